//! Reduce-scatter: reduce every rank's buffer and leave block `i` (of the near-equal split used
//! by all-reduce) on rank `i`.

pub(crate) mod direct;
pub(crate) mod ring;

use std::ops::Range;

use crate::layout::{self, Blocks};
use crate::op::OpCtx;
use crate::select::Algorithm;
use crate::{CollectiveError, DType, NativeOp, ReduceKind, Result, kernels};

/// Where a reduce-scatter reads this rank's contribution and writes its finished block.
pub(crate) enum Data<'a> {
    /// One buffer: the contribution, whose block `rank` the result replaces (the all-reduce).
    InPlace(&'a mut [u8]),
    /// The contribution, left as it is, and a buffer of exactly this rank's block for the
    /// result (the reduce-scatter itself, which so copies nothing of the input).
    Apart {
        /// This rank's contribution, every block.
        input: &'a [u8],
        /// This rank's block of the result.
        out: &'a mut [u8],
    },
}

impl Data<'_> {
    pub(super) fn input(&self) -> &[u8] {
        match self {
            Data::InPlace(data) => data,
            Data::Apart { input, .. } => input,
        }
    }

    /// The whole output: the separate one, or the buffer itself in place.
    pub(super) fn output(&mut self) -> &mut [u8] {
        match self {
            Data::InPlace(data) => data,
            Data::Apart { out, .. } => out,
        }
    }

    /// The finished bytes of `range` (bytes of the input) of this rank's block `block`.
    pub(super) fn finished(&mut self, range: Range<usize>, block: Range<usize>) -> &mut [u8] {
        match self {
            Data::InPlace(data) => &mut data[range],
            Data::Apart { out, .. } => &mut out[range.start - block.start..range.end - block.start],
        }
    }
}

/// Bytes of this rank's block of the result of reducing `input_len` bytes of `dtype` over
/// `size` ranks.
pub(crate) fn block_len(input_len: usize, dtype: DType, size: u32, rank: u32) -> usize {
    let esize = dtype.size();
    let blocks = Blocks::Balanced {
        count: input_len / esize,
        parts: size as usize,
    };
    layout::bytes(blocks.block(rank as usize), esize).len()
}

/// Reduces `input` over the group into `out`, this rank's block of the result
/// ([`block_len`] bytes).
pub(crate) fn run(
    ctx: &OpCtx<'_>,
    input: &[u8],
    out: &mut [u8],
    dtype: DType,
    reduce: ReduceKind,
) -> Result<()> {
    ctx.start(dtype, input.len())?;
    kernels::wide_size(dtype)?;
    let n = ctx.size() as usize;
    let esize = dtype.size();
    let expected = block_len(input.len(), dtype, ctx.size(), ctx.rank);
    if out.len() != expected {
        return Err(CollectiveError::invalid(format!(
            "reduce_scatter output holds {} bytes; rank {} of {n} gets a block of {expected} of \
             the {} input bytes",
            out.len(),
            ctx.rank,
            input.len()
        )));
    }
    if n == 1 {
        out.copy_from_slice(input);
        return Ok(());
    }
    if let Some(native) = ctx.native() {
        let equal = input.len() % (n * esize) == 0;
        if equal && native.supports(NativeOp::ReduceScatter, dtype, Some(reduce)) {
            ctx.record_algorithm("native");
            return native.reduce_scatter(input, out, dtype, reduce);
        }
    }
    let segment_bytes = ctx.segment_bytes(input.len(), esize);
    let data = Data::Apart { input, out };
    let algorithm = ctx.settings.reduce_scatter(input.len());
    match algorithm {
        Algorithm::Direct => {
            ctx.record_algorithm(algorithm.name());
            direct::run(ctx, data, dtype, reduce, segment_bytes)
        }
        Algorithm::Ring | Algorithm::RankOrderRing => {
            let seat = ctx.ring_seat(algorithm);
            ctx.record_ring(&seat);
            ring::run(ctx, seat, data, dtype, reduce, segment_bytes)
        }
        other => Err(CollectiveError::invalid(format!(
            "algorithm {other} does not apply to reduce_scatter"
        ))),
    }
}
