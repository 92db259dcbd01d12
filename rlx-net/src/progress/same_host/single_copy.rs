//! The single-copy path: a large message between two ranks of one host moves in one kernel
//! copy, from the sender's buffer straight into the receiver's, instead of two copies through
//! a loopback TCP stream (user to socket buffer, socket buffer to user).
//!
//! Over loopback every byte of a TCP message is copied twice, both copies on the two ranks'
//! cores, and one message runs at what one stream carries. Here, as in Open MPI's
//! shared-memory transport, the sender publishes where its bytes are, the receiver reads them
//! with cross-memory attach (`cross_memory.rs`), and tells the sender it is done.
//!
//! The protocol, for a message of at least [`EngineConfig::min_single_copy`] bytes to a peer
//! that took this rank's offer (below):
//! 1. The sender, holding the peer's send lock for the whole message, stores the message's
//!    ticket (its sequence number plus one) in its `offered` word and writes a
//!    [`FrameKind::Pull`] frame on link 0: a header whose lengths are the message's, followed by
//!    a [`Descriptor`] of where the message's parts lie in its memory and where its `offered`
//!    and `taken` words are. The link carries nothing else until the message is done, so the
//!    frame keeps its place in the message order.
//! 2. The receiver matches the frame like the first frame of any message (a posted receive,
//!    the unexpected budget, or parking when neither takes it) and reads the parts from the
//!    sender's memory into the destination. It then reads the sender's `offered` word: if it
//!    no longer holds the ticket, the sender gave up on the message (its deadline passed, its
//!    transport was aborted) and may have reused the buffer meanwhile, so the bytes are not
//!    trusted and the peer is lost. Otherwise it writes the ticket into the sender's `taken`
//!    word.
//! 3. The sender waits until `taken` holds the ticket: yielding while the copy should take,
//!    then in growing sleeps (an exchange reads its own receive's links meanwhile). It reads
//!    no other link: a message read from a peer that is about to post its receive would land
//!    in a copy. Two ranks sending to each other still make progress, because the background
//!    watcher drains links nobody reads. Giving up clears `offered` first and makes the peer
//!    lost, as a send that timed out mid-message does.
//!
//! The offer, made once when the transport is built: a willing rank (`RLX_SINGLE_COPY` is not
//! `0`) writes a [`FrameKind::Offer`] frame as the first frame of link 0 to each peer on this
//! host (reached over loopback or at its own address, see `peer_on_this_host`): its process id,
//! the address and value of a random nonce of its own, the address of its `accepted` word, and
//! the name of its shared-memory lane to that peer (`lane.rs`), if it made one.
//! A willing peer reads the nonce in the named process and, when the bytes match, reads that
//! peer's pulled messages from that process from then on and writes 1 into its `accepted`
//! word. A rank sends by pull only to peers that wrote its `accepted` word, and reads by pull
//! only from the process whose nonce it read, so a peer cannot make it read or write in a
//! process other than the peer's own. Nothing waits for an answer: a missing permission
//! (another user, Yama's `ptrace_scope`, a seccomp profile) or a peer that does not take the
//! offer leaves the path off, and messages go over TCP as before.
//!
//! The head of a pulled message may instead pass through a shared-memory file of the sender's,
//! copied in and out with plain memory copies (`bounce.rs`); the tickets, `offered` and `taken`
//! work the same way for it.
//!
//! The peers' words are `std` atomics even under loom: the peer process writes and reads them
//! through the kernel, which no model can follow.
//!
//! [`EngineConfig::min_single_copy`]: super::EngineConfig::min_single_copy
//! [`FrameKind::Pull`]: crate::frame::FrameKind::Pull
//! [`FrameKind::Offer`]: crate::frame::FrameKind::Offer

use crate::sync::{Mutex, MutexGuard, lock};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rlx_transport::{CollectiveError, Tag, blocked_send};

use crate::error::{Lost, protocol_lost};
use crate::frame::{FrameHeader, FrameKind, OFFER_LEN};

use super::bounce::{BounceView, Bounced};
use super::lane::{LaneIn, LaneOut};
use super::sys::cross_memory;
use crate::progress::Engine;
use crate::progress::exchange::Companion;
use crate::progress::link::{Land, PeerIo};
use crate::progress::service::Own;
use crate::progress::socket::{poll, pollfd};

