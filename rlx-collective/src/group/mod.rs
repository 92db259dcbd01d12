//! [`ProcessGroup`]: the ranks that run collectives together, over one [`Transport`].
//!
//! A group is a cheap handle (`Clone` shares it) on shared state: the transport, the members
//! (group rank → world rank), the group id and the sequence counter that gives every
//! operation its identity on the wire, the algorithm overrides, rank 0's federated
//! bookkeeping, and the queue and scratch region of the one-sided all-reduce.
//!
//! This file holds the type, its construction (`new`, `split`) and its settings; the rest of
//! its methods live by theme: `execute.rs` issues and runs operations, `point_to_point.rs`
//! sends and receives under user tags, `collectives.rs` wraps the reducing collectives,
//! broadcast and barrier, `movement.rs` the gathering and scattering ones, `compressed.rs`
//! the compressed all-reduce, `federated.rs` federated averaging,
//! `membership.rs` shrinks a group to its survivors, and `worker.rs` runs the non-blocking
//! ones.

mod algorithms;
mod cabling;
mod collectives;
mod compressed;
mod execute;
mod federated;
mod many;
mod membership;
mod movement;
mod point_to_point;
mod worker;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use parking_lot::Mutex;

use crate::all_reduce::one_sided::{self, region::OneSided};
use crate::federated::StaleRounds;
use crate::flight::{DEFAULT_FLIGHT_ENTRIES, FlightEntry, FlightRecorder};
use crate::health::Health;
use crate::issue_order::IssueOrder;
use crate::op::OpKind;
use crate::select::Settings;
use crate::split::{self, GroupIds, Record};
use crate::{CollectiveError, DType, Result, Topology, Transport};
use cabling::CablePlan;
use worker::Worker;

/// The group id of the world group every family starts from.
pub const WORLD_GROUP_ID: u16 = 1;

pub use many::DEFAULT_BUCKET_BYTES;
pub(crate) use many::{buckets, unpack};

/// A set of ranks that run collectives together; see the crate docs for the operations.
///
/// Every member must issue the same collectives in the same order (as in MPI and NCCL); each
/// operation takes the next sequence number of the group when it is issued — for the
/// `spawn_*` variants, on the calling thread before it returns — and all of its messages
/// carry `(group id, sequence)`, so concurrent operations never exchange each other's bytes.
///
/// The collectives take slices of any [`Element`](crate::Element) type (`f32`, `bf16`, `i64`,
/// ...); buffers of the `*_typed` operations are raw little-endian elements of a [`DType`]
/// known only at run time (any alignment), and the typed operations are thin wrappers over
/// them.
///
/// # Failures
///
/// A fatal failure ([`CollectiveError::is_fatal`]: a lost peer, a timeout, an abort, bad
/// bytes) in any operation of the group on any rank makes the group unusable on every rank,
/// as an aborted NCCL communicator is: that rank tells every member, and every member's
/// current operation (whichever it is, point-to-point calls included) and every later one
/// fails promptly — within milliseconds on a local network, not at the operation timeout —
/// with [`CollectiveError::GroupFailed`] naming the rank at fault, unless it saw the failure
/// itself (then with the error it saw). Other errors (a different length, an invalid argument)
/// leave the group usable. [`ProcessGroup::federated_average`] is the exception: it is built
/// to go on without lost members, so its failures stay in the round.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use rlx_collective::{MemTransport, ProcessGroup, ReduceKind, Transport};
///
/// let ranks = MemTransport::fan_out(3);
/// let threads: Vec<_> = ranks
///     .into_iter()
///     .map(|t| {
///         std::thread::spawn(move || {
///             let group = ProcessGroup::new(t as Arc<dyn Transport>);
///             let mut x = vec![group.rank() as f32; 4];
///             group.all_reduce(&mut x, ReduceKind::Sum)?;
///             Ok::<_, rlx_collective::CollectiveError>(x)
///         })
///     })
///     .collect();
/// for t in threads {
///     assert_eq!(t.join().unwrap()?, vec![3.0; 4]);
/// }
/// # Ok::<(), rlx_collective::CollectiveError>(())
/// ```
#[derive(Clone)]
pub struct ProcessGroup {
    shared: Arc<Shared>,
}

