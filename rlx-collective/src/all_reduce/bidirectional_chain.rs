//! All-reduce along a chain of cables (see [`crate::cable_path`]), both directions of every
//! cable at once.
//!
//! The buffer is cut in two halves. The first is reduced along the line towards its end,
//! segment by segment (each rank folds its own elements into the partial that arrives from
//! the rank before it and passes it on), and the last rank, which finishes it, sends the
//! result back along the line; the second half runs the other way, reduced towards the
//! line's start and sent back from there. So each direction of every cable carries one half
//! being reduced and the other half coming back: S bytes in all, where a ring around the
//! chain puts 2(n-1)/n · S on every cable (its closing hop crosses all of them), and S is
//! what each half of the line must learn of the other. Partials travel in the accumulation
//! type; each half is narrowed once, by the rank at its far end, and copied by the others, so
//! every rank ends with the same bytes.
//!
//! Each of the four streams (one half's reduction and its return, for each half) has a
//! thread and a phase of its own, and a reduction thread hands each finished segment to its
//! return thread through a channel: every stream is received by one thread in order, and no
//! thread waits for bytes that wait for it.

use std::sync::mpsc;

use crate::cable_path::CablePath;
use crate::op::OpCtx;
use crate::per_cable;
use crate::{CollectiveError, DType, ReduceKind, Result, kernels};

/// The phases of the four streams: the first half's reduction and return, the second's.
const PHASES: [u16; 4] = [1, 2, 3, 4];

/// One stream's work on this rank.
enum Stream<'d> {
    /// Folds this rank's segments into the partials arriving from `from` (or starts them, at
    /// the line's end it starts from) and passes them on to `to` (or finishes them, at the far
    /// end), handing each segment on to the return stream.
    Reduce {
        ctx: OpCtx<'d>,
        segments: Vec<&'d mut [u8]>,
        from: Option<u32>,
        to: Option<u32>,
        finished: mpsc::Sender<&'d mut [u8]>,
    },
    /// Receives each finished segment from `from` (unless this rank finished it) and passes it
    /// on to `to` (unless this is the end of the line).
    Return {
        ctx: OpCtx<'d>,
        segments: mpsc::Receiver<&'d mut [u8]>,
        from: Option<u32>,
        to: Option<u32>,
    },
}

/// The fixed parameters of the reductions.
#[derive(Clone, Copy)]
struct Fold {
    dtype: DType,
    reduce: ReduceKind,
    size: u32,
    wsize: usize,
    segment_elems: usize,
}

/// All-reduces `data` in place over a group cabled as `path`.
pub(crate) fn run(
    ctx: &OpCtx<'_>,
    path: &CablePath,
    data: &mut [u8],
    dtype: DType,
    reduce: ReduceKind,
    segment_bytes: usize,
) -> Result<()> {
    let (before, after) = path.neighbours(ctx.rank).ok_or_else(|| {
        CollectiveError::invalid(format!(
            "bidirectional_chain all-reduce: rank {} is not on the chain {:?}",
            ctx.rank,
            path.ranks()
        ))
    })?;
    let esize = dtype.size();
    let fold = Fold {
        dtype,
        reduce,
        size: ctx.size(),
        wsize: kernels::wide_size(dtype)?,
        segment_elems: (segment_bytes / esize).max(1),
    };
    let half = data.len() / esize / 2 * esize;
    let (first, second) = data.split_at_mut(half);
    let contexts = PHASES.map(|phase| ctx.phase(phase));
    let [reduce_first, return_first, reduce_second, return_second] = contexts;
    let (first_done, first_finished) = mpsc::channel();
    let (second_done, second_finished) = mpsc::channel();
    let segment_len = fold.segment_elems * esize;
    let streams = vec![
        Stream::Reduce {
            ctx: reduce_first,
            segments: first.chunks_mut(segment_len).collect(),
            from: before,
            to: after,
            finished: first_done,
        },
        Stream::Return {
            ctx: return_first,
            segments: first_finished,
            from: after,
            to: before,
        },
        Stream::Reduce {
            ctx: reduce_second,
            segments: second.chunks_mut(segment_len).collect(),
            from: after,
            to: before,
            finished: second_done,
        },
        Stream::Return {
            ctx: return_second,
            segments: second_finished,
            from: before,
            to: after,
        },
    ];
    per_cable::concurrently(ctx, streams, |stream| match stream {
        Stream::Reduce {
            ctx,
            segments,
            from,
            to,
            finished,
        } => reduce_along(&ctx, fold, segments, (from, to), &finished),
        Stream::Return {
            ctx,
            segments,
            from,
            to,
        } => return_along(&ctx, &segments, (from, to)),
    })
}

/// The reduction stream of one half (see [`Stream::Reduce`]).
fn reduce_along<'d>(
    ctx: &OpCtx<'_>,
    fold: Fold,
    segments: Vec<&'d mut [u8]>,
    (from, to): (Option<u32>, Option<u32>),
    finished: &mpsc::Sender<&'d mut [u8]>,
) -> Result<()> {
    let wide_len = fold.segment_elems * fold.wsize;
    let mut partial = vec![0u8; wide_len];
    for segment in segments {
        let len = segment.len() / fold.dtype.size() * fold.wsize;
        let partial = &mut partial[..len];
        match from {
            Some(from) => {
                ctx.recv_into(from, partial)?;
                kernels::accumulate_narrow(fold.dtype, fold.reduce, partial, segment)?;
            }
            None => kernels::widen(fold.dtype, segment, partial)?,
        }
        match to {
            Some(to) => ctx.send(to, partial)?,
            None => kernels::finish(fold.dtype, fold.reduce, fold.size, partial, segment)?,
        }
        // The return stream ends early when it failed; its error is the one reported.
        if finished.send(segment).is_err() {
            return Ok(());
        }
    }
    Ok(())
}

/// The return stream of one half (see [`Stream::Return`]): it ends when the reduction stream
/// has handed on its last segment, or failed.
fn return_along(
    ctx: &OpCtx<'_>,
    segments: &mpsc::Receiver<&mut [u8]>,
    (from, to): (Option<u32>, Option<u32>),
) -> Result<()> {
    for segment in segments {
        if let Some(from) = from {
            ctx.recv_into(from, segment)?;
        }
        if let Some(to) = to {
            ctx.send(to, segment)?;
        }
    }
    Ok(())
}
