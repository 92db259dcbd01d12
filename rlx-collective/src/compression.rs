//! The wire formats of the compressed all-reduce ([`Compression`]) and the codecs that turn f32
//! values into frames and back, plus the [`Compressor`] that carries one tensor's
//! error-feedback residual from call to call.
//!
//! A frame holds the values of one contiguous range of elements:
//! - [`Compression::None`]: the f32 values, 4 bytes each.
//! - [`Compression::Bf16`] and [`Compression::Fp16`]: the values rounded to nearest-even, 2 bytes
//!   each (`half`'s slice conversions; Fp16 overflows to infinity beyond ±65504, as a cast does).
//! - [`Compression::Int8`]: first one f32 scale per block of [`INT8_BLOCK`] elements, then one
//!   signed byte per element; element `i` of block `b` is `q[i] × scale[b]`, with
//!   `scale = max|x| / 127` over the block and `q = round(x / scale)` (to nearest-even) in
//!   `-127..=127`.
//!
//! A frame is cut into chunks of [`FRAME_CHUNK`] values, each laid out as above.
//!
//! Frames are little-endian and carry no header: their length follows from the format and the
//! element count, which the all-reduce agrees on before the first frame. Decoding checks what a
//! frame's bytes can get wrong: a scale that is NaN, infinite, negative or larger than a block
//! of `f32::MAX` has, and a -128 (never encoded) where it would overflow, are refused, so a
//! hostile or corrupted frame never turns into a wrong answer.
//!
//! Frame buffers are `u32` words, so that the f32, bf16 and f16 views of them are aligned
//! without copies or `unsafe`; [`Compression::frame_words`] sizes them. The codecs are public
//! ([`Compression::encode`], [`Compression::decode`]) for tools that measure them and for
//! users who store compressed tensors.
//!
//! The kernels are plain loops over exact chunks that LLVM vectorises on x86-64's baseline
//! SSE2 (checked with `objdump -d` on a release build): the int8 block maximum is
//! `pand`/`pcmpgtd` on four lanes; the quantise loop `mulps`/`maxps`/`minps`/`addps` then
//! `packssdw`/`packuswb` (rounding by a magic-number add, because a float-to-int `as` cast
//! stayed scalar `cvttss2si` and ran at 2.9 GB/s where the vector loop runs at 11.5 GB/s on an
//! L2-resident megabyte); the dequantise loop `punpcklbw`/`cvtdq2ps`/`mulps`; and the error
//! feedback of the all-reduce `subps`/`addps`. The half-precision conversions are `half`'s
//! (F16C when the CPU has it, detected at run time). `cargo xtask bench --kernels` measures
//! them beside a memcpy.

use std::fmt;
use std::str::FromStr;

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use crate::{CollectiveError, Result};

/// Elements that share one f32 scale in an [`Compression::Int8`] frame: the scales cost
/// 4/256 = 1.6% on top of one byte per element, and a block small enough that one large
/// gradient does not flatten the resolution of many small ones.
pub const INT8_BLOCK: usize = 256;

/// Values per chunk of a frame. A frame is a sequence of chunks of this many values (the last
/// one shorter), each laid out as the module docs describe and starting on a word boundary,
/// so that the all-reduce can fold, compress and decompress a chunk at a time with its f32
/// buffers (16 KiB each) in the L1 cache. A multiple of [`INT8_BLOCK`], so that the chunks
/// cost no bytes: [`Compression::frame_bytes`] is that of one unchunked frame.
pub const FRAME_CHUNK: usize = 4096;

/// The largest int8 magnitude the quantiser produces (the range is symmetric, so -128 is
/// never used).
const INT8_MAX: f32 = 127.0;

/// The largest scale an int8 block can have: the largest whose product with 127 is finite.
/// `f32::MAX / 127` rounds up to a scale that overflows, so this is the float just below it;
/// a block whose largest magnitude is near `f32::MAX` gets it, and its values land a fraction
/// of an ulp lower than an exact scale would put them.
const MAX_SCALE: f32 = f32::from_bits((f32::MAX / INT8_MAX).to_bits() - 1);

/// 1.5 × 2^23: a float whose ulp is 1, so that adding it rounds to an integer (see
/// `quantise_block`).
const ROUNDING_MAGIC: f32 = 12_582_912.0;

