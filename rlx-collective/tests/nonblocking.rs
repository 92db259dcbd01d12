//! Non-blocking collectives: many operations in flight on one group at once, issued in the
//! same order everywhere, never exchange each other's bytes.

mod common;

use std::sync::Arc;

use rlx_collective::{CollectiveError, DType, ReduceKind};

/// Sizes of the eight concurrent all-reduces: small ones take recursive doubling, large ones
/// the segmented ring.
const SIZES: [usize; 8] = [1, 7, 100, 1000, 9000, 3, 20_000, 13];

fn contribution(rank: u32, round: u32, slot: usize, count: usize) -> Vec<f32> {
    // Small integers keep every sum exact in f32, so equality is the right check.
    (0..count)
        .map(|i| ((rank as usize * 31 + round as usize * 7 + slot * 3 + i) % 97) as f32)
        .collect()
}

#[test]
fn eight_all_reduces_in_flight_for_200_rounds() {
    let world = 4u32;
    let results = common::on_each(common::world(world), move |group| {
        let group = Arc::new(group);
        for round in 0..200u32 {
            let handles: Vec<_> = SIZES
                .iter()
                .enumerate()
                .map(|(slot, &count)| {
                    let data = contribution(group.rank(), round, slot, count);
                    group.spawn_all_reduce(data, ReduceKind::Sum)
                })
                .collect();
            for (slot, handle) in handles.into_iter().enumerate() {
                let got = handle.join()?;
                let count = SIZES[slot];
                let mut want = vec![0f32; count];
                for r in 0..world {
                    for (w, x) in want.iter_mut().zip(contribution(r, round, slot, count)) {
                        *w += x;
                    }
                }
                assert_eq!(got, want, "round {round} slot {slot}");
            }
        }
        Ok::<_, CollectiveError>(())
    });
    for r in results {
        r.unwrap();
    }
}

#[test]
fn different_collectives_in_flight_together() {
    let world = 3u32;
    let results = common::on_each(common::world(world), move |group| {
        let me = group.rank() as u8;
        for round in 0..20u8 {
            let gather = group.spawn_all_gather_typed(vec![me, round], DType::U8);
            let bcast = group.spawn_broadcast_typed(1, vec![me; 5], DType::I8);
            let reduce =
                group.spawn_all_reduce_typed(vec![me, 1, round], DType::U8, ReduceKind::Max);
            let barrier = group.spawn_barrier();
            let a2a = group.spawn_all_to_all_typed(vec![me, me, me], DType::U8);
            let scatter = group.spawn_scatter_typed(2, vec![10, 11, 12, 13, 14, 15], 2, DType::U8);
            // A blocking collective issued while the others are still running.
            let mut x = [f32::from(me)];
            group.all_reduce(&mut x, ReduceKind::Sum)?;
            assert_eq!(x, [3.0]);
            assert_eq!(gather.join()?, vec![0, round, 1, round, 2, round]);
            assert_eq!(bcast.join()?, vec![1; 5]);
            assert_eq!(reduce.join()?, vec![2, 1, round]);
            barrier.join()?;
            assert_eq!(a2a.join()?, vec![0, 1, 2]);
            assert_eq!(scatter.join()?, vec![10 + 2 * me, 11 + 2 * me]);
        }
        Ok::<_, CollectiveError>(())
    });
    for r in results {
        r.unwrap();
    }
}

#[test]
fn join_reports_errors_instead_of_panicking() {
    let results = common::on_each(common::world(2), |group| {
        group
            .spawn_all_reduce_typed(vec![0u8; 3], DType::F32, ReduceKind::Sum)
            .join()
    });
    for r in results {
        assert!(
            matches!(r, Err(CollectiveError::InvalidArgument { .. })),
            "{r:?}"
        );
    }
}
