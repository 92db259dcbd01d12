//! Federated averaging on a group: rounds that go on without lost or late members, whose
//! failures stay in the round (the protocol lives in the crate's `federated` module).

use std::time::Duration;

use super::ProcessGroup;
use crate::Result;
use crate::federated;
use crate::health::FailureScope;
use crate::op::{OpId, OpKind};

impl ProcessGroup {
    /// One round of federated averaging. Rank 0 waits up to `deadline` for the others'
    /// contributions, averages what arrived (always including its own) and sends the average
    /// to everyone; every rank's `data` ends as that average. Returns the number of
    /// participants on rank 0 and 0 elsewhere.
    ///
    /// A contribution that misses the deadline is discarded: each round has its own identity,
    /// so it can never be counted in a later round. A rank that was late receives the average
    /// of the round it was late for and stays in step.
    ///
    /// A failure in a round, even a lost member, fails only that round on the ranks it
    /// touches, never the group (see [the type docs](ProcessGroup#failures)); a round on a
    /// group that already failed fails at once.
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use rlx_collective::{MemTransport, ProcessGroup, ReduceKind, Transport};
    /// # let world: Vec<ProcessGroup> = MemTransport::fan_out(3).into_iter()
    /// #     .map(|t| ProcessGroup::new(t as Arc<dyn Transport>)).collect();
    /// std::thread::scope(|s| {
    ///     for group in &world {
    ///         s.spawn(move || {
    ///             let mut model = [group.rank() as f32; 2];
    ///             let counted = group
    ///                 .federated_average(&mut model, std::time::Duration::from_secs(10))
    ///                 .unwrap();
    ///             assert_eq!(model, [1.0, 1.0]);
    ///             assert_eq!(counted, if group.rank() == 0 { 3 } else { 0 });
    ///         });
    ///     }
    /// });
    /// ```
    pub fn federated_average(&self, data: &mut [f32], deadline: Duration) -> Result<usize> {
        let id = OpId {
            scope: FailureScope::Operation,
            ..self.issue(OpKind::FederatedAverage)
        };
        let stale = &self.shared.federated;
        self.execute(id, |ctx| federated::run(ctx, stale, data, deadline))
    }

    /// Number of late federated contributions rank 0 still expects from past rounds (they are
    /// freed as they arrive, at the start of the next round).
    ///
    /// See the example of [`ProcessGroup::federated_average`].
    pub fn federated_outstanding(&self) -> usize {
        self.shared.federated.lock().outstanding()
    }
}
