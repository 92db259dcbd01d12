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
//! Layout: this file is the [`Engine`] façade: construction, the calls of the transport,
//! exclusion and the end. It owns `core.rs`'s [`Core`] (what every room shares: rank, world,
//! tuning, the per-peer links, the hub, the abort and watcher wake-up sockets, the byte
//! counters) and each room's own state, and builds the rooms' *views* on demand, as small
//! structs of borrowed references: a room sees the core and the views of the rooms it calls,
//! never the engine, so no room reaches into another's state and every call between rooms
//! names the room it goes to (`self.same_host.carriage(..)`, `self.reader.service(..)`).
//!
//! The rooms, each a view, from the bottom up: `same_host/` ([`SameHost`]: the fast paths
//! between ranks of one host: the offer, single copy, bounce files, lanes, and the OS calls
//! under them); `reader.rs` ([`Reader`]: decodes frames on a link and lands payloads, handing
//! same-host frames to the same-host room); `recv.rs` ([`Receiver`]: the engine's side of the
//! hub's receive loop, reading a peer's links through the reader); `writer/` ([`Writer`]: the
//! frames of one message and how a blocked send waits, asking the same-host room once how the
//! message travels); `exchange.rs` ([`Exchange`]: a send and a receive run together by one
//! thread, the receive being the send's [`ProgressHook`](hook::ProgressHook) from `hook.rs`);
//! `liveness/` ([`Watcher`]: the background watcher, heartbeats and the silence rule, catching
//! up after a stop). Beside them: `config.rs` the tuning every room reads; `hub.rs` the
//! socket-free matching state, wake-up rule and receive loop (the part the loom models
//! check); `link.rs` the per-peer sockets and link state; `medium.rs` the contract of what
//! carries a link's bytes (the socket, or a medium the link switched to); `socket.rs` the OS
//! calls (`poll(2)`, vectored sends, wake-up sockets); `traffic.rs` the byte counters.

mod config;
mod core;
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
use std::time::Duration;

use rlx_transport::{CollectiveError, EXCLUSION_TAG, Failure, FatalCause, Tag};

use crate::error::Lost;
use crate::frame::{FrameHeader, FrameKind};
use crate::matching::Outcome;
use crate::sync::{Mutex, lock};

pub(crate) use liveness::DEFAULT_HEARTBEAT;
pub(crate) use recv::LANDING_GRACE;

use self::core::Core;
use self::exchange::Exchange;
use self::liveness::{CatchUp, Watcher};
use self::reader::Reader;
use self::recv::Receiver;
use self::same_host::{OFFER_WAIT, SameHost, SameHostState};
pub(crate) use self::writer::Meanwhile;
use self::writer::Writer;

pub(crate) use hub::Hub;
// The loom models drive the receive loop through a fake of the sockets.
pub(crate) use config::EngineConfig;
#[cfg(rlx_loom)]
pub(crate) use hub::{Drive, DriveEnd, Links};
pub(crate) use link::PeerIo;
pub(crate) use same_host::DEFAULT_LANE_BYTES;
pub(crate) use same_host::DEFAULT_MAX_BOUNCED;
pub(crate) use same_host::DEFAULT_MIN_SINGLE_COPY;
use socket::{peer_on_this_host, read_some, same_host_congestion_control};

/// Default of [`EngineConfig::spin`]: how long a thread that waits for its own receive spins
/// on non-blocking reads before it blocks in `poll(2)` (a blocking wake-up costs ~30 µs on the
/// reference machine).
pub(crate) const DEFAULT_SPIN: Duration = Duration::from_micros(50);

