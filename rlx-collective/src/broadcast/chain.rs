//! Pipelined chain broadcast for large buffers: the root streams segments to the next rank,
//! which forwards each segment as soon as it lands. Every link carries the buffer once, so the
//! time approaches one buffer transfer plus (n-2) segment transfers.

use crate::Result;
use crate::layout;
use crate::op::OpCtx;

/// Copies the root's `data` into every rank's `data`, `segment_bytes` at a time.
pub(crate) fn run(
    ctx: &OpCtx<'_>,
    root: u32,
    data: &mut [u8],
    elem_size: usize,
    segment_bytes: usize,
) -> Result<()> {
    let n = ctx.size();
    let relative = (ctx.rank + n - root) % n;
    let prev = (ctx.rank + n - 1) % n;
    let next = (ctx.rank + 1) % n;
    let count = data.len() / elem_size.max(1);
    let segments = layout::segment_count(count, segment_bytes / elem_size.max(1));
    for segment in 0..segments {
        let range = layout::bytes(layout::balanced(count, segments, segment), elem_size);
        if relative > 0 {
            ctx.recv_into(prev, &mut data[range.clone()])?;
        }
        if relative + 1 < n {
            ctx.send(next, &data[range])?;
        }
    }
    Ok(())
}
