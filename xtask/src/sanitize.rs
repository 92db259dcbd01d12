//! `cargo xtask sanitize`: the test suites under ThreadSanitizer, and the MLX backend's FFI
//! boundary (the Rust crate and its C++ shim) under AddressSanitizer.
//!
//! A sanitizer needs the standard library built with the same instrumentation, so this uses
//! rustup's nightly toolchain with its `rust-src` component and `-Zbuild-std`; Debian's Rust
//! release, which the macOS check uses, ships no sanitizer runtimes. Each sanitizer builds into
//! a target directory of its own, so the normal build is never invalidated. A report fails the
//! run at once (`halt_on_error=1`), naming the test.
//!
//! A few tests measure time, memory or threads against bounds set for uninstrumented code;
//! under a sanitizer (5–15 times slower, shadow memory in every RSS figure, a thread of its
//! own) those bounds say nothing about the code, so [`LEFT_OUT`] lists them with the reason,
//! and the run prints that list. Everything else runs.

use std::path::Path;
use std::process::Command;

use clap::{Args, ValueEnum};

use crate::cmd::{run_step, workspace_root};

/// Flags of `cargo xtask sanitize`.
#[derive(Debug, Args)]
pub(crate) struct SanitizeArgs {
    /// The selection CI runs: the unit tests and integration tests of rlx-transport and
    /// rlx-net, rlx-collective's unit tests and its failure-path suites, and the MLX shim.
    /// Without it every test target of every crate runs (rlx-collective's matrix alone takes
    /// about an hour under ThreadSanitizer on two cores).
    #[arg(long)]
    pub(crate) quick: bool,
    /// The sanitizers to run.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Sanitizer::Thread, Sanitizer::Address])]
    pub(crate) sanitizer: Vec<Sanitizer>,
}

/// A sanitizer this command runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Sanitizer {
    /// ThreadSanitizer over the Rust crates: data races, lock-order inversions.
    Thread,
    /// AddressSanitizer over the MLX backend: the Rust side and the C++ shim it calls.
    Address,
}

/// The target every sanitized build is for (`-Zbuild-std` needs one named).
const TARGET: &str = "x86_64-unknown-linux-gnu";

/// Tests left out under ThreadSanitizer, each with the reason.
const LEFT_OUT: &[(&str, &str)] = &[(
    "a_flood_for_a_tag_nobody_receives_is_bounded_by_the_budget",
    "bounds resident memory, which under the sanitizer includes its shadow memory",
)];

/// Tests the quick selection also leaves out, to keep CI inside its time, each with the
/// reason; the full run (`cargo xtask sanitize`) runs them.
const QUICK_LEFT_OUT: &[(&str, &str)] = &[(
    "conformance_matrix",
    "one_sided's matrix of every size over worlds of 1 to 8 took 8 of the quick run's 15 \
     minutes; the same worlds with capped segments (many signals per operation) and the other \
     one-sided tests still run",
)];

/// The test targets ThreadSanitizer runs: (package, targets). Quick mode keeps the suites
/// whose concurrency is the point (abort, blame, failure propagation, non-blocking
/// operations, shrinking, the one-sided heap).
fn thread_targets(quick: bool) -> Vec<(&'static str, Vec<&'static str>)> {
    let all = vec!["--lib", "--tests"];
    if !quick {
        return vec![
            ("rlx-transport", all.clone()),
            ("rlx-net", all.clone()),
            ("rlx-collective", all.clone()),
            ("rlx-tb", all),
        ];
    }
    let collective_suites = [
        "abort",
        "stall_blame",
        "failure_propagation",
        "nonblocking",
        "worker_threads",
        "shrink",
        "one_sided",
    ];
    let mut collective = vec!["--lib"];
    for suite in collective_suites {
        collective.extend(["--test", suite]);
    }
    vec![
        ("rlx-transport", all.clone()),
        ("rlx-net", all),
        ("rlx-collective", collective),
    ]
}

