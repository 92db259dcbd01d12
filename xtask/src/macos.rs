//! The macOS step of `cargo xtask ci`: type-checks the workspace for Apple Silicon and Intel
//! Macs on this Linux machine, with no Apple SDK and no linker.
//!
//! Debian's `rustc-web`, `cargo-web`, `rust-web-clippy` and `rust-web-src` packages are one Rust
//! release together with the source of its standard library, so cargo can rebuild `std` for an
//! Apple target (`-Zbuild-std`, which `RUSTC_BOOTSTRAP=1` unlocks on a stable compiler).
//! `clippy` and `doc` never link, so nothing Apple-made is needed. The passes mirror the Linux
//! ones: default features, the whole workspace with the Thunderbolt backend, the MLX backend's
//! Rust code (its build script compiles a C++ shim against MLX, which cannot happen here, so
//! cargo's build-script override for the `links = "mlx"` package stands in for it), and the
//! docs, all with warnings denied.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::cmd::{run_step, workspace_root};

/// The Apple targets checked, both in every pass.
const TARGETS: &[&str] = &["aarch64-apple-darwin", "x86_64-apple-darwin"];

/// The Debian packages that provide the toolchain (`.ci/run` installs them).
pub(crate) const PACKAGES: &[&str] = &["rustc-web", "cargo-web", "rust-web-clippy", "rust-web-src"];

/// Debian's toolchain, used instead of rustup's, whose release has no std source here.
#[derive(Debug)]
pub(crate) struct Toolchain {
    cargo: PathBuf,
    rustc: PathBuf,
}

impl Toolchain {
    /// Finds Debian's `cargo` and `rustc` with the std source next to them, or says what is
    /// missing.
    pub(crate) fn find() -> Result<Toolchain, String> {
        let install = format!("apt-get install {}", PACKAGES.join(" "));
        let toolchain = Toolchain {
            cargo: PathBuf::from("/usr/bin/cargo"),
            rustc: PathBuf::from("/usr/bin/rustc"),
        };
        for tool in [
            &toolchain.cargo,
            &toolchain.rustc,
            Path::new("/usr/bin/cargo-clippy"),
        ] {
            if !tool.is_file() {
                return Err(format!("{} is missing ({install})", tool.display()));
            }
        }
        let sysroot = Command::new(&toolchain.rustc)
            .args(["--print", "sysroot"])
            .output()
            .map_err(|e| format!("{} --print sysroot: {e}", toolchain.rustc.display()))?;
        let sysroot = PathBuf::from(String::from_utf8_lossy(&sysroot.stdout).trim());
        let std_source = sysroot.join("lib/rustlib/src/rust/library/std");
        if !std_source.is_dir() {
            return Err(format!(
                "the standard library's source is missing at {} ({install})",
                std_source.display()
            ));
        }
        Ok(toolchain)
    }

    /// A cargo command of this toolchain for `subcommand`, building std for every Apple
    /// target, in a target directory of its own.
    fn cargo(&self, subcommand: &str) -> Command {
        let root = workspace_root();
        let mut command = Command::new(&self.cargo);
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut dirs = vec![PathBuf::from("/usr/bin")];
        dirs.extend(std::env::split_paths(&path));
        command
            .current_dir(&root)
            .env(
                "PATH",
                std::env::join_paths(dirs).unwrap_or_else(|_| path.clone()),
            )
            .env("RUSTC", &self.rustc)
            .env("RUSTC_BOOTSTRAP", "1")
            .env("CARGO_TARGET_DIR", root.join("target").join("macos-check"))
            // Set by rustup's proxies and by the cargo running xtask; they would pull the other
            // toolchain back in.
            .env_remove("RUSTUP_TOOLCHAIN")
            .env_remove("RUSTC_WRAPPER")
            .env_remove("RUSTC_WORKSPACE_WRAPPER")
            .env_remove("CARGO")
            .args([subcommand, "-Zbuild-std=std,panic_abort"]);
        for target in TARGETS {
            command.args(["--target", target]);
        }
        command
    }
}

/// Runs every macOS pass with `toolchain`; `Err` names the first that failed.
pub(crate) fn check(toolchain: &Toolchain) -> Result<(), String> {
    let deny = ["--", "-D", "warnings"];
    run_step(
        "macOS clippy (default features)",
        toolchain.cargo("clippy").arg("--all-targets").args(deny),
    )?;
    run_step(
        "macOS clippy (workspace, thunderbolt)",
        toolchain
            .cargo("clippy")
            .args([
                "--all-targets",
                "--workspace",
                "--features",
                "rlx-collective/thunderbolt",
            ])
            .args(deny),
    )?;
    let mut mlx = toolchain.cargo("clippy");
    for target in TARGETS {
        mlx.args([
            "--config",
            &format!("target.{target}.mlx.rustc-link-lib=[\"dylib=mlx\"]"),
        ]);
    }
    run_step(
        "macOS clippy (mlx, build script overridden)",
        mlx.args([
            "--all-targets",
            "-p",
            "rlx-mlx-ffi",
            "-p",
            "rlx-collective",
            "--features",
            "rlx-collective/mlx",
        ])
        .args(deny),
    )?;
    run_step(
        "macOS docs",
        toolchain
            .cargo("doc")
            .env("RUSTDOCFLAGS", "-D warnings")
            .args([
                "--workspace",
                "--no-deps",
                "--features",
                "rlx-collective/thunderbolt",
            ]),
    )
}
