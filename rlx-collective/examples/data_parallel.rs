//! Data-parallel training of a small MLP, the way a user's trainer uses RLX: every rank holds
//! the whole model and a shard of each batch, computes its gradients, and the gradients are
//! summed across ranks by a [`Bucketer`], as PyTorch DDP does it: each tensor (layer 2, layer
//! 1 and the loss) is handed over as backward produces it, and each bucket is all-reduced in
//! the background as soon as it is full. Every rank then applies the same update, so the
//! weights stay bit-identical everywhere.
//!
//! The task is synthetic and deterministic: fit a fixed teacher function of 8 inputs. At the
//! end rank 0 compares the final loss with the same training run in one process on whole
//! batches, and every rank checks that its weights equal rank 0's bit for bit.
//!
//! With `--compression bf16|fp16|int8` the gradients travel compressed
//! ([`ProcessGroup::all_reduce_compressed`], one [`Compressor`] per layer so that each keeps its
//! layer's error feedback), one layer after the other, and the final loss is compared with the
//! uncompressed one-process run within the format's tolerance ([`tolerance`]).
//!
//! ```sh
//! cargo build --release -p rlx-collective --example data_parallel
//! cargo xtask launch -n 4 -- target/release/examples/data_parallel --steps 300
//! cargo xtask launch -n 4 -- target/release/examples/data_parallel --compression int8
//! ```

use std::process::ExitCode;

use rlx_collective::{
    Bucketer, CollectiveError, Compression, Compressor, ProcessGroup, ReduceKind,
};

/// The bucket size of the example: small, so that the small model spreads over several
/// buckets and the first goes out while the others are filled (a real model keeps the
/// default, 25 MiB).
const BUCKET_BYTES: usize = 4 << 10;

/// Inputs per example.
const INPUTS: usize = 8;

/// What to train.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Config {
    /// Optimisation steps.
    pub(crate) steps: usize,
    /// Examples per step, over all ranks.
    pub(crate) batch: usize,
    /// Width of the hidden layer.
    pub(crate) hidden: usize,
    /// Learning rate of plain gradient descent.
    pub(crate) learning_rate: f32,
    /// How the gradients travel: `None` for the plain non-blocking all-reduces.
    pub(crate) compression: Option<Compression>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            steps: 300,
            batch: 64,
            hidden: 16,
            learning_rate: 0.05,
            compression: None,
        }
    }
}

/// How the run went, as rank 0 sees it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Report {
    /// Loss of the first step.
    pub(crate) first_loss: f32,
    /// Loss of the last step, trained across the ranks.
    pub(crate) final_loss: f32,
    /// Loss of the last step of the same training in one process on whole batches.
    pub(crate) reference_loss: f32,
    /// Whether every rank ended with rank 0's weights, bit for bit.
    pub(crate) identical: bool,
}

/// A two-layer perceptron: `tanh(x W1 + b1) W2 + b2`, all parameters in one buffer so that a
/// layer's gradients are one contiguous bucket.
#[derive(Clone, Debug)]
struct Mlp {
    hidden: usize,
    /// Layer 1 (`W1` then `b1`), then layer 2 (`W2` then `b2`).
    params: Vec<f32>,
}

impl Mlp {
    fn new(hidden: usize) -> Self {
        let mut seed = 0x2545_F491_4F6C_DD1Du64;
        let len = Self::layer1_len(hidden) + hidden + 1;
        let params = (0..len).map(|_| 0.5 * uniform(&mut seed)).collect();
        Mlp { hidden, params }
    }

    fn layer1_len(hidden: usize) -> usize {
        INPUTS * hidden + hidden
    }