/// Most parts (slices of the caller's) a pulled message may have; a message in more parts is
/// sent over TCP.
pub(crate) const MAX_PARTS: usize = 4;

/// Encoded size of a [`Descriptor`].
pub(crate) const DESCRIPTOR_LEN: usize = 48 + 16 * MAX_PARTS;

/// Default of [`EngineConfig::min_single_copy`](super::EngineConfig::min_single_copy): below
/// this the loopback stream is as fast, and the round trip of the `taken` word costs more than
/// the copy it saves.
pub(crate) const DEFAULT_MIN_SINGLE_COPY: u64 = 256 << 10;

/// The segment size pipelined collectives use among ranks that all run on this host: the
/// largest they follow.
const ONE_HOST_SEGMENT: usize = rlx_transport::MAX_SEGMENT_HINT;

/// How fast the sender expects the receiver to copy, to decide how long it spins for the
/// `taken` word before it sleeps between looks (a conservative memory-copy rate).
const EXPECTED_COPY_BYTES_PER_SEC: u64 = 2 << 30;

/// The longest a sender looks at the `taken` word without sleeping, however long the copy
/// should take: past it the receiver is most likely busy elsewhere, not copying.
const LONGEST_SPIN: Duration = Duration::from_millis(5);

/// The longest sleep between two looks at the `taken` word.
const LONGEST_NAP: Duration = Duration::from_millis(1);

/// How long the offer waits for its socket (it is the first frame on an empty link).
const OFFER_WAIT: Duration = Duration::from_millis(100);

/// Where the bytes of a pulled message lie in the sender's memory, and the sender's words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Descriptor {
    /// Address of the sender's `offered` word.
    pub(crate) offered: u64,
    /// Address of the sender's `taken` word.
    pub(crate) taken: u64,
    /// `(address, length)` of each part, in message order.
    pub(crate) parts: [(u64, u64); MAX_PARTS],
    /// How many entries of `parts` are used.
    pub(crate) count: usize,
    /// The message's head, bounced through the sender's shared-memory file (`bounce.rs`).
    pub(crate) bounced: Bounced,
}

impl Descriptor {
    /// The descriptor's bytes: `offered`, `taken`, the part count, the bounce file's
    /// descriptor number, id and bounced length, then `MAX_PARTS` pairs of address and length
    /// (unused ones zero), all little-endian `u64`s.
    pub(crate) fn encode(&self) -> [u8; DESCRIPTOR_LEN] {
        let mut out = [0u8; DESCRIPTOR_LEN];
        out[0..8].copy_from_slice(&self.offered.to_le_bytes());
        out[8..16].copy_from_slice(&self.taken.to_le_bytes());
        out[16..24].copy_from_slice(&(self.count as u64).to_le_bytes());
        out[24..32].copy_from_slice(&self.bounced.fd.to_le_bytes());
        out[32..40].copy_from_slice(&self.bounced.id.to_le_bytes());
        out[40..48].copy_from_slice(&self.bounced.len.to_le_bytes());
        for (i, (addr, len)) in self.parts.iter().enumerate() {
            let at = PARTS_AT + 16 * i;
            out[at..at + 8].copy_from_slice(&addr.to_le_bytes());
            out[at + 8..at + 16].copy_from_slice(&len.to_le_bytes());
        }
        out
    }

