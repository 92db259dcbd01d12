//! Segmented ring all-gather, in place: rank `r` starts with block `r` filled and, after n-1
//! steps of forwarding to `r+1` what came from `r-1`, holds every block.
//!
//! Segments land straight in the caller's buffer; nothing is allocated. Each step is one
//! exchange: the segment from `r-1` lands while the one to `r+1` is written.

use crate::Result;
use crate::layout::{self, Blocks};
use crate::op::OpCtx;

/// Fills every block of `data` (cut by `blocks`, elements of `elem_size` bytes) from its owner;
/// block `rank` must already hold this rank's contribution. Needs at least two ranks.
pub(crate) fn run(
    ctx: &OpCtx<'_>,
    data: &mut [u8],
    elem_size: usize,
    blocks: Blocks,
    segment_bytes: usize,
) -> Result<()> {
    let n = ctx.size() as usize;
    let r = ctx.rank as usize;
    let segments = layout::segment_count(blocks.max_len(), segment_bytes / elem_size.max(1));
    let next = ((r + 1) % n) as u32;
    let prev = ((r + n - 1) % n) as u32;
    for segment in 0..segments {
        for step in 0..n - 1 {
            let (send_block, recv_block) = layout::all_gather_step(r, n, step);
            let send = layout::bytes(blocks.segment(send_block, segments, segment), elem_size);
            let recv = layout::bytes(blocks.segment(recv_block, segments, segment), elem_size);
            let (outgoing, incoming) = layout::send_and_recv(data, send, recv)?;
            ctx.send_recv_into(next, outgoing, prev, incoming)?;
        }
    }
    Ok(())
}
