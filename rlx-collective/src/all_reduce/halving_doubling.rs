//! All-reduce for large worlds at mid sizes: a reduce-scatter by recursive halving, then an
//! all-gather by recursive doubling (Rabenseifner's algorithm), with the fold of recursive
//! doubling for a world that is not a power of two.
//!
//! It moves what the ring moves, 2(p-1)/p of the buffer in and out of each rank, in 2·log2 p
//! steps instead of the ring's 2(n-1): on 64 ranks 12 latencies instead of 126, which is what
//! bounds an all-reduce of tens or hundreds of KiB on a large world.
//!
//! With p the largest power of two not above n and rem = n - p, the first 2·rem ranks pair
//! up as in recursive doubling: each even one hands its buffer to its odd neighbour and waits
//! for the result. The p remaining ranks (virtual ranks 0..p) split the buffer into p blocks.
//! Halving: at distance d = p/2, p/4, ..., 1, a rank keeps the half of its current blocks on
//! its side of bit d of its virtual rank, sends the other half to partner `v XOR d` and adds
//! the partner's copy of its kept half; it ends holding block v reduced over every rank, in
//! the accumulation type, which it narrows once (so results round once, as the ring's do).
//! Doubling: at distance d = 1, 2, ..., p/2, partners swap the narrowed blocks they hold, so
//! every rank ends with the same bytes. The odd ranks of the fold pass them back.

use std::ops::Range;

use crate::layout::{self, PowerOfTwoFold, send_and_recv};
use crate::op::OpCtx;
use crate::scratch::Scratch;
use crate::{DType, ReduceKind, Result, kernels};

/// All-reduces `data` in place over at least two ranks.
///
/// When the accumulation type is the element type itself (f32, f64, i64), `data` is the
/// accumulator; otherwise a widened copy is. Either way what arrives lands segment by segment
/// in this thread's scratch buffer (see [`crate::scratch`]) before it is folded in: fresh
/// buffers of the whole size cost a page fault per page on every call, which made a first
/// version of this file 7 to 10 times slower than the ring between two ranks of one host.
pub(crate) fn run(
    ctx: &OpCtx<'_>,
    data: &mut [u8],
    dtype: DType,
    reduce: ReduceKind,
) -> Result<()> {
    let wsize = kernels::wide_size(dtype)?;
    let elements = data.len() / dtype.size();
    let segment_elements = (ctx.segment_bytes(data.len(), dtype.size()) / dtype.size()).max(1);
    let mut scratch = Scratch::take(0, segment_elements * wsize);
    let plan = Plan {
        ctx,
        dtype,
        reduce,
        wsize,
        segment_elements,
    };
    let result = if wsize == dtype.size() {
        plan.all_reduce(data, None, &mut scratch.recv)
    } else {
        let mut wide = vec![0u8; elements * wsize];
        kernels::widen(dtype, data, &mut wide)
            .and_then(|()| plan.all_reduce(data, Some(&mut wide), &mut scratch.recv))
    };
    scratch.give_back();
    result
}

/// What every step of one call needs.
struct Plan<'a, 'c> {
    ctx: &'a OpCtx<'c>,
    dtype: DType,
    reduce: ReduceKind,
    wsize: usize,
    segment_elements: usize,
}

impl Plan<'_, '_> {
    /// The schedule of the module docs; `wide` is the accumulator when it is not `data`.
    fn all_reduce(
        &self,
        data: &mut [u8],
        mut wide: Option<&mut [u8]>,
        landing: &mut [u8],
    ) -> Result<()> {
        let (ctx, n, r) = (self.ctx, self.ctx.size(), self.ctx.rank);
        let fold = PowerOfTwoFold::of(n);
        let pof2 = fold.pof2;
        let elements = data.len() / self.dtype.size();
        // The fold: even ranks of its pairs sit out the halving and the doubling.
        let acc = wide.as_deref_mut().unwrap_or(&mut *data);
        let Some(virtual_rank) = fold.virtual_rank(r) else {
            self.swap(r + 1, acc, &mut [], landing, Arrival::InPlace(self.wsize))?;
            ctx.recv_into(r + 1, data)?;
            return Ok(());
        };
        if fold.pairs(r) {
            self.swap(r - 1, &[], acc, landing, Arrival::Folded)?;
        }
        let blocks = Blocks {
            elements,
            parts: pof2 as usize,
        };
        let mut held = 0..pof2 as usize;
        let mut distance = pof2 / 2;
        while distance > 0 {
            let (kept, given) = halves(&held, virtual_rank & distance != 0);
            let acc = wide.as_deref_mut().unwrap_or(&mut *data);
            let (out, kept_acc) = send_and_recv(
                acc,
                blocks.bytes(&given, self.wsize),
                blocks.bytes(&kept, self.wsize),
            )?;
            let partner = fold.real_rank(virtual_rank ^ distance);
            self.swap(partner, out, kept_acc, landing, Arrival::Folded)?;
            held = kept;
            distance /= 2;
        }
        self.finish_block(data, wide.as_deref(), blocks.bytes(&held, 1), landing)?;
        let esize = self.dtype.size();
        let mut distance = 1;
        while distance < pof2 {
            let theirs = partner_blocks(&held, virtual_rank & distance != 0);
            let (out, into) = send_and_recv(
                data,
                blocks.bytes(&held, esize),
                blocks.bytes(&theirs, esize),
            )?;
            let partner = fold.real_rank(virtual_rank ^ distance);
            self.swap(partner, out, into, landing, Arrival::InPlace(esize))?;
            held = held.start.min(theirs.start)..held.end.max(theirs.end);
            distance *= 2;
        }
        if fold.pairs(r) {
            ctx.send(r - 1, data)?;
        }
        Ok(())
    }

