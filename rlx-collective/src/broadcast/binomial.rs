//! Binomial-tree broadcast: ⌈log2 n⌉ rounds; in round k every rank that already has the data
//! sends it to the rank 2^k further (relative to the root). Latency-optimal for small buffers.

use crate::Result;
use crate::op::OpCtx;

/// Copies the root's `data` into every rank's `data`.
pub(crate) fn run(ctx: &OpCtx<'_>, root: u32, data: &mut [u8]) -> Result<()> {
    let n = ctx.size();
    let relative = (ctx.rank + n - root) % n;
    let real = |v: u32| (v + root) % n;
    let mut mask = 1u32;
    while mask < n {
        if relative & mask != 0 {
            ctx.recv_into(real(relative - mask), data)?;
            break;
        }
        mask <<= 1;
    }
    // Children are relative + 2^k for every 2^k below the bit this rank received on (below n
    // for the root), the farthest first so the deepest subtree starts earliest. The sends are
    // in flight together, so children that copy the data themselves copy it at once.
    mask >>= 1;
    // At most one child per bit of a rank, so they fit on the stack of this latency path.
    let mut children = [0u32; u32::BITS as usize];
    let mut count = 0;
    while mask > 0 {
        if relative + mask < n {
            children[count] = real(relative + mask);
            count += 1;
        }
        mask >>= 1;
    }
    let data = &*data;
    ctx.send_all_during(&children[..count], &|_| data, &mut || Ok(()))
}
