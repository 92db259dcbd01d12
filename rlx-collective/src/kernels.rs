//! Reduction kernels: widening a dtype into its accumulation type, combining accumulators, and
//! narrowing the final result, for every [`DType`] × [`ReduceKind`].
//!
//! Every algorithm accumulates in a wide type across all hops (f32 for f16/bf16/f32, f64 for
//! f64, i64 for the integers) and narrows exactly once, on the rank that finishes a block.
//! Buffers are raw little-endian bytes: user slices may be unaligned, so elements are read with
//! `from_le_bytes` on exact-size chunks, which compiles to plain (vectorisable) loads on
//! little-endian targets and is correct everywhere.
//!
//! The combine functions are commutative bit for bit (NaN is canonical, `max(-0, +0)` is `+0`,
//! `min(-0, +0)` is `-0`), so ranks that combine the same operands in a different order — as
//! recursive doubling does — still end bit-identical.

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use crate::{CollectiveError, DType, ReduceKind, Result};

/// Elements per block of the blocked kernels: small enough for the stack, large enough to
/// amortise per-call work such as the CPU-feature check of f16 conversions.
const BLOCK: usize = 256;

/// An accumulation type: what partial results are made of and travel as.
trait Wide: Copy {
    /// Size in bytes on the wire.
    const SIZE: usize;
    const ZERO: Self;
    fn load(bytes: &[u8]) -> Self;
    fn store(self, bytes: &mut [u8]);
    fn sum(a: Self, b: Self) -> Self;
    fn product(a: Self, b: Self) -> Self;
    fn max(a: Self, b: Self) -> Self;
    fn min(a: Self, b: Self) -> Self;
    /// `sum / world` with the rounding rule of the type.
    fn mean(sum: Self, world: u32) -> Self;
}

/// A dtype as stored by the user, with its accumulation type.
trait Narrow: Copy {
    type W: Wide;
    const SIZE: usize;
    fn load(bytes: &[u8]) -> Self;
    fn store(self, bytes: &mut [u8]);
    fn widen(self) -> Self::W;
    /// Rounds (floats) or saturates (integers) the accumulator into this type.
    fn narrow(wide: Self::W) -> Self;

    /// Whether the kernels should convert a block at a time through
    /// [`Narrow::widen_block`]/[`Narrow::narrow_block`] (worth it where those are faster than
    /// the per-element conversion; the plain loops vectorise better otherwise).
    const BLOCKED: bool = false;

    /// Widens the elements in `src` into `dst` (as many as `dst` holds, at most [`BLOCK`]).
    #[inline(always)]
    fn widen_block(src: &[u8], dst: &mut [Self::W]) {
        for (s, d) in src.chunks_exact(Self::SIZE).zip(dst) {
            *d = Self::load(s).widen();
        }
    }

    /// Narrows `src` (at most [`BLOCK`] accumulators) into the elements of `dst`.
    #[inline(always)]
    fn narrow_block(src: &[Self::W], dst: &mut [u8]) {
        for (w, d) in src.iter().zip(dst.chunks_exact_mut(Self::SIZE)) {
            Self::narrow(*w).store(d);
        }
    }
}

macro_rules! le_codec {
    ($t:ty, $n:literal) => {
        const SIZE: usize = $n;
        #[inline(always)]
        fn load(bytes: &[u8]) -> Self {
            // The callers pass chunks of exactly SIZE bytes, so the fallback is never taken; it
            // only keeps this free of panics.
            bytes
                .first_chunk::<$n>()
                .map_or(<$t>::from_le_bytes([0; $n]), |b| <$t>::from_le_bytes(*b))
        }
        #[inline(always)]
        fn store(self, bytes: &mut [u8]) {
            if let Some(b) = bytes.first_chunk_mut::<$n>() {
                *b = self.to_le_bytes();
            }
        }
    };
}

