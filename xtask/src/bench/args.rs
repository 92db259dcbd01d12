//! The flags of `cargo xtask bench` and the smoke sweep that `cargo xtask ci` runs.

use std::path::PathBuf;

use clap::Args;

use crate::world::WorldArgs;

/// Flags of `cargo xtask bench` (nccl-tests' short flags where it has one).
#[derive(Debug, Clone, Args)]
pub(crate) struct BenchArgs {
    /// Operations: all_reduce, all_gather, reduce_scatter, broadcast, reduce, all_to_all,
    /// sendrecv, gather, scatter, a comma-separated list, or all.
    #[arg(long, default_value = "all_reduce")]
    pub(crate) op: String,
    /// Smallest size in bytes (suffixes K, M, G).
    #[arg(short = 'b', long = "minbytes", default_value = "8")]
    pub(crate) min_bytes: String,
    /// Largest size in bytes (suffixes K, M, G).
    #[arg(short = 'e', long = "maxbytes", default_value = "256M")]
    pub(crate) max_bytes: String,
    /// Multiplication factor between sizes.
    #[arg(short = 'f', long = "stepfactor", default_value_t = 4)]
    pub(crate) factor: u64,
    /// Timed iterations per size (fewer for big sizes, see --budget).
    #[arg(short = 'n', long = "iters", default_value_t = 20)]
    pub(crate) iters: u32,
    /// Warm-up iterations per size.
    #[arg(short = 'w', long = "warmup_iters", default_value_t = 5)]
    pub(crate) warmup: u32,
    /// Element types: f16, bf16, f32, f64, i8, u8, i32, i64, a list, or all.
    #[arg(short = 'd', long = "datatype", default_value = "f32")]
    pub(crate) dtype: String,
    /// Reductions: sum, mean, max, min, prod, a list, or all.
    #[arg(short = 'o', long = "redop", default_value = "sum")]
    pub(crate) redop: String,
    /// Number of ranks.
    #[arg(long, default_value_t = 2)]
    pub(crate) ranks: u32,
    /// Transport, rendezvous and namespaces of RLX's ranks.
    #[command(flatten)]
    pub(crate) world: WorldArgs,
    /// Force algorithms, as OP=ALGORITHM[,...] (e.g. all_reduce=ring).
    #[arg(long, default_value = "")]
    pub(crate) algorithm: String,
    /// Bytes each size may move at most, which caps the iterations of big sizes.
    #[arg(long, default_value = "1G")]
    pub(crate) budget: String,
    /// Write every number (each iteration's time included) to this JSON file.
    #[arg(long)]
    pub(crate) json: Option<PathBuf>,
    /// Draw busbw against size as an SVG.
    #[arg(long)]
    pub(crate) plot: Option<PathBuf>,
    /// Also run Open MPI, Gloo and MLX (whichever are installed) and iperf3, interleaved.
    #[arg(long)]
    pub(crate) peers: bool,
    /// Also run `all_reduce_compressed` in these formats (none, bf16, fp16, int8, a list, or
    /// all) right after each f32 sum or mean all-reduce of the same size, reporting its time,
    /// busbw of the uncompressed bytes, wire bytes per rank and speedup over the plain one.
    #[arg(long, default_value = "")]
    pub(crate) compression: String,
    /// Measure the compression kernels (GB/s of f32 compressed and decompressed on one core,
    /// beside a memcpy) on a buffer of -e bytes instead of running ranks.
    #[arg(long)]
    pub(crate) kernels: bool,
    /// Also print each row's 90th and 99th percentile and slowest iteration, which show a
    /// size that sometimes falls into a slow mode.
    #[arg(long)]
    pub(crate) percentiles: bool,
    /// Write the side-by-side report of BENCHMARKS.md into this directory: `--runs` runs of
    /// the same sweeps with the peers (1 and 32 MiB, 256 MiB, the 8 B all-reduce), their JSON
    /// files and plots, and `report-N-ranks.md` with the medians, the per-run ratios and each
    /// target met or missed. Takes the world flags (`--ranks`, `--netns`...); the sweep flags
    /// are its own.
    #[arg(long)]
    pub(crate) report: Option<PathBuf>,
    /// Runs of each sweep for `--report`.
    #[arg(long, default_value_t = 3)]
    pub(crate) runs: u32,
    /// With `--report`: measure nothing, write the report again from the JSON files of
    /// `--runs` runs already in the directory.
    #[arg(long, requires = "report")]
    pub(crate) rewrite: bool,
}

impl BenchArgs {
    /// The smoke sweep of `cargo xtask ci`: every operation, dtype and reduction on a few
    /// small sizes over three TCP ranks; only the `#wrong` column decides.
    pub(crate) fn smoke() -> BenchArgs {
        BenchArgs {
            op: "all".to_owned(),
            min_bytes: "8".to_owned(),
            max_bytes: "64K".to_owned(),
            factor: 64,
            iters: 2,
            warmup: 1,
            dtype: "all".to_owned(),
            redop: "all".to_owned(),
            ranks: 3,
            world: WorldArgs::tcp(),
            algorithm: String::new(),
            budget: "1G".to_owned(),
            json: None,
            plot: None,
            peers: false,
            compression: "all".to_owned(),
            kernels: false,
            percentiles: false,
            report: None,
            runs: 1,
            rewrite: false,
        }
    }
}
