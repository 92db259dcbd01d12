//! The flags of `cargo xtask test-cluster`, the fault they describe, the time every
//! survivor has to report that fault, the scenarios of `--repeat` and the durations of
//! `--duration`.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};

use super::fault::{Fault, FaultKind, Target};
use crate::world::WorldArgs;

/// Flags of `cargo xtask test-cluster`.
#[derive(Debug, Clone, Args)]
pub(crate) struct ClusterArgs {
    /// Number of ranks.
    #[arg(short = 'n', long = "ranks", default_value_t = 4)]
    pub(crate) ranks: u32,
    /// Transport, rendezvous and namespaces of RLX's ranks.
    #[command(flatten)]
    pub(crate) world: WorldArgs,
    /// Kill rank RANK (SIGKILL) at POINT: a case index, OP or OP:NTH for the start of the NTH
    /// (from 0, the default) group of collective OP, a group being one dtype and size (e.g.
    /// 2@all_reduce:3).
    #[arg(long, value_name = "RANK@POINT", conflicts_with_all = ["stall", "cut", "drop"])]
    pub(crate) kill: Option<Target>,
    /// Freeze rank RANK at POINT (same syntax as --kill); survivors must time out (or lose a
    /// peer that timed out). A rank of its own process stops with SIGSTOP; once every survivor
    /// has reported, the launcher resumes it (SIGCONT) and it too must fail, in time.
    #[arg(long, value_name = "RANK@POINT", conflicts_with_all = ["cut", "drop"])]
    pub(crate) stall: Option<Target>,
    /// Pull rank RANK's cable at POINT (same syntax as --kill; needs --netns): its switch port
    /// goes down. Survivors must name it; the rank itself, cut off, must fail too.
    #[arg(
        long,
        value_name = "RANK@POINT",
        requires = "netns",
        conflicts_with = "drop"
    )]
    pub(crate) cut: Option<Target>,
    /// Make rank RANK's link drop every packet at POINT (a `tc` rule on both ends; needs
    /// --netns). Judged as --cut.
    #[arg(long, value_name = "RANK@POINT", requires = "netns")]
    pub(crate) drop: Option<Target>,
    /// Run the whole case list this many times.
    #[arg(long, default_value_t = 1)]
    pub(crate) iters: u32,
    /// Seed of the input values (with --repeat: of the trials' faults and inputs).
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// Global timeout in seconds: a rank still running then is reported as hung.
    #[arg(long, default_value_t = 180)]
    pub(crate) timeout: u64,
    /// With --kill or --stall: the survivors shrink their group to the ranks left
    /// (`ProcessGroup::shrink`) and run the rest of the cases on the smaller world, every
    /// result checked; the run passes only if every survivor agrees on the same new group.
    #[arg(long)]
    pub(crate) shrink: bool,
    /// With --kill and --shrink: once the survivors have shrunk, the launcher starts the
    /// killed rank again as a replacement that joins through `ProcessGroup::grow`, and the
    /// case list runs once more on the world of all N ranks.
    #[arg(long, requires = "shrink")]
    pub(crate) rejoin: bool,
    /// The ranks' operation timeout (RLX_TIMEOUT_MS); defaults to 2000 with --stall, --cut
    /// and --drop.
    #[arg(long)]
    pub(crate) timeout_ms: Option<u64>,
    /// Seconds within which every survivor must report its error after a fault (added to the
    /// operation timeout for a stall or a cut link).
    #[arg(long, default_value_t = 10)]
    pub(crate) fault_bound: u64,
    /// A smaller case list (fewer sizes), for CI.
    #[arg(long)]
    pub(crate) quick: bool,
    /// Write every case of every rank, and the verdict, to this JSON file.
    #[arg(long)]
    pub(crate) json: Option<PathBuf>,
    /// Fault trials instead of one run: N trials of each scenario (see --scenario), each a run
    /// of the quick case list with one fault at a random rank and point drawn from --seed,
    /// and a summary line per scenario.
    #[arg(long, value_name = "N", conflicts_with_all = ["kill", "stall", "cut", "drop", "shrink", "json"])]
    pub(crate) repeat: Option<u32>,
    /// A soak instead of the case list: a random mix of collectives, sizes up to 64 MiB,
    /// dtypes and reductions, with non-blocking operations in flight, every result checked,
    /// for this long (`90s`, `20m`, `1h`); fails if a rank's memory, file descriptors or
    /// threads grow from the first minute to the last beyond stated bounds.
    #[arg(long, value_parser = parse_duration, conflicts_with_all = ["kill", "stall", "cut", "drop", "shrink", "repeat"])]
    pub(crate) duration: Option<Duration>,
    /// The scenarios of --repeat (comma-separated; default: all).
    #[arg(long, value_enum, value_delimiter = ',', requires = "repeat")]
    pub(crate) scenario: Vec<Scenario>,
}