struct Shared {
    transport: Arc<dyn Transport>,
    group_id: u16,
    /// World rank of every group rank.
    members: Vec<u32>,
    rank: u32,
    seq: AtomicU32,
    /// How many times `shrink` was called on this group (each attempt has its own tags).
    shrinks: AtomicU32,
    /// How many times `grow` was called on this group (each attempt has its own tags).
    grows: AtomicU32,
    /// The next free group id of this rank's family (see the `split` module).
    group_ids: Arc<GroupIds>,
    settings: Mutex<Settings>,
    federated: Mutex<StaleRounds>,
    one_sided: OneSided,
    /// Present when native collectives may run on this group (see [`IssueOrder`]).
    issue_order: Option<IssueOrder>,
    /// Whether a fatal failure has made the group unusable (see the `health` module).
    health: Health,
    /// Runs the non-blocking operations.
    worker: Worker,
    /// The recent operations, for diagnosis.
    flight: FlightRecorder,
    /// What the link matrix says of the members' cables: the rings' order, islands, a line.
    cables: CablePlan,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.flight.dump_if_asked(self.group_id == WORLD_GROUP_ID);
    }
}

impl fmt::Debug for ProcessGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProcessGroup")
            .field("group_id", &self.shared.group_id)
            .field("rank", &self.shared.rank)
            .field("members", &self.shared.members)
            .field("next_seq", &self.shared.seq.load(Ordering::Relaxed))
            .finish()
    }
}

impl ProcessGroup {
    /// The world group over `transport`: group rank = world rank. Create it once per transport
    /// and clone it; two world groups on one transport would share operation identities (and
    /// the failure notices of a world group that failed, so after a fatal failure build the
    /// new group on a new transport).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use rlx_collective::{MemTransport, ProcessGroup, Transport};
    ///
    /// let t: Arc<dyn Transport> = MemTransport::fan_out(1).remove(0);
    /// let group = ProcessGroup::new(t);
    /// assert_eq!((group.rank(), group.world_size(), group.is_leader()), (0, 1, true));
    /// ```
    pub fn new(transport: Arc<dyn Transport>) -> ProcessGroup {
        let members = (0..transport.world_size()).collect();
        let rank = transport.rank();
        ProcessGroup::from_parts(
            transport,
            WORLD_GROUP_ID,
            members,
            rank,
            Arc::new(GroupIds::after(WORLD_GROUP_ID)),
        )
    }

    fn from_parts(
        transport: Arc<dyn Transport>,
        group_id: u16,
        members: Vec<u32>,
        rank: u32,
        group_ids: Arc<GroupIds>,
    ) -> ProcessGroup {
        let transport_has_native = transport.native_collectives().is_some();
        let world_rank = members.get(rank as usize).copied().unwrap_or(rank);
        let topology = transport.topology().and_then(|t| t.restricted(&members));
        let cables = CablePlan::of(topology.as_ref(), members.len() as u32, group_id);
        let settings = cables.settings();
        ProcessGroup {
            shared: Arc::new(Shared {
                transport,
                group_id,
                members,
                rank,
                seq: AtomicU32::new(0),
                shrinks: AtomicU32::new(0),
                grows: AtomicU32::new(0),
                group_ids,
                settings: Mutex::new(settings),
                federated: Mutex::new(StaleRounds::default()),
                one_sided: OneSided::default(),
                issue_order: (group_id == WORLD_GROUP_ID && transport_has_native)
                    .then(IssueOrder::default),
                health: Health::default(),
                worker: Worker::default(),
                flight: FlightRecorder::new(group_id, world_rank, DEFAULT_FLIGHT_ENTRIES),
                cables,
            }),
        }
    }