    /// The summed loss of `rows` and the summed gradients into `grads` (same layout as the
    /// parameters), each divided by `scale` (the global batch size).
    fn loss_and_grads(&self, rows: &[[f32; INPUTS]], scale: f32, grads: &mut [f32]) -> f32 {
        let h = self.hidden;
        let (layer1, layer2) = self.params.split_at(Self::layer1_len(h));
        let (w1, b1) = layer1.split_at(INPUTS * h);
        let (w2, b2) = layer2.split_at(h);
        grads.fill(0.0);
        let (g1, g2) = grads.split_at_mut(Self::layer1_len(h));
        let mut loss = 0.0;
        let mut hidden = vec![0.0f32; h];
        for x in rows {
            for (j, a) in hidden.iter_mut().enumerate() {
                let z: f32 = b1[j] + (0..INPUTS).map(|i| x[i] * w1[i * h + j]).sum::<f32>();
                *a = z.tanh();
            }
            let y = b2[0] + hidden.iter().zip(w2).map(|(a, w)| a * w).sum::<f32>();
            let err = y - teacher(x);
            loss += err * err / scale;
            let dy = 2.0 * err / scale;
            for j in 0..h {
                g2[j] += dy * hidden[j];
                let dz = dy * w2[j] * (1.0 - hidden[j] * hidden[j]);
                for i in 0..INPUTS {
                    g1[i * h + j] += dz * x[i];
                }
                g1[INPUTS * h + j] += dz;
            }
            g2[h] += dy;
        }
        loss
    }

    fn step(&mut self, grads: &[f32], learning_rate: f32) {
        for (p, g) in self.params.iter_mut().zip(grads) {
            *p -= learning_rate * g;
        }
    }
}

/// The function the network learns.
fn teacher(x: &[f32; INPUTS]) -> f32 {
    (x[0] * 1.5 - x[3]).sin() + 0.5 * x[5] * x[6]
}

