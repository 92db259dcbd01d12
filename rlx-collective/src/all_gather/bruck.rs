//! Bruck's all-gather for small buffers: ⌈log2 n⌉ steps for any n.
//!
//! The output buffer doubles as the working buffer: it holds blocks in the order r, r+1, ...
//! At the step with distance d, rank r sends its first min(d, n-d) blocks to r-d and appends
//! as many from r+d. A final rotation by r blocks puts every block at its rank's position.

use crate::Result;
use crate::layout;
use crate::op::OpCtx;

/// Gathers `local` from every rank into `out` (n × `local.len()` bytes, rank order).
pub(crate) fn run(ctx: &OpCtx<'_>, local: &[u8], out: &mut [u8]) -> Result<()> {
    let n = ctx.size() as usize;
    let r = ctx.rank as usize;
    let len = local.len();
    out[..len].copy_from_slice(local);
    let mut distance = 1usize;
    while distance < n {
        let blocks = distance.min(n - distance);
        let to = ((r + n - distance) % n) as u32;
        let from = ((r + distance) % n) as u32;
        let incoming = distance * len..(distance + blocks) * len;
        let (outgoing, incoming) = layout::send_and_recv(out, 0..blocks * len, incoming)?;
        ctx.send_recv_into(to, outgoing, from, incoming)?;
        distance *= 2;
    }
    out.rotate_right(r * len);
    Ok(())
}
