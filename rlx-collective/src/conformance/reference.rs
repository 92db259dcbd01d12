//! The serial reference the conformance cases are checked against: a naive, obviously correct
//! reduction written independently of the kernels (exact integer arithmetic in i128, floats
//! in f64), and the comparison with its stated error bound.
//!
//! Error bound for float Sum and Mean: `Σ|x| · 2n · u_acc + |ref| · (u_acc + ulp_out) +
//! tiny_out`, where `u_acc` is the unit roundoff of the accumulation type (2^-24 for f32,
//! 2^-53 for f64), `ulp_out` the relative spacing of the output type (2^-10 f16, 2^-7 bf16,
//! 2^-23 f32, 2^-52 f64) and `tiny_out` its smallest subnormal. Product: `|ref| · (2n · u_acc
//! + ulp_out) + tiny_out`. Max and Min, and integers, must match exactly.

use half::{bf16, f16};

use crate::{DType, ReduceKind};

/// What a result must be.
#[derive(Debug)]
pub enum Expected {
    /// Exactly these bytes.
    Bytes(Vec<u8>),
    /// Floats of `dtype` within `tolerance` of `values`.
    Floats {
        /// The element type of the result.
        dtype: DType,
        /// The exact values (computed in f64).
        values: Vec<f64>,
        /// The allowed absolute error of each element.
        tolerance: Vec<f64>,
    },
}

fn float_at(dtype: DType, bytes: &[u8], i: usize) -> f64 {
    let s = dtype.size();
    let b = &bytes[i * s..(i + 1) * s];
    match dtype {
        DType::F16 => f16::from_le_bytes([b[0], b[1]]).to_f64(),
        DType::BF16 => bf16::from_le_bytes([b[0], b[1]]).to_f64(),
        DType::F32 => f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        _ => f64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]),
    }
}

fn int_at(dtype: DType, bytes: &[u8], i: usize) -> i128 {
    let s = dtype.size();
    let b = &bytes[i * s..(i + 1) * s];
    match dtype {
        DType::I8 => i128::from(b[0] as i8),
        DType::U8 => i128::from(b[0]),
        DType::I32 => i128::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        _ => i128::from(i64::from_le_bytes([
            b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7],
        ])),
    }
}

fn push_float(dtype: DType, x: f64, out: &mut Vec<u8>) {
    match dtype {
        DType::F16 => out.extend_from_slice(&f16::from_f64(x).to_le_bytes()),
        DType::BF16 => out.extend_from_slice(&bf16::from_f64(x).to_le_bytes()),
        DType::F32 => out.extend_from_slice(&(x as f32).to_le_bytes()),
        _ => out.extend_from_slice(&x.to_le_bytes()),
    }
}

fn push_int(dtype: DType, x: i128, out: &mut Vec<u8>) {
    let clamp = |lo: i128, hi: i128| x.clamp(lo, hi);
    match dtype {
        DType::I8 => out.push(clamp(i8::MIN.into(), i8::MAX.into()) as i8 as u8),
        DType::U8 => out.push(clamp(0, u8::MAX.into()) as u8),
        DType::I32 => {
            out.extend_from_slice(&(clamp(i32::MIN.into(), i32::MAX.into()) as i32).to_le_bytes())
        }
        _ => out.extend_from_slice(&(clamp(i64::MIN.into(), i64::MAX.into()) as i64).to_le_bytes()),
    }
}

/// Relative spacing and smallest subnormal of an output float type.
fn output_precision(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::F16 => (2f64.powi(-10), 2f64.powi(-24)),
        DType::BF16 => (2f64.powi(-7), 2f64.powi(-133)),
        DType::F32 => (2f64.powi(-23), 2f64.powi(-149)),
        _ => (2f64.powi(-52), f64::from_bits(1)),
    }
}

fn max_with_signed_zero(a: f64, b: f64) -> f64 {
    if a == b {
        if a.is_sign_negative() { b } else { a }
    } else {
        a.max(b)
    }
}

fn min_with_signed_zero(a: f64, b: f64) -> f64 {
    if a == b {
        if a.is_sign_negative() { a } else { b }
    } else {
        a.min(b)
    }
}

