//! Property tests: random world sizes, lengths, dtypes, reductions, algorithms and values,
//! against the serial reference of the conformance module.

mod common;

use std::sync::Arc;

use half::{bf16, f16};
use proptest::prelude::*;
use rlx_collective::conformance::reference::{self, Expected};
use rlx_collective::{Algorithm, CollectiveError, CollectiveOp, DType, ProcessGroup, ReduceKind};

/// Encodes `x` as a `dtype` element, keeping integers in ranges where the wide accumulator
/// cannot saturate mid-way (which would make the result depend on the order of the hops).
fn encode(dtype: DType, reduce: ReduceKind, x: f64, out: &mut Vec<u8>) {
    let product = reduce == ReduceKind::Product;
    let x = if product && dtype.is_float() {
        // Magnitudes in [0.5, 2): products of a few factors stay finite in f16.
        let m = 0.5 + (x.abs() % 1.5);
        if x < 0.0 { -m } else { m }
    } else {
        x
    };
    let int = if product { (x as i64) % 4 } else { x as i64 };
    match dtype {
        DType::F16 => out.extend_from_slice(&f16::from_f64(x).to_le_bytes()),
        DType::BF16 => out.extend_from_slice(&bf16::from_f64(x).to_le_bytes()),
        DType::F32 => out.extend_from_slice(&(x as f32).to_le_bytes()),
        DType::F64 => out.extend_from_slice(&x.to_le_bytes()),
        DType::I8 => out.push(int as i8 as u8),
        DType::U8 => out.push(int as u8),
        DType::I32 => out.extend_from_slice(&(int as i32).to_le_bytes()),
        _ => out.extend_from_slice(&(int.wrapping_mul(1 << 20)).to_le_bytes()),
    }
}

fn groups(world: u32, algorithm: Algorithm, segment: Option<usize>) -> Vec<ProcessGroup> {
    let groups = common::world(world);
    for g in &groups {
        g.set_algorithm(CollectiveOp::AllReduce, algorithm).unwrap();
        g.set_max_segment_bytes(segment);
    }
    groups
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

    #[test]
    fn all_reduce_and_reduce_scatter_match_the_reference(
        world in 1u32..=6,
        count in 0usize..700,
        dtype in proptest::sample::select(DType::ALL.to_vec()),
        reduce in proptest::sample::select(ReduceKind::ALL.to_vec()),
        algorithm in proptest::sample::select(vec![
            Algorithm::Auto, Algorithm::Ring, Algorithm::RecursiveDoubling,
        ]),
        segment in proptest::option::of(1usize..400),
        values in proptest::collection::vec(-300.0f64..300.0, 6 * 700),
    ) {
        let inputs: Arc<Vec<Vec<u8>>> = Arc::new((0..world as usize).map(|r| {
            let mut out = Vec::new();
            for &x in &values[r * count..(r + 1) * count] {
                encode(dtype, reduce, x, &mut out);
            }
            out
        }).collect());
        let expected = reference::reduce(dtype, reduce, &inputs);
        let shared = Arc::clone(&inputs);
        let results = common::on_each(groups(world, algorithm, segment), move |g| {
            let mut data = shared[g.rank() as usize].clone();
            g.all_reduce_typed(&mut data, dtype, reduce)?;
            let block = g.reduce_scatter_typed(&shared[g.rank() as usize], dtype, reduce)?;
            Ok::<_, CollectiveError>((data, block))
        });
        let mut first: Option<Vec<u8>> = None;
        for (rank, r) in results.into_iter().enumerate() {
            let (data, block) = r.map_err(|e| TestCaseError::fail(e.to_string()))?;
            reference::check(&data, &expected).map_err(TestCaseError::fail)?;
            let range = rlx_block(count, world as usize, rank);
            let want = reference::slice(&expected, dtype.size(), range);
            reference::check(&block, &want).map_err(TestCaseError::fail)?;
            match &first {
                None => first = Some(data),
                Some(f) => prop_assert_eq!(f, &data, "rank {} differs from rank 0", rank),
            }
        }
    }

    #[test]
    fn data_movement_matches_the_reference(
        world in 1u32..=6,
        count in 0usize..300,
        root_pick in 0u32..6,
        dtype in proptest::sample::select(DType::ALL.to_vec()),
        segment in proptest::option::of(1usize..200),
        bytes in proptest::collection::vec(any::<u8>(), 6 * 6 * 300 * 8),
    ) {
        let root = root_pick % world;
        let len = count * dtype.size();
        let n = world as usize;
        let inputs: Arc<Vec<Vec<u8>>> =
            Arc::new((0..n).map(|r| bytes[r * n * len..(r + 1) * n * len].to_vec()).collect());
        let shared = Arc::clone(&inputs);
        let results = common::on_each(groups(world, Algorithm::Auto, segment), move |g| {
            let me = g.rank() as usize;
            let mine = &shared[me][..len];
            let gathered = g.all_gather_typed(mine, dtype)?;
            let rooted = g.gather_typed(root, mine, dtype)?;
            let mut b = if me == root as usize { mine.to_vec() } else { vec![0; len] };
            g.broadcast_typed(root, &mut b, dtype)?;
            let exchanged = g.all_to_all_typed(&shared[me], dtype)?;
            Ok::<_, CollectiveError>((gathered, rooted, b, exchanged))
        });
        let all: Vec<u8> = inputs.iter().flat_map(|i| i[..len].to_vec()).collect();
        for (rank, r) in results.into_iter().enumerate() {
            let (gathered, rooted, b, exchanged) =
                r.map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(&gathered, &all);
            if rank == root as usize {
                prop_assert_eq!(rooted.as_ref(), Some(&all));
            } else {
                prop_assert!(rooted.is_none());
            }
            prop_assert_eq!(&b, &inputs[root as usize][..len].to_vec());
            let want: Vec<u8> =
                inputs.iter().flat_map(|i| i[rank * len..(rank + 1) * len].to_vec()).collect();
            reference::check(&exchanged, &Expected::Bytes(want)).map_err(TestCaseError::fail)?;
        }
    }
}

/// Rank `rank`'s block of a reduce-scatter of `count` elements on `world` ranks, as the
/// public docs of `reduce_scatter` define it.
fn rlx_block(count: usize, world: usize, rank: usize) -> std::ops::Range<usize> {
    rank * count / world..(rank + 1) * count / world
}
