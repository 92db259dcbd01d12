//! `rlx flight-report DIR`: reads the flight records that the ranks of a job wrote to
//! `DIR` (`RLX_FLIGHT_RECORDER=DIR`, one `rank-<r>.jsonl` per rank) and says what a user needs
//! to know about a hang or a failure: how far every rank got, the first operation that some
//! rank never entered (and what that rank was doing instead), operations that differ between
//! ranks at the same sequence number, and whom each unfinished operation waited on. A rank that
//! left no record (killed, or stopped before it could write) is named as such.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use clap::Args;
use serde::Deserialize;

/// Flags of `rlx flight-report`.
#[derive(Debug, Args)]
pub struct FlightReportArgs {
    /// The directory the ranks dumped their records to.
    pub dir: PathBuf,
    /// The job's world size, so that ranks without a record are named too.
    #[arg(long)]
    pub world: Option<u32>,
}

/// One line of a rank's record (the fields `rlx_collective::flight::FlightEntry` writes).
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Entry {
    pub(crate) group: u16,
    pub(crate) rank: u32,
    pub(crate) seq: u32,
    pub(crate) op: String,
    /// For a point-to-point call: the world rank on the other side, and the user tag.
    pub(crate) peer: Option<u32>,
    pub(crate) tag: Option<u32>,
    pub(crate) dtype: Option<String>,
    pub(crate) elements: Option<u64>,
    pub(crate) algorithm: Option<String>,
    pub(crate) state: String,
    pub(crate) waiting_on: Option<u32>,
    pub(crate) error: Option<String>,
}

impl Entry {
    /// Whether it is a point-to-point call (outside the group's sequence).
    fn is_point_to_point(&self) -> bool {
        self.peer.is_some()
    }

    /// The call alone: `barrier #3`, `recv(from 0, tag 8)`.
    fn call(&self) -> String {
        match (self.peer, self.tag) {
            (Some(peer), Some(tag)) if self.op == "send" => {
                format!("send(to {peer}, tag {tag})")
            }
            (Some(peer), Some(tag)) => format!("{}(from {peer}, tag {tag})", self.op),
            _ => format!("{} #{}", self.op, self.seq),
        }
    }

    fn describe(&self) -> String {
        let mut text = self.call();
        match (&self.dtype, self.elements) {
            (Some(dtype), Some(elements)) => {
                let _ = write!(text, " of {elements} {dtype}");
            }
            // A receive before its message arrived knows only the type it expects.
            (Some(dtype), None) => {
                let _ = write!(text, " of {dtype}");
            }
            _ => {}
        }
        if let Some(algorithm) = &self.algorithm {
            let _ = write!(text, " by {algorithm}");
        }
        let _ = write!(text, " ({}", self.state);
        if self.state != "done" {
            if let Some(peer) = self.waiting_on {
                let _ = write!(text, ", waiting on rank {peer}");
            }
        }
        if let Some(error) = &self.error {
            let _ = write!(text, ": {error}");
        }
        text.push(')');
        text
    }
}

/// Each rank's collectives of one group by sequence number.
type Ranks<'a> = BTreeMap<u32, BTreeMap<u32, &'a Entry>>;

/// Prints the report of the records in `args.dir`.
pub fn run(args: &FlightReportArgs) -> Result<(), String> {
    let entries = read_dir(&args.dir)?;
    print!("{}", diagnose(&entries, args.world));
    Ok(())
}

/// Prints the report on the records in `dir` of a run in which rank `victim` of `ranks` was
/// killed or stalled, removes them, and checks that it names the victim and the operation each
/// survivor was left in. (The survivors need not be in the fault point's collective: those that
/// did not need the victim there went on to the next one.)
pub fn check_names_faulty_rank(dir: &Path, victim: u32, ranks: u32) -> Result<(), String> {
    let report = print_and_remove(dir, ranks)?;
    let named = report.contains(&format!("rank {victim}: left no record"))
        || report.contains(&format!("rank {victim} never entered"));
    let survivors_named = (0..ranks)
        .filter(|&r| r != victim)
        .all(|r| names_operation_of(&report, r));
    if named && survivors_named {
        Ok(())
    } else {
        Err(format!(
            "the flight report does not name rank {victim} and every survivor's operation"
        ))
    }
}

