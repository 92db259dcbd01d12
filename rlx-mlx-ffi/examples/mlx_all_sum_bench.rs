//! Times MLX's native `all_sum` through [`MlxTransport`] (f32, 8 B to 64 MiB) so that it can
//! be compared with `scripts/mlx_all_sum_bench.py`, which times `mx.distributed.all_sum` from
//! Python under the same launch. Run every rank with MLX's ring variables, e.g.
//! `MLX_HOSTFILE=hosts.json MLX_RANK=0 cargo run --release --features mlx --example
//! mlx_all_sum_bench` (and rank 1 alike); rank 0 prints the table. Every result is checked.
//! Sizes in bytes given as arguments replace the default list (for profiling one size).

use std::time::Instant;

use rlx_mlx_ffi::MlxTransport;
use rlx_transport::{CollectiveError, DType, ReduceKind, Transport};

/// Message sizes in bytes: 8 B to 64 MiB.
const SIZES: [usize; 9] = [
    8,
    64,
    512,
    4 << 10,
    32 << 10,
    256 << 10,
    2 << 20,
    16 << 20,
    64 << 20,
];

fn main() -> Result<(), CollectiveError> {
    let t = MlxTransport::from_env()?;
    let native = t
        .native_collectives()
        .ok_or_else(|| CollectiveError::unsupported("no native collectives"))?;
    let n = t.world_size();
    let me = t.rank();
    let expected = (n * (n + 1) / 2) as f32;
    if me == 0 {
        println!(
            "{:>10} {:>8} {:>12} {:>10} {:>10}",
            "bytes", "iters", "median_us", "algbw", "busbw"
        );
    }
    let sizes: Vec<usize> = match std::env::args()
        .skip(1)
        .map(|a| a.parse::<usize>())
        .collect::<Result<Vec<_>, _>>()
    {
        Ok(given) if !given.is_empty() => given,
        Ok(_) => SIZES.to_vec(),
        Err(e) => {
            return Err(CollectiveError::invalid(format!(
                "sizes must be byte counts: {e}"
            )));
        }
    };
    for bytes in sizes {
        let count = bytes / 4;
        let iters = ((256usize << 20) / bytes).clamp(5, 200);
        let mut times = Vec::with_capacity(iters);
        let mut data = vec![0u8; bytes];
        for i in 0..iters + 2 {
            for chunk in data.chunks_exact_mut(4) {
                chunk.copy_from_slice(&((me + 1) as f32).to_le_bytes());
            }
            t.barrier()?;
            let start = Instant::now();
            native.all_reduce(&mut data, DType::F32, ReduceKind::Sum)?;
            let took = start.elapsed();
            if i >= 2 {
                times.push(took.as_secs_f64());
            }
            let wrong = data
                .chunks_exact(4)
                .filter(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) != expected)
                .count();
            if wrong > 0 {
                return Err(CollectiveError::protocol(
                    None,
                    format!("{wrong} of {count} elements wrong at {bytes} bytes"),
                ));
            }
        }
        times.sort_by(f64::total_cmp);
        let median = times[times.len() / 2];
        let algbw = bytes as f64 / median / 1e9;
        let busbw = algbw * 2.0 * f64::from(n - 1) / f64::from(n);
        if me == 0 {
            println!(
                "{bytes:>10} {iters:>8} {:>12.1} {algbw:>10.3} {busbw:>10.3}",
                median * 1e6
            );
        }
    }
    t.barrier()?;
    Ok(())
}
