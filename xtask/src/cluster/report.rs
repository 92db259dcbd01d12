//! The launcher's verdict on a finished job: the table of cases, every wrong byte, hang,
//! crash and unexpected error, the survivors' errors after a fault, and the JSON report.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::args::{ClusterArgs, fault_bound};
use super::fault::{self, Fault};
use super::monitor::Monitor;
use super::shrink;
use super::table;
use super::view::End;

/// What a fault did, for the JSON report: one entry per survivor, and the victim's when it
/// lived through the fault (resumed from a stall, or cut off).
#[derive(Debug, Default)]
struct FaultOutcome {
    survivors: Vec<serde_json::Value>,
    live_victim: Option<serde_json::Value>,
}

impl Monitor {
    pub(super) fn report(
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
        if let Some(why) = &self.cut_failed {
            problems.push(format!("FAULT: the victim's link could not be cut: {why}"));
        }
        let mut outcome = FaultOutcome::default();
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
            Some(f) => self.judge_fault(f, timeout_ms, args, &mut problems, &mut outcome),
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
            self.write_json(path, &merged, &problems, &outcome)?;
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
        outcome: &mut FaultOutcome,
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
            let error = errors.get(&rank).and_then(Option::as_ref);
            outcome.survivors.push(serde_json::json!({
                "rank": rank,
                "after_ms": after.map(|d| d.as_secs_f64() * 1e3),
                "kind": error.map(|e| e.kind.as_str()),
                "peer": error.and_then(|e| e.peer),
                "right": verdict.is_ok(),
                "succeeded": matches!(view.end, Some(End::Done { .. })),
            }));
            match verdict {
                Err(why) => problems.push(format!("FAULT: {why}")),
                Ok(()) if after.is_none_or(|d| d > bound) => problems.push(format!(
                    "FAULT: rank {rank} took {after_text} to report, over the bound of {:.1} s",
                    bound.as_secs_f64()
                )),
                Ok(()) => {}
            }
        }
        if let Some(resumed_at) = self.resumed_at {
            lines.push(self.judge_live_victim(fault, resumed_at, problems, outcome));
        } else if fault.kind.cuts_the_link() {
            lines.push(self.judge_live_victim(fault, fault_at, problems, outcome));
        }
        lines
    }

    /// Judges the victim of a fault it lives through, from `since` (its resumption after a
    /// stall, or the cut of its link): it must fail (a hang or a crash is reported as such
    /// already); returns its verdict line.
    fn judge_live_victim(
        &self,
        fault: &Fault,
        since: Instant,
        problems: &mut Vec<String>,
        outcome: &mut FaultOutcome,
    ) -> String {
        let victim = fault.target.rank;
        let view = &self.ranks[victim as usize];
        let after = view.ended_at.map(|t| t.saturating_duration_since(since));
        let (label, state) = if fault.kind.cuts_the_link() {
            ("CUT", "cut off")
        } else {
            ("RESUME", "resumed")
        };
        let (how, text) = match &view.end {
            Some(End::Failed(e)) => ("failed", e.message.clone()),
            // A rank cut off cannot hear that its group failed: when everything its last
            // operations needed had reached it before the cut (the others' arrivals at a final
            // barrier), it finishes them, and exactly; only an operation that needs a byte
            // from beyond the cut must fail. (A stalled rank, once resumed, finds the group's
            // failure notices waiting, so it must fail.)
            Some(End::Done { failed: 0 }) if fault.kind.cuts_the_link() => (
                "finished",
                "finished its cases, every result exact, with what had reached it before the cut"
                    .to_owned(),
            ),
            Some(End::Done { .. }) => {
                problems.push(format!(
                    "{label}: rank {victim} reported success after its {} ({state})",
                    fault.kind.name()
                ));
                ("succeeded", "reported success".to_owned())
            }
            Some(End::Crashed(why)) => ("crashed", why.clone()),
            Some(End::Victim) | None => ("hung", "still running".to_owned()),
        };
        outcome.live_victim = Some(serde_json::json!({
            "after_ms": after.map(|d| d.as_secs_f64() * 1e3),
            "outcome": how,
            "message": text,
        }));
        let after_text = after.map_or_else(
            || "never".to_owned(),
            |d| format!("{:.3} s", d.as_secs_f64()),
        );
        format!(
            "rank {victim} ({} fault, {state}): after {after_text}: {text}",
            fault.kind.name()
        )
    }

    fn write_json(
        &self,
        path: &PathBuf,
        merged: &[table::MergedCase],
        problems: &[String],
        outcome: &FaultOutcome,
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
            "hung": self.hung,
            "killed_in_bootstrap": self.killed_in_bootstrap,
            "survivors": outcome.survivors,
            "live_victim": outcome.live_victim,
            "cases": cases,
        });
        let text = serde_json::to_string_pretty(&doc)
            .map_err(|e| format!("could not encode the report: {e}"))?;
        std::fs::write(path, text).map_err(|e| format!("could not write {}: {e}", path.display()))
    }
}
