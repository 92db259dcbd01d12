//! The matching queue behind a transport's receives: messages that arrived, waiting for the
//! receive that names their `(source, tag)`.
//!
//! [`Inbox`] is transport-neutral: [`MemTransport`](crate::MemTransport) delivers into it from the
//! sending thread, and socket transports can deliver into it from whichever thread read the
//! frame. It keeps FIFO order per `(source, tag)`, wakes waiters on delivery, on a lost peer
//! and on abort, and honours deadlines.

use std::collections::VecDeque;
use std::fmt;
use std::time::{Duration, Instant};

use crate::sync::{Condvar, Mutex, lock};
use crate::{CollectiveError, Failure, Result, Tag};

/// What arrived: a message, or a peer's notice that its part of the operation failed.
#[derive(Debug)]
pub enum Delivery {
    /// A message body.
    Data(Vec<u8>),
    /// A [`Failure`] notice (see [`Transport::send_failure`](crate::Transport::send_failure)).
    Failure(Failure),
}

#[derive(Debug)]
struct Entry {
    from: u32,
    tag: Tag,
    delivery: Delivery,
}

#[derive(Debug, Default)]
struct State {
    /// Arrived, unclaimed messages in arrival order. A linear scan finds the first match: the
    /// queue is short in practice (a few messages per operation in flight), and one queue keeps
    /// steady-state traffic free of per-tag allocations.
    queue: VecDeque<Entry>,
    /// Peers that are gone, with the reason.
    lost: Vec<(u32, String)>,
    /// Set by [`Inbox::abort`].
    aborted: bool,
    /// Set by [`Inbox::close`]: the owner is gone and refuses new deliveries.
    closed: Option<String>,
    /// Peers the owner excluded ([`Inbox::exclude`]), whose deliveries are refused.
    excluded: Vec<u32>,
}

/// A thread-safe matching queue; see the module docs.
pub struct Inbox {
    owner: u32,
    state: Mutex<State>,
    arrived: Condvar,
}

impl fmt::Debug for Inbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = lock(&self.state);
        f.debug_struct("Inbox")
            .field("owner", &self.owner)
            .field("queued", &state.queue.len())
            .field("lost", &state.lost)
            .field("aborted", &state.aborted)
            .finish()
    }
}

impl Inbox {
    /// An empty inbox of rank `owner`.
    pub fn new(owner: u32) -> Self {
        Self {
            owner,
            state: Mutex::new(State::default()),
            arrived: Condvar::new(),
        }
    }

    /// Queues a delivery from `from` under `tag` and wakes the waiters. Fails with `PeerLost`
    /// (naming the owner) once the inbox is closed, so the sender learns its peer is gone.
    pub fn deliver(&self, from: u32, tag: Tag, delivery: Delivery) -> Result<()> {
        let mut state = lock(&self.state);
        if let Some(reason) = &state.closed {
            return Err(CollectiveError::PeerLost {
                peer: self.owner,
                reason: reason.clone(),
            });
        }
        if state.excluded.contains(&from) {
            return Err(CollectiveError::PeerLost {
                peer: self.owner,
                reason: format!("rank {} declared rank {from} dead", self.owner),
            });
        }
        state.queue.push_back(Entry {
            from,
            tag,
            delivery,
        });
        drop(state);
        self.arrived.notify_all();
        Ok(())
    }

    /// Records that `peer` is gone: receives from it fail with `PeerLost` once its queued
    /// messages are consumed. The first reason recorded for a peer is kept.
    pub fn mark_lost(&self, peer: u32, reason: impl Into<String>) {
        let mut state = lock(&self.state);
        if !state.lost.iter().any(|(p, _)| *p == peer) {
            state.lost.push((peer, reason.into()));
        }
        drop(state);
        self.arrived.notify_all();
    }

    /// Excludes `peer` for good: drops what it queued, refuses its later deliveries (the
    /// sender gets `PeerLost`) and fails receives from it with `PeerLost{reason}`.
    pub fn exclude(&self, peer: u32, reason: impl Into<String>) {
        let mut state = lock(&self.state);
        state.queue.retain(|entry| entry.from != peer);
        if !state.excluded.contains(&peer) {
            state.excluded.push(peer);
        }
        state.lost.retain(|(p, _)| *p != peer);
        state.lost.push((peer, reason.into()));
        drop(state);
        self.arrived.notify_all();
    }

    /// Whether `peer` has been marked lost.
    pub fn is_lost(&self, peer: u32) -> bool {
        lock(&self.state).lost.iter().any(|(p, _)| *p == peer)
    }

    /// Makes every waiting and later [`Inbox::take`] fail with `Aborted`.
    pub fn abort(&self) {
        lock(&self.state).aborted = true;
        self.arrived.notify_all();
    }

    /// Whether [`Inbox::abort`] was called.
    pub fn is_aborted(&self) -> bool {
        lock(&self.state).aborted
    }

    /// Refuses later deliveries with `PeerLost{reason}` and drops what is queued.
    pub fn close(&self, reason: impl Into<String>) {
        let mut state = lock(&self.state);
        state.closed = Some(reason.into());
        state.queue.clear();
    }

    /// The data messages from `from` that wait unclaimed, as (tag, length in bytes), oldest
    /// first.
    pub fn unreceived_from(&self, from: u32) -> Vec<(Tag, u64)> {
        lock(&self.state)
            .queue
            .iter()
            .filter(|entry| entry.from == from)
            .filter_map(|entry| match &entry.delivery {
                Delivery::Data(body) => Some((entry.tag, body.len() as u64)),
                Delivery::Failure(_) => None,
            })
            .collect()
    }

