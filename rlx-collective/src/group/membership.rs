//! Changing who is in a group: [`ProcessGroup::shrink`] forms a new group of the members that
//! are still alive (the agreement itself lives in the `shrink` module).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::ProcessGroup;
use crate::shrink::Agreement;
use crate::{CollectiveError, Result};

impl ProcessGroup {
    /// Collective over the survivors: forms a new group of the members of this group that are
    /// still alive, so that a job goes on after losing a rank. Call it on every surviving
    /// member after an operation failed fatally (a [`CollectiveError::GroupFailed`],
    /// [`CollectiveError::PeerLost`] or [`CollectiveError::Timeout`]); on a healthy group it
    /// returns a new group of the same members.
    ///
    /// The survivors agree on who is left (see the crate's `shrink` module for the
    /// agreement): members that are gone, or that do not answer within the operation timeout,
    /// are declared dead and excluded at the transport, so nothing they send can ever reach
    /// the survivors again. The new group keeps the survivors' order of this group (group rank
    /// i is the i-th survivor), has a new group id and starts a fresh operation sequence; the
    /// transports keep their links, no new rendezvous is needed. This group stays unusable.
    ///
    /// What is lost: the operations that were in flight when the failure happened (their
    /// results are undefined on every rank: re-run the step), and the algorithm overrides of
    /// this group (set them again on the new one).
    ///
    /// A member that was declared dead but is alive (a stalled process that resumes) fails
    /// here and in every later operation with [`CollectiveError::GroupFailed`] naming itself,
    /// cause [`FatalCause::Excluded`](crate::FatalCause::Excluded). Fails with
    /// [`CollectiveError::Unsupported`] on a transport that cannot exclude a peer (the MLX
    /// backend) and with [`CollectiveError::Aborted`] once this rank's transport was aborted.
    ///
    /// # Examples
    ///
    /// A data-parallel step loop that goes on when a worker dies:
    ///
    /// ```
    /// use std::sync::Arc;
    /// use rlx_collective::{CollectiveError, MemTransport, ProcessGroup, ReduceKind, Transport};
    ///
    /// let ranks = MemTransport::fan_out(3);
    /// let threads: Vec<_> = ranks
    ///     .into_iter()
    ///     .map(|t| {
    ///         std::thread::spawn(move || -> Result<u32, CollectiveError> {
    ///             let mut group = ProcessGroup::new(t.clone() as Arc<dyn Transport>);
    ///             for step in 0..4 {
    ///                 if step == 2 && t.rank() == 2 {
    ///                     t.abort(); // rank 2's machine goes away
    ///                     return Ok(0);
    ///                 }
    ///                 let mut grads = vec![1.0f32; 8];
    ///                 if let Err(error) = group.all_reduce(&mut grads, ReduceKind::Sum) {
    ///                     assert!(error.is_fatal());
    ///                     group = group.shrink()?; // the survivors go on
    ///                     grads = vec![1.0f32; 8];
    ///                     group.all_reduce(&mut grads, ReduceKind::Sum)?;
    ///                 }
    ///                 assert_eq!(grads[0], group.world_size() as f32);
    ///             }
    ///             Ok(group.world_size())
    ///         })
    ///     })
    ///     .collect();
    /// let sizes: Vec<u32> = threads.into_iter().map(|t| t.join().unwrap().unwrap()).collect();
    /// assert_eq!(sizes, [2, 2, 0]);
    /// ```
    pub fn shrink(&self) -> Result<ProcessGroup> {
        let shared = &self.shared;
        let attempt = shared.shrinks.fetch_add(1, Ordering::Relaxed);
        let timeout = shared.transport.op_timeout();
        let started = Instant::now();
        let _span = tracing::info_span!("shrink", group = shared.group_id, attempt).entered();
        let decision = Agreement::new(
            shared.transport.as_ref(),
            &shared.members,
            shared.group_id,
            attempt,
            shared.group_ids.proposal(),
            timeout,
        )
        .run()?;
        shared.group_ids.reserve(decision.group_id);
        let me = shared.transport.rank();
        let rank = decision
            .members
            .iter()
            .position(|&m| m == me)
            .ok_or_else(|| {
                CollectiveError::protocol(None, "shrink: the decision leaves this rank out")
            })? as u32;
        tracing::info!(
            new_group = decision.group_id,
            world = decision.members.len(),
            elapsed = ?started.elapsed(),
            "shrink: the survivors formed a new group"
        );
        Ok(ProcessGroup::from_parts(
            Arc::clone(&shared.transport),
            decision.group_id,
            decision.members,
            rank,
            Arc::clone(&shared.group_ids),
        ))
    }
}