    /// Narrows the reduced elements `held` (an element range) of the accumulator into
    /// `data`, once. In place, only `Mean` changes anything: it divides through a copy.
    fn finish_block(
        &self,
        data: &mut [u8],
        wide: Option<&[u8]>,
        held: Range<usize>,
        landing: &mut [u8],
    ) -> Result<()> {
        let (esize, n) = (self.dtype.size(), self.ctx.size());
        let narrow = held.start * esize..held.end * esize;
        if let Some(wide) = wide {
            let wide_range = held.start * self.wsize..held.end * self.wsize;
            return kernels::finish(
                self.dtype,
                self.reduce,
                n,
                &wide[wide_range],
                &mut data[narrow],
            );
        }
        if self.reduce != ReduceKind::Mean {
            return Ok(());
        }
        for piece in data[narrow].chunks_mut(landing.len().max(esize)) {
            let copy = &mut landing[..piece.len()];
            copy.copy_from_slice(piece);
            kernels::finish(self.dtype, self.reduce, n, copy, piece)?;
        }
        Ok(())
    }

    /// Sends `out` to `partner` while receiving as much as `into` holds from it, in segments
    /// that both sides cut alike (each cuts both directions into the same number of segments);
    /// `arrival` says where each received segment goes.
    fn swap(
        &self,
        partner: u32,
        out: &[u8],
        into: &mut [u8],
        landing: &mut [u8],
        arrival: Arrival,
    ) -> Result<()> {
        let element = match arrival {
            Arrival::Folded => self.wsize,
            Arrival::InPlace(element) => element,
        };
        let (sent, received) = (out.len() / element, into.len() / element);
        let segments = sent.max(received).div_ceil(self.segment_elements).max(1);
        for segment in 0..segments {
            let bytes = |count: usize| {
                let range = layout::balanced(count, segments, segment);
                range.start * element..range.end * element
            };
            let (outgoing, incoming) = (&out[bytes(sent)], bytes(received));
            let ctx = self.ctx;
            if let Arrival::InPlace(_) = arrival {
                exchange(ctx, partner, outgoing, &mut into[incoming])?;
                continue;
            }
            let landed = &mut landing[..incoming.len()];
            exchange(ctx, partner, outgoing, landed)?;
            kernels::accumulate_wide(self.dtype, self.reduce, &mut into[incoming], landed)?;
        }
        Ok(())
    }
}

/// Where the segments a swap receives go.
#[derive(Clone, Copy)]
enum Arrival {
    /// Into the scratch landing, then folded into the accumulator (elements of the
    /// accumulation type).
    Folded,
    /// Straight into place; elements of this many bytes.
    InPlace(usize),
}

/// One segment's exchange with `partner`: a plain send or receive when one side is empty (the
/// fold of a world that is not a power of two sends one way only).
fn exchange(ctx: &OpCtx<'_>, partner: u32, outgoing: &[u8], incoming: &mut [u8]) -> Result<()> {
    match (outgoing.is_empty(), incoming.is_empty()) {
        (false, true) => ctx.send(partner, outgoing),
        (true, false) => ctx.recv_into(partner, incoming),
        _ => ctx.send_recv_into(partner, outgoing, partner, incoming),
    }
}

/// The buffer of `elements` elements cut into `parts` near-equal blocks.
struct Blocks {
    elements: usize,
    parts: usize,
}

impl Blocks {
    /// The bytes of blocks `range`, for elements of `size` bytes.
    fn bytes(&self, range: &Range<usize>, size: usize) -> Range<usize> {
        let first = layout::balanced(self.elements, self.parts, range.start).start;
        let end = if range.is_empty() {
            first
        } else {
            layout::balanced(self.elements, self.parts, range.end - 1).end
        };
        first * size..end * size
    }
}

/// The halves of the blocks `held` a halving step keeps and gives away: the upper half kept
/// when `upper` (this rank's bit of the step is set), the lower one otherwise.
fn halves(held: &Range<usize>, upper: bool) -> (Range<usize>, Range<usize>) {
    let middle = held.start + held.len() / 2;
    let (lower, higher) = (held.start..middle, middle..held.end);
    if upper {
        (higher, lower)
    } else {
        (lower, higher)
    }
}

/// The blocks a doubling partner holds, of the same size as `held`: just below them when this
/// rank's bit of the step is set, just above otherwise.
fn partner_blocks(held: &Range<usize>, upper: bool) -> Range<usize> {
    let size = held.len();
    if upper {
        held.start - size..held.start
    } else {
        held.end..held.end + size
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halving_ends_on_the_block_of_the_virtual_rank_and_doubling_covers_all() {
        for p in [2usize, 4, 8, 16] {
            for v in 0..p {
                let mut held = 0..p;
                let mut distance = p / 2;
                while distance > 0 {
                    held = halves(&held, v & distance != 0).0;
                    distance /= 2;
                }
                assert_eq!(held, v..v + 1, "p {p}, virtual rank {v}");
                let mut distance = 1;
                while distance < p {
                    let theirs = partner_blocks(&held, v & distance != 0);
                    held = held.start.min(theirs.start)..held.end.max(theirs.end);
                    distance *= 2;
                }
                assert_eq!(held, 0..p);
            }
        }
    }

    #[test]
    fn blocks_cover_the_buffer_in_bytes() {
        let blocks = Blocks {
            elements: 13,
            parts: 4,
        };
        assert_eq!(blocks.bytes(&(0..4), 2), 0..26);
        assert_eq!(blocks.bytes(&(1..2), 4), 12..24);
        assert_eq!(blocks.bytes(&(2..2), 4).len(), 0);
    }
}
