//! The failure protocol of a group: whether the group is still usable on this rank
//! ([`Health`]) and how every wait of the group ([`Watch`]) notices a fatal failure anywhere
//! in it.
//!
//! When a failure is fatal ([`CollectiveError::is_fatal`]: a lost peer, a timeout, an abort,
//! bad bytes), the group can no longer be trusted. The rank marks its group failed
//! ([`Health`]) and sends one group-wide notice ([`Failure::GroupFailed`]) to every member,
//! under the group's reserved phase [`GROUP_NOTICE_PHASE`]. Members may be in any operation
//! by then (a rank that finished operation k waits in k+1 for a rank still stuck in k), so
//! every wait of a group ([`Watch::wait`]) waits in short slices and, between them, looks for
//! those notices from every member. A rank that learns of the failure marks its own group
//! failed and forwards the notice once, so the news reaches every member even when the rank
//! that saw the failure first could not tell them all. From then on every operation of the
//! group fails at once with [`CollectiveError::GroupFailed`] naming the culprit, like an
//! aborted NCCL communicator.
//!
//! A timeout names the rank at the end of the chain of waits that starts at the awaited peer
//! (see the `wait_chain` module): between slices every wait also answers the probes of ranks
//! that timed out, with the rank it waits on and what it waits in. A chain that closes on
//! itself is a deadlock ([`CollectiveError::Deadlock`]); the rank that finds it tells the
//! others with a notice of cause [`FatalCause::Deadlock`], and each of them reports the
//! deadlock too, with its own wait and those its probers told it of. The probing side of a
//! wait is in `probes.rs`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::wait_chain::{self, Doing};
use crate::{CollectiveError, Failure, FatalCause, Result, Tag, Transport, Waiter};

mod probes;

pub(crate) use probes::unreceived_beside;

/// The phase of every collective group's tag space that carries the group's failure notices
/// (sequence number 0). Operations use the phases below it.
pub(crate) const GROUP_NOTICE_PHASE: u16 = u16::MAX;

/// How long a wait of a group lasts at least before it looks for group-wide failure notices.
/// Short enough that a failure anywhere in the group reaches a waiting rank well within a
/// second; long enough that waiting costs nothing measurable (one poll per member per slice).
pub(crate) const NOTICE_SLICE: Duration = Duration::from_millis(10);

/// How much longer a slice lasts per byte of the awaited message: one nanosecond, the time a
/// byte takes to land at 1 GB/s. A socket transport whose deadline falls while a message is
/// landing in the caller's buffer must move the landed bytes into a copy of its own; slices
/// as long as a slow link needs for the whole message make that rare for large messages.
const SLICE_PER_BYTE: Duration = Duration::from_nanos(1);

/// How long one wait of a receive of `expected` bytes lasts before the group's notices are
/// looked at again.
pub(crate) fn slice_for(expected: usize) -> Duration {
    NOTICE_SLICE
        .saturating_add(SLICE_PER_BYTE.saturating_mul(u32::try_from(expected).unwrap_or(u32::MAX)))
}

/// The tag of `group`'s failure notices.
pub(crate) const fn notice_tag(group: u16) -> Tag {
    Tag::op(group, 0, GROUP_NOTICE_PHASE)
}

/// How far the failures of an operation reach.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FailureScope {
    /// A fatal failure makes the whole group unusable (every collective and point-to-point
    /// call).
    Group,
    /// Failures stay in the operation and it does not watch for group-wide notices: federated
    /// averaging, whose rounds are built to go on without lost or late members.
    Operation,
}

/// Whether a group is still usable on this rank. It is set once, by the first fatal failure
/// this rank sees in the group or hears of from a member, and every operation consults it.
#[derive(Debug, Default)]
pub(crate) struct Health {
    /// Set after `record` is; the hot path reads only this.
    failed: AtomicBool,
    /// The group-wide notice that failed the group, and the world rank that reported it.
    record: Mutex<Option<(Failure, u32)>>,
    /// Whether this rank has sent its own group-wide notice.
    announced: AtomicBool,
    /// What the members that probed this rank said they wait in, one entry per member (a
    /// probe means its sender timed out, so the group is failing by then).
    heard: Mutex<Vec<Waiter>>,
}

impl Health {
    /// Fails with [`CollectiveError::GroupFailed`] once the group has failed.
    pub(crate) fn check(&self) -> Result<()> {
        if !self.failed.load(Ordering::Acquire) {
            return Ok(());
        }
        match *self.record.lock() {
            Some((notice, reporter)) => Err(notice.into_error(reporter)),
            None => Ok(()),
        }
    }