/// Prints the report on the records in `dir` of a run in which rank `victim`'s link was cut,
/// removes them, and checks that it names the operation every survivor was left in. A rank cut
/// off enters its operations as the others do, and each side sees the other go silent, so the
/// records cannot single it out (its name comes from the survivors' errors); and when what it
/// needed had reached it before the cut, it finishes and leaves no record at all.
pub fn check_names_survivors_operations(dir: &Path, victim: u32, ranks: u32) -> Result<(), String> {
    let report = print_and_remove(dir, ranks)?;
    match (0..ranks).find(|&r| r != victim && !names_operation_of(&report, r)) {
        None => Ok(()),
        Some(rank) => Err(format!(
            "the flight report does not name the operation rank {rank} was left in"
        )),
    }
}

/// Prints the report on the records in `dir` of a world of `ranks`, removes them, and returns
/// the report.
fn print_and_remove(dir: &Path, ranks: u32) -> Result<String, String> {
    let entries = read_dir(dir)?;
    let report = diagnose(&entries, Some(ranks));
    println!("\n{report}");
    let _ = std::fs::remove_dir_all(dir);
    Ok(report)
}

/// Whether `report` names the operation rank `rank` was left in.
fn names_operation_of(report: &str, rank: u32) -> bool {
    report
        .lines()
        .any(|l| l.starts_with(&format!("  rank {rank}: ")) && l.contains(" #"))
}

/// Every entry of every `rank-*.jsonl` file in `dir`.
pub(crate) fn read_dir(dir: &Path) -> Result<Vec<Entry>, String> {
    let listing = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut entries = Vec::new();
    for file in listing.flatten() {
        let path = file.path();
        let name = file.file_name().to_string_lossy().into_owned();
        if !(name.starts_with("rank-") && name.ends_with(".jsonl")) {
            continue;
        }
        let text =
            std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        for (number, line) in text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
        {
            let entry = serde_json::from_str(line)
                .map_err(|e| format!("{}:{}: {e}", path.display(), number + 1))?;
            entries.push(entry);
        }
    }
    Ok(entries)
}

/// The report on `entries`, group by group; `world` names the ranks expected.
pub(crate) fn diagnose(entries: &[Entry], world: Option<u32>) -> String {
    let mut out = String::new();
    let groups: BTreeSet<u16> = entries.iter().map(|e| e.group).collect();
    if groups.is_empty() {
        out.push_str("flight report: no records\n");
    }
    for group in groups {
        let mut ranks: Ranks<'_> = BTreeMap::new();
        let calls: Vec<&Entry> = entries
            .iter()
            .filter(|e| e.group == group && e.is_point_to_point())
            .collect();
        for entry in entries
            .iter()
            .filter(|e| e.group == group && !e.is_point_to_point())
        {
            ranks
                .entry(entry.rank)
                .or_default()
                .insert(entry.seq, entry);
        }
        // A rank that made only point-to-point calls has a record too.
        for call in &calls {
            ranks.entry(call.rank).or_default();
        }
        let present: Vec<String> = ranks.keys().map(ToString::to_string).collect();
        let _ = writeln!(
            out,
            "flight report, group {group}: records of rank(s) {}",
            present.join(", ")
        );
        if let Some(world) = world.filter(|_| group == 1) {
            for rank in (0..world).filter(|r| !ranks.contains_key(r)) {
                let _ = writeln!(
                    out,
                    "  rank {rank}: left no record (killed, or stopped before it could write one)"
                );
            }
        }
        rank_lines(&mut out, &ranks, &calls);
        // Only sequence numbers every ring still covers can be compared.
        let from = ranks
            .values()
            .filter_map(|ops| ops.keys().next().copied())
            .max()
            .unwrap_or(0);
        let to = ranks
            .values()
            .filter_map(|ops| ops.keys().next_back().copied())
            .max()
            .unwrap_or(0);
        first_missing(&mut out, &ranks, from..=to);
        for line in unmatched_messages(&calls) {
            let _ = writeln!(out, "  {line}");
        }
        mismatches(&mut out, &ranks, from..=to);
        for line in deadlocks(&ranks, &calls) {
            let _ = writeln!(out, "  {line}");
        }
    }
    out
}

