//! What the launcher knows about each rank while the job runs: its progress, its records,
//! its shrink and how its run ended.

use std::collections::VecDeque;
use std::time::Instant;

use super::events::{CaseRecord, ErrorRecord};

/// How a rank's run ended, as the launcher saw it.
#[derive(Debug, Clone)]
pub(super) enum End {
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
pub(super) struct RankView {
    pub(super) groups: Option<u64>,
    pub(super) started_groups: u64,
    pub(super) finished: u64,
    pub(super) current: Option<(String, Instant)>,
    pub(super) end: Option<End>,
    pub(super) ended_at: Option<Instant>,
    pub(super) records: Vec<CaseRecord>,
    pub(super) log_tail: VecDeque<String>,
    /// Its shrink, once it reported one.
    pub(super) shrunk: Option<Shrunk>,
    /// The size of the grown world it reported being in, and how long its grow or join took
    /// (microseconds).
    pub(super) grown: Option<(u32, u64)>,
}

impl RankView {
    pub(super) fn status(&self, rank: u32) -> String {
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

/// A survivor's report of its shrink.
#[derive(Debug, Clone)]
pub(super) struct Shrunk {
    /// The error that made it shrink.
    pub(super) error: ErrorRecord,
    /// World ranks of its new group.
    pub(super) members: Vec<u32>,
    /// How long the shrink itself took, in microseconds.
    pub(super) micros: u64,
    /// When the launcher heard of it.
    pub(super) at: Instant,
}
