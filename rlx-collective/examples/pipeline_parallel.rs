//! Pipeline-parallel inference, the hand-off of hidden states between ranks: a stack of dense
//! layers is split into one stage per rank, a batch is cut into micro-batches, and each stage
//! receives a micro-batch's hidden states from the previous stage, applies its layers and sends
//! the result on (a GPipe-style forward schedule: while stage 2 works on micro-batch 0, stage
//! 1 already works on micro-batch 1). The last stage checks every output against the unsplit
//! model, which it can compute alone because the weights come from a fixed seed.
//!
//! The hidden states travel as `bf16`, as a real pipeline would send them; the reference
//! rounds at the same points, so the check is exact.
//!
//! ```sh
//! cargo build --release -p rlx-collective --example pipeline_parallel
//! cargo xtask launch -n 4 -- target/release/examples/pipeline_parallel
//! ```

use std::process::ExitCode;
use std::time::Instant;

use half::bf16;
use rlx_collective::{CollectiveError, ProcessGroup};

/// The model and the batch.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Config {
    /// Dense layers in the whole model (split as evenly as possible over the stages).
    pub(crate) layers: usize,
    /// Width of every layer.
    pub(crate) width: usize,
    /// Micro-batches per batch.
    pub(crate) micro_batches: usize,
    /// Rows per micro-batch.
    pub(crate) rows: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            layers: 8,
            width: 32,
            micro_batches: 8,
            rows: 4,
        }
    }
}

/// What the last stage saw.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Report {
    /// Micro-batches whose output equals the unsplit model's, bit for bit (last stage only).
    pub(crate) matching: usize,
    /// Micro-batches checked (last stage only; 0 elsewhere).
    pub(crate) checked: usize,
    /// Wall time of the pipelined batch on this rank.
    pub(crate) seconds: f64,
}

/// The user tag of micro-batch `m`'s hidden states.
fn tag(m: usize) -> u32 {
    100 + m as u32
}

/// Layer `l`'s weights (`width × width`, then `width` biases), the same on every rank.
fn layer(l: usize, width: usize) -> Vec<f32> {
    let mut seed = 0xA076_1D64_78BD_642Fu64 ^ (l as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let scale = 1.0 / (width as f32).sqrt();
    (0..width * width + width)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (((seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0) * scale
        })
        .collect()
}

/// Applies layer weights `w` to `rows` of `width` values: `tanh(x W + b)`, rounded to bf16 as
/// it will travel.
fn apply(w: &[f32], width: usize, x: &[bf16]) -> Vec<bf16> {
    let (weights, bias) = w.split_at(width * width);
    x.chunks(width)
        .flat_map(|row| {
            (0..width).map(move |j| {
                let z: f32 = bias[j]
                    + row
                        .iter()
                        .enumerate()
                        .map(|(i, v)| v.to_f32() * weights[i * width + j])
                        .sum::<f32>();
                bf16::from_f32(z.tanh())
            })
        })
        .collect()
}

/// The input of micro-batch `m`.
fn input(m: usize, cfg: &Config) -> Vec<bf16> {
    (0..cfg.rows * cfg.width)
        .map(|i| bf16::from_f32((((i * 7 + m * 13) % 17) as f32 - 8.0) / 8.0))
        .collect()
}

/// The layers stage `stage` of `stages` holds.
fn stage_layers(stage: usize, stages: usize, layers: usize) -> std::ops::Range<usize> {
    layers * stage / stages..layers * (stage + 1) / stages
}

/// Runs one pipelined batch over `group` (stage = rank).
pub(crate) fn run(group: &ProcessGroup, cfg: &Config) -> Result<Report, CollectiveError> {
    let (stage, stages) = (group.rank() as usize, group.world_size() as usize);
    let weights: Vec<Vec<f32>> = stage_layers(stage, stages, cfg.layers)
        .map(|l| layer(l, cfg.width))
        .collect();
    let started = Instant::now();
    let mut outputs = Vec::new();
    for m in 0..cfg.micro_batches {
        let mut hidden = if stage == 0 {
            input(m, cfg)
        } else {
            group.recv::<bf16>(stage as u32 - 1, tag(m))?
        };
        for w in &weights {
            hidden = apply(w, cfg.width, &hidden);
        }
        if stage + 1 < stages {
            group.send(stage as u32 + 1, tag(m), &hidden)?;
        } else {
            outputs.push(hidden);
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let mut matching = 0;
    for (m, output) in outputs.iter().enumerate() {
        let mut expected = input(m, cfg);
        for l in 0..cfg.layers {
            expected = apply(&layer(l, cfg.width), cfg.width, &expected);
        }
        matching += usize::from(*output == expected);
    }
    Ok(Report {
        matching,
        checked: outputs.len(),
        seconds,
    })
}

#[allow(
    dead_code,
    reason = "the tests include this file for `run` and never call main"
)]
fn main() -> ExitCode {
    let cfg = Config::default();
    let outcome = rlx_collective::init().and_then(|group| {
        let report = run(&group, &cfg)?;
        Ok((group.rank(), group.world_size(), report))
    });
    match outcome {
        Ok((rank, world, report)) if rank + 1 == world => {
            println!(
                "pipeline_parallel: {} layers in {world} stages, {} micro-batches of {} rows: \
                 {}/{} outputs equal the unsplit model's, {:.2} ms",
                cfg.layers,
                cfg.micro_batches,
                cfg.rows,
                report.matching,
                report.checked,
                report.seconds * 1e3
            );
            if report.matching == report.checked {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pipeline_parallel: {e}");
            ExitCode::FAILURE
        }
    }
}
