//! Deterministic inputs for the conformance cases: every rank can compute every rank's input
//! from (seed, case, rank), so the serial reference needs no communication.
//!
//! Value ranges keep the wide accumulator from saturating in the middle of a reduction (where
//! the result would depend on the order of the hops) while still exercising the final
//! narrowing: integer sums and products saturate in i8/u8/i32, floats stay finite.

use half::{bf16, f16};

use crate::{DType, ReduceKind};

/// The SplitMix64 generator: tiny, fast and good enough to make test data look random (and
/// to draw seeded test plans: a failing trial replays from its seed).
#[derive(Clone, Debug)]
pub struct SplitMix(u64);

impl SplitMix {
    /// The generator seeded with `seed` alone.
    pub fn seeded(seed: u64) -> Self {
        SplitMix(seed)
    }

    /// Uniform in `0..n` (`0` when `n` is 0), up to a negligible modulo bias.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    pub(crate) fn new(seed: u64, case: u64, rank: u32) -> Self {
        let mut g = SplitMix(seed ^ case.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        g.0 ^= g
            .next_u64()
            .wrapping_add(u64::from(rank).wrapping_mul(0xD1B5_4A32_D192_ED03));
        g
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// `count` elements of `dtype` for `rank` in case `case`, suited to `reduce` (`None` for the
/// collectives that only move data).
pub(crate) fn input(
    dtype: DType,
    reduce: Option<ReduceKind>,
    seed: u64,
    case: u64,
    rank: u32,
    count: usize,
) -> Vec<u8> {
    let mut g = SplitMix::new(seed, case, rank);
    let mut out = Vec::with_capacity(count * dtype.size());
    let product = reduce == Some(ReduceKind::Product);
    let sums = matches!(reduce, Some(ReduceKind::Sum | ReduceKind::Mean));
    for _ in 0..count {
        let bits = g.next_u64();
        if dtype.is_float() {
            let x = if product {
                // Magnitudes in [0.5, 2) keep a product of up to 16 factors finite in f16.
                let m = 0.5 + 1.5 * g.unit();
                if bits & 1 == 0 { m } else { -m }
            } else {
                g.unit() * 16.0 - 8.0
            };
            match dtype {
                DType::F16 => out.extend_from_slice(&f16::from_f64(x).to_le_bytes()),
                DType::BF16 => out.extend_from_slice(&bf16::from_f64(x).to_le_bytes()),
                DType::F32 => out.extend_from_slice(&(x as f32).to_le_bytes()),
                _ => out.extend_from_slice(&x.to_le_bytes()),
            }
        } else {
            let small = (bits % 7) as i64 - 3;
            match dtype {
                DType::I8 if product => out.push(small as i8 as u8),
                DType::U8 if product => out.push((bits % 4) as u8),
                DType::I32 if product => out.extend_from_slice(&(small as i32).to_le_bytes()),
                DType::I64 if product => out.extend_from_slice(&small.to_le_bytes()),
                DType::I8 | DType::U8 => out.push(bits as u8),
                DType::I32 => out.extend_from_slice(&(bits as u32).to_le_bytes()),
                // Sums of up to 32 ranks of ±2^58 stay inside i64.
                _ if sums => out.extend_from_slice(&((bits as i64) >> 6).to_le_bytes()),
                _ => out.extend_from_slice(&bits.to_le_bytes()),
            }
        }
    }
    out
}
