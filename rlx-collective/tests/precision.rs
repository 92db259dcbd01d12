//! The precision guarantees of the collectives through the public API: wide accumulation
//! across hops, saturation only at the end, round-to-nearest integer means, and bit-identical
//! results on every rank even for signed zeros and NaN.

mod common;

use half::f16;
use rlx_collective::{Algorithm, CollectiveError, CollectiveOp, DType, ReduceKind};

fn each_algorithm() -> [Algorithm; 2] {
    [Algorithm::Ring, Algorithm::RecursiveDoubling]
}

#[test]
fn i8_mean_of_hundreds_is_a_hundred() {
    for algorithm in each_algorithm() {
        let results = common::on_each(common::world(3), move |group| {
            group.set_algorithm(CollectiveOp::AllReduce, algorithm)?;
            let mut x = vec![100i8 as u8; 5];
            group.all_reduce_typed(&mut x, DType::I8, ReduceKind::Mean)?;
            let mut s = vec![100i8 as u8; 5];
            group.all_reduce_typed(&mut s, DType::I8, ReduceKind::Sum)?;
            Ok::<_, CollectiveError>((x, s))
        });
        for r in results {
            let (mean, sum) = r.unwrap();
            assert_eq!(mean, vec![100; 5], "{algorithm}");
            assert_eq!(
                sum,
                vec![127; 5],
                "{algorithm}: sum saturates only at the end"
            );
        }
    }
}

#[test]
fn f16_mean_of_values_whose_sum_overflows_f16() {
    for algorithm in each_algorithm() {
        let results = common::on_each(common::world(4), move |group| {
            group.set_algorithm(CollectiveOp::AllReduce, algorithm)?;
            let mut x: Vec<u8> = (0..9)
                .flat_map(|_| f16::from_f32(30000.0).to_le_bytes())
                .collect();
            group.all_reduce_typed(&mut x, DType::F16, ReduceKind::Mean)?;
            Ok::<_, CollectiveError>(x)
        });
        for r in results {
            let x = r.unwrap();
            for c in x.chunks_exact(2) {
                assert_eq!(
                    f16::from_le_bytes([c[0], c[1]]).to_f32(),
                    30000.0,
                    "{algorithm}"
                );
            }
        }
    }
}

#[test]
fn signed_zeros_and_nans_end_bit_identical() {
    for algorithm in each_algorithm() {
        for reduce in [ReduceKind::Max, ReduceKind::Min, ReduceKind::Sum] {
            let results = common::on_each(common::world(5), move |group| {
                group.set_algorithm(CollectiveOp::AllReduce, algorithm)?;
                let r = group.rank();
                let nan_a = f32::from_bits(0x7fc0_0000 | r);
                let mut x = [
                    if r % 2 == 0 { 0.0 } else { -0.0 },
                    if r == 1 { nan_a } else { 1.0 },
                    if r % 2 == 0 {
                        f32::from_bits(0xffc0_0000 | r)
                    } else {
                        nan_a
                    },
                ];
                group.all_reduce(&mut x, reduce)?;
                Ok::<_, CollectiveError>(x.map(f32::to_bits))
            });
            let bits: Vec<[u32; 3]> = results.into_iter().map(|r| r.unwrap()).collect();
            assert!(
                bits.iter().all(|b| *b == bits[0]),
                "{algorithm} {reduce}: {bits:x?}"
            );
            match reduce {
                ReduceKind::Max => assert_eq!(bits[0][0], 0.0f32.to_bits()),
                ReduceKind::Min => assert_eq!(bits[0][0], (-0.0f32).to_bits()),
                _ => {}
            }
            assert!(f32::from_bits(bits[0][1]).is_nan());
        }
    }
}

#[test]
fn a_world_of_one_is_the_identity() {
    let groups = common::world(1);
    let g = &groups[0];
    for dtype in DType::ALL {
        for reduce in ReduceKind::ALL {
            let original: Vec<u8> = (0..dtype.size() * 5).map(|i| (i * 37 + 11) as u8).collect();
            let mut x = original.clone();
            g.all_reduce_typed(&mut x, dtype, reduce).unwrap();
            assert_eq!(x, original, "{dtype} {reduce}");
            assert_eq!(
                g.reduce_scatter_typed(&original, dtype, reduce).unwrap(),
                original
            );
        }
    }
    assert_eq!(g.all_gather(&[1.0, 2.0]).unwrap(), vec![1.0, 2.0]);
    assert_eq!(g.gather(0, &[4.0]).unwrap(), Some(vec![4.0]));
    assert_eq!(g.all_to_all(&[4.0, 5.0]).unwrap(), vec![4.0, 5.0]);
    let mut y = [0.0f32; 2];
    g.scatter(0, &[6.0, 7.0], &mut y).unwrap();
    assert_eq!(y, [6.0, 7.0]);
    g.barrier().unwrap();
}
