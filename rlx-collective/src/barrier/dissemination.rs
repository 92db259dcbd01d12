//! Dissemination barrier: ⌈log2 n⌉ rounds; in round k rank r signals r+2^k and waits for
//! r-2^k. After the last round every rank has heard, directly or not, from every other.

use crate::Result;
use crate::op::OpCtx;

/// Returns once every member has entered this barrier.
pub(crate) fn run(ctx: &OpCtx<'_>) -> Result<()> {
    ctx.record_algorithm("dissemination");
    let n = ctx.size();
    let mut distance = 1u32;
    while distance < n {
        let (to, from) = ((ctx.rank + distance) % n, (ctx.rank + n - distance) % n);
        ctx.send_recv_into(to, &[], from, &mut [])?;
        distance = distance.saturating_mul(2);
    }
    Ok(())
}