    /// Marks the group failed by `notice` from `reporter`, unless it already is (the first
    /// failure is the one every later operation reports).
    fn record(&self, notice: Failure, reporter: u32) {
        let mut record = self.record.lock();
        if record.is_none() {
            *record = Some((notice, reporter));
        }
        self.failed.store(true, Ordering::Release);
    }

    /// True exactly once: for the caller that is to send this rank's group-wide notice.
    fn take_announcement(&self) -> bool {
        !self.announced.swap(true, Ordering::AcqRel)
    }

    /// Keeps what a prober said it waits in, replacing what it said before.
    fn hear(&self, said: Waiter) {
        let mut heard = self.heard.lock();
        heard.retain(|earlier| earlier.rank != said.rank);
        heard.push(said);
    }

    /// What world rank `rank` said it waits in when it last probed this rank.
    fn heard_from(&self, rank: u32) -> Option<Waiter> {
        self.heard.lock().iter().find(|w| w.rank == rank).cloned()
    }
}

/// What a wait of one group needs to notice the group's failures: the transport, the
/// members, this rank, the group's health and how far failures reach.
#[derive(Clone, Copy)]
pub(crate) struct Watch<'a> {
    transport: &'a dyn Transport,
    members: &'a [u32],
    /// This rank's index in the group.
    rank: u32,
    group: u16,
    health: &'a Health,
    scope: FailureScope,
    /// What the waits of this watch are, as probers are told.
    doing: Doing,
}

impl<'a> Watch<'a> {
    /// The watch of group `group` (members `members`, this rank at index `rank`).
    pub(crate) fn new(
        transport: &'a dyn Transport,
        members: &'a [u32],
        rank: u32,
        group: u16,
        health: &'a Health,
        scope: FailureScope,
    ) -> Self {
        Watch {
            transport,
            members,
            rank,
            group,
            health,
            scope,
            doing: Doing::Upkeep,
        }
    }

    /// The same watch for waits that are `doing`.
    pub(crate) fn doing(self, doing: Doing) -> Self {
        Watch { doing, ..self }
    }

    /// Fails once the group has failed (see [`Health::check`]).
    pub(crate) fn check(&self) -> Result<()> {
        self.health.check()
    }

    /// Runs `attempt` (a receive from world rank `peer`, or a send to it that gives up before
    /// its first byte, with the deadline it is given) until it returns something or `total`
    /// has passed (`Ok(None)`). For group-scoped operations it
    /// calls `attempt` with slices of at least `slice` and in between looks for group-wide
    /// failure notices, so that it fails within about a slice of a fatal failure anywhere in
    /// the group, and answers wait probes with `peer`.
    pub(crate) fn wait<T>(
        &self,
        total: Duration,
        slice: Duration,
        peer: u32,
        mut attempt: impl FnMut(Duration) -> Result<Option<T>>,
    ) -> Result<Option<T>> {
        self.check()?;
        if self.scope == FailureScope::Operation {
            return attempt(total);
        }
        // One clock read per slice, and none for a wait that ends in its first slice: a
        // point-to-point receive of a few bytes is over in about a microsecond, of which each
        // read of this virtual machine's clock costs 2 %. A first slice that ended empty ran
        // its whole length, so the wait counts from that long before the first read.
        let mut start: Option<Instant> = None;
        let mut left = total;
        loop {
            let this_slice = left.min(slice);
            match attempt(this_slice) {
                Ok(Some(value)) => return Ok(Some(value)),
                Ok(None) => {}
                // A member that declared the group failed and then left (its process ended
                // once it reported) told why before its links closed: its notice, queued
                // ahead of the loss, names the rank at fault, where the loss names only it.
                Err(error) if error.is_fatal() => {
                    self.notices(peer)?;
                    return Err(error);
                }
                Err(error) => return Err(error),
            }
            self.notices(peer)?;
            self.answer_probes(peer)?;
            let now = Instant::now();
            let start = *start.get_or_insert_with(|| now.checked_sub(this_slice).unwrap_or(now));
            let elapsed = now.saturating_duration_since(start);
            if elapsed >= total {
                return Ok(None);
            }
            left = total - elapsed;
        }
    }

