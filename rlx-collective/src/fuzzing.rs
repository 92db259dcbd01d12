//! The body of the fuzz target over the compressed all-reduce's wire: its frames
//! ([`Compression::decode`]) and its agreement header.
//!
//! As in `rlx_transport::fuzzing`, the target maps arbitrary bytes to a verdict after checking
//! what must hold of the decoder's answer; the `cargo fuzz` target of the `fuzz/` crate and the
//! replay test of this crate call the same function.
//!
//! Not a stable API: hidden from the documentation, for the fuzz crate and the replay tests.

use rlx_transport::ReduceKind;
use rlx_transport::fuzzing::{Seed, Verdict, check};

use crate::all_reduce::compressed::Header;
use crate::compression::{Compression, FRAME_CHUNK, INT8_BLOCK};

/// The largest element count the target decodes: three chunks, so that every chunk boundary
/// (and a short last chunk) is reached.
const MAX_ELEMENTS: usize = 3 * FRAME_CHUNK;
/// The group size of the header checks.
const GROUP: u32 = 4;

/// The bytes as little-endian words, the last one zero-padded.
fn words(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks(4)
        .map(|c| {
            let mut w = [0u8; 4];
            w[..c.len()].copy_from_slice(c);
            u32::from_le_bytes(w)
        })
        .collect()
}

/// The bytes as f32 values, non-finite ones replaced by their index (the int8 encoder refuses
/// them, and the half formats overflow them on purpose).
fn finite_values(bytes: &[u8]) -> Vec<f32> {
    words(bytes)
        .into_iter()
        .enumerate()
        .map(|(i, w)| {
            let x = f32::from_bits(w);
            if x.is_finite() { x } else { i as f32 }
        })
        .collect()
}

/// How far an int8 value may land from `x` in a block whose largest magnitude is `max`: half a
/// quantisation step, plus the rounding of the scale's products, plus 127 times the rounding
/// of a scale that is subnormal (half the smallest subnormal).
fn int8_tolerance(max: f32) -> f32 {
    max / 127.0 * 0.5 + max * 1e-6 + 127.0 * f32::from_bits(1)
}

/// Target `compressed_frame`: a selector byte, a `u16` element count, then the rest.
///
/// - Selector mod 3 = 0, decode: the rest is a frame of the format the selector names
///   (selector / 3 mod 4). Decoding never panics, whatever the frame's length; an int8 frame
///   that decodes gives finite values only (a hostile frame must not turn into infinities).
/// - 1, round trip: the rest is f32 values (non-finite ones replaced). Each format decodes its
///   own encoding: `none` exactly, `bf16` and `fp16` as their scalar conversions, `int8`
///   within half a step of its block's scale and finite.
/// - 2, header: the rest is an agreement header; an accepted one comes from a rank inside the
///   group and encodes back to the same bytes.
pub fn compressed_frame(data: &[u8]) -> Verdict {
    let Some((&selector, rest)) = data.split_first() else {
        return Ok(());
    };
    let Some((count, rest)) = rest.split_first_chunk::<2>() else {
        return Ok(());
    };
    let count = usize::from(u16::from_le_bytes(*count)) % (MAX_ELEMENTS + 1);
    let format = Compression::ALL[usize::from(selector / 3) % Compression::ALL.len()];
    match selector % 3 {
        0 => decode_frame(format, count, rest),
        1 => round_trip(format, rest),
        _ => header(rest),
    }
}

fn decode_frame(format: Compression, count: usize, bytes: &[u8]) -> Verdict {
    let frame = words(bytes);
    let mut out = vec![0.0f32; count];
    if format.decode(&frame, &mut out, Some(1)).is_err() {
        return Ok(());
    }
    check(frame.len() >= format.frame_words(count), || {
        format!(
            "a {format} frame of {} words decoded {count} values",
            frame.len()
        )
    })?;
    if format == Compression::Int8 {
        let bad = out.iter().position(|x| !x.is_finite());
        check(bad.is_none(), || {
            format!(
                "an int8 frame decoded to {:?} at {bad:?}",
                bad.map(|i| out[i])
            )
        })?;
    }
    Ok(())
}

