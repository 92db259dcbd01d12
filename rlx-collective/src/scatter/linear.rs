//! Linear scatter: the root sends block `i` straight to rank `i`. The root's link carries (n-1)
//! blocks whatever the schedule, so a tree would only add hops. The root's sends are in flight
//! together, its own block copied meanwhile (see `OpCtx::send_all_during`), so where peers
//! copy their blocks themselves every copy runs at once.

use crate::Result;
use crate::op::OpCtx;

/// Delivers block `rank` of the root's `send` (n blocks of `recv.len()` bytes) into every
/// rank's `recv`; `send` is read on the root only.
pub(crate) fn run(ctx: &OpCtx<'_>, root: u32, send: &[u8], recv: &mut [u8]) -> Result<()> {
    if ctx.rank != root {
        return ctx.recv_into(root, recv);
    }
    let len = recv.len();
    let block = |rank: u32| &send[rank as usize * len..(rank as usize + 1) * len];
    let others: Vec<u32> = (0..ctx.size()).filter(|&rank| rank != root).collect();
    // The root's own block last, so that the others wait for nothing but the wire.
    ctx.send_all_during(&others, &block, &mut || {
        recv.copy_from_slice(block(root));
        Ok(())
    })
}
