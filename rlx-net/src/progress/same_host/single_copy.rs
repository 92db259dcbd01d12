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
//!    [`FrameKind::SingleCopy`] frame on link 0: a header whose lengths are the message's, followed by
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
//! The offer (`offer.rs`), made once when the transport is built: a willing rank writes a [`FrameKind::Offer`] frame as the first frame of link 0 to each peer on this
//! host (reached over loopback or at its own address, see `peer_on_this_host`): its process id,
//! the address and value of a random nonce of its own, the address of its `accepted` word, and
//! the name of its shared-memory lane to that peer (`lane.rs`), if it made one.
//! A peer reads the nonce in the named process and, when the bytes match and its own
//! single-copy path is on (`RLX_SINGLE_COPY` is not `0`), reads that peer's pulled messages from
//! that process from then on and writes 1 into its `accepted` word. A rank sends by pull only to peers that wrote its `accepted` word, and reads by pull
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
//! [`EngineConfig::min_single_copy`]: crate::progress::EngineConfig::min_single_copy
//! [`FrameKind::SingleCopy`]: crate::frame::FrameKind::SingleCopy
//! [`FrameKind::Offer`]: crate::frame::FrameKind::Offer

use crate::sync::{Mutex, MutexGuard, lock};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rlx_transport::{CollectiveError, blocked_send};

use crate::error::Lost;
use crate::frame::FrameHeader;

use super::SameHost;
use super::bounce::{BounceFile, PeerBounceFile};
use super::descriptor::{BouncedHead, DESCRIPTOR_LEN, Descriptor, MAX_PARTS};
use super::sys::cross_memory;
use crate::progress::hook::ProgressHook;
use crate::progress::link::{Destination, OwnReceive, PeerIo};
use crate::progress::socket::{poll, pollfd};

/// Default of [`EngineConfig::min_single_copy`](super::EngineConfig::min_single_copy): below
/// this the loopback stream is as fast, and the round trip of the `taken` word costs more than
/// the copy it saves.
pub(crate) const DEFAULT_MIN_SINGLE_COPY: u64 = 256 << 10;

/// How fast the sender expects the receiver to copy, to decide how long it spins for the
/// `taken` word before it sleeps between looks (a conservative memory-copy rate).
const EXPECTED_COPY_BYTES_PER_SEC: u64 = 2 << 30;

/// The longest a sender looks at the `taken` word without sleeping, however long the copy
/// should take: past it the receiver is most likely busy elsewhere, not copying.
const LONGEST_SPIN: Duration = Duration::from_millis(5);

/// The longest sleep between two looks at the `taken` word.
const LONGEST_NAP: Duration = Duration::from_millis(1);

/// How one message travels to its peer: the writer asks once per message
/// ([`SameHost::carriage`]).
#[derive(Debug)]
pub(in crate::progress) enum Carriage {
    /// As frames on the links.
    Stream,
    /// As one frame carrying the descriptor the peer reads the message by, with its head
    /// `bounced` through the bounce file (`bounce.rs`).
    SingleCopy {
        descriptor: [u8; DESCRIPTOR_LEN],
        bounced: BouncedHead,
    },
}

/// What this rank knows and publishes for one peer.
#[derive(Debug, Default)]
pub(super) struct PeerCopy {
    /// The peer's process id once this rank read its nonce there (0: never).
    pub(super) pull_from: AtomicU32,
    /// The peer read this rank's nonce and wrote 1 here: large messages to it go by pull. It
    /// writes [`ACCEPTED_NO_BOUNCE`](super::bounce::ACCEPTED_NO_BOUNCE) instead when it cannot map this rank's bounce file.
    pub(super) accepted: AtomicU64,
    /// The address of the peer's `accepted` word, from its offer (0: none taken).
    pub(super) accepted_at: AtomicU64,
    /// The ticket of the message this rank offers the peer now (0: none).
    pub(super) offered: AtomicU64,
    /// The ticket of the last message the peer has taken.
    pub(super) taken: AtomicU64,
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
    pub(super) nonce: &'static [u8; 16],
    /// Indexed by rank: the rank runs on this host (see `peer_on_this_host`), as its first
    /// link said when the transport was built.
    here: Box<[bool]>,
    /// Indexed by rank: this rank's mapping of the peer's bounce file, used by whoever reads
    /// the peer's pulled messages.
    views: Box<[Mutex<Option<PeerBounceFile>>]>,
    /// Indexed by rank: the bounce file of this rank's messages to the peer, made at the first
    /// one; used under the peer's send lock.
    bounce_files: Box<[Mutex<Option<BounceFile>>]>,
}