/// Each rank's line: how far it completed and what it left unfinished.
fn rank_lines(out: &mut String, ranks: &Ranks<'_>, calls: &[&Entry]) {
    for (rank, ops) in ranks {
        let done = ops
            .values()
            .filter(|e| e.state == "done")
            .map(|e| e.seq)
            .max();
        let unfinished: Vec<String> = ops
            .values()
            .copied()
            .chain(calls.iter().copied().filter(|c| c.rank == *rank))
            .filter(|e| e.state != "done")
            .map(Entry::describe)
            .collect();
        let done = done.map_or_else(|| "nothing".to_owned(), |s| format!("up to #{s}"));
        let now = if unfinished.is_empty() {
            "nothing unfinished".to_owned()
        } else {
            unfinished.join("; ")
        };
        let _ = writeln!(out, "  rank {rank}: completed {done}; {now}");
    }
}

/// The first sequence number in `seqs` that some rank never entered, with what each such rank
/// did instead.
fn first_missing(out: &mut String, ranks: &Ranks<'_>, seqs: std::ops::RangeInclusive<u32>) {
    for seq in seqs {
        let missing: Vec<u32> = ranks
            .iter()
            .filter(|(_, ops)| !ops.contains_key(&seq))
            .map(|(rank, _)| *rank)
            .collect();
        if missing.is_empty() {
            continue;
        }
        let op = ranks
            .values()
            .find_map(|ops| ops.get(&seq))
            .map_or("?", |e| e.op.as_str());
        for rank in missing {
            let instead = ranks[&rank]
                .values()
                .next_back()
                .map_or_else(|| "no operation".to_owned(), |e| e.describe());
            let _ = writeln!(
                out,
                "  first operation not entered by every rank: {op} #{seq}: rank {rank} never \
                 entered it (its last: {instead})"
            );
        }
        break;
    }
}

/// The sequence numbers in `seqs` at which ranks ran different operations.
fn mismatches(out: &mut String, ranks: &Ranks<'_>, seqs: std::ops::RangeInclusive<u32>) {
    for seq in seqs {
        let names: BTreeMap<&str, Vec<u32>> =
            ranks
                .iter()
                .fold(BTreeMap::new(), |mut names, (rank, ops)| {
                    if let Some(entry) = ops.get(&seq) {
                        names.entry(entry.op.as_str()).or_default().push(*rank);
                    }
                    names
                });
        if names.len() > 1 {
            let parts: Vec<String> = names
                .iter()
                .map(|(op, ranks)| format!("rank(s) {ranks:?} in {op}"))
                .collect();
            let _ = writeln!(out, "  mismatch at #{seq}: {}", parts.join(", "));
        }
    }
}

/// Ranks that wait on each other, each in its unfinished call, one line per cycle:
/// `deadlock: rank 0 waits on rank 1 in barrier #3; rank 1 waits on rank 0 in recv(from 0,
/// tag 8)`. A rank's wait is its unfinished point-to-point call, else its last unfinished
/// collective.
fn deadlocks(ranks: &Ranks<'_>, calls: &[&Entry]) -> Vec<String> {
    let waits: BTreeMap<u32, &Entry> = ranks
        .iter()
        .filter_map(|(rank, ops)| {
            let unfinished = |e: &&Entry| e.state != "done" && e.waiting_on.is_some();
            let mut p2p = calls.iter().copied().filter(|c| c.rank == *rank);
            let entry = p2p
                .rfind(unfinished)
                .or_else(|| ops.values().copied().rfind(unfinished))?;
            Some((*rank, entry))
        })
        .collect();
    let mut cycles: BTreeSet<Vec<u32>> = BTreeSet::new();
    for &start in waits.keys() {
        let mut path = vec![start];
        while let Some(next) = waits
            .get(path.last().unwrap_or(&start))
            .and_then(|e| e.waiting_on)
        {
            if let Some(at) = path.iter().position(|&r| r == next) {
                let mut cycle = path[at..].to_vec();
                let lowest = cycle
                    .iter()
                    .enumerate()
                    .min_by_key(|(_, r)| **r)
                    .map_or(0, |(i, _)| i);
                cycle.rotate_left(lowest);
                cycles.insert(cycle);
                break;
            }
            path.push(next);
        }
    }
    cycles
        .iter()
        .map(|cycle| {
            let parts: Vec<String> = cycle
                .iter()
                .map(|rank| {
                    let entry = waits[rank];
                    let on = entry.waiting_on.unwrap_or_default();
                    format!("rank {rank} waits on rank {on} in {}", entry.call())
                })
                .collect();
            format!("deadlock: {}", parts.join("; "))
        })
        .collect()
}