/// The progress engine of one transport; see the module docs. It owns the state every room
/// shares ([`Core`]) and each room's own, and builds each room's view on demand: no room holds
/// the engine, so none can reach into another's state.
#[derive(Debug)]
pub(crate) struct Engine {
    core: Core,
    catch_up: CatchUp,
    same_host: SameHostState,
    /// The sequence numbers of the messages this rank sends itself (the writer's).
    to_self: Mutex<u64>,
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
        let hub = Hub::new(rank, world, links, cfg.max_unexpected, cfg.min_striped)
            .holding_for(cfg.longest_hold);
        Ok(Self {
            core: Core::new(rank, world, cfg, peers, hub)?,
            catch_up: CatchUp::new(),
            same_host: SameHostState::new(here),
            to_self: Mutex::new(0),
        })
    }

    // ----- the rooms' views ---------------------------------------------------------------

    fn same_host(&self) -> SameHost<'_> {
        self.same_host.view(&self.core)
    }

    fn reader(&self) -> Reader<'_> {
        Reader::new(&self.core, self.same_host())
    }

    fn receiver(&self) -> Receiver<'_> {
        Receiver::new(&self.core, self.reader(), &self.catch_up)
    }

    fn writer(&self) -> Writer<'_> {
        Writer::new(&self.core, self.same_host(), self.reader(), &self.to_self)
    }

    fn exchange(&self) -> Exchange<'_> {
        Exchange::new(&self.core, self.writer(), self.receiver(), self.reader())
    }

    // ----- messages -----------------------------------------------------------------------

    /// See [`Writer::send`].
    pub(crate) fn send(
        &self,
        to: u32,
        kind: FrameKind,
        tag: Tag,
        parts: &[&[u8]],
    ) -> Result<(), CollectiveError> {
        self.writer().send(to, kind, tag, parts)
    }

    /// See [`Writer::try_send`].
    pub(crate) fn try_send(
        &self,
        to: u32,
        kind: FrameKind,
        tag: Tag,
        parts: &[&[u8]],
        wait: Duration,
    ) -> Result<bool, CollectiveError> {
        self.writer().try_send(to, kind, tag, parts, wait)
    }

    /// See [`Writer::try_send_during`].
    pub(crate) fn try_send_during(
        &self,
        to: u32,
        tag: Tag,
        parts: &[&[u8]],
        wait: Duration,
        meanwhile: Meanwhile<'_>,
    ) -> Result<bool, CollectiveError> {
        self.writer()
            .try_send_during(to, tag, parts, wait, meanwhile)
    }

    /// See [`Receiver::recv`].
    pub(crate) fn recv(
        &self,
        from: u32,
        tag: Tag,
        buf: Option<&mut [u8]>,
        timeout: Duration,
    ) -> Result<Option<Outcome>, CollectiveError> {
        self.receiver().recv(from, tag, buf, timeout)
    }

    /// See [`Exchange::send_recv`].
    pub(crate) fn send_recv(
        &self,
        to: u32,
        from: u32,
        tag: Tag,
        parts: &[&[u8]],
        buf: &mut [u8],
        timeout: Duration,
    ) -> Result<Option<Outcome>, CollectiveError> {
        self.exchange()
            .send_recv(to, from, tag, parts, buf, timeout)
    }

    /// The background watcher's loop (see `liveness/watch.rs`); returns once the transport is
    /// aborted or closed.
    pub(crate) fn watch(&self) {
        Watcher::new(&self.core, self.reader(), &self.catch_up).watch();
    }

    // ----- the same-host room -------------------------------------------------------------

    /// Offers every peer on this host to read this process and, when lanes are on, a lane (see
    /// `same_host/offer.rs`): one [`FrameKind::Offer`] frame on its first link, written before
    /// any message. A link that does not take these few bytes at once is broken or about to
    /// be; the fast paths simply stay off for it.
    pub(crate) fn offer_same_host(&self) {
        for (peer, offer) in self.same_host().offers() {
            let sent = self.try_send(
                peer,
                FrameKind::Offer,
                Tag::from_raw(0),
                &[&offer],
                OFFER_WAIT,
            );
            tracing::debug!(peer, ?sent, "same-host offer");
        }
    }

    /// See [`SameHost::segment_hint`].
    pub(crate) fn segment_hint(&self, members: &[u32]) -> Option<usize> {
        self.same_host().segment_hint(members)
    }

    /// Whether this rank reads large messages from `peer` by single copy (for tests and tools).
    pub(crate) fn pulls_from(&self, peer: u32) -> bool {
        self.same_host().pulls_from(peer)
    }

    /// Whether link 0 from `peer` reads its shared-memory lane (for tests and tools).
    pub(crate) fn reads_lane_from(&self, peer: u32) -> bool {
        match self.core.peers.get(peer as usize) {
            Some(Some(io)) => io.links.first().is_some_and(|link| link.switched()),
            _ => false,
        }
    }

    // ----- questions ----------------------------------------------------------------------

    /// Whether a pulled message of `peer` waits for its receive now (see
    /// [`Hub::holds_message_from`]).
    pub(crate) fn holds_message_from(&self, peer: u32) -> bool {
        self.core.hub.holds_message_from(peer)
    }

    pub(crate) fn op_timeout(&self) -> Duration {
        self.core.cfg.op_timeout
    }

    /// See [`rlx_transport::Transport::unreceived_from`].
    pub(crate) fn unreceived_from(&self, from: u32) -> Vec<(Tag, u64)> {
        if from >= self.core.world || from == self.core.rank {
            return Vec::new();
        }
        lock(&self.core.hub.state).unreceived_from(from)
    }

    /// What this engine has moved so far.
    pub(crate) fn traffic(&self) -> rlx_transport::Traffic {
        self.core.traffic.snapshot()
    }

    /// The address of `rank`'s first link, for messages.
    pub(crate) fn peer_addr(&self, rank: u32) -> Option<SocketAddr> {
        let peer = self.core.peers.get(rank as usize)?.as_ref()?;
        peer.links.first()?.stream.peer_addr().ok()
    }

    /// This end's address of `rank`'s first link.
    pub(crate) fn local_addr_towards(&self, rank: u32) -> Option<SocketAddr> {
        let peer = self.core.peers.get(rank as usize)?.as_ref()?;
        peer.links.first()?.stream.local_addr().ok()
    }

    // ----- failure and the end ------------------------------------------------------------

    /// Declares `peer` dead for good (see `Transport::exclude_peer`): tells it so when its
    /// socket takes the notice at once, then drops what it queued and closes the sending side
    /// of its links.
    pub(crate) fn exclude(&self, peer: u32) -> Result<(), CollectiveError> {
        if peer == self.core.rank {
            return Err(CollectiveError::invalid(format!(
                "rank {peer} cannot exclude itself"
            )));
        }
        let io = self.core.peer_io(peer)?;
        self.tell_excluded(peer, io);
        let addr = io.addr.as_str();
        self.core.hub.exclude(
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
        if lock(&self.core.hub.state).peers[peer as usize]
            .lost
            .is_some()
        {
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

    /// Wakes every blocked call with `Aborted`, shuts every socket down; idempotent.
    pub(crate) fn abort(&self) {
        if self.core.stop() {
            tracing::info!("transport aborted: every blocked call fails with Aborted");
        }
    }

    pub(crate) fn is_aborted(&self) -> bool {
        self.core.is_aborted()
    }

    /// Says goodbye on every link (best effort, never blocking), then shuts everything down.
    pub(crate) fn close(&self) {
        self.core.hub.begin_close();
        if !self.is_aborted() {
            let close = FrameHeader::whole(FrameKind::Close, Tag::from_raw(0), 0, 0).encode();
            for peer in self.core.peers.iter().flatten() {
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
        if self.core.stop() {
            tracing::debug!("transport closed");
        }
    }
}