    /// This rank's rank in the group.
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use rlx_collective::{MemTransport, ProcessGroup, ReduceKind, Transport};
    /// # let world: Vec<ProcessGroup> = MemTransport::fan_out(1).into_iter()
    /// #     .map(|t| ProcessGroup::new(t as Arc<dyn Transport>)).collect();
    /// let group = &world[0];
    /// assert_eq!((group.rank(), group.world_size(), group.is_leader()), (0, 1, true));
    /// assert_eq!(group.members(), [0]);
    /// assert_eq!(group.group_id(), rlx_collective::WORLD_GROUP_ID);
    /// ```
    pub fn rank(&self) -> u32 {
        self.shared.rank
    }

    /// Number of ranks in the group.
    ///
    /// See the example of [`ProcessGroup::rank`].
    pub fn world_size(&self) -> u32 {
        self.shared.members.len() as u32
    }

    /// Whether this is rank 0 of the group.
    ///
    /// See the example of [`ProcessGroup::rank`].
    pub fn is_leader(&self) -> bool {
        self.shared.rank == 0
    }

    /// The transport the group runs on (whose ranks are world ranks).
    ///
    /// See the [type-level example](ProcessGroup#examples) for a group built on a transport.
    pub fn transport(&self) -> &Arc<dyn Transport> {
        &self.shared.transport
    }

    /// The group's recent collectives, oldest first, then its recent point-to-point calls
    /// (each at most [`DEFAULT_FLIGHT_ENTRIES`](crate::flight::DEFAULT_FLIGHT_ENTRIES)): what
    /// each was doing, the peer it last waited on (and a point-to-point call's tag), and how it
    /// ended. See the [`flight`](crate::flight) module.
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use rlx_collective::{MemTransport, ProcessGroup, Transport};
    /// use rlx_collective::flight::FlightState;
    ///
    /// let group = ProcessGroup::new(MemTransport::fan_out(1).remove(0) as Arc<dyn Transport>);
    /// group.barrier()?;
    /// let record = group.flight_record();
    /// assert_eq!((record[0].op, record[0].state), ("barrier", FlightState::Done));
    /// # Ok::<(), rlx_collective::CollectiveError>(())
    /// ```
    pub fn flight_record(&self) -> Vec<FlightEntry> {
        self.shared.flight.snapshot()
    }

    /// Writes [`ProcessGroup::flight_record`] to `dir` as JSON lines
    /// (`rank-<world rank>.jsonl`, or `rank-<r>-group-<g>.jsonl` for a sub-group), which
    /// `cargo xtask flight-report DIR` reads; returns the file written. Groups also write it
    /// by themselves on a fatal failure and when dropped, if `RLX_FLIGHT_RECORDER` names a
    /// directory.
    pub fn dump_flight_record(&self, dir: &std::path::Path) -> Result<std::path::PathBuf> {
        let path = self
            .shared
            .flight
            .file_in(dir, self.shared.group_id == WORLD_GROUP_ID);
        self.shared.flight.dump_to(&path)?;
        Ok(path)
    }

    /// The group's id on the wire ([`WORLD_GROUP_ID`] for the world group).
    ///
    /// See the example of [`ProcessGroup::rank`].
    pub fn group_id(&self) -> u16 {
        self.shared.group_id
    }

    /// The world rank of every group rank, in group-rank order.
    ///
    /// See the example of [`ProcessGroup::rank`].
    pub fn members(&self) -> &[u32] {
        &self.shared.members
    }

    /// The link matrix of this group's members, indexed by group rank: which of them a cable
    /// joins, which a switch, which only a route through other machines, and the addresses
    /// at each end. `None` when the transport does not know (threads, MLX, a world that
    /// grew).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use rlx_collective::{MemTransport, ProcessGroup, Transport};
    ///
    /// let t: Arc<dyn Transport> = MemTransport::fan_out(1).remove(0);
    /// assert!(ProcessGroup::new(t).topology().is_none());
    /// ```
    pub fn topology(&self) -> Option<Topology> {
        self.shared
            .transport
            .topology()?
            .restricted(&self.shared.members)
    }

