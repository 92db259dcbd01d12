//! `cargo xtask bench --kernels`: the throughput of the compression codecs of
//! `all_reduce_compressed` on one thread, beside a memcpy of the same f32 buffer, so that one
//! run says whether compressing and decompressing keep up with memory (and with the link).
//!
//! Throughput counts the uncompressed f32 bytes per second (10^9 bytes per GB). Each kernel
//! runs a few times on the same buffer; the table gives the best and the median run, because
//! on a shared machine the best run is the kernel and the spread is the neighbours.

use std::time::Instant;

use rlx_collective::{CollectiveError, Compression};

use super::{measure, plot};

/// Timed runs of each kernel.
const RUNS: usize = 7;

/// Best and median seconds of [`RUNS`] runs of `kernel`.
fn time(mut kernel: impl FnMut() -> Result<(), CollectiveError>) -> Result<(f64, f64), String> {
    // One untimed run faults the output's pages in.
    kernel().map_err(|e| e.to_string())?;
    let mut seconds = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        let started = Instant::now();
        kernel().map_err(|e| e.to_string())?;
        seconds.push(started.elapsed().as_secs_f64());
    }
    let best = seconds.iter().copied().fold(f64::INFINITY, f64::min);
    Ok((best, measure::median(&seconds)))
}

/// Measures every format of `compressions` (all of them when empty) on `bytes` of f32.
pub(crate) fn run(bytes: u64, compressions: &[Compression]) -> Result<(), String> {
    let count = usize::try_from(bytes / 4)
        .map_err(|_| format!("{bytes} bytes do not fit in memory here"))?
        .max(1);
    let formats = if compressions.is_empty() {
        Compression::ALL.to_vec()
    } else {
        compressions.to_vec()
    };
    // Gradient-like values: mixed signs, magnitudes over several decades.
    let src: Vec<f32> = (0..count)
        .map(|i| (i as f32 * 0.013).sin() * (1 + i % 997) as f32 * 1e-3)
        .collect();
    let mut out = vec![0f32; count];
    let f32_bytes = (count * 4) as f64;
    let gbps = |seconds: f64| f32_bytes / seconds / 1e9;
    println!(
        "# compression kernels on {} of f32, one thread, best and median of {RUNS} runs; GB/s \
         of uncompressed f32",
        plot::human_bytes(count as u64 * 4)
    );
    println!(
        "# {:<8} {:>12} {:>12} {:>14} {:>14}",
        "format", "frame bytes", "compress", "decompress", "(median c/d)"
    );
    let (best, median) = time(|| {
        out.copy_from_slice(&src);
        Ok(())
    })?;
    println!(
        "  {:<8} {:>12} {:>7.2} GB/s {:>9.2} GB/s {:>6.2}/{:.2}",
        "memcpy",
        count * 4,
        gbps(best),
        gbps(best),
        gbps(median),
        gbps(median)
    );
    for compression in formats {
        let mut frame = vec![0u32; compression.frame_words(count)];
        let (encode_best, encode_median) = time(|| compression.encode(&src, &mut frame))?;
        let (decode_best, decode_median) = time(|| compression.decode(&frame, &mut out, None))?;
        println!(
            "  {:<8} {:>12} {:>7.2} GB/s {:>9.2} GB/s {:>6.2}/{:.2}",
            compression.name(),
            compression.frame_bytes(count),
            gbps(encode_best),
            gbps(decode_best),
            gbps(encode_median),
            gbps(decode_median)
        );
    }
    Ok(())
}
