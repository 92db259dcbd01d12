//! `cargo xtask test-cluster --duration D`: the soak. The ranks run a seeded random mix of
//! collectives for D, every result checked (see `soak_rank`), and each rank reports its resident
//! memory, open file descriptors and threads every few seconds. The run fails on any error or
//! wrong result, on a hang, and when a rank's resources grow from the first window of the run
//! to the last by more than the stated bounds: a leak of buffers, sockets or threads shows
//! there long before it shows in production.
//!
//! A rank reads its own figures between rounds, when none of its operations' buffers is alive
//! and after handing freed memory back to the system, rather than being sampled from outside
//! at whatever moment a timer fires: a sample taken in the middle of a 64 MiB all-reduce counts
//! that round's buffers, and which rounds the samples hit depends on how fast the machine
//! runs, so a busy machine used to look like a leak.

use std::time::{Duration, Instant};

use super::args::ClusterArgs;
use super::events::{Event, Usage};
use crate::job::{Job, Output, Stream};
use crate::ranks;
use crate::world::World;

/// How much a rank's resident memory may grow from the first window to the last: two of the
/// largest buffers a round moves (an allocator may keep freed ones for reuse).
const RSS_GROWTH_BOUND_KIB: u64 = 128 << 10;

/// How many more open file descriptors a rank may hold at the end than at the start.
const FD_GROWTH_BOUND: u64 = 2;

/// How many more threads a rank may run at the end than at the start.
const THREAD_GROWTH_BOUND: u64 = 2;

/// How long after the duration the ranks have to finish their last round and report.
const FINISH_GRACE: Duration = Duration::from_secs(120);

/// The samples one rank reported, each with when it arrived.
#[derive(Debug, Default)]
struct Samples {
    taken: Vec<(Duration, Usage)>,
}

impl Samples {
    /// The largest figures of the samples in `from..=to`.
    fn peak(&self, from: Duration, to: Duration) -> Option<Usage> {
        self.taken
            .iter()
            .filter(|(at, _)| (from..=to).contains(at))
            .map(|&(_, usage)| usage)
            .reduce(Usage::max)
    }
}

/// Judges one rank's first and last windows; pushes what grew too much to `problems`.
fn judge_growth(rank: usize, first: Usage, last: Usage, problems: &mut Vec<String>) {
    let grew = |a: u64, b: u64| b.saturating_sub(a);
    if grew(first.rss_kib, last.rss_kib) > RSS_GROWTH_BOUND_KIB {
        problems.push(format!(
            "LEAK: rank {rank}'s resident memory grew from {} to {} MiB (bound: +{} MiB)",
            first.rss_kib >> 10,
            last.rss_kib >> 10,
            RSS_GROWTH_BOUND_KIB >> 10
        ));
    }
    if grew(first.fds, last.fds) > FD_GROWTH_BOUND {
        problems.push(format!(
            "LEAK: rank {rank}'s open file descriptors grew from {} to {} (bound: \
             +{FD_GROWTH_BOUND})",
            first.fds, last.fds
        ));
    }
    if grew(first.threads, last.threads) > THREAD_GROWTH_BOUND {
        problems.push(format!(
            "LEAK: rank {rank}'s threads grew from {} to {} (bound: +{THREAD_GROWTH_BOUND})",
            first.threads, last.threads
        ));
    }
}

/// What the launcher learned of one rank.
#[derive(Debug, Default)]
struct SoakView {
    /// Operations it checked, as last reported.
    ops: u64,
    /// Result bytes it checked, as last reported.
    bytes: u64,
    /// Its final count of checked operations, once it finished.
    done: Option<u64>,
    /// Its error, or how it ended without a report.
    failed: Option<String>,
}

/// Runs the soak of `args` for `duration`.
pub(super) fn run(args: &ClusterArgs, duration: Duration) -> Result<(), String> {
    if args.ranks < 2 {
        return Err("the soak needs at least two ranks".to_owned());
    }
    let config = args.world.config(args.ranks, args.timeout_ms);
    config.validate()?;
    let binary = ranks::rank_binary(args.world.transport)?;
    let world = World::prepare(&config)?;
    let rank_args = vec![
        "__rank".to_owned(),
        "--transport".to_owned(),
        args.world.transport.name().to_owned(),
        "--ranks".to_owned(),
        args.ranks.to_string(),
        "--seed".to_owned(),
        args.seed.to_string(),
        "--soak-secs".to_owned(),
        duration.as_secs().max(1).to_string(),
    ];
    let specs: Vec<_> = (0..world.process_count())
        .map(|index| world.child(index, &binary, rank_args.clone()))
        .collect();
    println!(
        "test-cluster: soak of {} ranks over {} for {} s, seed {}",
        args.ranks,
        args.world.transport.name(),
        duration.as_secs(),
        args.seed
    );
    let result = watch(args, &specs, duration);
    drop(world);
    result
}

