//! The progress engine: reads and writes the sockets of established links on the calling
//! threads, and feeds the [`State`](crate::matching::State) matching machine.
//!
//! How a receive makes progress (no thread hop on the latency path):
//! - The receiving thread posts its receive, then takes the *reader role* of every link to the
//!   peer it waits for, and reads those sockets itself: non-blocking reads in a short spin, then
//!   `poll(2)`. A frame for its own receive lands straight in its buffer.
//! - A thread that finds the links taken waits on the condition variable (a follower): the
//!   reader hands frames addressed to others over in buffers of their own and wakes them, and
//!   wakes them again when it releases the links so that one of them reads next.
//! - A sender whose write would block reads every free link meanwhile (so two ranks sending
//!   large messages to each other, or a ring of them, cannot deadlock), within the per-peer
//!   unexpected budget.
//! - A background watcher polls links that no caller has touched for a little while: it drains
//!   them into the budget and notices a lost peer at once even when nobody waits for it. A caller
//!   that wants a link the watcher holds kicks it through a wake-up socket.
//! - The watcher also beats on links that were silent in the sending direction and declares a
//!   peer lost that sent nothing for several heartbeat intervals (`heartbeat.rs`), so a stopped
//!   or unreachable peer is noticed in seconds, not at the operation timeout.
//!
//! Failure: EOF, a reset or a protocol violation on any link marks the peer lost, shuts its
//! sockets down (so every thread polling them wakes) and wakes every waiter; `abort` does the
//! same for every peer and makes its wake-up socket readable forever.
//!
//! Layout: this file is the [`Engine`] façade: construction, failure and close. `config.rs`
//! holds the tuning every room reads; `hub.rs` the socket-free matching state, wake-up rule and
//! receive loop (the part the loom models check); `recv.rs` the engine's socket side of that
//! loop; `reader.rs` the link service that decodes frames and lands payloads; `writer/` the
//! frames of one message and how a blocked send waits; `hook.rs` the contract of the work a send
//! moves on meanwhile, which `exchange.rs` (a send and a receive run together by one thread)
//! implements; `link.rs` the per-peer sockets and link state; `medium.rs` the contract of what
//! carries a link's bytes (the socket, or a medium the link switched to); `socket.rs` the OS calls
//! (`poll(2)`, vectored sends, wake-up sockets); `traffic.rs` the byte counters. Two rooms of
//! their own: `liveness/` (the background watcher, heartbeats and the silence rule, catching up
//! after a stop) and `same_host/` (the fast paths between ranks of one host: the offer, single
//! copy, bounce files, lanes, and the OS calls under them).

mod config;
mod exchange;
mod hook;
mod hub;
mod link;
mod liveness;
mod medium;
mod reader;
mod recv;
mod same_host;
mod socket;
mod traffic;
mod writer;

use std::io;
use std::net::{Shutdown, SocketAddr};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use rlx_transport::{CollectiveError, EXCLUSION_TAG, Failure, FatalCause, Tag};

use crate::error::Lost;
use crate::frame::{FrameHeader, FrameKind, HEADER_LEN};
use crate::sync::{AtomicBool, Mutex, lock};

pub(crate) use liveness::DEFAULT_HEARTBEAT;
pub(crate) use recv::LANDING_GRACE;

use self::liveness::CatchUp;
use self::same_host::{Lanes, SingleCopy};
use self::traffic::TrafficCounters;

pub(crate) use hub::Hub;
// The loom models drive the receive loop through a fake of the sockets.
pub(crate) use config::EngineConfig;
#[cfg(rlx_loom)]
pub(crate) use hub::{DriveEnd, Links};
pub(crate) use link::PeerIo;
use link::{HeaderSent, Link};
pub(crate) use same_host::DEFAULT_LANE_BYTES;
pub(crate) use same_host::DEFAULT_MAX_BOUNCED;
pub(crate) use same_host::DEFAULT_MIN_SINGLE_COPY;
use socket::{WakeWrite, peer_on_this_host, read_some, same_host_congestion_control};

/// Default of [`EngineConfig::spin`]: how long a thread that waits for its own receive spins
/// on non-blocking reads before it blocks in `poll(2)` (a blocking wake-up costs ~30 µs on the
/// reference machine).
pub(crate) const DEFAULT_SPIN: Duration = Duration::from_micros(50);

