//! Bandwidth-optimal all-reduce: the segmented ring reduce-scatter followed by the segmented
//! ring all-gather of the finished blocks, both in place in the caller's buffer.
//!
//! Every rank sends and receives 2(n-1)/n of the buffer; the all-gather half moves the narrow
//! final values, so every rank ends with the bytes the block owners produced.

use crate::layout::Blocks;
use crate::op::OpCtx;
use crate::ring_order::RingSeat;
use crate::{DType, ReduceKind, Result};

/// All-reduces `data` in place over at least two ranks, around the ring of `seat`.
pub(crate) fn run(
    ctx: &OpCtx<'_>,
    seat: RingSeat<'_>,
    data: &mut [u8],
    dtype: DType,
    reduce: ReduceKind,
    segment_bytes: usize,
) -> Result<()> {
    let in_place = crate::reduce_scatter::Data::InPlace(&mut *data);
    crate::reduce_scatter::ring::run(ctx, seat, in_place, dtype, reduce, segment_bytes)?;
    let blocks = Blocks::Balanced {
        count: data.len() / dtype.size(),
        parts: ctx.size() as usize,
    };
    crate::all_gather::ring::run(ctx, seat, data, dtype.size(), blocks, segment_bytes)
}
