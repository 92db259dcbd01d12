//! Gather: the root ends with every rank's buffer in rank order. All ranks pass the same
//! length.

pub(crate) mod linear;

use crate::op::OpCtx;
use crate::{CollectiveError, DType, Result};

/// How many elements (or bytes) `len` of them from each of `world` ranks make together.
pub(crate) fn gathered_len(len: usize, world: u32) -> Result<usize> {
    len.checked_mul(world as usize).ok_or_else(|| {
        CollectiveError::invalid(format!(
            "gathering {len} elements from {world} ranks overflows the address space"
        ))
    })
}

/// Gathers the `dtype` elements of every rank's `local` into the root's `out` (n ×
/// `local.len()` bytes, rank order); `out` is not touched elsewhere.
pub(crate) fn run(
    ctx: &OpCtx<'_>,
    root: u32,
    local: &[u8],
    out: &mut [u8],
    dtype: DType,
) -> Result<()> {
    ctx.start(dtype, local.len())?;
    ctx.record_algorithm("linear");
    ctx.check_root(root)?;
    if ctx.rank != root {
        return linear::run(ctx, root, local, &mut []);
    }
    let total = gathered_len(local.len(), ctx.size())?;
    if out.len() != total {
        return Err(CollectiveError::invalid(format!(
            "gather output on the root holds {} bytes; {} ranks × {} bytes need {total}",
            out.len(),
            ctx.size(),
            local.len()
        )));
    }
    linear::run(ctx, root, local, out)
}
