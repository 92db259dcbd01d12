//! The matching state's transitions for failure notices: a notice travels in the same order as
//! the messages of its peer and is matched by tag like one, but carries a decoded [`Failure`]
//! instead of bytes and weighs a fixed amount against the unexpected budget.

use rlx_transport::{CollectiveError, Failure, Tag};

use super::{Body, Outcome, PeerState, PostState, Queued, State};

/// Accounting weight of one queued failure notice, so that a flood of them is bounded too.
pub(super) const NOTICE_WEIGHT: u64 = 64;

impl State {
    /// A failure notice this rank sent to itself.
    pub(crate) fn deliver_local_failure(
        &mut self,
        from: u32,
        seq: u64,
        tag: Tag,
        failure: Failure,
    ) {
        let peer = self.peer(from);
        if let Some(post) = peer
            .posted
            .iter_mut()
            .find(|p| p.tag == tag && matches!(p.state, PostState::Waiting))
        {
            post.state = PostState::Done(Outcome::Failure(failure));
            return;
        }
        queue_notice(peer, seq, tag, failure);
    }

    /// A failure notice for `tag` (message number `seq`) arrived from `from`.
    pub(crate) fn on_failure(
        &mut self,
        from: u32,
        seq: u64,
        tag: Tag,
        failure: Failure,
    ) -> Result<bool, CollectiveError> {
        let budget = self.budget;
        let peer = self.peer(from);
        if seq != peer.next_seq {
            return Err(CollectiveError::protocol(
                Some(from),
                format!(
                    "failure notice numbered {seq} where {} was due",
                    peer.next_seq
                ),
            ));
        }
        if let Some(post) = peer
            .posted
            .iter_mut()
            .find(|p| p.tag == tag && matches!(p.state, PostState::Waiting))
        {
            post.state = PostState::Done(Outcome::Failure(failure));
        } else {
            if !peer.admits(NOTICE_WEIGHT, budget) {
                return Ok(false);
            }
            queue_notice(peer, seq, tag, failure);
        }
        peer.next_seq += 1;
        Ok(true)
    }
}

/// Queues a notice no receive waits for yet, at its weight against the budget.
fn queue_notice(peer: &mut PeerState, seq: u64, tag: Tag, failure: Failure) {
    peer.unexpected_bytes += NOTICE_WEIGHT;
    peer.insert_queued(Queued {
        seq,
        tag,
        body: Body::Failure(failure),
        weight: NOTICE_WEIGHT,
    });
}
