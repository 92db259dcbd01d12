//! Error behaviour: a rank passing another length (or dtype) makes every rank fail with
//! `LengthMismatch` promptly instead of hanging, the group stays usable afterwards, and bad
//! arguments (reserved tags, unknown ranks, ragged typed buffers) are refused.

mod common;

use std::time::Duration;

use rlx_collective::{
    Algorithm, CollectiveError, CollectiveOp, DType, ProcessGroup, ReduceKind, TAG_RESERVED_BASE,
};

/// Short enough that a hang shows as a `Timeout` error (which fails the assertions below),
/// long enough for a loaded machine to deliver the failure notices first.
const OP_TIMEOUT: Duration = Duration::from_secs(20);

/// Checks that every rank failed with a `LengthMismatch` that names a collective (not the
/// transport's receive it came through) and the rank whose length differs, `odd`, in its text
/// too, with what that rank passed in elements of the operation's type. In a world of two
/// neither stands apart: each rank names the other.
fn assert_length_mismatch(results: Vec<Result<(), CollectiveError>>, what: &str, odd: u32) {
    let world = results.len() as u32;
    for (rank, result) in (0u32..).zip(results) {
        let named = if world == 2 { 1 - rank } else { odd };
        match result {
            Err(
                ref error @ CollectiveError::LengthMismatch {
                    op,
                    peer: Some(peer),
                    ..
                },
            ) if op != "recv" && peer == named => {
                let text = error.to_string();
                assert!(
                    text.starts_with(&format!(
                        "{op}: length mismatch with rank {peer}: it passed "
                    )) && text.contains(" elements where "),
                    "{what}: rank {rank}: {text}"
                );
            }
            other => panic!(
                "{what}: rank {rank} got {other:?}, expected LengthMismatch naming the \
                 operation and rank {named}"
            ),
        }
    }
}

/// The example of the error text: 1000 against 1001 `f32`s on two ranks, then on four
/// ranks, where every rank names the one whose length differs, whether it found the mismatch
/// or heard of it.
#[test]
fn a_length_mismatch_says_which_operation_and_which_rank() {
    let results = common::on_each(common::world_with_timeout(2, OP_TIMEOUT), move |group| {
        let mut x = vec![1.0f32; 1000 + group.rank() as usize];
        group.all_reduce(&mut x, ReduceKind::Sum)
    });
    let expected = [
        "all_reduce: length mismatch with rank 1: it passed 1001 f32 elements where rank 0 \
         passed 1000 f32 elements",
        "all_reduce: length mismatch with rank 0: it passed 1000 f32 elements where rank 1 \
         passed 1001 f32 elements",
    ];
    for (rank, result) in results.iter().enumerate() {
        let text = result.as_ref().err().map(ToString::to_string);
        assert_eq!(text.as_deref(), Some(expected[rank]), "rank {rank}");
    }
    rank_2_stands_apart(common::world_with_timeout(4, OP_TIMEOUT), "in process");
    // The same over TCP, where the notices that carry the lengths cross sockets.
    #[cfg(feature = "tcp")]
    rank_2_stands_apart(
        common::tcp_world(4, common::free_port(), |rank, n, port| {
            common::loopback_builder(rank, n, port, OP_TIMEOUT)
        }),
        "over TCP",
    );
}

/// Four ranks all-reduce 100 000 `f32`s but rank 2 passes one more: every rank names it.
fn rank_2_stands_apart(groups: Vec<ProcessGroup>, what: &str) {
    let results = common::on_each(groups, move |group| {
        let count = if group.rank() == 2 { 100_001 } else { 100_000 };
        group.all_reduce(&mut vec![1.0f32; count], ReduceKind::Sum)
    });
    for (rank, result) in results.iter().enumerate() {
        let text = result.as_ref().err().map(ToString::to_string);
        assert_eq!(
            text.as_deref(),
            Some(
                "all_reduce: length mismatch with rank 2: it passed 100001 f32 elements where \
                 ranks 0, 1, 3 passed 100000 f32 elements"
            ),
            "{what}: rank {rank}"
        );
    }
}

/// After a failed operation the group must still work: a correct all-reduce follows.
fn then_all_reduce_works(group: &ProcessGroup) {
    let mut x = vec![1.0f32; 100];
    group
        .all_reduce(&mut x, ReduceKind::Sum)
        .unwrap_or_else(|e| panic!("rank {}: all_reduce after a failure: {e}", group.rank()));
    assert_eq!(x, vec![group.world_size() as f32; 100]);
}