macro_rules! float_wide {
    ($t:ty, $n:literal) => {
        impl Wide for $t {
            const ZERO: Self = 0.0;
            le_codec!($t, $n);
            #[inline(always)]
            fn sum(a: Self, b: Self) -> Self {
                canonical(a + b)
            }
            #[inline(always)]
            fn product(a: Self, b: Self) -> Self {
                canonical(a * b)
            }
            #[inline(always)]
            fn max(a: Self, b: Self) -> Self {
                if a.is_nan() || b.is_nan() {
                    <$t>::NAN
                } else if a == b {
                    // Equal values differ at most in the sign of zero; AND keeps +0.
                    <$t>::from_bits(a.to_bits() & b.to_bits())
                } else if a > b {
                    a
                } else {
                    b
                }
            }
            #[inline(always)]
            fn min(a: Self, b: Self) -> Self {
                if a.is_nan() || b.is_nan() {
                    <$t>::NAN
                } else if a == b {
                    // OR keeps -0.
                    <$t>::from_bits(a.to_bits() | b.to_bits())
                } else if a < b {
                    a
                } else {
                    b
                }
            }
            #[inline(always)]
            fn mean(sum: Self, world: u32) -> Self {
                canonical(sum / world as $t)
            }
        }
    };
}

/// Replaces every NaN by the canonical quiet NaN, so that the payload a CPU happens to
/// propagate from one operand cannot make `a + b` and `b + a` differ in their bits.
#[inline(always)]
fn canonical<T: num_like::Float>(x: T) -> T {
    if x.is_nan() { T::NAN } else { x }
}

mod num_like {
    //! The two float types the canonical-NaN helper is used with.

    /// A float with a canonical NaN.
    pub(super) trait Float: Copy {
        const NAN: Self;
        fn is_nan(self) -> bool;
    }
    impl Float for f32 {
        const NAN: Self = f32::NAN;
        fn is_nan(self) -> bool {
            f32::is_nan(self)
        }
    }
    impl Float for f64 {
        const NAN: Self = f64::NAN;
        fn is_nan(self) -> bool {
            f64::is_nan(self)
        }
    }
}

float_wide!(f32, 4);
float_wide!(f64, 8);

impl Wide for i64 {
    const ZERO: Self = 0;
    le_codec!(i64, 8);
    #[inline(always)]
    fn sum(a: Self, b: Self) -> Self {
        a.saturating_add(b)
    }
    #[inline(always)]
    fn product(a: Self, b: Self) -> Self {
        a.saturating_mul(b)
    }
    #[inline(always)]
    fn max(a: Self, b: Self) -> Self {
        Ord::max(a, b)
    }
    #[inline(always)]
    fn min(a: Self, b: Self) -> Self {
        Ord::min(a, b)
    }
    #[inline(always)]
    fn mean(sum: Self, world: u32) -> Self {
        // Round to nearest, halves away from zero. |remainder| < world <= u32::MAX, so doubling
        // it cannot overflow, and |quotient| < |sum| leaves room for the correction.
        let n = i64::from(world.max(1));
        let quotient = sum / n;
        let remainder = sum % n;
        if 2 * remainder.abs() >= n {
            quotient + sum.signum()
        } else {
            quotient
        }
    }
}

macro_rules! float_narrow {
    ($t:ty, $n:literal, $w:ty, $widen:expr, $narrow:expr) => {
        impl Narrow for $t {
            type W = $w;
            le_codec!($t, $n);
            #[inline(always)]
            fn widen(self) -> $w {
                $widen(self)
            }
            #[inline(always)]
            fn narrow(wide: $w) -> Self {
                $narrow(wide)
            }
        }
    };
}

/// f16 converts a block at a time: `half`'s slice conversions use the F16C instructions where
/// the CPU has them, while its per-element conversion re-checks the CPU on every call.
impl Narrow for f16 {
    type W = f32;
    const BLOCKED: bool = true;
    le_codec!(f16, 2);
    #[inline(always)]
    fn widen(self) -> f32 {
        self.to_f32()
    }
    #[inline(always)]
    fn narrow(wide: f32) -> Self {
        f16::from_f32(wide)
    }
    #[inline(always)]
    fn widen_block(src: &[u8], dst: &mut [f32]) {
        let mut halves = [f16::ZERO; BLOCK];
        let k = dst.len().min(BLOCK).min(src.len() / 2);
        for (h, s) in halves[..k].iter_mut().zip(src.chunks_exact(2)) {
            *h = f16::load(s);
        }
        halves[..k].convert_to_f32_slice(&mut dst[..k]);
    }
    #[inline(always)]
    fn narrow_block(src: &[f32], dst: &mut [u8]) {
        let mut halves = [f16::ZERO; BLOCK];
        let k = src.len().min(BLOCK).min(dst.len() / 2);
        halves[..k].convert_from_f32_slice(&src[..k]);
        for (h, d) in halves[..k].iter().zip(dst.chunks_exact_mut(2)) {
            h.store(d);
        }
    }
}

