//! How RLX's reductions map onto MLX's native collectives while keeping RLX's precision rules:
//! partial results accumulate in a wide type (f32 for f16/bf16/f32, f64 for f64, i64 for the
//! narrow integers), `Mean` is a sum divided once at the end, integer results saturate only
//! when narrowed and integer means round to nearest (halves away from zero).
//!
//! MLX's ring reduces in the element type it is given, so narrow inputs are widened here
//! before MLX sees them and narrowed after. Combinations MLX cannot do with these semantics
//! (`Product`, which MLX lacks; sums of `i64`, which MLX wraps instead of saturating) are not
//! planned, so `ProcessGroup` runs its own algorithms for them. Everything here is plain
//! arithmetic on byte buffers, testable without MLX.

use half::{bf16, f16};
use rlx_transport::{CollectiveError, DType, ReduceKind, Result};

/// MLX's element types, with the codes of `shim/rlx_mlx_shim.h`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(
    not(feature = "mlx"),
    allow(dead_code, reason = "used by the MLX-backed transport")
)]
pub(crate) enum MlxDtype {
    U8 = 1,
    I8 = 5,
    I32 = 7,
    I64 = 8,
    F16 = 9,
    BF16 = 10,
    F32 = 11,
    F64 = 12,
}

impl MlxDtype {
    /// The MLX type that holds RLX's `dtype` unchanged (`None` for a dtype added to RLX
    /// later that MLX lacks).
    pub(crate) const fn of(dtype: DType) -> Option<MlxDtype> {
        Some(match dtype {
            DType::F16 => MlxDtype::F16,
            DType::BF16 => MlxDtype::BF16,
            DType::F32 => MlxDtype::F32,
            DType::F64 => MlxDtype::F64,
            DType::I8 => MlxDtype::I8,
            DType::U8 => MlxDtype::U8,
            DType::I32 => MlxDtype::I32,
            DType::I64 => MlxDtype::I64,
            _ => return None,
        })
    }

    /// The shim's code for this type.
    #[cfg_attr(
        not(feature = "mlx"),
        allow(dead_code, reason = "used by the MLX-backed transport")
    )]
    pub(crate) const fn code(self) -> i32 {
        self as i32
    }

    pub(crate) const fn size(self) -> usize {
        match self {
            MlxDtype::U8 | MlxDtype::I8 => 1,
            MlxDtype::F16 | MlxDtype::BF16 => 2,
            MlxDtype::F32 | MlxDtype::I32 => 4,
            MlxDtype::F64 | MlxDtype::I64 => 8,
        }
    }
}

/// MLX's native reductions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MlxReduce {
    Sum = 0,
    Max = 1,
    Min = 2,
}

/// How one all-reduce (or reduce-scatter) runs on MLX.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ReducePlan {
    /// The element type MLX reduces in.
    pub(crate) wire: MlxDtype,
    /// The reduction MLX runs.
    pub(crate) op: MlxReduce,
    /// The RLX dtype of the caller's buffer.
    pub(crate) dtype: DType,
    /// The RLX reduction asked for.
    pub(crate) reduce: ReduceKind,
}

impl ReducePlan {
    /// The plan for `reduce` on `dtype`, or `None` when MLX cannot do it with RLX's semantics.
    pub(crate) fn new(dtype: DType, reduce: ReduceKind) -> Option<ReducePlan> {
        let (wire, op) = match reduce {
            ReduceKind::Max => (MlxDtype::of(dtype)?, MlxReduce::Max),
            ReduceKind::Min => (MlxDtype::of(dtype)?, MlxReduce::Min),
            ReduceKind::Sum | ReduceKind::Mean => {
                let wire = match dtype {
                    DType::F16 | DType::BF16 | DType::F32 => MlxDtype::F32,
                    DType::F64 => MlxDtype::F64,
                    DType::I8 | DType::U8 | DType::I32 => MlxDtype::I64,
                    _ => return None,
                };
                (wire, MlxReduce::Sum)
            }
            _ => return None,
        };
        Some(ReducePlan {
            wire,
            op,
            dtype,
            reduce,
        })
    }

    /// Whether MLX can reduce the caller's bytes as they are (no widening, no final step).
    pub(crate) fn in_place(&self) -> bool {
        MlxDtype::of(self.dtype) == Some(self.wire) && self.reduce != ReduceKind::Mean
    }

