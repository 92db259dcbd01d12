//! The matching state of one transport: which receives are posted, which messages are arriving
//! or waiting unclaimed, which peers are gone, who reads which socket.
//!
//! It is a plain state machine guarded by one mutex of [`crate::progress::Engine`]; every method
//! here runs under that lock and does no I/O. The reader of a socket calls
//! [`State::on_first_frame`], [`State::on_stripe`] and [`State::on_bytes`] as bytes arrive;
//! receivers call [`State::begin_recv`], [`State::poll_post`] and [`State::withdraw`]. The loom
//! models in `tests/loom_progress.rs` run the engine's receive loop over these methods from
//! racing threads.
//!
//! Memory: a message with a posted receive lands in that receive's buffer (or a buffer handed
//! to it); a message nobody waits for is *unexpected* and counts against a per-peer budget.
//! When the budget is used up the reader stops taking new frames from that peer (its header
//! stays parked), so TCP flow control pushes back on the sender. One message is always admitted
//! when nothing is buffered, so a message larger than the budget can still arrive.
//!
//! Layout: this file holds the types, the invariants and the receive side's transitions
//! (posting, polling, withdrawing, putting back, losing); `arrival.rs` the arriving side's
//! (first frames, stripes, bytes), which move the same per-peer queues and budgets and must
//! keep the same invariants; `notices.rs` the transitions of failure notices, which travel in
//! the same order as messages; `peer.rs` holds one peer's queues, budget and reader roles;
//! `tests.rs` the unit tests.

use std::time::Duration;

use rlx_transport::{CollectiveError, Failure, Tag};

use crate::error::Lost;
use crate::frame::Striping;

mod arrival;
mod notices;
mod peer;
#[cfg(all(test, not(rlx_loom)))]
mod tests;

pub(crate) use peer::{Holder, LONGEST_HOLD, PeerState};

/// Messages at least this long that a posted receive with a buffer waits for are left on the
/// link for that receive's thread, which lands them in place, instead of being read into an
/// owned copy by whichever thread holds the link (the watcher, a blocked sender, another
/// receive). Shorter ones are copied: the copy costs less than handing the link over.
const OWNER_READS_MIN: u64 = 64 * 1024;

/// Identity of a posted receive.
pub(crate) type PostId = u64;

/// What a finished receive produced.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// The message, in a buffer of its own.
    Owned(Vec<u8>),
    /// The message landed in the receiver's own buffer; this many bytes.
    Landed(usize),
    /// The peer's failure notice.
    Failure(Failure),
    /// The message was longer than the receiver's buffer (and was consumed).
    TooLong {
        /// The buffer's length.
        capacity: usize,
        /// The message's length.
        got: u64,
    },
}

/// Where the payload of an arriving message goes.
#[derive(Debug)]
pub(crate) enum Dest {
    /// Into the buffer of the receive that the reading thread itself posted.
    Caller,
    /// Into this buffer, allocated at the checked length.
    Owned(Vec<u8>),
    /// Nowhere: the bytes are read and dropped (the receiver's buffer was too short).
    Discard,
}

#[derive(Debug)]
enum Target {
    /// Nobody waits for it yet; a placeholder sits in the queue at its place.
    Unexpected,
    /// The posted receive it belongs to.
    Post(PostId),
}

#[derive(Debug)]
struct Arriving {
    seq: u64,
    tag: Tag,
    total: u64,
    received: u64,
    dest: Dest,
    target: Target,
    /// For [`Dest::Discard`]: the receiver's buffer length, to report.
    capacity: usize,
    /// How the sender cut the message over the links; every stripe must match it exactly,
    /// so that stripes never overlap and each is written once.
    stripes: Striping,
    /// Stripes whose header has been seen (bit `i` for stripe `i`).
    seen: u64,
}

#[derive(Debug)]
enum Body {
    Data(Vec<u8>),
    Failure(Failure),
    /// Still arriving: the bytes are in the [`Arriving`] entry with this sequence number.
    Arriving,
}

#[derive(Debug)]
struct Queued {
    seq: u64,
    tag: Tag,
    body: Body,
    weight: u64,
}

#[derive(Debug)]
enum PostState {
    Waiting,
    Filling,
    Done(Outcome),
}

#[derive(Debug)]
struct Posted {
    id: PostId,
    tag: Tag,
    /// The receiver's buffer length for `recv_into`; `None` for a receive that returns a `Vec`.
    capacity: Option<usize>,
    state: PostState,
}

/// What a receive found when it started.
#[derive(Debug)]
pub(crate) enum Begin {
    /// A queued message or notice, ready now.
    Ready(Outcome),
    /// The receive is posted under this id; wait with [`State::poll_post`].
    Posted(PostId),
}

