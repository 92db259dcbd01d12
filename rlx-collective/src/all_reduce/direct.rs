//! Direct all-reduce for a full mesh of cables: the direct reduce-scatter (see
//! [`crate::reduce_scatter::direct`]), in which every rank sends each peer that peer's block of
//! its contribution and receives its own block from every peer at once, then the direct
//! all-gather of the finished blocks (see [`crate::all_gather::direct`], which says why every
//! cable of a mesh is then busy). Every block is reduced by one rank in one fixed order, and the
//! all-gather hands out the owner's bytes, so every rank ends with the same bits, run after run.

use crate::layout::Blocks;
use crate::op::OpCtx;
use crate::reduce_scatter::{self, Data};
use crate::{DType, ReduceKind, Result};

/// All-reduces `data` in place over at least two ranks, `segment_bytes` of a block at a time.
pub(crate) fn run(
    ctx: &OpCtx<'_>,
    data: &mut [u8],
    dtype: DType,
    reduce: ReduceKind,
    segment_bytes: usize,
) -> Result<()> {
    let esize = dtype.size();
    let blocks = Blocks::Balanced {
        count: data.len() / esize,
        parts: ctx.size() as usize,
    };
    reduce_scatter::direct::run(ctx, Data::InPlace(&mut *data), dtype, reduce, segment_bytes)?;
    crate::all_gather::direct::run(ctx, data, esize, blocks)
}