    /// Number of queued, unclaimed deliveries.
    pub fn queued(&self) -> usize {
        lock(&self.state).queue.len()
    }

    /// Waits up to `timeout` for the first delivery from `from` under `tag`.
    ///
    /// Returns the message, `Ok(None)` at the deadline, the peer's [`Failure`] as an error,
    /// `PeerLost` when `from` is gone and nothing of it is queued, or `Aborted`.
    pub fn take(&self, from: u32, tag: Tag, timeout: Duration) -> Result<Option<Vec<u8>>> {
        let deadline = Instant::now().checked_add(timeout);
        let mut state = lock(&self.state);
        loop {
            if state.aborted {
                return Err(CollectiveError::Aborted);
            }
            if let Some(index) = state
                .queue
                .iter()
                .position(|e| e.from == from && e.tag == tag)
            {
                let entry = state.queue.remove(index);
                return match entry.map(|e| e.delivery) {
                    Some(Delivery::Data(bytes)) => Ok(Some(bytes)),
                    Some(Delivery::Failure(failure)) => Err(failure.into_error(from)),
                    None => Err(CollectiveError::protocol(
                        Some(from),
                        "inbox entry vanished",
                    )),
                };
            }
            if let Some((_, reason)) = state.lost.iter().find(|(p, _)| *p == from) {
                return Err(CollectiveError::PeerLost {
                    peer: from,
                    reason: reason.clone(),
                });
            }
            let remaining = match deadline {
                Some(deadline) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return Ok(None);
                    }
                    Some(deadline - now)
                }
                None => None,
            };
            state = match remaining {
                Some(remaining) => match self.arrived.wait_timeout(state, remaining) {
                    Ok((guard, _)) => guard,
                    Err(poisoned) => poisoned.into_inner().0,
                },
                None => match self.arrived.wait(state) {
                    Ok(guard) => guard,
                    Err(poisoned) => poisoned.into_inner(),
                },
            };
        }
    }
}

#[cfg(all(test, not(rlx_loom)))]
mod tests {
    use super::*;

    #[test]
    fn fifo_per_source_and_tag() {
        let inbox = Inbox::new(0);
        let a = Tag::user(1).unwrap();
        let b = Tag::user(2).unwrap();
        inbox.deliver(1, a, Delivery::Data(vec![1])).unwrap();
        inbox.deliver(1, b, Delivery::Data(vec![2])).unwrap();
        inbox.deliver(1, a, Delivery::Data(vec![3])).unwrap();
        inbox.deliver(2, a, Delivery::Data(vec![4])).unwrap();
        let t = Duration::ZERO;
        assert_eq!(inbox.take(1, b, t).unwrap(), Some(vec![2]));
        assert_eq!(inbox.take(2, a, t).unwrap(), Some(vec![4]));
        assert_eq!(inbox.take(1, a, t).unwrap(), Some(vec![1]));
        assert_eq!(inbox.take(1, a, t).unwrap(), Some(vec![3]));
        assert_eq!(inbox.take(1, a, t).unwrap(), None);
    }

    #[test]
    fn lost_peer_drains_first_then_fails() {
        let inbox = Inbox::new(0);
        let a = Tag::user(1).unwrap();
        inbox.deliver(3, a, Delivery::Data(vec![9])).unwrap();
        inbox.mark_lost(3, "gone");
        assert_eq!(inbox.take(3, a, Duration::ZERO).unwrap(), Some(vec![9]));
        let err = inbox.take(3, a, Duration::from_secs(5)).unwrap_err();
        assert!(
            matches!(err, CollectiveError::PeerLost { peer: 3, .. }),
            "{err}"
        );
    }

    #[test]
    fn failure_notice_becomes_an_error() {
        let inbox = Inbox::new(0);
        let a = Tag::op(1, 2, 0);
        let f = Failure::LengthMismatch {
            expected: 4,
            got: 8,
            own: Some(16),
        };
        inbox.deliver(1, a, Delivery::Failure(f)).unwrap();
        let err = inbox.take(1, a, Duration::ZERO).unwrap_err();
        // What the sender passed travels with its notice.
        assert!(
            matches!(&err, CollectiveError::LengthMismatch { lengths, .. } if lengths == &[(1, 16)]),
            "{err:?}"
        );
        assert!(matches!(
            err,
            CollectiveError::LengthMismatch {
                op: "recv",
                peer: Some(1),
                expected: 4,
                got: 8,
                dtype: None,
                ..
            }
        ));
    }

    #[test]
    fn deadline_is_honoured() {
        let inbox = Inbox::new(0);
        let start = Instant::now();
        let got = inbox
            .take(1, Tag::user(0).unwrap(), Duration::from_millis(50))
            .unwrap();
        assert!(got.is_none());
        assert!(start.elapsed() >= Duration::from_millis(50));
    }

    #[test]
    fn closed_inbox_refuses_deliveries() {
        let inbox = Inbox::new(4);
        inbox.close("dropped");
        let err = inbox
            .deliver(0, Tag::user(0).unwrap(), Delivery::Data(vec![]))
            .unwrap_err();
        assert!(matches!(err, CollectiveError::PeerLost { peer: 4, .. }));
    }
}
