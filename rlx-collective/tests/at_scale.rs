//! Every collective exact at 16, 64 and 256 ranks: thread worlds larger than any test cluster
//! this machine can host as processes, against the serial reference, with every algorithm
//! forced in turn at 16 ranks and the automatic choice at 64 and 256 (where the large-world
//! schedules, such as non-power-of-two folds and many-step rings, are what breaks).
//!
//! The same collectives at up to 1024 simulated ranks, timed, are `cargo xtask simulate`.

mod common;

use rlx_collective::conformance::ConformanceOptions;
use rlx_collective::{CollectiveOp, DType, ReduceKind};

/// Every collective on a float, a half-width float and an integer type, empty, one element,
/// a prime count and one past a segment (the cap makes 1031 elements take several segments).
fn options(algorithms: bool, seed: u64) -> ConformanceOptions {
    ConformanceOptions {
        ops: CollectiveOp::ALL.to_vec(),
        dtypes: vec![DType::F32, DType::BF16, DType::I32],
        reduces: vec![ReduceKind::Sum, ReduceKind::Max],
        sizes: vec![0, 1, 1031],
        algorithms,
        max_segment_bytes: Some(1024),
        seed,
        ..ConformanceOptions::default()
    }
}

#[test]
fn sixteen_ranks_every_algorithm() {
    let options = ConformanceOptions {
        dtypes: vec![DType::F32, DType::BF16],
        ..options(true, 16)
    };
    common::exact_everywhere(16, options);
}

#[test]
fn sixty_four_ranks() {
    common::exact_everywhere(64, options(false, 64));
}

/// At 256 ranks every rank computes the reference from every rank's input, so an
/// all-to-all, whose input is a block per rank, keeps to small blocks (256 inputs of 256
/// blocks each per rank).
#[test]
fn two_hundred_fifty_six_ranks() {
    let others = ConformanceOptions {
        ops: CollectiveOp::ALL
            .into_iter()
            .filter(|op| *op != CollectiveOp::AllToAll)
            .collect(),
        dtypes: vec![DType::F32],
        reduces: vec![ReduceKind::Sum],
        sizes: vec![1, 1031],
        ..options(false, 256)
    };
    common::exact_everywhere(256, others);
    let all_to_all = ConformanceOptions {
        ops: vec![CollectiveOp::AllToAll],
        dtypes: vec![DType::I32],
        sizes: vec![1, 3],
        ..options(false, 257)
    };
    common::exact_everywhere(256, all_to_all);
}