    /// Decodes and checks a descriptor from `peer` for a message of `total` bytes: the parts
    /// must add up to exactly `total`, unused entries must be zero, and the bounced head must
    /// lie inside the message (with no file named when nothing is bounced).
    pub(crate) fn decode(
        peer: u32,
        bytes: &[u8; DESCRIPTOR_LEN],
        total: u64,
    ) -> Result<Self, CollectiveError> {
        let word = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&bytes[i..i + 8]);
            u64::from_le_bytes(w)
        };
        let bad = |detail: String| CollectiveError::protocol(Some(peer), detail);
        let count = word(16);
        if count == 0 || count > MAX_PARTS as u64 {
            return Err(bad(format!(
                "single-copy descriptor with {count} parts (1 to {MAX_PARTS} are allowed)"
            )));
        }
        let mut parts = [(0u64, 0u64); MAX_PARTS];
        let mut sum = 0u64;
        for (i, part) in parts.iter_mut().enumerate() {
            *part = (word(PARTS_AT + 16 * i), word(PARTS_AT + 8 + 16 * i));
            if i as u64 >= count && *part != (0, 0) {
                return Err(bad(
                    "single-copy descriptor with stray part bytes".to_owned()
                ));
            }
            sum = sum.checked_add(part.1).ok_or_else(|| {
                bad("single-copy descriptor whose part lengths overflow".to_owned())
            })?;
        }
        if sum != total {
            return Err(bad(format!(
                "single-copy descriptor covers {sum} bytes of a message of {total}"
            )));
        }
        let bounced = Bounced {
            fd: word(24),
            id: word(32),
            len: word(40),
        };
        if bounced.len > total || (bounced.len == 0 && bounced != Bounced::default()) {
            return Err(bad(format!(
                "single-copy descriptor bounces {} bytes of a message of {total} (file {}, id {:#x})",
                bounced.len, bounced.fd, bounced.id
            )));
        }
        Ok(Self {
            offered: word(0),
            taken: word(8),
            parts,
            count: count as usize,
            bounced,
        })
    }
}

/// Where the parts of a [`Descriptor`] start in its bytes.
const PARTS_AT: usize = 48;

/// What this rank knows and publishes for one peer.
#[derive(Debug, Default)]
struct PeerCopy {
    /// The peer's process id once this rank read its nonce there (0: never).
    pull_from: AtomicU32,
    /// The peer read this rank's nonce and wrote 1 here: large messages to it go by pull. It
    /// writes [`ACCEPTED_NO_BOUNCE`](super::bounce::ACCEPTED_NO_BOUNCE) instead when it cannot map this rank's bounce file.
    accepted: AtomicU64,
    /// The address of the peer's `accepted` word, from its offer (0: none taken).
    accepted_at: AtomicU64,
    /// The ticket of the message this rank offers the peer now (0: none).
    offered: AtomicU64,
    /// The ticket of the last message the peer has taken.
    taken: AtomicU64,
}

/// The single-copy state of one engine.
///
/// The words the peers read and write (`offered`, `taken`, `accepted`) and the nonce live for
/// the rest of the process: a peer that took this engine's offer may still write `accepted`,
/// or finish a copy and write `taken`, after this transport was dropped (a group rebuilt by
/// `shrink` or `grow`, a short-lived transport in a test), and that write must land in memory
/// nobody else uses. They take 32 bytes per peer and 16 for the nonce, once per transport
/// built; the allocation is deliberately never freed.
#[derive(Debug)]
pub(crate) struct SingleCopy {
    /// Indexed by rank.
    peers: &'static [PeerCopy],
    nonce: &'static [u8; 16],
    /// Indexed by rank: the rank runs on this host (see `peer_on_this_host`), as its first
    /// link said when the transport was built.
    here: Box<[bool]>,
    /// Indexed by rank: this rank's mapping of the peer's bounce file, used by whoever reads
    /// the peer's pulled messages.
    views: Box<[Mutex<Option<BounceView>>]>,
}

impl SingleCopy {
    /// The state of an engine whose peers `here[r]` says run on this host.
    pub(crate) fn new(here: Box<[bool]>) -> Self {
        let mut nonce = Box::new([0u8; 16]);
        // Without randomness the nonce stays zero: the offer then still proves the peer can
        // read this process, only not that the process it named is this one, which the local
        // address already made likely.
        let _ = getrandom::fill(&mut nonce[..]);
        let peers: Box<[PeerCopy]> = here.iter().map(|_| PeerCopy::default()).collect();
        Self {
            peers: Box::leak(peers),
            nonce: Box::leak(nonce),
            views: here.iter().map(|_| Mutex::new(None)).collect(),
            here,
        }
    }

    /// Whether `rank` runs on this host.
    fn on_this_host(&self, rank: u32) -> bool {
        self.here.get(rank as usize).copied().unwrap_or(false)
    }

    fn peer(&self, rank: u32) -> Option<&PeerCopy> {
        self.peers.get(rank as usize)
    }

