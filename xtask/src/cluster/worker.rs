//! `xtask __rank`: one rank of `cargo xtask test-cluster` (or, over the in-process transport,
//! every rank as a thread), reporting to the launcher in the JSON lines of [`super::events`].
//!
//! The rank runs `rlx_collective::conformance` one group at a time — one collective, dtype and
//! element count, with every reduction, forced algorithm and root of that group — so that the
//! launcher always knows which operation a rank is in, and a hang report can name it. Inputs
//! differ per group and per seed. After its last report a rank that passed keeps its
//! transport open until the launcher closes its stdin, so that finishing first never looks
//! like a lost peer to the others; a rank whose run failed aborts its transport, so that the
//! failure reaches every peer still waiting on it.

use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use rlx_collective::conformance::{self, CaseResult, ConformanceOptions, DEFAULT_SIZES};
use rlx_collective::{CollectiveOp, DType, ProcessGroup, ReduceKind};

use super::cabling_checks;
use super::events::{CaseRecord, ErrorRecord, Event};
use super::fault::{Fault, FaultKind, Point, Trigger};
use super::soak_rank;
use crate::ranks;
use crate::world::TransportKind;

/// The element counts of `--quick`: empty, one, a prime, and a thousand.
const QUICK_SIZES: [usize; 4] = [0, 1, 13, 1000];

/// Groups of at least this many elements run a second time with [`SMALL_SEGMENT_BYTES`]
/// segments, so that the pipelined algorithms take many segments per block at every world
/// size (with the default 256 KiB segments a 65537-element block of a 4-rank ring is one).
const MULTI_SEGMENT_MIN_COUNT: usize = 1000;

/// The segment cap of the second run of large groups.
const SMALL_SEGMENT_BYTES: usize = 4096;

/// Flags of the hidden `__rank` subcommand (set by the test-cluster launcher).
#[derive(Debug, Args)]
pub(crate) struct RankArgs {
    /// Transport of this rank.
    #[arg(long, value_enum)]
    pub(crate) transport: TransportKind,
    /// World size (used by the in-process transport, which runs every rank here).
    #[arg(long)]
    pub(crate) ranks: u32,
    /// Repetitions of the case list.
    #[arg(long, default_value_t = 1)]
    pub(crate) iters: u32,
    /// Seed of the inputs.
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// The short case list.
    #[arg(long)]
    pub(crate) quick: bool,
    /// The fault to inject, as KIND:RANK@POINT.
    #[arg(long)]
    pub(crate) fault: Option<String>,
    /// After a fatal failure, shrink the group to the survivors and go on.
    #[arg(long)]
    pub(crate) shrink: bool,
    /// After the shrunk world's cases, grow by one (the replacement of the lost rank) and run
    /// the case list again on the grown world.
    #[arg(long)]
    pub(crate) rejoin: bool,
    /// This process replaces a lost rank: join the running job (`rlx_collective::join`) and
    /// run the case list on the grown world.
    #[arg(long)]
    pub(crate) join: bool,
    /// Run the soak (a random mix of checked collectives) for this many seconds instead of
    /// the case list.
    #[arg(long)]
    pub(crate) soak_secs: Option<u64>,
    /// Check first that the transport knows the link matrix and that the group's rings cross
    /// other machines on at most this many hops (set for a cabling of namespaces).
    #[arg(long)]
    pub(crate) routed_ring_hops: Option<usize>,
}

/// Case indices on a grown world start here (see [`SHRUNK_CASE_BASE`]).
pub(crate) const GROWN_CASE_BASE: u64 = 2 << 32;

/// How long the survivors wait for their replacement to join.
const GROW_WAIT: Duration = Duration::from_secs(120);

/// Case indices after a shrink start here, so that the launcher tells the cases of the
/// shrunk world from those of the full one (the survivors number them alike, whatever point
/// each had reached when the failure came).
pub(crate) const SHRUNK_CASE_BASE: u64 = 1 << 32;

/// One group of cases: a collective on one dtype and element count (and segment cap).
#[derive(Debug, Clone, Copy)]
struct Group {
    op: CollectiveOp,
    dtype: DType,
    count: usize,
    max_segment_bytes: Option<usize>,
}

impl Group {
    fn name(&self) -> String {
        if self.op == CollectiveOp::Barrier {
            return "barrier".to_owned();
        }
        let mut name = format!("{} {} n={}", self.op, self.dtype, self.count);
        if let Some(cap) = self.max_segment_bytes {
            name.push_str(&format!(" segments<={cap}B"));
        }
        name
    }
}

