//! [`ProcessGroup::all_reduce_many`]: one call for the hundreds of gradient tensors of a real
//! model, as PyTorch DDP's buckets and Horovod's tensor fusion do it. The tensors are packed
//! into buckets of about [`DEFAULT_BUCKET_BYTES`] in order, each bucket is all-reduced as one
//! buffer on the group's worker thread while the next is packed, and the results are copied
//! back. Two small all-reduces first check that every rank passes the same tensors, so that a
//! mismatch names the tensor instead of a bucket.

use std::collections::VecDeque;

use super::ProcessGroup;
use crate::handle::CollectiveHandle;
use crate::{CollectiveError, DType, Element, ReduceKind, Result};

/// The size of a bucket: PyTorch DDP's default (25 MiB), large enough that a bucket moves at
/// the link's speed, small enough that the first bucket's reduction starts early.
pub const DEFAULT_BUCKET_BYTES: usize = 25 << 20;

/// Buckets reduced at once: one on the wire while the next is packed, so that packing hides
/// behind the reduction and at most two buckets of copies exist.
const BUCKETS_IN_FLIGHT: usize = 2;

impl ProcessGroup {
    /// Reduces every tensor of `tensors` over the group in place, as one `all_reduce` per
    /// tensor would, in a few large all-reduces instead of many small ones.
    ///
    /// Tensors may have any lengths, empty ones included, but every rank must pass the same
    /// number of tensors with the same lengths; otherwise every rank fails with
    /// [`CollectiveError::InvalidArgument`] naming the first tensor that differs, and the
    /// group stays usable. Each result is bit-identical on every rank; against separate
    /// all-reduces, max, min and integer results are the same bits and float sums differ at
    /// most by the rounding of another summation order (a tensor's bucket may be reduced by
    /// another algorithm than the tensor alone).
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use rlx_collective::{MemTransport, ProcessGroup, ReduceKind, Transport};
    /// # let world: Vec<ProcessGroup> = MemTransport::fan_out(2).into_iter()
    /// #     .map(|t| ProcessGroup::new(t as Arc<dyn Transport>)).collect();
    /// std::thread::scope(|s| {
    ///     for group in &world {
    ///         s.spawn(move || {
    ///             let (mut weight, mut bias) = (vec![1.0f32; 1000], vec![2.0f32; 10]);
    ///             group
    ///                 .all_reduce_many(&mut [&mut weight, &mut bias], ReduceKind::Sum)
    ///                 .unwrap();
    ///             assert_eq!((weight[0], bias[9]), (2.0, 4.0));
    ///         });
    ///     }
    /// });
    /// ```
    pub fn all_reduce_many<T: Element>(
        &self,
        tensors: &mut [&mut [T]],
        op: ReduceKind,
    ) -> Result<()> {
        self.all_reduce_many_bucketed(tensors, op, DEFAULT_BUCKET_BYTES)
    }

    /// [`ProcessGroup::all_reduce_many`] with buckets of about `bucket_bytes` (DDP's
    /// `bucket_cap_mb`): smaller buckets start the first reduction earlier, larger ones make
    /// fewer calls. Every rank must pass the same size.
    pub fn all_reduce_many_bucketed<T: Element>(
        &self,
        tensors: &mut [&mut [T]],
        op: ReduceKind,
        bucket_bytes: usize,
    ) -> Result<()> {
        let mut bytes: Vec<&mut [u8]> = tensors
            .iter_mut()
            .map(|t| bytemuck::cast_slice_mut::<T, u8>(t))
            .collect();
        self.many_bucketed(&mut bytes, T::DTYPE, op, bucket_bytes)
    }

    /// [`ProcessGroup::all_reduce_many`] on raw little-endian `dtype` elements.
    pub fn all_reduce_many_typed(
        &self,
        tensors: &mut [&mut [u8]],
        dtype: DType,
        op: ReduceKind,
    ) -> Result<()> {
        self.many_bucketed(tensors, dtype, op, DEFAULT_BUCKET_BYTES)
    }

    /// The one implementation of the `all_reduce_many` forms, on bytes.
    fn many_bucketed(
        &self,
        tensors: &mut [&mut [u8]],
        dtype: DType,
        op: ReduceKind,
        bucket_bytes: usize,
    ) -> Result<()> {
        for tensor in tensors.iter() {
            crate::check_dtype_len(tensor.len(), dtype)?;
        }
        let lengths: Vec<usize> = tensors.iter().map(|t| t.len() / dtype.size()).collect();
        self.check_same_tensors(&lengths, dtype, bucket_bytes)?;
        let byte_lengths: Vec<usize> = tensors.iter().map(|t| t.len()).collect();
        let capacity = bucket_bytes.max(dtype.size());
        let plan = buckets(&byte_lengths, 0..byte_lengths.len(), capacity);
        let last = plan.len().saturating_sub(1);
        let mut in_flight: VecDeque<(CollectiveHandle<Vec<u8>>, Vec<usize>)> = VecDeque::new();
        for (k, bucket) in plan.into_iter().enumerate() {
            if in_flight.len() == BUCKETS_IN_FLIGHT {
                if let Some((handle, members)) = in_flight.pop_front() {
                    unpack(&handle.join()?, &members, tensors)?;
                }
            }
            if k == last {
                // Nothing is left to pack meanwhile: the last bucket runs on this thread, and a
                // bucket of one tensor in place, without the copies.
                if let [only] = bucket[..] {
                    self.all_reduce_typed(tensors[only], dtype, op)?;
                } else {
                    let mut packed = pack(&bucket, tensors);
                    self.all_reduce_typed(&mut packed, dtype, op)?;
                    unpack(&packed, &bucket, tensors)?;
                }
            } else {
                let handle = self.spawn_all_reduce_typed(pack(&bucket, tensors), dtype, op);
                in_flight.push_back((handle, bucket));
            }
        }
        for (handle, members) in in_flight {
            unpack(&handle.join()?, &members, tensors)?;
        }
        Ok(())
    }