    /// This rank's mapping of `rank`'s bounce file, locked.
    pub(in crate::progress) fn view(
        &self,
        rank: u32,
    ) -> Option<MutexGuard<'_, Option<BounceView>>> {
        self.views.get(rank as usize).map(|v| lock(v))
    }

    /// What `rank` wrote into this rank's `accepted` word (0: nothing).
    pub(in crate::progress) fn accepted(&self, rank: u32) -> u64 {
        self.peer(rank)
            .map_or(0, |p| p.accepted.load(Ordering::Relaxed))
    }

    /// The address of `rank`'s `accepted` word, once its offer was taken.
    pub(in crate::progress) fn accepted_at(&self, rank: u32) -> Option<u64> {
        let at = self.peer(rank)?.accepted_at.load(Ordering::Relaxed);
        (at != 0).then_some(at)
    }
}

impl Engine {
    /// Whether a message of `total` bytes in `parts` to `to` goes by pull.
    pub(in crate::progress) fn pulls_to(&self, to: u32, total: u64, parts: usize) -> bool {
        total >= self.cfg.min_single_copy
            && parts <= MAX_PARTS
            && self
                .single_copy
                .peer(to)
                .is_some_and(|p| p.accepted.load(Ordering::Relaxed) & 1 == 1)
    }

    /// Publishes message `seq` to `to` as offered, with its head `bounced`, and returns its
    /// descriptor.
    pub(in crate::progress) fn offer(
        &self,
        to: u32,
        seq: u64,
        parts: &[&[u8]],
        bounced: Bounced,
    ) -> [u8; DESCRIPTOR_LEN] {
        let mut desc = Descriptor {
            offered: 0,
            taken: 0,
            parts: [(0, 0); MAX_PARTS],
            count: parts.len().min(MAX_PARTS),
            bounced,
        };
        for (slot, part) in desc.parts.iter_mut().zip(parts) {
            *slot = (part.as_ptr() as usize as u64, part.len() as u64);
        }
        if let Some(p) = self.single_copy.peer(to) {
            p.offered.store(seq + 1, Ordering::SeqCst);
            desc.offered = p.offered.as_ptr() as usize as u64;
            desc.taken = p.taken.as_ptr() as usize as u64;
        }
        desc.encode()
    }

    /// Withdraws the offer to `to`: from now on the peer does not trust what it reads.
    fn withdraw_offer(&self, to: u32) {
        if let Some(p) = self.single_copy.peer(to) {
            p.offered.store(0, Ordering::SeqCst);
        }
    }

    /// Waits until `to` has taken message `seq` of `total` bytes, moving the exchange's
    /// receive on meanwhile when there is one. Giving up (abort, lost peer, deadline) first
    /// withdraws the offer, so that the caller's buffer may be reused at once.
    pub(in crate::progress) fn wait_taken(
        &self,
        to: u32,
        io: &PeerIo,
        seq: u64,
        total: u64,
        mut companion: Option<&mut Companion<'_>>,
        deadline: Option<Instant>,
    ) -> Result<(), CollectiveError> {
        let Some(words) = self.single_copy.peer(to) else {
            return Ok(());
        };
        let started = Instant::now();
        let expected =
            Duration::from_nanos(total.saturating_mul(1_000_000_000) / EXPECTED_COPY_BYTES_PER_SEC);
        let spin = self.cfg.spin.max(expected.min(LONGEST_SPIN));
        let mut nap = Duration::from_micros(20);
        loop {
            if words.taken.load(Ordering::SeqCst) == seq + 1 {
                return Ok(());
            }
            if let Some(c) = companion.as_deref_mut() {
                if self.serve_companion(c) {
                    continue;
                }
            }
            let now = Instant::now();
            let lost = crate::sync::lock(&self.hub.state).peers[to as usize]
                .lost
                .clone();
            let timed_out = deadline.is_some_and(|d| now >= d);
            if self.is_aborted() || lost.is_some() || timed_out {
                self.withdraw_offer(to);
                // The peer may have taken it just before the offer was withdrawn.
                if words.taken.load(Ordering::SeqCst) == seq + 1 {
                    return Ok(());
                }
                return Err(match lost {
                    _ if self.is_aborted() => CollectiveError::Aborted,
                    Some(lost) => lost.error(to),
                    None => self.abandon_send(to, io, "before it took the message"),
                });
            }
            if now.duration_since(started) < spin {
                // Yielding rather than spinning on the bare word: where ranks share cores, the
                // thread copying this message may be waiting for this one's core.
                std::thread::yield_now();
                continue;
            }
            // The peer has not taken it within the copy's time: it is busy elsewhere (most
            // often it has not posted its receive yet), or blocked sending to this rank. Wait
            // in growing naps without reading other links: a message read now from a peer
            // that is about to post its receive would land in a copy. Two ranks sending to
            // each other still make progress, because the background watcher drains links
            // nobody reads (into the unexpected budget, as for messages over TCP).
            match companion.as_deref_mut().filter(|c| c.reading()) {
                Some(c) => {
                    self.wait_exchange(io, 0, c);
                }
                None => self.nap(nap),
            }
            nap = (nap * 2).min(LONGEST_NAP);
        }
    }