/// The reduction of `inputs` (one buffer of little-endian `dtype` elements per rank, rank
/// order, all of one length) under `reduce`.
pub fn reduce(dtype: DType, reduce: ReduceKind, inputs: &[Vec<u8>]) -> Expected {
    let n = inputs.len();
    // Buffers of unequal length are reduced over their common prefix.
    let count = inputs
        .iter()
        .map(|b| b.len() / dtype.size())
        .min()
        .unwrap_or(0);
    if dtype.is_float() {
        let unit = if dtype == DType::F64 {
            2f64.powi(-53)
        } else {
            2f64.powi(-24)
        };
        let (ulp_out, tiny_out) = output_precision(dtype);
        let mut values = Vec::with_capacity(count);
        let mut tolerance = Vec::with_capacity(count);
        let mut exact = Vec::new();
        for i in 0..count {
            let xs = inputs.iter().map(|b| float_at(dtype, b, i));
            match reduce {
                ReduceKind::Max => push_float(
                    dtype,
                    xs.reduce(max_with_signed_zero).unwrap_or(0.0),
                    &mut exact,
                ),
                ReduceKind::Min => push_float(
                    dtype,
                    xs.reduce(min_with_signed_zero).unwrap_or(0.0),
                    &mut exact,
                ),
                ReduceKind::Product => {
                    let p: f64 = xs.product();
                    values.push(p);
                    tolerance.push(p.abs() * (2.0 * n as f64 * unit + ulp_out) + tiny_out);
                }
                _ => {
                    let (sum, abs) = xs.fold((0.0, 0.0), |(s, a), x| (s + x, a + x.abs()));
                    let scale = if reduce == ReduceKind::Mean {
                        n as f64
                    } else {
                        1.0
                    };
                    let value = sum / scale;
                    values.push(value);
                    tolerance.push(
                        abs / scale * 2.0 * n as f64 * unit
                            + value.abs() * (unit + ulp_out)
                            + tiny_out,
                    );
                }
            }
        }
        if matches!(reduce, ReduceKind::Max | ReduceKind::Min) {
            return Expected::Bytes(exact);
        }
        return Expected::Floats {
            dtype,
            values,
            tolerance,
        };
    }
    let mut out = Vec::with_capacity(count * dtype.size());
    for i in 0..count {
        let xs = inputs.iter().map(|b| int_at(dtype, b, i));
        let value = match reduce {
            ReduceKind::Max => xs.max().unwrap_or(0),
            ReduceKind::Min => xs.min().unwrap_or(0),
            ReduceKind::Product => xs.fold(1i128, i128::saturating_mul),
            ReduceKind::Mean => {
                let sum: i128 = xs.sum();
                let n = n as i128;
                let (q, r) = (sum / n, sum % n);
                if 2 * r.abs() >= n {
                    q + sum.signum()
                } else {
                    q
                }
            }
            _ => xs.sum(),
        };
        push_int(dtype, value, &mut out);
    }
    Expected::Bytes(out)
}

/// The element range `range` of an expected result (empty where `range` lies outside it).
pub fn slice(expected: &Expected, elem_size: usize, range: std::ops::Range<usize>) -> Expected {
    match expected {
        Expected::Bytes(b) => Expected::Bytes(
            b.get(range.start * elem_size..range.end * elem_size)
                .unwrap_or_default()
                .to_vec(),
        ),
        Expected::Floats {
            dtype,
            values,
            tolerance,
        } => Expected::Floats {
            dtype: *dtype,
            values: values.get(range.clone()).unwrap_or_default().to_vec(),
            tolerance: tolerance.get(range).unwrap_or_default().to_vec(),
        },
    }
}

/// Compares a result with what it must be; the error names the first wrong element.
pub fn check(got: &[u8], expected: &Expected) -> Result<(), String> {
    match expected {
        Expected::Bytes(want) => {
            if got.len() != want.len() {
                return Err(format!("{} bytes, expected {}", got.len(), want.len()));
            }
            match got.iter().zip(want).position(|(a, b)| a != b) {
                None => Ok(()),
                Some(at) => Err(format!(
                    "byte {at} is {:#04x}, expected {:#04x} ({} wrong bytes)",
                    got[at],
                    want[at],
                    got.iter().zip(want).filter(|(a, b)| a != b).count()
                )),
            }
        }
        Expected::Floats {
            dtype,
            values,
            tolerance,
        } => {
            if got.len() != values.len() * dtype.size() {
                return Err(format!(
                    "{} bytes, expected {}",
                    got.len(),
                    values.len() * dtype.size()
                ));
            }
            for (i, (want, tol)) in values.iter().zip(tolerance).enumerate() {
                let x = float_at(*dtype, got, i);
                if (x - want).abs() > *tol || x.is_nan() {
                    return Err(format!(
                        "element {i} is {x}, expected {want} within {tol:e}"
                    ));
                }
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_reference_saturates_and_rounds() {
        let inputs = vec![vec![100u8], vec![100u8], vec![100u8]];
        assert_eq!(
            check(&[100], &reduce(DType::I8, ReduceKind::Mean, &inputs)),
            Ok(())
        );
        assert_eq!(
            check(&[127], &reduce(DType::I8, ReduceKind::Sum, &inputs)),
            Ok(())
        );
        assert!(check(&[100], &reduce(DType::I8, ReduceKind::Sum, &inputs)).is_err());
    }

    #[test]
    fn float_bound_rejects_a_wrong_value() {
        let a = 1.5f32.to_le_bytes().to_vec();
        let b = 2.25f32.to_le_bytes().to_vec();
        let e = reduce(DType::F32, ReduceKind::Sum, &[a, b]);
        assert_eq!(check(&3.75f32.to_le_bytes(), &e), Ok(()));
        assert!(check(&3.7501f32.to_le_bytes(), &e).is_err());
    }
}
