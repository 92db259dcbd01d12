//! `cargo xtask test-cluster`: a local multi-rank cluster that runs every collective on every
//! dtype and reduction over awkward sizes, each result checked against a serial reference.
//!
//! The launcher builds the rank binary once, starts the ranks with the environment a user's
//! launcher would set (see [`crate::world`]), shows one live progress line per rank, and ends
//! with a table. It fails on any wrong byte, on any error that should not have happened, and on
//! a hang — the global `--timeout` — naming each hung rank and the case it was in. With
//! `--kill`/`--stall` it instead checks that every survivor fails with the right error in time.

mod events;
mod fault;
mod progress;
mod shrink;
mod table;
pub(crate) mod worker;

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;

use crate::flight_report;
use crate::job::{ChildSpec, Job, Output, Stream};
use crate::world::{self, TransportKind, World, WorldArgs};
use events::{CaseRecord, ErrorRecord, Event};
use fault::{Fault, FaultKind, Target};
use progress::Progress;

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
    #[arg(long, value_name = "RANK@POINT", conflicts_with = "stall")]
    pub(crate) kill: Option<Target>,
    /// Freeze rank RANK at POINT (same syntax as --kill); survivors must time out (or lose a
    /// peer that timed out).
    #[arg(long, value_name = "RANK@POINT")]
    pub(crate) stall: Option<Target>,
    /// Run the whole case list this many times.
    #[arg(long, default_value_t = 1)]
    pub(crate) iters: u32,
    /// Seed of the input values.
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
    /// The ranks' operation timeout (RLX_TIMEOUT_MS); defaults to 2000 with --stall.
    #[arg(long)]
    pub(crate) timeout_ms: Option<u64>,
    /// Seconds within which every survivor must report its error after a kill or stall
    /// (added to the operation timeout for a stall).
    #[arg(long, default_value_t = 10)]
    pub(crate) fault_bound: u64,
    /// A smaller case list (fewer sizes), for CI.
    #[arg(long)]
    pub(crate) quick: bool,
    /// Write every case of every rank, and the verdict, to this JSON file.
    #[arg(long)]
    pub(crate) json: Option<PathBuf>,
}

impl ClusterArgs {
    /// The flags `cargo xtask ci` runs with: a short cluster of three ranks over TCP.
    pub(crate) fn ci() -> ClusterArgs {
        ClusterArgs {
            ranks: 3,
            world: WorldArgs::tcp(),
            kill: None,
            stall: None,
            iters: 1,
            seed: 1,
            timeout: 300,
            shrink: false,
            rejoin: false,
            timeout_ms: None,
            fault_bound: 10,
            quick: true,
            json: None,
        }
    }

    fn fault(&self) -> Option<Fault> {
        match (&self.kill, &self.stall) {
            (Some(target), _) => Some(Fault {
                kind: FaultKind::Kill,
                target: target.clone(),
            }),
            (None, Some(target)) => Some(Fault {
                kind: FaultKind::Stall,
                target: target.clone(),
            }),
            (None, None) => None,
        }
    }
}

/// How a rank's run ended, as the launcher saw it.
#[derive(Debug, Clone)]
enum End {
    /// It ran every case (some may have failed).
    Done { failed: u64 },
    /// It reported a run-ending error.
    Failed(ErrorRecord),
    /// Its output ended without a report.
    Crashed(String),
    /// It was the fault's victim and reached the fault point.
    Victim,
}

/// What the launcher knows about one rank.
#[derive(Debug, Default)]
struct RankView {
    groups: Option<u64>,
    started_groups: u64,
    finished: u64,
    current: Option<(String, Instant)>,
    end: Option<End>,
    ended_at: Option<Instant>,
    records: Vec<CaseRecord>,
    log_tail: VecDeque<String>,
    /// Its shrink, once it reported one.
    shrunk: Option<shrink::Shrunk>,
    /// The size of the grown world it reported being in, and how long its grow or join took
    /// (microseconds).
    grown: Option<(u32, u64)>,
}