/// How [`ProcessGroup::all_reduce_compressed`](crate::ProcessGroup::all_reduce_compressed)
/// puts f32 values on the wire. Every rank of a call must pass the same format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Compression {
    /// f32 as is (4 bytes per element): the compressed schedule without a codec, exact.
    #[default]
    None,
    /// bfloat16 (2 bytes per element): f32's range, 8 bits of mantissa.
    Bf16,
    /// IEEE half precision (2 bytes per element): 11 bits of mantissa, finite up to ±65504.
    Fp16,
    /// One signed byte per element plus one f32 scale per [`INT8_BLOCK`] elements (about
    /// 1.016 bytes per element). Refuses non-finite values.
    Int8,
}

impl Compression {
    /// Every format, in a fixed order.
    pub const ALL: [Compression; 4] = [
        Compression::None,
        Compression::Bf16,
        Compression::Fp16,
        Compression::Int8,
    ];

    /// The lowercase name used in flags, tables and errors (`"int8"`...).
    pub const fn name(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Bf16 => "bf16",
            Compression::Fp16 => "fp16",
            Compression::Int8 => "int8",
        }
    }

    /// The format's code in the all-reduce's header.
    pub(crate) const fn code(self) -> u8 {
        match self {
            Compression::None => 0,
            Compression::Bf16 => 1,
            Compression::Fp16 => 2,
            Compression::Int8 => 3,
        }
    }

    /// The format with header code `code`, if there is one.
    pub(crate) fn from_code(code: u8) -> Option<Compression> {
        Compression::ALL.into_iter().find(|c| c.code() == code)
    }

    /// Bytes of a frame that carries `elements` values in this format.
    pub const fn frame_bytes(self, elements: usize) -> usize {
        match self {
            Compression::None => 4 * elements,
            Compression::Bf16 | Compression::Fp16 => 2 * elements,
            Compression::Int8 => 4 * elements.div_ceil(INT8_BLOCK) + elements,
        }
    }

    /// Words of a frame buffer that holds `elements` values in this format (the frame's bytes
    /// rounded up to whole words).
    pub const fn frame_words(self, elements: usize) -> usize {
        self.frame_bytes(elements).div_ceil(4)
    }

    /// Compresses `src` into `frame`, which holds at least
    /// [`frame_words`](Compression::frame_words)`(src.len())` words; the frame is its first
    /// [`frame_bytes`](Compression::frame_bytes)`(src.len())` bytes. An [`Compression::Int8`]
    /// block with a NaN or infinite value is [`CollectiveError::InvalidArgument`]: no scale
    /// can carry it.
    ///
    /// # Examples
    ///
    /// ```
    /// use rlx_collective::Compression;
    ///
    /// let values = [0.5f32, -1.0, 0.25];
    /// let mut frame = vec![0u32; Compression::Int8.frame_words(values.len())];
    /// Compression::Int8.encode(&values, &mut frame)?;
    /// let mut back = [0.0f32; 3];
    /// Compression::Int8.decode(&frame, &mut back, None)?;
    /// assert_eq!(back[1], -1.0); // the block's largest magnitude is exact
    /// # Ok::<(), rlx_collective::CollectiveError>(())
    /// ```
    pub fn encode(self, src: &[f32], frame: &mut [u32]) -> Result<()> {
        let chunk_words = self.frame_words(FRAME_CHUNK);
        for (index, chunk) in src.chunks(FRAME_CHUNK).enumerate() {
            let words = frame.len();
            let at = frame
                .get_mut(index * chunk_words..)
                .ok_or(short_frame(words, self.frame_bytes(src.len())))?;
            self.encode_chunk(chunk, at)?;
        }
        Ok(())
    }

    /// [`Compression::encode`] of at most one [`FRAME_CHUNK`].
    fn encode_chunk(self, src: &[f32], frame: &mut [u32]) -> Result<()> {
        let count = src.len();
        match self {
            Compression::None => {
                as_f32s_mut(frame, count)?.copy_from_slice(src);
            }
            Compression::Bf16 => {
                half_view_mut::<bf16>(frame, count)?.convert_from_f32_slice(src);
            }
            Compression::Fp16 => {
                half_view_mut::<f16>(frame, count)?.convert_from_f32_slice(src);
            }
            Compression::Int8 => {
                let (scales, values) = int8_views_mut(frame, count)?;
                for ((block, scale), out) in src
                    .chunks(INT8_BLOCK)
                    .zip(scales.iter_mut())
                    .zip(values.chunks_mut(INT8_BLOCK))
                {
                    *scale = quantise_block(block, out)?;
                }
            }
        }
        Ok(())
    }

    /// Decompresses `frame` (the words [`Compression::encode`] filled for `dst.len()` values)
    /// into `dst`. A scale that is NaN, infinite, negative or larger than any block's, or a
    /// value the encoder never writes that would overflow at its scale, is
    /// [`CollectiveError::Protocol`] naming `peer`, the rank the frame came from (if known):
    /// decoding a frame never produces an infinity or a NaN from finite inputs.
    pub fn decode(self, frame: &[u32], dst: &mut [f32], peer: Option<u32>) -> Result<()> {
        let chunk_words = self.frame_words(FRAME_CHUNK);
        let count = dst.len();
        for (index, chunk) in dst.chunks_mut(FRAME_CHUNK).enumerate() {
            let at = frame
                .get(index * chunk_words..)
                .ok_or(short_frame(frame.len(), self.frame_bytes(count)))?;
            self.decode_chunk(at, chunk, peer)?;
        }
        Ok(())
    }

    /// [`Compression::decode`] of at most one [`FRAME_CHUNK`].
    fn decode_chunk(self, frame: &[u32], dst: &mut [f32], peer: Option<u32>) -> Result<()> {
        let count = dst.len();
        match self {
            Compression::None => dst.copy_from_slice(as_f32s(frame, count)?),
            Compression::Bf16 => half_view::<bf16>(frame, count)?.convert_to_f32_slice(dst),
            Compression::Fp16 => half_view::<f16>(frame, count)?.convert_to_f32_slice(dst),
            Compression::Int8 => {
                let (scales, values) = int8_views(frame, count)?;
                for (index, ((&scale, block), out)) in scales
                    .iter()
                    .zip(values.chunks(INT8_BLOCK))
                    .zip(dst.chunks_mut(INT8_BLOCK))
                    .enumerate()
                {
                    // No encoder produces a scale above MAX_SCALE, and only those scales can
                    // overflow to infinity when multiplied by a value of at most 127 in
                    // magnitude; -128 (never encoded) overflows from a little below it. Both
                    // are refused, so a finite scale always gives finite values; the -128 scan
                    // runs only for the few scales where it matters.
                    if !(scale.is_finite() && (0.0..=MAX_SCALE).contains(&scale)) {
                        return Err(CollectiveError::protocol(
                            peer,
                            format!("int8 frame with scale {scale} in block {index}"),
                        ));
                    }
                    if scale > f32::MAX / 128.0 && block.contains(&i8::MIN) {
                        return Err(CollectiveError::protocol(
                            peer,
                            format!(
                                "int8 frame with the value -128 (never encoded) at scale \
                                 {scale} in block {index}"
                            ),
                        ));
                    }
                    dequantise_block(block, scale, out);
                }
            }
        }
        Ok(())
    }
}

