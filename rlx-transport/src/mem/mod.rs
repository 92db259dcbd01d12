//! [`MemTransport`]: the ranks of one world as threads of one process.
//!
//! It is a real, supported transport (single-host tensor parallelism across threads, tests,
//! examples), not only a test double: it honours deadlines, aborts and lost peers exactly as
//! the socket transports do. A send copies the message into the receiver's [`Inbox`]; there is
//! no backpressure, so a sender that never waits for its receiver grows that inbox.

mod admission;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use admission::Desk;
pub use admission::MemJoiner;

use crate::inbox::{Delivery, Inbox};
use crate::symmetric::Symmetric;
use crate::{
    CollectiveError, DEFAULT_OP_TIMEOUT, EXCLUSION_TAG, Failure, FatalCause, Result, Tag, Transport,
};

struct MemWorld {
    inboxes: Vec<Inbox>,
    /// Where joiners wait; shared by every world of the job (see the `admission` module).
    desk: Arc<Desk>,
}

/// One rank of an in-process world; create the whole world with [`MemTransport::fan_out`].
///
/// Dropping a rank's transport (or calling [`Transport::abort`] on it) makes the other ranks'
/// pending and later receives from it fail with [`CollectiveError::PeerLost`] once its queued
/// messages are consumed, and their sends to it fail the same way.
///
/// # Examples
///
/// ```
/// use rlx_transport::{MemTransport, Transport};
///
/// let ranks = MemTransport::fan_out(2);
/// let peer = ranks[1].clone();
/// let t = std::thread::spawn(move || peer.recv_bytes(0, 7));
/// ranks[0].send_bytes(1, 7, b"hello")?;
/// assert_eq!(t.join().unwrap()?, b"hello");
/// # Ok::<(), rlx_transport::CollectiveError>(())
/// ```
pub struct MemTransport {
    rank: u32,
    world: Arc<MemWorld>,
    op_timeout: Duration,
}

impl fmt::Debug for MemTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemTransport")
            .field("rank", &self.rank)
            .field("world_size", &self.world.inboxes.len())
            .field("op_timeout", &self.op_timeout)
            .finish()
    }
}

impl MemTransport {
    /// A world of `world` ranks with the default operation timeout; element `i` is rank `i`.
    pub fn fan_out(world: u32) -> Vec<Arc<MemTransport>> {
        Self::fan_out_with_timeout(world, DEFAULT_OP_TIMEOUT)
    }

    /// A world of `world` ranks whose blocking calls without a deadline give up after
    /// `op_timeout`.
    pub fn fan_out_with_timeout(world: u32, op_timeout: Duration) -> Vec<Arc<MemTransport>> {
        Self::fan_out_in(world, op_timeout, Arc::default())
    }

    /// A world of `world` ranks whose joiners wait at `desk`.
    fn fan_out_in(world: u32, op_timeout: Duration, desk: Arc<Desk>) -> Vec<Arc<MemTransport>> {
        let world_state = Arc::new(MemWorld {
            inboxes: (0..world).map(Inbox::new).collect(),
            desk,
        });
        (0..world)
            .map(|rank| {
                Arc::new(MemTransport {
                    rank,
                    world: Arc::clone(&world_state),
                    op_timeout,
                })
            })
            .collect()
    }

    /// A world of `world` ranks with a symmetric heap of `heap_size` bytes on each, so that
    /// one-sided code ([`SymmetricTransport`](crate::SymmetricTransport)) runs on threads too.
    /// Each rank's heap service runs on threads of its own (two per peer).
    pub fn fan_out_symmetric(
        world: u32,
        heap_size: u64,
    ) -> Result<Vec<Arc<Symmetric<MemTransport>>>> {
        Self::fan_out_symmetric_with_timeout(world, heap_size, DEFAULT_OP_TIMEOUT)
    }

