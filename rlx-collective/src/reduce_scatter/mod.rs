//! Reduce-scatter: reduce every rank's buffer and leave block `i` (of the near-equal split used
//! by all-reduce) on rank `i`.

pub(crate) mod ring;

use crate::layout::{self, Blocks};
use crate::op::OpCtx;
use crate::select::Algorithm;
use crate::{CollectiveError, DType, NativeOp, ReduceKind, Result, kernels};

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
    let seat = ctx.ring_seat(Algorithm::Ring);
    ctx.record_ring(&seat);
    let segment_bytes = ctx.segment_bytes(input.len(), esize);
    let data = ring::Data::Apart { input, out };
    ring::run(ctx, seat, data, dtype, reduce, segment_bytes)
}