float_narrow!(bf16, 2, f32, bf16::to_f32, bf16::from_f32);
float_narrow!(f32, 4, f32, |x| x, |x| x);
float_narrow!(f64, 8, f64, |x| x, |x| x);

macro_rules! int_narrow {
    ($t:ty, $n:literal) => {
        impl Narrow for $t {
            type W = i64;
            le_codec!($t, $n);
            #[inline(always)]
            fn widen(self) -> i64 {
                i64::from(self)
            }
            #[inline(always)]
            fn narrow(wide: i64) -> Self {
                wide.clamp(i64::from(<$t>::MIN), i64::from(<$t>::MAX)) as $t
            }
        }
    };
}

int_narrow!(i8, 1);
int_narrow!(u8, 1);
int_narrow!(i32, 4);
int_narrow!(i64, 8);

fn unknown_dtype(dtype: DType) -> CollectiveError {
    CollectiveError::unsupported(format!("reductions on dtype {dtype}"))
}

fn unknown_reduce(reduce: ReduceKind) -> CollectiveError {
    CollectiveError::unsupported(format!("reduction {reduce}"))
}

/// Calls the generic function `$f::<T>($args)` with `T` the element type of `$dtype`.
macro_rules! with_narrow {
    ($dtype:expr, $f:ident ( $($arg:expr),* )) => {
        match $dtype {
            DType::F16 => $f::<f16>($($arg),*),
            DType::BF16 => $f::<bf16>($($arg),*),
            DType::F32 => $f::<f32>($($arg),*),
            DType::F64 => $f::<f64>($($arg),*),
            DType::I8 => $f::<i8>($($arg),*),
            DType::U8 => $f::<u8>($($arg),*),
            DType::I32 => $f::<i32>($($arg),*),
            DType::I64 => $f::<i64>($($arg),*),
            other => Err(unknown_dtype(other)),
        }
    };
}

/// The dtype whose elements are `dtype`'s accumulators (f32 for the half floats and f32, f64
/// for f64, i64 for the integers), so that accumulators can be reduced further as elements of
/// their own: reducing those with the same reduction is exactly what accumulating does.
pub(crate) fn wide_dtype(dtype: DType) -> DType {
    match dtype {
        DType::F16 | DType::BF16 | DType::F32 => DType::F32,
        DType::F64 => DType::F64,
        _ => DType::I64,
    }
}

/// Size in bytes of one accumulator element of `dtype`.
pub(crate) fn wide_size(dtype: DType) -> Result<usize> {
    fn size<N: Narrow>() -> Result<usize> {
        Ok(N::W::SIZE)
    }
    with_narrow!(dtype, size())
}

/// Whether `dtype` accumulates in its own type (f32, f64, i64): its wide form is its bytes, and
/// narrowing the accumulator back changes nothing, so algorithms may skip both conversions.
pub(crate) fn accumulates_in_kind(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::F64 | DType::I64)
}

/// Refuses reductions this build does not know (`ReduceKind` is non-exhaustive).
fn known(reduce: ReduceKind) -> Result<()> {
    match reduce {
        ReduceKind::Sum
        | ReduceKind::Mean
        | ReduceKind::Product
        | ReduceKind::Max
        | ReduceKind::Min => Ok(()),
        other => Err(unknown_reduce(other)),
    }
}

/// Widens the `dtype` elements of `src` into accumulator elements in `dst`.
pub(crate) fn widen(dtype: DType, src: &[u8], dst: &mut [u8]) -> Result<()> {
    fn run<N: Narrow>(src: &[u8], dst: &mut [u8]) -> Result<()> {
        if !N::BLOCKED {
            for (s, d) in src
                .chunks_exact(N::SIZE)
                .zip(dst.chunks_exact_mut(N::W::SIZE))
            {
                N::load(s).widen().store(d);
            }
            return Ok(());
        }
        let mut wide = [N::W::ZERO; BLOCK];
        for (s, d) in src
            .chunks(BLOCK * N::SIZE)
            .zip(dst.chunks_mut(BLOCK * N::W::SIZE))
        {
            let k = (s.len() / N::SIZE).min(d.len() / N::W::SIZE);
            N::widen_block(s, &mut wide[..k]);
            for (w, d) in wide[..k].iter().zip(d.chunks_exact_mut(N::W::SIZE)) {
                w.store(d);
            }
        }
        Ok(())
    }
    with_narrow!(dtype, run(src, dst))
}