/// The groups of every iteration, in the order every rank runs them.
fn plan(iters: u32, quick: bool) -> Vec<Group> {
    let sizes: &[usize] = if quick { &QUICK_SIZES } else { &DEFAULT_SIZES };
    let mut groups = Vec::new();
    for _ in 0..iters {
        for op in CollectiveOp::ALL {
            if op == CollectiveOp::Barrier {
                groups.push(Group {
                    op,
                    dtype: DType::U8,
                    count: 0,
                    max_segment_bytes: None,
                });
                continue;
            }
            for dtype in DType::ALL {
                for &count in sizes {
                    groups.push(Group {
                        op,
                        dtype,
                        count,
                        max_segment_bytes: None,
                    });
                    if count >= MULTI_SEGMENT_MIN_COUNT {
                        groups.push(Group {
                            op,
                            dtype,
                            count,
                            max_segment_bytes: Some(SMALL_SEGMENT_BYTES),
                        });
                    }
                }
            }
        }
    }
    groups
}

/// How many groups of each collective one iteration of the plan holds, in plan order: the
/// points `OP:NTH` at which a fault can be placed.
pub(super) fn groups_per_op(quick: bool) -> Vec<(&'static str, u64)> {
    let mut counts: Vec<(&'static str, u64)> = Vec::new();
    for group in plan(1, quick) {
        match counts.iter_mut().find(|(op, _)| *op == group.op.name()) {
            Some((_, n)) => *n += 1,
            None => counts.push((group.op.name(), 1)),
        }
    }
    counts
}

/// Writes events to stdout, one whole line at a time even from several rank threads.
#[derive(Debug, Default)]
struct Reporter {
    lock: Mutex<()>,
}

impl Reporter {
    fn emit(&self, event: &Event) {
        let _guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = std::io::stdout().lock();
        // The launcher reading our stdout is the only consumer; if it is gone, so is the point.
        let _ = writeln!(out, "{}", event.to_line());
        let _ = out.flush();
    }
}

/// Runs the rank(s), then waits until the launcher closes stdin.
pub(crate) fn run(args: &RankArgs) -> Result<(), String> {
    let fault = args.fault.as_deref().map(Fault::from_arg).transpose()?;
    let joining = Instant::now();
    let groups = if args.join {
        let group = rlx_collective::join().map_err(|e| format!("could not join the job: {e}"))?;
        vec![group]
    } else {
        match ranks::join(args.transport, args.ranks) {
            Ok(groups) => groups,
            Err(message) => {
                report_failed("bootstrap", &message);
                return Err(message);
            }
        }
    };
    if let Some(most) = args.routed_ring_hops {
        for group in &groups {
            if let Err(message) = cabling_checks::check(group, most, args.transport) {
                report_failed("cabling", &message);
                return Err(message);
            }
        }
    }
    // A replacement reports under the rank it replaces (the launcher's RLX_RANK), not under
    // its rank in the grown world.
    let replaced = std::env::var("RLX_RANK")
        .ok()
        .and_then(|r| r.parse::<u32>().ok());
    let joined_micros = joining.elapsed().as_micros() as u64;
    let reporter = Arc::new(Reporter::default());
    if let Some(secs) = args.soak_secs {
        soak(groups, Duration::from_secs(secs), args.seed, &reporter);
        return Ok(());
    }
    let plan = Arc::new(plan(args.iters, args.quick));
    // Every rank's group stays here until the process exits, so that a rank that is done
    // never closes its links while the others still run.
    let keep: Arc<Mutex<Vec<ProcessGroup>>> = Arc::default();
    let in_process = groups.len() > 1;
    let mut threads = Vec::new();
    for group in groups {
        let label = match replaced {
            Some(rank) if args.join => rank,
            _ => group.rank(),
        };
        let ctx = RankCtx {
            label,
            group,
            plan: Arc::clone(&plan),
            reporter: Arc::clone(&reporter),
            fault: fault.clone(),
            seed: args.seed,
            in_process,
            shrink: args.shrink,
            rejoin: args.rejoin,
            join: args.join,
            joined_micros,
        };
        let keep = Arc::clone(&keep);
        let body = move || {
            let groups = ctx.run();
            keep.lock()
                .unwrap_or_else(|p| p.into_inner())
                .extend(groups);
        };
        if in_process {
            threads.push(std::thread::spawn(body));
        } else {
            body();
        }
    }
    wait_for_the_launcher();
    drop(threads);
    Ok(())
}

/// Waits until the launcher closes stdin, its signal to exit. Rank threads are not joined: a
/// stalled one never returns, by design.
fn wait_for_the_launcher() {
    let mut sink = Vec::new();
    let _ = std::io::stdin().lock().read_to_end(&mut sink);
}

/// Runs the soak on every group (one thread each), reports how each ended, and waits for
/// the launcher; every group stays open until then, as after the case list.
fn soak(groups: Vec<ProcessGroup>, duration: Duration, seed: u64, reporter: &Arc<Reporter>) {
    let threads: Vec<_> = groups
        .into_iter()
        .map(|group| {
            let reporter = Arc::clone(reporter);
            std::thread::spawn(move || {
                let rank = group.rank();
                let emit = |event: &Event| reporter.emit(event);
                match soak_rank::run(&group, duration, seed, &emit) {
                    Ok(checked) => emit(&Event::Done {
                        rank,
                        passed: checked,
                        failed: 0,
                    }),
                    Err(error) => {
                        emit(&Event::Failed { rank, error });
                        group.transport().abort();
                    }
                }
                group
            })
        })
        .collect();
    let _keep: Vec<ProcessGroup> = threads.into_iter().filter_map(|t| t.join().ok()).collect();
    wait_for_the_launcher();
}

/// Reports that this rank failed `during` (bootstrap, or a check before the cases) with
/// `message`, naming the peer the message names first.
fn report_failed(during: &str, message: &str) {
    let Some(rank) = std::env::var("RLX_RANK")
        .ok()
        .and_then(|r| r.trim().parse::<u32>().ok())
    else {
        return;
    };
    let peer = message.split("rank ").skip(1).find_map(|rest| {
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().ok()
    });
    Reporter::default().emit(&Event::Failed {
        rank,
        error: ErrorRecord {
            kind: during.to_owned(),
            peer,
            message: message.to_owned(),
            during: Some(during.to_owned()),
        },
    });
}

/// What one rank needs to run its cases.
struct RankCtx {
    /// The rank this one reports as.
    label: u32,
    group: ProcessGroup,
    plan: Arc<Vec<Group>>,
    reporter: Arc<Reporter>,
    fault: Option<Fault>,
    seed: u64,
    in_process: bool,
    shrink: bool,
    rejoin: bool,
    join: bool,
    /// How long joining took (for a replacement).
    joined_micros: u64,
}

/// The victim's side of a fault: detects the point and carries it out.
struct Injector {
    fault: Option<Fault>,
    fired: AtomicBool,
    /// Set once an in-process victim has "died": it must not report anything afterwards.
    dead: AtomicBool,
    rank: u32,
    in_process: bool,
    reporter: Arc<Reporter>,
    group: ProcessGroup,
}

impl Injector {
    /// Carries out the fault if `hit` says the point is reached now, before case `next`.
    fn maybe_fire(&self, next: u64, hit: impl FnOnce(&Point) -> bool) {
        let Some(fault) = &self.fault else { return };
        if fault.target.rank != self.rank
            || self.fired.load(Ordering::SeqCst)
            || !hit(&fault.target.point)
        {
            return;
        }
        self.fired.store(true, Ordering::SeqCst);
        self.reporter.emit(&Event::Fault {
            rank: self.rank,
            kind: fault.kind.name().to_owned(),
            index: next,
        });
        match fault.kind {
            FaultKind::Kill if self.in_process => {
                // An in-process rank cannot be killed alone: it aborts its transport, which
                // the other ranks observe as this peer lost, and stays silent from now on.
                self.dead.store(true, Ordering::SeqCst);
                self.group.transport().abort();
            }
            FaultKind::Stall if !self.in_process => {
                // The whole process stops, its transport's threads too, as under a debugger
                // or on a laptop gone to sleep. The launcher resumes it (SIGCONT) once every
                // survivor has reported; it then goes on into the operation it stopped
                // before, which must fail cleanly: no hang, no success.
                // SAFETY: `raise` has no memory-safety preconditions.
                unsafe {
                    libc::raise(libc::SIGSTOP);
                }
            }
            FaultKind::Cut | FaultKind::Drop => {
                // The launcher takes the link away, then says so on stdin; the rank goes on
                // into the operation, cut off, and must fail by itself. (An end of stdin means
                // the launcher gave up: go on all the same.)
                let mut line = String::new();
                let _ = std::io::stdin().read_line(&mut line);
            }
            // A separate process waits here for the launcher's SIGKILL; a stalled in-process
            // rank freezes forever, holding its links open without ever answering.
            FaultKind::Kill | FaultKind::Stall => loop {
                std::thread::sleep(Duration::from_secs(3600));
            },
        }
    }

    fn silent(&self) -> bool {
        self.dead.load(Ordering::SeqCst)
    }
}

/// How a run of the case list ended on one rank.
enum Ran {
    /// Every case ran (on `group`, which may be a shrunk one).
    Through { group: ProcessGroup, shrunk: bool },
    /// The run ended early; it was reported and the transport aborted.
    Ended,
}

impl RankCtx {
    /// Runs the rank; returns the groups to keep open until the launcher ends the process.
    fn run(&self) -> Vec<ProcessGroup> {
        let rank = self.label;
        let mut keep = vec![self.group.clone()];
        let injector = Arc::new(Injector {
            fault: self.fault.clone().filter(|_| !self.join),
            fired: AtomicBool::new(false),
            dead: AtomicBool::new(false),
            rank,
            in_process: self.in_process,
            reporter: Arc::clone(&self.reporter),
            group: self.group.clone(),
        });
        self.reporter.emit(&Event::Ready {
            rank,
            groups: self.plan.len() as u64,
        });
        let counters = Counters::default();
        if self.join {
            counters.next_case.store(GROWN_CASE_BASE, Ordering::SeqCst);
            self.reporter.emit(&Event::Grown {
                rank,
                members: self.group.world_size(),
                micros: self.joined_micros,
            });
        }
        let (group, shrunk) =
            match self.run_cases(self.group.clone(), &injector, &counters, !self.join) {
                Ran::Through { group, shrunk } => (group, shrunk),
                Ran::Ended => return keep,
            };
        keep.push(group.clone());
        if self.rejoin && shrunk {
            let started = Instant::now();
            let grown = match group.grow(1, GROW_WAIT) {
                Ok(grown) => grown,
                Err(error) => {
                    self.reporter.emit(&Event::Failed {
                        rank,
                        error: ErrorRecord::from_error(&error, Some("grow".to_owned())),
                    });
                    group.transport().abort();
                    return keep;
                }
            };
            self.reporter.emit(&Event::Grown {
                rank,
                members: grown.world_size(),
                micros: started.elapsed().as_micros() as u64,
            });
            counters.next_case.store(GROWN_CASE_BASE, Ordering::SeqCst);
            counters.failed.store(0, Ordering::SeqCst);
            keep.push(grown.clone());
            if let Ran::Ended = self.run_cases(grown, &injector, &counters, false) {
                return keep;
            }
        }
        let failed = counters.failed.load(Ordering::SeqCst);
        // The count of the last stage (full, shrunk or grown world): the bits below the
        // stage bases.
        let ran = counters.next_case.load(Ordering::SeqCst) & (SHRUNK_CASE_BASE - 1);
        self.reporter.emit(&Event::Done {
            rank,
            passed: ran.saturating_sub(failed),
            failed,
        });
        keep
    }

    /// Runs the case list on `group`. With `may_shrink` (and `--shrink`), a fatal failure
    /// shrinks the group to the survivors, which go on from the earliest case any of them
    /// failed in; the fault fires only before that.
    fn run_cases(
        &self,
        mut group: ProcessGroup,
        injector: &Arc<Injector>,
        counters: &Counters,
        may_shrink: bool,
    ) -> Ran {
        let rank = self.label;
        let mut trigger = Trigger::default();
        let mut shrunk = false;
        let mut index = 0;
        while let Some(case_group) = self.plan.get(index) {
            let next = counters.next_case.load(Ordering::SeqCst);
            if may_shrink && !shrunk {
                injector.maybe_fire(next, |point| {
                    trigger.reached(point, next, case_group.op.name())
                });
            }
            if injector.silent() {
                return Ran::Ended;
            }
            self.reporter.emit(&Event::Start {
                rank,
                group: index as u64,
                name: case_group.name(),
            });
            let progress = {
                let reporter = Arc::clone(&self.reporter);
                let next_case = Arc::clone(&counters.next_case);
                let failed = Arc::clone(&counters.failed);
                let injector = Arc::clone(injector);
                move |case: &CaseResult| {
                    if injector.silent() {
                        return;
                    }
                    let index = next_case.fetch_add(1, Ordering::SeqCst);
                    if !case.passed {
                        failed.fetch_add(1, Ordering::SeqCst);
                    }
                    reporter.emit(&Event::Case {
                        rank,
                        case: record(index, case),
                    });
                    // Between this case and the next one: the place for an index point.
                    injector.maybe_fire(
                        index + 1,
                        |point| matches!(point, Point::Index(at) if *at == index + 1),
                    );
                }
            };
            let options = ConformanceOptions {
                ops: vec![case_group.op],
                dtypes: vec![case_group.dtype],
                reduces: ReduceKind::ALL.to_vec(),
                sizes: vec![case_group.count],
                algorithms: true,
                all_roots: false,
                max_segment_bytes: case_group.max_segment_bytes,
                seed: self.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ index as u64,
                progress: Some(Arc::new(progress)),
            };
            let error = match conformance::run(&group, &options) {
                Ok(_) => {
                    index += 1;
                    continue;
                }
                Err(error) => error,
            };
            if injector.silent() {
                return Ran::Ended;
            }
            if self.shrink && may_shrink && !shrunk && error.is_fatal() {
                match shrink_and_resume(&group, index, rank, &error, case_group, &self.reporter) {
                    Ok((smaller, resume)) => {
                        group = smaller;
                        index = resume;
                        shrunk = true;
                        counters.next_case.store(SHRUNK_CASE_BASE, Ordering::SeqCst);
                        counters.failed.store(0, Ordering::SeqCst);
                        continue;
                    }
                    Err(shrink_error) => {
                        self.reporter.emit(&Event::Failed {
                            rank,
                            error: ErrorRecord::from_error(
                                &shrink_error,
                                Some(format!("shrink after {}", case_group.name())),
                            ),
                        });
                        group.transport().abort();
                        return Ran::Ended;
                    }
                }
            }
            self.reporter.emit(&Event::Failed {
                rank,
                error: ErrorRecord::from_error(&error, Some(case_group.name())),
            });
            // The run only ends early on an error that leaves the group unusable. Abort,
            // as a program would: a peer still waiting on this rank in an earlier
            // operation then fails at once (this peer lost) instead of at its timeout.
            group.transport().abort();
            return Ran::Ended;
        }
        Ran::Through { group, shrunk }
    }
}

/// The case counters of one rank: the next case's index and the failed cases.
#[derive(Default)]
struct Counters {
    next_case: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
}

/// Shrinks `group` to its survivors after `error` (met in plan group `index`, named by
/// `during`), reports it, and returns the new group with the plan group every survivor
/// resumes at: the earliest one any of them failed in, so that all run the same cases.
fn shrink_and_resume(
    group: &ProcessGroup,
    index: usize,
    rank: u32,
    error: &rlx_collective::CollectiveError,
    during: &Group,
    reporter: &Reporter,
) -> Result<(ProcessGroup, usize), rlx_collective::CollectiveError> {
    let started = Instant::now();
    let smaller = group.shrink()?;
    let micros = started.elapsed().as_micros() as u64;
    let mut resume = [index as i64];
    smaller.all_reduce(&mut resume, ReduceKind::Min)?;
    reporter.emit(&Event::Shrunk {
        rank,
        error: ErrorRecord::from_error(error, Some(during.name())),
        members: smaller.members().to_vec(),
        micros,
    });
    let resume = usize::try_from(resume[0]).unwrap_or(index);
    Ok((smaller, resume))
}

/// The launcher's record of one conformance case.
fn record(index: u64, case: &CaseResult) -> CaseRecord {
    CaseRecord {
        index,
        op: case.op.name().to_owned(),
        dtype: if case.op == CollectiveOp::Barrier {
            "-".to_owned()
        } else {
            case.dtype.name().to_owned()
        },
        reduce: case.reduce.map_or("-", ReduceKind::name).to_owned(),
        count: case.count as u64,
        name: case.name.clone(),
        passed: case.passed,
        detail: case.detail.clone(),
        micros: u64::try_from(case.elapsed.as_micros()).unwrap_or(u64::MAX),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_covers_every_collective_and_dtype_once_per_iteration() {
        let groups = plan(2, true);
        let sizes = QUICK_SIZES.len()
            + QUICK_SIZES
                .iter()
                .filter(|&&n| n >= MULTI_SEGMENT_MIN_COUNT)
                .count();
        let per_iteration = (CollectiveOp::ALL.len() - 1) * DType::ALL.len() * sizes + 1;
        assert_eq!(groups.len(), 2 * per_iteration);
        let barriers = groups
            .iter()
            .filter(|g| g.op == CollectiveOp::Barrier)
            .count();
        assert_eq!(barriers, 2);
        assert!(plan(1, false).iter().any(|g| g.count == 65537));
        assert!(
            groups
                .iter()
                .any(|g| g.max_segment_bytes == Some(SMALL_SEGMENT_BYTES))
        );
    }
}
