//! Direct all-reduce for a full mesh of cables: a direct reduce-scatter, in which every rank
//! sends each peer that peer's block of its contribution and receives its own block from every
//! peer at once, then the direct all-gather of the finished blocks (see
//! [`crate::all_gather::direct`], which says why every cable of a mesh is then busy).
//!
//! The reduce-scatter goes segment by segment: the n-1 exchanges of a segment run at once, one
//! per cable, each landing its peer's contribution in a slot of its own; then the block's owner
//! folds its own elements and the slots in rank order into a wide accumulator and narrows once.
//! Every block is so reduced by one rank in one fixed order, and the all-gather hands out the
//! owner's bytes, so every rank ends with the same bits, run after run. Memory: n-1 slots of a
//! segment and one accumulator of a segment.

use crate::all_gather::direct::concurrently;
use crate::layout::{self, Blocks};
use crate::op::OpCtx;
use crate::{DType, ReduceKind, Result, kernels};

/// All-reduces `data` in place over at least two ranks, `segment_bytes` of a block at a time.
pub(crate) fn run(
    ctx: &OpCtx<'_>,
    data: &mut [u8],
    dtype: DType,
    reduce: ReduceKind,
    segment_bytes: usize,
) -> Result<()> {
    let n = ctx.size() as usize;
    let esize = dtype.size();
    let blocks = Blocks::Balanced {
        count: data.len() / esize,
        parts: n,
    };
    reduce_scatter(ctx, data, dtype, reduce, blocks, segment_bytes)?;
    crate::all_gather::direct::run(ctx, data, esize, blocks)
}

/// Leaves in block `rank` of `data` the reduction of every rank's block `rank`.
fn reduce_scatter(
    ctx: &OpCtx<'_>,
    data: &mut [u8],
    dtype: DType,
    reduce: ReduceKind,
    blocks: Blocks,
    segment_bytes: usize,
) -> Result<()> {
    let (n, r, esize) = (ctx.size() as usize, ctx.rank as usize, dtype.size());
    let wsize = kernels::wide_size(dtype)?;
    let segments = layout::segment_count(blocks.max_len(), segment_bytes / esize);
    let most = blocks.max_len().div_ceil(segments);
    let mut slots = vec![vec![0u8; most * esize]; n - 1];
    let mut acc = vec![0u8; most * wsize];
    for segment in 0..segments {
        let mine = layout::bytes(blocks.segment(r, segments, segment), esize);
        let len = mine.len();
        let contribution: &[u8] = data;
        let exchanges: Vec<(u32, u32, &mut [u8])> = slots
            .iter_mut()
            .enumerate()
            .map(|(i, slot)| {
                let s = i + 1;
                let (to, from) = ((r + s) % n, (r + n - s) % n);
                (to as u32, from as u32, &mut slot[..len])
            })
            .collect();
        concurrently(ctx, exchanges, |(to, from, into)| {
            let send = layout::bytes(blocks.segment(to as usize, segments, segment), esize);
            ctx.send_recv_into(to, &contribution[send], from, into)
        })?;
        let acc = &mut acc[..len / esize * wsize];
        kernels::widen(dtype, &data[mine.clone()], acc)?;
        // The slot of peer `p` is slot (r - p) mod n - 1: fold the peers in rank order.
        for peer in (0..n).filter(|&p| p != r) {
            let slot = &slots[(r + n - peer) % n - 1][..len];
            kernels::accumulate_narrow(dtype, reduce, acc, slot)?;
        }
        kernels::finish(dtype, reduce, n as u32, acc, &mut data[mine])?;
    }
    Ok(())
}