/// `acc[i] = acc[i] ⊕ widen(src[i])`: folds this rank's own `dtype` elements into a received
/// partial.
pub(crate) fn accumulate_narrow(
    dtype: DType,
    reduce: ReduceKind,
    acc: &mut [u8],
    src: &[u8],
) -> Result<()> {
    fn run<N: Narrow>(reduce: ReduceKind, acc: &mut [u8], src: &[u8]) -> Result<()> {
        // Monomorphising per operator keeps the loop free of a per-element branch.
        fn apply<N: Narrow>(acc: &mut [u8], src: &[u8], f: impl Fn(N::W, N::W) -> N::W) {
            if !N::BLOCKED {
                for (a, s) in acc
                    .chunks_exact_mut(N::W::SIZE)
                    .zip(src.chunks_exact(N::SIZE))
                {
                    f(N::W::load(a), N::load(s).widen()).store(a);
                }
                return;
            }
            let mut wide = [N::W::ZERO; BLOCK];
            for (a, s) in acc
                .chunks_mut(BLOCK * N::W::SIZE)
                .zip(src.chunks(BLOCK * N::SIZE))
            {
                let k = (s.len() / N::SIZE).min(a.len() / N::W::SIZE);
                N::widen_block(s, &mut wide[..k]);
                for (a, w) in a.chunks_exact_mut(N::W::SIZE).zip(&wide[..k]) {
                    f(N::W::load(a), *w).store(a);
                }
            }
        }
        match reduce {
            ReduceKind::Sum | ReduceKind::Mean => apply::<N>(acc, src, N::W::sum),
            ReduceKind::Product => apply::<N>(acc, src, N::W::product),
            ReduceKind::Max => apply::<N>(acc, src, N::W::max),
            ReduceKind::Min => apply::<N>(acc, src, N::W::min),
            other => return Err(unknown_reduce(other)),
        }
        Ok(())
    }
    with_narrow!(dtype, run(reduce, acc, src))
}

/// `acc[i] = acc[i] ⊕ other[i]` on accumulators of `dtype`.
pub(crate) fn accumulate_wide(
    dtype: DType,
    reduce: ReduceKind,
    acc: &mut [u8],
    other: &[u8],
) -> Result<()> {
    fn run<N: Narrow>(reduce: ReduceKind, acc: &mut [u8], other: &[u8]) -> Result<()> {
        fn apply<W: Wide>(acc: &mut [u8], other: &[u8], f: impl Fn(W, W) -> W) {
            for (a, o) in acc
                .chunks_exact_mut(W::SIZE)
                .zip(other.chunks_exact(W::SIZE))
            {
                f(W::load(a), W::load(o)).store(a);
            }
        }
        match reduce {
            ReduceKind::Sum | ReduceKind::Mean => apply::<N::W>(acc, other, N::W::sum),
            ReduceKind::Product => apply::<N::W>(acc, other, N::W::product),
            ReduceKind::Max => apply::<N::W>(acc, other, N::W::max),
            ReduceKind::Min => apply::<N::W>(acc, other, N::W::min),
            unknown => return Err(unknown_reduce(unknown)),
        }
        Ok(())
    }
    with_narrow!(dtype, run(reduce, acc, other))
}