    /// Sleeps for `nap`, waking at once when the transport is aborted, and runs the duties a
    /// layer above installed for blocked sends (`rlx_transport::blocked_send`).
    fn nap(&self, nap: Duration) {
        if nap < LONGEST_NAP {
            std::thread::sleep(nap);
        } else {
            let mut fds = [pollfd(self.abort_rx.as_raw_fd(), libc::POLLIN)];
            poll(&mut fds, nap);
        }
        blocked_send::waiting();
    }

    /// The process a single-copy frame from `from` is read from: the one whose offer this rank
    /// took. A peer that sends one without such an offer breaks the protocol, and is refused
    /// before anything is allocated or read for it.
    pub(in crate::progress) fn pull_source(&self, from: u32) -> Result<u32, Lost> {
        let pid = self
            .single_copy
            .peer(from)
            .map_or(0, |p| p.pull_from.load(Ordering::Relaxed));
        if pid == 0 {
            return Err(Lost::Protocol(format!(
                "single-copy frame from rank {from}, which did not prove it runs on this host"
            )));
        }
        Ok(pid)
    }

    /// Reads pulled message `seq` of `header.total` bytes from process `pid` (rank `from`)
    /// into its destination, checks that the sender still offers it, and tells the sender it
    /// was taken.
    pub(in crate::progress) fn take_pulled(
        &self,
        from: u32,
        pid: u32,
        header: &FrameHeader,
        desc: &Descriptor,
        land: Land,
        own: Option<&mut Own<'_>>,
    ) -> Result<(), Lost> {
        let total = header.total;
        match land {
            Land::Caller => match own
                .and_then(|o| o.buf.as_deref_mut())
                .and_then(|buf| buf.get_mut(..usize::try_from(total).ok()?))
            {
                Some(buf) => self.read_pulled(from, pid, header, desc, buf)?,
                None => {
                    return Err(Lost::Protocol(format!(
                        "frame from rank {from} addressed a receive buffer that is not present"
                    )));
                }
            },
            Land::Owned(dest) => {
                // SAFETY: see `RawDest`: the owned buffer of this arriving message is `total`
                // bytes long, and this link alone writes it (a pulled message is one stripe).
                let slice = unsafe { std::slice::from_raw_parts_mut(dest.0, total as usize) };
                self.read_pulled(from, pid, header, desc, slice)?;
            }
            Land::Discard => {}
        }
        self.check_still_offered(from, pid, header, desc)?;
        let ticket = header.seq + 1;
        cross_memory::write_word(pid, desc.taken, ticket)
            .map_err(|e| self.pull_failed(from, pid, "writing the taken word", e))?;
        self.traffic
            .received_single_copy(total, matches!(land, Land::Owned(_)));
        Ok(())
    }

    /// Checks that rank `from` (process `pid`) still offers message `header.seq`: a sender
    /// that gave up may have reused its buffer, so what was read from it is not trusted.
    pub(in crate::progress) fn check_still_offered(
        &self,
        from: u32,
        pid: u32,
        header: &FrameHeader,
        desc: &Descriptor,
    ) -> Result<(), Lost> {
        let mut offered = [0u8; 8];
        cross_memory::read_from(pid, &[(desc.offered, 8)], &mut offered)
            .map_err(|e| self.pull_failed(from, pid, "reading the offer word", e))?;
        if u64::from_ne_bytes(offered) != header.seq + 1 {
            return Err(Lost::Gone(format!(
                "rank {from} at {} withdrew message {} while it was being read (its send gave up)",
                self.peer_label(from),
                header.seq
            )));
        }
        Ok(())
    }

