//! All-to-all: every rank's buffer is n equal blocks; block `j` of rank `i` ends as block `i`
//! of rank `j`.

pub(crate) mod direct;
pub(crate) mod pairwise;

use crate::layout::Blocks;
use crate::op::OpCtx;
use crate::select::Algorithm;
use crate::{CollectiveError, DType, Result};

/// Exchanges the blocks of `send` (elements of `dtype`) into `recv`, of the same length.
pub(crate) fn run(ctx: &OpCtx<'_>, send: &[u8], recv: &mut [u8], dtype: DType) -> Result<()> {
    ctx.start(dtype, send.len())?;
    let n = ctx.size() as usize;
    let esize = dtype.size();
    let count = send.len() / esize;
    if count % n != 0 {
        return Err(CollectiveError::invalid(format!(
            "all_to_all needs a multiple of {n} elements (one block per rank), got {count}"
        )));
    }
    if recv.len() != send.len() {
        return Err(CollectiveError::invalid(format!(
            "all_to_all output holds {} bytes; it must match the {} bytes sent",
            recv.len(),
            send.len()
        )));
    }
    let blocks = Blocks::Equal { len: count / n };
    let algorithm = ctx.settings.all_to_all(send.len());
    ctx.record_algorithm(algorithm.name());
    match algorithm {
        Algorithm::Direct => direct::run(ctx, send, recv, esize, blocks),
        Algorithm::Pairwise => pairwise::run(ctx, send, recv, esize, blocks),
        other => Err(CollectiveError::invalid(format!(
            "algorithm {other} does not apply to all_to_all"
        ))),
    }
}