/// The progress engine of one transport; see the module docs.
#[derive(Debug)]
pub(crate) struct Engine {
    rank: u32,
    world: u32,
    cfg: EngineConfig,
    peers: Vec<Option<PeerIo>>,
    hub: Hub,
    abort_tx: UnixStream,
    abort_rx: UnixStream,
    watch_tx: UnixStream,
    watch_rx: UnixStream,
    watch_kicked: AtomicBool,
    self_seq: Mutex<u64>,
    traffic: TrafficCounters,
    catch_up: CatchUp,
    single_copy: SingleCopy,
    lanes: Lanes,
}

impl Engine {
    /// An engine over established links: `peers[r]` holds rank `r`'s links (`None` for this
    /// rank), every peer with the same number of links.
    pub(crate) fn new(
        rank: u32,
        world: u32,
        cfg: EngineConfig,
        peers: Vec<Option<PeerIo>>,
    ) -> io::Result<Self> {
        let links = peers
            .iter()
            .flatten()
            .map(|p| p.links.len())
            .max()
            .unwrap_or(1);
        let here: Box<[bool]> = peers
            .iter()
            .map(|p| {
                p.as_ref()
                    .and_then(|p| p.links.first())
                    .is_some_and(|l| peer_on_this_host(&l.stream))
            })
            .collect();
        for peer in peers.iter().flatten() {
            for link in &peer.links {
                link.stream.set_nonblocking(true)?;
                same_host_congestion_control(&link.stream);
            }
        }
        let (abort_tx, abort_rx) = UnixStream::pair()?;
        let (watch_tx, watch_rx) = UnixStream::pair()?;
        for s in [&abort_tx, &abort_rx, &watch_tx, &watch_rx] {
            s.set_nonblocking(true)?;
        }
        Ok(Self {
            rank,
            world,
            cfg,
            peers,
            hub: Hub::new(rank, world, links, cfg.max_unexpected, cfg.min_striped)
                .holding_for(cfg.longest_hold),
            abort_tx,
            abort_rx,
            watch_tx,
            watch_rx,
            watch_kicked: AtomicBool::new(false),
            self_seq: Mutex::new(0),
            traffic: TrafficCounters::default(),
            catch_up: CatchUp::new(),
            single_copy: SingleCopy::new(here),
            lanes: Lanes::new(world),
        })
    }

    /// Whether a pulled message of `peer` waits for its receive now (see
    /// [`Hub::holds_message_from`]).
    pub(crate) fn holds_message_from(&self, peer: u32) -> bool {
        self.hub.holds_message_from(peer)
    }

    pub(crate) fn op_timeout(&self) -> Duration {
        self.cfg.op_timeout
    }

    /// See [`rlx_transport::Transport::unreceived_from`].
    pub(crate) fn unreceived_from(&self, from: u32) -> Vec<(Tag, u64)> {
        if from >= self.world || from == self.rank {
            return Vec::new();
        }
        lock(&self.hub.state).unreceived_from(from)
    }

    /// What this engine has moved so far.
    pub(crate) fn traffic(&self) -> rlx_transport::Traffic {
        self.traffic.snapshot()
    }

    fn peer_io(&self, rank: u32) -> Result<&PeerIo, CollectiveError> {
        match self.peers.get(rank as usize) {
            Some(Some(p)) => Ok(p),
            _ => Err(CollectiveError::UnknownRank {
                rank,
                world_size: self.world,
            }),
        }
    }

    fn check_rank(&self, rank: u32) -> Result<(), CollectiveError> {
        if rank >= self.world {
            return Err(CollectiveError::UnknownRank {
                rank,
                world_size: self.world,
            });
        }
        Ok(())
    }

    /// The address of `rank`'s first link, for messages.
    pub(crate) fn peer_addr(&self, rank: u32) -> Option<SocketAddr> {
        let peer = self.peers.get(rank as usize)?.as_ref()?;
        peer.links.first()?.stream.peer_addr().ok()
    }

    /// This end's address of `rank`'s first link.
    pub(crate) fn local_addr_towards(&self, rank: u32) -> Option<SocketAddr> {
        let peer = self.peers.get(rank as usize)?.as_ref()?;
        peer.links.first()?.stream.local_addr().ok()
    }

    // ----- failure -----------------------------------------------------------------------

    /// Marks `peer` lost, shuts its sockets down and wakes everyone.
    fn lose(&self, peer: u32, lost: Lost) {
        self.hub.lose(self, peer, lost);
    }

