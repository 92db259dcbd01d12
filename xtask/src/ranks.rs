//! The ranks of `test-cluster`, `bench` and the doctor's alias: this very binary, built in
//! release mode and re-executed with a hidden subcommand, so they run exactly the collectives
//! a user's program would, built once; and the rank side's joining of its group.

use std::fs;
use std::path::PathBuf;

use crate::cmd::{cargo, workspace_root};
use crate::world::TransportKind;

/// `target/xtask/`, created on demand, for files the launcher writes (hostfiles, peer builds).
pub(crate) fn scratch_dir() -> Result<PathBuf, String> {
    let dir = workspace_root().join("target").join("xtask");
    fs::create_dir_all(&dir).map_err(|e| format!("could not create {}: {e}", dir.display()))?;
    Ok(dir)
}

/// Names a release xtask binary that tests use as their rank binary instead of building one
/// (see [`rank_binary`]); `cargo xtask flaky` sets it to its own snapshot, so that a test it
/// runs never builds from a tree that someone edits during the hunt.
pub(crate) const RANK_BINARY_VAR: &str = "RLX_XTASK_RANK_BINARY";

/// The rank binary: this binary built in release mode (with the `mlx` feature when the world
/// needs it), so that the collectives run at full speed even under a debug `cargo xtask`.
pub(crate) fn rank_binary(transport: TransportKind) -> Result<PathBuf, String> {
    let needs_mlx = transport == TransportKind::Mlx;
    if let Some(binary) = std::env::var_os(RANK_BINARY_VAR).filter(|_| !needs_mlx) {
        return Ok(PathBuf::from(binary));
    }
    if !cfg!(debug_assertions) && (cfg!(feature = "mlx") || !needs_mlx) {
        return std::env::current_exe()
            .map_err(|e| format!("could not find the running xtask binary: {e}"));
    }
    let mut command = cargo();
    command.args([
        "build",
        "--release",
        "--package",
        "xtask",
        "--bin",
        "xtask",
        "--message-format=json-render-diagnostics",
    ]);
    if needs_mlx {
        command.args(["--features", "mlx"]);
    }
    eprintln!(
        "xtask: building the rank binary (release{})",
        if needs_mlx { ", mlx" } else { "" }
    );
    let output = command
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("could not run cargo build: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "building the rank binary failed ({})",
            output.status
        ));
    }
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|message| message["reason"] == "compiler-artifact")
        .filter(|message| message["target"]["name"] == "xtask")
        .find_map(|message| message["executable"].as_str().map(PathBuf::from))
        .ok_or_else(|| "cargo build did not report the xtask executable".to_owned())
}

/// The rank side: the groups this process runs. A socket or MLX rank joins the world from the
/// environment its launcher set (`rlx_collective::init`); the in-process transport makes all
/// `ranks` ranks here, honouring `RLX_TIMEOUT_MS` as the socket transports do.
pub(crate) fn join(
    transport: TransportKind,
    ranks: u32,
) -> Result<Vec<rlx_collective::ProcessGroup>, String> {
    use std::sync::Arc;

    use rlx_collective::{MemTransport, ProcessGroup, Transport};

    match transport {
        TransportKind::Mem => {
            let env = |key: &str| std::env::var(key).ok().filter(|v| !v.trim().is_empty());
            let timeout =
                rlx_transport::bootstrap::op_timeout_from(&env).map_err(|e| e.to_string())?;
            Ok(MemTransport::fan_out_with_timeout(ranks, timeout)
                .into_iter()
                .map(|t| ProcessGroup::new(t as Arc<dyn Transport>))
                .collect())
        }
        _ => rlx_collective::init()
            .map(|group| vec![group])
            .map_err(|e| format!("could not join the group over {}: {e}", transport.name())),
    }
}

/// Forces the algorithms named in `overrides` (`all_reduce=ring,broadcast=binomial_tree`) on
/// `group`.
pub(crate) fn force_algorithms(
    group: &rlx_collective::ProcessGroup,
    overrides: &str,
) -> Result<(), String> {
    use rlx_collective::CollectiveOp;

    for item in overrides
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        let (op_name, algorithm_name) = item
            .split_once('=')
            .ok_or_else(|| format!("{item:?} is not OP=ALGORITHM"))?;
        let op = CollectiveOp::ALL
            .into_iter()
            .find(|op| op.name() == op_name)
            .ok_or_else(|| format!("{op_name:?} is not a collective"))?;
        let algorithm = op
            .algorithms()
            .iter()
            .copied()
            .find(|a| a.name() == algorithm_name)
            .ok_or_else(|| {
                let names: Vec<&str> = op.algorithms().iter().map(|a| a.name()).collect();
                format!(
                    "{op_name} has no algorithm {algorithm_name:?} (choose {})",
                    names.join(", ")
                )
            })?;
        group
            .set_algorithm(op, algorithm)
            .map_err(|e| format!("could not force {item}: {e}"))?;
    }
    Ok(())
}