    /// The group ranks in the order the group's rings visit them (`[0, 2, 1, 3]` on a chain
    /// cabled 0-2-1-3): rank order unless the link matrix shows a cheaper ring (see
    /// [`ProcessGroup::topology`]). [`Algorithm::RankOrderRing`](crate::Algorithm::RankOrderRing) rings in rank order
    /// instead.
    pub fn ring_order(&self) -> &[u32] {
        self.shared.cables.ring_order().ranks_in_order()
    }

    /// Collective: allocates the scratch region of the one-sided all-reduce
    /// ([`Algorithm::OneSidedRing`](crate::Algorithm::OneSidedRing)) with `region_bytes` bytes of the symmetric heap on every
    /// rank, freeing the previous one. Without it the first one-sided all-reduce allocates
    /// [`DEFAULT_ONE_SIDED_REGION_BYTES`](crate::select::DEFAULT_ONE_SIDED_REGION_BYTES) (at most
    /// half the heap). Larger regions mean larger segments and fewer messages; buffers larger
    /// than a region travel in several segments.
    ///
    /// It is ordered like a collective: every member issues it with the same size at the same
    /// point of the group's sequence, and it waits for the one-sided all-reduces issued
    /// before it. Nothing
    /// else may allocate or free heap memory on the transport meanwhile. Fails with
    /// `Unsupported` on a sub-group or a transport without a heap, and with
    /// `InvalidArgument` when the region is smaller than
    /// [`MIN_ONE_SIDED_REGION_BYTES`](crate::select::MIN_ONE_SIDED_REGION_BYTES) or does not fit.
    ///
    /// See the example of [`ProcessGroup::set_algorithm`]; `tests/one_sided.rs` enables the
    /// region on a transport with a heap end to end.
    pub fn enable_one_sided(&self, region_bytes: u64) -> Result<()> {
        self.run(OpKind::EnableOneSided, |ctx| {
            one_sided::enable(ctx, region_bytes)
        })
    }

    /// The world rank of group rank `rank`.
    fn world_peer(&self, rank: u32) -> Result<u32> {
        self.shared
            .members
            .get(rank as usize)
            .copied()
            .ok_or(CollectiveError::UnknownRank {
                rank,
                world_size: self.world_size(),
            })
    }

