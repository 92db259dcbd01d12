//! Reduce-scatter: reduce every rank's buffer and leave block `i` (of the near-equal split used
//! by all-reduce) on rank `i`.

pub(crate) mod ring;

use crate::layout::{self, Blocks};
use crate::op::OpCtx;
use crate::{DType, NativeOp, ReduceKind, Result, kernels};

/// Reduces `input` over the group and returns this rank's block of the result.
pub(crate) fn run(
    ctx: &OpCtx<'_>,
    input: &[u8],
    dtype: DType,
    reduce: ReduceKind,
) -> Result<Vec<u8>> {
    ctx.start(dtype, input.len())?;
    kernels::wide_size(dtype)?;
    let n = ctx.size() as usize;
    let esize = dtype.size();
    let blocks = Blocks::Balanced {
        count: input.len() / esize,
        parts: n,
    };
    let mine = layout::bytes(blocks.block(ctx.rank as usize), esize);
    if n == 1 {
        return Ok(input.to_vec());
    }
    if let Some(native) = ctx.native() {
        let equal = input.len() % (n * esize) == 0;
        if equal && native.supports(NativeOp::ReduceScatter, dtype, Some(reduce)) {
            ctx.record_algorithm("native");
            let mut out = vec![0u8; mine.len()];
            native.reduce_scatter(input, &mut out, dtype, reduce)?;
            return Ok(out);
        }
    }
    ctx.record_algorithm("ring");
    let mut work = input.to_vec();
    let segment_bytes = ctx.settings.segment_bytes(input.len(), esize);
    ring::run(ctx, &mut work, dtype, reduce, segment_bytes)?;
    Ok(work.get(mine).map(<[u8]>::to_vec).unwrap_or_default())
}