    /// [`MemTransport::fan_out_symmetric`] with an operation timeout.
    pub fn fan_out_symmetric_with_timeout(
        world: u32,
        heap_size: u64,
        op_timeout: Duration,
    ) -> Result<Vec<Arc<Symmetric<MemTransport>>>> {
        Self::fan_out_with_timeout(world, op_timeout)
            .into_iter()
            .map(|rank| Symmetric::new(rank, heap_size).map(Arc::new))
            .collect()
    }

    /// A handle with which a new thread joins this job when its members grow their group
    /// (see [`MemJoiner`]).
    pub fn joiner(&self) -> MemJoiner {
        MemJoiner::new(Arc::clone(&self.world.desk))
    }

    fn inbox(&self, rank: u32) -> Result<&Inbox> {
        self.world
            .inboxes
            .get(rank as usize)
            .ok_or(CollectiveError::UnknownRank {
                rank,
                world_size: self.world_size(),
            })
    }

    fn own_inbox(&self) -> Result<&Inbox> {
        let inbox = self.inbox(self.rank)?;
        if inbox.is_aborted() {
            return Err(CollectiveError::Aborted);
        }
        Ok(inbox)
    }

    fn leave(&self, reason: &str) {
        if let Ok(own) = self.inbox(self.rank) {
            own.close(format!("rank {} {reason}", self.rank));
        }
        for (peer, inbox) in self.world.inboxes.iter().enumerate() {
            if peer as u32 != self.rank {
                inbox.mark_lost(self.rank, format!("in-process rank {} {reason}", self.rank));
            }
        }
    }
}

impl Transport for MemTransport {
    fn rank(&self) -> u32 {
        self.rank
    }

    fn world_size(&self) -> u32 {
        self.world.inboxes.len() as u32
    }

    fn send_message(&self, to: u32, tag: Tag, parts: &[&[u8]]) -> Result<()> {
        self.own_inbox()?;
        let target = self.inbox(to)?;
        let body = parts.concat();
        target.deliver(self.rank, tag, Delivery::Data(body))
    }

    fn recv_message(&self, from: u32, tag: Tag, timeout: Duration) -> Result<Option<Vec<u8>>> {
        self.inbox(from)?;
        self.own_inbox()?.take(from, tag, timeout)
    }

    fn send_failure(&self, to: u32, tag: Tag, failure: Failure) -> Result<()> {
        self.own_inbox()?;
        self.inbox(to)?
            .deliver(self.rank, tag, Delivery::Failure(failure))
    }

    fn unreceived_from(&self, from: u32) -> Vec<(Tag, u64)> {
        self.own_inbox()
            .map(|inbox| inbox.unreceived_from(from))
            .unwrap_or_default()
    }

    fn op_timeout(&self) -> Duration {
        self.op_timeout
    }

    fn exclude_peer(&self, peer: u32) -> Result<()> {
        let target = self.inbox(peer)?;
        if peer == self.rank {
            return Err(CollectiveError::invalid(format!(
                "rank {peer} cannot exclude itself"
            )));
        }
        self.own_inbox()?.exclude(
            peer,
            format!("in-process rank {peer} was declared dead by this rank"),
        );
        // The peer may have left already; then nobody needs telling.
        let _ = target.deliver(
            self.rank,
            EXCLUSION_TAG,
            Delivery::Failure(Failure::GroupFailed {
                culprit: peer,
                cause: FatalCause::Excluded,
            }),
        );
        target.mark_lost(
            self.rank,
            format!("in-process rank {} declared this rank dead", self.rank),
        );
        Ok(())
    }

    fn admission(&self) -> Option<&dyn crate::Admission> {
        Some(self)
    }

    fn abort(&self) {
        if let Ok(own) = self.inbox(self.rank) {
            own.abort();
        }
        self.leave("aborted");
    }
}

impl Drop for MemTransport {
    fn drop(&mut self) {
        self.leave("dropped its transport");
    }
}

#[cfg(all(test, not(rlx_loom)))]
mod tests {
    use super::*;
    use std::thread;
    use std::time::Instant;

