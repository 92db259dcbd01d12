//! All-to-all: every rank's buffer is n equal blocks; block `j` of rank `i` ends as block `i`
//! of rank `j`.

pub(crate) mod pairwise;

use crate::layout::Blocks;
use crate::op::OpCtx;
use crate::{CollectiveError, DType, Result};

/// Exchanges the blocks of `send` (elements of `dtype`); returns the received blocks.
pub(crate) fn run(ctx: &OpCtx<'_>, send: &[u8], dtype: DType) -> Result<Vec<u8>> {
    ctx.start(dtype, send.len())?;
    ctx.record_algorithm("pairwise");
    let n = ctx.size() as usize;
    let esize = dtype.size();
    let count = send.len() / esize;
    if count % n != 0 {
        return Err(CollectiveError::invalid(format!(
            "all_to_all needs a multiple of {n} elements (one block per rank), got {count}"
        )));
    }
    let mut recv = vec![0u8; send.len()];
    pairwise::run(
        ctx,
        send,
        &mut recv,
        esize,
        Blocks::Equal { len: count / n },
    )?;
    Ok(recv)
}
