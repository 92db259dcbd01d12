//! What every room of the engine shares: this rank's place in the world, the tuning, the
//! per-peer links, the hub, the abort and watcher wake-up sockets and the byte counters, with
//! the few things every room does with them (find a peer's links, lose a peer, write a header
//! whole, notice an abort).
//!
//! The engine owns one [`Core`]; each room gets a reference to it in its view, beside the
//! state that room alone keeps (`same_host/`'s offers and lanes, `liveness/`'s catch-up clock,
//! the writer's count of messages to itself). Nothing here knows a room: the core is the floor
//! they all stand on, not a hub of calls between them.

use std::io;
use std::io::Read;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use rlx_transport::CollectiveError;

use crate::error::Lost;
use crate::frame::HEADER_LEN;
use crate::sync::{AtomicBool, Ordering};

use super::config::EngineConfig;
use super::hub::{Hub, Links};
use super::link::{HeaderSent, Link, PeerIo};
use super::socket::WakeWrite;
use super::traffic::TrafficCounters;

/// The wake-up socket of the background watcher: a caller that wants a link the watcher
/// holds rings it, and the watcher polls its other end.
#[derive(Debug)]
pub(in crate::progress) struct Bell {
    tx: UnixStream,
    rx: UnixStream,
    /// Set from a ring until the watcher has heard it, so that a burst of callers writes once.
    rung: AtomicBool,
}

impl Bell {
    fn new() -> io::Result<Self> {
        let (tx, rx) = UnixStream::pair()?;
        tx.set_nonblocking(true)?;
        rx.set_nonblocking(true)?;
        Ok(Self {
            tx,
            rx,
            rung: AtomicBool::new(false),
        })
    }

    /// Wakes the watcher unless a ring is already on its way.
    pub(in crate::progress) fn ring(&self) {
        if !self.rung.swap(true, Ordering::SeqCst) {
            let _ = (&self.tx).write_all_nonblocking(b"k");
        }
    }

    /// The end the watcher polls.
    pub(in crate::progress) fn fd(&self) -> RawFd {
        self.rx.as_raw_fd()
    }

    /// The watcher heard the bell: reads the rings away and re-arms it.
    pub(in crate::progress) fn heard(&self) {
        let mut sink = [0u8; 64];
        while matches!((&self.rx).read(&mut sink), Ok(n) if n > 0) {}
        self.rung.store(false, Ordering::SeqCst);
    }
}

/// The state every room of the engine sees; see the module docs.
#[derive(Debug)]
pub(in crate::progress) struct Core {
    pub(in crate::progress) rank: u32,
    pub(in crate::progress) world: u32,
    pub(in crate::progress) cfg: EngineConfig,
    /// `peers[r]`: rank `r`'s links (`None` for this rank).
    pub(in crate::progress) peers: Vec<Option<PeerIo>>,
    pub(in crate::progress) hub: Hub,
    /// Written once by an abort, so that every `poll(2)` that includes `abort_rx` wakes.
    abort_tx: UnixStream,
    pub(in crate::progress) abort_rx: UnixStream,
    pub(in crate::progress) bell: Bell,
    pub(in crate::progress) traffic: TrafficCounters,
}

impl Core {
    pub(in crate::progress) fn new(
        rank: u32,
        world: u32,
        cfg: EngineConfig,
        peers: Vec<Option<PeerIo>>,
        hub: Hub,
    ) -> io::Result<Self> {
        let (abort_tx, abort_rx) = UnixStream::pair()?;
        abort_tx.set_nonblocking(true)?;
        abort_rx.set_nonblocking(true)?;
        Ok(Self {
            rank,
            world,
            cfg,
            peers,
            hub,
            abort_tx,
            abort_rx,
            bell: Bell::new()?,
            traffic: TrafficCounters::default(),
        })
    }

    pub(in crate::progress) fn peer_io(&self, rank: u32) -> Result<&PeerIo, CollectiveError> {
        match self.peers.get(rank as usize) {
            Some(Some(p)) => Ok(p),
            _ => Err(CollectiveError::UnknownRank {
                rank,
                world_size: self.world,
            }),
        }
    }

    pub(in crate::progress) fn check_rank(&self, rank: u32) -> Result<(), CollectiveError> {
        if rank >= self.world {
            return Err(CollectiveError::UnknownRank {
                rank,
                world_size: self.world,
            });
        }
        Ok(())
    }

    /// Marks `peer` lost, shuts its sockets down and wakes everyone.
    pub(in crate::progress) fn lose(&self, peer: u32, lost: Lost) {
        self.hub.lose(self, peer, lost);
    }

    /// Writes `header`, a frame without payload, whole on `link` to `rank` (see
    /// [`Link::write_header_whole`]); a failed or stalled write is the loss of the peer.
    pub(in crate::progress) fn send_header_whole(
        &self,
        rank: u32,
        io: &PeerIo,
        link: &Link,
        header: &[u8; HEADER_LEN],
        what: &str,
        limit: Duration,
    ) -> Result<HeaderSent, Lost> {
        let abort_fd = self.abort_rx.as_raw_fd();
        match link.write_header_whole(header, limit, abort_fd, || self.is_aborted()) {
            Ok(HeaderSent::Stalled { written }) => Err(Lost::Gone(format!(
                "{what} to {} stalled after {written} of {HEADER_LEN} bytes (link unusable)",
                io.addr
            ))),
            Ok(sent) => Ok(sent),
            Err(e) => Err(self.lost_from_io(rank, &format!("sending {what}"), &e)),
        }
    }

    /// A send to `to` that reached its deadline `when` the link was left in a state nothing
    /// else can follow: the peer is lost, and the send's error is a timeout naming it.
    pub(in crate::progress) fn abandon_send(
        &self,
        to: u32,
        io: &PeerIo,
        when: &str,
    ) -> CollectiveError {
        let after = self.cfg.op_timeout;
        self.lose(
            to,
            Lost::Gone(format!(
                "a send to it timed out after {after:?} {when} (link to {} unusable)",
                io.addr
            )),
        );
        CollectiveError::Timeout {
            peer: Some(to),
            op: "send",
            after,
        }
    }

    pub(in crate::progress) fn lost_from_io(&self, peer: u32, what: &str, err: &io::Error) -> Lost {
        Lost::Gone(format!("{what} with {} failed: {err}", self.addr_of(peer)))
    }

    pub(in crate::progress) fn lost_eof(&self, peer: u32) -> Lost {
        Lost::Gone(format!(
            "connection to {} closed (the process ended or crashed)",
            self.addr_of(peer)
        ))
    }

    fn addr_of(&self, peer: u32) -> &str {
        let addr = self.peers.get(peer as usize).and_then(|p| p.as_ref());
        addr.map_or("an unknown address", |p| p.addr.as_str())
    }

    pub(in crate::progress) fn is_aborted(&self) -> bool {
        self.hub.is_aborted()
    }

    /// Records the end of the transport, wakes every blocked call and shuts the sockets down.
    /// Returns `false` when it had ended before.
    pub(in crate::progress) fn stop(&self) -> bool {
        if !self.hub.abort() {
            return false;
        }
        let _ = (&self.abort_tx).write_all_nonblocking(b"!");
        for peer in self.peers.iter().flatten() {
            peer.shutdown();
        }
        self.hub.wake();
        true
    }
}

impl Links for Core {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn kick_watcher(&self) {
        self.bell.ring();
    }

    fn shut_down(&self, peer: u32) {
        if let Some(Some(io)) = self.peers.get(peer as usize) {
            io.shutdown();
        }
    }
}
