//! [`ProcessGroup`]: the ranks that run collectives together, over one [`Transport`].
//!
//! A group is a cheap handle (`Clone` shares it) on shared state: the transport, the members
//! (group rank → world rank), the group id and the sequence counter that gives every
//! operation its identity on the wire, the algorithm overrides, rank 0's federated
//! bookkeeping, and the queue and scratch region of the one-sided all-reduce.

use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

use crate::all_reduce::one_sided::{self, OneSided};
use crate::federated::{self, StaleRounds};
use crate::handle::{AllReduceHandle, CollectiveHandle};
use crate::issue_order::IssueOrder;
use crate::op::{FailureScope, Health, OpCtx, OpId, Watch};
use crate::select::{Algorithm, CollectiveOp, Settings};
use crate::split::{self, Record};
use crate::{CollectiveError, DType, ReduceKind, Result, Tag, Transport};

/// The group id of the world group every family starts from.
pub const WORLD_GROUP_ID: u16 = 1;

/// A set of ranks that run collectives together; see the crate docs for the operations.
///
/// Every member must issue the same collectives in the same order (as in MPI and NCCL); each
/// operation takes the next sequence number of the group when it is issued — for the
/// `spawn_*` variants, on the calling thread before it returns — and all of its messages
/// carry `(group id, sequence)`, so concurrent operations never exchange each other's bytes.
///
/// Buffers of the `*_typed` operations are raw little-endian elements of a [`DType`] (any
/// alignment); the `f32` operations are thin wrappers over them.
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
    /// The next free group id of this rank's family (see the `split` module).
    next_group_id: Arc<Mutex<u32>>,
    settings: Mutex<Settings>,
    federated: Mutex<StaleRounds>,
    one_sided: OneSided,
    /// Present when native collectives may run on this group (see [`IssueOrder`]).
    issue_order: Option<IssueOrder>,
    /// Whether a fatal failure has made the group unusable (see the `op` module).
    health: Health,
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

fn f32_bytes(data: &[f32]) -> &[u8] {
    bytemuck::cast_slice(data)
}

fn f32_bytes_mut(data: &mut [f32]) -> &mut [u8] {
    bytemuck::cast_slice_mut(data)
}

