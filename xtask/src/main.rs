//! `cargo xtask`: the project's automation. `ci` is exactly what CI runs; `loom` runs the model
//! checks; `sanitize` the test suites under ThreadSanitizer and AddressSanitizer; `flaky`
//! runs chosen tests many times beside busy threads to find those that depend on scheduling;
//! `test-cluster` and `bench` launch real multi-process jobs, whose ranks are this same binary
//! re-executed with a hidden subcommand; `bench-ab` runs two builds' benches in turn to compare
//! them; `launch`, `doctor` and `flight-report` are aliases of the installable `rlx` command's
//! (crate `rlx-cli`).

mod bench;
mod ci;
mod cluster;
mod cmd;
mod downstream;
mod flaky;
mod loom;
mod macos;
mod ranks;
mod sanitize;
mod supervise;

// The `rlx` command's modules, under the names the rest of xtask uses.
use rlx_cli::{doctor, flight_report, job, launch, netns, tcp_counters, world};

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "cargo xtask", about = "RLX transport project automation")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Everything CI runs: fmt check, clippy -D warnings, tests, a short cluster run, a bench
    /// smoke sweep, the MLX tests, the macOS type-check, loom, the sanitizers (quick selection).
    Ci(ci::CiArgs),
    /// Loom model checks under `--cfg rlx_loom`.
    Loom(loom::LoomArgs),
    /// The test suites under ThreadSanitizer and the MLX shim under AddressSanitizer (rustup's
    /// nightly with its std source).
    Sanitize(sanitize::SanitizeArgs),
    /// A pre-flight check of every rank pair: route and interface, MTU, RTT, bandwidth, clock
    /// skew, Thunderbolt links, versions, with advice.
    Doctor(doctor::DoctorArgs),
    /// One doctor rank (started by doctor).
    #[command(name = "__doctor-rank", hide = true)]
    DoctorRank,
    /// Runs chosen tests N times each beside K busy threads and prints each test's failure
    /// count with its first failure's output (default: the multi-process, network-namespace and
    /// fault tests).
    Flaky(flaky::FlakyArgs),
    /// Reads the flight records a job's ranks wrote (RLX_FLIGHT_RECORDER=DIR) and names the
    /// rank that never reached an operation, mismatched operations and whom each rank waited on.
    FlightReport(flight_report::FlightReportArgs),
    /// The macOS type-check of `ci` alone (clippy and docs for aarch64- and x86_64-apple-darwin
    /// with Debian's Rust and its std source).
    MacosCheck,
    /// The README's "Use it in your crate" program as a fresh crate of its own, built against
    /// this checkout and launched as 4 ranks (a step of `ci`).
    ReadmeCrate,
    /// A local multi-rank cluster running every collective on every dtype and reduction over
    /// awkward sizes, checked against a serial reference.
    TestCluster(cluster::ClusterArgs),
    /// An nccl-tests style sweep (busbw, #wrong), optionally side by side with Open MPI, Gloo
    /// and MLX.
    Bench(bench::BenchArgs),
    /// A/B of two release builds of this binary: their benches in turn, round after round, and
    /// a table of each row's median time, new over old, flagging rows more than 5% slower.
    BenchAb(bench::ab::AbArgs),
    /// The bench's operations on a simulated network (a switch, a mesh, a ring or a chain of
    /// cables at a given rate and latency) at up to a thousand thread ranks, on a virtual
    /// clock: the collectives that ship, their predicted times against each operation's
    /// lower bound.
    Simulate(bench::simulate::SimulateArgs),
    /// Runs any program as N ranks with the launch environment (torchrun / mlx.launch style):
    /// rank-prefixed output, and the first failed rank's exit code.
    Launch(launch::LaunchArgs),
    /// One of the test-cluster runs of `ci`, by its index (started by flaky).
    #[command(name = "__ci-cluster", hide = true)]
    CiCluster {
        /// Which run, counted from 0 in the order `ci` runs them.
        index: usize,
    },
    /// One test-cluster rank (started by test-cluster).
    #[command(name = "__rank", hide = true)]
    Rank(cluster::worker::RankArgs),
    /// One bench rank (started by bench).
    #[command(name = "__bench-rank", hide = true)]
    BenchRank(bench::worker::BenchRankArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Launch(args) => {
            return match launch::run(&args) {
                Ok(code) => ExitCode::from(code),
                Err(message) => {
                    eprintln!("xtask launch: {message}");
                    ExitCode::FAILURE
                }
            };
        }
        Command::Ci(args) => ci::run(&args),
        Command::Loom(args) => loom::run(&args),
        Command::Sanitize(args) => sanitize::run(&args),
        Command::FlightReport(args) => flight_report::run(&args),
        Command::Flaky(args) => flaky::run(&args),
        Command::CiCluster { index } => ci::cluster_run(index),
        // The doctor's ranks are this binary's release build, so they measure at full speed
        // even under a debug `cargo xtask`.
        Command::Doctor(args) => ranks::rank_binary(args.world.transport.into())
            .and_then(|binary| doctor::run(&args, &binary)),
        Command::DoctorRank => doctor::rank_main(),
        Command::ReadmeCrate => downstream::check(),
        Command::MacosCheck => macos::Toolchain::find().and_then(|t| macos::check(&t)),
        Command::TestCluster(args) => cluster::run(&args),
        Command::Bench(args) => bench::run(&args),
        Command::BenchAb(args) => bench::ab::run(&args),
        Command::Simulate(args) => bench::simulate::run(&args),
        Command::Rank(args) => {
            rlx_collective::install_debug_subscriber();
            cluster::worker::run(&args)
        }
        Command::BenchRank(args) => {
            rlx_collective::install_debug_subscriber();
            bench::worker::run(&args)
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("xtask: {message}");
            ExitCode::FAILURE
        }
    }
}