    /// Looks for group-wide notices (see [`Watch::poll_notices`]) during a wait on world rank
    /// `waits_on`; a notice that another rank found a deadlock becomes this rank's own
    /// [`CollectiveError::Deadlock`], with its wait and those it heard of.
    fn notices(&self, waits_on: u32) -> Result<()> {
        let (error, found_by) = match self.poll_notices() {
            Err(
                error @ CollectiveError::GroupFailed {
                    cause: FatalCause::Deadlock,
                    reporter,
                    ..
                },
            ) => (error, reporter),
            other => return other,
        };
        // The probes a finder sent this rank arrived before its notice; take them first.
        if self.answer_probes(waits_on).is_err() {
            return Err(error);
        }
        let me = self.waiter(waits_on);
        let mut waits = self.health.heard.lock().clone();
        waits.insert(0, me);
        Err(CollectiveError::Deadlock {
            op: self.doing.op(),
            after: None,
            found_by,
            waits,
        })
    }

    /// Looks, without waiting, for a group-wide notice from every other member; fails with
    /// the first one found, or when another thread of this rank found one.
    pub(crate) fn poll_notices(&self) -> Result<()> {
        for (index, &peer) in self.members.iter().enumerate() {
            if index as u32 != self.rank {
                self.poll_notice_of(peer)?;
            }
        }
        self.check()
    }

    /// Looks, without waiting, for a group-wide notice from world rank `peer`. A notice fails
    /// the group here and is returned as the error.
    pub(crate) fn poll_notice_of(&self, peer: u32) -> Result<()> {
        if self.scope == FailureScope::Operation {
            return Ok(());
        }
        match self
            .transport
            .recv_message(peer, notice_tag(self.group), Duration::ZERO)
        {
            Ok(None) => Ok(()),
            Err(CollectiveError::GroupFailed {
                peer: culprit,
                cause,
                reporter,
            }) => {
                tracing::warn!(
                    group = self.group,
                    culprit,
                    ?cause,
                    reporter,
                    "received a group failure notice"
                );
                self.health
                    .record(Failure::GroupFailed { culprit, cause }, reporter);
                Err(CollectiveError::GroupFailed {
                    peer: culprit,
                    cause,
                    reporter,
                })
            }
            Ok(Some(message)) => Err(CollectiveError::protocol(
                Some(peer),
                format!(
                    "message of {} bytes under the failure-notice phase of group {}",
                    message.len(),
                    self.group
                ),
            )),
            Err(error) if !error.is_fatal() => Err(CollectiveError::protocol(
                Some(peer),
                format!(
                    "unexpected notice under the failure-notice phase of group {}: {error}",
                    self.group
                ),
            )),
            // A member that is gone (its queued notices were drained first) or a transport that
            // stopped is no reason to fail here: the member may have finished and left, and a
            // wait that needs it reports it itself.
            Err(_) => Ok(()),
        }
    }

    /// The group-wide notice a fatal `error` calls for, with the world rank to report as its
    /// source, or `None` when `error` is not fatal or the failures of this watch stay in the
    /// operation.
    pub(crate) fn group_notice(&self, error: &CollectiveError) -> Option<(Failure, u32)> {
        if self.scope == FailureScope::Operation {
            return None;
        }
        let me = self.transport.rank();
        let cause = error.fatal_cause()?;
        let (culprit, reporter) = match *error {
            CollectiveError::GroupFailed { peer, reporter, .. } => (peer, reporter),
            // A deadlock has no culprit; its notice names the rank that found it.
            CollectiveError::Deadlock { found_by, .. } => (found_by, found_by),
            CollectiveError::PeerLost { peer, .. }
            | CollectiveError::Unreceived { peer, .. }
            | CollectiveError::Timeout {
                peer: Some(peer), ..
            }
            | CollectiveError::Protocol {
                peer: Some(peer), ..
            }
            | CollectiveError::Io {
                peer: Some(peer), ..
            } => (peer, me),
            // No peer to blame: this rank's own transport failed (aborted, or a wait for no
            // particular peer timed out).
            _ => (me, me),
        };
        Some((Failure::GroupFailed { culprit, cause }, reporter))
    }

    /// For a fatal `error` of a group-scoped operation: marks the group failed and, the first
    /// time, tells every other member with a group-wide notice (best effort: a member that
    /// cannot be told is already failing on its own). Does nothing for other errors.
    pub(crate) fn on_failure(&self, error: &CollectiveError) {
        if self.scope == FailureScope::Operation {
            return;
        }
        let Some((notice, reporter)) = self.group_notice(error) else {
            return;
        };
        self.health.record(notice, reporter);
        if !self.health.take_announcement() {
            return;
        }
        self.tell_members(notice_tag(self.group), notice);
    }