/// Little-endian `f32`s from bytes whose length is already known to be a multiple of 4.
fn f32s_from_le(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Length of `len` elements gathered from `world` ranks, refused when it overflows.
fn gathered_len(len: usize, world: u32) -> Result<usize> {
    len.checked_mul(world as usize).ok_or_else(|| {
        CollectiveError::invalid(format!(
            "gathering {len} elements from {world} ranks overflows the address space"
        ))
    })
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
            Arc::new(Mutex::new(u32::from(WORLD_GROUP_ID) + 1)),
        )
    }

    fn from_parts(
        transport: Arc<dyn Transport>,
        group_id: u16,
        members: Vec<u32>,
        rank: u32,
        next_group_id: Arc<Mutex<u32>>,
    ) -> ProcessGroup {
        let transport_has_native = transport.native_collectives().is_some();
        ProcessGroup {
            shared: Arc::new(Shared {
                transport,
                group_id,
                members,
                rank,
                seq: AtomicU32::new(0),
                next_group_id,
                settings: Mutex::new(Settings::default()),
                federated: Mutex::new(StaleRounds::default()),
                one_sided: OneSided::default(),
                issue_order: (group_id == WORLD_GROUP_ID && transport_has_native)
                    .then(IssueOrder::default),
                health: Health::default(),
            }),
        }
    }

    /// This rank's rank in the group.
    pub fn rank(&self) -> u32 {
        self.shared.rank
    }

    /// Number of ranks in the group.
    pub fn world_size(&self) -> u32 {
        self.shared.members.len() as u32
    }

    /// Whether this is rank 0 of the group.
    pub fn is_leader(&self) -> bool {
        self.shared.rank == 0
    }

    /// The transport the group runs on (whose ranks are world ranks).
    pub fn transport(&self) -> &Arc<dyn Transport> {
        &self.shared.transport
    }

    /// The group's id on the wire ([`WORLD_GROUP_ID`] for the world group).
    pub fn group_id(&self) -> u16 {
        self.shared.group_id
    }

    /// The world rank of every group rank, in group-rank order.
    pub fn members(&self) -> &[u32] {
        &self.shared.members
    }

    /// Forces `algorithm` for `op` on this group (and its clones) from the next issued
    /// operation on; [`Algorithm::Auto`] restores the size-based choice. Every member must
    /// make the same choice. Fails with `InvalidArgument` if `op` has no such algorithm (see
    /// [`CollectiveOp::algorithms`]), and with `Unsupported` if this group cannot run it (see
    /// [`ProcessGroup::supports_algorithm`]).
    pub fn set_algorithm(&self, op: CollectiveOp, algorithm: Algorithm) -> Result<()> {
        let known = op.algorithms().contains(&algorithm);
        if known && algorithm == Algorithm::OneSidedRing && !self.supports_algorithm(op, algorithm)
        {
            if self.shared.transport.symmetric().is_none() {
                return Err(CollectiveError::unsupported(format!(
                    "{op} with {algorithm} needs a transport with a symmetric heap, and this \
                     transport has none (wrap it in rlx_transport::Symmetric)"
                )));
            }
            if self.shared.group_id != WORLD_GROUP_ID {
                return Err(CollectiveError::unsupported(format!(
                    "{op} with {algorithm} runs on the world group only: a sub-group cannot \
                     allocate symmetric heap memory, which is collective over the whole world"
                )));
            }
        }
        self.shared.settings.lock().set(op, algorithm)
    }

    /// Whether `algorithm` can run `op` on this group: it is one of `op`'s algorithms and,
    /// for [`Algorithm::OneSidedRing`], this is the world group of a transport with a
    /// symmetric heap ([`Transport::symmetric`]).
    pub fn supports_algorithm(&self, op: CollectiveOp, algorithm: Algorithm) -> bool {
        op.algorithms().contains(&algorithm)
            && (algorithm != Algorithm::OneSidedRing
                || (self.shared.group_id == WORLD_GROUP_ID
                    && self.shared.transport.symmetric().is_some()))
    }

    /// Collective: allocates the scratch region of the one-sided all-reduce
    /// ([`Algorithm::OneSidedRing`]) with `region_bytes` bytes of the symmetric heap on every
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
    pub fn enable_one_sided(&self, region_bytes: u64) -> Result<()> {
        let shared = &self.shared;
        self.run(one_sided::ENABLE_OP, |ctx| {
            one_sided::enable(ctx, &shared.one_sided, region_bytes)
        })
    }

    /// The algorithm forced for `op` ([`Algorithm::Auto`] when none is).
    pub fn algorithm(&self, op: CollectiveOp) -> Algorithm {
        self.shared.settings.lock().get(op)
    }

    /// Caps the pipeline segment size of the segmented algorithms at `bytes` (at least one
    /// element), so that small inputs take multi-segment paths in tests and benchmarks;
    /// `None` restores the measured sizes. Every member must set the same value.
    #[doc(hidden)]
    pub fn set_max_segment_bytes(&self, bytes: Option<usize>) {
        self.shared.settings.lock().max_segment_bytes = bytes;
    }

    /// The current segment cap (see [`ProcessGroup::set_max_segment_bytes`]).
    #[doc(hidden)]
    pub fn max_segment_bytes(&self) -> Option<usize> {
        self.shared.settings.lock().max_segment_bytes
    }

    /// Issues the next operation: takes its sequence number and the settings it runs with.
    fn issue(&self, name: &'static str) -> OpId {
        let shared = &self.shared;
        let id = OpId {
            group: shared.group_id,
            seq: shared.seq.fetch_add(1, Ordering::Relaxed),
            rank: shared.rank,
            is_world: shared.group_id == WORLD_GROUP_ID,
            name,
            settings: *shared.settings.lock(),
            scope: FailureScope::Group,
        };
        shared.one_sided.on_issue(&id);
        if let Some(order) = &shared.issue_order {
            order.register(id.seq);
        }
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
    fn execute<T>(&self, id: OpId, body: impl FnOnce(&OpCtx<'_>) -> Result<T>) -> Result<T> {
        let shared = &self.shared;
        let ctx = OpCtx::new(
            shared.transport.as_ref(),
            &shared.members,
            &shared.health,
            id,
        );
        // Until the body runs, nothing of it releases the operation's place in the one-sided
        // queue, so an operation that ends early releases it here.
        let _turn = match &shared.issue_order {
            Some(order) => match order.wait_turn(id.seq, id.name, ctx.timeout()) {
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
        match std::panic::catch_unwind(AssertUnwindSafe(|| body(&ctx))) {
            Ok(result) => result.inspect_err(|error| ctx.notify_failure(error)),
            Err(panic) => {
                ctx.notify_failure(&CollectiveError::Aborted);
                std::panic::resume_unwind(panic)
            }
        }
    }

    fn run<T>(&self, name: &'static str, body: impl FnOnce(&OpCtx<'_>) -> Result<T>) -> Result<T> {
        let id = self.issue(name);
        self.execute(id, body)
    }

    fn spawn<T: Send + 'static>(
        &self,
        name: &'static str,
        body: impl FnOnce(&OpCtx<'_>) -> Result<T> + Send + 'static,
    ) -> CollectiveHandle<T> {
        let id = self.issue(name);
        let group = self.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("rlx-{name}"))
            .spawn(move || group.execute(id, body));
        if spawned.is_err() {
            // The operation was issued but will not run here: its peers must not wait for it.
            let shared = &self.shared;
            shared.one_sided.release(id.seq);
            if let Some(order) = &shared.issue_order {
                order.release(id.seq);
            }
            // An operation that never runs leaves its peers' matching broken for good: that
            // is a fatal failure of the group, announced as one.
            OpCtx::new(
                shared.transport.as_ref(),
                &shared.members,
                &shared.health,
                id,
            )
            .notify_failure(&CollectiveError::Aborted);
        }
        CollectiveHandle::new(spawned, name, self.shared.rank)
    }

    /// The failure watch of this group's point-to-point calls.
    fn watch(&self) -> Watch<'_> {
        let shared = &self.shared;
        Watch::new(
            shared.transport.as_ref(),
            &shared.members,
            shared.rank,
            shared.group_id,
            &shared.health,
            FailureScope::Group,
        )
    }

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

    /// Sends `data` to group rank `to` under the user tag `tag` (below
    /// [`TAG_RESERVED_BASE`](crate::TAG_RESERVED_BASE)). User tags are per pair of world
    /// ranks, shared by every group of the family.
    pub fn send_f32(&self, to: u32, tag: u32, data: &[f32]) -> Result<()> {
        self.send_typed(to, tag, f32_bytes(data), DType::F32)
    }

    /// Receives the next `f32` message from group rank `from` under the user tag `tag`,
    /// waiting at most the transport's operation timeout.
    pub fn recv_f32(&self, from: u32, tag: u32) -> Result<Vec<f32>> {
        Ok(f32s_from_le(&self.recv_typed(from, tag, DType::F32)?))
    }

    /// Sends the `dtype` elements in `data` to group rank `to` under the user tag `tag`.
    pub fn send_typed(&self, to: u32, tag: u32, data: &[u8], dtype: DType) -> Result<()> {
        crate::check_dtype_len(data.len(), dtype)?;
        let tag = Tag::user(tag)?;
        let peer = self.world_peer(to)?;
        let watch = self.watch();
        watch.check()?;
        self.shared
            .transport
            .send_message(peer, tag, &[data])
            .inspect_err(|error| watch.on_failure(error))
    }

    /// Receives the next message from group rank `from` under the user tag `tag` as `dtype`
    /// elements; a length that is not a whole number of elements is a protocol error.
    pub fn recv_typed(&self, from: u32, tag: u32, dtype: DType) -> Result<Vec<u8>> {
        let tag = Tag::user(tag)?;
        let peer = self.world_peer(from)?;
        let after = self.shared.transport.op_timeout();
        let watch = self.watch();
        let bytes = watch
            .wait(after, crate::op::NOTICE_SLICE, |deadline| {
                self.shared.transport.recv_message(peer, tag, deadline)
            })
            .and_then(|got| {
                got.ok_or(CollectiveError::Timeout {
                    peer: Some(peer),
                    op: "recv",
                    after,
                })
            })
            .inspect_err(|error| watch.on_failure(error))?;
        if bytes.len() % dtype.size() != 0 {
            return Err(CollectiveError::protocol(
                Some(peer),
                format!(
                    "message of {} bytes is not a whole number of {dtype} elements",
                    bytes.len()
                ),
            ));
        }
        Ok(bytes)
    }

    /// Returns once every member has entered the barrier (dissemination algorithm).
    pub fn barrier(&self) -> Result<()> {
        self.run("barrier", crate::barrier::dissemination::run)
    }

    /// Reduces `data` over the group in place; every rank ends with bit-identical values.
    ///
    /// Accumulates in f32 (f64 for `F64` data, i64 for integers) across all hops and rounds
    /// once at the end. All ranks must pass the same length; otherwise every rank fails with
    /// [`CollectiveError::LengthMismatch`].
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use rlx_collective::{MemTransport, ProcessGroup, ReduceKind, Transport};
    ///
    /// let world: Vec<ProcessGroup> = MemTransport::fan_out(2)
    ///     .into_iter()
    ///     .map(|t| ProcessGroup::new(t as Arc<dyn Transport>))
    ///     .collect();
    /// let peer = world[1].clone();
    /// let t = std::thread::spawn(move || {
    ///     let mut x = [3.0f32, 4.0];
    ///     peer.all_reduce(&mut x, ReduceKind::Mean).map(|_| x)
    /// });
    /// let mut x = [1.0f32, 2.0];
    /// world[0].all_reduce(&mut x, ReduceKind::Mean)?;
    /// assert_eq!(x, [2.0, 3.0]);
    /// assert_eq!(t.join().unwrap()?, [2.0, 3.0]);
    /// # Ok::<(), rlx_collective::CollectiveError>(())
    /// ```
    pub fn all_reduce(&self, data: &mut [f32], op: ReduceKind) -> Result<()> {
        self.all_reduce_typed(f32_bytes_mut(data), DType::F32, op)
    }

    /// [`ProcessGroup::all_reduce`] on raw little-endian `dtype` elements.
    pub fn all_reduce_typed(&self, data: &mut [u8], dtype: DType, op: ReduceKind) -> Result<()> {
        let one_sided = &self.shared.one_sided;
        self.run("all_reduce", |ctx| {
            crate::all_reduce::run(ctx, one_sided, data, dtype, op)
        })
    }

    /// Non-blocking [`ProcessGroup::all_reduce`]: issued now, run on its own thread;
    /// `join()` returns the reduced buffer.
    pub fn spawn_all_reduce(self: &Arc<Self>, data: Vec<f32>, op: ReduceKind) -> AllReduceHandle {
        self.as_ref().spawn_all_reduce_f32(data, op)
    }

    /// [`ProcessGroup::spawn_all_reduce`] on a plain (non-`Arc`) group handle.
    pub fn spawn_all_reduce_f32(&self, mut data: Vec<f32>, op: ReduceKind) -> AllReduceHandle {
        let group = self.clone();
        self.spawn("all_reduce", move |ctx| {
            let one_sided = &group.shared.one_sided;
            crate::all_reduce::run(ctx, one_sided, f32_bytes_mut(&mut data), DType::F32, op)?;
            Ok(data)
        })
    }

    /// Non-blocking [`ProcessGroup::all_reduce_typed`].
    pub fn spawn_all_reduce_typed(
        &self,
        mut data: Vec<u8>,
        dtype: DType,
        op: ReduceKind,
    ) -> CollectiveHandle<Vec<u8>> {
        let group = self.clone();
        self.spawn("all_reduce", move |ctx| {
            crate::all_reduce::run(ctx, &group.shared.one_sided, &mut data, dtype, op)?;
            Ok(data)
        })
    }

    /// Reduces every rank's `data` into `root`'s `data`; the other ranks' buffers are left
    /// unchanged.
    pub fn reduce(&self, root: u32, data: &mut [f32], op: ReduceKind) -> Result<()> {
        self.reduce_typed(root, f32_bytes_mut(data), DType::F32, op)
    }

    /// [`ProcessGroup::reduce`] on raw little-endian `dtype` elements.
    pub fn reduce_typed(
        &self,
        root: u32,
        data: &mut [u8],
        dtype: DType,
        op: ReduceKind,
    ) -> Result<()> {
        self.run("reduce", |ctx| {
            crate::reduce::run(ctx, root, data, dtype, op)
        })
    }

    /// Non-blocking [`ProcessGroup::reduce_typed`]; `join()` returns the buffer (the result on
    /// the root, the untouched input elsewhere).
    pub fn spawn_reduce_typed(
        &self,
        root: u32,
        mut data: Vec<u8>,
        dtype: DType,
        op: ReduceKind,
    ) -> CollectiveHandle<Vec<u8>> {
        self.spawn("reduce", move |ctx| {
            crate::reduce::run(ctx, root, &mut data, dtype, op)?;
            Ok(data)
        })
    }

    /// Reduces every rank's `data` and returns this rank's block of the result: with `c`
    /// elements on `n` ranks, rank `i` gets elements `i*c/n .. (i+1)*c/n` (blocks differ by
    /// at most one element when `n` does not divide `c`).
    pub fn reduce_scatter(&self, data: &[f32], op: ReduceKind) -> Result<Vec<f32>> {
        let bytes = self.reduce_scatter_typed(f32_bytes(data), DType::F32, op)?;
        Ok(f32s_from_le(&bytes))
    }

    /// [`ProcessGroup::reduce_scatter`] on raw little-endian `dtype` elements.
    pub fn reduce_scatter_typed(
        &self,
        data: &[u8],
        dtype: DType,
        op: ReduceKind,
    ) -> Result<Vec<u8>> {
        self.run("reduce_scatter", |ctx| {
            crate::reduce_scatter::run(ctx, data, dtype, op)
        })
    }

    /// Non-blocking [`ProcessGroup::reduce_scatter_typed`].
    pub fn spawn_reduce_scatter_typed(
        &self,
        data: Vec<u8>,
        dtype: DType,
        op: ReduceKind,
    ) -> CollectiveHandle<Vec<u8>> {
        self.spawn("reduce_scatter", move |ctx| {
            crate::reduce_scatter::run(ctx, &data, dtype, op)
        })
    }

    /// Gathers every rank's `local` on every rank, in rank order. All ranks pass the same
    /// length.
    pub fn all_gather(&self, local: &[f32]) -> Result<Vec<f32>> {
        let mut out = vec![0f32; gathered_len(local.len(), self.world_size())?];
        self.all_gather_into(local, &mut out)?;
        Ok(out)
    }

    /// [`ProcessGroup::all_gather`] into `out`, which holds `world_size × local.len()`
    /// elements: a loop that gathers the same sizes again and again allocates nothing. An
    /// `out` of another length is [`CollectiveError::InvalidArgument`] on this rank and fails
    /// the operation on the others.
    pub fn all_gather_into(&self, local: &[f32], out: &mut [f32]) -> Result<()> {
        self.all_gather_typed_into(f32_bytes(local), f32_bytes_mut(out), DType::F32)
    }

    /// [`ProcessGroup::all_gather`] on raw little-endian `dtype` elements.
    pub fn all_gather_typed(&self, local: &[u8], dtype: DType) -> Result<Vec<u8>> {
        let mut out = vec![0u8; gathered_len(local.len(), self.world_size())?];
        self.all_gather_typed_into(local, &mut out, dtype)?;
        Ok(out)
    }

    /// [`ProcessGroup::all_gather_into`] on raw little-endian `dtype` elements.
    pub fn all_gather_typed_into(&self, local: &[u8], out: &mut [u8], dtype: DType) -> Result<()> {
        self.run("all_gather", |ctx| {
            let expected = gathered_len(local.len(), ctx.size())?;
            if out.len() != expected {
                return Err(CollectiveError::invalid(format!(
                    "all_gather output holds {} bytes; {} ranks × {} bytes need {expected}",
                    out.len(),
                    ctx.size(),
                    local.len()
                )));
            }
            crate::all_gather::run(ctx, local, out, dtype)
        })
    }

    /// Non-blocking [`ProcessGroup::all_gather_typed`].
    pub fn spawn_all_gather_typed(
        &self,
        local: Vec<u8>,
        dtype: DType,
    ) -> CollectiveHandle<Vec<u8>> {
        self.spawn("all_gather", move |ctx| {
            let mut out = vec![0u8; gathered_len(local.len(), ctx.size())?];
            crate::all_gather::run(ctx, &local, &mut out, dtype)?;
            Ok(out)
        })
    }

    /// Gathers every rank's `local` on `root` in rank order: `Some` on the root, `None`
    /// elsewhere. All ranks pass the same length.
    pub fn gather(&self, root: u32, local: &[f32]) -> Result<Option<Vec<f32>>> {
        let bytes = self.gather_typed(root, f32_bytes(local), DType::F32)?;
        Ok(bytes.map(|b| f32s_from_le(&b)))
    }

    /// [`ProcessGroup::gather`] on raw little-endian `dtype` elements.
    pub fn gather_typed(&self, root: u32, local: &[u8], dtype: DType) -> Result<Option<Vec<u8>>> {
        self.run("gather", |ctx| crate::gather::run(ctx, root, local, dtype))
    }

    /// Non-blocking [`ProcessGroup::gather_typed`].
    pub fn spawn_gather_typed(
        &self,
        root: u32,
        local: Vec<u8>,
        dtype: DType,
    ) -> CollectiveHandle<Option<Vec<u8>>> {
        self.spawn("gather", move |ctx| {
            crate::gather::run(ctx, root, &local, dtype)
        })
    }

    /// Sends block `i` of `root`'s `send` (world_size blocks of `recv.len()` elements) to rank
    /// `i`'s `recv`; `send` is only read on the root (pass `&[]` elsewhere).
    pub fn scatter(&self, root: u32, send: &[f32], recv: &mut [f32]) -> Result<()> {
        self.scatter_typed(root, f32_bytes(send), f32_bytes_mut(recv), DType::F32)
    }

    /// [`ProcessGroup::scatter`] on raw little-endian `dtype` elements.
    pub fn scatter_typed(
        &self,
        root: u32,
        send: &[u8],
        recv: &mut [u8],
        dtype: DType,
    ) -> Result<()> {
        self.run("scatter", |ctx| {
            crate::scatter::run(ctx, root, send, recv, dtype)
        })
    }

    /// Non-blocking [`ProcessGroup::scatter_typed`]: `send` is read on the root only;
    /// `join()` returns this rank's block of `recv_len` bytes.
    pub fn spawn_scatter_typed(
        &self,
        root: u32,
        send: Vec<u8>,
        recv_len: usize,
        dtype: DType,
    ) -> CollectiveHandle<Vec<u8>> {
        self.spawn("scatter", move |ctx| {
            let mut recv = vec![0u8; recv_len];
            crate::scatter::run(ctx, root, &send, &mut recv, dtype)?;
            Ok(recv)
        })
    }

    /// Copies `root`'s `data` into every rank's `data`. All ranks pass the same length.
    pub fn broadcast(&self, root: u32, data: &mut [f32]) -> Result<()> {
        self.broadcast_typed(root, f32_bytes_mut(data), DType::F32)
    }

    /// [`ProcessGroup::broadcast`] on raw little-endian `dtype` elements.
    pub fn broadcast_typed(&self, root: u32, data: &mut [u8], dtype: DType) -> Result<()> {
        self.run("broadcast", |ctx| {
            crate::broadcast::run(ctx, root, data, dtype)
        })
    }

    /// Non-blocking [`ProcessGroup::broadcast_typed`]; `join()` returns the buffer.
    pub fn spawn_broadcast_typed(
        &self,
        root: u32,
        mut data: Vec<u8>,
        dtype: DType,
    ) -> CollectiveHandle<Vec<u8>> {
        self.spawn("broadcast", move |ctx| {
            crate::broadcast::run(ctx, root, &mut data, dtype)?;
            Ok(data)
        })
    }

    /// Splits `send` into world_size equal blocks and sends block `j` to rank `j`; returns the
    /// blocks received, block `i` from rank `i`.
    pub fn all_to_all(&self, send: &[f32]) -> Result<Vec<f32>> {
        let bytes = self.all_to_all_typed(f32_bytes(send), DType::F32)?;
        Ok(f32s_from_le(&bytes))
    }

    /// [`ProcessGroup::all_to_all`] on raw little-endian `dtype` elements.
    pub fn all_to_all_typed(&self, send: &[u8], dtype: DType) -> Result<Vec<u8>> {
        self.run("all_to_all", |ctx| crate::all_to_all::run(ctx, send, dtype))
    }

    /// Non-blocking [`ProcessGroup::all_to_all_typed`].
    pub fn spawn_all_to_all_typed(&self, send: Vec<u8>, dtype: DType) -> CollectiveHandle<Vec<u8>> {
        self.spawn("all_to_all", move |ctx| {
            crate::all_to_all::run(ctx, &send, dtype)
        })
    }

    /// Non-blocking [`ProcessGroup::barrier`].
    pub fn spawn_barrier(&self) -> CollectiveHandle<()> {
        self.spawn("barrier", crate::barrier::dissemination::run)
    }

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
    pub fn federated_average(&self, data: &mut [f32], deadline: Duration) -> Result<usize> {
        let shared = &self.shared;
        let id = OpId {
            scope: FailureScope::Operation,
            ..self.issue("federated_average")
        };
        self.execute(id, |ctx| {
            if ctx.size() == 1 {
                return Ok(1);
            }
            if ctx.rank == 0 {
                federated::run_root(ctx, &mut shared.federated.lock(), data, deadline)
            } else {
                federated::run_member(ctx, data, deadline).map(|()| 0)
            }
        })
    }

    /// Number of late federated contributions rank 0 still expects from past rounds (they are
    /// freed as they arrive, at the start of the next round).
    pub fn federated_outstanding(&self) -> usize {
        self.shared.federated.lock().outstanding()
    }

    /// The reduce dtype for ranks holding `dtypes` (see [`negotiate_reduce_dtype`]).
    ///
    /// [`negotiate_reduce_dtype`]: crate::negotiate_reduce_dtype
    pub fn negotiate_reduce_dtype(dtypes: &[DType]) -> DType {
        crate::negotiate_reduce_dtype(dtypes)
    }

    /// Collectively agrees on the reduce dtype: gathers every rank's `local` dtype and applies
    /// [`crate::negotiate_reduce_dtype`]. Every rank gets the same answer.
    pub fn agree_reduce_dtype(&self, local: DType) -> Result<DType> {
        let codes = self.all_gather_typed(&[local.code()], DType::U8)?;
        let dtypes = codes
            .iter()
            .map(|&code| {
                DType::from_code(code).ok_or_else(|| {
                    CollectiveError::protocol(None, format!("unknown dtype code {code}"))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(crate::negotiate_reduce_dtype(&dtypes))
    }

    /// Splits the group like `MPI_Comm_split`: ranks passing the same `color` form a new
    /// group, ordered by `key` (ties by rank in this group); `None` joins no group and gets
    /// `Ok(None)`. Every member of this group must call it.
    ///
    /// The new group shares the transport; its id differs from the id of every other group
    /// that shares a rank with it, so its collectives may run concurrently with this group's.
    /// Splits of two different groups must not run concurrently within one process.
    pub fn split(&self, color: Option<u32>, key: i32) -> Result<Option<ProcessGroup>> {
        let proposal = *self.shared.next_group_id.lock();
        let mine = Record {
            color,
            key,
            proposal,
        };
        let all = self.all_gather_typed(&mine.encode(), DType::U8)?;
        let records = all
            .chunks_exact(split::RECORD_LEN)
            .enumerate()
            .map(|(rank, bytes)| Record::decode(rank as u32, bytes))
            .collect::<Result<Vec<_>>>()?;
        let Some(plan) = split::plan(&records, self.shared.rank)? else {
            return Ok(None);
        };
        {
            let mut next = self.shared.next_group_id.lock();
            *next = (*next).max(u32::from(plan.group_id) + 1);
        }
        let members = plan
            .members
            .iter()
            .map(|&parent| self.world_peer(parent))
            .collect::<Result<Vec<_>>>()?;
        Ok(Some(ProcessGroup::from_parts(
            Arc::clone(&self.shared.transport),
            plan.group_id,
            members,
            plan.rank,
            Arc::clone(&self.shared.next_group_id),
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_groups_are_shareable_across_threads() {
        fn assert_shareable<T: Clone + Send + Sync + 'static>() {}
        assert_shareable::<ProcessGroup>();
        fn assert_send<T: Send>() {}
        assert_send::<CollectiveHandle<Vec<f32>>>();
    }

    #[test]
    fn every_issued_operation_takes_the_next_sequence_number() {
        let t: Arc<dyn Transport> = crate::MemTransport::fan_out(1).remove(0);
        let group = ProcessGroup::new(t);
        let first = group.issue("test").seq;
        let handle = group.spawn_barrier();
        handle.join().unwrap();
        let mut x = [1.0f32];
        group.all_reduce(&mut x, ReduceKind::Sum).unwrap();
        assert_eq!(group.issue("test").seq, first + 3);
    }
}