    /// Declares `peer` dead for good (see `Transport::exclude_peer`): tells it so when its
    /// socket takes the notice at once, then drops what it queued and closes the sending side
    /// of its links.
    pub(crate) fn exclude(&self, peer: u32) -> Result<(), CollectiveError> {
        if peer == self.rank {
            return Err(CollectiveError::invalid(format!(
                "rank {peer} cannot exclude itself"
            )));
        }
        let io = self.peer_io(peer)?;
        self.tell_excluded(peer, io);
        let addr = io.addr.as_str();
        self.hub.exclude(
            peer,
            Lost::Gone(format!(
                "rank {peer} at {addr} was declared dead by this rank"
            )),
        );
        // Only the sending side closes: the peer reads the notice, then the end of the
        // stream. Closing the receiving side too would answer whatever it still sends with a
        // reset, which can discard the notice before it is read; what it sends now stays
        // unread in this socket until the transport closes.
        io.shutdown_write();
        Ok(())
    }

    /// Writes the exclusion notice to `peer`'s first link if the socket takes the whole frame
    /// now. A peer that stopped reading (its buffers full) or a send in progress on the link
    /// means no notice: exclusion must never wait for the rank it excludes.
    fn tell_excluded(&self, peer: u32, io: &PeerIo) {
        if lock(&self.hub.state).peers[peer as usize].lost.is_some() {
            return;
        }
        if io.links.is_empty() {
            return;
        }
        let Ok(mut tx) = io.tx.try_lock() else {
            return;
        };
        let notice = Failure::GroupFailed {
            culprit: peer,
            cause: FatalCause::Excluded,
        }
        .encode();
        let header = FrameHeader::whole(
            FrameKind::Failure,
            EXCLUSION_TAG,
            tx.next_seq,
            notice.len() as u64,
        )
        .encode();
        let whole = header.len() + notice.len();
        match io.write_frame(&mut tx, 0, &header, &[&notice], 0, notice.len() as u64, 0) {
            Ok(n) if n == whole => tx.next_seq += 1,
            // Half a frame on the wire makes the peer see a broken link instead of the notice;
            // it is shut down right after either way.
            _ => tracing::debug!(
                peer,
                "exclusion notice not sent: the socket did not take it"
            ),
        }
    }

    /// Writes `header`, a frame without payload, whole on `link` to `rank` (see
    /// [`Link::write_header_whole`]); a failed or stalled write is the loss of the peer.
    fn send_header_whole(
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
    fn abandon_send(&self, to: u32, io: &PeerIo, when: &str) -> CollectiveError {
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

    fn lost_from_io(&self, peer: u32, what: &str, err: &io::Error) -> Lost {
        let addr = self.peers.get(peer as usize).and_then(|p| p.as_ref());
        let addr = addr.map_or("an unknown address", |p| p.addr.as_str());
        Lost::Gone(format!("{what} with {addr} failed: {err}"))
    }

    fn lost_eof(&self, peer: u32) -> Lost {
        let addr = self.peers.get(peer as usize).and_then(|p| p.as_ref());
        let addr = addr.map_or("an unknown address", |p| p.addr.as_str());
        Lost::Gone(format!(
            "connection to {addr} closed (the process ended or crashed)"
        ))
    }

    /// Wakes every blocked call with `Aborted`, shuts every socket down; idempotent.
    pub(crate) fn abort(&self) {
        if self.stop() {
            tracing::info!("transport aborted: every blocked call fails with Aborted");
        }
    }

    /// What [`Engine::abort`] and [`Engine::close`] share: records the end, wakes every
    /// blocked call and shuts the sockets down. Returns `false` when it had ended before.
    fn stop(&self) -> bool {
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

    pub(crate) fn is_aborted(&self) -> bool {
        self.hub.is_aborted()
    }

    /// Says goodbye on every link (best effort, never blocking), then shuts everything down.
    pub(crate) fn close(&self) {
        self.hub.begin_close();
        if !self.is_aborted() {
            let close = FrameHeader::whole(FrameKind::Close, Tag::from_raw(0), 0, 0).encode();
            for peer in self.peers.iter().flatten() {
                if let Ok(mut tx) = peer.tx.try_lock() {
                    if !peer.links.is_empty() {
                        let _ = peer.write_frame(&mut tx, 0, &close, &[], 0, 0, 0);
                    }
                }
                for link in &peer.links {
                    let _ = link.stream.shutdown(Shutdown::Write);
                    // Closing a socket with unread bytes makes the kernel reset it, which
                    // discards what this side has not transmitted yet; read them away first.
                    let mut sink = [0u8; 4096];
                    for _ in 0..256 {
                        if !matches!(read_some(&link.stream, &mut sink), Ok(n) if n > 0) {
                            break;
                        }
                    }
                }
            }
        }
        // The end of every job: not worth more than a debug line.
        if self.stop() {
            tracing::debug!("transport closed");
        }
    }
}
