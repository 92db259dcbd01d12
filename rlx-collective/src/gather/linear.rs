//! Linear gather: every rank sends its buffer straight to the root, which lands each one in its
//! place in the output. The root's link carries (n-1) buffers whatever the schedule, so a tree
//! would only add hops.

use crate::Result;
use crate::op::OpCtx;

/// Gathers every rank's `local` into `out` on the root (n × `local.len()` bytes, rank order);
/// `out` is unused elsewhere.
pub(crate) fn run(ctx: &OpCtx<'_>, root: u32, local: &[u8], out: &mut [u8]) -> Result<()> {
    if ctx.rank != root {
        return ctx.send(root, local);
    }
    let len = local.len();
    for rank in (0..ctx.size()).filter(|&rank| rank != root) {
        ctx.recv_into(
            rank,
            &mut out[rank as usize * len..(rank as usize + 1) * len],
        )?;
    }
    // The root's own block last: copying it first would keep the others' blocks waiting in
    // the socket, where a large one is taken into a buffer of the transport's and copied
    // twice.
    out[root as usize * len..(root as usize + 1) * len].copy_from_slice(local);
    Ok(())
}
