//! Issuing and running a group's operations: every operation takes the group's next sequence
//! number on the issuing thread, then runs (here or on a thread of its own) with an
//! [`OpCtx`] that carries its identity, and announces its failure to the other members.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;

use super::{ProcessGroup, WORLD_GROUP_ID};
use std::sync::Arc;

use crate::handle::{CollectiveHandle, ResultSlot};
use crate::health::FailureScope;
use crate::op::{OpCtx, OpId, OpKind};
use crate::{CollectiveError, Result};

impl ProcessGroup {
    /// Issues the next operation: takes its sequence number and the settings it runs with.
    pub(super) fn issue(&self, kind: OpKind) -> OpId {
        let shared = &self.shared;
        let id = OpId {
            group: shared.group_id,
            seq: shared.seq.fetch_add(1, Ordering::Relaxed),
            rank: shared.rank,
            is_world: shared.group_id == WORLD_GROUP_ID,
            kind,
            settings: *shared.settings.lock(),
            scope: FailureScope::Group,
        };
        if id.uses_one_sided_region() {
            shared.one_sided.register(id.seq);
        }
        if let Some(order) = &shared.issue_order {
            order.register(id.seq);
        }
        shared.flight.issued(id.seq, id.kind.name());
        id
    }

    /// Runs an issued operation; on failure tells the other members before returning. On a
    /// group that has failed it fails at once, telling nobody: the members were told when the
    /// group failed, and telling them again for every later operation would only pile notices
    /// up in their inboxes.
    ///
    /// A panic inside the operation (a bug) is announced as a fatal failure of this rank
    /// before it continues to unwind, so that the other members do not wait for the
    /// operation's messages until their timeout.
    pub(super) fn execute<T>(
        &self,
        id: OpId,
        body: impl FnOnce(&OpCtx<'_>) -> Result<T>,
    ) -> Result<T> {
        let shared = &self.shared;
        let _span = tracing::debug_span!("op", group = id.group, seq = id.seq, op = id.kind.name())
            .entered();
        let ctx = self.context(id);
        // Until the body runs, nothing of it releases the operation's place in the one-sided
        // queue, so an operation that ends early releases it here.
        let _turn = match &shared.issue_order {
            Some(order) => match order.wait_turn(id.seq, id.kind.name(), ctx.timeout()) {
                Ok(turn) => Some(turn),
                Err(error) => {
                    shared.one_sided.release(id.seq);
                    ctx.notify_failure(&error);
                    return Err(error);
                }
            },
            None => None,
        };
        if let Err(error) = ctx.check_group() {
            shared.one_sided.release(id.seq);
            return Err(error);
        }
        shared.flight.running(id.seq);
        match std::panic::catch_unwind(AssertUnwindSafe(|| body(&ctx))) {
            Ok(result) => {
                let result = result
                    .and_then(|value| ctx.last_look().map(|()| value))
                    .map_err(|error| ctx.fail(error));
                shared.flight.ended(id.seq, result.as_ref().err());
                result.inspect_err(|error| {
                    tracing::warn!(%error, "operation failed");
                    if error.is_fatal() {
                        shared
                            .flight
                            .dump_if_asked(shared.group_id == WORLD_GROUP_ID);
                    }
                })
            }
            Err(panic) => {
                shared.flight.ended(id.seq, Some(&CollectiveError::Aborted));
                ctx.notify_failure(&CollectiveError::Aborted);
                std::panic::resume_unwind(panic)
            }
        }
    }

    /// Issues operation `kind` and runs it on this thread.
    pub(super) fn run<T>(
        &self,
        kind: impl Into<OpKind>,
        body: impl FnOnce(&OpCtx<'_>) -> Result<T>,
    ) -> Result<T> {
        let id = self.issue(kind.into());
        self.execute(id, body)
    }

    /// Issues operation `kind` on this thread and queues it on the group's progress worker.
    pub(super) fn spawn<T: Send + 'static>(
        &self,
        kind: impl Into<OpKind>,
        body: impl FnOnce(&OpCtx<'_>) -> Result<T> + Send + 'static,
    ) -> CollectiveHandle<T> {
        let id = self.issue(kind.into());
        let name = id.kind.name();
        let rank = self.shared.rank;
        let group = self.clone();
        let slot = ResultSlot::new();
        let filled = Arc::clone(&slot);
        let job = Box::new(move || {
            let result = std::panic::catch_unwind(AssertUnwindSafe(|| group.execute(id, body)))
                .unwrap_or_else(|payload| {
                    let why = payload
                        .downcast_ref::<&str>()
                        .map(|s| (*s).to_owned())
                        .or_else(|| payload.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "unknown panic".to_owned());
                    Err(CollectiveError::PeerFailed {
                        peer: rank,
                        detail: format!("{name} panicked: {why}"),
                    })
                });
            // The group clone goes first: dropping the last one ends the worker.
            drop(group);
            filled.fill(result);
        });
        let submitted = self.shared.worker.submit(self.shared.group_id, job);
        if let Err(source) = submitted {
            // The operation was issued but will not run here: its peers must not wait for it.
            let shared = &self.shared;
            shared.one_sided.release(id.seq);
            if let Some(order) = &shared.issue_order {
                order.release(id.seq);
            }
            // An operation that never runs leaves its peers' matching broken for good: that
            // is a fatal failure of the group, announced as one.
            self.context(id).notify_failure(&CollectiveError::Aborted);
            return CollectiveHandle::failed(CollectiveError::Io { peer: None, source });
        }
        CollectiveHandle::running(slot)
    }

    /// The context of operation `id` on this group.
    fn context(&self, id: OpId) -> OpCtx<'_> {
        let shared = &self.shared;
        OpCtx::new(
            shared.transport.as_ref(),
            &shared.members,
            &shared.health,
            &shared.one_sided,
            &shared.flight,
            shared.cables.view(),
            id,
        )
    }

    /// Aborts this rank's part of the job from any thread: the other members are told first
    /// (their operations of this group fail with [`CollectiveError::GroupFailed`] naming this
    /// rank, cause `Aborted`), then the transport is aborted, which wakes every blocked call
    /// of every group on it, on every local thread, with [`CollectiveError::Aborted`], and
    /// makes every later call fail at once. Idempotent.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use rlx_collective::{CollectiveError, MemTransport, ProcessGroup, Transport};
    ///
    /// let ranks = MemTransport::fan_out(2);
    /// let group = ProcessGroup::new(ranks[0].clone() as Arc<dyn Transport>);
    /// let waiting = {
    ///     let group = group.clone();
    ///     std::thread::spawn(move || group.recv::<f32>(1, 7))
    /// };
    /// group.abort();
    /// // Aborted, or (if the receive began after the abort) the group's failure naming rank 0.
    /// let woken = waiting.join().unwrap();
    /// assert!(matches!(woken, Err(CollectiveError::Aborted | CollectiveError::GroupFailed { peer: 0, .. })));
    /// ```
    pub fn abort(&self) {
        tracing::warn!(
            group = self.shared.group_id,
            "aborting this rank's part of the job"
        );
        self.watch().on_failure(&CollectiveError::Aborted);
        self.shared.transport.abort();
    }
}
