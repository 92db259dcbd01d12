//! One peer's part of the matching state: its queue of arrived and arriving messages, its
//! posted receives, its unexpected-byte budget, whether it is lost, and who holds the reader
//! role of each of its links.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::{Arriving, Body, PostId, Posted, Queued};
use crate::error::Lost;

/// Who holds the reader role of a link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Holder {
    Free,
    /// A receiving thread, for its posted receive.
    Receiver(PostId),
    /// A caller's thread reading links for nobody in particular: a send whose own write
    /// would block, or a catch-up after this process was stopped.
    Sender,
    /// The background watcher.
    Background,
}

/// Reader-role bookkeeping of one link.
#[derive(Debug)]
pub(crate) struct LinkSlot {
    pub(crate) holder: Holder,
    /// Another thread waits for this link's reader role.
    pub(crate) wanted: bool,
    /// When a foreground thread last released it, or the watcher released it while a caller
    /// waited for it (the watcher leaves busy links alone).
    pub(crate) released_at: Instant,
    /// The link's next frame is parked (budget exhausted or waiting for link 0): polling its
    /// socket would spin, so pollers skip it until the state changes.
    pub(crate) parked: bool,
}

/// How long a large unexpected message waits per byte for its receive (in its sender's memory
/// when pulled, in the sockets when streamed): the time a byte takes to copy at 1 GB/s, about
/// what landing it in a buffer of the transport's own (a fresh allocation, then a second copy
/// into the receive) costs.
const HOLD_PER_BYTE: Duration = Duration::from_nanos(1);
/// The longest a large unexpected message waits for its receive, unless a test sets another
/// limit (`TcpTransportBuilder::longest_hold`).
pub(crate) const LONGEST_HOLD: Duration = Duration::from_millis(100);
/// Smaller unexpected messages are taken at once, as before holds existed: the copy a
/// hold saves them costs less than a millisecond, no more than the background watcher may take
/// to take them once their hold is over, and with 512 KiB blocks held a scatter of two ranks
/// fell into iterations of 0.5–2 ms (from 0.05) in some runs.
const HOLD_MIN_BYTES: u64 = 4 << 20;

/// A large unexpected message left unread for a while (see [`PeerState::holds`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Held {
    seq: u64,
    until: Instant,
}

/// Per-peer matching state.
#[derive(Debug)]
pub(crate) struct PeerState {
    pub(super) queue: VecDeque<Queued>,
    pub(super) posted: Vec<Posted>,
    pub(super) arriving: Vec<Arriving>,
    pub(super) unexpected_bytes: u64,
    /// Next sequence number expected at the start of a message (on link 0).
    pub(super) next_seq: u64,
    pub(crate) lost: Option<Lost>,
    pub(crate) links: Vec<LinkSlot>,
    /// The pulled message at the head of link 0 that waits for its receive to be posted.
    pub(super) held: Option<Held>,
}

impl PeerState {
    pub(super) fn new(links: usize) -> Self {
        Self {
            queue: VecDeque::new(),
            posted: Vec::new(),
            arriving: Vec::new(),
            unexpected_bytes: 0,
            next_seq: 0,
            lost: None,
            links: (0..links)
                .map(|_| LinkSlot {
                    holder: Holder::Free,
                    wanted: false,
                    released_at: Instant::now(),
                    parked: false,
                })
                .collect(),
            held: None,
        }
    }

    /// Whether unexpected message `seq` of `total` bytes (at least [`HOLD_MIN_BYTES`]) stays
    /// unread for now (its link parked): a pulled one in its sender's memory, a streamed one in
    /// the sockets, its sender's send waiting meanwhile. A receive posted meanwhile reads it
    /// straight into its buffer; landing it now would cost a buffer of its size and a second
    /// copy. It stays for about as long as that would take (at most `longest`), counted from
    /// when it was first seen, and is then taken like any message, so that ranks that send to
    /// each other before they receive still make progress.
    pub(super) fn holds(
        &mut self,
        seq: u64,
        total: u64,
        now: impl FnOnce() -> Instant,
        longest: Duration,
    ) -> bool {
        if total < HOLD_MIN_BYTES {
            return false;
        }
        // Only a message long enough to be held reads the clock: every small message that
        // arrives before its receive passes here.
        let now = now();
        match self.held {
            Some(held) if held.seq == seq => now < held.until,
            _ => {
                let hold = HOLD_PER_BYTE
                    .saturating_mul(u32::try_from(total).unwrap_or(u32::MAX))
                    .min(longest);
                self.held = Some(Held {
                    seq,
                    until: now + hold,
                });
                true
            }
        }
    }

    /// When the message this peer's link 0 is parked for stops waiting for its receive, if one
    /// is: from then on the background watcher takes it.
    pub(crate) fn hold_ends(&self) -> Option<Instant> {
        self.held.map(|held| held.until)
    }

    pub(super) fn post_mut(&mut self, id: PostId) -> Option<&mut Posted> {
        self.posted.iter_mut().find(|p| p.id == id)
    }

    pub(super) fn insert_queued(&mut self, entry: Queued) {
        let at = self
            .queue
            .iter()
            .position(|q| q.seq > entry.seq)
            .unwrap_or(self.queue.len());
        self.queue.insert(at, entry);
    }

    /// The mark of a peer whose messages nobody receives: `(next_seq, unexpected_bytes)` while
    /// a link is parked with unexpected bytes held (the budget stops the reader), `None`
    /// otherwise. A sequence number that stays put means nothing was received meanwhile.
    pub(crate) fn held_back(&self) -> Option<(u64, u64)> {
        let parked = self.links.iter().any(|l| l.parked);
        (parked && self.unexpected_bytes > 0).then_some((self.next_seq, self.unexpected_bytes))
    }

    /// Whether the unexpected budget admits `weight` more bytes (always when nothing is held).
    pub(super) fn admits(&self, weight: u64, budget: u64) -> bool {
        self.unexpected_bytes == 0 || self.unexpected_bytes.saturating_add(weight) <= budget
    }

    /// Drops the buffers of messages that will never complete; only called when no link of
    /// this peer has a reader (a reader may be writing into them).
    pub(crate) fn drop_arriving_if_lost(&mut self) {
        if self.lost.is_none() || self.links.iter().any(|l| l.holder != Holder::Free) {
            return;
        }
        let seqs: Vec<u64> = self.arriving.drain(..).map(|a| a.seq).collect();
        self.queue
            .retain(|q| !(matches!(q.body, Body::Arriving) && seqs.contains(&q.seq)));
        self.unexpected_bytes = self.queue.iter().map(|q| q.weight).sum();
    }
}
