//! Tensor-parallel MLP block, as in Megatron-style models: `Y = gelu(X A) B` with `A` split by
//! columns and `B` by rows over the ranks. Each rank multiplies the whole input by its columns
//! of `A`, applies the activation to its slice (no communication: the split follows the
//! columns), multiplies by its rows of `B`, and one all-reduce sums the partial outputs. The
//! result is checked against the unsplit product and the time per step is reported.
//!
//! ```sh
//! cargo build --release -p rlx-collective --example tensor_parallel
//! cargo xtask launch -n 4 -- target/release/examples/tensor_parallel --steps 20
//! ```

use std::process::ExitCode;
use std::time::Instant;

use rlx_collective::{CollectiveError, ProcessGroup, ReduceKind};

/// The block's shape.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Config {
    /// Rows of the input (tokens).
    pub(crate) tokens: usize,
    /// Model width (columns of the input and the output).
    pub(crate) model: usize,
    /// Width of the hidden layer, split over the ranks.
    pub(crate) hidden: usize,
    /// Forward steps timed.
    pub(crate) steps: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            tokens: 16,
            model: 64,
            hidden: 256,
            steps: 20,
        }
    }
}

/// What a rank measured.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Report {
    /// Largest absolute difference from the unsplit product.
    pub(crate) max_error: f32,
    /// Median time of one forward step (compute and all-reduce), in seconds.
    pub(crate) step_seconds: f64,
}

/// Element `(r, c)` of a fixed pseudo-random matrix `which`, the same on every rank.
fn entry(which: u64, r: usize, c: usize, scale: f32) -> f32 {
    let mut x = which
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add((r as u64) << 32 | c as u64);
    x ^= x >> 33;
    x = x.wrapping_mul(0xFF51_AFD7_ED55_8CCD);
    x ^= x >> 33;
    (((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0) * scale
}

/// The tanh approximation of GELU.
fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + (0.797_884_6 * (x + 0.044_715 * x * x * x)).tanh())
}

/// `gelu(X A[:, cols]) B[cols, :]`: the partial output of the hidden columns `cols`.
fn partial(cfg: &Config, cols: std::ops::Range<usize>) -> Vec<f32> {
    let a_scale = 1.0 / (cfg.model as f32).sqrt();
    let b_scale = 1.0 / (cfg.hidden as f32).sqrt();
    let mut out = vec![0.0f32; cfg.tokens * cfg.model];
    for t in 0..cfg.tokens {
        for h in cols.clone() {
            let z: f32 = (0..cfg.model)
                .map(|i| entry(1, t, i, 1.0) * entry(2, i, h, a_scale))
                .sum();
            let g = gelu(z);
            for o in 0..cfg.model {
                out[t * cfg.model + o] += g * entry(3, h, o, b_scale);
            }
        }
    }
    out
}

/// Runs the split block on `group` and checks it against the unsplit one.
pub(crate) fn run(group: &ProcessGroup, cfg: &Config) -> Result<Report, CollectiveError> {
    let (rank, world) = (group.rank() as usize, group.world_size() as usize);
    let cols = cfg.hidden * rank / world..cfg.hidden * (rank + 1) / world;
    let mut times = Vec::with_capacity(cfg.steps);
    let mut y = Vec::new();
    for _ in 0..cfg.steps.max(1) {
        let started = Instant::now();
        y = partial(cfg, cols.clone());
        group.all_reduce(&mut y, ReduceKind::Sum)?;
        times.push(started.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    let whole = partial(cfg, 0..cfg.hidden);
    let max_error = y
        .iter()
        .zip(&whole)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    Ok(Report {
        max_error,
        step_seconds: times[times.len() / 2],
    })
}

#[allow(
    dead_code,
    reason = "the tests include this file for `run` and never call main"
)]
fn main() -> ExitCode {
    let mut cfg = Config::default();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match (arg.as_str(), args.next().and_then(|v| v.parse().ok())) {
            ("--steps", Some(v)) => cfg.steps = v,
            ("--hidden", Some(v)) => cfg.hidden = v,
            _ => {
                eprintln!("usage: tensor_parallel [--steps N] [--hidden N]");
                return ExitCode::FAILURE;
            }
        }
    }
    let outcome = rlx_collective::init().and_then(|group| {
        let report = run(&group, &cfg)?;
        Ok((group.rank(), group.world_size(), report))
    });
    match outcome {
        Ok((rank, world, report)) => {
            if rank == 0 {
                println!(
                    "tensor_parallel: {}x{} input, hidden {} split over {world} ranks: {:.3} ms \
                     per step (median of {}), max difference from the unsplit block {:.1e}",
                    cfg.tokens,
                    cfg.model,
                    cfg.hidden,
                    report.step_seconds * 1e3,
                    cfg.steps,
                    report.max_error
                );
            }
            if report.max_error <= 1e-4 {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("tensor_parallel: {e}");
            ExitCode::FAILURE
        }
    }
}
