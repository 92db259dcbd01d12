//! Direct all-to-all for a full mesh of cables: the pairwise exchange's n-1 steps all at once,
//! one per cable on a thread of its own (see [`crate::all_gather::direct`]). Step `s` sends
//! block `r+s` to rank `r+s` and lands rank `r-s`'s block in block `r-s`, so every cable
//! carries one block each way and the time is one block over one cable where the pairwise
//! steps take n-1.

use crate::Result;
use crate::layout::{self, Blocks};
use crate::op::OpCtx;
use crate::per_cable::{concurrently, partners};

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
    let mut into: Vec<Option<&mut [u8]>> = layout::blocks_mut(recv, blocks, n, elem_size)
        .into_iter()
        .map(Some)
        .collect();
    if let Some(own) = into[r].take() {
        own.copy_from_slice(&send[layout::bytes(blocks.block(r), elem_size)]);
    }
    let exchanges: Vec<(u32, u32, &mut [u8])> = (1..n)
        .filter_map(|s| {
            let (to, from) = partners(r, n, s);
            Some((to as u32, from as u32, into[from].take()?))
        })
        .collect();
    concurrently(ctx, exchanges, |(to, from, into)| {
        let outgoing = &send[layout::bytes(blocks.block(to as usize), elem_size)];
        ctx.send_recv_into(to, outgoing, from, into)
    })
}