    /// The caller's elements converted to the wire type.
    pub(crate) fn widen(&self, data: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(data.len() / self.dtype.size() * self.wire.size());
        match (self.dtype, self.wire) {
            (DType::F16, MlxDtype::F32) => each::<2>(data, |b| {
                out.extend_from_slice(&f16::from_le_bytes(b).to_f32().to_le_bytes());
            }),
            (DType::BF16, MlxDtype::F32) => each::<2>(data, |b| {
                out.extend_from_slice(&bf16::from_le_bytes(b).to_f32().to_le_bytes());
            }),
            (DType::I8, MlxDtype::I64) => {
                each::<1>(data, |b| {
                    out.extend_from_slice(&i64::from(b[0] as i8).to_le_bytes())
                });
            }
            (DType::U8, MlxDtype::I64) => {
                each::<1>(data, |b| {
                    out.extend_from_slice(&i64::from(b[0]).to_le_bytes())
                });
            }
            (DType::I32, MlxDtype::I64) => each::<4>(data, |b| {
                out.extend_from_slice(&i64::from(i32::from_le_bytes(b)).to_le_bytes());
            }),
            _ => out.extend_from_slice(data),
        }
        out
    }

    /// Writes the reduced wire elements back into the caller's `data`, dividing by `world` for
    /// `Mean` and narrowing once.
    pub(crate) fn narrow(&self, wire: &[u8], data: &mut [u8], world: u32) -> Result<()> {
        let count = data.len() / self.dtype.size();
        if wire.len() != count * self.wire.size() {
            return Err(CollectiveError::LengthMismatch {
                op: "native all_reduce",
                peer: None,
                expected: (count * self.wire.size()) as u64,
                got: wire.len() as u64,
                dtype: None,
                lengths: Vec::new(),
            });
        }
        let mean = self.reduce == ReduceKind::Mean;
        if !mean && MlxDtype::of(self.dtype) == Some(self.wire) {
            data.copy_from_slice(wire);
            return Ok(());
        }
        let n = f64::from(world);
        // Fixed-size elements on both sides, so that every element is moved by value instead
        // of by a `memcpy` call of a length known only at run time.
        match (self.wire, self.dtype) {
            (MlxDtype::F32, dtype) => {
                let scaled = |b: [u8; 4]| {
                    let v = f32::from_le_bytes(b);
                    if mean { v / world as f32 } else { v }
                };
                match dtype {
                    DType::F16 => {
                        map_elements(wire, data, |b| f16::from_f32(scaled(b)).to_le_bytes())
                    }
                    DType::BF16 => {
                        map_elements(wire, data, |b| bf16::from_f32(scaled(b)).to_le_bytes())
                    }
                    _ => map_elements(wire, data, |b| scaled(b).to_le_bytes()),
                }
            }
            (MlxDtype::F64, _) => map_elements(wire, data, |b| {
                let v = f64::from_le_bytes(b);
                (if mean { v / n } else { v }).to_le_bytes()
            }),
            (MlxDtype::I64, dtype) => {
                let reduced = |b: [u8; 8]| {
                    let sum = i64::from_le_bytes(b);
                    if mean { mean_rounded(sum, world) } else { sum }
                };
                match dtype {
                    DType::I8 => map_elements(wire, data, |b| {
                        [reduced(b).clamp(i8::MIN.into(), i8::MAX.into()) as i8 as u8]
                    }),
                    DType::U8 => {
                        map_elements(wire, data, |b| [reduced(b).clamp(0, u8::MAX.into()) as u8])
                    }
                    DType::I32 => map_elements(wire, data, |b| {
                        (reduced(b).clamp(i32::MIN.into(), i32::MAX.into()) as i32).to_le_bytes()
                    }),
                    _ => map_elements(wire, data, |b| reduced(b).to_le_bytes()),
                }
            }
            _ => data.copy_from_slice(wire),
        }
        Ok(())
    }
}

impl ReducePlan {
    /// Combines `other` into `acc` (`acc = acc ⊕ other`), both wire elements, the way MLX's
    /// reduction would: used when ranks exchange small buffers directly instead of calling
    /// MLX's collective. Every rank combines the contributions in rank order, so all get the
    /// same bits.
    pub(crate) fn accumulate(&self, acc: &mut [u8], other: &[u8]) {
        self.combine_into(acc, other, false);
    }

    /// Combines the earlier contributions `earlier` into `acc` from the left
    /// (`acc = earlier ⊕ acc`), keeping rank order when `acc` holds a later rank's elements.
    pub(crate) fn accumulate_after(&self, acc: &mut [u8], earlier: &[u8]) {
        self.combine_into(acc, earlier, true);
    }