    /// The loss of rank `from` (process `pid`) after `what` failed with `e`.
    pub(in crate::progress) fn pull_failed(
        &self,
        from: u32,
        pid: u32,
        what: &str,
        e: std::io::Error,
    ) -> Lost {
        Lost::Gone(format!(
            "{what} of process {pid} (rank {from} at {}) failed: {e}",
            self.peer_label(from)
        ))
    }

    fn peer_label(&self, rank: u32) -> &str {
        let addr = self.peers.get(rank as usize).and_then(|p| p.as_ref());
        addr.map_or("an unknown address", |p| p.addr.as_str())
    }

    /// Offers every peer on this host to read this process (see the module docs): one
    /// [`FrameKind::Offer`] frame on its first link, written before any message. Nothing waits
    /// for an answer; until one arrives, messages to that peer go over TCP.
    pub(crate) fn offer_single_copy(&self) {
        if !self.single_copy_willing() {
            return;
        }
        for peer in (0..self.world).filter(|&p| p != self.rank) {
            let Some(words) = self
                .single_copy
                .peer(peer)
                .filter(|_| self.single_copy.on_this_host(peer))
            else {
                continue;
            };
            let mut offer = [0u8; OFFER_LEN];
            offer[0..8].copy_from_slice(&u64::from(cross_memory::own_pid()).to_le_bytes());
            let nonce = self.single_copy.nonce.as_ptr() as usize as u64;
            offer[8..16].copy_from_slice(&nonce.to_le_bytes());
            let accepted = words.accepted.as_ptr() as usize as u64;
            offer[16..24].copy_from_slice(&accepted.to_le_bytes());
            offer[24..40].copy_from_slice(&self.single_copy.nonce[..]);
            let (lane_fd, lane_id) = self.make_lane(peer);
            offer[40..48].copy_from_slice(&lane_fd.to_le_bytes());
            offer[48..56].copy_from_slice(&lane_id.to_le_bytes());
            // A link that does not take these few bytes at once is broken or about to be;
            // the path simply stays off for it.
            let sent = self.try_send(
                peer,
                FrameKind::Offer,
                Tag::from_raw(0),
                &[&offer],
                OFFER_WAIT,
            );
            tracing::debug!(peer, ?sent, "single-copy offer");
        }
    }

    /// Makes the lane to `peer` (`lane.rs`) when lanes are on, and returns its name for the
    /// offer (zeros: none).
    fn make_lane(&self, peer: u32) -> (u64, u64) {
        if self.cfg.lane_bytes == 0 {
            return (0, 0);
        }
        let Some(Some(io)) = self.peers.get(peer as usize) else {
            return (0, 0);
        };
        let mut tx = lock(&io.tx);
        if tx.lane.is_none() {
            tx.lane = LaneOut::create(self.cfg.lane_bytes);
        }
        tx.lane.as_ref().map_or((0, 0), LaneOut::name)
    }

