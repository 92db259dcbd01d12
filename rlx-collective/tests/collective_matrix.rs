//! The collective matrix over in-process worlds of 1..=8 ranks: every collective × dtype ×
//! reduction × awkward size × forced algorithm (× every root for the rooted collectives)
//! against the serial reference, identical on all ranks.
//!
//! All-reduce runs the full cross product; the other collectives run fewer sizes so the suite
//! stays within its time budget, and a second pass caps the segment size so that small
//! buffers take the multi-segment paths of every pipelined algorithm.

mod common;

use rlx_collective::conformance::{ConformanceOptions, DEFAULT_SIZES};
use rlx_collective::{CollectiveOp, DType, ReduceKind};

fn all_reduce_options(sizes: Vec<usize>, max_segment_bytes: Option<usize>) -> ConformanceOptions {
    ConformanceOptions {
        ops: vec![CollectiveOp::AllReduce],
        dtypes: DType::ALL.to_vec(),
        reduces: ReduceKind::ALL.to_vec(),
        sizes,
        algorithms: true,
        max_segment_bytes,
        seed: 0xA11,
        ..ConformanceOptions::default()
    }
}

fn others_options(sizes: Vec<usize>, max_segment_bytes: Option<usize>) -> ConformanceOptions {
    ConformanceOptions {
        ops: CollectiveOp::ALL
            .into_iter()
            .filter(|op| *op != CollectiveOp::AllReduce)
            .collect(),
        sizes,
        algorithms: true,
        all_roots: true,
        max_segment_bytes,
        seed: 0x0BE,
        ..ConformanceOptions::default()
    }
}

macro_rules! world_tests {
    ($($name:ident: $n:expr),* $(,)?) => {
        mod all_reduce_full_matrix {
            use super::*;
            $(
                #[test]
                fn $name() {
                    common::exact_everywhere($n, all_reduce_options(DEFAULT_SIZES.to_vec(), None));
                }
            )*
        }
        mod all_reduce_multi_segment {
            use super::*;
            $(
                #[test]
                fn $name() {
                    // 96-byte segments: 1000 f64 on 8 ranks is 2 segments per block, 4099
                    // i8 on 2 ranks is 22.
                    common::exact_everywhere($n, all_reduce_options(vec![1000, 4099], Some(96)));
                }
            )*
        }
        mod other_collectives {
            use super::*;
            $(
                #[test]
                fn $name() {
                    common::exact_everywhere($n, others_options(vec![0, 1, 7, 13, 1000], None));
                    common::exact_everywhere($n, others_options(vec![2, 4099], Some(96)));
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

/// A wrong answer must fail the matrix: the reference is not comparing a result with itself.
#[test]
fn the_reference_catches_a_wrong_result() {
    use rlx_collective::conformance::reference::{check, reduce};
    let inputs = vec![vec![1u8, 2, 3], vec![4u8, 5, 6]];
    let expected = reduce(DType::U8, ReduceKind::Sum, &inputs);
    assert!(check(&[5, 7, 9], &expected).is_ok());
    assert!(check(&[5, 7, 8], &expected).is_err());
    assert!(check(&[5, 7], &expected).is_err());
}
