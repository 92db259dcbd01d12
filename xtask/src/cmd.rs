//! Running child commands from the workspace root, with the command echoed and its failure
//! turned into an error message.

use std::path::PathBuf;
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