/// Starts the ranks, samples and watches them to the end, and judges the soak.
fn watch(
    args: &ClusterArgs,
    specs: &[crate::job::ChildSpec],
    duration: Duration,
) -> Result<(), String> {
    let started = Instant::now();
    let mut job = Job::spawn(specs)?;
    let children = specs.len();
    let mut views: Vec<SoakView> = (0..args.ranks).map(|_| SoakView::default()).collect();
    let mut samples: Vec<Samples> = (0..args.ranks).map(|_| Samples::default()).collect();
    let mut next_line = started + Duration::from_secs(60);
    let deadline = started + duration + FINISH_GRACE;
    let mut hung = false;
    while views.iter().any(|v| v.done.is_none() && v.failed.is_none()) {
        let now = Instant::now();
        if now >= deadline {
            hung = true;
            break;
        }
        if now >= next_line {
            next_line += Duration::from_secs(60);
            let ops: Vec<String> = views.iter().map(|v| v.ops.to_string()).collect();
            println!(
                "soak: {:.0} s, operations checked per rank: {}",
                (now - started).as_secs_f64(),
                ops.join(" ")
            );
        }
        match job.next(Duration::from_millis(200)) {
            Some(Output::Line {
                stream: Stream::Stdout,
                text,
                child,
            }) => match serde_json::from_str::<Event>(&text) {
                Ok(event) => observe(&mut views, &mut samples, started.elapsed(), event),
                Err(_) => println!("[{}] {text}", job.label(child)),
            },
            Some(Output::Line { text, child, .. }) => println!("[{}] {text}", job.label(child)),
            Some(Output::Closed { child }) => {
                // A process of its own runs one rank; the in-process transport runs them all.
                let ranks = if children == 1 {
                    0..views.len()
                } else {
                    child..child + 1
                };
                for view in &mut views[ranks] {
                    if view.done.is_none() && view.failed.is_none() {
                        view.failed = Some("exited without a report".to_owned());
                    }
                }
            }
            None => {}
        }
    }
    job.finish(Duration::from_secs(5));
    drop(job);
    judge(&views, &samples, started.elapsed(), duration, hung)
}

/// Takes in one event of a rank, `at` this long after the start.
fn observe(views: &mut [SoakView], samples: &mut [Samples], at: Duration, event: Event) {
    let rank = event.rank() as usize;
    let Some(view) = views.get_mut(rank) else {
        return;
    };
    match event {
        Event::Soak {
            ops, bytes, usage, ..
        } => {
            view.ops = ops;
            view.bytes = bytes;
            if let (Some(usage), Some(samples)) = (usage, samples.get_mut(rank)) {
                samples.taken.push((at, usage));
            }
        }
        Event::Done { passed, .. } => {
            view.ops = passed;
            view.done = Some(passed);
        }
        Event::Failed { error, .. } => view.failed = Some(error.message),
        _ => {}
    }
}

/// The verdict: errors, hangs and growth between the first and the last window.
fn judge(
    views: &[SoakView],
    samples: &[Samples],
    elapsed: Duration,
    duration: Duration,
    hung: bool,
) -> Result<(), String> {
    let mut problems = Vec::new();
    for (rank, view) in views.iter().enumerate() {
        if let Some(why) = &view.failed {
            problems.push(format!("ERROR: rank {rank}: {why}"));
        } else if view.done.is_none() && hung {
            problems.push(format!(
                "HANG: rank {rank} still running after {:.0} s",
                elapsed.as_secs_f64()
            ));
        }
    }
    // The first and last minute of the run (a third of it, when shorter than three minutes).
    let window = Duration::from_secs(60).min(duration / 3);
    let end = duration.min(elapsed);
    println!(
        "\nresources per rank, peak of the first {0:.0} s -> peak of the last {0:.0} s:",
        window.as_secs_f64()
    );
    for (rank, rank_samples) in samples.iter().enumerate() {
        let first = rank_samples.peak(Duration::ZERO, window);
        // A rank's last report comes as it stops, after the duration.
        let last = rank_samples.peak(end.saturating_sub(window), Duration::MAX);
        match (first, last) {
            (Some(first), Some(last)) => {
                println!(
                    "  rank {rank}: RSS {} -> {} MiB, fds {} -> {}, threads {} -> {}",
                    first.rss_kib >> 10,
                    last.rss_kib >> 10,
                    first.fds,
                    last.fds,
                    first.threads,
                    last.threads
                );
                judge_growth(rank, first, last, &mut problems);
            }
            _ => problems.push(format!(
                "SAMPLES: rank {rank} was not sampled in both windows"
            )),
        }
    }
    println!(
        "  bounds: RSS +{} MiB, fds +{FD_GROWTH_BOUND}, threads +{THREAD_GROWTH_BOUND}",
        RSS_GROWTH_BOUND_KIB >> 10
    );
    let ops: u64 = views.iter().map(|v| v.ops).sum();
    let bytes: u64 = views.iter().map(|v| v.bytes).sum();
    let per_rank: Vec<String> = views.iter().map(|v| v.ops.to_string()).collect();
    println!(
        "{ops} operation results checked ({} per rank), {:.1} GiB of results, in {:.0} s",
        per_rank.join("/"),
        bytes as f64 / f64::from(1u32 << 30),
        elapsed.as_secs_f64()
    );
    if problems.is_empty() {
        println!("test-cluster: soak PASS");
        return Ok(());
    }
    for problem in &problems {
        println!("{problem}");
    }
    Err(format!(
        "soak failed: {} problem(s), first: {}",
        problems.len(),
        problems[0]
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn growth_beyond_the_bounds_is_a_leak() {
        let first = Usage {
            rss_kib: 100 << 10,
            fds: 20,
            threads: 8,
        };
        let mut problems = Vec::new();
        judge_growth(0, first, first, &mut problems);
        let slightly = Usage {
            rss_kib: first.rss_kib + 1000,
            fds: 22,
            threads: 10,
        };
        judge_growth(0, first, slightly, &mut problems);
        assert!(problems.is_empty(), "{problems:?}");
        let leaking = Usage {
            rss_kib: first.rss_kib + RSS_GROWTH_BOUND_KIB + 1,
            fds: 30,
            threads: 11,
        };
        judge_growth(1, first, leaking, &mut problems);
        assert_eq!(problems.len(), 3, "{problems:?}");
    }

    #[test]
    fn this_process_can_be_sampled() {
        let usage = Usage::of(std::process::id()).unwrap();
        assert!(usage.rss_kib > 0 && usage.fds > 0 && usage.threads > 0);
    }
}
