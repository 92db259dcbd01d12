//! Direct reduce-scatter for a full mesh of cables: every rank sends each peer that peer's
//! block of its contribution and receives its own block from every peer at once, one exchange
//! per cable (see [`crate::all_gather::direct`] for why every cable of a mesh is then busy).
//!
//! It goes segment by segment, as a pipeline: one thread per cable exchanges segment after
//! segment with its peers, landing each peer's contribution in one of two slots of its own,
//! while the caller's thread folds the segment every exchange has landed (the block's own
//! elements and the slots in rank order, into a wide accumulator, narrowed once). An exchange
//! waits only for the fold of the segment two back, whose slot it reuses, so the cables stay
//! busy while the fold runs. Every block is so reduced by one rank in one fixed order. Memory:
//! 2(n-1) segment slots and one accumulator of a segment.

use std::ops::Range;

use parking_lot::{Condvar, Mutex};

use super::Data;
use crate::layout::{self, Blocks};
use crate::op::OpCtx;
use crate::per_cable::{self, join_all, tell_if_fatal};
use crate::{CollectiveError, DType, ReduceKind, Result, kernels};

/// How far the exchanges and the fold of a reduce-scatter are.
#[derive(Default)]
struct Progress {
    /// Segments each exchange has landed in its slots.
    landed: Vec<usize>,
    /// Segments folded into this rank's block.
    folded: usize,
    /// Whether an exchange failed (or its thread ended early): every thread stops.
    failed: bool,
}

/// The progress the exchange threads and the folding thread wait on.
struct Pipeline {
    progress: Mutex<Progress>,
    changed: Condvar,
}

impl Pipeline {
    /// Waits until `ready` holds; `false` when the pipeline failed instead. Every exchange ends
    /// in bounded time (the operation timeout), with a landed segment or a failure, so neither
    /// side waits for ever.
    fn wait_until(&self, ready: impl Fn(&Progress) -> bool) -> bool {
        let mut progress = self.progress.lock();
        while !progress.failed && !ready(&progress) {
            self.changed.wait(&mut progress);
        }
        !progress.failed
    }

    fn update(&self, change: impl FnOnce(&mut Progress)) {
        change(&mut self.progress.lock());
        self.changed.notify_all();
    }
}

/// Marks the pipeline failed when an exchange thread ends by a panic, so that the folding
/// thread does not wait for its segments.
struct FailOnPanic<'p>(&'p Pipeline);

impl Drop for FailOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.update(|p| p.failed = true);
        }
    }
}

/// The contributions of the other ranks' blocks, which the exchanges read while this rank's
/// block is folded in place.
struct OtherBlocks<'d> {
    before: &'d [u8],
    after: &'d [u8],
    /// Where this rank's block is (bytes of the whole buffer).
    own: Range<usize>,
}

impl OtherBlocks<'_> {
    /// The bytes of `range` (of the whole buffer), which lies outside this rank's block.
    fn read(&self, range: Range<usize>) -> &[u8] {
        if range.end <= self.own.start {
            &self.before[range]
        } else {
            &self.after[range.start - self.own.end..range.end - self.own.end]
        }
    }
}

/// The fixed parameters of one reduce-scatter.
struct Plan {
    n: usize,
    r: usize,
    esize: usize,
    blocks: Blocks,
    segments: usize,
}

impl Plan {
    /// Bytes of the whole buffer that segment `segment` of block `block` holds.
    fn segment(&self, block: usize, segment: usize) -> Range<usize> {
        layout::bytes(
            self.blocks.segment(block, self.segments, segment),
            self.esize,
        )
    }
}

/// This rank's block: where its own elements are read and its result written.
enum OwnBlock<'d> {
    /// One slice for both (the all-reduce).
    InPlace(&'d mut [u8]),
    /// This rank's elements of the block, and the separate result.
    Apart { input: &'d [u8], out: &'d mut [u8] },
}

impl OwnBlock<'_> {
    /// Folds bytes `range` of the block: its own elements widened into `acc`, each slot's
    /// contribution folded in, in order, and the result narrowed into place.
    fn fold(
        &mut self,
        range: Range<usize>,
        acc: &mut [u8],
        slots: &[&[u8]],
        how: Fold,
    ) -> Result<()> {
        let own: &[u8] = match self {
            OwnBlock::InPlace(block) => &block[range.clone()],
            OwnBlock::Apart { input, .. } => &input[range.clone()],
        };
        kernels::widen(how.dtype, own, acc)?;
        for slot in slots {
            kernels::accumulate_narrow(how.dtype, how.reduce, acc, &slot[..range.len()])?;
        }
        let result = match self {
            OwnBlock::InPlace(block) => &mut block[range],
            OwnBlock::Apart { out, .. } => &mut out[range],
        };
        kernels::finish(how.dtype, how.reduce, how.ranks, acc, result)
    }
}

/// What a fold computes.
#[derive(Clone, Copy)]
struct Fold {
    dtype: DType,
    reduce: ReduceKind,
    ranks: u32,
}