    /// Fails on every rank, naming the first tensor that differs, unless every rank passes
    /// tensors of `lengths` elements of `dtype` and the same `bucket_bytes`: an all-reduce of
    /// the count and the bucket size (their maxima and minima at once, as `[n, b, -n, -b]`
    /// under `Max`), then one of the lengths.
    pub(crate) fn check_same_tensors(
        &self,
        lengths: &[usize],
        dtype: DType,
        bucket_bytes: usize,
    ) -> Result<()> {
        let mut count = extremes(&[lengths.len(), bucket_bytes]);
        self.all_reduce(&mut count, ReduceKind::Max)?;
        if count[1] != -count[3] {
            return Err(CollectiveError::invalid(format!(
                "all_reduce_many: the ranks use different bucket sizes (from {} to {} bytes); \
                 this rank uses {bucket_bytes}",
                -count[3], count[1]
            )));
        }
        let (most, fewest) = (count[0], -count[2]);
        if most != fewest {
            return Err(CollectiveError::invalid(format!(
                "all_reduce_many: the ranks pass different numbers of tensors (from {fewest} to \
                 {most}); this rank passes {}",
                lengths.len()
            )));
        }
        let mut spans = extremes(lengths);
        self.all_reduce(&mut spans, ReduceKind::Max)?;
        let n = lengths.len();
        match (0..n).find(|&i| spans[i] != -spans[n + i]) {
            None => Ok(()),
            Some(i) => Err(CollectiveError::invalid(format!(
                "all_reduce_many: tensor {i} has from {} to {} {} elements across the ranks; \
                 this rank's has {}",
                -spans[n + i],
                spans[i],
                dtype,
                lengths[i]
            ))),
        }
    }
}

/// `values` followed by their negations, as `i64`s: under `Max` the first half gives each
/// value's maximum over the ranks and the second half minus its minimum.
fn extremes(values: &[usize]) -> Vec<i64> {
    let as_i64 = |v: usize| i64::try_from(v).unwrap_or(i64::MAX);
    values
        .iter()
        .map(|&v| as_i64(v))
        .chain(values.iter().map(|&v| -as_i64(v)))
        .collect()
}

/// The tensors of each bucket, taken in `order`: consecutive non-empty tensors until the next
/// would take the bucket past `capacity` elements (a tensor longer than that is a bucket
/// alone).
pub(crate) fn buckets(
    lengths: &[usize],
    order: impl Iterator<Item = usize>,
    capacity: usize,
) -> Vec<Vec<usize>> {
    let mut all = Vec::new();
    let (mut current, mut filled) = (Vec::new(), 0usize);
    for (i, len) in order.map(|i| (i, lengths[i])).filter(|(_, len)| *len > 0) {
        if !current.is_empty() && filled + len > capacity {
            all.push(std::mem::take(&mut current));
            filled = 0;
        }
        current.push(i);
        filled += len;
    }
    if !current.is_empty() {
        all.push(current);
    }
    all
}

/// The bytes of the tensors of `bucket`, one after the other.
fn pack(bucket: &[usize], tensors: &[&mut [u8]]) -> Vec<u8> {
    let mut packed = Vec::with_capacity(bucket.iter().map(|&i| tensors[i].len()).sum());
    for &i in bucket {
        packed.extend_from_slice(tensors[i]);
    }
    packed
}

/// Copies a reduced bucket back into its tensors, `members` in the order they were packed.
pub(crate) fn unpack<T: Copy>(
    reduced: &[T],
    members: &[usize],
    tensors: &mut [&mut [T]],
) -> Result<()> {
    let mut rest = reduced;
    for &i in members {
        // An all-reduce returns its buffer at the length it was given; this only guards that.
        let (head, tail) = rest.split_at_checked(tensors[i].len()).ok_or_else(|| {
            CollectiveError::protocol(None, "all_reduce_many: a bucket came back short")
        })?;
        tensors[i].copy_from_slice(head);
        rest = tail;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_keep_order_skip_empty_tensors_and_give_long_ones_their_own() {
        let lengths = [3, 0, 4, 10, 2, 2, 0];
        assert_eq!(
            buckets(&lengths, 0..7, 8),
            vec![vec![0, 2], vec![3], vec![4, 5]]
        );
        assert_eq!(
            buckets(&lengths, (0..7).rev(), 8),
            vec![vec![5, 4], vec![3], vec![2, 0]]
        );
        assert!(buckets(&[0, 0], 0..2, 8).is_empty());
        assert_eq!(buckets(&[8, 8], 0..2, 8), vec![vec![0], vec![1]]);
    }
}
