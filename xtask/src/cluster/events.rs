//! The JSON-lines protocol from a test-cluster rank to its launcher: one [`Event`] per line on
//! the rank's stdout. Anything else a rank prints there is shown to the user as a log line.

use serde::{Deserialize, Serialize};

/// One thing a rank tells its launcher.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "event", rename_all = "snake_case")]
pub(crate) enum Event {
    /// The rank joined its group and knows how many groups of cases it will run.
    Ready {
        /// The rank.
        rank: u32,
        /// Number of groups (one collective, dtype and size each) over all iterations.
        groups: u64,
    },
    /// The rank is about to run a group of cases (the hang report names the last one).
    Start {
        /// The rank.
        rank: u32,
        /// Index of the group over all iterations.
        group: u64,
        /// Its name (`all_reduce f16 n=65537`).
        name: String,
    },
    /// The rank finished a case.
    Case {
        /// The rank.
        rank: u32,
        /// The outcome.
        case: CaseRecord,
    },
    /// The rank reached its fault point and is about to die or freeze.
    Fault {
        /// The rank.
        rank: u32,
        /// `"kill"` or `"stall"`.
        kind: String,
        /// The case it was about to run.
        index: u64,
    },
    /// The rank's run ended with an error (after that it only waits to be told to exit).
    Failed {
        /// The rank.
        rank: u32,
        /// What went wrong.
        error: ErrorRecord,
    },
    /// The rank ran every case.
    Done {
        /// The rank.
        rank: u32,
        /// Cases that passed.
        passed: u64,
        /// Cases that failed.
        failed: u64,
    },
    /// The rank met a fatal error, shrank its group to the survivors and goes on with them.
    Shrunk {
        /// The rank (its rank in the full world).
        rank: u32,
        /// The error that made it shrink.
        error: ErrorRecord,
        /// World ranks of the new group's members.
        members: Vec<u32>,
        /// How long the shrink took, in microseconds.
        micros: u64,
    },
    /// A soak rank's running count of checked operations.
    Soak {
        /// The rank.
        rank: u32,
        /// Operations run and checked so far.
        ops: u64,
        /// Result bytes checked so far.
        bytes: u64,
        /// Its resources between two rounds, when it could read them.
        usage: Option<Usage>,
    },
    /// The rank is in a grown world (it grew its group, or it joined as a replacement).
    Grown {
        /// The rank (the one it replaces, for a replacement).
        rank: u32,
        /// Size of the grown world.
        members: u32,
        /// How long its grow (or join) took, in microseconds.
        micros: u64,
    },
}

impl Event {
    /// The rank the event is about.
    pub(crate) fn rank(&self) -> u32 {
        match self {
            Event::Ready { rank, .. }
            | Event::Start { rank, .. }
            | Event::Case { rank, .. }
            | Event::Fault { rank, .. }
            | Event::Failed { rank, .. }
            | Event::Done { rank, .. }
            | Event::Shrunk { rank, .. }
            | Event::Grown { rank, .. }
            | Event::Soak { rank, .. } => *rank,
        }
    }

    /// The event as one line of JSON.
    pub(crate) fn to_line(&self) -> String {
        // Serializing these plain structs cannot fail; an empty object keeps the stream
        // line-oriented even so.
        serde_json::to_string(self).unwrap_or_else(|_| "{}".to_owned())
    }
}

/// The outcome of one case on one rank.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct CaseRecord {
    /// Index over all iterations.
    pub(crate) index: u64,
    /// The collective (`"all_reduce"`).
    pub(crate) op: String,
    /// The element type, `"-"` for operations without one (barrier).
    pub(crate) dtype: String,
    /// The reduction, `"-"` for operations without one.
    pub(crate) reduce: String,
    /// Element count.
    pub(crate) count: u64,
    /// The case's full name (with its algorithm and root), as the conformance suite gives it.
    pub(crate) name: String,
    /// Whether the result matched the serial reference.
    pub(crate) passed: bool,
    /// What was wrong, when it failed.
    pub(crate) detail: String,
    /// Wall time of the case on this rank, in microseconds.
    pub(crate) micros: u64,
}

/// A run-ending error, with the fields the launcher's fault verdict needs.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct ErrorRecord {
    /// `"peer_lost"`, `"peer_failed"`, `"group_failed"`, `"timeout"`, `"aborted"` or `"other"`.
    pub(crate) kind: String,
    /// The peer the error names, when it names one.
    pub(crate) peer: Option<u32>,
    /// The error's message.
    pub(crate) message: String,
    /// The case that was running.
    pub(crate) during: Option<String>,
}

impl ErrorRecord {
    /// The record of `error` raised while running `during`.
    pub(crate) fn from_error(
        error: &rlx_collective::CollectiveError,
        during: Option<String>,
    ) -> Self {
        use rlx_collective::CollectiveError as E;
        let (kind, peer) = match error {
            E::PeerLost { peer, .. } => ("peer_lost", Some(*peer)),
            E::PeerFailed { peer, .. } => ("peer_failed", Some(*peer)),
            E::GroupFailed { peer, .. } => ("group_failed", Some(*peer)),
            E::Timeout { peer, .. } => ("timeout", *peer),
            E::Aborted => ("aborted", None),
            _ => ("other", None),
        };
        ErrorRecord {
            kind: kind.to_owned(),
            peer,
            message: error.to_string(),
            during,
        }
    }
}

/// One rank's resources at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Usage {
    pub(super) rss_kib: u64,
    pub(super) fds: u64,
    pub(super) threads: u64,
}

impl Usage {
    /// Reads process `pid`'s usage from `/proc`; `None` once it is gone.
    pub(super) fn of(pid: u32) -> Option<Usage> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let field = |name: &str| {
            status
                .lines()
                .find_map(|line| line.strip_prefix(name))
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|value| value.parse().ok())
        };
        let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
        Some(Usage {
            rss_kib: field("VmRSS:")?,
            fds,
            threads: field("Threads:")?,
        })
    }

    /// The larger of each figure.
    pub(super) fn max(self, other: Usage) -> Usage {
        Usage {
            rss_kib: self.rss_kib.max(other.rss_kib),
            fds: self.fds.max(other.fds),
            threads: self.threads.max(other.threads),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_round_trip_as_single_lines() {
        let events = [
            Event::Ready {
                rank: 1,
                groups: 10,
            },
            Event::Start {
                rank: 2,
                group: 3,
                name: "all_reduce f16 sum n=7".to_owned(),
            },
            Event::Failed {
                rank: 0,
                error: ErrorRecord {
                    kind: "peer_lost".to_owned(),
                    peer: Some(2),
                    message: "peer rank 2 lost: reset\nby peer".to_owned(),
                    during: None,
                },
            },
        ];
        for event in events {
            let line = event.to_line();
            assert!(!line.contains('\n'));
            let back: Event = serde_json::from_str(&line).unwrap();
            assert_eq!(back, event);
        }
    }

    #[test]
    fn errors_name_their_peer() {
        let lost = rlx_collective::CollectiveError::PeerLost {
            peer: 3,
            reason: "eof".to_owned(),
        };
        let record = ErrorRecord::from_error(&lost, None);
        assert_eq!((record.kind.as_str(), record.peer), ("peer_lost", Some(3)));
        let other = rlx_collective::CollectiveError::invalid("x");
        assert_eq!(ErrorRecord::from_error(&other, None).kind, "other");
    }
}
