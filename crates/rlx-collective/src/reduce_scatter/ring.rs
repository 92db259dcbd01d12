//! Segmented ring reduce-scatter: after n-1 steps rank `r` holds the fully reduced block `r`.
//!
//! At step `s` rank `r` sends its partial of block `r-s-1` to `r+1` and receives the partial of
//! block `r-s-2` from `r-1`, folding its own elements in as soon as the segment lands. Partials
//! travel in the wide accumulation type; the owner narrows once. Each block is reduced along
//! one fixed chain and finished by one rank, so the result does not depend on who reads it.
//!
//! Memory: two reused segment-sized accumulator buffers, nothing per step.

use crate::layout::{self, Blocks};
use crate::op::OpCtx;
use crate::{DType, ReduceKind, Result, kernels};

/// Reduces `data` (this rank's contribution, `dtype` elements) over the group; on return the
/// element range `Blocks::Balanced{count, parts: n}.block(rank)` of `data` holds the final
/// result and the other blocks are unchanged. Needs at least two ranks.
pub(crate) fn run(
    ctx: &OpCtx<'_>,
    data: &mut [u8],
    dtype: DType,
    reduce: ReduceKind,
    segment_bytes: usize,
) -> Result<()> {
    let n = ctx.size() as usize;
    let r = ctx.rank as usize;
    let esize = dtype.size();
    let wsize = kernels::wide_size(dtype)?;
    let blocks = Blocks::Balanced {
        count: data.len() / esize,
        parts: n,
    };
    let segments = layout::segment_count(blocks.max_len(), segment_bytes / esize);
    let max_segment = blocks.max_len().div_ceil(segments);
    let mut send_buf = vec![0u8; max_segment * wsize];
    let mut recv_buf = vec![0u8; max_segment * wsize];
    let next = ((r + 1) % n) as u32;
    let prev = ((r + n - 1) % n) as u32;

    for segment in 0..segments {
        for step in 0..n - 1 {
            let send_block = (r + 2 * n - step - 1) % n;
            let recv_block = (r + 2 * n - step - 2) % n;
            let send_range = blocks.segment(send_block, segments, segment);
            let send_len = send_range.len() * wsize;
            if step == 0 {
                let own = &data[layout::bytes(send_range, esize)];
                kernels::widen(dtype, own, &mut send_buf[..send_len])?;
            }
            ctx.send(next, &send_buf[..send_len])?;

            let recv_range = blocks.segment(recv_block, segments, segment);
            let recv_len = recv_range.len() * wsize;
            ctx.recv_into(prev, &mut recv_buf[..recv_len])?;
            let own = &mut data[layout::bytes(recv_range, esize)];
            kernels::accumulate_narrow(dtype, reduce, &mut recv_buf[..recv_len], own)?;
            if step == n - 2 {
                kernels::finish(dtype, reduce, n as u32, &recv_buf[..recv_len], own)?;
            } else {
                // The partial just completed is the one to forward at the next step.
                std::mem::swap(&mut send_buf, &mut recv_buf);
            }
        }
    }
    Ok(())
}