/// Reduces `data`'s contribution (`dtype` elements) over the group, leaving this rank's block
/// of the result (of the near-equal split into n blocks) in place or in the separate output.
/// Needs at least two ranks.
pub(crate) fn run(
    ctx: &OpCtx<'_>,
    data: Data<'_>,
    dtype: DType,
    reduce: ReduceKind,
    segment_bytes: usize,
) -> Result<()> {
    let (n, r, esize) = (ctx.size() as usize, ctx.rank as usize, dtype.size());
    let wsize = kernels::wide_size(dtype)?;
    let count = match &data {
        Data::InPlace(data) => data.len(),
        Data::Apart { input, .. } => input.len(),
    } / esize;
    let blocks = Blocks::Balanced { count, parts: n };
    let plan = Plan {
        n,
        r,
        esize,
        blocks,
        segments: layout::segment_count(blocks.max_len(), segment_bytes / esize),
    };
    let most = blocks.max_len().div_ceil(plan.segments);
    let slots: Vec<[Mutex<Vec<u8>>; 2]> = (1..n)
        .map(|_| [(); 2].map(|()| Mutex::new(vec![0u8; most * esize])))
        .collect();
    let own = layout::bytes(blocks.block(r), esize);
    let (others, mut own_block) = split_own(data, own.clone())?;
    let pipeline = Pipeline {
        progress: Mutex::new(Progress {
            landed: vec![0; n - 1],
            ..Progress::default()
        }),
        changed: Condvar::new(),
    };
    let how = Fold {
        dtype,
        reduce,
        ranks: n as u32,
    };
    std::thread::scope(|scope| {
        let threads: Vec<_> = (1..n)
            .map(|s| {
                let (plan, slots, others, pipeline) = (&plan, &slots, &others, &pipeline);
                per_cable::spawn(scope, ctx, move || {
                    exchange_segments(ctx, plan, s, &slots[s - 1], others, pipeline)
                })
            })
            .collect();
        let mut acc = vec![0u8; most * wsize];
        let folded = fold_segments(&plan, own.start, &slots, &pipeline, |range, slots| {
            let acc = &mut acc[..range.len() / esize * wsize];
            own_block.fold(range, acc, slots, how)
        });
        join_all(threads).and(folded)
    })
}

/// `data` cut into the other ranks' blocks, which the exchanges read, and this rank's block
/// (bytes `own`), which the fold reads and writes.
fn split_own(data: Data<'_>, own: Range<usize>) -> Result<(OtherBlocks<'_>, OwnBlock<'_>)> {
    Ok(match data {
        Data::InPlace(data) => {
            let (before, rest) = data.split_at_mut(own.start);
            let (own_block, after) = rest.split_at_mut(own.len());
            let others = OtherBlocks { before, after, own };
            (others, OwnBlock::InPlace(own_block))
        }
        Data::Apart { input, out } => {
            if out.len() != own.len() {
                return Err(CollectiveError::invalid(format!(
                    "reduce_scatter output holds {} bytes; this rank's block needs {}",
                    out.len(),
                    own.len()
                )));
            }
            let others = OtherBlocks {
                before: &input[..own.start],
                after: &input[own.end..],
                own: own.clone(),
            };
            (
                others,
                OwnBlock::Apart {
                    input: &input[own],
                    out,
                },
            )
        }
    })
}

/// Thread `s` of the reduce-scatter: every segment, sends peer `r+s` its segment of this
/// rank's contribution and lands peer `r-s`'s segment of this rank's block in `slots`.
fn exchange_segments(
    ctx: &OpCtx<'_>,
    plan: &Plan,
    s: usize,
    slots: &[Mutex<Vec<u8>>; 2],
    others: &OtherBlocks<'_>,
    pipeline: &Pipeline,
) -> Result<()> {
    let _fail_on_panic = FailOnPanic(pipeline);
    let (to, from) = per_cable::partners(plan.r, plan.n, s);
    for segment in 0..plan.segments {
        // The slot of this segment held the one two back: it must have been folded.
        if !pipeline.wait_until(|p| p.folded + 2 > segment) {
            return Ok(());
        }
        let len = plan.segment(plan.r, segment).len();
        let send = others.read(plan.segment(to, segment));
        let mut slot = slots[segment % 2].lock();
        let exchanged = ctx.send_recv_into(to as u32, send, from as u32, &mut slot[..len]);
        drop(slot);
        if let Err(error) = exchanged {
            tell_if_fatal(ctx, &error);
            pipeline.update(|p| p.failed = true);
            return Err(error);
        }
        pipeline.update(|p| p.landed[s - 1] = segment + 1);
    }
    Ok(())
}

/// The caller's side of the reduce-scatter: folds each segment of this rank's block (which
/// starts at byte `own_start` of the buffer) with `fold`, given the segment's bytes within the
/// block and the slots in the rank order of their peers, once every exchange has landed it.
fn fold_segments(
    plan: &Plan,
    own_start: usize,
    slots: &[[Mutex<Vec<u8>>; 2]],
    pipeline: &Pipeline,
    mut fold: impl FnMut(Range<usize>, &[&[u8]]) -> Result<()>,
) -> Result<()> {
    let (n, r) = (plan.n, plan.r);
    for segment in 0..plan.segments {
        if !pipeline.wait_until(|p| p.landed.iter().all(|&landed| landed > segment)) {
            return Ok(());
        }
        let range = plan.segment(r, segment);
        // The slot of peer `p` is slot (r - p) mod n - 1.
        let guards: Vec<_> = (0..n)
            .filter(|&p| p != r)
            .map(|p| slots[(r + n - p) % n - 1][segment % 2].lock())
            .collect();
        let views: Vec<&[u8]> = guards.iter().map(|g| g.as_slice()).collect();
        let folded = fold(range.start - own_start..range.end - own_start, &views);
        drop(guards);
        if let Err(error) = folded {
            pipeline.update(|p| p.failed = true);
            return Err(error);
        }
        pipeline.update(|p| p.folded = segment + 1);
    }
    Ok(())
}
