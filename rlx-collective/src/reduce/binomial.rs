//! Segmented binomial-tree reduce to a root: in round k, ranks (relative to the root) with bit
//! k set send their partial to the rank 2^k below and drop out; the others fold in what they
//! receive. Partials travel in the wide accumulation type and only the root narrows.
//!
//! Memory: two segment-sized accumulator buffers, kept from one call to the next on the same
//! thread (see [`crate::scratch`]): allocated afresh, they made every 256 KiB–2 MiB f32 reduce
//! of two processes fault in new pages, 2–4 times slower than Open MPI's. The segments of one
//! operation follow each other on one tag, which the transport keeps in order.

use crate::layout;
use crate::op::OpCtx;
use crate::scratch::Scratch;
use crate::{DType, ReduceKind, Result, kernels};

/// Reduces every rank's `data` into the root's `data`; other ranks' buffers are unchanged.
pub(crate) fn run(
    ctx: &OpCtx<'_>,
    root: u32,
    data: &mut [u8],
    dtype: DType,
    reduce: ReduceKind,
    segment_bytes: usize,
) -> Result<()> {
    let n = ctx.size();
    let relative = (ctx.rank + n - root) % n;
    let esize = dtype.size();
    let wsize = kernels::wide_size(dtype)?;
    let count = data.len() / esize;
    let segments = layout::segment_count(count, segment_bytes / esize);
    let max_segment = count.div_ceil(segments);
    let mut scratch = Scratch::take(max_segment * wsize, max_segment * wsize);
    let result = segments_in_turn(
        ctx,
        &Tree { root, relative, n },
        data,
        dtype,
        reduce,
        segments,
        &mut scratch,
    );
    scratch.give_back();
    result
}

/// Where this rank sits in the tree: the root, this rank relative to it, the group's size.
struct Tree {
    root: u32,
    relative: u32,
    n: u32,
}

/// Reduces `data` in `segments` segments, one after the other, through the buffers of
/// `scratch` (the partial this rank sends, and the one it receives).
fn segments_in_turn(
    ctx: &OpCtx<'_>,
    tree: &Tree,
    data: &mut [u8],
    dtype: DType,
    reduce: ReduceKind,
    segments: usize,
    scratch: &mut Scratch,
) -> Result<()> {
    let &Tree { root, relative, n } = tree;
    let real = |v: u32| (v + root) % n;
    let esize = dtype.size();
    let wsize = kernels::wide_size(dtype)?;
    let count = data.len() / esize;
    let Scratch {
        send: acc,
        recv: incoming,
    } = scratch;
    for segment in 0..segments {
        let range = layout::balanced(count, segments, segment);
        let wide_len = range.len() * wsize;
        let own = layout::bytes(range, esize);
        kernels::widen(dtype, &data[own.clone()], &mut acc[..wide_len])?;
        let mut mask = 1u32;
        let mut sent = false;
        while mask < n {
            if relative & mask != 0 {
                ctx.send(real(relative - mask), &acc[..wide_len])?;
                sent = true;
                break;
            }
            if relative + mask < n {
                ctx.recv_into(real(relative + mask), &mut incoming[..wide_len])?;
                kernels::accumulate_wide(
                    dtype,
                    reduce,
                    &mut acc[..wide_len],
                    &incoming[..wide_len],
                )?;
            }
            mask <<= 1;
        }
        if !sent {
            kernels::finish(dtype, reduce, n, &acc[..wide_len], &mut data[own])?;
        }
    }
    Ok(())
}