impl SingleCopy {
    /// The state of an engine whose peers `here[r]` says run on this host.
    pub(super) fn new(here: Box<[bool]>) -> Self {
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
            bounce_files: here.iter().map(|_| Mutex::new(None)).collect(),
            here,
        }
    }

    /// Whether `rank` runs on this host.
    pub(super) fn on_this_host(&self, rank: u32) -> bool {
        self.here.get(rank as usize).copied().unwrap_or(false)
    }

    pub(super) fn peer(&self, rank: u32) -> Option<&PeerCopy> {
        self.peers.get(rank as usize)
    }

    /// This rank's mapping of `rank`'s bounce file, locked.
    pub(in crate::progress) fn view(
        &self,
        rank: u32,
    ) -> Option<MutexGuard<'_, Option<PeerBounceFile>>> {
        self.views.get(rank as usize).map(|v| lock(v))
    }

    /// The bounce file of this rank's messages to `rank`, locked.
    pub(in crate::progress) fn bounce_file(
        &self,
        rank: u32,
    ) -> Option<MutexGuard<'_, Option<BounceFile>>> {
        self.bounce_files.get(rank as usize).map(|f| lock(f))
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

impl SameHost<'_> {
    /// How data message `seq` in `parts` travels to `to` (sent in an exchange or not): by
    /// single copy when the peer took this rank's offer and the message is large enough and
    /// in few enough parts, then published as offered with its bounced head prepared; else as
    /// frames on the links.
    pub(in crate::progress) fn carriage(
        &self,
        to: u32,
        seq: u64,
        parts: &[&[u8]],
        exchange: bool,
    ) -> Carriage {
        let total: u64 = parts.iter().map(|p| p.len() as u64).sum();
        if !self.sends_single_copy_to(to, total, parts.len()) {
            return Carriage::Stream;
        }
        let bounced = self.prepare_bounce(to, seq, total, exchange);
        Carriage::SingleCopy {
            descriptor: self.offer(to, seq, parts, bounced),
            bounced,
        }
    }

    /// Whether a message of `total` bytes in `parts` to `to` goes by pull.
    fn sends_single_copy_to(&self, to: u32, total: u64, parts: usize) -> bool {
        total >= self.core.cfg.min_single_copy
            && parts <= MAX_PARTS
            && self
                .single_copy
                .peer(to)
                .is_some_and(|p| p.accepted.load(Ordering::Relaxed) & 1 == 1)
    }

    /// Publishes message `seq` to `to` as offered, with its head `bounced`, and returns its
    /// descriptor.
    fn offer(
        &self,
        to: u32,
        seq: u64,
        parts: &[&[u8]],
        bounced: BouncedHead,
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

    /// Waits until `to` has taken message `seq` of `total` bytes, moving the send's progress
    /// hook on meanwhile when there is one. Giving up (abort, lost peer, deadline) first
    /// withdraws the offer, so that the caller's buffer may be reused at once.
    pub(in crate::progress) fn wait_taken(
        &self,
        to: u32,
        io: &PeerIo,
        seq: u64,
        total: u64,
        mut hook: Option<&mut dyn ProgressHook>,
        deadline: Option<Instant>,
    ) -> Result<(), CollectiveError> {
        let Some(words) = self.single_copy.peer(to) else {
            return Ok(());
        };
        let started = Instant::now();
        let expected =
            Duration::from_nanos(total.saturating_mul(1_000_000_000) / EXPECTED_COPY_BYTES_PER_SEC);
        let spin = self.core.cfg.spin.max(expected.min(LONGEST_SPIN));
        let mut nap = Duration::from_micros(20);
        loop {
            if words.taken.load(Ordering::SeqCst) == seq + 1 {
                return Ok(());
            }
            if let Some(hook) = hook.as_deref_mut() {
                if hook.serve() {
                    continue;
                }
            }
            let now = Instant::now();
            let lost = crate::sync::lock(&self.core.hub.state).peers[to as usize]
                .lost
                .clone();
            let timed_out = deadline.is_some_and(|d| now >= d);
            if self.core.is_aborted() || lost.is_some() || timed_out {
                self.withdraw_offer(to);
                // The peer may have taken it just before the offer was withdrawn.
                if words.taken.load(Ordering::SeqCst) == seq + 1 {
                    return Ok(());
                }
                return Err(match lost {
                    _ if self.core.is_aborted() => CollectiveError::Aborted,
                    Some(lost) => lost.error(to),
                    None => self.core.abandon_send(to, io, "before it took the message"),
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
            match hook.as_deref_mut().filter(|h| h.reading()) {
                Some(hook) => {
                    hook.wait(io, 0);
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
            let mut fds = [pollfd(self.core.abort_rx.as_raw_fd(), libc::POLLIN)];
            poll(&mut fds, nap);
        }
        blocked_send::waiting();
    }

    /// The process a single-copy frame from `from` is read from: the one whose offer this rank
    /// took. A peer that sends one without such an offer breaks the protocol, and is refused
    /// before anything is allocated or read for it.
    pub(in crate::progress) fn single_copy_source(&self, from: u32) -> Result<u32, Lost> {
        let pid = self
            .single_copy
            .peer(from)
            .map_or(0, |p| p.pull_from.load(Ordering::Relaxed));
        if pid == 0 {
            return Err(Lost::Protocol(format!(
                "single-copy frame from rank {from}, which did not prove it runs on this host"
            )));
        }
        if !self.single_copy_on() {
            return Err(Lost::Protocol(format!(
                "single-copy frame from rank {from}, though this rank never accepted any \
                 (its single-copy path is off)"
            )));
        }
        Ok(pid)
    }

    /// Reads pulled message `seq` of `header.total` bytes from process `pid` (rank `from`)
    /// into its destination, checks that the sender still offers it, and tells the sender it
    /// was taken.
    pub(in crate::progress) fn take_single_copy(
        &self,
        from: u32,
        pid: u32,
        header: &FrameHeader,
        desc: &Descriptor,
        land: Destination,
        own: Option<&mut OwnReceive<'_>>,
    ) -> Result<(), Lost> {
        let total = header.total;
        match land {
            Destination::Caller => match own
                .and_then(|o| o.buf.as_deref_mut())
                .and_then(|buf| buf.get_mut(..usize::try_from(total).ok()?))
            {
                Some(buf) => self.read_single_copy(from, pid, header, desc, buf)?,
                None => {
                    return Err(Lost::Protocol(format!(
                        "frame from rank {from} addressed a receive buffer that is not present"
                    )));
                }
            },
            Destination::Owned(dest) => {
                // SAFETY: see `RawDest`: the owned buffer of this arriving message is `total`
                // bytes long, and this link alone writes it (a pulled message is one stripe).
                let slice = unsafe { std::slice::from_raw_parts_mut(dest.0, total as usize) };
                self.read_single_copy(from, pid, header, desc, slice)?;
            }
            Destination::Discard => {}
        }
        self.check_still_offered(from, pid, header, desc)?;
        let ticket = header.seq + 1;
        cross_memory::write_word(pid, desc.taken, ticket)
            .map_err(|e| self.single_copy_failed(from, pid, "writing the taken word", e))?;
        self.core
            .traffic
            .received_single_copy(total, matches!(land, Destination::Owned(_)));
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
            .map_err(|e| self.single_copy_failed(from, pid, "reading the offer word", e))?;
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
    pub(in crate::progress) fn single_copy_failed(
        &self,
        from: u32,
        pid: u32,
        what: &str,
        e: std::io::Error,
    ) -> Lost {
        // A process that is gone is the usual cause, and the plainest thing to say.
        if e.raw_os_error() == Some(libc::ESRCH) {
            return Lost::Gone(format!(
                "its process {pid} (at {}) has ended",
                self.peer_label(from)
            ));
        }
        Lost::Gone(format!(
            "{what} of process {pid} (rank {from} at {}) failed: {e}",
            self.peer_label(from)
        ))
    }

    fn peer_label(&self, rank: u32) -> &str {
        let addr = self.core.peers.get(rank as usize).and_then(|p| p.as_ref());
        addr.map_or("an unknown address", |p| p.addr.as_str())
    }
}