    /// Sends `failure` under `tag` to every other member, best effort: a member that cannot
    /// be told learns of the failure from its own broken link or from another member. First
    /// to every member whose link takes it at once, then to the others, each waiting at most
    /// one probe window: a member that does not read (stopped, or cut off with its socket
    /// full) must not hold the notice back from the rest, nor this rank's error for long.
    pub(crate) fn tell_members(&self, tag: Tag, failure: Failure) {
        let others = self
            .members
            .iter()
            .enumerate()
            .filter(|&(index, _)| index as u32 != self.rank)
            .map(|(_, &peer)| peer);
        let slow: Vec<u32> = others
            .filter(|&peer| {
                !matches!(
                    self.transport
                        .try_send_failure(peer, tag, failure, Duration::ZERO),
                    Ok(true)
                )
            })
            .collect();
        let window = wait_chain::probe_window(self.transport.op_timeout());
        for peer in slow {
            let _ = self.transport.try_send_failure(peer, tag, failure, window);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemTransport;

    /// The watch of test group 7 on `transport`'s rank, whose members are world ranks 0..n.
    fn watch_on<'a>(
        transport: &'a dyn Transport,
        members: &'a [u32],
        health: &'a Health,
        scope: FailureScope,
    ) -> Watch<'a> {
        Watch::new(transport, members, transport.rank(), 7, health, scope)
    }

    /// A group-wide notice blaming a lost `culprit`. The cause comes from the error it stands
    /// for, which is how the collectives produce it too.
    fn notice(culprit: u32) -> Failure {
        let cause = CollectiveError::PeerLost {
            peer: culprit,
            reason: "gone".to_owned(),
        }
        .fatal_cause();
        Failure::GroupFailed {
            culprit,
            cause: cause.expect("a lost peer is fatal"),
        }
    }

    #[test]
    fn a_notice_fails_the_group_and_is_forwarded_once() {
        let world = MemTransport::fan_out(3);
        let members = [0, 1, 2];
        let health = Health::default();
        let watch = watch_on(world[1].as_ref(), &members, &health, FailureScope::Group);
        world[0]
            .send_failure(1, notice_tag(7), notice(2))
            .expect("rank 1 is there");
        let err = watch
            .wait(Duration::from_secs(60), NOTICE_SLICE, 2, |deadline| {
                world[1].recv_message(2, Tag::op(7, 3, 0), deadline)
            })
            .expect_err("the notice fails the wait");
        assert!(
            matches!(
                err,
                CollectiveError::GroupFailed {
                    peer: 2,
                    reporter: 0,
                    ..
                }
            ),
            "{err}"
        );
        // Every later call fails the same way, without waiting.
        assert!(matches!(
            watch.check(),
            Err(CollectiveError::GroupFailed { peer: 2, .. })
        ));
        watch.on_failure(&err);
        watch.on_failure(&err);
        let forwarded = world[2].recv_message(1, notice_tag(7), Duration::ZERO);
        assert!(
            matches!(
                forwarded,
                Err(CollectiveError::GroupFailed {
                    peer: 2,
                    reporter: 1,
                    ..
                })
            ),
            "{forwarded:?}"
        );
        assert!(matches!(
            world[2].recv_message(1, notice_tag(7), Duration::ZERO),
            Ok(None)
        ));
        // Other groups on the same transport are untouched.
        let other = Health::default();
        let other_watch = Watch::new(
            world[2].as_ref(),
            &members,
            2,
            8,
            &other,
            FailureScope::Group,
        );
        assert!(other_watch.poll_notices().is_ok());
    }

    #[test]
    fn operation_scoped_failures_stay_in_the_operation() {
        let world = MemTransport::fan_out(2);
        let members = [0, 1];
        let health = Health::default();
        let watch = watch_on(
            world[0].as_ref(),
            &members,
            &health,
            FailureScope::Operation,
        );
        watch.on_failure(&CollectiveError::Aborted);
        assert!(watch.check().is_ok());
        assert!(matches!(
            world[1].recv_message(0, notice_tag(7), Duration::ZERO),
            Ok(None)
        ));
    }

    #[test]
    fn data_under_the_notice_phase_is_a_protocol_error() {
        let world = MemTransport::fan_out(2);
        let members = [0, 1];
        let health = Health::default();
        let watch = watch_on(world[0].as_ref(), &members, &health, FailureScope::Group);
        world[1]
            .send_message(0, notice_tag(7), &[b"stray"])
            .expect("rank 0 is there");
        assert!(matches!(
            watch.poll_notices(),
            Err(CollectiveError::Protocol { peer: Some(1), .. })
        ));
    }
}