/// Narrows the fully reduced accumulators `acc` into `dtype` elements in `dst`, dividing by
/// `world` first for [`ReduceKind::Mean`].
pub(crate) fn finish(
    dtype: DType,
    reduce: ReduceKind,
    world: u32,
    acc: &[u8],
    dst: &mut [u8],
) -> Result<()> {
    fn run<N: Narrow>(reduce: ReduceKind, world: u32, acc: &[u8], dst: &mut [u8]) -> Result<()> {
        known(reduce)?;
        let mean = reduce == ReduceKind::Mean;
        if !N::BLOCKED {
            let pairs = acc
                .chunks_exact(N::W::SIZE)
                .zip(dst.chunks_exact_mut(N::SIZE));
            if mean {
                for (a, d) in pairs {
                    N::narrow(N::W::mean(N::W::load(a), world)).store(d);
                }
            } else {
                for (a, d) in pairs {
                    N::narrow(N::W::load(a)).store(d);
                }
            }
            return Ok(());
        }
        let mut wide = [N::W::ZERO; BLOCK];
        for (a, d) in acc
            .chunks(BLOCK * N::W::SIZE)
            .zip(dst.chunks_mut(BLOCK * N::SIZE))
        {
            let k = (a.len() / N::W::SIZE).min(d.len() / N::SIZE);
            for (w, a) in wide[..k].iter_mut().zip(a.chunks_exact(N::W::SIZE)) {
                let x = N::W::load(a);
                *w = if mean { N::W::mean(x, world) } else { x };
            }
            N::narrow_block(&wide[..k], d);
        }
        Ok(())
    }
    with_narrow!(dtype, run(reduce, world, acc, dst))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reduce_all(dtype: DType, reduce: ReduceKind, inputs: &[Vec<u8>]) -> Vec<u8> {
        let ws = wide_size(dtype).unwrap();
        let count = inputs[0].len() / dtype.size();
        let mut acc = vec![0u8; count * ws];
        widen(dtype, &inputs[0], &mut acc).unwrap();
        for input in &inputs[1..] {
            accumulate_narrow(dtype, reduce, &mut acc, input).unwrap();
        }
        let mut out = vec![0u8; inputs[0].len()];
        finish(dtype, reduce, inputs.len() as u32, &acc, &mut out).unwrap();
        out
    }

    #[test]
    fn integer_mean_rounds_to_nearest() {
        let i8s = |v: &[i8]| v.iter().map(|x| *x as u8).collect::<Vec<u8>>();
        let out = reduce_all(
            DType::I8,
            ReduceKind::Mean,
            &[i8s(&[100]), i8s(&[100]), i8s(&[100])],
        );
        assert_eq!(out, i8s(&[100]));
        // (1 + 2) / 2 = 1.5 rounds away from zero; (-1 - 2) / 2 = -1.5 likewise.
        let out = reduce_all(DType::I8, ReduceKind::Mean, &[i8s(&[1, -1]), i8s(&[2, -2])]);
        assert_eq!(out, i8s(&[2, -2]));
        let out = reduce_all(DType::I8, ReduceKind::Sum, &[i8s(&[100]), i8s(&[100])]);
        assert_eq!(out, i8s(&[127]));
    }

    #[test]
    fn f16_mean_past_the_f16_range() {
        let x = f16::from_f32(30000.0).to_le_bytes().to_vec();
        let out = reduce_all(
            DType::F16,
            ReduceKind::Mean,
            &[x.clone(), x.clone(), x.clone(), x],
        );
        assert_eq!(f16::from_le_bytes([out[0], out[1]]).to_f32(), 30000.0);
    }

    #[test]
    fn accumulating_in_kind_means_the_conversions_are_identities() {
        let bytes: Vec<u8> = (0..64u8).map(|b| b.wrapping_mul(37)).collect();
        for dtype in DType::ALL {
            let count = bytes.len() / dtype.size();
            let own = &bytes[..count * dtype.size()];
            let mut wide = vec![0u8; count * wide_size(dtype).unwrap()];
            widen(dtype, own, &mut wide).unwrap();
            let mut narrow = vec![0u8; own.len()];
            finish(dtype, ReduceKind::Sum, 2, &wide, &mut narrow).unwrap();
            let identity = wide == own && narrow == own;
            assert_eq!(accumulates_in_kind(dtype), identity, "{dtype}");
            let wide = wide_dtype(dtype);
            assert_eq!(wide_size(dtype).unwrap(), wide.size(), "{dtype}");
            assert!(accumulates_in_kind(wide), "{dtype}");
        }
    }

    #[test]
    fn max_min_of_signed_zeros_and_nan_commute() {
        let pz = 0.0f32;
        let nz = -0.0f32;
        assert_eq!(
            <f32 as Wide>::max(pz, nz).to_bits(),
            <f32 as Wide>::max(nz, pz).to_bits()
        );
        assert_eq!(<f32 as Wide>::max(nz, pz).to_bits(), pz.to_bits());
        assert_eq!(<f32 as Wide>::min(pz, nz).to_bits(), nz.to_bits());
        let a = f32::from_bits(0x7fc0_0001);
        let b = f32::from_bits(0xffc0_0002);
        assert_eq!(
            <f32 as Wide>::sum(a, b).to_bits(),
            <f32 as Wide>::sum(b, a).to_bits()
        );
        assert!(<f64 as Wide>::max(f64::NAN, 1.0).is_nan());
    }
}
