//! Pipelined chain broadcast for large buffers: the root streams segments to the next rank of
//! the group's ring order (see [`crate::ring_order`]: the cables' order where the link matrix
//! shows one), which forwards each segment as soon as it lands. Every link carries the buffer once, so the
//! time approaches one buffer transfer plus (n-2) segment transfers. A rank receives the next
//! segment while its forward of the last one is in flight (see `OpCtx::send_during`), so where
//! ranks copy their messages themselves every rank of the chain copies all the time.

use crate::Result;
use crate::layout;
use crate::op::OpCtx;
use crate::ring_order::RingSeat;

/// Copies the root's `data` into every rank's `data`, `segment_bytes` at a time, along the
/// ring of `seat` from the root.
pub(crate) fn run(
    ctx: &OpCtx<'_>,
    seat: RingSeat<'_>,
    root: u32,
    data: &mut [u8],
    elem_size: usize,
    segment_bytes: usize,
) -> Result<()> {
    let n = ctx.size() as usize;
    let relative = (seat.position() + n - seat.position_of(root)) % n;
    let (prev, next) = (seat.prev(), seat.next());
    let count = data.len() / elem_size.max(1);
    let segments = layout::segment_count(count, segment_bytes / elem_size.max(1));
    let range =
        |segment: usize| layout::bytes(layout::balanced(count, segments, segment), elem_size);
    let receives = relative > 0;
    let forwards = relative + 1 < n;
    if receives {
        ctx.recv_into(prev, &mut data[range(0)])?;
    }
    for segment in 0..segments {
        // The next segment lands while this one is forwarded.
        let receive = receives && segment + 1 < segments;
        let incoming = if receive { range(segment + 1) } else { 0..0 };
        let (outgoing, landing) = layout::send_and_recv(data, range(segment), incoming)?;
        let mut receive_next = || {
            if receive {
                ctx.recv_into(prev, &mut *landing)
            } else {
                Ok(())
            }
        };
        if forwards {
            ctx.send_during(next, outgoing, &mut receive_next)?;
        } else {
            receive_next()?;
        }
    }
    Ok(())
}