/// What the reader does with the payload of a frame whose header it just read.
#[derive(Debug)]
pub(crate) enum Landing {
    /// Write `len` bytes at `offset` of the reading thread's own buffer.
    Caller,
    /// Write into the owned buffer starting at this address (stable while the message arrives).
    Owned(*mut u8),
    /// Read and drop.
    Discard,
    /// Not now: the budget is exhausted, or (for a stripe) link 0 has not announced the message.
    Park,
}

/// The whole matching state of a transport.
#[derive(Debug)]
pub(crate) struct State {
    pub(crate) peers: Vec<PeerState>,
    pub(crate) aborted: bool,
    next_post: PostId,
    budget: u64,
    links: usize,
    min_striped: u64,
    /// The longest an unexpected pulled message waits for its receive ([`LONGEST_HOLD`]
    /// unless a test sets it).
    longest_hold: Duration,
}

impl State {
    /// State for `world` peers with `links` links each and an unexpected budget of `budget`
    /// bytes per peer.
    /// Messages of at least `min_striped` bytes are striped over the `links` links.
    pub(crate) fn new(world: u32, links: usize, budget: u64, min_striped: u64) -> Self {
        Self {
            peers: (0..world).map(|_| PeerState::new(links)).collect(),
            aborted: false,
            next_post: 1,
            budget,
            links: links.clamp(1, 64),
            min_striped,
            longest_hold: LONGEST_HOLD,
        }
    }

    /// Lets unexpected pulled messages wait at most `hold` for their receives.
    pub(crate) fn set_longest_hold(&mut self, hold: Duration) {
        self.longest_hold = hold;
    }

    /// Whether the posted receive `id` has its outcome.
    pub(crate) fn is_done(&mut self, from: u32, id: PostId) -> bool {
        self.peer(from)
            .posted
            .iter()
            .any(|p| p.id == id && matches!(p.state, PostState::Done(_)))
    }

    /// A message this rank sent to itself: complete at once, outside the budget (the sender is
    /// this process, which can always wait for itself).
    pub(crate) fn deliver_local(&mut self, from: u32, seq: u64, tag: Tag, bytes: Vec<u8>) {
        let peer = self.peer(from);
        if let Some(post) = peer
            .posted
            .iter_mut()
            .find(|p| p.tag == tag && matches!(p.state, PostState::Waiting))
        {
            post.state = PostState::Done(match post.capacity {
                Some(capacity) if bytes.len() > capacity => Outcome::TooLong {
                    capacity,
                    got: bytes.len() as u64,
                },
                _ => Outcome::Owned(bytes),
            });
            return;
        }
        let weight = bytes.len() as u64;
        peer.unexpected_bytes += weight;
        peer.insert_queued(Queued {
            seq,
            tag,
            body: Body::Data(bytes),
            weight,
        });
    }

    fn peer(&mut self, from: u32) -> &mut PeerState {
        // Ranks are validated by the transport before any call reaches the state.
        let index = (from as usize).min(self.peers.len().saturating_sub(1));
        &mut self.peers[index]
    }

    /// What a receive from `from` under `tag` that will not wait ends with when nothing
    /// under `tag` is queued (the abort, the peer's loss, or no message yet), so that it need
    /// not be posted and withdrawn; `None` when there is a message to take.
    pub(crate) fn empty_handed(
        &mut self,
        from: u32,
        tag: Tag,
    ) -> Option<Result<Option<Outcome>, CollectiveError>> {
        if self.aborted {
            return Some(Err(CollectiveError::Aborted));
        }
        let peer = self.peer(from);
        if peer.queue.iter().any(|q| q.tag == tag) {
            return None;
        }
        Some(match &peer.lost {
            Some(lost) => Err(lost.error(from)),
            None => Ok(None),
        })
    }

    /// The messages from `from` that arrived or are arriving and wait for a receive, as (tag,
    /// length in bytes), oldest first; failure notices are not messages.
    pub(crate) fn unreceived_from(&mut self, from: u32) -> Vec<(Tag, u64)> {
        let peer = self.peer(from);
        peer.queue
            .iter()
            .filter_map(|q| match &q.body {
                Body::Data(bytes) => Some((q.tag, bytes.len() as u64)),
                Body::Arriving => peer
                    .arriving
                    .iter()
                    .find(|a| a.seq == q.seq)
                    .map(|a| (q.tag, a.total)),
                Body::Failure(_) => None,
            })
            .collect()
    }

