//! `cargo xtask ci`: exactly what CI runs, in order, stopping at the first failure.

use clap::Args;

use crate::cmd::{cargo, run_step};
use crate::{bench, cluster, loom};

/// Flags of `cargo xtask ci`.
#[derive(Debug, Args)]
pub(crate) struct CiArgs {
    /// Skip the loom model checks (they are part of CI; this is for quick local runs).
    #[arg(long)]
    pub(crate) no_loom: bool,
}

/// Runs every CI step.
pub(crate) fn run(args: &CiArgs) -> Result<(), String> {
    run_step("fmt", cargo().args(["fmt", "--all", "--check"]))?;
    run_step(
        "clippy",
        cargo().args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--features",
            "rlx-collective/thunderbolt",
            "--",
            "-D",
            "warnings",
        ]),
    )?;
    run_step(
        "tests",
        cargo().args([
            "test",
            "--workspace",
            "--features",
            "rlx-collective/thunderbolt",
        ]),
    )?;
    eprintln!("\n==> test-cluster: 3 ranks over TCP, the quick case list");
    cluster::run(&cluster::ClusterArgs::ci()).map_err(|e| format!("test-cluster: {e}"))?;
    eprintln!("\n==> bench smoke: every operation, dtype and reduction, small sizes, #wrong only");
    bench::run(&bench::BenchArgs::smoke()).map_err(|e| format!("bench smoke: {e}"))?;
    if !args.no_loom {
        loom::run(&loom::LoomArgs { preemptions: 2 })?;
    }
    Ok(())
}
