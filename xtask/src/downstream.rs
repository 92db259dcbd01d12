//! The README's "Use it in your crate" section, checked as a new user would use it: its
//! `Cargo.toml` lines and its program become a fresh crate outside the workspace, which is
//! built against this checkout; the `rlx` command is installed with `cargo install`, as the
//! section says, and launches it as 4 ranks. A README that shows a dependency line, an
//! install command or an API that no longer works fails CI.

use std::fs;
use std::path::{Path, PathBuf};

use crate::cmd::{cargo, run_step, workspace_root};

/// The README section whose blocks make the crate.
const SECTION: &str = "## Use it in your crate";
/// How many ranks the crate is launched as.
const RANKS: u32 = 4;

/// Builds the README's crate, installs `rlx` and launches the crate as [`RANKS`] ranks over
/// TCP with it.
pub(crate) fn check() -> Result<(), String> {
    let root = workspace_root();
    let readme = fs::read_to_string(root.join("README.md"))
        .map_err(|e| format!("downstream crate: cannot read README.md: {e}"))?;
    let (manifest, program, commands) = section_blocks(&readme)?;
    let dir = root.join("target").join("downstream");
    write_crate(&dir, &manifest_for(&manifest, &root)?, &program)?;
    // The workspace's target directory, so that the dependencies built for the tests and
    // the examples are reused.
    let target = root.join("target");
    run_step(
        "downstream crate (build)",
        cargo()
            .current_dir(&dir)
            .env("CARGO_TARGET_DIR", &target)
            .args(["build", "--release"]),
    )?;
    let rlx = install_rlx(&commands, &root, &dir)?;
    let binary = target.join("release").join("readme-program");
    eprintln!("\n==> downstream crate: rlx launch -n {RANKS} -- readme-program");
    let status = std::process::Command::new(&rlx)
        .args([
            "launch",
            "-n",
            &RANKS.to_string(),
            "--timeout-ms",
            "60000",
            "--",
        ])
        .arg(&binary)
        .status()
        .map_err(|e| format!("could not run {}: {e}", rlx.display()))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!(
            "the README's program failed as {RANKS} ranks under rlx launch ({status})"
        ))
    }
}

/// Installs the `rlx` command from this checkout into `dir`, the way the README's `sh` block
/// (`commands`) says, and returns its path. The debug profile and the workspace's target
/// directory reuse what the tests built, and `--locked` the versions they were tested with.
fn install_rlx(commands: &str, root: &Path, dir: &Path) -> Result<PathBuf, String> {
    let says = |words: &[&str]| {
        commands
            .lines()
            .any(|line| words.iter().all(|word| line.contains(word)))
    };
    if !says(&["cargo install", "rlx-cli"]) || !says(&["rlx launch"]) {
        return Err(format!(
            "README.md's {SECTION:?}: its sh block does not install rlx-cli with cargo install \
             and run the program with rlx launch"
        ));
    }
    let install_root = dir.join("cli");
    run_step(
        "downstream crate (cargo install rlx-cli)",
        cargo()
            .env("CARGO_TARGET_DIR", root.join("target"))
            .args(["install", "--debug", "--locked", "--force", "--path"])
            .arg(root.join("rlx-cli"))
            .arg("--root")
            .arg(&install_root),
    )?;
    Ok(install_root.join("bin").join("rlx"))
}

/// The first `toml`, `rust` and `sh` blocks of the README's [`SECTION`].
fn section_blocks(readme: &str) -> Result<(String, String, String), String> {
    let start = readme
        .find(SECTION)
        .ok_or_else(|| format!("README.md has no section {SECTION:?}"))?;
    let body = &readme[start + SECTION.len()..];
    let body = body.find("\n## ").map_or(body, |end| &body[..end]);
    let block = |fence: &str| {
        let open = format!("```{fence}\n");
        let from = body
            .find(&open)
            .ok_or_else(|| format!("README.md's {SECTION:?} has no {fence} block"))?
            + open.len();
        let len = body[from..]
            .find("```")
            .ok_or_else(|| format!("README.md's {SECTION:?}: an unclosed {fence} block"))?;
        Ok::<_, String>(body[from..from + len].to_owned())
    };
    Ok((block("toml")?, block("rust")?, block("sh")?))
}

/// The crate's manifest: a package of its own (not a member of this workspace) with the
/// README's dependency lines, whose `path` is pointed at this checkout's crate.
fn manifest_for(dependencies: &str, root: &Path) -> Result<String, String> {
    let crate_dir = root.join("rlx-collective");
    let mut pointed = false;
    let lines: Vec<String> = dependencies
        .lines()
        .map(
            |line| match (line.find("path = \""), line.starts_with("rlx-collective")) {
                (Some(at), true) => {
                    let value = at + "path = \"".len();
                    let end = line[value..].find('"').map_or(line.len(), |e| value + e);
                    pointed = true;
                    format!("{}{}{}", &line[..value], crate_dir.display(), &line[end..])
                }
                _ => line.to_owned(),
            },
        )
        .collect();
    if !pointed {
        return Err(format!(
            "README.md's {SECTION:?}: its toml block has no `rlx-collective = {{ path = ... }}` line"
        ));
    }
    Ok(format!(
        "[package]\nname = \"readme-program\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\
         publish = false\n\n{}\n[workspace]\n",
        lines.join("\n")
    ))
}

/// Writes the crate into `dir`, with this workspace's lock file so that it builds with the
/// dependency versions the workspace was tested with.
fn write_crate(dir: &Path, manifest: &str, program: &str) -> Result<(), String> {
    let src = dir.join("src");
    let write = |path: PathBuf, text: &str| {
        fs::write(&path, text).map_err(|e| format!("downstream crate: {}: {e}", path.display()))
    };
    fs::create_dir_all(&src).map_err(|e| format!("downstream crate: {}: {e}", src.display()))?;
    write(dir.join("Cargo.toml"), manifest)?;
    write(src.join("main.rs"), program)?;
    let lock = workspace_root().join("Cargo.lock");
    fs::copy(&lock, dir.join("Cargo.lock"))
        .map(drop)
        .map_err(|e| format!("downstream crate: copying {}: {e}", lock.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_readme_section_makes_a_crate_pointed_at_this_checkout() {
        let readme = fs::read_to_string(workspace_root().join("README.md")).unwrap();
        let (toml, program, commands) = section_blocks(&readme).unwrap();
        assert!(program.contains("rlx_collective::init()"), "{program}");
        assert!(commands.contains("rlx launch"), "{commands}");
        let manifest = manifest_for(&toml, Path::new("/checkout")).unwrap();
        assert!(
            manifest.contains("path = \"/checkout/rlx-collective\""),
            "{manifest}"
        );
        assert!(manifest.ends_with("[workspace]\n"), "{manifest}");
    }
}
