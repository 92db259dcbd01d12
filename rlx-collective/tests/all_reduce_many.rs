//! `ProcessGroup::all_reduce_many` against one `all_reduce` per tensor, on in-process worlds
//! of 1 to 8 ranks: every element type and reduction, tensor lists with empty, one-element and
//! prime-length tensors, and buckets small enough that the tensors spread over many of them
//! (and one tensor over a bucket of its own). The values are small integers, which every
//! type and summation order represents exactly, so the results must be the same bits.
//! Mismatched tensor lists fail on every rank naming the tensor, and the group goes on.

mod common;

use half::{bf16, f16};
use rlx_collective::{CollectiveError, Element, ProcessGroup, ReduceKind};

/// An element type built from a small integer.
trait Sample: Element + PartialEq + std::fmt::Debug {
    fn sample(x: i64) -> Self;
}

impl Sample for f32 {
    fn sample(x: i64) -> Self {
        x as f32
    }
}
impl Sample for f64 {
    fn sample(x: i64) -> Self {
        x as f64
    }
}
impl Sample for f16 {
    fn sample(x: i64) -> Self {
        f16::from_f32(x as f32)
    }
}
impl Sample for bf16 {
    fn sample(x: i64) -> Self {
        bf16::from_f32(x as f32)
    }
}
impl Sample for i8 {
    fn sample(x: i64) -> Self {
        x as i8
    }
}
impl Sample for u8 {
    fn sample(x: i64) -> Self {
        x.unsigned_abs() as u8
    }
}
impl Sample for i32 {
    fn sample(x: i64) -> Self {
        x as i32
    }
}
impl Sample for i64 {
    fn sample(x: i64) -> Self {
        x
    }
}

/// Tensor lengths: none, empty, one element, primes around them, and a 4099-element tensor
/// that needs a bucket of its own at the small bucket size.
const LISTS: [&[usize]; 4] = [&[], &[0], &[1], &[0, 1, 2, 3, 5, 7, 11, 13, 0, 4099, 17]];
/// Bucket sizes: a few elements (many buckets) and the default.
const BUCKETS: [usize; 2] = [64, rlx_collective::DEFAULT_BUCKET_BYTES];

/// Rank `rank`'s tensors for `lengths`: values -3..=3 (their sums and products over 8 ranks
/// stay exact in every type's accumulator).
fn tensors<T: Sample>(rank: u32, lengths: &[usize]) -> Vec<Vec<T>> {
    lengths
        .iter()
        .enumerate()
        .map(|(t, &len)| {
            (0..len)
                .map(|i| T::sample((i as i64 + t as i64 * 5 + i64::from(rank) * 3) % 7 - 3))
                .collect()
        })
        .collect()
}

/// On every rank: the bucketed results and those of separate all-reduces agree, for `T` and
/// every reduction, list and bucket size.
fn agrees_with_separate_all_reduces<T: Sample>(group: &ProcessGroup) {
    for op in ReduceKind::ALL {
        for lengths in LISTS {
            for bucket in BUCKETS {
                let mut many = tensors::<T>(group.rank(), lengths);
                let mut views: Vec<&mut [T]> = many.iter_mut().map(Vec::as_mut_slice).collect();
                group
                    .all_reduce_many_bucketed(&mut views, op, bucket)
                    .unwrap_or_else(|e| panic!("{op:?} {lengths:?} {bucket}: {e}"));
                for (t, mut alone) in tensors::<T>(group.rank(), lengths).into_iter().enumerate() {
                    group
                        .all_reduce(&mut alone, op)
                        .expect("the separate all_reduce");
                    assert_eq!(
                        many[t],
                        alone,
                        "{} {op:?}, tensor {t} of {lengths:?}, bucket {bucket} B, world {}",
                        T::DTYPE,
                        group.world_size()
                    );
                }
            }
        }
    }
}

#[test]
fn bucketed_results_are_those_of_separate_all_reduces() {
    for world in 1..=8 {
        common::on_each(common::world(world), |group| {
            agrees_with_separate_all_reduces::<f32>(&group);
            agrees_with_separate_all_reduces::<f64>(&group);
            agrees_with_separate_all_reduces::<f16>(&group);
            agrees_with_separate_all_reduces::<bf16>(&group);
            agrees_with_separate_all_reduces::<i8>(&group);
            agrees_with_separate_all_reduces::<u8>(&group);
            agrees_with_separate_all_reduces::<i32>(&group);
            agrees_with_separate_all_reduces::<i64>(&group);
        });
    }
}

