//! `cargo xtask`: the project's automation. `ci` is exactly what CI runs; `loom` runs the model
//! checks; `test-cluster` and `bench` launch real multi-process jobs.

mod ci;
mod cmd;
mod loom;

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
    /// Everything CI runs: fmt check, clippy -D warnings, tests, a short cluster run, loom.
    Ci(ci::CiArgs),
    /// Loom model checks under `--cfg rlx_loom`.
    Loom(loom::LoomArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Ci(args) => ci::run(&args),
        Command::Loom(args) => loom::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("xtask: {message}");
            ExitCode::FAILURE
        }
    }
}