    fn combine_into(&self, acc: &mut [u8], other: &[u8], other_first: bool) {
        macro_rules! combine {
            ($t:ty, $n:literal, $from:expr, $to:expr) => {
                for (a, b) in acc.chunks_exact_mut($n).zip(other.chunks_exact($n)) {
                    let mut x = [0u8; $n];
                    x.copy_from_slice(a);
                    let mut y = [0u8; $n];
                    y.copy_from_slice(b);
                    let (mut x, mut y): ($t, $t) = ($from(x), $from(y));
                    if other_first {
                        std::mem::swap(&mut x, &mut y);
                    }
                    let v = match self.op {
                        MlxReduce::Sum => x + y,
                        MlxReduce::Max => {
                            if y > x {
                                y
                            } else {
                                x
                            }
                        }
                        MlxReduce::Min => {
                            if y < x {
                                y
                            } else {
                                x
                            }
                        }
                    };
                    a.copy_from_slice(&$to(v));
                }
            };
        }
        match self.wire {
            MlxDtype::U8 => combine!(u8, 1, u8::from_le_bytes, u8::to_le_bytes),
            MlxDtype::I8 => combine!(i8, 1, i8::from_le_bytes, i8::to_le_bytes),
            MlxDtype::I32 => combine!(i32, 4, i32::from_le_bytes, i32::to_le_bytes),
            MlxDtype::I64 => combine!(i64, 8, i64::from_le_bytes, i64::to_le_bytes),
            MlxDtype::F16 => combine!(f16, 2, f16::from_le_bytes, f16::to_le_bytes),
            MlxDtype::BF16 => combine!(bf16, 2, bf16::from_le_bytes, bf16::to_le_bytes),
            MlxDtype::F32 => combine!(f32, 4, f32::from_le_bytes, f32::to_le_bytes),
            MlxDtype::F64 => combine!(f64, 8, f64::from_le_bytes, f64::to_le_bytes),
        }
    }
}

/// `sum / world` rounded to nearest, halves away from zero.
fn mean_rounded(sum: i64, world: u32) -> i64 {
    let n = i128::from(world.max(1));
    let s = i128::from(sum);
    let q = s / n;
    let r = s % n;
    let q = if 2 * r.abs() >= n { q + s.signum() } else { q };
    q as i64
}

fn each<const N: usize>(data: &[u8], mut f: impl FnMut([u8; N])) {
    for chunk in data.chunks_exact(N) {
        let mut b = [0u8; N];
        b.copy_from_slice(chunk);
        f(b);
    }
}

