//! Segmented ring reduce-scatter: after n-1 steps rank `r` holds the fully reduced block `r`.
//!
//! The ring runs by positions (see [`RingSeat`]; in rank order, position `p` is rank `p`). At
//! step `s` the rank at position `p` sends its partial of the block of position `p-s-1` to
//! the next position and receives the partial of the block of position `p-s-2` from the
//! previous one, folding its own elements in as soon as the segment lands. Partials
//! travel in the wide accumulation type; the owner narrows once. Each block is reduced along
//! one fixed chain and finished by one rank, so the result does not depend on who reads it.
//!
//! Memory: two segment-sized accumulator buffers, reused from one call to the next on the same
//! thread (see [`crate::scratch`]), nothing per step.
//!
//! When the accumulation type is the element type itself (f32, f64, i64), the wide partial of
//! this rank's own elements is those elements: the first step sends them straight from the
//! caller's buffer instead of copying them into a partial first, and the last step folds the
//! received partial into the caller's buffer in one pass (except for `Mean`, which divides
//! after the fold). The combine is commutative bit for bit (see [`crate::kernels`]), so the
//! bytes are those of the general path.
//!
//! Together, reusing the buffers and skipping the conversions took two processes' f32 sum
//! all-reduces (each rank pinned to its own core, medians of eight interleaved runs) from
//! 42.0 to 35.5 µs at 128 KiB, 122 to 102 µs at 512 KiB, 259 to 222 µs at 1 MiB and 572 to
//! 513 µs at 2 MiB; 4 MiB stayed at 1.26-1.27 ms.

use std::ops::Range;

use super::Data;
use crate::layout::{self, Blocks};
use crate::op::OpCtx;
use crate::ring_order::RingSeat;
use crate::scratch::Scratch;
use crate::{CollectiveError, DType, ReduceKind, Result, kernels};

/// Reduces `data`'s contribution (`dtype` elements) over the group; on return this rank's
/// block, the element range `Blocks::Balanced{count, parts: n}.block(rank)`, holds the final
/// result (in place, or in the separate output) and the other blocks are unchanged. The ring
/// visits the ranks in `seat`'s order. Needs at least two ranks.
pub(crate) fn run(
    ctx: &OpCtx<'_>,
    seat: RingSeat<'_>,
    data: Data<'_>,
    dtype: DType,
    reduce: ReduceKind,
    segment_bytes: usize,
) -> Result<()> {
    reduce_into(
        ctx,
        seat,
        data,
        Finish::Narrow,
        dtype,
        reduce,
        segment_bytes,
    )
}

/// [`run`] with this rank's block left in the wide accumulation type (see
/// [`kernels::wide_size`]) in `out`, neither narrowed nor divided for a mean: the first level
/// of a plan that goes on reducing it with other ranks (`all_reduce::two_level`), so that the
/// elements are rounded, saturated and divided once, at the end, as the flat ring does.
pub(crate) fn run_wide(
    ctx: &OpCtx<'_>,
    seat: RingSeat<'_>,
    input: &[u8],
    out: &mut [u8],
    dtype: DType,
    reduce: ReduceKind,
    segment_bytes: usize,
) -> Result<()> {
    let data = Data::Apart { input, out };
    reduce_into(ctx, seat, data, Finish::Wide, dtype, reduce, segment_bytes)
}

/// What the rank does with its block's finished accumulators.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Finish {
    /// Narrows them into `dtype` elements (dividing for a mean).
    Narrow,
    /// Keeps them as they are.
    Wide,
}

/// [`run`] or [`run_wide`], as `finish` says.
fn reduce_into(
    ctx: &OpCtx<'_>,
    seat: RingSeat<'_>,
    mut data: Data<'_>,
    finish: Finish,
    dtype: DType,
    reduce: ReduceKind,
    segment_bytes: usize,
) -> Result<()> {
    let n = ctx.size() as usize;
    let esize = dtype.size();
    let blocks = Blocks::Balanced {
        count: data.input().len() / esize,
        parts: n,
    };
    let segments = layout::segment_count(blocks.max_len(), segment_bytes / esize);
    let ring = Ring {
        ctx,
        dtype,
        reduce,
        n,
        seat,
        esize,
        wsize: kernels::wide_size(dtype)?,
        already_wide: kernels::accumulates_in_kind(dtype),
        finish,
        blocks,
        segments,
    };
    let partial_len = blocks.max_len().div_ceil(segments) * ring.wsize;
    // Only forwarded partials and widened own elements go through the send buffer: two ranks
    // whose elements are their own accumulators never use it.
    let send_len = if n == 2 && ring.already_wide {
        0
    } else {
        partial_len
    };
    let mine = layout::bytes(blocks.block(ctx.rank as usize), esize);
    if let Data::Apart { out, .. } = &data {
        let needed = match finish {
            Finish::Narrow => mine.len(),
            Finish::Wide => mine.len() / esize * ring.wsize,
        };
        if out.len() != needed {
            return Err(CollectiveError::invalid(format!(
                "reduce_scatter output holds {} bytes; this rank's block needs {needed}",
                out.len(),
            )));
        }
    }
    let mut scratch = Scratch::take(send_len, partial_len);
    let result = ring.steps(&mut data, mine, &mut scratch);
    scratch.give_back();
    result
}

