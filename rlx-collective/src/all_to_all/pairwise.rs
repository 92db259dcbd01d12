//! Pairwise-exchange all-to-all: in step s (1..n) rank r sends block r+s to rank r+s and
//! receives its block from rank r-s, so every step is a permutation and no link carries two
//! messages at once. Each step is one exchange, so the incoming block lands in place while the
//! outgoing one is written.

use crate::Result;
use crate::layout::{self, Blocks};
use crate::op::OpCtx;

/// Sends block `j` of `send` to rank `j` and lands rank `i`'s block in block `i` of `recv`.
pub(crate) fn run(
    ctx: &OpCtx<'_>,
    send: &[u8],
    recv: &mut [u8],
    elem_size: usize,
    blocks: Blocks,
) -> Result<()> {
    let n = ctx.size() as usize;
    let r = ctx.rank as usize;
    for step in 1..n {
        let to = (r + step) % n;
        let from = (r + n - step) % n;
        ctx.send_recv_into(
            to as u32,
            &send[layout::bytes(blocks.block(to), elem_size)],
            from as u32,
            &mut recv[layout::bytes(blocks.block(from), elem_size)],
        )?;
    }
    // This rank's own block last, so that the exchanges start at once (see the gather).
    let own = layout::bytes(blocks.block(r), elem_size);
    recv[own.clone()].copy_from_slice(&send[own]);
    Ok(())
}
