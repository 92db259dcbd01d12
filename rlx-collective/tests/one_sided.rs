//! The one-sided all-reduce (`Algorithm::OneSidedRing`) over in-process worlds with a
//! symmetric heap: the conformance matrix (every dtype × reduction × awkward size, worlds
//! 1..=8, against the serial reference and identical on all ranks), segments bounded by the
//! scratch region, bit-identity with the two-sided ring, many consecutive and concurrent
//! operations sharing the signal words, and the errors: no heap, sub-groups, mismatched
//! lengths, a lost peer.

mod common;

use std::sync::Arc;
use std::time::Duration;

use rlx_collective::conformance::{self, ConformanceOptions, DEFAULT_SIZES};
use rlx_collective::select::MIN_ONE_SIDED_REGION_BYTES;
use rlx_collective::{
    Algorithm, CollectiveError, CollectiveOp, DType, MemTransport, ProcessGroup, ReduceKind,
    Transport,
};

/// The world groups of an `n`-rank in-process world whose ranks each have a symmetric heap of
/// `heap_bytes`, with the operation timeout `timeout`.
fn heap_world_with_timeout(n: u32, heap_bytes: u64, timeout: Duration) -> Vec<ProcessGroup> {
    MemTransport::fan_out_symmetric_with_timeout(n, heap_bytes, timeout)
        .expect("an in-process world with a heap")
        .into_iter()
        .map(|t| ProcessGroup::new(t as Arc<dyn Transport>))
        .collect()
}

fn heap_world(n: u32, heap_bytes: u64) -> Vec<ProcessGroup> {
    heap_world_with_timeout(n, heap_bytes, common::TEST_TIMEOUT)
}

fn force_one_sided(group: &ProcessGroup) {
    group
        .set_algorithm(CollectiveOp::AllReduce, Algorithm::OneSidedRing)
        .expect("a world group with a heap runs the one-sided all-reduce");
}

/// Runs the all-reduce conformance cases (every algorithm, the one-sided one included) on a
/// world with a heap of `heap_bytes` and checks that one-sided cases ran and passed.
fn conformance_on_heap(world: u32, heap_bytes: u64, sizes: Vec<usize>, cap: Option<usize>) {
    let options = ConformanceOptions {
        ops: vec![CollectiveOp::AllReduce],
        sizes,
        algorithms: true,
        max_segment_bytes: cap,
        seed: 0x0E5,
        ..ConformanceOptions::default()
    };
    let reports = common::on_each(heap_world(world, heap_bytes), move |group| {
        // The algorithms this group runs: all but those that follow cables it does not have.
        let algorithms = CollectiveOp::AllReduce
            .algorithms()
            .iter()
            .filter(|&&a| group.supports_algorithm(CollectiveOp::AllReduce, a))
            .count();
        (algorithms, conformance::run(&group, &options))
    });
    for (algorithms, report) in reports {
        let report = report.unwrap_or_else(|e| panic!("world {world}: the run failed: {e}"));
        assert!(report.passed(), "world {world}: {}", report.summary());
        let one_sided = report
            .cases()
            .iter()
            .filter(|c| c.algorithm == Algorithm::OneSidedRing)
            .count();
        assert!(
            algorithms >= 5,
            "world {world}: only {algorithms} algorithms run"
        );
        assert_eq!(
            one_sided * algorithms,
            report.cases().len(),
            "world {world}: the one-sided algorithm did not run every case"
        );
    }
}

macro_rules! world_tests {
    ($($name:ident: $n:expr),* $(,)?) => {
        mod conformance_matrix {
            use super::*;
            $(
                /// A 64 KiB heap gives a 32 KiB region: 65537 elements take several segments
                /// because the region, not the segment setting, bounds them.
                #[test]
                fn $name() {
                    conformance_on_heap($n, 64 << 10, DEFAULT_SIZES.to_vec(), None);
                }
            )*
        }
        mod capped_segments {
            use super::*;
            $(
                #[test]
                fn $name() {
                    conformance_on_heap($n, 1 << 20, vec![1000, 4099], Some(96));
                }
            )*
        }
    };
}

world_tests!(
    world_1: 1,
    world_2: 2,
    world_3: 3,
    world_4: 4,
    world_5: 5,
    world_6: 6,
    world_7: 7,
    world_8: 8,
);

/// Deterministic `f32` input of `rank` for round `round`, with values whose sums round.
fn input(rank: u32, round: u32, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| {
            let x = (i as u32).wrapping_mul(2_654_435_761) ^ rank.wrapping_mul(40_503) ^ round;
            (x % 20_011) as f32 / 7.0 - 1000.0
        })
        .collect()
}

