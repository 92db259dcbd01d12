//! The launcher's watch over a running job: it reads every rank's events and output, starts
//! a killed rank's replacement, and stops at the end, at a hang or when a fault's bound runs
//! out.

use std::time::{Duration, Instant};

use super::args::{ClusterArgs, fault_bound};
use super::events::Event;
use super::fault::{Fault, FaultKind, Point};
use super::progress::Progress;
use super::view::{End, RankView, Shrunk};
use crate::job::{ChildSpec, Job, Output, Stream};
use crate::world::TransportKind;

/// What the launcher does for the monitor at two moments of a fault.
pub(super) struct FaultHooks<'a> {
    /// Called just before a stalled victim is resumed (the flight report is read then).
    pub(super) before_resume: &'a mut dyn FnMut() -> Result<(), String>,
    /// Takes rank `rank`'s link away as fault `kind` does (`--cut`, `--drop`).
    pub(super) cut_link: &'a mut dyn FnMut(u32, FaultKind) -> Result<(), String>,
}

/// The launcher's view of the whole job while it runs, and its verdict afterwards.
pub(super) struct Monitor {
    pub(super) ranks: Vec<RankView>,
    pub(super) fault_at: Option<Instant>,
    /// The index of the case the victim was about to run when it failed.
    pub(super) fault_index: Option<u64>,
    pub(super) hung: bool,
    /// When the launcher stopped watching (the reference for "hung for ... s").
    pub(super) stopped_at: Instant,
    pub(super) mem: bool,
    /// The spec of the killed rank's replacement, until it is started.
    pub(super) replacement: Option<ChildSpec>,
    /// The replacement's child index and the rank it replaces, once started.
    pub(super) replaced: Option<(usize, u32)>,
    /// Whether a stalled victim stopped with SIGSTOP is to be resumed once the survivors have
    /// reported (its own process, and no shrink that goes on without it).
    resume_stalled: bool,
    /// The child index and rank of the victim while it is stopped.
    stopped: Option<(usize, u32)>,
    /// When the stalled victim was resumed.
    pub(super) resumed_at: Option<Instant>,
    /// The child index and rank of the resumed victim until it reports: a victim that stops
    /// itself can do so just after the resumption reached it, so it is resumed again at every
    /// tick until it reports (a SIGCONT to a running process does nothing).
    resuming: Option<(usize, u32)>,
    /// The verdict on the flight records, when it was taken before the victim was resumed.
    pub(super) flight: Option<Result<(), String>>,
    /// With a `bootstrap:MS` kill: whether the victim had not joined yet when it was killed.
    pub(super) killed_in_bootstrap: Option<bool>,
    /// Why the victim's link could not be cut, if it could not.
    pub(super) cut_failed: Option<String>,
}