/// For every receive still waiting, the messages its source sent to it under other tags that
/// it never received: the usual cause of a point-to-point hang (a wrong tag).
fn unmatched_messages(calls: &[&Entry]) -> Vec<String> {
    let mut lines = Vec::new();
    let waiting = calls
        .iter()
        .filter(|c| c.state != "done" && c.op != "send" && c.tag.is_some());
    for wait in waiting {
        let (Some(source), Some(wanted)) = (wait.peer, wait.tag) else {
            continue;
        };
        let received = |tag: Option<u32>| {
            calls.iter().any(|c| {
                c.rank == wait.rank && c.peer == Some(source) && c.tag == tag && c.state == "done"
            })
        };
        for sent in calls.iter().filter(|c| {
            c.rank == source
                && c.op == "send"
                && c.peer == Some(wait.rank)
                && c.tag != Some(wanted)
                && !received(c.tag)
        }) {
            let what = match (sent.elements, &sent.dtype) {
                (Some(n), Some(dtype)) => format!(" ({n} × {dtype})"),
                _ => String::new(),
            };
            lines.push(format!(
                "unreceived: rank {source} sent tag {}{what} to rank {}; rank {} waits for tag \
                 {wanted}",
                sent.tag.unwrap_or_default(),
                wait.rank,
                wait.rank
            ));
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, mpsc};
    use std::time::Duration;

    use rlx_collective::{MemTransport, ProcessGroup, ReduceKind, Transport};

    use super::*;

    /// Ranks 0 and 1 enter an all-reduce that rank 2 never issues: their records, dumped once
    /// it failed, make the report name rank 2 and the operation it never entered.
    ///
    /// Nothing waits on a timeout (it is long, so a thread that starts late cannot fail the
    /// barrier): rank 2 dumps its record once ranks 0 and 1 are past the barrier, then aborts
    /// its transport, which fails their all-reduce at once with the loss of rank 2.
    #[test]
    fn the_report_names_the_rank_that_never_arrived() {
        let dir = std::env::temp_dir().join(format!("rlx-flight-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let world = MemTransport::fan_out_with_timeout(3, Duration::from_secs(60));
        // Ranks 0 and 1 say when they are past the barrier.
        let (past_barrier, wait_for_barrier) = mpsc::channel::<()>();
        let mut wait_for_barrier = Some(wait_for_barrier);
        let threads: Vec<_> = world
            .into_iter()
            .map(|t| {
                let dir = dir.clone();
                let past_barrier = past_barrier.clone();
                let wait_for_barrier = if t.rank() == 2 {
                    wait_for_barrier.take()
                } else {
                    None
                };
                std::thread::spawn(move || {
                    let group = ProcessGroup::new(t as Arc<dyn Transport>);
                    group.barrier().unwrap();
                    if let Some(others) = wait_for_barrier {
                        // Once the others are past the barrier, losing this rank fails only
                        // their all-reduce.
                        for _ in 0..2 {
                            others.recv_timeout(Duration::from_secs(60)).unwrap();
                        }
                        group.dump_flight_record(&dir).unwrap();
                        group.transport().abort();
                        return;
                    }
                    past_barrier.send(()).unwrap();
                    let mut x = [1.0f32; 4];
                    assert!(group.all_reduce(&mut x, ReduceKind::Sum).is_err());
                    group.dump_flight_record(&dir).unwrap();
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let report = diagnose(&read_dir(&dir).unwrap(), Some(4));
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            report.contains(
                "all_reduce #1: rank 2 never entered it (its last: barrier #0 by dissemination \
                 (done))"
            ),
            "{report}"
        );
        assert!(report.contains("rank 3: left no record"), "{report}");
        assert!(
            report.contains("rank 0: completed up to #0; all_reduce #1 of 4 f32 by"),
            "{report}"
        );
    }

    #[test]
    fn different_operations_at_one_sequence_number_are_a_mismatch() {
        let entry = |rank, op: &str| Entry {
            group: 1,
            rank,
            seq: 7,
            op: op.to_owned(),
            peer: None,
            tag: None,
            dtype: Some("f32".to_owned()),
            elements: Some(8),
            algorithm: Some("ring".to_owned()),
            state: "running".to_owned(),
            waiting_on: Some(1 - rank),
            error: None,
        };
        let report = diagnose(&[entry(0, "all_reduce"), entry(1, "broadcast")], None);
        assert!(
            report.contains("mismatch at #7: rank(s) [0] in all_reduce, rank(s) [1] in broadcast"),
            "{report}"
        );
        assert!(
            report.contains("all_reduce #7 of 8 f32 by ring (running, waiting on rank 1)"),
            "{report}"
        );
    }

    /// Rank 0 sends under tag 7 while rank 1 waits for tag 8: the receive times out (no
    /// message under tag 8 ever comes, so the outcome does not depend on timing), and the
    /// report of both records shows rank 1's receive as unfinished and names the message it
    /// never received, with its length in elements and its type.
    #[test]
    fn a_receive_on_the_wrong_tag_is_named_with_the_message_it_missed() {
        let world = MemTransport::fan_out_with_timeout(2, Duration::from_millis(200));
        let groups: Vec<ProcessGroup> = world
            .into_iter()
            .map(|t| ProcessGroup::new(t as Arc<dyn Transport>))
            .collect();
        groups[0]
            .send(1, 7, &[half::bf16::from_f32(1.0); 1024])
            .expect("a send into the peer's queue");
        let missed = groups[1].recv::<half::bf16>(0, 8);
        assert!(
            matches!(
                missed,
                Err(rlx_collective::CollectiveError::Unreceived { tag: 8, .. })
            ),
            "{missed:?}"
        );
        let entries: Vec<Entry> = groups
            .iter()
            .flat_map(ProcessGroup::flight_record)
            .map(|e| serde_json::from_str(&serde_json::to_string(&e).unwrap()).unwrap())
            .collect();
        let report = diagnose(&entries, Some(2));
        assert!(
            report.contains("rank 1: completed nothing; recv(from 0, tag 8) of bf16 (failed"),
            "{report}"
        );
        assert!(
            report.contains(
                "unreceived: rank 0 sent tag 7 (1024 × bf16) to rank 1; rank 1 waits for tag 8"
            ),
            "{report}"
        );
    }

    /// Rank 0 sends under tag 7 and waits in a barrier; rank 1 waits for tag 8: both calls
    /// fail as a deadlock (neither wait can end, so the outcome does not depend on timing),
    /// and the report names the cycle, each rank with its call.
    #[test]
    fn ranks_waiting_on_each_other_are_named_as_a_deadlock() {
        let world = MemTransport::fan_out_with_timeout(2, Duration::from_secs(1));
        let groups: Vec<ProcessGroup> = world
            .into_iter()
            .map(|t| ProcessGroup::new(t as Arc<dyn Transport>))
            .collect();
        let done = std::sync::Barrier::new(2);
        let results: Vec<_> = std::thread::scope(|s| {
            let done = &done;
            let threads: Vec<_> = groups
                .iter()
                .map(|group| {
                    s.spawn(move || {
                        let result = if group.rank() == 0 {
                            group
                                .send(1, 7, &[half::bf16::from_f32(1.0); 16])
                                .and_then(|()| group.barrier())
                        } else {
                            group.recv::<half::bf16>(0, 8).map(drop)
                        };
                        done.wait();
                        result
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        for result in &results {
            assert!(
                matches!(
                    result,
                    Err(rlx_collective::CollectiveError::Deadlock { .. })
                ),
                "{result:?}"
            );
        }
        let entries: Vec<Entry> = groups
            .iter()
            .flat_map(ProcessGroup::flight_record)
            .map(|e| serde_json::from_str(&serde_json::to_string(&e).unwrap()).unwrap())
            .collect();
        let report = diagnose(&entries, Some(2));
        assert!(
            report.contains(
                "deadlock: rank 0 waits on rank 1 in barrier #0; rank 1 waits on rank 0 in \
                 recv(from 0, tag 8)"
            ),
            "{report}"
        );
    }
}
