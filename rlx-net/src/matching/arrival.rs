//! The arriving side of the matching state: a message's first frame finds its receive (or
//! its place in the queue, or waits), later frames and stripes follow it, and the last bytes
//! complete it.

use std::time::{Duration, Instant};

use rlx_transport::CollectiveError;

use super::{
    Arriving, Body, Dest, Landing, OWNER_READS_MIN, Outcome, PeerState, PostId, PostState, Posted,
    Queued, State, Target,
};
use crate::frame::{FrameHeader, FrameKind, Striping};

impl State {
    /// The reader of link 0 of `from` decoded the first frame of message `seq` (`total` bytes
    /// under `tag`). `reader` is the reading thread's own posted receive, if any. Returns where
    /// the payload lands; [`Landing::Park`] leaves the frame unread (budget exhausted, or a
    /// large message that a receive of another thread waits for with a buffer of its own).
    pub(crate) fn on_first_frame(
        &mut self,
        from: u32,
        header: &FrameHeader,
        reader: Option<PostId>,
    ) -> Result<Landing, CollectiveError> {
        let (seq, tag, total) = (header.seq, header.tag, header.total);
        let stripes = self.first_stripe(from, header)?;
        let (budget, longest_hold) = (self.budget, self.longest_hold);
        let peer = self.peer(from);
        let post = peer
            .posted
            .iter_mut()
            .find(|p| p.tag == tag && matches!(p.state, PostState::Waiting));
        let held = peer.held.take();
        let placed = match post {
            Some(post) => for_post(post, total, reader),
            None => {
                peer.held = held;
                unexpected(peer, header, budget, longest_hold)
            }
        };
        let Some((dest, target, capacity, landing)) = placed else {
            return Ok(Landing::Park);
        };
        peer.next_seq += 1;
        peer.arriving.push(Arriving {
            seq,
            tag,
            total,
            received: 0,
            dest,
            target,
            capacity,
            stripes,
            seen: 1,
        });
        let landing = match &mut peer.arriving.last_mut().map(|a| &mut a.dest) {
            Some(Dest::Owned(buf)) => Landing::Owned(buf.as_mut_ptr()),
            _ => landing,
        };
        if total == 0 {
            self.on_bytes(from, seq, 0)?;
        }
        Ok(landing)
    }

    /// The stripes of the message whose first frame `header` is, once the frame is checked to
    /// cover the first stripe and to carry the message number due from `from`.
    fn first_stripe(
        &mut self,
        from: u32,
        header: &FrameHeader,
    ) -> Result<Striping, CollectiveError> {
        let (seq, total) = (header.seq, header.total);
        // A pulled message is read whole by one thread, whatever the number of links.
        let stripes = match header.kind {
            FrameKind::SingleCopy => Striping::new(total, 1, u64::MAX),
            _ => Striping::new(total, self.links, self.min_striped),
        };
        if stripes.range(0) != (header.offset, header.len) {
            return Err(CollectiveError::protocol(
                Some(from),
                format!(
                    "first frame of message {seq} covers {}+{} bytes, not the first stripe of {total}",
                    header.offset, header.len
                ),
            ));
        }
        let due = self.peer(from).next_seq;
        if seq != due {
            return Err(CollectiveError::protocol(
                Some(from),
                format!("message number {seq} where {due} was due"),
            ));
        }
        Ok(stripes)
    }

    /// A later stripe (offset > 0) of message `seq` was decoded on some link. `reader` is the
    /// reading thread's own posted receive.
    pub(crate) fn on_stripe(
        &mut self,
        from: u32,
        link: usize,
        header: &FrameHeader,
        reader: Option<PostId>,
    ) -> Result<Landing, CollectiveError> {
        let (seq, tag, total) = (header.seq, header.tag, header.total);
        let peer = self.peer(from);
        let Some(a) = peer.arriving.iter_mut().find(|a| a.seq == seq) else {
            if seq >= peer.next_seq {
                return Ok(Landing::Park);
            }
            return Err(CollectiveError::protocol(
                Some(from),
                format!("stripe of message {seq}, which is not arriving"),
            ));
        };
        let bit = 1u64.checked_shl(link as u32).unwrap_or(0);
        if a.tag != tag
            || a.total != total
            || link >= a.stripes.count()
            || a.stripes.range(link) != (header.offset, header.len)
            || a.seen & bit != 0
        {
            return Err(CollectiveError::protocol(
                Some(from),
                format!(
                    "stripe {}+{} of message {seq} on link {link} does not match how it was cut",
                    header.offset, header.len
                ),
            ));
        }
        a.seen |= bit;
        Ok(match &mut a.dest {
            Dest::Owned(buf) => Landing::Owned(buf.as_mut_ptr()),
            Dest::Discard => Landing::Discard,
            Dest::Caller => match a.target {
                Target::Post(p) if reader == Some(p) => Landing::Caller,
                // The buffer's owner holds every link of this peer while its bytes may land
                // there, so another reader can only see a redirected destination.
                _ => Landing::Discard,
            },
        })
    }

