//! The `rlx` command's implementation: `rlx launch` runs any program as the ranks of one job,
//! `rlx doctor` checks the links a job would use, `rlx flight-report` reads the flight
//! records a job's ranks wrote. Install the command with
//! `cargo install --git <repository> rlx-cli` (or `--path rlx-cli` in a checkout).
//!
//! The library exists so the workspace's `cargo xtask` can offer the same commands as aliases
//! and start the ranks of its own test clusters and benchmarks through the same launcher
//! ([`job`], [`world`], [`netns`]); it is not an API with stability promises.

pub mod doctor;
pub mod flight_report;
pub mod job;
pub mod launch;
pub mod netns;
pub mod tcp_counters;
pub mod world;

/// Whether this is CI's run (`CI=true`, which the repository's `.ci/run` sets): there a test
/// may skip nothing, because CI installs everything every test needs.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}