    /// Takes `peer`'s offer (the bytes of a [`FrameKind::Offer`] frame): when this rank is
    /// willing and the nonce is where the peer says, in the process it names, this rank reads
    /// the peer's large messages from that process from now on, and writes the peer's
    /// `accepted` word so that it starts sending them by pull. Anything else leaves the path
    /// off for that peer and is not an error: the offer is an optimisation.
    ///
    /// Returns the peer's lane, mapped and accepted, when the offer names one and lanes are on
    /// here; link 0 reads it once the peer's switch frame arrives.
    pub(in crate::progress) fn take_offer(&self, peer: u32, offer: &[u8]) -> Option<LaneIn> {
        if !self.single_copy_willing() {
            return None;
        }
        let words = self.single_copy.peer(peer)?;
        let word = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&offer[i..i + 8]);
            u64::from_le_bytes(w)
        };
        let pid = u32::try_from(word(0)).unwrap_or(0);
        words.accepted_at.store(word(16), Ordering::Relaxed);
        let mut seen = [0u8; 16];
        let proven = pid != 0
            && cross_memory::read_from(pid, &[(word(8), 16)], &mut seen).is_ok()
            && seen[..] == offer[24..40];
        if !proven {
            tracing::debug!(
                peer,
                pid,
                "single-copy offer not taken: its nonce was not readable"
            );
            return None;
        }
        // The first proven process stays the peer's: a later offer naming another is ignored.
        let current =
            match words
                .pull_from
                .compare_exchange(0, pid, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => pid,
                Err(current) => current,
            };
        if current != pid {
            return None;
        }
        match cross_memory::write_word(pid, word(16), 1) {
            Ok(()) => tracing::debug!(peer, pid, "single-copy offer taken"),
            Err(e) => tracing::debug!(peer, pid, %e, "single-copy offer not answered"),
        }
        let (lane_fd, lane_id) = (word(40), word(48));
        if lane_fd == 0 || self.cfg.lane_bytes == 0 {
            return None;
        }
        LaneIn::open(pid, lane_fd, lane_id)
            .inspect_err(|e| tracing::debug!(peer, pid, %e, "lane not mapped; link 0 stays on TCP"))
            .ok()
    }

    /// The segment size for pipelined collectives among `members` when they all run on this
    /// host (see `Transport::segment_hint`). Where the ranks run is seen alike from both ends
    /// of every link, so every member answers alike, whatever its own `RLX_SINGLE_COPY`: a
    /// setting of one rank's would make the members cut their buffers differently. Over the
    /// single-copy path each message costs a round trip of about 17 µs on the reference
    /// machine and pipelining buys nothing; over loopback TCP (the path switched off, or not
    /// permitted) 4 MiB segments measured as fast as 256 KiB ones.
    pub(crate) fn segment_hint(&self, members: &[u32]) -> Option<usize> {
        let all_here = members
            .iter()
            .all(|&m| m == self.rank || self.single_copy.on_this_host(m));
        (cross_memory::SUPPORTED && members.len() > 1 && all_here).then_some(ONE_HOST_SEGMENT)
    }

    /// Whether this rank offers to be read and takes its peers' offers: the system has the
    /// calls and `RLX_SINGLE_COPY` did not turn the path off.
    fn single_copy_willing(&self) -> bool {
        cross_memory::SUPPORTED && self.cfg.min_single_copy != u64::MAX
    }

    /// Whether this rank reads large messages from `peer` by pull (for tests and tools).
    pub(crate) fn pulls_from(&self, peer: u32) -> bool {
        self.single_copy
            .peer(peer)
            .is_some_and(|p| p.pull_from.load(Ordering::Relaxed) != 0)
    }
}

/// Decodes a pulled frame's descriptor, as a protocol failure of the peer when it is bad.
pub(in crate::progress) fn descriptor(
    from: u32,
    bytes: &[u8],
    total: u64,
) -> Result<Descriptor, Lost> {
    let mut raw = [0u8; DESCRIPTOR_LEN];
    raw.copy_from_slice(&bytes[..DESCRIPTOR_LEN]);
    Descriptor::decode(from, &raw, total).map_err(protocol_lost)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_round_trip_and_bad_ones_are_refused() {
        let d = Descriptor {
            offered: 0x1000,
            taken: 0x1008,
            parts: [(0x7000, 100), (0x9000, 28), (0, 0), (0, 0)],
            count: 2,
            bounced: Bounced {
                fd: 9,
                id: 0x55,
                len: 100,
            },
        };
        assert_eq!(Descriptor::decode(3, &d.encode(), 128).unwrap(), d);
        let refused =
            |bytes: [u8; DESCRIPTOR_LEN], total: u64| match Descriptor::decode(3, &bytes, total) {
                Err(CollectiveError::Protocol {
                    peer: Some(3),
                    detail,
                }) => detail,
                other => panic!("expected a protocol error, got {other:?}"),
            };
        assert!(refused(d.encode(), 129).contains("128 bytes of a message of 129"));
        let mut none = d;
        none.count = 0;
        refused(none.encode(), 128);
        let mut many = d.encode();
        many[16..24].copy_from_slice(&5u64.to_le_bytes());
        refused(many, 128);
        let mut stray = d.encode();
        stray[PARTS_AT + 16 * 3] = 1;
        refused(stray, 128);
        let mut past = d;
        past.bounced.len = 129;
        assert!(refused(past.encode(), 128).contains("bounces 129 bytes"));
        let mut nameless = d;
        nameless.bounced.len = 0;
        refused(nameless.encode(), 128);
        let huge = Descriptor {
            parts: [(1, u64::MAX), (2, u64::MAX), (0, 0), (0, 0)],
            ..d
        };
        refused(huge.encode(), u64::MAX);
    }
}