/// The fixed parameters of one reduce-scatter.
struct Ring<'c, 'a> {
    ctx: &'c OpCtx<'a>,
    dtype: DType,
    reduce: ReduceKind,
    /// Group size and this rank's seat in the ring.
    n: usize,
    seat: RingSeat<'c>,
    /// Bytes per element and per accumulator element.
    esize: usize,
    wsize: usize,
    /// See [`kernels::accumulates_in_kind`].
    already_wide: bool,
    finish: Finish,
    blocks: Blocks,
    segments: usize,
}

impl Ring<'_, '_> {
    fn next(&self) -> u32 {
        self.seat.next()
    }

    fn prev(&self) -> u32 {
        self.seat.prev()
    }

    /// The whole schedule, in the order described in the module docs.
    fn steps(&self, data: &mut Data<'_>, mine: Range<usize>, scratch: &mut Scratch) -> Result<()> {
        let (n, position, esize, wsize) = (self.n, self.seat.position(), self.esize, self.wsize);
        let Scratch {
            send: send_buf,
            recv: recv_buf,
        } = scratch;
        for segment in 0..self.segments {
            for step in 0..n - 1 {
                let last = step == n - 2;
                let (send_at, recv_at) = layout::reduce_scatter_step(position, n, step);
                let (send_block, recv_block) =
                    (self.seat.rank_at(send_at), self.seat.rank_at(recv_at));
                let send_range = self.blocks.segment(send_block, self.segments, segment);
                let send_len = send_range.len() * wsize;
                let recv_range = self.blocks.segment(recv_block, self.segments, segment);
                let recv_len = recv_range.len() * wsize;
                let incoming = &mut recv_buf[..recv_len];
                if step > 0 {
                    let outgoing = &send_buf[..send_len];
                    self.ctx
                        .send_recv_into(self.next(), outgoing, self.prev(), incoming)?;
                } else if self.already_wide {
                    // This rank's own elements are their own partial.
                    let own = &data.input()[layout::bytes(send_range, esize)];
                    self.ctx
                        .send_recv_into(self.next(), own, self.prev(), incoming)?;
                } else {
                    let own = &data.input()[layout::bytes(send_range, esize)];
                    kernels::widen(self.dtype, own, &mut send_buf[..send_len])?;
                    let outgoing = &send_buf[..send_len];
                    self.ctx
                        .send_recv_into(self.next(), outgoing, self.prev(), incoming)?;
                }

                let own_range = layout::bytes(recv_range, esize);
                let partial = &mut recv_buf[..recv_len];
                if last && self.already_wide && self.reduce != ReduceKind::Mean {
                    // The finished block is own ⊕ partial, and narrowing to the accumulation
                    // type itself changes nothing (so a wide output is a narrow one).
                    match data {
                        Data::InPlace(data) => {
                            let own = &mut data[own_range];
                            kernels::accumulate_wide(self.dtype, self.reduce, own, partial)?;
                        }
                        Data::Apart { input, .. } => {
                            let own = &input[own_range.clone()];
                            kernels::accumulate_wide(self.dtype, self.reduce, partial, own)?;
                            data.finished(own_range, mine.clone())
                                .copy_from_slice(partial);
                        }
                    }
                    continue;
                }
                let own = &data.input()[own_range.clone()];
                kernels::accumulate_narrow(self.dtype, self.reduce, partial, own)?;
                if last && self.finish == Finish::Wide {
                    let offset = (own_range.start - mine.start) / esize * wsize;
                    let out = data.output();
                    out[offset..offset + partial.len()].copy_from_slice(partial);
                } else if last {
                    let own = data.finished(own_range, mine.clone());
                    kernels::finish(self.dtype, self.reduce, n as u32, partial, own)?;
                } else {
                    // The partial just completed is the one to forward at the next step.
                    std::mem::swap(send_buf, recv_buf);
                }
            }
        }
        Ok(())
    }
}