/// With the smallest region every slot holds one element, so 1000 elements take hundreds of
/// segments; the result equals the two-sided ring's bit for bit (same chain, same kernels).
#[test]
fn tiny_region_many_segments_match_the_ring_bit_for_bit() {
    let results = common::on_each(heap_world(3, 1 << 16), |group| {
        group.enable_one_sided(MIN_ONE_SIDED_REGION_BYTES)?;
        let mut all = Vec::new();
        for (round, dtype) in [DType::F16, DType::F32, DType::F64, DType::I8]
            .into_iter()
            .enumerate()
        {
            let len = 1000 * dtype.size();
            let original: Vec<u8> = (0..len)
                .map(|i| (i as u32 * 31 + group.rank() * 7 + round as u32) as u8 & 0x3F)
                .collect();
            let mut one_sided = original.clone();
            force_one_sided(&group);
            group.all_reduce_typed(&mut one_sided, dtype, ReduceKind::Sum)?;
            let mut ring = original;
            group.set_algorithm(CollectiveOp::AllReduce, Algorithm::Ring)?;
            group.all_reduce_typed(&mut ring, dtype, ReduceKind::Sum)?;
            assert_eq!(one_sided, ring, "{dtype}: one-sided and ring differ");
            all.push(one_sided);
        }
        Ok::<_, CollectiveError>(all)
    });
    let results: Vec<_> = results.into_iter().map(|r| r.unwrap()).collect();
    assert!(results.windows(2).all(|w| w[0] == w[1]));
}

/// Hundreds of one-sided operations in a row, of changing lengths and interleaved with
/// two-sided collectives, reuse the same signal words and slots without a reset.
#[test]
fn many_consecutive_operations_reuse_the_signals() {
    let n = 4u32;
    let results = common::on_each(heap_world(n, 1 << 16), move |group| {
        force_one_sided(&group);
        for round in 0..300u32 {
            let len = [0usize, 1, 5, 64, 333, 4097][round as usize % 6];
            let mut data: Vec<f32> = (0..len).map(|i| (i as u32 + round) as f32).collect();
            data.iter_mut().for_each(|x| *x += group.rank() as f32);
            group.all_reduce(&mut data, ReduceKind::Sum)?;
            let rank_sum = (n * (n - 1) / 2) as f32;
            for (i, x) in data.iter().enumerate() {
                let want = n as f32 * (i as u32 + round) as f32 + rank_sum;
                assert_eq!(*x, want, "round {round}, element {i}");
            }
            if round % 50 == 0 {
                group.barrier()?;
                let gathered = group.all_gather(&[round as f32])?;
                assert_eq!(gathered, vec![round as f32; n as usize]);
            }
        }
        Ok::<_, CollectiveError>(())
    });
    for r in results {
        r.unwrap();
    }
}

/// Several one-sided operations in flight on one group at once run one at a time in issue
/// order on every rank, whichever thread gets there first.
#[test]
fn concurrent_spawned_operations_take_turns() {
    let n = 3u32;
    let results = common::on_each(heap_world(n, 1 << 16), move |group| {
        force_one_sided(&group);
        let group = Arc::new(group);
        let handles: Vec<_> = (0..8u32)
            .map(|k| group.spawn_all_reduce(input(group.rank(), k, 5000), ReduceKind::Max))
            .collect();
        let mut blocking = input(group.rank(), 99, 300);
        group.all_reduce(&mut blocking, ReduceKind::Min)?;
        let mut results = Vec::new();
        for h in handles {
            results.push(h.join()?);
        }
        results.push(blocking);
        Ok::<_, CollectiveError>(results)
    });
    for results in results {
        let results = results.unwrap();
        for (k, got) in results[..8].iter().enumerate() {
            let want: Vec<f32> = (0..5000)
                .map(|i| {
                    (0..n)
                        .map(|r| input(r, k as u32, 5000)[i])
                        .fold(f32::MIN, f32::max)
                })
                .collect();
            assert_eq!(got, &want, "spawned operation {k}");
        }
        let want: Vec<f32> = (0..300)
            .map(|i| {
                (0..n)
                    .map(|r| input(r, 99, 300)[i])
                    .fold(f32::MAX, f32::min)
            })
            .collect();
        assert_eq!(results[8], want);
    }
}

#[test]
fn a_transport_without_a_heap_is_unsupported() {
    let results = common::on_each(common::world(2), |group| {
        assert!(!group.supports_algorithm(CollectiveOp::AllReduce, Algorithm::OneSidedRing));
        let forced = group.set_algorithm(CollectiveOp::AllReduce, Algorithm::OneSidedRing);
        let enabled = group.enable_one_sided(1 << 16);
        // The group still works, and the refused override changed nothing.
        let mut x = [group.rank() as f32 + 1.0];
        group.all_reduce(&mut x, ReduceKind::Sum).unwrap();
        assert_eq!(x, [3.0]);
        assert_eq!(group.algorithm(CollectiveOp::AllReduce), Algorithm::Auto);
        // An operation without the algorithm is a wrong argument, heap or no heap.
        let wrong_op = group.set_algorithm(CollectiveOp::Broadcast, Algorithm::OneSidedRing);
        assert!(matches!(
            wrong_op,
            Err(CollectiveError::InvalidArgument { .. })
        ));
        (forced, enabled)
    });
    for (forced, enabled) in results {
        for err in [forced.unwrap_err(), enabled.unwrap_err()] {
            match &err {
                CollectiveError::Unsupported { what } => {
                    assert!(what.contains("symmetric heap"), "{err}");
                }
                other => panic!("expected Unsupported, got {other}"),
            }
        }
    }
}

