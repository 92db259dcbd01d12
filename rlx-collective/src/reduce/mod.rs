//! Reduce: the root ends with the reduction of every rank's buffer; the other ranks' buffers
//! are left as they were.

pub(crate) mod binomial;

use crate::op::OpCtx;
use crate::{DType, ReduceKind, Result, kernels};

/// Reduces the `dtype` elements of every rank's `data` into the root's `data`.
pub(crate) fn run(
    ctx: &OpCtx<'_>,
    root: u32,
    data: &mut [u8],
    dtype: DType,
    reduce: ReduceKind,
) -> Result<()> {
    ctx.start(dtype, data.len())?;
    ctx.record_algorithm("binomial_tree");
    kernels::wide_size(dtype)?;
    ctx.check_root(root)?;
    if ctx.size() == 1 {
        return Ok(());
    }
    let segment_bytes = ctx.segment_bytes(data.len(), dtype.size());
    binomial::run(ctx, root, data, dtype, reduce, segment_bytes)
}