    #[test]
    fn unknown_rank_and_reserved_tag() {
        let w = MemTransport::fan_out(2);
        assert!(matches!(
            w[0].send_bytes(5, 0, b"x"),
            Err(CollectiveError::UnknownRank {
                rank: 5,
                world_size: 2
            })
        ));
        assert!(matches!(
            w[0].recv_bytes(9, 0),
            Err(CollectiveError::UnknownRank { .. })
        ));
        assert!(matches!(
            w[0].send_bytes(1, crate::TAG_RESERVED_BASE, b"x"),
            Err(CollectiveError::InvalidArgument { .. })
        ));
    }

    #[test]
    fn timeout_returns_none() {
        let w = MemTransport::fan_out(2);
        let start = Instant::now();
        assert!(
            w[0].recv_bytes_timeout(1, 3, Duration::from_millis(30))
                .unwrap()
                .is_none()
        );
        assert!(start.elapsed() >= Duration::from_millis(30));
    }

    #[test]
    fn recv_bytes_times_out_with_an_error() {
        let w = MemTransport::fan_out_with_timeout(2, Duration::from_millis(20));
        let err = w[0].recv_bytes(1, 3).unwrap_err();
        assert!(matches!(
            err,
            CollectiveError::Timeout {
                peer: Some(1),
                op: "recv",
                ..
            }
        ));
    }

    #[test]
    fn abort_wakes_a_blocked_receiver() {
        let w = MemTransport::fan_out(2);
        let r0 = w[0].clone();
        let t = thread::spawn(move || r0.recv_bytes(1, 0));
        thread::sleep(Duration::from_millis(20));
        w[0].abort();
        assert!(matches!(t.join().unwrap(), Err(CollectiveError::Aborted)));
        assert!(matches!(
            w[0].send_bytes(1, 0, b""),
            Err(CollectiveError::Aborted)
        ));
        assert!(matches!(
            w[1].recv_bytes(0, 0),
            Err(CollectiveError::PeerLost { peer: 0, .. })
        ));
    }

    #[test]
    fn dropping_a_rank_fails_its_peers() {
        let mut w = MemTransport::fan_out(3);
        let r0 = w[0].clone();
        let t = thread::spawn(move || r0.recv_bytes(2, 0));
        thread::sleep(Duration::from_millis(20));
        let gone = w.pop().unwrap();
        drop(gone);
        let err = t.join().unwrap().unwrap_err();
        assert!(
            matches!(err, CollectiveError::PeerLost { peer: 2, .. }),
            "{err}"
        );
        assert!(matches!(
            w[1].send_bytes(2, 0, b"late"),
            Err(CollectiveError::PeerLost { peer: 2, .. })
        ));
    }

    #[test]
    fn default_barrier_over_many_ranks() {
        for n in 1..=8u32 {
            let w = MemTransport::fan_out(n);
            let handles: Vec<_> = w
                .into_iter()
                .map(|t| {
                    thread::spawn(move || {
                        for _ in 0..20 {
                            t.barrier()?;
                        }
                        Ok::<_, CollectiveError>(())
                    })
                })
                .collect();
            for h in handles {
                h.join().unwrap().unwrap();
            }
        }
    }

    #[test]
    fn recv_into_checks_the_length() {
        let w = MemTransport::fan_out(2);
        let tag = Tag::user(1).unwrap();
        w[0].send_message(1, tag, &[b"ab", b"cd"]).unwrap();
        let mut buf = [0u8; 8];
        let n = w[1]
            .recv_message_into(0, tag, &mut buf, Duration::ZERO)
            .unwrap();
        assert_eq!(n, Some(4));
        assert_eq!(&buf[..4], b"abcd");
        w[0].send_message(1, tag, &[&[0u8; 9]]).unwrap();
        assert!(matches!(
            w[1].recv_message_into(0, tag, &mut buf, Duration::ZERO),
            Err(CollectiveError::LengthMismatch {
                op: "recv",
                peer: Some(0),
                expected: 8,
                got: 9,
                dtype: None,
                ..
            })
        ));
    }
}