#[test]
fn the_algorithm_applies_to_all_reduce_only() {
    let group = heap_world(1, 1 << 12).remove(0);
    let err = group
        .set_algorithm(CollectiveOp::AllGather, Algorithm::OneSidedRing)
        .unwrap_err();
    assert!(
        matches!(err, CollectiveError::InvalidArgument { .. }),
        "{err}"
    );
    assert!(!group.supports_algorithm(CollectiveOp::Broadcast, Algorithm::OneSidedRing));
    assert!(group.supports_algorithm(CollectiveOp::AllReduce, Algorithm::OneSidedRing));
}

#[test]
fn sub_groups_are_unsupported() {
    let results = common::on_each(heap_world(4, 1 << 16), |group| {
        let sub = group
            .split(Some(group.rank() % 2), 0)?
            .expect("every rank has a color");
        let refused = sub.set_algorithm(CollectiveOp::AllReduce, Algorithm::OneSidedRing);
        // The world group of the same transport still runs it.
        force_one_sided(&group);
        let mut x = [1.0f32; 10];
        group.all_reduce(&mut x, ReduceKind::Sum)?;
        assert_eq!(x, [4.0; 10]);
        Ok::<_, CollectiveError>(refused)
    });
    for r in results {
        let err = r.unwrap().unwrap_err();
        assert!(matches!(err, CollectiveError::Unsupported { .. }), "{err}");
    }
}

#[test]
fn a_region_below_the_minimum_is_refused_everywhere() {
    let results = common::on_each(heap_world(2, 1 << 16), |group| {
        let small = group.enable_one_sided(MIN_ONE_SIDED_REGION_BYTES - 8);
        let too_big = group.enable_one_sided(1 << 20);
        // After both refusals the group lazily allocates its default and works.
        force_one_sided(&group);
        let mut x = [2.0f32; 3];
        group.all_reduce(&mut x, ReduceKind::Product)?;
        assert_eq!(x, [4.0; 3]);
        Ok::<_, CollectiveError>((small, too_big))
    });
    for r in results {
        let (small, too_big) = r.unwrap();
        assert!(matches!(
            small,
            Err(CollectiveError::InvalidArgument { .. })
        ));
        assert!(matches!(
            too_big,
            Err(CollectiveError::InvalidArgument { .. })
        ));
    }
}

/// A rank passing another length makes every rank fail with `LengthMismatch`, and
/// the next one-sided operation on the group succeeds.
#[test]
fn mismatched_lengths_fail_every_rank_and_leave_the_group_usable() {
    let results = common::on_each(heap_world(3, 1 << 16), |group| {
        force_one_sided(&group);
        let len = if group.rank() == 1 { 11 } else { 10 };
        let mut x = vec![1.0f32; len];
        let mismatch = group.all_reduce(&mut x, ReduceKind::Sum);
        let mut y = vec![1.0f32; 1000];
        group.all_reduce(&mut y, ReduceKind::Sum)?;
        assert_eq!(y, vec![3.0; 1000]);
        Ok::<_, CollectiveError>(mismatch)
    });
    for r in results {
        let mismatch = r.unwrap();
        assert!(
            matches!(mismatch, Err(CollectiveError::LengthMismatch { .. })),
            "{mismatch:?}"
        );
    }
}

/// A rank that is gone makes the others fail with an error, never hang.
#[test]
fn a_lost_peer_fails_the_operation() {
    let mut groups = heap_world_with_timeout(3, 1 << 16, Duration::from_secs(3));
    drop(groups.pop());
    let results = common::on_each(groups, |group| {
        force_one_sided(&group);
        let mut x = vec![1.0f32; 100];
        group.all_reduce(&mut x, ReduceKind::Sum)
    });
    for r in results {
        let err = r.unwrap_err();
        assert!(err.is_fatal(), "{err}");
    }
}

/// A rank whose buffer is refused before any byte moves — here in the very first one-sided
/// operation, which also allocates the region — makes the others fail with its notice, not
/// with a timeout, and the group goes on.
#[test]
fn a_refused_buffer_on_one_rank_fails_the_others_promptly() {
    let results = common::on_each(heap_world(3, 1 << 16), |group| {
        force_one_sided(&group);
        let mut bytes = vec![0u8; if group.rank() == 1 { 6 } else { 8 }];
        let refused = group.all_reduce_typed(&mut bytes, DType::F32, ReduceKind::Sum);
        let mut x = [1.0f32; 7];
        group.all_reduce(&mut x, ReduceKind::Sum)?;
        assert_eq!(x, [3.0; 7]);
        Ok::<_, CollectiveError>(refused)
    });
    for (rank, r) in results.into_iter().enumerate() {
        let err = r.unwrap().unwrap_err();
        if rank == 1 {
            assert!(
                matches!(err, CollectiveError::InvalidArgument { .. }),
                "{err}"
            );
        } else {
            assert!(!err.is_fatal(), "rank {rank}: {err}");
        }
    }
}
