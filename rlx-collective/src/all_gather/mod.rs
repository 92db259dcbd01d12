//! All-gather: every rank ends with every rank's buffer, in rank order. All ranks must pass
//! the same length.

pub(crate) mod bruck;
pub(crate) mod direct;
pub(crate) mod ring;

use crate::layout::{self, Blocks};
use crate::op::OpCtx;
use crate::select::Algorithm;
use crate::{CollectiveError, DType, NativeOp, Result};

/// Gathers the `dtype` elements of `local` from every rank into `out` (n × `local.len()`
/// bytes).
pub(crate) fn run(ctx: &OpCtx<'_>, local: &[u8], out: &mut [u8], dtype: DType) -> Result<()> {
    ctx.start(dtype, local.len())?;
    let n = ctx.size() as usize;
    let total = out.len();
    if local.len() as u128 * n as u128 != total as u128 {
        return Err(CollectiveError::invalid(format!(
            "all_gather output holds {total} bytes, expected {n} ranks × {} bytes",
            local.len()
        )));
    }
    if n == 1 {
        out.copy_from_slice(local);
        return Ok(());
    }
    if let Some(native) = ctx.native() {
        if native.supports(NativeOp::AllGather, dtype, None) {
            ctx.record_algorithm("native");
            return native.all_gather(local, out, dtype);
        }
    }
    let algorithm = ctx.settings.all_gather(total);
    ctx.record_algorithm(algorithm.name());
    match algorithm {
        Algorithm::Bruck => bruck::run(ctx, local, out)?,
        Algorithm::Direct => {
            let esize = dtype.size();
            let blocks = Blocks::Equal {
                len: local.len() / esize,
            };
            out[layout::bytes(blocks.block(ctx.rank as usize), esize)].copy_from_slice(local);
            direct::run(ctx, out, esize, blocks)?;
        }
        Algorithm::Ring | Algorithm::RankOrderRing => {
            let seat = ctx.ring_seat(algorithm);
            ctx.record_ring(&seat);
            let esize = dtype.size();
            let blocks = Blocks::Equal {
                len: local.len() / esize,
            };
            out[layout::bytes(blocks.block(ctx.rank as usize), esize)].copy_from_slice(local);
            let segment_bytes = ctx.segment_bytes(total, esize);
            ring::run(ctx, seat, out, esize, blocks, segment_bytes)?;
        }
        other => {
            return Err(CollectiveError::invalid(format!(
                "algorithm {other} does not apply to all_gather"
            )));
        }
    }
    Ok(())
}