impl ClusterArgs {
    /// The flags `cargo xtask ci` runs with: a short cluster of three ranks over TCP.
    pub(crate) fn ci() -> ClusterArgs {
        ClusterArgs {
            ranks: 3,
            world: WorldArgs::tcp(),
            kill: None,
            stall: None,
            cut: None,
            drop: None,
            iters: 1,
            seed: 1,
            timeout: 300,
            shrink: false,
            rejoin: false,
            timeout_ms: None,
            fault_bound: 10,
            quick: true,
            json: None,
            repeat: None,
            duration: None,
            scenario: Vec::new(),
        }
    }

    pub(super) fn fault(&self) -> Option<Fault> {
        [
            (FaultKind::Kill, &self.kill),
            (FaultKind::Stall, &self.stall),
            (FaultKind::Cut, &self.cut),
            (FaultKind::Drop, &self.drop),
        ]
        .into_iter()
        .find_map(|(kind, target)| {
            target.as_ref().map(|target| Fault {
                kind,
                target: target.clone(),
            })
        })
    }
}

/// How long after the fault every survivor has to report it (or, with `--shrink`, to hold
/// its new group): `--fault-bound`, plus the operation timeout for a stall or a cut link (the
/// survivors may learn of it from their timeout), and once more with `--shrink` (the shrink
/// waits that long for the silent rank's answer).
pub(super) fn fault_bound(fault: &Fault, timeout_ms: Option<u64>, args: &ClusterArgs) -> Duration {
    let timeout = Duration::from_millis(timeout_ms.unwrap_or(0));
    Duration::from_secs(args.fault_bound)
        + match (fault.kind, args.shrink) {
            (FaultKind::Kill, _) => Duration::ZERO,
            (_, false) => timeout,
            (_, true) => timeout * 2,
        }
}

/// One kind of trial.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Scenario {
    /// SIGKILL of a random rank at a random point.
    Kill,
    /// SIGSTOP of a random rank at a random point, with a 3 s operation timeout; the rank is
    /// resumed afterwards and must fail too.
    Stall,
    /// SIGKILL of rank 0, the rendezvous host: in every other trial during the rendezvous,
    /// else at a random point of the run.
    KillRoot,
    /// A random rank's cable pulled (its switch port down) at a random point, with a 3 s
    /// operation timeout; needs --netns.
    Cut,
    /// A random rank's link made to drop every packet at a random point, with a 3 s operation
    /// timeout; needs --netns.
    Drop,
}

impl Scenario {
    /// The scenarios that run by default: every one, those that cut links only with
    /// `--netns`.
    pub(crate) fn defaults(netns: bool) -> Vec<Scenario> {
        let mut all = vec![Scenario::Kill, Scenario::Stall, Scenario::KillRoot];
        if netns {
            all.extend([Scenario::Cut, Scenario::Drop]);
        }
        all
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            Scenario::Kill => "kill",
            Scenario::Stall => "stall",
            Scenario::KillRoot => "kill-root",
            Scenario::Cut => "cut",
            Scenario::Drop => "drop",
        }
    }

    /// Whether the scenario cuts links, which needs network namespaces.
    pub(super) fn needs_netns(self) -> bool {
        matches!(self, Scenario::Cut | Scenario::Drop)
    }
}

/// Parses a duration of the soak: `90`, `90s`, `20m` or `1h`.
pub(super) fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => text.split_at(at),
        None => (text, "s"),
    };
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration such as 90s, 20m or 1h"))?;
    let seconds = match unit {
        "s" => number,
        "m" => number * 60,
        "h" => number * 3600,
        _ => return Err(format!("{text:?}: the unit is s, m or h")),
    };
    Ok(Duration::from_secs(seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("20m"), Ok(Duration::from_secs(1200)));
        assert_eq!(parse_duration("60"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        for bad in ["", "m", "5d", "-1s"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