impl fmt::Display for Compression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Compression {
    type Err = CollectiveError;

    fn from_str(s: &str) -> Result<Self> {
        let wanted = s.trim().to_ascii_lowercase();
        Compression::ALL
            .into_iter()
            .find(|c| c.name() == wanted)
            .ok_or_else(|| {
                CollectiveError::invalid(format!(
                    "unknown compression {s:?} (expected none, bf16, fp16 or int8)"
                ))
            })
    }
}

/// The error of a buffer too short for its frame: a bug of the caller, reported rather than
/// panicked on.
fn short_frame(words: usize, needed: usize) -> CollectiveError {
    CollectiveError::invalid(format!(
        "frame buffer of {words} words is too short for {needed} bytes"
    ))
}

fn as_f32s(frame: &[u32], count: usize) -> Result<&[f32]> {
    let words = frame
        .get(..count)
        .ok_or(short_frame(frame.len(), 4 * count))?;
    Ok(bytemuck::cast_slice(words))
}

fn as_f32s_mut(frame: &mut [u32], count: usize) -> Result<&mut [f32]> {
    let len = frame.len();
    let words = frame.get_mut(..count).ok_or(short_frame(len, 4 * count))?;
    Ok(bytemuck::cast_slice_mut(words))
}

fn half_view<T: bytemuck::Pod>(frame: &[u32], count: usize) -> Result<&[T]> {
    let words = frame
        .get(..count.div_ceil(2))
        .ok_or(short_frame(frame.len(), 2 * count))?;
    let halves: &[T] = bytemuck::cast_slice(words);
    Ok(&halves[..count])
}

