//! The verdict of `test-cluster --kill/--stall R@POINT --shrink [--rejoin]`: every survivor
//! reported the failure with an error the fault explains, shrank to the same group of exactly
//! the survivors in time, and ran the rest of the cases on that smaller world, every one
//! passing on every survivor; with `--rejoin`, the killed rank's replacement and every
//! survivor were then in a grown world of all the ranks, where every case passed on every
//! rank.

use std::time::{Duration, Instant};

use super::events::ErrorRecord;
use super::fault::{self, Fault};
use super::table::MergedCase;
use super::view::{End, RankView};
use super::worker::{GROWN_CASE_BASE, SHRUNK_CASE_BASE};
use std::collections::BTreeMap;

/// Whether `case` ran after the shrink (on the shrunk world or a grown one).
pub(super) fn after_shrink(case: &MergedCase) -> bool {
    case.case.index >= SHRUNK_CASE_BASE
}

/// Whether `case` ran on the grown world.
pub(super) fn after_grow(case: &MergedCase) -> bool {
    case.case.index >= GROWN_CASE_BASE
}

/// Checks that the cases of one stage were reported by exactly `ranks` and counts the
/// passes; pushes problems naming `stage`.
fn check_stage(
    cases: &[&MergedCase],
    ranks: &[u32],
    stage: &str,
    problems: &mut Vec<String>,
) -> usize {
    if cases.is_empty() {
        problems.push(format!("SHRINK: no case ran on the {stage}"));
        return 0;
    }
    let incomplete = cases
        .iter()
        .filter(|c| c.ranks.iter().copied().collect::<Vec<_>>() != ranks)
        .count();
    if incomplete > 0 {
        problems.push(format!(
            "SHRINK: {incomplete} of the {} cases on the {stage} were not reported by exactly \
             ranks {ranks:?}",
            cases.len()
        ));
    }
    cases.iter().filter(|c| c.passed()).count()
}

/// Judges the survivors of `fault` (at `fault_at`): pushes what is wrong to `problems` and
/// returns one line per survivor plus a summary of the cases on the shrunk world.
pub(super) fn judge(
    fault: &Fault,
    rejoin: bool,
    ranks: &[RankView],
    fault_at: Instant,
    bound: Duration,
    merged: &[MergedCase],
    problems: &mut Vec<String>,
) -> Vec<String> {
    let victim = fault.target.rank;
    let survivors: Vec<u32> = (0..ranks.len() as u32).filter(|&r| r != victim).collect();
    let errors: BTreeMap<u32, Option<ErrorRecord>> = survivors
        .iter()
        .map(|&rank| {
            let error = ranks[rank as usize]
                .shrunk
                .as_ref()
                .map(|s| s.error.clone());
            (rank, error)
        })
        .collect();
    let verdicts = fault::judge(fault.kind, victim, &errors);
    let mut lines = Vec::new();
    let mut times = Vec::new();
    for &rank in &survivors {
        let view = &ranks[rank as usize];
        let Some(shrunk) = &view.shrunk else {
            let why = match &view.end {
                Some(End::Failed(e)) => format!("failed instead: {}", e.message),
                Some(End::Done { .. }) => "finished without meeting the failure".to_owned(),
                Some(End::Crashed(why)) => why.clone(),
                _ => "never reported".to_owned(),
            };
            problems.push(format!("SHRINK: rank {rank} did not shrink: {why}"));
            continue;
        };
        let after = shrunk.at.saturating_duration_since(fault_at);
        times.push(after);
        lines.push(format!(
            "survivor rank {rank}: new group {:?} {:.3} s after the fault (the shrink took {:.1} ms), after: {}",
            shrunk.members,
            after.as_secs_f64(),
            shrunk.micros as f64 / 1000.0,
            shrunk.error.message
        ));
        if let Some(Err(why)) = verdicts.get(&rank) {
            problems.push(format!("FAULT: {why}"));
        }
        if shrunk.members != survivors {
            problems.push(format!(
                "SHRINK: rank {rank}'s new group is {:?}, not the survivors {survivors:?}",
                shrunk.members
            ));
        }
        if after > bound {
            problems.push(format!(
                "SHRINK: rank {rank} held its new group {:.3} s after the fault, over the bound of {:.1} s",
                after.as_secs_f64(),
                bound.as_secs_f64()
            ));
        }
        match &view.end {
            Some(End::Done { .. }) => {}
            Some(End::Failed(e)) => problems.push(format!(
                "SHRINK: rank {rank} failed on the shrunk world{}: {}",
                e.during
                    .as_deref()
                    .map(|d| format!(" in {d}"))
                    .unwrap_or_default(),
                e.message
            )),
            other => problems.push(format!(
                "SHRINK: rank {rank} did not finish on the shrunk world ({other:?})"
            )),
        }
    }
    let shrunk_cases: Vec<&MergedCase> = merged
        .iter()
        .filter(|c| after_shrink(c) && !after_grow(c))
        .collect();
    let passed = check_stage(&shrunk_cases, &survivors, "shrunk world", problems);
    times.sort_unstable();
    if let (Some(first), Some(last)) = (times.first(), times.last()) {
        lines.push(format!(
            "shrink: {} survivors held the new group {:.3}-{:.3} s after the fault; {passed} of {} cases on the {}-rank world passed",
            times.len(),
            first.as_secs_f64(),
            last.as_secs_f64(),
            shrunk_cases.len(),
            survivors.len()
        ));
    }
    if rejoin {
        let everyone: Vec<u32> = (0..ranks.len() as u32).collect();
        let mut grow_micros = Vec::new();
        for &rank in &everyone {
            let view = &ranks[rank as usize];
            match view.grown {
                Some((size, micros)) if size as usize == ranks.len() => {
                    if rank != victim {
                        grow_micros.push(micros);
                    }
                }
                Some((size, _)) => problems.push(format!(
                    "REJOIN: rank {rank} was in a grown world of {size} ranks, not {}",
                    ranks.len()
                )),
                None => problems.push(format!(
                    "REJOIN: rank {rank}{} never reported the grown world",
                    if rank == victim {
                        " (the replacement)"
                    } else {
                        ""
                    }
                )),
            }
        }
        if !matches!(ranks[victim as usize].end, Some(End::Done { .. })) {
            problems.push(format!(
                "REJOIN: the replacement of rank {victim} did not finish: {:?}",
                ranks[victim as usize].end
            ));
        }
        let grown_cases: Vec<&MergedCase> = merged.iter().filter(|c| after_grow(c)).collect();
        let passed = check_stage(&grown_cases, &everyone, "grown world", problems);
        let slowest = grow_micros.iter().max().copied().unwrap_or(0);
        lines.push(format!(
            "rejoin: rank {victim} came back as a replacement (the survivors' grow took up to {:.1} ms, from its call to the grown world); {passed} of {} cases on the grown {}-rank world passed",
            slowest as f64 / 1000.0,
            grown_cases.len(),
            ranks.len()
        ));
    }
    lines
}