/// Writes `f` of every `I`-byte element of `from` into the `O`-byte elements of `to`, which
/// hold as many elements.
fn map_elements<const I: usize, const O: usize>(
    from: &[u8],
    to: &mut [u8],
    f: impl Fn([u8; I]) -> [u8; O],
) {
    for (dst, src) in to.chunks_exact_mut(O).zip(from.chunks_exact(I)) {
        let mut b = [0u8; I];
        b.copy_from_slice(src);
        dst.copy_from_slice(&f(b));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_follow_the_precision_rules() {
        let p = ReducePlan::new(DType::F16, ReduceKind::Sum).unwrap();
        assert_eq!(p.wire, MlxDtype::F32);
        assert!(!p.in_place());
        assert!(
            ReducePlan::new(DType::F32, ReduceKind::Sum)
                .unwrap()
                .in_place()
        );
        assert!(
            !ReducePlan::new(DType::F32, ReduceKind::Mean)
                .unwrap()
                .in_place()
        );
        assert!(ReducePlan::new(DType::I64, ReduceKind::Sum).is_none());
        assert!(ReducePlan::new(DType::F32, ReduceKind::Product).is_none());
        let max = ReducePlan::new(DType::BF16, ReduceKind::Max).unwrap();
        assert_eq!((max.wire, max.op), (MlxDtype::BF16, MlxReduce::Max));
        assert!(max.in_place());
    }

    /// A mean of f16 values whose sum passes 65504 stays right because the sum is in f32.
    #[test]
    fn f16_mean_past_the_f16_range() {
        let plan = ReducePlan::new(DType::F16, ReduceKind::Mean).unwrap();
        let mine: Vec<u8> = [60000.0f32, 1.5]
            .iter()
            .flat_map(|&v| f16::from_f32(v).to_le_bytes())
            .collect();
        let mut wire = plan.widen(&mine);
        // Stand in for MLX's sum over two ranks holding the same values.
        for chunk in wire.chunks_exact_mut(4) {
            let v = f32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
            chunk.copy_from_slice(&(2.0 * v).to_le_bytes());
        }
        let mut out = mine.clone();
        plan.narrow(&wire, &mut out, 2).unwrap();
        assert_eq!(out, mine);
    }

    #[test]
    fn accumulate_matches_the_reduction() {
        let sum = ReducePlan::new(DType::I8, ReduceKind::Sum).unwrap();
        let mut acc = sum.widen(&[100u8, 200]);
        sum.accumulate(&mut acc, &sum.widen(&[100u8, 200]));
        let mut out = [0u8; 2];
        sum.narrow(&acc, &mut out, 2).unwrap();
        assert_eq!(out.map(|b| b as i8), [127, -112]);
        let max = ReducePlan::new(DType::BF16, ReduceKind::Max).unwrap();
        let a: Vec<u8> = [1.5f32, -2.0]
            .iter()
            .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
            .collect();
        let b: Vec<u8> = [-1.0f32, 3.0]
            .iter()
            .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
            .collect();
        let mut acc = max.widen(&a);
        max.accumulate(&mut acc, &max.widen(&b));
        let expected: Vec<u8> = [1.5f32, 3.0]
            .iter()
            .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
            .collect();
        assert_eq!(acc, expected);
    }

    /// `accumulate_after` is `accumulate` with the operands' order swapped, down to which of
    /// two unordered (NaN) operands wins, so ranks that combine from either side agree.
    #[test]
    fn accumulating_from_the_left_keeps_the_order() {
        let nan = f32::NAN.to_le_bytes();
        let one = 1.0f32.to_le_bytes();
        for reduce in [ReduceKind::Sum, ReduceKind::Max, ReduceKind::Min] {
            let plan = ReducePlan::new(DType::F32, reduce).unwrap();
            for (a, b) in [(nan, one), (one, nan), (one, 2.5f32.to_le_bytes())] {
                let mut forward = a.to_vec();
                plan.accumulate(&mut forward, &b);
                let mut from_left = b.to_vec();
                plan.accumulate_after(&mut from_left, &a);
                assert_eq!(forward, from_left, "{reduce}");
            }
        }
    }

    #[test]
    fn narrowing_in_place_plans_copies_and_means_divide() {
        let sum = ReducePlan::new(DType::F32, ReduceKind::Sum).unwrap();
        let wire: Vec<u8> = [3.0f32, -1.5]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let mut out = [0u8; 8];
        sum.narrow(&wire, &mut out, 2).unwrap();
        assert_eq!(&out[..], &wire[..]);
        let mean = ReducePlan::new(DType::F32, ReduceKind::Mean).unwrap();
        mean.narrow(&wire, &mut out, 2).unwrap();
        let halves: Vec<u8> = [1.5f32, -0.75]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(&out[..], &halves[..]);
        let f64_mean = ReducePlan::new(DType::F64, ReduceKind::Mean).unwrap();
        let mut out = [0u8; 8];
        f64_mean.narrow(&9.0f64.to_le_bytes(), &mut out, 3).unwrap();
        assert_eq!(out, 3.0f64.to_le_bytes());
        assert!(matches!(
            sum.narrow(&wire[..4], &mut [0u8; 8], 2),
            Err(CollectiveError::LengthMismatch { .. })
        ));
    }

    #[test]
    fn integer_sums_saturate_and_means_round() {
        let plan = ReducePlan::new(DType::I8, ReduceKind::Sum).unwrap();
        let wire: Vec<u8> = [300i64, -300, 5]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let mut out = [0u8; 3];
        plan.narrow(&wire, &mut out, 3).unwrap();
        assert_eq!(out.map(|b| b as i8), [127, -128, 5]);
        assert_eq!(mean_rounded(5, 2), 3);
        assert_eq!(mean_rounded(-5, 2), -3);
        assert_eq!(mean_rounded(4, 3), 1);
        assert_eq!(mean_rounded(-4, 3), -1);
        assert_eq!(mean_rounded(i64::MAX, 1), i64::MAX);
        let u = ReducePlan::new(DType::U8, ReduceKind::Mean).unwrap();
        assert_eq!(u.widen(&[255, 1]).len(), 16);
    }
}
