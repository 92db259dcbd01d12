//! Gather: the root ends with every rank's buffer in rank order. All ranks pass the same
//! length.

pub(crate) mod linear;

use crate::op::OpCtx;
use crate::{CollectiveError, DType, Result};

/// Gathers the `dtype` elements of every rank's `local`; `Some` on the root, `None` elsewhere.
pub(crate) fn run(
    ctx: &OpCtx<'_>,
    root: u32,
    local: &[u8],
    dtype: DType,
) -> Result<Option<Vec<u8>>> {
    ctx.start(dtype, local.len())?;
    ctx.record_algorithm("linear");
    ctx.check_root(root)?;
    if ctx.rank != root {
        linear::run(ctx, root, local, &mut [])?;
        return Ok(None);
    }
    let total = local
        .len()
        .checked_mul(ctx.size() as usize)
        .ok_or_else(|| CollectiveError::invalid("gathered size overflows the address space"))?;
    let mut out = vec![0u8; total];
    linear::run(ctx, root, local, &mut out)?;
    Ok(Some(out))
}
