//! Scatter: block `i` of the root's buffer goes to rank `i`. Every rank passes a receive buffer
//! of the block length; the root's send buffer holds n blocks.

pub(crate) mod linear;

use crate::op::OpCtx;
use crate::{CollectiveError, DType, Result};

/// Scatters the root's `send` into every rank's `recv` (elements of `dtype`).
pub(crate) fn run(
    ctx: &OpCtx<'_>,
    root: u32,
    send: &[u8],
    recv: &mut [u8],
    dtype: DType,
) -> Result<()> {
    ctx.start(dtype, recv.len())?;
    ctx.record_algorithm("linear");
    ctx.check_root(root)?;
    if ctx.rank == root {
        let expected = recv.len() as u64 * u64::from(ctx.size());
        if send.len() as u64 != expected {
            return Err(CollectiveError::invalid(format!(
                "scatter root buffer holds {} bytes, expected {expected} ({} ranks × {} bytes)",
                send.len(),
                ctx.size(),
                recv.len()
            )));
        }
    }
    linear::run(ctx, root, send, recv)
}