#[test]
fn mismatched_all_reduce_lengths_fail_on_every_rank() {
    // (normal count, odd rank's count): same algorithm, and counts on both sides of the
    // recursive-doubling/ring crossover so the ranks disagree on the algorithm too.
    let shapes = [
        (1000usize, 1001usize),
        (1000, 999),
        (7, 100_000),
        (100_000, 3),
        (0, 1),
    ];
    for world in [2u32, 3, 4, 5] {
        for algorithm in [
            Algorithm::Auto,
            Algorithm::Ring,
            Algorithm::RecursiveDoubling,
        ] {
            for (normal, odd) in shapes {
                let odd_rank = world - 1;
                let results = common::on_each(
                    common::world_with_timeout(world, OP_TIMEOUT),
                    move |group| {
                        group
                            .set_algorithm(CollectiveOp::AllReduce, algorithm)
                            .unwrap();
                        let count = if group.rank() == odd_rank {
                            odd
                        } else {
                            normal
                        };
                        let mut x = vec![1.0f32; count];
                        let result = group.all_reduce(&mut x, ReduceKind::Sum);
                        then_all_reduce_works(&group);
                        result
                    },
                );
                assert_length_mismatch(
                    results,
                    &format!("world {world} {algorithm} {normal} vs {odd}"),
                    odd_rank,
                );
            }
        }
    }
}

#[test]
fn mismatched_dtype_fails_on_every_rank() {
    let results = common::on_each(common::world_with_timeout(4, OP_TIMEOUT), |group| {
        let dtype = if group.rank() == 2 {
            DType::F64
        } else {
            DType::F32
        };
        let mut x = vec![0u8; 64 * dtype.size()];
        let result = group.all_reduce_typed(&mut x, dtype, ReduceKind::Max);
        then_all_reduce_works(&group);
        result
    });
    assert_length_mismatch(results, "f32 vs f64", 2);
}

#[test]
fn mismatched_all_gather_lengths_fail_on_every_rank() {
    for algorithm in [Algorithm::Ring, Algorithm::Bruck] {
        let results = common::on_each(common::world_with_timeout(5, OP_TIMEOUT), move |group| {
            group
                .set_algorithm(CollectiveOp::AllGather, algorithm)
                .unwrap();
            let count = if group.rank() == 1 { 9 } else { 8 };
            let result = group.all_gather(&vec![1.0f32; count]).map(|_| ());
            then_all_reduce_works(&group);
            result
        });
        assert_length_mismatch(results, &format!("all_gather {algorithm}"), 1);
    }
}

#[test]
fn mismatched_broadcast_fails_the_rank_that_differs_and_nobody_hangs() {
    // In a tree only the subtree below the odd rank depends on it; the odd rank itself must
    // see the mismatch and every rank must return.
    let results = common::on_each(common::world_with_timeout(4, OP_TIMEOUT), |group| {
        let count = if group.rank() == 3 { 5 } else { 4 };
        let mut x = vec![group.rank() as f32; count];
        let result = group.broadcast(0, &mut x);
        then_all_reduce_works(&group);
        result
    });
    assert!(matches!(
        results[3],
        Err(CollectiveError::LengthMismatch { .. })
    ));
    for r in &results {
        assert!(!matches!(r, Err(CollectiveError::Timeout { .. })), "{r:?}");
    }
}

#[test]
fn reserved_user_tags_are_invalid_arguments() {
    let groups = common::world(2);
    let g = &groups[0];
    for tag in [TAG_RESERVED_BASE, TAG_RESERVED_BASE + 7, u32::MAX] {
        assert!(matches!(
            g.send_f32(1, tag, &[1.0]),
            Err(CollectiveError::InvalidArgument { .. })
        ));
        assert!(matches!(
            g.recv_f32(1, tag),
            Err(CollectiveError::InvalidArgument { .. })
        ));
        assert!(matches!(
            g.send_typed(1, tag, &[0; 4], DType::I32),
            Err(CollectiveError::InvalidArgument { .. })
        ));
    }
}

#[test]
fn point_to_point_round_trips_below_the_reserved_range() {
    let results = common::on_each(common::world(2), |group| {
        let tag = TAG_RESERVED_BASE - 1;
        if group.rank() == 0 {
            group.send_f32(1, tag, &[1.5, -2.0])?;
            group.send_typed(1, 3, &[1, 0, 2, 0], DType::U8)?;
            Ok::<_, CollectiveError>(Vec::new())
        } else {
            let a = group.recv_f32(0, tag)?;
            let b = group.recv_typed(0, 3, DType::U8)?;
            assert_eq!(b, vec![1, 0, 2, 0]);
            Ok(a)
        }
    });
    assert_eq!(results[1].as_ref().unwrap(), &vec![1.5, -2.0]);
    assert!(results[0].is_ok());
}

