//! The benchmark's input values and their closed-form expected results, identical in every
//! system of the sweep (`xtask/peers/*` compute the same patterns), so that `#wrong` is a real
//! check everywhere without a serial reference run inside the timed loop.
//!
//! Inputs are small integers, exact in every dtype, chosen so that no reduction overflows:
//! `(rank + i) % 4` for sum, mean, max and min; for product a single 2 per element (on rank
//! `i % n`) and 1 elsewhere; `(31·rank + i) % 101` for data movement. The full semantics of
//! every reduction (saturation, rounding, wide accumulation) are what `test-cluster` checks.

use half::{bf16, f16};
use rlx_collective::{Compression, DType, ReduceKind};

/// A value outside every input and every expected result, written into outputs before the
/// checked iteration so that a stale buffer cannot pass.
pub(crate) const POISON: f64 = 113.0;

/// Input of `rank` at global index `i` for a reduction.
pub(crate) fn reduce_input(redop: ReduceKind, rank: u32, world: u32, i: u64) -> f64 {
    match redop {
        ReduceKind::Product => {
            if i % u64::from(world.max(1)) == u64::from(rank) {
                2.0
            } else {
                1.0
            }
        }
        _ => ((u64::from(rank) + i) % 4) as f64,
    }
}

/// The reduction over every rank's [`reduce_input`] at index `i`, as RLX defines it for the
/// dtype (integer means round to nearest, halves away from zero).
pub(crate) fn reduce_expected(redop: ReduceKind, dtype: DType, world: u32, i: u64) -> f64 {
    let values = (0..world).map(|r| reduce_input(redop, r, world, i));
    match redop {
        ReduceKind::Max => values.fold(f64::MIN, f64::max),
        ReduceKind::Min => values.fold(f64::MAX, f64::min),
        ReduceKind::Product => values.product(),
        ReduceKind::Mean => {
            let mean = values.sum::<f64>() / f64::from(world.max(1));
            if dtype.is_float() { mean } else { mean.round() }
        }
        _ => values.sum(),
    }
}

/// Input of `rank` at index `i` for data movement.
pub(crate) fn data_value(rank: u32, i: u64) -> f64 {
    ((u64::from(rank) * 31 + i) % 101) as f64
}

/// `values` encoded as little-endian `dtype` elements.
pub(crate) fn encode(dtype: DType, values: impl Iterator<Item = f64>) -> Vec<u8> {
    let mut out = Vec::new();
    for v in values {
        // The values are small integers or a mean of them: every conversion below is exact
        // or rounds to nearest, which is what the check allows for.
        match dtype {
            DType::F16 => out.extend_from_slice(&f16::from_f64(v).to_le_bytes()),
            DType::BF16 => out.extend_from_slice(&bf16::from_f64(v).to_le_bytes()),
            DType::F32 => out.extend_from_slice(&(v as f32).to_le_bytes()),
            DType::F64 => out.extend_from_slice(&v.to_le_bytes()),
            DType::I8 => out.extend_from_slice(&(v as i8).to_le_bytes()),
            DType::U8 => out.push(v as u8),
            DType::I32 => out.extend_from_slice(&(v as i32).to_le_bytes()),
            _ => out.extend_from_slice(&(v as i64).to_le_bytes()),
        }
    }
    out
}

/// Element `i` of the little-endian `dtype` buffer `bytes`, as f64 (`None` past the end).
pub(crate) fn decode(dtype: DType, bytes: &[u8], i: usize) -> Option<f64> {
    let size = dtype.size();
    let raw = bytes.get(i * size..(i + 1) * size)?;
    let mut b8 = [0u8; 8];
    b8[..size].copy_from_slice(raw);
    Some(match dtype {
        DType::F16 => f16::from_le_bytes([b8[0], b8[1]]).to_f64(),
        DType::BF16 => bf16::from_le_bytes([b8[0], b8[1]]).to_f64(),
        DType::F32 => f64::from(f32::from_le_bytes([b8[0], b8[1], b8[2], b8[3]])),
        DType::F64 => f64::from_le_bytes(b8),
        DType::I8 => f64::from(b8[0] as i8),
        DType::U8 => f64::from(b8[0]),
        DType::I32 => f64::from(i32::from_le_bytes([b8[0], b8[1], b8[2], b8[3]])),
        _ => i64::from_le_bytes(b8) as f64,
    })
}

/// The tolerance of a float comparison relative to `max(1, |expected|)`: one rounding of the
/// dtype (means are not integers); integers compare exactly.
fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => 1.0 / 1024.0,
        DType::BF16 => 1.0 / 128.0,
        DType::F32 => 1e-6,
        DType::F64 => 1e-12,
        _ => 0.0,
    }
}