    /// Starts a receive from `from` under `tag`: takes the first queued match, or posts.
    /// `capacity` is the receiver's buffer length (`None` when it wants a `Vec`).
    pub(crate) fn begin_recv(
        &mut self,
        from: u32,
        tag: Tag,
        capacity: Option<usize>,
    ) -> Result<Begin, CollectiveError> {
        if self.aborted {
            return Err(CollectiveError::Aborted);
        }
        let id = self.next_post;
        let peer = self.peer(from);
        if let Some(index) = peer.queue.iter().position(|q| q.tag == tag) {
            let arriving = matches!(peer.queue[index].body, Body::Arriving);
            let Some(entry) = peer.queue.remove(index) else {
                return Err(CollectiveError::protocol(
                    Some(from),
                    "queue entry vanished",
                ));
            };
            peer.unexpected_bytes = peer.unexpected_bytes.saturating_sub(entry.weight);
            for slot in &mut peer.links {
                slot.parked = false;
            }
            if !arriving {
                return Ok(Begin::Ready(match entry.body {
                    Body::Data(bytes) => match capacity {
                        Some(capacity) if bytes.len() > capacity => Outcome::TooLong {
                            capacity,
                            got: bytes.len() as u64,
                        },
                        _ => Outcome::Owned(bytes),
                    },
                    Body::Failure(f) => Outcome::Failure(f),
                    Body::Arriving => Outcome::Owned(Vec::new()),
                }));
            }
            // The message is still arriving: it becomes this receive's, and lands in its
            // owned buffer (the receiver copies it out when it completes).
            if let Some(a) = peer.arriving.iter_mut().find(|a| a.seq == entry.seq) {
                a.target = Target::Post(id);
            }
            peer.posted.push(Posted {
                id,
                tag,
                capacity,
                state: PostState::Filling,
            });
            self.next_post += 1;
            return Ok(Begin::Posted(id));
        }
        if let Some(lost) = &peer.lost {
            return Err(lost.error(from));
        }
        peer.posted.push(Posted {
            id,
            tag,
            capacity,
            state: PostState::Waiting,
        });
        self.next_post += 1;
        Ok(Begin::Posted(id))
    }

    /// Checks on a posted receive: `Some` when it is finished (the post is then gone), with the
    /// outcome or the error that ends it (lost peer, abort).
    pub(crate) fn poll_post(
        &mut self,
        from: u32,
        id: PostId,
    ) -> Option<Result<Outcome, CollectiveError>> {
        let aborted = self.aborted;
        let peer = self.peer(from);
        let index = peer.posted.iter().position(|p| p.id == id)?;
        if matches!(peer.posted[index].state, PostState::Done(_)) {
            let post = peer.posted.remove(index);
            return match post.state {
                PostState::Done(outcome) => Some(Ok(outcome)),
                _ => None,
            };
        }
        if aborted {
            self.remove_post(from, id);
            return Some(Err(CollectiveError::Aborted));
        }
        if let Some(lost) = &peer.lost {
            let err = lost.error(from);
            self.remove_post(from, id);
            return Some(Err(err));
        }
        None
    }

    /// How many bytes have landed of the message arriving into the reading thread's own
    /// buffer for posted receive `id` from `from`; `None` when no message lands there.
    pub(crate) fn landed_for(&self, from: u32, id: PostId) -> Option<u64> {
        self.peers
            .get(from as usize)?
            .arriving
            .iter()
            .find_map(|a| {
                let own = matches!(a.target, Target::Post(p) if p == id);
                (own && matches!(a.dest, Dest::Caller)).then_some(a.received)
            })
    }

    fn remove_post(&mut self, from: u32, id: PostId) {
        let peer = self.peer(from);
        peer.posted.retain(|p| p.id != id);
        for a in &mut peer.arriving {
            if matches!(a.target, Target::Post(p) if p == id) {
                a.target = Target::Unexpected;
                if matches!(a.dest, Dest::Caller) {
                    a.dest = Dest::Discard;
                }
            }
        }
    }

