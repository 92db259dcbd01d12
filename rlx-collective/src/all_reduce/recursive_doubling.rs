//! Latency-optimal all-reduce for small buffers: recursive doubling, with the usual fold for a
//! world that is not a power of two.
//!
//! With p the largest power of two not above n and rem = n - p, the first 2·rem ranks pair up:
//! each even one hands its buffer to its odd neighbour and waits for the result. The p
//! remaining ranks then exchange whole accumulators with partner `v XOR 2^k` for k in
//! 0..log2 p. Both partners of an exchange combine the same two operands, and the combine is
//! commutative bit for bit, so all p ranks hold the same accumulator; they narrow it
//! identically and the odd ranks pass the narrow result back to their even neighbours.

use crate::layout::PowerOfTwoFold;
use crate::op::OpCtx;
use crate::{DType, ReduceKind, Result, kernels};

/// All-reduces `data` in place over at least two ranks.
pub(crate) fn run(
    ctx: &OpCtx<'_>,
    data: &mut [u8],
    dtype: DType,
    reduce: ReduceKind,
) -> Result<()> {
    let n = ctx.size();
    let r = ctx.rank;
    let wsize = kernels::wide_size(dtype)?;
    let wide_len = data.len() / dtype.size() * wsize;
    let fold = PowerOfTwoFold::of(n);

    let mut acc = vec![0u8; wide_len];
    kernels::widen(dtype, data, &mut acc)?;
    let mut incoming = vec![0u8; wide_len];

    // The fold: even ranks of its pairs sit out the exchange.
    let Some(virtual_rank) = fold.virtual_rank(r) else {
        ctx.send(r + 1, &acc)?;
        ctx.recv_into(r + 1, data)?;
        return Ok(());
    };
    if fold.pairs(r) {
        ctx.recv_into(r - 1, &mut incoming)?;
        kernels::accumulate_wide(dtype, reduce, &mut acc, &incoming)?;
    }

    let mut mask = 1u32;
    while mask < fold.pof2 {
        let partner = fold.real_rank(virtual_rank ^ mask);
        ctx.send_recv_into(partner, &acc, partner, &mut incoming)?;
        kernels::accumulate_wide(dtype, reduce, &mut acc, &incoming)?;
        mask <<= 1;
    }
    kernels::finish(dtype, reduce, n, &acc, data)?;
    if fold.pairs(r) {
        ctx.send(r - 1, data)?;
    }
    Ok(())
}