impl Monitor {
    pub(super) fn run(
        job: &mut Job,
        args: &ClusterArgs,
        fault: Option<&Fault>,
        timeout_ms: Option<u64>,
        replacement: Option<ChildSpec>,
        hooks: &mut FaultHooks<'_>,
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
            resume_stalled: args.world.transport != TransportKind::Mem && !args.shrink,
            stopped: None,
            resumed_at: None,
            resuming: None,
            flight: None,
            killed_in_bootstrap: None,
            cut_failed: None,
        };
        let deadline = Instant::now() + Duration::from_secs(args.timeout);
        let fault_bound = fault.map_or(Duration::ZERO, |f| fault_bound(f, timeout_ms, args));
        // A kill during the rendezvous is the launcher's to carry out, at its time from now.
        let mut bootstrap_kill = fault.and_then(|f| match f.target.point {
            Point::Bootstrap { after_ms } => Some((
                f.target.rank,
                Instant::now() + Duration::from_millis(after_ms),
            )),
            _ => None,
        });
        let mut progress = Progress::new();
        loop {
            if let Some((victim, _)) = bootstrap_kill.filter(|&(_, at)| Instant::now() >= at) {
                bootstrap_kill = None;
                monitor.kill_in_bootstrap(job, victim);
            }
            if monitor.ranks.iter().all(|r| r.end.is_some())
                && !monitor.resume_victim(job, hooks.before_resume)
            {
                break;
            }
            if let Some((child, rank)) = monitor.resuming {
                if monitor.ranks[rank as usize].end.is_some() {
                    monitor.resuming = None;
                } else {
                    job.resume(child);
                }
            }
            let now = Instant::now();
            // After a shrink the survivors run on: the bound is on their shrink, not their end.
            // A resumed victim has the same bound again, from its resumption.
            let fault_expired = match monitor.resumed_at {
                Some(at) => now > at + fault_bound,
                None => {
                    monitor.fault_at.is_some_and(|at| now > at + fault_bound)
                        && !(args.shrink && monitor.every_survivor_shrank_or_ended())
                }
            };
            // A rank that died on its own is a failure already; the others get the same bound
            // as after an injected kill to report, rather than the whole global timeout.
            let crash_expired = monitor
                .first_crash()
                .is_some_and(|at| now > at + Duration::from_secs(args.fault_bound));
            if now >= deadline || fault_expired || crash_expired {
                monitor.hung = true;
                break;
            }
            // A kill in the rendezvous is due at its time, not at the next tick.
            let wait = bootstrap_kill.map_or(Duration::from_millis(100), |(_, at)| {
                at.saturating_duration_since(now)
                    .min(Duration::from_millis(100))
            });
            if let Some(output) = job.next(wait) {
                monitor.observe(job, output, fault, hooks, &mut progress);
            }
            progress.update(&monitor.status_lines());
        }
        monitor.stopped_at = Instant::now();
        progress.finish(&monitor.status_lines());
        monitor
    }

    /// Kills `victim` (the child of the same index) as a `bootstrap:MS` fault.
    fn kill_in_bootstrap(&mut self, job: &mut Job, victim: u32) {
        job.kill(victim as usize);
        let at = Instant::now();
        let view = &mut self.ranks[victim as usize];
        self.killed_in_bootstrap = Some(view.groups.is_none());
        view.end = Some(End::Victim);
        view.ended_at = Some(at);
        self.fault_at = Some(at);
        self.fault_index = Some(0);
    }

    /// Resumes the stopped victim of a stall, if there is one; true when it did, so that the
    /// run goes on until the victim too has reported.
    fn resume_victim(
        &mut self,
        job: &mut Job,
        before_resume: &mut dyn FnMut() -> Result<(), String>,
    ) -> bool {
        let Some((child, rank)) = self.stopped.take() else {
            return false;
        };
        self.flight = Some(before_resume());
        job.resume(child);
        let view = &mut self.ranks[rank as usize];
        view.end = None;
        view.ended_at = None;
        self.resumed_at = Some(Instant::now());
        self.resuming = Some((child, rank));
        true
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

    pub(super) fn status_lines(&self) -> Vec<String> {
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
        hooks: &mut FaultHooks<'_>,
        progress: &mut Progress,
    ) {
        match output {
            Output::Line {
                child,
                stream: Stream::Stdout,
                text,
            } => match serde_json::from_str::<Event>(&text) {
                Ok(event) => self.apply(job, child, event, fault, hooks),
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

    fn apply(
        &mut self,
        job: &mut Job,
        child: usize,
        event: Event,
        fault: Option<&Fault>,
        hooks: &mut FaultHooks<'_>,
    ) {
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
                let expected = fault.filter(|f| f.target.rank == rank && f.kind.name() == kind);
                if let Some(f) = expected.filter(|f| f.kind.cuts_the_link()) {
                    // The victim runs on, cut off, and must fail by itself: it waits for the
                    // word that its link is gone, then goes into the operation.
                    match (hooks.cut_link)(rank, f.kind) {
                        Ok(()) => {
                            if let Err(why) = job.send_line(child, "cut") {
                                self.cut_failed = Some(why);
                            }
                        }
                        Err(why) => self.cut_failed = Some(why),
                    }
                    self.fault_at = Some(Instant::now());
                    self.fault_index = Some(index);
                } else if expected.is_some() {
                    if kind == FaultKind::Kill.name() && !self.mem {
                        job.kill(child);
                    }
                    if kind == FaultKind::Stall.name() && self.resume_stalled {
                        self.stopped = Some((child, rank));
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
                view.shrunk = Some(Shrunk {
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
            // A soak's progress is the soak launcher's to read.
            Event::Soak { .. } => {}
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
}
