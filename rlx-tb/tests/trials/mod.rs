//! The runner of this crate's multi-process test binaries (`harness = false`): libtest-mimic
//! with libtest's command line and summary, one test at a time, and tests that cannot run on
//! this machine shown as ignored with their reason instead of passing silently.
//!
//! Under `CI=true` a test that cannot run fails instead: CI runs as root with iproute2
//! installed, so there a skip can only mean a broken CI machine, never a pass.

#![allow(
    dead_code,
    reason = "each test binary uses a different part of the runner"
)]

use libtest_mimic::{Arguments, Failed, Trial};

/// A test body: `Err` with the reason on failure (a panic fails the test too).
pub(crate) type Body = fn() -> Result<(), String>;

/// The trial of `body`, or, when `unavailable` names a reason, an ignored trial that shows it
/// (a failing one under `CI=true`).
pub(crate) fn trial(name: &str, body: Body, unavailable: Option<&'static str>) -> Trial {
    match unavailable {
        None => Trial::test(name, move || body().map_err(Failed::from)),
        Some(reason) if in_ci() => Trial::test(name, move || {
            Err(Failed::from(format!(
                "CI=true, yet this test cannot run here: {reason}"
            )))
        }),
        Some(reason) => Trial::test(name, || Ok(()))
            .with_ignored_flag(true)
            .with_kind(format!("skipped: {reason}")),
    }
}

/// Whether this run is CI's (`CI=true`), where every test must run.
fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Runs `trials` under libtest's command line, one at a time unless `--test-threads` says
/// otherwise (the tests start processes of their own and count sockets), and exits.
pub(crate) fn run(trials: Vec<Trial>) -> ! {
    let mut args = Arguments::from_args();
    args.test_threads.get_or_insert(1);
    libtest_mimic::run(&args, trials).exit()
}