    /// Splits the group like `MPI_Comm_split`: ranks passing the same `color` form a new
    /// group, ordered by `key` (ties by rank in this group); `None` joins no group and gets
    /// `Ok(None)`. Every member of this group must call it.
    ///
    /// The new group shares the transport; its id differs from the id of every other group
    /// that shares a rank with it, so its collectives may run concurrently with this group's.
    /// Splits of two different groups must not run concurrently within one process.
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use rlx_collective::{MemTransport, ProcessGroup, ReduceKind, Transport};
    /// # let world: Vec<ProcessGroup> = MemTransport::fan_out(4).into_iter()
    /// #     .map(|t| ProcessGroup::new(t as Arc<dyn Transport>)).collect();
    /// std::thread::scope(|s| {
    ///     for group in &world {
    ///         s.spawn(move || {
    ///             // Even and odd ranks form two groups of two, ordered by world rank.
    ///             let half = group.split(Some(group.rank() % 2), 0).unwrap().unwrap();
    ///             assert_eq!((half.rank(), half.world_size()), (group.rank() / 2, 2));
    ///             let mut x = [group.rank() as i32];
    ///             half.all_reduce(&mut x, ReduceKind::Sum).unwrap();
    ///             assert_eq!(x, [if group.rank() % 2 == 0 { 2 } else { 4 }]);
    ///         });
    ///     }
    /// });
    /// ```
    pub fn split(&self, color: Option<u32>, key: i32) -> Result<Option<ProcessGroup>> {
        let ids = &self.shared.group_ids;
        let mine = Record {
            color,
            key,
            proposal: ids.proposal(),
        };
        let all = self.all_gather_typed(&mine.encode(), DType::U8)?;
        let Some(plan) = split::plan_gathered(&all, self.shared.rank)? else {
            return Ok(None);
        };
        ids.reserve(plan.group_id);
        let members = plan
            .members
            .iter()
            .map(|&parent| self.world_peer(parent))
            .collect::<Result<Vec<_>>>()?;
        let group = ProcessGroup::from_parts(
            Arc::clone(&self.shared.transport),
            plan.group_id,
            members,
            plan.rank,
            Arc::clone(ids),
        );
        group
            .shared
            .flight
            .set_generation(self.shared.flight.generation());
        Ok(Some(group))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handle::CollectiveHandle;
    use crate::{CollectiveOp, ReduceKind};

    #[test]
    fn process_groups_are_shareable_across_threads() {
        fn assert_shareable<T: Clone + Send + Sync + 'static>() {}
        assert_shareable::<ProcessGroup>();
        fn assert_send<T: Send>() {}
        assert_send::<CollectiveHandle<Vec<f32>>>();
    }

    /// `from` tells rank 0 of the world group, as a member that declared it failed does,
    /// that world rank `culprit` is at fault for `cause`.
    fn announce(from: &dyn Transport, culprit: u32, cause: crate::FatalCause) {
        let notice = crate::Failure::GroupFailed { culprit, cause };
        from.send_failure(0, crate::health::notice_tag(WORLD_GROUP_ID), notice)
            .unwrap();
    }

    /// A rank whose operation needs no wait (a broadcast root, a send) still reports the
    /// failure its members have already announced, instead of a success for a group they have
    /// given up on: the case of a rank resumed after a stall, whose data had all arrived.
    #[test]
    fn an_operation_that_needs_no_wait_reports_an_announced_failure() {
        let world = crate::MemTransport::fan_out(2);
        let group = ProcessGroup::new(Arc::clone(&world[0]) as Arc<dyn Transport>);
        let mut data = [1.0f32; 3];
        group.broadcast(0, &mut data).unwrap();
        announce(&*world[1], 0, crate::FatalCause::Timeout);
        let err = group.broadcast(0, &mut data).unwrap_err();
        assert!(
            matches!(
                err,
                CollectiveError::GroupFailed {
                    peer: 0,
                    reporter: 1,
                    ..
                }
            ),
            "{err}"
        );
        assert!(
            matches!(
                group.send(1, 5, &data),
                Err(CollectiveError::GroupFailed { .. })
            ),
            "the group stays failed"
        );
    }

    #[test]
    fn a_member_that_announced_a_failure_and_left_is_not_the_one_blamed() {
        let world = crate::MemTransport::fan_out(3);
        let group = ProcessGroup::new(Arc::clone(&world[0]) as Arc<dyn Transport>);
        // Rank 1 declares the group failed because of rank 2, then its process ends: its
        // notice is queued ahead of its loss.
        announce(&*world[1], 2, crate::FatalCause::PeerLost);
        world[1].abort();
        let mut data = [0.0f32; 3];
        let err = group.broadcast(1, &mut data).unwrap_err();
        assert!(
            matches!(
                err,
                CollectiveError::GroupFailed {
                    peer: 2,
                    reporter: 1,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn every_issued_operation_takes_the_next_sequence_number() {
        let t: Arc<dyn Transport> = crate::MemTransport::fan_out(1).remove(0);
        let group = ProcessGroup::new(t);
        let first = group.issue(OpKind::from(CollectiveOp::Barrier)).seq;
        let handle = group.spawn_barrier();
        handle.join().unwrap();
        let mut x = [1.0f32];
        group.all_reduce(&mut x, ReduceKind::Sum).unwrap();
        assert_eq!(
            group.issue(OpKind::from(CollectiveOp::Barrier)).seq,
            first + 3
        );
    }
}
