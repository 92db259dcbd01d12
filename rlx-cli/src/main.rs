//! `rlx`: launch a program as the ranks of a job, check the links between the ranks, and read
//! the flight records of a job that failed.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use rlx_cli::{doctor, flight_report, launch};

#[derive(Debug, Parser)]
#[command(
    name = "rlx",
    version,
    about = "RLX transport: launch, doctor, flight-report"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Runs any program as N ranks with the launch environment (torchrun / mlx.launch style):
    /// rank-prefixed output, and the first failed rank's exit code.
    Launch(launch::LaunchArgs),
    /// A pre-flight check of every rank pair: route and interface, MTU, RTT, bandwidth, clock
    /// skew, Thunderbolt links, versions, with advice.
    Doctor(doctor::DoctorArgs),
    /// One doctor rank (started by doctor).
    #[command(name = "__doctor-rank", hide = true)]
    DoctorRank,
    /// Reads the flight records a job's ranks wrote (RLX_FLIGHT_RECORDER=DIR) and names the
    /// rank that never reached an operation, mismatched operations and whom each rank waited on.
    FlightReport(flight_report::FlightReportArgs),
}

fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Command::Launch(args) => {
            return match launch::run(&args) {
                Ok(code) => ExitCode::from(code),
                Err(message) => {
                    eprintln!("rlx launch: {message}");
                    ExitCode::FAILURE
                }
            };
        }
        Command::Doctor(args) => std::env::current_exe()
            .map_err(|e| format!("could not find the running rlx binary: {e}"))
            .and_then(|binary| doctor::run(&args, &binary)),
        Command::DoctorRank => doctor::rank_main(),
        Command::FlightReport(args) => flight_report::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("rlx: {message}");
            ExitCode::FAILURE
        }
    }
}