fn round_trip(format: Compression, bytes: &[u8]) -> Verdict {
    let values = finite_values(bytes);
    let values = &values[..values.len().min(MAX_ELEMENTS)];
    let mut frame = vec![0u32; format.frame_words(values.len())];
    if let Err(e) = format.encode(values, &mut frame) {
        return Err(format!("{format} refused finite values: {e}"));
    }
    let mut back = vec![0.0f32; values.len()];
    format
        .decode(&frame, &mut back, None)
        .map_err(|e| format!("{format} refused its own frame: {e}"))?;
    for (block, (xs, ys)) in values
        .chunks(INT8_BLOCK)
        .zip(back.chunks(INT8_BLOCK))
        .enumerate()
    {
        let max = xs.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        for (i, (&x, &y)) in xs.iter().zip(ys).enumerate() {
            let expected = match format {
                Compression::Bf16 => half::bf16::from_f32(x).to_f32(),
                Compression::Fp16 => half::f16::from_f32(x).to_f32(),
                _ => x,
            };
            let holds = match format {
                Compression::Int8 => y.is_finite() && (y - x).abs() <= int8_tolerance(max),
                _ => y.to_bits() == expected.to_bits(),
            };
            check(holds, || {
                format!("{format}: element {i} of block {block}: {x} came back as {y}")
            })?;
        }
    }
    Ok(())
}

fn header(bytes: &[u8]) -> Verdict {
    let Ok(header) = Header::decode(bytes, 1, GROUP) else {
        return Ok(());
    };
    check(header.origin < GROUP, || {
        format!("{header:?} in a group of {GROUP}")
    })?;
    let encoded = header.encode();
    check(encoded[..] == *bytes, || {
        format!("{header:?} decoded from {bytes:02x?} encodes as {encoded:02x?}")
    })
}

/// Valid encodings and a few malformed inputs for the target above: its seed corpus under
/// `fuzz/corpus/`.
pub fn seeds() -> Vec<Seed> {
    let mut out: Vec<Seed> = Vec::new();
    let values: Vec<f32> = (0..600).map(|i| (i as f32 - 300.0) * 0.37).collect();
    let value_bytes: Vec<u8> = values.iter().flat_map(|x| x.to_le_bytes()).collect();
    for (index, format) in Compression::ALL.into_iter().enumerate() {
        let mut frame = vec![0u32; format.frame_words(values.len())];
        if format.encode(&values, &mut frame).is_err() {
            continue;
        }
        let frame_bytes: Vec<u8> = frame.iter().flat_map(|w| w.to_le_bytes()).collect();
        let selector = 3 * index as u8;
        let count = (values.len() as u16).to_le_bytes();
        let decode = [&[selector][..], &count, &frame_bytes].concat();
        out.push((
            "compressed_frame",
            format!("decode-{format}"),
            decode.clone(),
        ));
        out.push((
            "compressed_frame",
            format!("decode-{format}-short"),
            decode[..decode.len() / 2].to_vec(),
        ));
        let round = [&[selector + 1][..], &count, &value_bytes].concat();
        out.push(("compressed_frame", format!("round-trip-{format}"), round));
    }
    let extremes = [f32::MAX, -f32::MAX, 1.0, f32::MIN_POSITIVE];
    let tiny = [1e-37f32, 0.0, -2e-38, 5e-38];
    for (index, format) in Compression::ALL.into_iter().enumerate() {
        for (name, values) in [("extremes", extremes), ("tiny", tiny)] {
            let bytes: Vec<u8> = values.iter().flat_map(|x| x.to_le_bytes()).collect();
            let round = [&[3 * index as u8 + 1][..], &[0, 0], &bytes].concat();
            out.push((
                "compressed_frame",
                format!("round-trip-{format}-{name}"),
                round,
            ));
        }
    }
    let mut nan_scale = vec![9u8, 10, 0];
    nan_scale.extend_from_slice(&f32::NAN.to_le_bytes());
    nan_scale.extend_from_slice(&[1u8; 12]);
    out.push(("compressed_frame", "int8-nan-scale".to_owned(), nan_scale));
    let header = Header {
        origin: 2,
        compression: Compression::Int8,
        reduce: ReduceKind::Sum,
        count: 1 << 20,
    };
    let encoded = header.encode();
    out.push((
        "compressed_frame",
        "header".to_owned(),
        [&[2u8, 0, 0][..], &encoded].concat(),
    ));
    let mut outside = encoded;
    outside[8] = 9;
    out.push((
        "compressed_frame",
        "header-rank-outside".to_owned(),
        [&[2u8, 0, 0][..], &outside].concat(),
    ));
    out
}
