//! Broadcast: every rank ends with the root's buffer. All ranks pass the same length.

pub(crate) mod binomial;
pub(crate) mod chain;
pub(crate) mod direct;

use crate::op::OpCtx;
use crate::select::Algorithm;
use crate::{CollectiveError, DType, Result};

/// Broadcasts the root's `data` (elements of `dtype`) into every rank's `data`.
pub(crate) fn run(ctx: &OpCtx<'_>, root: u32, data: &mut [u8], dtype: DType) -> Result<()> {
    ctx.start(dtype, data.len())?;
    ctx.check_root(root)?;
    let n = ctx.size();
    if n == 1 {
        return Ok(());
    }
    let algorithm = ctx.settings.broadcast(data.len(), n);
    ctx.record_algorithm(algorithm.name());
    match algorithm {
        Algorithm::BinomialTree => binomial::run(ctx, root, data),
        Algorithm::Direct => direct::run(ctx, root, data, dtype.size()),
        Algorithm::PipelinedChain => {
            let segment_bytes = ctx.segment_bytes(data.len(), dtype.size());
            let seat = ctx.ring_seat(Algorithm::Ring);
            chain::run(ctx, seat, root, data, dtype.size(), segment_bytes)
        }
        other => Err(CollectiveError::invalid(format!(
            "algorithm {other} does not apply to broadcast"
        ))),
    }
}