    /// `n` more bytes of message `seq` have been written; completes it when all are there and
    /// returns whether it did.
    pub(crate) fn on_bytes(
        &mut self,
        from: u32,
        seq: u64,
        n: u64,
    ) -> Result<bool, CollectiveError> {
        let peer = self.peer(from);
        let Some(index) = peer.arriving.iter().position(|a| a.seq == seq) else {
            return Err(CollectiveError::protocol(
                Some(from),
                format!("bytes for message {seq}, which is not arriving"),
            ));
        };
        let a = &mut peer.arriving[index];
        a.received = a.received.saturating_add(n);
        if a.received < a.total {
            return Ok(false);
        }
        let a = peer.arriving.swap_remove(index);
        let outcome = match a.dest {
            Dest::Caller => Outcome::Landed(a.total as usize),
            Dest::Owned(buf) => Outcome::Owned(buf),
            Dest::Discard => Outcome::TooLong {
                capacity: a.capacity,
                got: a.total,
            },
        };
        match a.target {
            Target::Post(id) => {
                if let Some(post) = peer.post_mut(id) {
                    post.state = PostState::Done(outcome);
                }
            }
            Target::Unexpected => {
                if let Some(q) = peer
                    .queue
                    .iter_mut()
                    .find(|q| matches!(q.body, Body::Arriving) && q.seq == a.seq)
                {
                    q.body = match outcome {
                        Outcome::Owned(buf) => Body::Data(buf),
                        // A message redirected from a withdrawn receive into a discard has no
                        // bytes to offer; it still occupies its place so FIFO holds.
                        _ => Body::Data(Vec::new()),
                    };
                }
            }
        }
        Ok(true)
    }
}

/// Where a new message goes, as [`State::on_first_frame`] records it: its destination, the
/// receive or queue it is for, the receive's capacity and where the reader lands the payload.
type Placed = (Dest, Target, usize, Landing);

/// Where a message of `total` bytes for the waiting receive `post` goes; `None` leaves it
/// for the receive's own thread (`reader` is the reading thread's receive).
fn for_post(post: &mut Posted, total: u64, reader: Option<PostId>) -> Option<Placed> {
    let fits = post.capacity.is_none_or(|c| total <= c as u64);
    if fits && post.capacity.is_some() && reader != Some(post.id) && total >= OWNER_READS_MIN {
        // The receive's own thread lands it in its buffer: it is posted, so it reads this
        // link as soon as it gets it. Landing it here would cost an allocation and a copy of
        // the whole message.
        return None;
    }
    post.state = PostState::Filling;
    let capacity = post.capacity.unwrap_or(0);
    let target = Target::Post(post.id);
    Some(if !fits {
        (Dest::Discard, target, capacity, Landing::Discard)
    } else if reader == Some(post.id) && post.capacity.is_some() {
        (Dest::Caller, target, capacity, Landing::Caller)
    } else {
        (
            Dest::Owned(vec![0u8; total as usize]),
            target,
            capacity,
            Landing::Discard,
        )
    })
}

/// Where a message nobody waits for goes: queued in an owned buffer within `peer`'s
/// unexpected budget of `budget` bytes; `None` parks it (the budget is used up, or a large
/// message waits up to `longest_hold` for its receive).
fn unexpected(
    peer: &mut PeerState,
    header: &FrameHeader,
    budget: u64,
    longest_hold: Duration,
) -> Option<Placed> {
    let (seq, tag, total) = (header.seq, header.tag, header.total);
    if peer.holds(seq, total, Instant::now, longest_hold) {
        return None;
    }
    peer.held = None;
    if !peer.admits(total, budget) {
        return None;
    }
    peer.unexpected_bytes += total;
    peer.insert_queued(Queued {
        seq,
        tag,
        body: Body::Arriving,
        weight: total,
    });
    Some((
        Dest::Owned(vec![0u8; total as usize]),
        Target::Unexpected,
        0,
        Landing::Discard,
    ))
}
