//! Running child commands from the workspace root, with the command echoed and its failure
//! turned into an error message; and the Python through which those commands find MLX.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The workspace root (the parent of this crate's directory).
pub(crate) fn workspace_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map(PathBuf::from).unwrap_or(manifest)
}

/// A `cargo` command run from the workspace root.
pub(crate) fn cargo() -> Command {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    command.current_dir(workspace_root());
    command
}

/// Runs `command`, echoing it first; a non-zero exit becomes an error naming the step.
pub(crate) fn run_step(step: &str, command: &mut Command) -> Result<(), String> {
    eprintln!("\n==> {step}: {command:?}");
    let status = command
        .status()
        .map_err(|e| format!("{step}: could not start {command:?}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{step} failed ({status})"))
    }
}

/// The Python through which the MLX backend's build finds MLX: `target/mlx-venv`'s, after
/// installing `mlx[cpu]` there unless MLX is found (there, or through `MLX_DIR`).
pub(crate) fn mlx_python(root: &Path) -> Result<PathBuf, String> {
    let venv = root.join("target").join("mlx-venv");
    let python = venv.join("bin").join("python");
    let has_mlx = Command::new(&python)
        .args(["-c", "import mlx.core"])
        .status()
        .is_ok_and(|s| s.success());
    if std::env::var_os("MLX_DIR").is_none() && !has_mlx {
        run_step(
            "mlx venv",
            Command::new("python3").args(["-m", "venv"]).arg(&venv),
        )?;
        run_step(
            "mlx install",
            Command::new(venv.join("bin").join("pip")).args(["install", "--quiet", "mlx[cpu]"]),
        )?;
    }
    Ok(python)
}