#[test]
fn unknown_ranks_are_refused() {
    let results = common::on_each(common::world(3), |group| {
        let p2p = group.send_f32(3, 0, &[1.0]);
        assert!(
            matches!(
                p2p,
                Err(CollectiveError::UnknownRank {
                    rank: 3,
                    world_size: 3
                })
            ),
            "{p2p:?}"
        );
        assert!(matches!(
            group.recv_f32(7, 0),
            Err(CollectiveError::UnknownRank { rank: 7, .. })
        ));
        let mut x = [1.0f32; 4];
        let bcast = group.broadcast(9, &mut x);
        let reduce = group.reduce(3, &mut x, ReduceKind::Sum);
        let gather = group.gather(5, &x).map(|_| ());
        then_all_reduce_works(&group);
        [bcast, reduce, gather]
    });
    for per_rank in results {
        for r in per_rank {
            assert!(
                matches!(r, Err(CollectiveError::UnknownRank { .. })),
                "{r:?}"
            );
        }
    }
}

#[test]
fn ragged_typed_buffers_are_invalid_arguments() {
    let results = common::on_each(common::world(3), |group| {
        let mut seven = [0u8; 7];
        let results = [
            group.all_reduce_typed(&mut seven, DType::F32, ReduceKind::Sum),
            group.broadcast_typed(0, &mut seven, DType::I64),
            group.all_gather_typed(&seven, DType::F16).map(|_| ()),
            group
                .reduce_scatter_typed(&seven, DType::BF16, ReduceKind::Sum)
                .map(|_| ()),
            group.send_typed((group.rank() + 1) % 3, 1, &seven, DType::I32),
            group.all_to_all_typed(&[0u8; 16], DType::F32).map(|_| ()),
        ];
        then_all_reduce_works(&group);
        results
    });
    for per_rank in results {
        for r in per_rank {
            assert!(
                matches!(r, Err(CollectiveError::InvalidArgument { .. })),
                "{r:?}"
            );
        }
    }
}

#[test]
fn a_forced_algorithm_must_exist_for_the_operation() {
    let groups = common::world(1);
    assert!(matches!(
        groups[0].set_algorithm(CollectiveOp::Broadcast, Algorithm::RecursiveDoubling),
        Err(CollectiveError::InvalidArgument { .. })
    ));
    assert_eq!(
        groups[0].algorithm(CollectiveOp::Broadcast),
        Algorithm::Auto
    );
}

/// `all_gather_into` fills the caller's buffer exactly as `all_gather` returns it, over world
/// sizes 1..=8 and awkward lengths; an output of the wrong length is refused on its rank, the
/// other ranks fail instead of waiting, and the group still works afterwards.
#[test]
fn all_gather_into_matches_all_gather_and_checks_its_output() {
    for world in 1u32..=8 {
        let results = common::on_each(
            common::world_with_timeout(world, OP_TIMEOUT),
            move |group| {
                for count in [0usize, 1, 7, 1000] {
                    let local: Vec<f32> = (0..count)
                        .map(|j| (group.rank() * 1000 + j as u32) as f32)
                        .collect();
                    let mut out = vec![f32::NAN; count * world as usize];
                    group.all_gather_into(&local, &mut out)?;
                    assert_eq!(
                        out,
                        group.all_gather(&local)?,
                        "world {world}, count {count}"
                    );
                }
                let mut short = vec![
                    0f32;
                    if group.rank() == 0 {
                        3
                    } else {
                        4 * world as usize
                    }
                ];
                let refused = group.all_gather_into(&[1.0; 4], &mut short);
                then_all_reduce_works(&group);
                Ok::<_, CollectiveError>(refused)
            },
        );
        for (rank, result) in results.into_iter().enumerate() {
            let refused = result.unwrap_or_else(|e| panic!("world {world} rank {rank}: {e}"));
            match (rank, refused) {
                (0, Err(CollectiveError::InvalidArgument { .. })) => {}
                // Rank 0's notice, or a neighbour's that failed because of it.
                (_, Err(CollectiveError::PeerFailed { .. })) if world > 1 => {}
                (_, Ok(())) if world == 1 => {}
                (rank, other) => {
                    panic!("world {world}: rank {rank} got {other:?} for a short output on rank 0")
                }
            }
        }
    }
}
