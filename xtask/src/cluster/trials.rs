//! `cargo xtask test-cluster --repeat N --seed S`: faults by the hundred. Each trial is a
//! test-cluster run of its own (this binary re-executed, in a process group of its own) with
//! one fault at a seeded random rank and a random point of a random collective, over the quick
//! case list; the loop collects each trial's JSON verdict and prints one summary line per
//! scenario: trials, failures, hangs, wrong results reported as success, detection times and
//! how many survivors named the right rank. The scenarios that cut links run in network
//! namespaces (`--netns`).
//!
//! A trial can never hang the loop: past its hard deadline its whole process group is
//! signalled (SIGTERM, so that its launcher reaps the ranks and removes any namespaces; then
//! SIGKILL) and the trial counts as a hang.

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rlx_collective::conformance::SplitMix;

use super::args::{ClusterArgs, Scenario};
use super::worker;
use crate::ranks;
use crate::supervise::{Supervised, supervise};
use crate::world::TransportKind;

/// The ranks' operation timeout in every trial: short, so that a stall is found in seconds.
const TRIAL_TIMEOUT_MS: u64 = 3000;

/// The trial launcher's own global timeout (`--timeout`), in seconds.
const TRIAL_GLOBAL_TIMEOUT_S: u64 = 60;

/// Past this, a trial is stopped from outside and counted as a hang.
const TRIAL_HARD_DEADLINE: Duration = Duration::from_secs(TRIAL_GLOBAL_TIMEOUT_S + 30);

/// A kill in the rendezvous comes this many milliseconds after the start at most (a local
/// rendezvous of 4 ranks takes some tens of milliseconds).
const BOOTSTRAP_WINDOW_MS: u64 = 40;

/// What one trial showed.
#[derive(Debug, Default)]
struct Trial {
    passed: bool,
    hung: bool,
    /// Wrong results reported as success: a wrong byte, or a rank that reported success after
    /// the fault (a survivor, or the resumed victim of a stall).
    wrong_success: bool,
    /// Survivors' detection times, in milliseconds.
    detections: Vec<f64>,
    survivors: usize,
    survivors_right: usize,
    /// For a fault the victim lives through (a stall, a cut link): whether the victim, resumed
    /// or cut off, ended cleanly: it failed, or (cut off) finished exactly with what had
    /// reached it before the cut.
    victim_clean: Option<bool>,
    /// For a kill in the rendezvous: whether the victim had not joined yet.
    in_bootstrap: Option<bool>,
    first_problem: Option<String>,
}

/// The totals of one scenario.
#[derive(Debug, Default)]
struct Summary {
    trials: usize,
    failures: usize,
    hangs: usize,
    wrong_success: usize,
    detections: Vec<f64>,
    survivors: usize,
    survivors_right: usize,
    live_victims: usize,
    victims_clean: usize,
    in_bootstrap: usize,
    /// The scenario cuts links: its victims live on cut off, not resumed.
    cuts_links: bool,
}

impl Summary {
    fn add(&mut self, trial: &Trial) {
        self.trials += 1;
        self.failures += usize::from(!trial.passed);
        self.hangs += usize::from(trial.hung);
        self.wrong_success += usize::from(trial.wrong_success);
        self.detections.extend(&trial.detections);
        self.survivors += trial.survivors;
        self.survivors_right += trial.survivors_right;
        if let Some(clean) = trial.victim_clean {
            self.live_victims += 1;
            self.victims_clean += usize::from(clean);
        }
        self.in_bootstrap += usize::from(trial.in_bootstrap == Some(true));
    }
}

/// Formats milliseconds compactly (`0.8 ms`, `3.31 s`).
fn millis(ms: f64) -> String {
    if ms < 1000.0 {
        format!("{ms:.1} ms")
    } else {
        format!("{:.2} s", ms / 1000.0)
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} trials, {} failed, {} hangs, {} wrong results reported as success",
            self.trials, self.failures, self.hangs, self.wrong_success
        )?;
        let mut sorted = self.detections.clone();
        sorted.sort_by(f64::total_cmp);
        if let (Some(min), Some(max)) = (sorted.first(), sorted.last()) {
            let median = sorted[sorted.len() / 2];
            write!(
                f,
                ", detection min/median/max {}/{}/{}",
                millis(*min),
                millis(median),
                millis(*max)
            )?;
        }
        write!(
            f,
            ", {}/{} survivors named the right rank",
            self.survivors_right, self.survivors
        )?;
        if self.live_victims > 0 {
            write!(
                f,
                ", {}/{} {}",
                self.victims_clean,
                self.live_victims,
                if self.cuts_links {
                    "cut-off ranks failed cleanly or finished exactly"
                } else {
                    "resumed ranks failed cleanly"
                }
            )?;
        }
        if self.in_bootstrap > 0 {
            write!(
                f,
                ", {} kills before the victim had joined",
                self.in_bootstrap
            )?;
        }
        Ok(())
    }
}

