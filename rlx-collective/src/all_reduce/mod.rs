//! All-reduce: every rank ends with the bit-identical reduction of every rank's buffer.
//!
//! [`run`] validates, takes the native path when the backend offers one for the world group,
//! and otherwise runs the algorithm the selector in [`crate::select`] picks.

pub(crate) mod bidirectional_chain;
pub(crate) mod compressed;
pub(crate) mod direct;
pub(crate) mod halving_doubling;
pub(crate) mod one_sided;
pub(crate) mod recursive_doubling;
pub(crate) mod ring;
pub(crate) mod two_level;

use crate::op::OpCtx;
use crate::select::Algorithm;
use crate::{CollectiveError, DType, NativeOp, ReduceKind, Result, kernels};

/// All-reduces the `dtype` elements of `data` in place. The operation's place in the group's
/// one-sided queue (if it has one) is released however this returns.
pub(crate) fn run(
    ctx: &OpCtx<'_>,
    data: &mut [u8],
    dtype: DType,
    reduce: ReduceKind,
) -> Result<()> {
    let _registration = ctx.one_sided().registration(ctx.tag().seq());
    let n = ctx.size();
    // The one-sided path takes its turn and its heap region (a collective allocation at first
    // use) before anything that can fail on one rank only.
    let prepared = if n > 1 && ctx.settings.all_reduce == Algorithm::OneSidedRing {
        Some(one_sided::prepare(ctx)?)
    } else {
        None
    };
    ctx.start(dtype, data.len())?;
    kernels::wide_size(dtype)?;
    if n == 1 {
        return Ok(());
    }
    if let Some(native) = ctx.native() {
        if native.supports(NativeOp::AllReduce, dtype, Some(reduce)) {
            ctx.record_algorithm("native");
            return native.all_reduce(data, dtype, reduce);
        }
    }
    let algorithm = ctx.settings.all_reduce(data.len(), n);
    ctx.record_algorithm(algorithm.name());
    match algorithm {
        Algorithm::RecursiveDoubling => recursive_doubling::run(ctx, data, dtype, reduce),
        Algorithm::HalvingDoubling => halving_doubling::run(ctx, data, dtype, reduce),
        Algorithm::Ring | Algorithm::RankOrderRing => {
            let seat = ctx.ring_seat(algorithm);
            ctx.record_ring(&seat);
            let segment_bytes = ctx.segment_bytes(data.len(), dtype.size());
            ring::run(ctx, seat, data, dtype, reduce, segment_bytes)
        }
        Algorithm::Direct => {
            let segment_bytes = ctx.segment_bytes(data.len(), dtype.size());
            direct::run(ctx, data, dtype, reduce, segment_bytes)
        }
        Algorithm::BidirectionalChain => match ctx.chain() {
            Some(path) => {
                let segment_bytes = ctx.segment_bytes(data.len(), dtype.size());
                bidirectional_chain::run(ctx, path, data, dtype, reduce, segment_bytes)
            }
            None => Err(CollectiveError::unsupported(
                "all_reduce with bidirectional_chain needs a group cabled in a line, and this \
                 group is not (see ProcessGroup::supports_algorithm)",
            )),
        },
        Algorithm::TwoLevel => match ctx.islands() {
            Some(islands) => two_level::run(ctx, islands, data, dtype, reduce),
            None => Err(CollectiveError::unsupported(
                "all_reduce with two_level needs islands of cables, and this group has none \
                 (see ProcessGroup::supports_algorithm)",
            )),
        },
        Algorithm::OneSidedRing => {
            let prepared = match prepared {
                Some(prepared) => prepared,
                None => one_sided::prepare(ctx)?,
            };
            let segment_bytes = ctx.segment_bytes(data.len(), dtype.size());
            one_sided::run(ctx, prepared, data, dtype, reduce, segment_bytes)
        }
        other => Err(CollectiveError::invalid(format!(
            "algorithm {other} does not apply to all_reduce"
        ))),
    }
}