    /// Gives up a posted receive at its deadline. A message already assigned to it but still
    /// arriving becomes unexpected again, at its place in the queue; if it was landing in the
    /// caller's buffer, `own` (that buffer) is copied into a new owned buffer and the address
    /// of that buffer is returned so the caller can redirect the links that are mid-frame.
    /// A receive that finished in the meantime returns its outcome instead.
    pub(crate) fn withdraw(&mut self, from: u32, id: PostId, own: Option<&[u8]>) -> Withdrawn {
        if let Some(Ok(outcome)) = self.poll_post(from, id) {
            return Withdrawn::Finished(outcome);
        }
        let peer = self.peer(from);
        peer.posted.retain(|p| p.id != id);
        // A link may have been left for this receive's thread (see `OWNER_READS_MIN`): its
        // frame is read again, as a message nobody waits for or for another receive.
        for slot in &mut peer.links {
            slot.parked = false;
        }
        let mut moved = None;
        let mut requeue = None;
        for a in &mut peer.arriving {
            if !matches!(a.target, Target::Post(p) if p == id) {
                continue;
            }
            a.target = Target::Unexpected;
            if matches!(a.dest, Dest::Caller) {
                let total = a.total as usize;
                let mut copy = vec![0u8; total];
                if let Some(src) = own.and_then(|b| b.get(..total)) {
                    copy.copy_from_slice(src);
                }
                a.dest = Dest::Owned(copy);
                if let Dest::Owned(buf) = &mut a.dest {
                    moved = Some((a.seq, buf.as_mut_ptr()));
                }
            }
            requeue = Some((a.seq, a.tag, a.total));
        }
        if let Some((seq, tag, total)) = requeue {
            peer.unexpected_bytes = peer.unexpected_bytes.saturating_add(total);
            peer.insert_queued(Queued {
                seq,
                tag,
                body: Body::Arriving,
                weight: total,
            });
        }
        match moved {
            Some((seq, base)) => Withdrawn::Moved { seq, base },
            None => Withdrawn::Gone,
        }
    }

    /// Puts a message that a receive had taken back at the head of `from`'s queue, when the
    /// call that took it failed for another reason (an exchange whose send failed): a later
    /// receive under `tag` takes it as if it had never been received. `own` is the receive's
    /// buffer, where a landed message is. Receives match in order, so it was the oldest
    /// message of its tag and the head keeps each tag's order (the order across tags does not
    /// matter); it takes the head's sequence number, which keeps the queue sorted and is never
    /// looked up (only arriving entries are). A message too long for the receive's buffer was
    /// consumed by it and has nothing to put back.
    pub(crate) fn put_back(&mut self, from: u32, tag: Tag, outcome: Outcome, own: Option<&[u8]>) {
        let (body, weight) = match outcome {
            Outcome::Owned(bytes) => {
                let weight = bytes.len() as u64;
                (Body::Data(bytes), weight)
            }
            Outcome::Landed(len) => {
                let bytes = own
                    .and_then(|b| b.get(..len))
                    .map_or_else(Vec::new, <[u8]>::to_vec);
                let weight = bytes.len() as u64;
                (Body::Data(bytes), weight)
            }
            Outcome::Failure(failure) => (Body::Failure(failure), notices::NOTICE_WEIGHT),
            Outcome::TooLong { .. } => return,
        };
        let peer = self.peer(from);
        let seq = peer.queue.front().map_or(0, |q| q.seq);
        peer.unexpected_bytes = peer.unexpected_bytes.saturating_add(weight);
        peer.queue.push_front(Queued {
            seq,
            tag,
            body,
            weight,
        });
    }

    /// Records that `from` is gone (the first cause is kept). Queued messages stay readable;
    /// receives that need more fail.
    pub(crate) fn mark_lost(&mut self, from: u32, lost: Lost) {
        let peer = self.peer(from);
        if peer.lost.is_none() {
            peer.lost = Some(lost);
        }
        peer.drop_arriving_if_lost();
    }

    /// Marks `from` lost for good with `lost` (replacing an earlier reason) and drops every
    /// complete message it had queued: an excluded peer's bytes must never be delivered.
    /// Messages still arriving are dropped once no reader writes into them.
    pub(crate) fn exclude(&mut self, from: u32, lost: Lost) {
        let peer = self.peer(from);
        peer.lost = Some(lost);
        peer.queue.retain(|q| matches!(q.body, Body::Arriving));
        peer.unexpected_bytes = peer.queue.iter().map(|q| q.weight).sum();
        peer.drop_arriving_if_lost();
    }

    /// Number of unexpected bytes buffered for `from` (for the loom models).
    #[cfg(rlx_loom)]
    pub(crate) fn unexpected_bytes_of(&self, from: u32) -> u64 {
        self.peers
            .get(from as usize)
            .map_or(0, |p| p.unexpected_bytes)
    }
}

/// What [`State::withdraw`] did.
#[derive(Debug)]
pub(crate) enum Withdrawn {
    /// The receive had finished after all.
    Finished(Outcome),
    /// The receive is gone; nothing of it was in flight into the caller's buffer.
    Gone,
    /// The receive is gone; message `seq` was landing in the caller's buffer and now lands at
    /// `base` (the first bytes already copied there).
    Moved {
        /// The message that moved.
        seq: u64,
        /// Its new buffer.
        base: *mut u8,
    },
}