/// Runs `args.repeat` trials of every scenario of `args.scenario` (all by default).
pub(super) fn run(args: &ClusterArgs, repeat: u32) -> Result<(), String> {
    if args.ranks < 2 {
        return Err("fault trials need at least two ranks".to_owned());
    }
    if args.world.transport == TransportKind::Mem {
        return Err(
            "fault trials kill and stop processes: use a transport of processes".to_owned(),
        );
    }
    let binary = ranks::rank_binary(args.world.transport)?;
    let dir = ranks::scratch_dir()?.join(format!("trials-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let scenarios = if args.scenario.is_empty() {
        Scenario::defaults(args.world.links.netns)
    } else {
        args.scenario.clone()
    };
    if let Some(scenario) = scenarios
        .iter()
        .find(|s| s.needs_netns() && !args.world.links.netns)
    {
        return Err(format!(
            "the {} scenario cuts a rank's link: it needs --netns",
            scenario.name()
        ));
    }
    let points = worker::groups_per_op(true);
    let mut rng = SplitMix::seeded(args.seed);
    let mut lines = Vec::new();
    let mut failed = 0;
    for scenario in scenarios {
        let mut summary = Summary {
            cuts_links: scenario.needs_netns(),
            ..Summary::default()
        };
        let started = Instant::now();
        for index in 0..repeat {
            let (flag, target) = pick(scenario, index, args.ranks, &points, &mut rng);
            let seed = rng.next_u64() % 1_000_000;
            let name = format!("{}-{index}", scenario.name());
            let trial = run_trial(args, &binary, &dir, &name, &[flag, &target], seed);
            println!(
                "{name}: {flag} {target} (seed {seed}): {}",
                match &trial.first_problem {
                    None => "pass".to_owned(),
                    Some(problem) => format!("FAIL: {problem} (log: {})", log_of(&dir, &name)),
                }
            );
            summary.add(&trial);
        }
        let line = format!(
            "{}: {summary} ({:.0} s)",
            scenario.name(),
            started.elapsed().as_secs_f64()
        );
        println!("{line}");
        failed += summary.failures;
        lines.push(line);
    }
    println!("\ntest-cluster --repeat {repeat} --seed {}:", args.seed);
    for line in &lines {
        println!("  {line}");
    }
    if failed == 0 {
        let _ = std::fs::remove_dir_all(&dir);
        Ok(())
    } else {
        Err(format!(
            "{failed} fault trial(s) failed; their logs are in {}",
            dir.display()
        ))
    }
}

/// The fault of trial `index` of `scenario`: the flag and its `RANK@POINT`.
fn pick(
    scenario: Scenario,
    index: u32,
    ranks: u32,
    points: &[(&'static str, u64)],
    rng: &mut SplitMix,
) -> (&'static str, String) {
    let random_point = |rng: &mut SplitMix| {
        let (op, groups) = points[rng.below(points.len() as u64) as usize];
        format!("{op}:{}", rng.below(groups))
    };
    let random_rank = |rng: &mut SplitMix| rng.below(u64::from(ranks));
    let anywhere = |flag, rng: &mut SplitMix| {
        let rank = random_rank(rng);
        (flag, format!("{rank}@{}", random_point(rng)))
    };
    match scenario {
        Scenario::Kill => anywhere("--kill", rng),
        Scenario::Stall => anywhere("--stall", rng),
        Scenario::Cut => anywhere("--cut", rng),
        Scenario::Drop => anywhere("--drop", rng),
        Scenario::KillRoot if index % 2 == 0 => (
            "--kill",
            format!("0@bootstrap:{}", rng.below(BOOTSTRAP_WINDOW_MS + 1)),
        ),
        Scenario::KillRoot => ("--kill", format!("0@{}", random_point(rng))),
    }
}

fn log_of(dir: &Path, name: &str) -> String {
    dir.join(format!("{name}.log")).display().to_string()
}

/// Runs one trial as a test-cluster run of its own and reads its verdict.
fn run_trial(
    args: &ClusterArgs,
    binary: &Path,
    dir: &Path,
    name: &str,
    fault: &[&str],
    seed: u64,
) -> Trial {
    let json = dir.join(format!("{name}.json"));
    let log = PathBuf::from(log_of(dir, name));
    let _ = std::fs::remove_file(&json);
    let mut command = Command::new(binary);
    command
        .args([
            "test-cluster",
            "--quick",
            "--ranks",
            &args.ranks.to_string(),
        ])
        .args(["--transport", args.world.transport.name()])
        .args(["--seed", &seed.to_string()])
        .args(["--timeout", &TRIAL_GLOBAL_TIMEOUT_S.to_string()])
        .args([
            "--timeout-ms",
            &args.timeout_ms.unwrap_or(TRIAL_TIMEOUT_MS).to_string(),
        ])
        .args(["--fault-bound", &args.fault_bound.to_string()])
        .args(fault)
        .arg("--json")
        .arg(&json)
        .stdin(Stdio::null());
    if args.world.links.netns {
        command.arg("--netns");
    }
    let outcome = supervise(&mut command, &log, TRIAL_HARD_DEADLINE);
    let mut trial = match std::fs::read_to_string(&json)
        .ok()
        .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
    {
        Some(report) => read_report(&report),
        None => Trial {
            first_problem: Some("the trial wrote no report".to_owned()),
            ..Trial::default()
        },
    };
    match outcome {
        Supervised::Exited(status) if status.success() => {}
        Supervised::Exited(_) => {
            trial.passed = false;
            trial
                .first_problem
                .get_or_insert_with(|| "the trial failed".to_owned());
        }
        Supervised::Deadline => {
            trial.passed = false;
            trial.hung = true;
            trial.first_problem = Some(format!(
                "HANG: the trial was still running after {} s",
                TRIAL_HARD_DEADLINE.as_secs()
            ));
        }
        Supervised::NotStarted(why) => {
            trial.passed = false;
            trial.first_problem = Some(why);
        }
    }
    trial
}

/// The verdict of one trial's JSON report.
fn read_report(report: &serde_json::Value) -> Trial {
    let problems: Vec<&str> = report["problems"]
        .as_array()
        .map(|p| p.iter().filter_map(serde_json::Value::as_str).collect())
        .unwrap_or_default();
    let survivors = report["survivors"].as_array().cloned().unwrap_or_default();
    let victim = report["live_victim"]["outcome"].as_str();
    let survivor_succeeded = survivors.iter().any(|s| s["succeeded"] == true);
    Trial {
        passed: report["passed"] == true,
        hung: report["hung"] == true || problems.iter().any(|p| p.starts_with("HANG")),
        wrong_success: survivor_succeeded
            || victim == Some("succeeded")
            || problems.iter().any(|p| p.starts_with("WRONG")),
        detections: survivors
            .iter()
            .filter_map(|s| s["after_ms"].as_f64())
            .collect(),
        survivors: survivors.len(),
        survivors_right: survivors.iter().filter(|s| s["right"] == true).count(),
        victim_clean: victim.map(|r| r == "failed" || r == "finished"),
        in_bootstrap: report["killed_in_bootstrap"].as_bool(),
        first_problem: problems.first().map(|p| (*p).to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_follow_the_seed_and_stay_in_the_plan() {
        let points = worker::groups_per_op(true);
        let picks = |seed| {
            let mut rng = SplitMix::seeded(seed);
            (0..20)
                .map(|i| pick(Scenario::KillRoot, i, 4, &points, &mut rng).1)
                .collect::<Vec<_>>()
        };
        assert_eq!(picks(7), picks(7));
        assert_ne!(picks(7), picks(8));
        for target in picks(7) {
            let parsed: super::super::fault::Target = target.parse().unwrap();
            assert_eq!(parsed.rank, 0, "{target}");
        }
    }

    #[test]
    fn a_summary_counts_every_kind_of_failure() {
        let report = serde_json::json!({
            "passed": false,
            "hung": false,
            "problems": ["RESUME: rank 1 reported success after it was resumed from its stall"],
            "survivors": [
                {"rank": 0, "after_ms": 3001.0, "right": true, "succeeded": false},
                {"rank": 2, "after_ms": 3004.0, "right": false, "succeeded": false},
            ],
            "live_victim": {"outcome": "succeeded", "after_ms": 1.0},
        });
        let mut summary = Summary::default();
        summary.add(&read_report(&report));
        let line = summary.to_string();
        assert!(
            line.starts_with("1 trials, 1 failed, 0 hangs, 1 wrong"),
            "{line}"
        );
        assert!(
            line.contains("1/2 survivors named the right rank"),
            "{line}"
        );
        assert!(line.contains("0/1 resumed ranks failed cleanly"), "{line}");
        assert!(line.contains("3.00 s/3.00 s/3.00 s"), "{line}");
    }
}