#[test]
fn mismatched_tensor_lists_name_the_tensor_on_every_rank_and_the_group_goes_on() {
    let results = common::on_each(common::world(3), |group| {
        let rank = group.rank() as usize;
        // Rank 2's tensor 1 is one element longer.
        let mut a = vec![1.0f32; 10];
        let mut b = vec![1.0f32; 20 + usize::from(rank == 2)];
        let longer = group
            .all_reduce_many(&mut [&mut a, &mut b], ReduceKind::Sum)
            .expect_err("a longer tensor");
        // Rank 0 passes one tensor fewer.
        let mut c = vec![1.0f32; 10];
        let mut d = vec![1.0f32; 20];
        let mut lists: Vec<&mut [f32]> = vec![&mut c, &mut d];
        if rank == 0 {
            lists.pop();
        }
        let fewer = group
            .all_reduce_many(&mut lists, ReduceKind::Sum)
            .expect_err("a missing tensor");
        let mut x = [1.0f32; 5];
        group
            .all_reduce(&mut x, ReduceKind::Sum)
            .expect("the group goes on");
        assert_eq!(x, [3.0; 5]);
        (longer, fewer)
    });
    for (rank, (longer, fewer)) in results.into_iter().enumerate() {
        for error in [&longer, &fewer] {
            assert!(
                matches!(error, CollectiveError::InvalidArgument { .. }),
                "rank {rank}: {error:?}"
            );
        }
        let (longer, fewer) = (longer.to_string(), fewer.to_string());
        assert!(
            longer.contains("tensor 1 has from 20 to 21 f32 elements"),
            "rank {rank}: {longer}"
        );
        assert!(
            fewer.contains("different numbers of tensors (from 1 to 2)"),
            "rank {rank}: {fewer}"
        );
    }
}

/// The order rank `rank` hands its tensors over in: backward's reverse order on even ranks,
/// a rotation of it on odd ones, so that buckets fill in different orders on different ranks.
fn ready_order(rank: u32, n: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).rev().collect();
    if rank % 2 == 1 && n > 0 {
        order.rotate_left(n / 2 + 1);
    }
    order
}

/// Three rounds of a `Bucketer`, each against separate all-reduces of the same tensors.
fn bucketer_agrees_with_separate_all_reduces<T: Sample>(group: &ProcessGroup) {
    for lengths in LISTS {
        for bucket_bytes in BUCKETS {
            let op = ReduceKind::Sum;
            let mut buckets =
                rlx_collective::Bucketer::<T>::with_bucket_bytes(group, lengths, op, bucket_bytes)
                    .expect("the same registration on every rank");
            for round in 0..3i64 {
                let inputs: Vec<Vec<T>> = tensors::<T>(group.rank(), lengths)
                    .into_iter()
                    .map(|t| t.into_iter().map(|_| T::sample(round)).collect())
                    .collect();
                for i in ready_order(group.rank(), lengths.len()) {
                    buckets.ready(i, &inputs[i]).expect("ready");
                }
                let mut out: Vec<Vec<T>> = lengths.iter().map(|&l| vec![T::sample(0); l]).collect();
                let mut views: Vec<&mut [T]> = out.iter_mut().map(Vec::as_mut_slice).collect();
                buckets.wait(&mut views).expect("wait");
                for (t, mut alone) in inputs.into_iter().enumerate() {
                    group
                        .all_reduce(&mut alone, op)
                        .expect("the separate all_reduce");
                    assert_eq!(
                        out[t],
                        alone,
                        "{} round {round}, tensor {t} of {lengths:?}, bucket {bucket_bytes} B",
                        T::DTYPE
                    );
                }
            }
        }
    }
}

#[test]
fn a_bucketer_reduces_what_separate_all_reduces_do_whatever_order_each_rank_marks() {
    for world in 1..=8 {
        common::on_each(common::world(world), |group| {
            bucketer_agrees_with_separate_all_reduces::<f32>(&group);
            bucketer_agrees_with_separate_all_reduces::<bf16>(&group);
            bucketer_agrees_with_separate_all_reduces::<i64>(&group);
        });
    }
}

#[test]
fn a_bucketer_refuses_what_would_lose_or_mix_up_a_gradient() {
    common::on_each(common::world(2), |group| {
        let mut buckets = rlx_collective::Bucketer::<f32>::new(&group, &[3, 4], ReduceKind::Sum)
            .expect("a registration");
        let wrong = buckets
            .ready(0, &[1.0; 4])
            .expect_err("a gradient of another length");
        assert!(
            wrong
                .to_string()
                .contains("tensor 0 has 4 f32 elements, 3 registered"),
            "{wrong}"
        );
        assert!(buckets.ready(2, &[1.0]).is_err(), "an unknown tensor");
        buckets.ready(1, &[1.0; 4]).expect("ready");
        let twice = buckets.ready(1, &[1.0; 4]).expect_err("twice");
        assert!(twice.to_string().contains("handed over twice"), "{twice}");
        let mut a = [0.0f32; 3];
        let mut b = [0.0f32; 4];
        let early = buckets
            .wait(&mut [&mut a, &mut b])
            .expect_err("tensor 0 missing");
        assert!(early.to_string().contains("tensors [0]"), "{early}");
        buckets.ready(0, &[2.0; 3]).expect("ready");
        buckets.wait(&mut [&mut a, &mut b]).expect("wait");
        assert_eq!((a, b), ([4.0; 3], [2.0; 4]));
    });
}