fn half_view_mut<T: bytemuck::Pod>(frame: &mut [u32], count: usize) -> Result<&mut [T]> {
    let len = frame.len();
    let words = frame
        .get_mut(..count.div_ceil(2))
        .ok_or(short_frame(len, 2 * count))?;
    let halves: &mut [T] = bytemuck::cast_slice_mut(words);
    Ok(&mut halves[..count])
}

/// The scales and the values of an int8 frame of `count` elements.
fn int8_views(frame: &[u32], count: usize) -> Result<(&[f32], &[i8])> {
    let blocks = count.div_ceil(INT8_BLOCK);
    let needed = blocks + count.div_ceil(4);
    let frame = frame
        .get(..needed)
        .ok_or(short_frame(frame.len(), 4 * blocks + count))?;
    let (scales, values) = frame.split_at(blocks);
    let values: &[i8] = bytemuck::cast_slice(values);
    Ok((bytemuck::cast_slice(scales), &values[..count]))
}

fn int8_views_mut(frame: &mut [u32], count: usize) -> Result<(&mut [f32], &mut [i8])> {
    let blocks = count.div_ceil(INT8_BLOCK);
    let needed = blocks + count.div_ceil(4);
    let len = frame.len();
    let frame = frame
        .get_mut(..needed)
        .ok_or(short_frame(len, 4 * blocks + count))?;
    let (scales, values) = frame.split_at_mut(blocks);
    let values: &mut [i8] = bytemuck::cast_slice_mut(values);
    Ok((bytemuck::cast_slice_mut(scales), &mut values[..count]))
}

/// The bits of `|x|` for the largest magnitude in `block`: for finite floats the order of
/// these bits is the order of the magnitudes, and NaN and infinity sit above every finite
/// value, so one integer maximum (which vectorises, where a float maximum with NaN rules does
/// not) finds both the scale and any non-finite value.
#[inline]
fn max_magnitude_bits(block: &[f32]) -> u32 {
    block
        .iter()
        .map(|x| x.to_bits() & 0x7fff_ffff)
        .fold(0, u32::max)
}

/// Quantises one block into `out` and returns its scale.
fn quantise_block(block: &[f32], out: &mut [i8]) -> Result<f32> {
    let bits = max_magnitude_bits(block);
    let max = f32::from_bits(bits);
    if !max.is_finite() {
        return Err(CollectiveError::invalid(
            "int8 compression of a non-finite value (NaN or infinity)",
        ));
    }
    if max == 0.0 {
        out.fill(0);
        return Ok(0.0);
    }
    let scale = (max / INT8_MAX).min(MAX_SCALE);
    let inverse = INT8_MAX / max;
    if inverse.is_finite() {
        for (x, q) in block.iter().zip(out.iter_mut()) {
            *q = round_to_i8(x * inverse);
        }
    } else {
        // A block whose largest magnitude is below 127 / f32::MAX has no finite inverse (and
        // zero times an infinite one is NaN), so its rare values are divided instead.
        for (x, q) in block.iter().zip(out.iter_mut()) {
            *q = round_to_i8(x / max * INT8_MAX);
        }
    }
    Ok(scale)
}

/// `y` (a value scaled to the int8 range) rounded to the nearest integer, ties to even.
#[inline(always)]
fn round_to_i8(y: f32) -> i8 {
    // Round to nearest-even without a float-to-int conversion (whose saturation and NaN rules
    // keep LLVM from vectorising it): adding 1.5 × 2^23 leaves round(y) in the low mantissa
    // bits of any |y| <= 2^22. The clamp only guards the last ulp of the product.
    let y = y.clamp(-INT8_MAX, INT8_MAX);
    let shifted = (y + ROUNDING_MAGIC).to_bits() as i32;
    shifted.wrapping_sub(ROUNDING_MAGIC.to_bits() as i32) as i8
}

