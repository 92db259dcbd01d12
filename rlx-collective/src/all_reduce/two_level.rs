//! Two-level all-reduce for islands of cables joined by a slower network (see
//! [`crate::islands`]): Thunderbolt meshes of Macs joined by Ethernet, say.
//!
//! With m islands of k ranks each and a buffer of S bytes:
//! 1. inside each island, a ring reduce-scatter over the island's cables leaves rank `j` of the
//!    island (its `j`-th lowest) with block `j` (of k) of the island's sum;
//! 2. rank `j` of every island all-reduces its block with the ranks `j` of the other islands,
//!    over the slow network: S/k bytes, every rank of an island on its own block at once;
//! 3. inside each island, a ring all-gather of the finished blocks.
//!
//! Each rank's slow link so carries 2(m-1)/m · S/k where a flat ring puts 2(n-1)/n · S on the
//! hops that cross between islands; the cables carry what a ring of k ranks does.
//!
//! The results are those of a flat plan: block `j` leaves step 1 in the wide accumulation type
//! (f32 for the half floats, i64 for the integers), is reduced across in that type, and is
//! narrowed (rounded, saturated, divided for a mean by all n ranks) once, by each rank `j` from
//! the same accumulators; step 3 copies the narrowed bytes, so every rank of the group ends
//! bit-identical. For f32, f64 and i64, whose accumulators are their elements, the levels run
//! in place with no buffer of their own (a mean still goes through one, to divide once).
//!
//! Each level is an [`OpCtx`] of its own ranks and phase ([`OpCtx::within`]), so the flat
//! algorithms run unchanged on it, and a failure on any level reaches the whole group.

use crate::islands::Islands;
use crate::layout::{self, Blocks};
use crate::op::OpCtx;
use crate::select::{Algorithm, SMALL_MESSAGE_BYTES};
use crate::{CollectiveError, DType, ReduceKind, Result, kernels};

/// The phase of the all-reduce across the islands.
const ACROSS_PHASE: u16 = 1;
/// The phase of the all-gather inside each island.
const GATHER_PHASE: u16 = 2;

/// All-reduces `data` in place over a group with `islands` (every member's seat known).
pub(crate) fn run(
    ctx: &OpCtx<'_>,
    islands: &Islands,
    data: &mut [u8],
    dtype: DType,
    reduce: ReduceKind,
) -> Result<()> {
    let seat = islands.seat(ctx.rank).ok_or_else(|| {
        CollectiveError::invalid(format!(
            "two_level all-reduce: rank {} is in none of the islands {islands}",
            ctx.rank
        ))
    })?;
    let esize = dtype.size();
    let blocks = Blocks::Balanced {
        count: data.len() / esize,
        parts: islands.island_size(),
    };
    let island_ring = islands.ring_of(seat.island).ok_or_else(|| {
        CollectiveError::invalid(format!(
            "two_level all-reduce: no ring for island {}",
            seat.island
        ))
    })?;
    let island_members = ctx.world_ranks(islands.island(seat.island))?;
    let local = seat.local as u32;
    let inside = ctx.within(&island_members, local, 0, island_ring);
    let seat_inside = inside.ring_seat(Algorithm::Ring);
    let segment_bytes = inside.segment_bytes(data.len(), esize);
    let across_members = ctx.world_ranks(&islands.across(seat.local))?;
    let across = ctx.within(
        &across_members,
        seat.island as u32,
        ACROSS_PHASE,
        islands.ring_across(),
    );
    let mine = layout::bytes(blocks.block(seat.local), esize);

    if kernels::accumulates_in_kind(dtype) && reduce != ReduceKind::Mean {
        let in_place = crate::reduce_scatter::Data::InPlace(&mut *data);
        crate::reduce_scatter::ring::run(
            &inside,
            seat_inside,
            in_place,
            dtype,
            reduce,
            segment_bytes,
        )?;
        all_reduce_across(&across, &mut data[mine], dtype, reduce)?;
    } else {
        let wide_dtype = kernels::wide_dtype(dtype);
        let mut wide = vec![0u8; mine.len() / esize * wide_dtype.size()];
        let summed = if reduce == ReduceKind::Mean {
            ReduceKind::Sum
        } else {
            reduce
        };
        crate::reduce_scatter::ring::run_wide(
            &inside,
            seat_inside,
            data,
            &mut wide,
            dtype,
            summed,
            segment_bytes,
        )?;
        all_reduce_across(&across, &mut wide, wide_dtype, summed)?;
        kernels::finish(dtype, reduce, ctx.size(), &wide, &mut data[mine])?;
    }

    let gather = ctx.within(&island_members, local, GATHER_PHASE, island_ring);
    crate::all_gather::ring::run(&gather, seat_inside, data, esize, blocks, segment_bytes)
}

/// All-reduces `block` with the ranks of `across`: recursive doubling when it is small, the
/// ring otherwise.
fn all_reduce_across(
    across: &OpCtx<'_>,
    block: &mut [u8],
    dtype: DType,
    reduce: ReduceKind,
) -> Result<()> {
    if block.len() <= SMALL_MESSAGE_BYTES {
        return super::recursive_doubling::run(across, block, dtype, reduce);
    }
    let segment_bytes = across.segment_bytes(block.len(), dtype.size());
    let seat = across.ring_seat(Algorithm::Ring);
    super::ring::run(across, seat, block, dtype, reduce, segment_bytes)
}
