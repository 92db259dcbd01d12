//! Segmented ring all-gather, in place: rank `r` starts with block `r` filled and, after n-1
//! steps of forwarding to the next rank of the ring what came from the previous one, holds
//! every block. The ring runs by positions (see [`RingSeat`]): a block travels under the
//! position of the rank that owns it.
//!
//! Segments land straight in the caller's buffer; nothing is allocated. Each step is one
//! exchange: the segment from `r-1` lands while the one to `r+1` is written.

use crate::Result;
use crate::layout::{self, Blocks};
use crate::op::OpCtx;
use crate::ring_order::RingSeat;

/// Fills every block of `data` (cut by `blocks`, elements of `elem_size` bytes) from its owner;
/// block `rank` must already hold this rank's contribution. The ring visits the ranks in
/// `seat`'s order. Needs at least two ranks.
pub(crate) fn run(
    ctx: &OpCtx<'_>,
    seat: RingSeat<'_>,
    data: &mut [u8],
    elem_size: usize,
    blocks: Blocks,
    segment_bytes: usize,
) -> Result<()> {
    let n = ctx.size() as usize;
    let segments = layout::segment_count(blocks.max_len(), segment_bytes / elem_size.max(1));
    let (next, prev) = (seat.next(), seat.prev());
    for segment in 0..segments {
        for step in 0..n - 1 {
            let (send_at, recv_at) = layout::all_gather_step(seat.position(), n, step);
            let (send_block, recv_block) = (seat.rank_at(send_at), seat.rank_at(recv_at));
            let send = layout::bytes(blocks.segment(send_block, segments, segment), elem_size);
            let recv = layout::bytes(blocks.segment(recv_block, segments, segment), elem_size);
            let (outgoing, incoming) = layout::send_and_recv(data, send, recv)?;
            ctx.send_recv_into(next, outgoing, prev, incoming)?;
        }
    }
    Ok(())
}
