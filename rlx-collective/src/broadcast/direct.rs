//! Direct broadcast for a full mesh of cables: the root sends block `j` of its buffer to rank
//! `j` over every cable at once (a direct scatter), then the ranks all-gather the blocks
//! directly (see [`crate::all_gather::direct`]). Each cable carries about one block each way
//! per half, so the time is about 2/n of one buffer over one cable, where a pipelined chain
//! needs the whole buffer over every cable of the chain (twice as fast on four ranks).

use crate::Result;
use crate::layout::{self, Blocks};
use crate::op::OpCtx;
use crate::per_cable::concurrently;

/// Copies the root's `data` (elements of `elem_size` bytes) into every rank's `data`.
pub(crate) fn run(ctx: &OpCtx<'_>, root: u32, data: &mut [u8], elem_size: usize) -> Result<()> {
    let n = ctx.size();
    let blocks = Blocks::Balanced {
        count: data.len() / elem_size.max(1),
        parts: n as usize,
    };
    let block = |rank: u32| layout::bytes(blocks.block(rank as usize), elem_size);
    if ctx.rank == root {
        let whole: &[u8] = data;
        let peers: Vec<u32> = (0..n).filter(|&rank| rank != root).collect();
        concurrently(ctx, peers, |to| ctx.send(to, &whole[block(to)]))?;
    } else {
        ctx.recv_into(root, &mut data[block(ctx.rank)])?;
    }
    crate::all_gather::direct::run(ctx, data, elem_size, blocks)
}
