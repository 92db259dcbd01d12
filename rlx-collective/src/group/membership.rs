//! Changing who is in a group: [`ProcessGroup::shrink`] forms a new group of the members that
//! are still alive (the agreement itself lives in the `shrink` module),
//! [`ProcessGroup::grow`] admits new processes (through the transport's
//! [`Admission`](crate::Admission)), and [`ProcessGroup::finalize`] leaves at the end.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::ProcessGroup;
use crate::shrink::Agreement;
use crate::{CollectiveError, Result, Tag};

/// The phase of a group's tag space that carries the leader's growth plan to the members (the
/// sequence number is the attempt); below the shrink phase.
const GROW_PHASE: u16 = crate::shrink::SHRINK_PHASE - 1;

/// What the leader sends each member in `grow`: the first byte says which.
const GROWTH_FAILED: u8 = 0;
const GROWTH_PLANNED: u8 = 1;

impl ProcessGroup {
    /// Ends this rank's part in the group, as `MPI_Finalize` does: waits until every member
    /// has called `finalize` (a barrier), so that no rank's leaving can fail an operation
    /// another member still runs, then drops this handle.
    ///
    /// The transport closes once its last handle is gone (clones of this group, groups split
    /// from it, handles of non-blocking operations). Its peers take the close as the end of
    /// the job, not as a failure: it is logged at `debug`, and only a receive that still
    /// waits for this rank fails, with [`CollectiveError::PeerLost`].
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use rlx_collective::{MemTransport, ProcessGroup, Transport};
    /// # let world: Vec<ProcessGroup> = MemTransport::fan_out(3).into_iter()
    /// #     .map(|t| ProcessGroup::new(t as Arc<dyn Transport>)).collect();
    /// std::thread::scope(|s| {
    ///     for group in world {
    ///         s.spawn(move || group.finalize().unwrap());
    ///     }
    /// });
    /// ```
    pub fn finalize(self) -> Result<()> {
        self.barrier()?;
        drop(self);
        Ok(())
    }

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
        let shrunk = ProcessGroup::from_parts(
            Arc::clone(&shared.transport),
            decision.group_id,
            decision.members,
            rank,
            Arc::clone(&shared.group_ids),
        );
        shrunk
            .shared
            .flight
            .set_generation(shared.flight.generation());
        Ok(shrunk)
    }

    /// Collective over the members: admits `joiners` new processes, waiting up to `timeout`
    /// for them, and returns the grown group: the members keep their ranks, the joiners take
    /// ranks `world_size()..world_size() + joiners` in the order they arrived. Every member
    /// calls it; a joiner starts with the job's rendezvous information (for TCP the same
    /// `RLX_MASTER_ADDR`/`RLX_MASTER_PORT` and `RLX_JOB_SECRET`, through
    /// [`join`](crate::join); in-process, [`MemJoiner`](crate::MemJoiner)) and gets the same
    /// grown group.
    ///
    /// The group's rank 0 (after a [`shrink`](ProcessGroup::shrink) that lost the original
    /// rank 0, the lowest survivor) admits the joiners: it takes over the job's rendezvous
    /// address, checks each joiner like a rank (job id, `RLX_JOB_SECRET`), and hosts the new
    /// world's rendezvous. The grown group runs on a new transport with links of its own and
    /// a fresh tag space, so nothing sent before the growth (a late contribution, a stale
    /// message) can reach it; this group and its transport stay as they were, for the caller
    /// to drop. Fails with `Timeout` on every member when fewer joiners came in time, with
    /// `GroupFailed` on a failed group (shrink it first), and with `Unsupported` on a
    /// transport that cannot admit processes (see [`Transport::admission`](crate::Transport::admission)).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use rlx_collective::{MemTransport, ProcessGroup, ReduceKind, Transport};
    ///
    /// let ranks = MemTransport::fan_out(2);
    /// let joiner = ranks[0].joiner();
    /// let newcomer = std::thread::spawn(move || {
    ///     let group = ProcessGroup::joined(joiner.join(Duration::from_secs(60))?)?;
    ///     let mut x = [10.0f32];
    ///     group.all_reduce(&mut x, ReduceKind::Sum)?;
    ///     Ok::<_, rlx_collective::CollectiveError>((group.rank(), x[0]))
    /// });
    /// let members: Vec<_> = ranks
    ///     .into_iter()
    ///     .map(|t| {
    ///         std::thread::spawn(move || {
    ///             let group = ProcessGroup::new(t as Arc<dyn Transport>);
    ///             let grown = group.grow(1, Duration::from_secs(60))?;
    ///             let mut x = [grown.rank() as f32];
    ///             grown.all_reduce(&mut x, ReduceKind::Sum)?;
    ///             Ok::<_, rlx_collective::CollectiveError>((grown.rank(), x[0]))
    ///         })
    ///     })
    ///     .collect();
    /// for member in members {
    ///     let (_, sum) = member.join().unwrap()?;
    ///     assert_eq!(sum, 11.0);
    /// }
    /// assert_eq!(newcomer.join().unwrap()?, (2, 11.0));
    /// # Ok::<(), rlx_collective::CollectiveError>(())
    /// ```
    pub fn grow(&self, joiners: u32, timeout: Duration) -> Result<ProcessGroup> {
        let shared = &self.shared;
        shared.health.check()?;
        let admission = shared.transport.admission().ok_or_else(|| {
            CollectiveError::unsupported(
                "grow: this transport cannot admit new processes (the TCP and in-process \
                 transports can)",
            )
        })?;
        let n = self.world_size();
        let size = n.checked_add(joiners).ok_or_else(|| {
            CollectiveError::invalid(format!("grow: {n} + {joiners} ranks overflow"))
        })?;
        let attempt = shared.grows.fetch_add(1, Ordering::Relaxed);
        let tag = Tag::op(shared.group_id, attempt, GROW_PHASE);
        let started = Instant::now();
        let _span = tracing::info_span!("grow", group = shared.group_id, joiners).entered();
        let plan = if shared.rank == 0 {
            let planned = admission
                .await_joiners(joiners, timeout)
                .and_then(|pending| Ok((pending, admission.plan_world(size)?)));
            let (pending, plan) = match planned {
                Ok(planned) => planned,
                Err(error) => {
                    let why = error.to_string();
                    for &member in &shared.members[1..] {
                        // A member that cannot be told fails at its own deadline.
                        let _ = shared.transport.send_message(
                            member,
                            tag,
                            &[&[GROWTH_FAILED], why.as_bytes()],
                        );
                    }
                    return Err(error);
                }
            };
            for &member in &shared.members[1..] {
                shared
                    .transport
                    .send_message(member, tag, &[&[GROWTH_PLANNED], &plan])?;
            }
            for (rank, joiner) in (n..).zip(pending) {
                let who = joiner.describe();
                tracing::info!(rank, joiner = %who, "grow: admitting");
                joiner.admit(rank, size, &plan)?;
            }
            plan
        } else {
            let leader = shared.members[0];
            let wait = timeout.saturating_add(shared.transport.op_timeout());
            let message = shared.transport.recv_message(leader, tag, wait)?.ok_or(
                CollectiveError::Timeout {
                    peer: Some(leader),
                    op: "grow",
                    after: wait,
                },
            )?;
            match message.split_first() {
                Some((&GROWTH_PLANNED, plan)) => plan.to_vec(),
                Some((&GROWTH_FAILED, why)) => {
                    return Err(CollectiveError::PeerFailed {
                        peer: leader,
                        detail: format!(
                            "growing the group failed on its rank 0: {}",
                            String::from_utf8_lossy(why)
                        ),
                    });
                }
                _ => {
                    return Err(CollectiveError::protocol(
                        Some(leader),
                        format!("grow: a plan message of {} bytes", message.len()),
                    ));
                }
            }
        };
        let successor = admission.successor(&plan, shared.rank, size)?;
        let grown = ProcessGroup::first_of_grown_world(successor, shared.flight.generation() + 1)?;
        tracing::info!(world = size, elapsed = ?started.elapsed(), "grow: the grown group is up");
        Ok(grown)
    }

    /// The group of a process that joined a running job, over the transport it was admitted
    /// with ([`MemJoiner::join`](crate::MemJoiner::join), or `rlx_net`'s
    /// `TcpTransportBuilder::join`; [`join`](crate::join) does all of it from the
    /// environment). It is the joiner's side of [`ProcessGroup::grow`]: it returns once every
    /// rank of the grown world is up. See the example of [`ProcessGroup::grow`].
    pub fn joined(transport: Arc<dyn crate::Transport>) -> Result<ProcessGroup> {
        ProcessGroup::first_of_grown_world(transport, 1)
    }

    /// The world group of a grown world over `transport`, once every rank of it is up: rank
    /// 0 tells everyone the world's generation (how many times the job grew; a joiner cannot
    /// know it), which names the flight records.
    fn first_of_grown_world(
        transport: Arc<dyn crate::Transport>,
        generation: u32,
    ) -> Result<ProcessGroup> {
        let group = ProcessGroup::new(transport);
        let mut told = [i64::from(generation)];
        group.broadcast(0, &mut told)?;
        group
            .shared
            .flight
            .set_generation(u32::try_from(told[0]).unwrap_or(generation));
        Ok(group)
    }
}