/// Dequantises one block of `values` with `scale` into `out`.
#[inline]
fn dequantise_block(values: &[i8], scale: f32, out: &mut [f32]) {
    for (q, x) in values.iter().zip(out.iter_mut()) {
        *x = f32::from(*q) * scale;
    }
}

/// The error-feedback state of one tensor for
/// [`ProcessGroup::all_reduce_compressed`](crate::ProcessGroup::all_reduce_compressed).
///
/// The residual holds, for each element, the error of the one compression this rank applied to
/// that element in the previous call: its own contribution on the first hop of the ring, a
/// partial sum it forwarded, or the final sum of the block it owns (in units of the sum, also
/// for `Mean`). The next call adds it to this rank's contribution before anything is
/// compressed, so every error is sent again once and the outputs of K calls on the same inputs
/// average to the exact result with an error that shrinks like 1/K.
///
/// Use one compressor per tensor (a compressor is sized by its first call, and a call with
/// another length is [`CollectiveError::InvalidArgument`]); a residual error that is not
/// finite (from an infinite or NaN input) is dropped rather than carried.
///
/// # Examples
///
/// ```
/// use rlx_collective::{Compression, Compressor};
///
/// let compressor = Compressor::new(Compression::Int8);
/// assert_eq!(compressor.compression(), Compression::Int8);
/// assert!(compressor.residual().is_empty());
/// ```
#[derive(Clone, Debug)]
pub struct Compressor {
    compression: Compression,
    residual: Vec<f32>,
    wire_bytes: u64,
}

impl Compressor {
    /// A compressor for `compression` with no residual yet.
    pub fn new(compression: Compression) -> Compressor {
        Compressor {
            compression,
            residual: Vec::new(),
            wire_bytes: 0,
        }
    }

    /// The wire format of this compressor.
    pub fn compression(&self) -> Compression {
        self.compression
    }

    /// The residual carried into the next call: empty before the first call, then one value
    /// per element of the tensor.
    pub fn residual(&self) -> &[f32] {
        &self.residual
    }

    /// Forgets the residual, as if no call had happened yet (for example after the model's
    /// parameters were reloaded).
    pub fn reset(&mut self) {
        self.residual.clear();
    }

    /// Bytes this rank sent in the last call, headers and frames (the receive side is the
    /// same by symmetry of the ring).
    pub fn last_wire_bytes(&self) -> u64 {
        self.wire_bytes
    }

    /// The residual for a call on `count` elements: created zeroed at the first call.
    pub(crate) fn residual_for(&mut self, count: usize) -> Result<&mut [f32]> {
        if self.residual.is_empty() {
            self.residual.resize(count, 0.0);
        }
        if self.residual.len() != count {
            return Err(CollectiveError::invalid(format!(
                "this compressor holds the residual of a tensor of {} elements, not {count}; \
                 use one compressor per tensor",
                self.residual.len()
            )));
        }
        Ok(&mut self.residual)
    }