/// A deterministic uniform value in [-1, 1) (xorshift).
fn uniform(state: &mut u64) -> f32 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    ((*state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

/// The global batch of `step`: the same on every rank.
fn batch(step: usize, size: usize) -> Vec<[f32; INPUTS]> {
    let mut seed = 0x9E37_79B9_7F4A_7C15u64 ^ (step as u64).wrapping_mul(0xD1B5_4A32_D192_ED03);
    (0..size)
        .map(|_| std::array::from_fn(|_| uniform(&mut seed)))
        .collect()
}

/// The rows of a batch of `size` that `rank` of `world` trains on.
fn shard(size: usize, rank: usize, world: usize) -> std::ops::Range<usize> {
    size * rank / world..size * (rank + 1) / world
}

/// Trains across `group` and reports; every rank returns the report (the reference loss is
/// computed on rank 0 only, elsewhere it is NaN).
pub(crate) fn train(group: &ProcessGroup, cfg: &Config) -> Result<Report, CollectiveError> {
    let (rank, world) = (group.rank() as usize, group.world_size() as usize);
    let mut model = Mlp::new(cfg.hidden);
    let split = Mlp::layer1_len(cfg.hidden);
    let mut grads = vec![0.0f32; model.params.len()];
    let mut first_loss = f32::NAN;
    let mut final_loss = f32::NAN;
    // One compressor per layer: each carries the error feedback of its own tensor.
    let mut compressors = cfg
        .compression
        .map(|c| [Compressor::new(c), Compressor::new(c)]);
    // Layer 1's gradients, layer 2's and the loss, registered once for every step.
    let lengths = [split, grads.len() - split, 1];
    let mut buckets = Bucketer::with_bucket_bytes(group, &lengths, ReduceKind::Sum, BUCKET_BYTES)?;
    for step in 0..cfg.steps {
        let rows = batch(step, cfg.batch);
        let mine = &rows[shard(cfg.batch, rank, world)];
        let local_loss = model.loss_and_grads(mine, cfg.batch as f32, &mut grads);
        let loss = match &mut compressors {
            Some([layer1, layer2]) => {
                // Blocking, layer 2 first as the backward pass finishes it; the loss is
                // reported exactly, so it goes uncompressed.
                let (g1, g2) = grads.split_at_mut(split);
                group.all_reduce_compressed(g2, ReduceKind::Sum, layer2)?;
                group.all_reduce_compressed(g1, ReduceKind::Sum, layer1)?;
                let mut loss = [local_loss];
                group.all_reduce(&mut loss, ReduceKind::Sum)?;
                loss[0]
            }
            None => {
                // Backward runs from the output: the loss and layer 2 are handed over first
                // and their buckets go out while layer 1's is still being filled.
                buckets.ready(2, &[local_loss])?;
                buckets.ready(1, &grads[split..])?;
                buckets.ready(0, &grads[..split])?;
                let mut loss = [0.0f32];
                let (g1, g2) = grads.split_at_mut(split);
                buckets.wait(&mut [g1, g2, &mut loss])?;
                loss[0]
            }
        };
        model.step(&grads, cfg.learning_rate);
        if step == 0 {
            first_loss = loss;
        }
        final_loss = loss;
        if rank == 0 && (step % 50 == 0 || step + 1 == cfg.steps) {
            eprintln!("step {step:4}: loss {loss:.5}");
        }
    }
    // Every rank must hold rank 0's weights bit for bit.
    let mut theirs = model.params.clone();
    group.broadcast(0, &mut theirs)?;
    let same = i32::from(
        theirs
            .iter()
            .zip(&model.params)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
    );
    let mut agreed = [same];
    group.all_reduce(&mut agreed, ReduceKind::Min)?;
    let reference_loss = if rank == 0 { reference(cfg) } else { f32::NAN };
    Ok(Report {
        first_loss,
        final_loss,
        reference_loss,
        identical: agreed[0] == 1,
    })
}

/// How far the final loss may drift from the one-process run (relative): float rounding
/// alone without compression, and the targets of compressed training with error feedback
/// (within 0.5% for bf16 and fp16, 2% for int8).
pub(crate) fn tolerance(compression: Option<Compression>) -> f32 {
    match compression {
        None | Some(Compression::None) => 1e-3,
        Some(Compression::Int8) => 0.02,
        Some(_) => 0.005,
    }
}

/// The same training in one process, on whole batches: the loss of its last step.
fn reference(cfg: &Config) -> f32 {
    let mut model = Mlp::new(cfg.hidden);
    let mut grads = vec![0.0f32; model.params.len()];
    let mut loss = f32::NAN;
    for step in 0..cfg.steps {
        loss = model.loss_and_grads(&batch(step, cfg.batch), cfg.batch as f32, &mut grads);
        model.step(&grads, cfg.learning_rate);
    }
    loss
}

#[allow(
    dead_code,
    reason = "the tests include this file for `train` and never call main"
)]
fn main() -> ExitCode {
    let mut cfg = Config::default();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let value = args.next();
        let number = value.as_deref().and_then(|v| v.parse().ok());
        match (arg.as_str(), number) {
            ("--steps", Some(v)) => cfg.steps = v,
            ("--batch", Some(v)) => cfg.batch = v,
            ("--compression", _) => match value.as_deref().map(str::parse) {
                Some(Ok(c)) => cfg.compression = Some(c),
                _ => {
                    eprintln!("data_parallel: --compression takes none, bf16, fp16 or int8");
                    return ExitCode::FAILURE;
                }
            },
            _ => {
                eprintln!(
                    "usage: data_parallel [--steps N] [--batch N] [--compression none|bf16|fp16|int8]"
                );
                return ExitCode::FAILURE;
            }
        }
    }
    let report = rlx_collective::init().and_then(|group| {
        let report = train(&group, &cfg)?;
        Ok((group.rank(), group.world_size(), report))
    });
    match report {
        Ok((0, world, r)) => {
            let drift = (r.final_loss - r.reference_loss).abs() / r.reference_loss.max(1e-6);
            println!(
                "data_parallel: {world} ranks, {} steps: loss {:.5} -> {:.5} (one process: {:.5}, \
                 relative difference {drift:.1e}); weights identical on every rank: {}",
                cfg.steps, r.first_loss, r.final_loss, r.reference_loss, r.identical
            );
            if r.identical && drift < tolerance(cfg.compression) {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Ok((_, _, r)) if r.identical => ExitCode::SUCCESS,
        Ok(_) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("data_parallel: {e}");
            ExitCode::FAILURE
        }
    }
}