/// The absolute error a compressed f32 all-reduce of the reduction inputs may show on `world`
/// ranks: each of the n compressions of an element's partial sums (at most 3n) rounds once,
/// and with error feedback an output also carries the last call's residual and this call's,
/// each at most that much again.
pub(crate) fn compressed_tolerance(compression: Compression, redop: ReduceKind, world: u32) -> f64 {
    let n = f64::from(world.max(1));
    let rounding = match compression {
        Compression::Bf16 => 1.0 / 256.0,
        Compression::Fp16 => 1.0 / 2048.0,
        Compression::Int8 => 1.0 / 254.0,
        _ => 1e-6,
    };
    let sum = 2.0 * n * 3.0 * n * rounding * 1.01;
    if redop == ReduceKind::Mean {
        sum / n
    } else {
        sum
    }
}

/// Counts the elements of `bytes` (`count` elements of `dtype`) that differ from
/// `expected(i)`; a buffer of the wrong length counts every missing element as wrong.
pub(crate) fn count_wrong(
    dtype: DType,
    bytes: &[u8],
    count: u64,
    expected: impl Fn(u64) -> f64,
) -> u64 {
    let tol = tolerance(dtype);
    count_wrong_within(dtype, bytes, count, expected, |want| {
        tol * want.abs().max(1.0)
    })
}

/// [`count_wrong`] with the allowed absolute error for an expected value given by `allowed`.
pub(crate) fn count_wrong_within(
    dtype: DType,
    bytes: &[u8],
    count: u64,
    expected: impl Fn(u64) -> f64,
    allowed: impl Fn(f64) -> f64,
) -> u64 {
    (0..count)
        .filter(|&i| {
            let want = expected(i);
            match usize::try_from(i)
                .ok()
                .and_then(|i| decode(dtype, bytes, i))
            {
                // A NaN compares false with everything, so it is named; an infinity where a
                // finite value was expected is off by more than any tolerance.
                Some(got) => got.is_nan() || (got - want).abs() > allowed(want),
                None => true,
            }
        })
        .count() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dtype_round_trips_the_patterns() {
        for dtype in DType::ALL {
            let values: Vec<f64> = (0..300).map(|i| data_value(3, i)).collect();
            let bytes = encode(dtype, values.iter().copied());
            assert_eq!(bytes.len(), 300 * dtype.size());
            assert_eq!(
                count_wrong(dtype, &bytes, 300, |i| data_value(3, i)),
                0,
                "{dtype}"
            );
            assert_eq!(
                count_wrong(dtype, &bytes, 300, |i| data_value(4, i)),
                300,
                "{dtype}"
            );
            // A short buffer counts its missing elements.
            assert_eq!(
                count_wrong(dtype, &bytes[..dtype.size()], 300, |i| data_value(3, i)),
                299
            );
        }
    }

    #[test]
    fn nan_and_infinity_count_as_wrong() {
        for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
            let bytes = encode(dtype, [f64::NAN, f64::INFINITY, 2.0].into_iter());
            assert_eq!(count_wrong(dtype, &bytes, 3, |_| 2.0), 2, "{dtype}");
        }
    }

    #[test]
    fn expected_reductions() {
        // Ranks 0..3 at index 1 hold 1, 2, 3.
        assert_eq!(reduce_expected(ReduceKind::Sum, DType::I8, 3, 1), 6.0);
        assert_eq!(reduce_expected(ReduceKind::Max, DType::I8, 3, 1), 3.0);
        assert_eq!(reduce_expected(ReduceKind::Min, DType::I8, 3, 1), 1.0);
        assert_eq!(reduce_expected(ReduceKind::Product, DType::I8, 3, 5), 2.0);
        // Ranks 0..2 at index 0 hold 0 and 1: the integer mean 0.5 rounds away from zero.
        assert_eq!(reduce_expected(ReduceKind::Mean, DType::I32, 2, 0), 1.0);
        assert_eq!(reduce_expected(ReduceKind::Mean, DType::F32, 2, 0), 0.5);
        // A mean that is not a dyadic fraction still passes after one f16 rounding.
        let third = reduce_expected(ReduceKind::Mean, DType::F16, 3, 2);
        assert!((third - 5.0 / 3.0).abs() < 1e-12);
        let bytes = encode(DType::F16, [third].into_iter());
        assert_eq!(count_wrong(DType::F16, &bytes, 1, |_| third), 0);
    }
}