    /// Records the bytes sent by the call that just ended.
    pub(crate) fn set_wire_bytes(&mut self, bytes: u64) {
        self.wire_bytes = bytes;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(compression: Compression, src: &[f32]) -> Vec<f32> {
        let mut frame = vec![0u32; compression.frame_words(src.len())];
        compression.encode(src, &mut frame).unwrap();
        let mut out = vec![0.0; src.len()];
        compression.decode(&frame, &mut out, Some(1)).unwrap();
        out
    }

    fn values(count: usize) -> Vec<f32> {
        (0..count)
            .map(|i| ((i as f32) * 0.37).sin() * (1.0 + (i % 7) as f32))
            .collect()
    }

    #[test]
    fn every_format_round_trips_within_its_precision() {
        for count in [0, 1, 2, 255, 256, 257, 1000, 4096, 4097, 9000] {
            let src = values(count);
            for compression in Compression::ALL {
                let out = round_trip(compression, &src);
                for (a, b) in src.chunks(INT8_BLOCK).zip(out.chunks(INT8_BLOCK)) {
                    let max = a.iter().fold(0f32, |m, x| m.max(x.abs()));
                    for (x, y) in a.iter().zip(b) {
                        let bound = match compression {
                            Compression::None => 0.0,
                            Compression::Bf16 => x.abs() / 256.0,
                            Compression::Fp16 => x.abs() / 2048.0 + 6e-8,
                            Compression::Int8 => max / 254.0 * 1.0001,
                        };
                        assert!((x - y).abs() <= bound, "{compression} {x} -> {y}");
                    }
                }
            }
        }
    }

    #[test]
    fn frame_sizes_and_names() {
        assert_eq!(Compression::Int8.frame_bytes(257), 8 + 257);
        assert_eq!(Compression::Bf16.frame_bytes(3), 6);
        assert_eq!(Compression::Bf16.frame_words(3), 2);
        for compression in Compression::ALL {
            assert_eq!(
                compression.name().parse::<Compression>().unwrap(),
                compression
            );
            assert_eq!(
                Compression::from_code(compression.code()),
                Some(compression)
            );
        }
        assert!("int4".parse::<Compression>().is_err());
    }

    #[test]
    fn int8_refuses_non_finite_inputs_and_bad_scales() {
        let mut frame = vec![0u32; Compression::Int8.frame_words(3)];
        let error = Compression::Int8
            .encode(&[1.0, f32::INFINITY, 2.0], &mut frame)
            .unwrap_err();
        assert!(matches!(error, CollectiveError::InvalidArgument { .. }));
        for bad in [f32::NAN, f32::INFINITY, -1.0] {
            frame[0] = bad.to_bits();
            let mut out = [0.0; 3];
            let error = Compression::Int8
                .decode(&frame, &mut out, Some(5))
                .unwrap_err();
            assert!(
                matches!(error, CollectiveError::Protocol { peer: Some(5), .. }),
                "{error}"
            );
        }
    }

    /// Found by fuzzing (`compressed_frame`): a finite scale far above any encoder's made
    /// `decode` return infinities instead of refusing the frame; and a block holding
    /// `f32::MAX` decoded to infinity, since `f32::MAX / 127` rounds up.
    #[test]
    fn int8_refuses_scales_and_values_that_would_overflow() {
        let mut frame = vec![0u32; Compression::Int8.frame_words(3)];
        let mut out = [0.0; 3];
        frame[0] = 2.0e38f32.to_bits();
        frame[1] = u32::from_le_bytes([0xf2, 1, 1, 0]);
        assert!(Compression::Int8.decode(&frame, &mut out, Some(2)).is_err());
        frame[0] = MAX_SCALE.to_bits();
        assert!(Compression::Int8.decode(&frame, &mut out, Some(2)).is_ok());
        assert!(out.iter().all(|x| x.is_finite()), "{out:?}");
        frame[1] = u32::from_le_bytes([0x80, 1, 1, 0]);
        assert!(Compression::Int8.decode(&frame, &mut out, Some(2)).is_err());
        // The same bug on the encoder's side: a block holding f32::MAX came back infinite.
        assert!((INT8_MAX * MAX_SCALE).is_finite());
        let extremes = [f32::MAX, -f32::MAX, 1.0];
        let back = round_trip(Compression::Int8, &extremes);
        assert!(back.iter().all(|x| x.is_finite()), "{back:?}");
        assert!(
            back[0] > f32::MAX * 0.999 && back[1] < -f32::MAX * 0.999,
            "{back:?}"
        );
    }

    /// Found while fuzzing (`compressed_frame`): in a block whose largest magnitude is below
    /// 127 / f32::MAX the inverse scale overflowed, so every nonzero value came back as the
    /// block's largest and zeros as garbage.
    #[test]
    fn int8_keeps_blocks_of_tiny_values() {
        let src = [1e-37f32, 0.0, -2e-38, 5e-38];
        let out = round_trip(Compression::Int8, &src);
        let step = 1e-37 / 127.0;
        for (x, y) in src.iter().zip(&out) {
            assert!((x - y).abs() <= step, "{src:?} came back as {out:?}");
        }
    }

    #[test]
    fn int8_keeps_zero_blocks_and_extremes_exact() {
        let mut src = vec![0.0f32; 300];
        src[260] = -3.0;
        src[261] = 3.0;
        let out = round_trip(Compression::Int8, &src);
        assert_eq!(out, src);
    }

    #[test]
    fn short_buffers_are_errors_not_panics() {
        let mut frame = vec![0u32; 1];
        assert!(Compression::Int8.encode(&[1.0; 300], &mut frame).is_err());
        let mut out = [0.0; 300];
        assert!(Compression::Bf16.decode(&frame, &mut out, None).is_err());
    }
}