/// Runs the chosen sanitizers.
pub(crate) fn run(args: &SanitizeArgs) -> Result<(), String> {
    let root = workspace_root();
    nightly_with_source()?;
    if args.sanitizer.contains(&Sanitizer::Thread) {
        thread(&root, args.quick)?;
    }
    if args.sanitizer.contains(&Sanitizer::Address) {
        address(&root)?;
    }
    Ok(())
}

/// Checks that rustup's nightly toolchain has its std source, installing the component when
/// it is missing (rustup fetches it from its own server).
fn nightly_with_source() -> Result<(), String> {
    let listed = Command::new("rustup")
        .args(["component", "list", "--installed", "--toolchain", "nightly"])
        .output()
        .map_err(|e| format!("sanitize: rustup is needed for the nightly toolchain: {e}"))?;
    if !listed.status.success() {
        return Err(format!(
            "sanitize: no nightly toolchain (rustup toolchain install nightly): {}",
            String::from_utf8_lossy(&listed.stderr).trim()
        ));
    }
    if String::from_utf8_lossy(&listed.stdout)
        .lines()
        .any(|line| line.starts_with("rust-src"))
    {
        return Ok(());
    }
    run_step(
        "sanitize: the nightly std source",
        Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", "nightly"]),
    )
}

/// A `cargo +nightly test -Zbuild-std` for `sanitizer` (`thread`, `address`) into its own
/// target directory.
fn sanitized_test(root: &Path, sanitizer: &str) -> Command {
    let mut command = Command::new("cargo");
    command
        .current_dir(root)
        // The nightly toolchain, not the workspace's: a `CARGO`/`RUSTC` inherited from the
        // `cargo xtask` that started this would pin the stable one.
        .env_remove("CARGO")
        .env_remove("RUSTC")
        .env_remove("RUSTUP_TOOLCHAIN")
        .env("RUSTFLAGS", format!("-Zsanitizer={sanitizer}"))
        .env("RUSTDOCFLAGS", format!("-Zsanitizer={sanitizer}"))
        .env(
            "CARGO_TARGET_DIR",
            root.join("target").join(format!("sanitize-{sanitizer}")),
        )
        .args(["+nightly", "test", "-Zbuild-std", "--target", TARGET]);
    command
}

/// ThreadSanitizer over the test targets of [`thread_targets`], less [`LEFT_OUT`].
fn thread(root: &Path, quick: bool) -> Result<(), String> {
    eprintln!("\n==> ThreadSanitizer leaves out:");
    let left_out: Vec<_> = LEFT_OUT
        .iter()
        .chain(if quick { QUICK_LEFT_OUT } else { &[] })
        .collect();
    for (test, reason) in &left_out {
        eprintln!("    {test}: {reason}");
    }
    let mut failed = Vec::new();
    for (package, targets) in thread_targets(quick) {
        let mut command = sanitized_test(root, "thread");
        command
            .env("TSAN_OPTIONS", "halt_on_error=1 second_deadlock_stack=1")
            .args(["-p", package])
            .args(&targets)
            .args(["--no-fail-fast", "--"]);
        for (test, _) in &left_out {
            command.args(["--skip", test]);
        }
        // Every package runs, so that one failure does not hide another's report.
        if let Err(error) = run_step(&format!("ThreadSanitizer: {package}"), &mut command) {
            failed.push(error);
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(failed.join("; "))
    }
}

/// AddressSanitizer over the MLX backend: the Rust FFI crate's tests, with its C++ shim
/// compiled with `-fsanitize=address` too. Leak detection is off: MLX and the Python runtime
/// it is found through keep allocations alive until exit by design.
fn address(root: &Path) -> Result<(), String> {
    let python = crate::cmd::mlx_python(root)?;
    let mut command = sanitized_test(root, "address");
    command
        .env("PYTHON", &python)
        .env("CXXFLAGS", "-fsanitize=address -fno-omit-frame-pointer")
        .env("ASAN_OPTIONS", "detect_leaks=0 halt_on_error=1")
        .args(["-p", "rlx-mlx-ffi", "--features", "mlx"]);
    run_step("AddressSanitizer: rlx-mlx-ffi", &mut command)
}