impl RankView {
    fn status(&self, rank: u32) -> String {
        let total = self
            .groups
            .map_or_else(|| "?".to_owned(), |c| c.to_string());
        let head = format!(
            "rank {rank}: [group {:>4}/{total}, {:>5} cases]",
            self.started_groups, self.finished
        );
        match &self.end {
            Some(End::Done { failed: 0 }) => format!("{head} done, all passed"),
            Some(End::Done { failed }) => format!("{head} done, {failed} FAILED"),
            Some(End::Failed(e)) => format!("{head} error: {}", e.message),
            Some(End::Crashed(why)) => format!("{head} {why}"),
            Some(End::Victim) => format!("{head} (fault injected here)"),
            None => match &self.current {
                Some((name, _)) => format!("{head} {name}"),
                None => format!("{head} starting"),
            },
        }
    }
}

/// Runs the cluster described by `args`; `Err` when anything was wrong.
pub(crate) fn run(args: &ClusterArgs) -> Result<(), String> {
    let fault = args.fault();
    if args.ranks == 0 {
        return Err("-n must be at least 1".to_owned());
    }
    if let Some(f) = &fault {
        if f.target.rank >= args.ranks {
            return Err(format!(
                "the fault's rank {} is not in a world of {} ranks",
                f.target.rank, args.ranks
            ));
        }
        if args.ranks < 2 {
            return Err("fault injection needs at least two ranks".to_owned());
        }
    }
    if args.shrink && fault.is_none() {
        return Err("--shrink needs a fault to survive (--kill or --stall)".to_owned());
    }
    if args.rejoin && (args.kill.is_none() || args.world.transport == TransportKind::Mem) {
        return Err(
            "--rejoin restarts a killed rank's process: it needs --kill and a transport of \
             separate processes (tcp)"
                .to_owned(),
        );
    }
    let stall = matches!(&fault, Some(f) if f.kind == FaultKind::Stall);
    let timeout_ms = args.timeout_ms.or(stall.then_some(2000));
    let config = args.world.config(args.ranks, timeout_ms);
    config.validate()?;
    // Build first: a long build must not hold network namespaces or ports.
    let binary = world::rank_binary(args.world.transport)?;
    let world = World::prepare(&config)?;
    let mut rank_args = vec![
        "__rank".to_owned(),
        "--transport".to_owned(),
        args.world.transport.name().to_owned(),
        "--ranks".to_owned(),
        args.ranks.to_string(),
        "--iters".to_owned(),
        args.iters.to_string(),
        "--seed".to_owned(),
        args.seed.to_string(),
    ];
    if args.quick {
        rank_args.push("--quick".to_owned());
    }
    if let Some(f) = &fault {
        rank_args.extend(["--fault".to_owned(), f.to_arg()]);
    }
    if args.shrink {
        rank_args.push("--shrink".to_owned());
    }
    if args.rejoin {
        rank_args.push("--rejoin".to_owned());
    }
    // With a fault, every rank keeps a flight record, and the report on them must name the
    // faulty rank: what a user would run to find it.
    let flight_dir = match &fault {
        Some(_) => {
            let dir = world::scratch_dir()?.join(format!("flight-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            Some(dir)
        }
        None => None,
    };
    let specs: Vec<_> = (0..world.process_count())
        .map(|index| {
            let spec = world.child(index, &binary, rank_args.clone());
            match &flight_dir {
                Some(dir) => spec.env(
                    rlx_collective::flight::FLIGHT_DIR_VAR,
                    dir.display().to_string(),
                ),
                None => spec,
            }
        })
        .collect();
    println!(
        "test-cluster: {} ranks over {}{}{}{}",
        args.ranks,
        args.world.transport.name(),
        if args.world.netns {
            ", one network namespace per rank (thunderbolt0 links)"
        } else {
            ""
        },
        args.world
            .rate
            .as_deref()
            .map(|r| format!(", links limited to {r}"))
            .unwrap_or_default(),
        fault
            .as_ref()
            .map(|f| format!(", {} rank {}", f.kind.name(), f.target))
            .unwrap_or_default(),
    );
    if args.shrink {
        println!("test-cluster: the survivors shrink to the ranks left and go on");
    }
    let result = supervise(
        args,
        &specs,
        fault.as_ref(),
        timeout_ms,
        flight_dir.as_deref(),
    );
    // The namespaces and the hostfile go only after every rank is reaped.
    drop(world);
    result
}

/// Starts the ranks of `specs`, watches them to the end, reaps them and judges the run.
fn supervise(
    args: &ClusterArgs,
    specs: &[ChildSpec],
    fault: Option<&Fault>,
    timeout_ms: Option<u64>,
    flight_dir: Option<&std::path::Path>,
) -> Result<(), String> {
    let started = Instant::now();
    let mut job = Job::spawn(specs)?;
    // With --rejoin the killed rank comes back as a replacement that joins the survivors.
    let replacement = fault
        .filter(|_| args.rejoin)
        .and_then(|f| specs.get(f.target.rank as usize))
        .map(|spec| spec.clone().args(["--join"]));
    let monitor = Monitor::run(&mut job, args, fault, timeout_ms, replacement);
    // Ranks that reported exit once their stdin closes; after a hang or a fault there is
    // nothing to wait for.
    let grace = if monitor.hung || fault.is_some() {
        Duration::ZERO
    } else {
        Duration::from_secs(5)
    };
    job.finish(grace);
    drop(job);
    let flight = match (flight_dir, fault) {
        (Some(dir), Some(fault)) => {
            flight_report::check_names_faulty_rank(dir, fault.target.rank, args.ranks)
                .map_err(|e| format!("{e} ({})", fault.target))
        }
        _ => Ok(()),
    };
    monitor
        .report(args, fault, timeout_ms, started.elapsed())
        .and(flight)
}

/// How long after the fault every survivor has to report it (or, with `--shrink`, to hold
/// its new group): `--fault-bound`, plus the operation timeout for a stall (the survivors
/// learn of it from their timeout), and once more with `--shrink` (the shrink waits that long
/// for the stalled rank's answer).
fn fault_bound(fault: &Fault, timeout_ms: Option<u64>, args: &ClusterArgs) -> Duration {
    let timeout = Duration::from_millis(timeout_ms.unwrap_or(0));
    Duration::from_secs(args.fault_bound)
        + match (fault.kind, args.shrink) {
            (FaultKind::Stall, false) => timeout,
            (FaultKind::Stall, true) => timeout * 2,
            (FaultKind::Kill, _) => Duration::ZERO,
        }
}

/// The launcher's view of the whole job while it runs, and its verdict afterwards.
struct Monitor {
    ranks: Vec<RankView>,
    fault_at: Option<Instant>,
    /// The index of the case the victim was about to run when it failed.
    fault_index: Option<u64>,
    hung: bool,
    /// When the launcher stopped watching (the reference for "hung for ... s").
    stopped_at: Instant,
    mem: bool,
    /// The spec of the killed rank's replacement, until it is started.
    replacement: Option<ChildSpec>,
    /// The replacement's child index and the rank it replaces, once started.
    replaced: Option<(usize, u32)>,
}

impl Monitor {
    fn run(
        job: &mut Job,
        args: &ClusterArgs,
        fault: Option<&Fault>,
        timeout_ms: Option<u64>,
        replacement: Option<ChildSpec>,
    ) -> Monitor {
        let mut monitor = Monitor {
            replacement,
            replaced: None,
            ranks: (0..args.ranks).map(|_| RankView::default()).collect(),
            fault_at: None,
            fault_index: None,
            hung: false,
            stopped_at: Instant::now(),
            mem: args.world.transport == TransportKind::Mem,
        };
        let deadline = Instant::now() + Duration::from_secs(args.timeout);
        let fault_bound = fault.map_or(Duration::ZERO, |f| fault_bound(f, timeout_ms, args));
        let mut progress = Progress::new();
        loop {
            if monitor.ranks.iter().all(|r| r.end.is_some()) {
                break;
            }
            let now = Instant::now();
            // After a shrink the survivors run on: the bound is on their shrink, not their end.
            let fault_expired = monitor.fault_at.is_some_and(|at| now > at + fault_bound)
                && !(args.shrink && monitor.every_survivor_shrank_or_ended());
            // A rank that died on its own is a failure already; the others get the same bound
            // as after an injected kill to report, rather than the whole global timeout.
            let crash_expired = monitor
                .first_crash()
                .is_some_and(|at| now > at + Duration::from_secs(args.fault_bound));
            if now >= deadline || fault_expired || crash_expired {
                monitor.hung = true;
                break;
            }
            if let Some(output) = job.next(Duration::from_millis(100)) {
                monitor.observe(job, output, fault, &mut progress);
            }
            progress.update(&monitor.status_lines());
        }
        monitor.stopped_at = Instant::now();
        progress.finish(&monitor.status_lines());
        monitor
    }

    /// Whether every rank that was not the fault's victim has shrunk or ended (a replacement
    /// of the victim is judged at the end).
    fn every_survivor_shrank_or_ended(&self) -> bool {
        let replaced = self.replaced.map(|(_, rank)| rank);
        (0u32..)
            .zip(&self.ranks)
            .all(|(rank, r)| r.shrunk.is_some() || r.end.is_some() || Some(rank) == replaced)
    }

    /// When the first rank ended without a report, if one did.
    fn first_crash(&self) -> Option<Instant> {
        self.ranks
            .iter()
            .filter(|r| matches!(r.end, Some(End::Crashed(_))))
            .filter_map(|r| r.ended_at)
            .min()
    }

    fn status_lines(&self) -> Vec<String> {
        (0u32..)
            .zip(&self.ranks)
            .map(|(rank, view)| view.status(rank))
            .collect()
    }

    /// The ranks that child `index` of the job runs.
    fn ranks_of_child(&self, index: usize) -> Vec<u32> {
        if let Some((child, rank)) = self.replaced {
            if child == index {
                return vec![rank];
            }
        }
        if self.mem {
            (0..self.ranks.len() as u32).collect()
        } else {
            vec![index as u32]
        }
    }

    fn observe(
        &mut self,
        job: &mut Job,
        output: Output,
        fault: Option<&Fault>,
        progress: &mut Progress,
    ) {
        match output {
            Output::Line {
                child,
                stream: Stream::Stdout,
                text,
            } => match serde_json::from_str::<Event>(&text) {
                Ok(event) => self.apply(job, child, event, fault),
                Err(_) => self.log(child, job.label(child), &text, progress),
            },
            Output::Line {
                child,
                stream: Stream::Stderr,
                text,
            } => self.log(child, job.label(child), &text, progress),
            Output::Closed { child } => {
                // Give the exit status a moment to become available after the pipe closed.
                let mut status = job.poll_exit(child);
                for _ in 0..20 {
                    if status.is_some() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(5));
                    status = job.poll_exit(child);
                }
                let why = match status {
                    Some(s) => format!("exited without a report ({s})"),
                    None => "closed its output without a report".to_owned(),
                };
                for rank in self.ranks_of_child(child) {
                    let view = &mut self.ranks[rank as usize];
                    if view.end.is_none() {
                        view.end = Some(End::Crashed(why.clone()));
                        view.ended_at = Some(Instant::now());
                    }
                }
            }
        }
    }

    fn log(&mut self, child: usize, label: &str, text: &str, progress: &mut Progress) {
        for rank in self.ranks_of_child(child) {
            let tail = &mut self.ranks[rank as usize].log_tail;
            if tail.len() == 20 {
                tail.pop_front();
            }
            tail.push_back(text.to_owned());
            if !self.mem {
                break;
            }
        }
        progress.log(&format!("[{label}] {text}"));
    }

    fn apply(&mut self, job: &mut Job, child: usize, event: Event, fault: Option<&Fault>) {
        let rank = event.rank();
        let Some(view) = self.ranks.get_mut(rank as usize) else {
            return;
        };
        let now = Instant::now();
        match event {
            Event::Ready { groups, .. } => view.groups = Some(groups),
            Event::Start { group, name, .. } => {
                view.started_groups = group + 1;
                view.current = Some((name, now));
            }
            Event::Case { case, .. } => {
                view.finished += 1;
                view.records.push(case);
            }
            Event::Fault { kind, index, .. } => {
                let expected =
                    fault.is_some_and(|f| f.target.rank == rank && f.kind.name() == kind);
                if expected {
                    if kind == FaultKind::Kill.name() && !self.mem {
                        job.kill(child);
                    }
                    view.end = Some(End::Victim);
                    view.ended_at = Some(now);
                    self.fault_at = Some(now);
                    self.fault_index = Some(index);
                }
            }
            Event::Failed { error, .. } => {
                view.end = Some(End::Failed(error));
                view.ended_at = Some(now);
            }
            Event::Done { failed, .. } => {
                view.end = Some(End::Done { failed });
                view.ended_at = Some(now);
            }
            Event::Shrunk {
                error,
                members,
                micros,
                ..
            } => {
                view.shrunk = Some(shrink::Shrunk {
                    error,
                    members,
                    micros,
                    at: now,
                });
                self.start_replacement(job, fault);
            }
            Event::Grown {
                members, micros, ..
            } => view.grown = Some((members, micros)),
        }
    }

    /// Starts the killed rank's replacement once every survivor has shrunk (with --rejoin).
    fn start_replacement(&mut self, job: &mut Job, fault: Option<&Fault>) {
        let Some(victim) = fault.map(|f| f.target.rank) else {
            return;
        };
        let survivors_shrunk = (0u32..)
            .zip(&self.ranks)
            .all(|(rank, view)| rank == victim || view.shrunk.is_some());
        if !survivors_shrunk {
            return;
        }
        let Some(spec) = self.replacement.take() else {
            return;
        };
        match job.add(&spec) {
            Ok(child) => {
                self.replaced = Some((child, victim));
                let view = &mut self.ranks[victim as usize];
                view.end = None;
                view.ended_at = None;
            }
            Err(why) => {
                let view = &mut self.ranks[victim as usize];
                view.end = Some(End::Crashed(format!(
                    "its replacement did not start: {why}"
                )));
            }
        }
    }

    fn report(
        self,
        args: &ClusterArgs,
        fault: Option<&Fault>,
        timeout_ms: Option<u64>,
        elapsed: Duration,
    ) -> Result<(), String> {
        let merged = table::merge(
            (0u32..)
                .zip(&self.ranks)
                .flat_map(|(rank, view)| view.records.iter().map(move |r| (rank, r))),
        );
        println!();
        if args.shrink {
            let (after, before): (Vec<_>, Vec<_>) =
                merged.iter().cloned().partition(shrink::after_shrink);
            let (grown, shrunk): (Vec<_>, Vec<_>) = after.into_iter().partition(shrink::after_grow);
            print!("{}", table::render(&before, args.ranks));
            println!("\nOn the shrunk world of {} ranks:", args.ranks - 1);
            print!("{}", table::render(&shrunk, args.ranks - 1));
            if args.rejoin {
                println!(
                    "\nOn the grown world of {} ranks (with the replacement):",
                    args.ranks
                );
                print!("{}", table::render(&grown, args.ranks));
            }
        } else {
            print!("{}", table::render(&merged, args.ranks));
        }
        let mut problems = Vec::new();
        // Cases from the fault point on ran without the victim: their failures are the
        // fault's expected effect, judged below through each survivor's error.
        let before_fault = |c: &&table::MergedCase| {
            self.fault_index.is_none_or(|at| c.case.index < at) || shrink::after_shrink(c)
        };
        let after_fault = merged
            .iter()
            .filter(|c| !c.passed() && !before_fault(c))
            .count();
        if after_fault > 0 {
            println!(
                "{after_fault} case(s) from the fault point on failed, as the fault makes them"
            );
        }
        for case in merged.iter().filter(before_fault).filter(|c| !c.passed()) {
            for (rank, detail) in &case.failures {
                problems.push(format!(
                    "WRONG: {} on rank {rank}: {detail}",
                    case.case.name
                ));
            }
        }
        if self.hung {
            for (rank, view) in (0u32..).zip(&self.ranks) {
                if view.end.is_none() {
                    let during = view.current.as_ref().map_or_else(
                        || "before its first case".to_owned(),
                        |(name, since)| {
                            let stuck = self.stopped_at.saturating_duration_since(*since);
                            format!("in {name} (for {:.1} s)", stuck.as_secs_f64())
                        },
                    );
                    problems.push(format!("HANG: rank {rank} still running {during}"));
                }
            }
        }
        for (rank, view) in (0u32..).zip(&self.ranks) {
            if let Some(End::Crashed(why)) = &view.end {
                let tail: Vec<&str> = view.log_tail.iter().map(String::as_str).collect();
                problems.push(format!(
                    "CRASH: rank {rank} {why}; last output: {}",
                    tail.join(" | ")
                ));
            }
        }
        let verdicts = match fault {
            None => {
                for (rank, view) in (0u32..).zip(&self.ranks) {
                    if let Some(End::Failed(e)) = &view.end {
                        problems.push(format!(
                            "ERROR: rank {rank} failed{}: {}",
                            e.during
                                .as_deref()
                                .map(|d| format!(" in {d}"))
                                .unwrap_or_default(),
                            e.message
                        ));
                    }
                }
                let incomplete = merged
                    .iter()
                    .filter(|c| c.ranks.len() as u32 != args.ranks)
                    .count();
                if incomplete > 0 && problems.is_empty() {
                    problems.push(format!(
                        "{incomplete} cases were not reported by every rank"
                    ));
                }
                Vec::new()
            }
            Some(f) if args.shrink => match self.fault_at {
                Some(fault_at) => shrink::judge(
                    f,
                    args.rejoin,
                    &self.ranks,
                    fault_at,
                    fault_bound(f, timeout_ms, args),
                    &merged,
                    &mut problems,
                ),
                None => {
                    problems.push(format!(
                        "FAULT: rank {} never reached the fault point {}",
                        f.target.rank, f.target
                    ));
                    Vec::new()
                }
            },
            Some(f) => self.judge_fault(f, timeout_ms, args, &mut problems),
        };
        let passed = merged.iter().filter(|c| c.passed()).count();
        println!(
            "\n{} cases on {} ranks over {}: {passed} passed, {} failed ({:.1} s)",
            merged.len(),
            args.ranks,
            args.world.transport.name(),
            merged.len() - passed,
            elapsed.as_secs_f64()
        );
        for line in &verdicts {
            println!("{line}");
        }
        if let Some(path) = &args.json {
            self.write_json(path, &merged, &problems)?;
        }
        if problems.is_empty() {
            println!("test-cluster: PASS");
            Ok(())
        } else {
            for problem in problems.iter().take(40) {
                println!("{problem}");
            }
            if problems.len() > 40 {
                println!("... and {} more", problems.len() - 40);
            }
            let first: Vec<&str> = problems.iter().take(3).map(String::as_str).collect();
            Err(format!(
                "test-cluster failed: {} problem(s), first: {}",
                problems.len(),
                first.join("; ")
            ))
        }
    }

    /// Checks the survivors after a fault; pushes problems and returns the per-rank verdicts.
    fn judge_fault(
        &self,
        fault: &Fault,
        timeout_ms: Option<u64>,
        args: &ClusterArgs,
        problems: &mut Vec<String>,
    ) -> Vec<String> {
        let victim = fault.target.rank;
        let Some(fault_at) = self.fault_at else {
            problems.push(format!(
                "FAULT: rank {victim} never reached the fault point {}",
                fault.target
            ));
            return Vec::new();
        };
        let mut errors = BTreeMap::new();
        for (rank, view) in (0u32..).zip(&self.ranks) {
            if rank == victim {
                continue;
            }
            let error = match &view.end {
                Some(End::Failed(e)) => Some(e.clone()),
                _ => None,
            };
            errors.insert(rank, error);
        }
        let bound = fault_bound(fault, timeout_ms, args);
        let mut lines = Vec::new();
        for (rank, verdict) in fault::judge(fault.kind, victim, &errors) {
            let view = &self.ranks[rank as usize];
            let after = view.ended_at.map(|t| t.saturating_duration_since(fault_at));
            let message = errors
                .get(&rank)
                .and_then(Option::as_ref)
                .map_or("no error", |e| e.message.as_str());
            let after_text = after.map_or_else(
                || "never".to_owned(),
                |d| format!("{:.3} s", d.as_secs_f64()),
            );
            lines.push(format!(
                "survivor rank {rank}: after {after_text}: {message}"
            ));
            match verdict {
                Err(why) => problems.push(format!("FAULT: {why}")),
                Ok(()) if after.is_none_or(|d| d > bound) => problems.push(format!(
                    "FAULT: rank {rank} took {after_text} to report, over the bound of {:.1} s",
                    bound.as_secs_f64()
                )),
                Ok(()) => {}
            }
        }
        lines
    }

    fn write_json(
        &self,
        path: &PathBuf,
        merged: &[table::MergedCase],
        problems: &[String],
    ) -> Result<(), String> {
        let cases: Vec<serde_json::Value> = merged
            .iter()
            .map(|c| {
                serde_json::json!({
                    "index": c.case.index,
                    "op": c.case.op,
                    "dtype": c.case.dtype,
                    "reduce": c.case.reduce,
                    "count": c.case.count,
                    "name": c.case.name,
                    "passed": c.passed(),
                    "ranks": c.ranks,
                    "failures": c.failures,
                    "micros": c.micros,
                })
            })
            .collect();
        let ranks: Vec<serde_json::Value> = (0u32..)
            .zip(&self.ranks)
            .map(|(rank, view)| {
                serde_json::json!({
                    "rank": rank,
                    "finished": view.finished,
                    "status": view.status(rank),
                })
            })
            .collect();
        let doc = serde_json::json!({
            "passed": problems.is_empty(),
            "problems": problems,
            "ranks": ranks,
            "cases": cases,
        });
        let text = serde_json::to_string_pretty(&doc)
            .map_err(|e| format!("could not encode the report: {e}"))?;
        std::fs::write(path, text).map_err(|e| format!("could not write {}: {e}", path.display()))
    }
}

#[cfg(test)]
mod tests {
    //! The launcher against scripted ranks: shell processes that print the events a real rank
    //! would (or hang, or die), so that every verdict is checked without building anything.

    use super::*;

    fn case(rank: u32, index: u64, passed: bool) -> String {
        Event::Case {
            rank,
            case: CaseRecord {
                index,
                op: "all_reduce".to_owned(),
                dtype: "f32".to_owned(),
                reduce: "sum".to_owned(),
                count: 7,
                name: format!("all_reduce/f32/sum/n=7/case{index}"),
                passed,
                detail: if passed {
                    String::new()
                } else {
                    "element 3: got 1, want 2".to_owned()
                },
                micros: 5,
            },
        }
        .to_line()
    }

    fn start(rank: u32) -> String {
        Event::Start {
            rank,
            group: 0,
            name: "all_reduce f32 n=7".to_owned(),
        }
        .to_line()
    }

    fn failed(rank: u32, kind: &str, peer: u32) -> String {
        Event::Failed {
            rank,
            error: ErrorRecord {
                kind: kind.to_owned(),
                peer: Some(peer),
                message: format!("{kind} naming rank {peer}"),
                during: None,
            },
        }
        .to_line()
    }

    /// A rank that prints `lines`, then does `then` (a shell command, e.g. waiting on stdin).
    fn scripted(rank: u32, lines: &[String], then: &str) -> ChildSpec {
        let mut script = String::new();
        for line in lines {
            script.push_str(&format!("printf '%s\\n' '{line}'; "));
        }
        script.push_str(then);
        ChildSpec::new(format!("rank {rank}"), "sh").args(["-c".to_owned(), script])
    }

    fn args(ranks: u32, timeout: u64) -> ClusterArgs {
        ClusterArgs {
            ranks,
            timeout,
            ..ClusterArgs::ci()
        }
    }

    fn done(rank: u32, failed: u64) -> String {
        Event::Done {
            rank,
            passed: 1 - failed,
            failed,
        }
        .to_line()
    }

    const WAIT_FOR_EOF: &str = "cat > /dev/null";

    fn shrunk(rank: u32, members: &[u32]) -> String {
        Event::Shrunk {
            rank,
            error: ErrorRecord {
                kind: "peer_lost".to_owned(),
                peer: Some(2),
                message: "peer_lost naming rank 2".to_owned(),
                during: None,
            },
            members: members.to_vec(),
            micros: 400,
        }
        .to_line()
    }

    #[test]
    fn a_shrink_passes_only_when_every_survivor_holds_the_survivors_and_passes_after() {
        let fault = Fault {
            kind: FaultKind::Kill,
            target: "2@0".parse().unwrap(),
        };
        let victim = Event::Fault {
            rank: 2,
            kind: "kill".to_owned(),
            index: 0,
        }
        .to_line();
        let after = worker::SHRUNK_CASE_BASE;
        let run = |members_of_1: &[u32], passed_after: bool| {
            let survivor = |rank: u32, members: &[u32], passed: bool| {
                scripted(
                    rank,
                    &[
                        start(rank),
                        shrunk(rank, members),
                        case(rank, after, passed),
                        done(rank, u64::from(!passed)),
                    ],
                    WAIT_FOR_EOF,
                )
            };
            let specs = [
                survivor(0, &[0, 1], true),
                survivor(1, members_of_1, passed_after),
                scripted(2, &[start(2), victim.clone()], "sleep 30"),
            ];
            let args = ClusterArgs {
                kill: Some("2@0".parse().unwrap()),
                shrink: true,
                ..args(3, 20)
            };
            supervise(&args, &specs, Some(&fault), None, None)
        };
        run(&[0, 1], true).unwrap();
        let err = run(&[0, 1, 2], true).unwrap_err();
        assert!(err.contains("SHRINK: rank 1's new group"), "{err}");
        let err = run(&[0, 1], false).unwrap_err();
        assert!(err.contains("WRONG"), "{err}");
    }

    #[test]
    fn a_clean_run_passes() {
        let specs: Vec<ChildSpec> = (0..2)
            .map(|r| scripted(r, &[start(r), case(r, 0, true), done(r, 0)], WAIT_FOR_EOF))
            .collect();
        supervise(&args(2, 20), &specs, None, None, None).unwrap();
    }

    #[test]
    fn a_wrong_byte_on_one_rank_fails_the_run() {
        let specs = [
            scripted(0, &[start(0), case(0, 0, true), done(0, 0)], WAIT_FOR_EOF),
            scripted(1, &[start(1), case(1, 0, false), done(1, 1)], WAIT_FOR_EOF),
        ];
        let err = supervise(&args(2, 20), &specs, None, None, None).unwrap_err();
        assert!(
            err.contains("WRONG: all_reduce/f32/sum/n=7/case0 on rank 1"),
            "{err}"
        );
    }

    #[test]
    fn a_hang_is_bounded_by_the_global_timeout_and_names_the_operation() {
        let specs = [
            scripted(0, &[start(0), case(0, 0, true)], "sleep 30"),
            scripted(1, &[start(1)], "sleep 30"),
        ];
        let began = Instant::now();
        let err = supervise(&args(2, 1), &specs, None, None, None).unwrap_err();
        assert!(began.elapsed() < Duration::from_secs(10), "{err}");
        for rank in 0..2 {
            let hang = format!("HANG: rank {rank} still running in all_reduce f32 n=7");
            assert!(err.contains(&hang), "{err}");
        }
    }

    #[test]
    fn a_crash_ends_the_run_long_before_the_global_timeout() {
        let specs = [
            scripted(0, &[start(0)], "sleep 60"),
            scripted(1, &[start(1)], "exit 3"),
        ];
        let began = Instant::now();
        let mut quick = args(2, 300);
        quick.fault_bound = 1;
        let err = supervise(&quick, &specs, None, None, None).unwrap_err();
        assert!(began.elapsed() < Duration::from_secs(20), "{err}");
        assert!(
            err.contains("HANG: rank 0 still running in all_reduce f32 n=7"),
            "{err}"
        );
        assert!(
            err.contains("CRASH: rank 1 exited without a report"),
            "{err}"
        );
    }

    #[test]
    fn a_kill_passes_only_with_the_right_errors() {
        let fault = Fault {
            kind: FaultKind::Kill,
            target: "1@0".parse().unwrap(),
        };
        let victim = Event::Fault {
            rank: 1,
            kind: "kill".to_owned(),
            index: 0,
        }
        .to_line();
        let run = |survivor_error: String| {
            let specs = [
                scripted(0, &[start(0), survivor_error], WAIT_FOR_EOF),
                scripted(1, &[start(1), victim.clone()], "sleep 30"),
            ];
            supervise(&args(2, 20), &specs, Some(&fault), None, None)
        };
        run(failed(0, "peer_lost", 1)).unwrap();
        for wrong in [failed(0, "timeout", 1), failed(0, "peer_lost", 0)] {
            let err = run(wrong).unwrap_err();
            assert!(err.contains("FAULT: rank 0"), "{err}");
        }
    }
}
