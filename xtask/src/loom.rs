//! `cargo xtask loom`: the loom model checks, built with `--cfg rlx_loom` in their own target
//! directory so that switching cfgs never invalidates the normal build.

use clap::Args;

use crate::cmd::{cargo, run_step, workspace_root};

/// Flags of `cargo xtask loom`.
#[derive(Debug, Args)]
pub(crate) struct LoomArgs {
    /// Loom's preemption bound (`LOOM_MAX_PREEMPTIONS`).
    #[arg(long, default_value_t = 2)]
    pub(crate) preemptions: u32,
}

/// The crates that carry loom models, with the test targets that hold them.
const MODELS: &[(&str, &str)] = &[
    ("rlx-transport", "loom_inbox"),
    ("rlx-transport", "loom_heap"),
    ("rlx-net", "loom_progress"),
    ("rlx-collective", "loom_flight"),
];

/// Runs every loom model at the given preemption bound.
pub(crate) fn run(args: &LoomArgs) -> Result<(), String> {
    let target = workspace_root().join("target").join("loom");
    for (package, test) in MODELS {
        let mut command = cargo();
        command
            .args(["test", "--release", "-p", package, "--test", test])
            .env("RUSTFLAGS", "--cfg rlx_loom -C debug-assertions")
            .env("LOOM_MAX_PREEMPTIONS", args.preemptions.to_string())
            .env("CARGO_TARGET_DIR", &target);
        run_step(&format!("loom {package}/{test}"), &mut command)?;
    }
    Ok(())
}
