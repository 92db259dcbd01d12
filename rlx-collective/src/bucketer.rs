//! [`Bucketer`]: gradient buckets as PyTorch DDP fills them during the backward pass. The
//! tensors are registered once; as backward produces each gradient (last layer first) the
//! program hands it over with [`Bucketer::ready`], and each bucket is all-reduced in the
//! background as soon as it is full, while backward goes on; [`Bucketer::wait`] returns the
//! results once every bucket is done.
//!
//! Buckets are planned in reverse registration order, the order backward produces gradients
//! in, and are launched strictly in bucket order (a full bucket waits for the ones before it):
//! every rank then issues the same all-reduces in the same order, whatever order its own
//! backward marked the tensors in.

use crate::group::{DEFAULT_BUCKET_BYTES, buckets, unpack};
use crate::handle::AllReduceHandle;
use crate::{CollectiveError, Element, ProcessGroup, ReduceKind, Result};

/// One bucket: its tensors, its packed buffer until it is launched, and then its all-reduce.
struct Bucket<T: Element> {
    members: Vec<usize>,
    buffer: Vec<T>,
    /// Where each member's elements start in `buffer`.
    offsets: Vec<usize>,
    /// The bucket's length in elements.
    len: usize,
    pending: usize,
    launched: Option<AllReduceHandle<T>>,
}

/// DDP-style gradient buckets over a group; see the module docs.
///
/// # Examples
///
/// ```
/// # use std::sync::Arc;
/// # use rlx_collective::{MemTransport, ProcessGroup, ReduceKind, Transport};
/// use rlx_collective::Bucketer;
/// # let world: Vec<ProcessGroup> = MemTransport::fan_out(2).into_iter()
/// #     .map(|t| ProcessGroup::new(t as Arc<dyn Transport>)).collect();
/// std::thread::scope(|s| {
///     for group in &world {
///         s.spawn(move || {
///             let mut grads = vec![vec![1.0f32; 300], vec![2.0f32; 7]];
///             let mut buckets = Bucketer::new(group, &[300, 7], ReduceKind::Sum).unwrap();
///             // Backward produces the last layer's gradient first.
///             buckets.ready(1, &grads[1]).unwrap();
///             buckets.ready(0, &grads[0]).unwrap();
///             let mut views: Vec<&mut [f32]> = grads.iter_mut().map(Vec::as_mut_slice).collect();
///             buckets.wait(&mut views).unwrap();
///             assert_eq!((grads[0][0], grads[1][0]), (2.0, 4.0));
///         });
///     }
/// });
/// ```
pub struct Bucketer<T: Element> {
    group: ProcessGroup,
    op: ReduceKind,
    lengths: Vec<usize>,
    buckets: Vec<Bucket<T>>,
    /// The bucket and the position in it of each tensor (`None` for an empty tensor).
    place: Vec<Option<(usize, usize)>>,
    is_ready: Vec<bool>,
    /// The first bucket not launched yet.
    next_launch: usize,
}

impl<T: Element> std::fmt::Debug for Bucketer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bucketer")
            .field("tensors", &self.lengths.len())
            .field("buckets", &self.buckets.len())
            .field("launched", &self.next_launch)
            .finish_non_exhaustive()
    }
}

impl<T: Element> Bucketer<T> {
    /// Registers tensors of `lengths` elements, reduced with `op` in buckets of about
    /// [`DEFAULT_BUCKET_BYTES`]. Collective: every rank must register the same lengths, or
    /// every rank fails with [`CollectiveError::InvalidArgument`] naming the first tensor that
    /// differs.
    pub fn new(group: &ProcessGroup, lengths: &[usize], op: ReduceKind) -> Result<Self> {
        Self::with_bucket_bytes(group, lengths, op, DEFAULT_BUCKET_BYTES)
    }

    /// [`Bucketer::new`] with buckets of about `bucket_bytes` (DDP's `bucket_cap_mb`).
    pub fn with_bucket_bytes(
        group: &ProcessGroup,
        lengths: &[usize],
        op: ReduceKind,
        bucket_bytes: usize,
    ) -> Result<Self> {
        group.check_same_tensors(lengths, T::DTYPE, bucket_bytes)?;
        let capacity = (bucket_bytes / size_of::<T>()).max(1);
        let plan = buckets(lengths, (0..lengths.len()).rev(), capacity);
        let mut place = vec![None; lengths.len()];
        let buckets = plan
            .into_iter()
            .enumerate()
            .map(|(b, members)| {
                let mut offsets = Vec::with_capacity(members.len());
                let mut filled = 0;
                for (k, &i) in members.iter().enumerate() {
                    place[i] = Some((b, k));
                    offsets.push(filled);
                    filled += lengths[i];
                }
                Bucket {
                    pending: members.len(),
                    buffer: vec![T::zeroed(); filled],
                    len: filled,
                    members,
                    offsets,
                    launched: None,
                }
            })
            .collect();
        Ok(Bucketer {
            group: group.clone(),
            op,
            lengths: lengths.to_vec(),
            buckets,
            place,
            is_ready: vec![false; lengths.len()],
            next_launch: 0,
        })
    }

    /// Hands over tensor `index`'s gradient: it is copied into its bucket, and every bucket
    /// that is full and whose predecessors are launched starts its all-reduce in the
    /// background. Fails on an unknown index, a second call for one tensor, or `grad` of
    /// another length than registered.
    pub fn ready(&mut self, index: usize, grad: &[T]) -> Result<()> {
        let registered = self.lengths.get(index).copied().ok_or_else(|| {
            CollectiveError::invalid(format!(
                "Bucketer::ready: tensor {index} of {} registered",
                self.lengths.len()
            ))
        })?;
        if grad.len() != registered {
            return Err(CollectiveError::invalid(format!(
                "Bucketer::ready: tensor {index} has {} {} elements, {registered} registered",
                grad.len(),
                T::DTYPE
            )));
        }
        if std::mem::replace(&mut self.is_ready[index], true) {
            return Err(CollectiveError::invalid(format!(
                "Bucketer::ready: tensor {index} was handed over twice in this round"
            )));
        }
        if let Some((b, k)) = self.place[index] {
            let bucket = &mut self.buckets[b];
            let at = bucket.offsets[k];
            bucket.buffer[at..at + grad.len()].copy_from_slice(grad);
            bucket.pending -= 1;
        }
        self.launch_full_buckets();
        Ok(())
    }

    /// Launches, in bucket order, every bucket that is full and whose predecessors are
    /// launched.
    fn launch_full_buckets(&mut self) {
        while let Some(bucket) = self.buckets.get_mut(self.next_launch) {
            if bucket.pending > 0 {
                return;
            }
            let packed = std::mem::take(&mut bucket.buffer);
            bucket.launched = Some(self.group.spawn_all_reduce(packed, self.op));
            self.next_launch += 1;
        }
    }

    /// Waits for every bucket and writes the reduced gradients into `out` (one slice per
    /// registered tensor, of its length), ready for the next round. Fails naming the tensors
    /// not handed over yet, or with the first bucket's error.
    pub fn wait(&mut self, out: &mut [&mut [T]]) -> Result<()> {
        let missing: Vec<usize> = (0..self.is_ready.len())
            .filter(|&i| !self.is_ready[i])
            .collect();
        if !missing.is_empty() {
            return Err(CollectiveError::invalid(format!(
                "Bucketer::wait: tensors {missing:?} were not handed over with ready()"
            )));
        }
        let lengths: Vec<usize> = out.iter().map(|t| t.len()).collect();
        if lengths != self.lengths {
            return Err(CollectiveError::invalid(format!(
                "Bucketer::wait: the outputs have lengths {lengths:?}, registered {:?}",
                self.lengths
            )));
        }
        self.is_ready.fill(false);
        self.next_launch = 0;
        let mut first_error = None;
        for bucket in &mut self.buckets {
            bucket.pending = bucket.members.len();
            let Some(handle) = bucket.launched.take() else {
                continue;
            };
            // Every bucket is joined, even after a failure, so that none is left running; its
            // buffer comes back for the next round (a fresh one when the reduction failed).
            let result = handle.join().and_then(|reduced| {
                let unpacked = unpack(&reduced, &bucket.members, out);
                bucket.buffer = reduced;
                unpacked
            });
            if bucket.buffer.len() != bucket.len {
                bucket.buffer = vec![T::zeroed(); bucket.len];
            }
            if let Err(e) = result {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}
