//! Fault injection for test-cluster: where a chosen rank dies or freezes (`RANK@POINT`), and
//! the verdict on what the survivors reported.
//!
//! A survivor's error is right when it is of a kind the fault explains (`PeerLost` or a
//! peer's failure notice for a kill; also `Timeout` for a stall or a cut link) and it names
//! the victim — or, after a kill, names another survivor whose own error is right. The second
//! case is how a lost peer travels in a ring: rank 3 loses rank 2 and tells rank 0, which was
//! waiting on rank 3, not rank 2. A stall or a cut link must be named directly: a rank that
//! times out follows the chain of waits to the rank that does not answer, and the heartbeat
//! names the rank that went silent, so a survivor naming another survivor blamed a rank that
//! was only waiting itself. A rank killed during the rendezvous leaves the others a bootstrap
//! error, which is right when it names the victim.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

use super::events::ErrorRecord;

/// The name of the rendezvous as a fault point.
const BOOTSTRAP: &str = "bootstrap";

/// What happens to the victim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FaultKind {
    /// The process is killed with SIGKILL (an in-process rank aborts its transport).
    Kill,
    /// The rank freezes: a rank of its own process stops with SIGSTOP (its transport's
    /// threads too) until the launcher resumes it; an in-process rank stops calling into the
    /// transport for good.
    Stall,
    /// The rank's cable is pulled (`--netns` only): its switch port goes down
    /// (`ip link set … down`), so nothing gets in or out, and no reset is ever sent.
    Cut,
    /// The rank's link drops every packet (`--netns` only): a `tc` rule on both ends of its
    /// cable, as a firewall or a broken switch would; the link itself stays up.
    Drop,
}

impl FaultKind {
    /// `"kill"`, `"stall"`, `"cut"` or `"drop"`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            FaultKind::Kill => "kill",
            FaultKind::Stall => "stall",
            FaultKind::Cut => "cut",
            FaultKind::Drop => "drop",
        }
    }

    /// The kind named `name` (see [`FaultKind::name`]).
    fn named(name: &str) -> Option<FaultKind> {
        [
            FaultKind::Kill,
            FaultKind::Stall,
            FaultKind::Cut,
            FaultKind::Drop,
        ]
        .into_iter()
        .find(|kind| kind.name() == name)
    }

    /// Whether the fault takes the victim's link away while the victim runs on: it must then
    /// fail by itself, as the survivors do.
    pub(crate) fn cuts_the_link(self) -> bool {
        matches!(self, FaultKind::Cut | FaultKind::Drop)
    }

    /// Whether the victim lives on and must fail cleanly too: a stalled rank once resumed, a
    /// rank whose link was taken away.
    pub(crate) fn victim_lives_on(self) -> bool {
        self != FaultKind::Kill
    }

    /// Whether a survivor's error of kind `kind` (an [`ErrorRecord::kind`]) can be caused by
    /// this fault.
    fn explains(self, kind: &str) -> bool {
        match self {
            // A group-wide notice names the rank at fault, so it explains whatever that rank's
            // own failure explains.
            FaultKind::Kill => matches!(
                kind,
                "peer_lost" | "peer_failed" | "group_failed" | "bootstrap"
            ),
            FaultKind::Stall | FaultKind::Cut | FaultKind::Drop => {
                matches!(
                    kind,
                    "peer_lost" | "peer_failed" | "group_failed" | "timeout"
                )
            }
        }
    }
}

/// The point at which the victim fails.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Point {
    /// Before the case with this index (counted over all iterations from 0).
    Index(u64),
    /// Before the `nth` group (from 0) of this collective (`all_reduce:3`); a group is one
    /// dtype and element count with every reduction, algorithm and root.
    Op {
        /// The collective's name.
        op: String,
        /// Which occurrence.
        nth: u64,
    },
    /// This many milliseconds after the launcher started the ranks, during the rendezvous
    /// (`bootstrap:MS`); the launcher carries it out, so only a kill can be placed there.
    Bootstrap {
        /// The delay from the start.
        after_ms: u64,
    },
}

/// `RANK@POINT`: the victim and the point, as given on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    /// The rank that fails.
    pub(crate) rank: u32,
    /// When it fails.
    pub(crate) point: Point,
}

impl FromStr for Target {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let usage = || {
            format!(
                "{s:?} is not RANK@POINT (POINT: a case index, OP, OP:NTH or bootstrap:MS, e.g. 2@17, \
                 2@all_reduce:3 or 0@bootstrap:20)"
            )
        };
        let (rank, point) = s.split_once('@').ok_or_else(usage)?;
        let rank = rank.trim().parse().map_err(|_| usage())?;
        let point = point.trim();
        let point = if let Ok(index) = point.parse() {
            Point::Index(index)
        } else {
            let (op, nth) = match point.split_once(':') {
                Some((op, nth)) => (op, nth.parse().map_err(|_| usage())?),
                None => (point, 0),
            };
            if op.is_empty() || !op.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
                return Err(usage());
            }
            if op == BOOTSTRAP {
                Point::Bootstrap { after_ms: nth }
            } else {
                Point::Op {
                    op: op.to_owned(),
                    nth,
                }
            }
        };
        Ok(Target { rank, point })
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.point {
            Point::Index(index) => write!(f, "{}@{index}", self.rank),
            Point::Op { op, nth } => write!(f, "{}@{op}:{nth}", self.rank),
            Point::Bootstrap { after_ms } => write!(f, "{}@{BOOTSTRAP}:{after_ms}", self.rank),
        }
    }
}

/// A fault to inject: the kind and the target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Fault {
    /// Kill or stall.
    pub(crate) kind: FaultKind,
    /// Who and when.
    pub(crate) target: Target,
}

impl Fault {
    /// The fault as one argument for the rank binary (`kill:2@all_reduce:3`).
    pub(crate) fn to_arg(&self) -> String {
        format!("{}:{}", self.kind.name(), self.target)
    }

    /// Parses [`Fault::to_arg`]'s form.
    pub(crate) fn from_arg(s: &str) -> Result<Fault, String> {
        let (kind, target) = s
            .split_once(':')
            .ok_or_else(|| format!("{s:?} is not KIND:RANK@POINT"))?;
        let kind = FaultKind::named(kind).ok_or_else(|| format!("unknown fault kind {kind:?}"))?;
        Ok(Fault {
            kind,
            target: target.parse()?,
        })
    }
}

/// Decides, group by group on the victim, whether the fault point is reached.
#[derive(Debug, Default)]
pub(crate) struct Trigger {
    seen: BTreeMap<String, u64>,
}

impl Trigger {
    /// Called before every group, in order, with the index of its first case; true exactly
    /// when the point is reached there.
    pub(crate) fn reached(&mut self, point: &Point, index: u64, op: &str) -> bool {
        let nth = self.seen.entry(op.to_owned()).or_insert(0);
        let this = *nth;
        *nth += 1;
        match point {
            Point::Index(at) => *at == index,
            Point::Op { op: at, nth } => at == op && *nth == this,
            Point::Bootstrap { .. } => false,
        }
    }
}

/// Judges each survivor's error: `Ok` when it is explained by `kind` on `victim` (directly or
/// through a chain of survivors), else `Err` with the reason. `errors` maps every survivor to
/// the error it reported, or `None` when it reported none.
pub(crate) fn judge(
    kind: FaultKind,
    victim: u32,
    errors: &BTreeMap<u32, Option<ErrorRecord>>,
) -> BTreeMap<u32, Result<(), String>> {
    errors
        .keys()
        .map(|&rank| {
            let mut visited = BTreeSet::new();
            (rank, explained(kind, victim, rank, errors, &mut visited))
        })
        .collect()
}

fn explained(
    kind: FaultKind,
    victim: u32,
    rank: u32,
    errors: &BTreeMap<u32, Option<ErrorRecord>>,
    visited: &mut BTreeSet<u32>,
) -> Result<(), String> {
    let Some(Some(error)) = errors.get(&rank) else {
        return Err(format!(
            "rank {rank} reported no error after rank {victim} failed"
        ));
    };
    if !kind.explains(&error.kind) {
        return Err(format!(
            "rank {rank} failed with an error a {} does not explain: {}",
            kind.name(),
            error.message
        ));
    }
    match error.peer {
        Some(peer) if peer == victim => Ok(()),
        Some(peer) if kind != FaultKind::Kill => Err(format!(
            "rank {rank} blamed rank {peer}, which was waiting itself, for the {} of rank \
             {victim}: {}",
            kind.name(),
            error.message
        )),
        Some(peer) if visited.insert(rank) && errors.contains_key(&peer) => {
            explained(kind, victim, peer, errors, visited).map_err(|why| {
                format!(
                    "rank {rank} blamed rank {peer} ({}), but {why}",
                    error.message
                )
            })
        }
        _ => Err(format!(
            "rank {rank}'s error does not lead to rank {victim}: {}",
            error.message
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(kind: &str, peer: u32) -> Option<ErrorRecord> {
        Some(ErrorRecord {
            kind: kind.to_owned(),
            peer: Some(peer),
            message: format!("{kind} {peer}"),
            during: None,
        })
    }

    #[test]
    fn targets_parse() {
        assert_eq!(
            "2@17".parse::<Target>().unwrap(),
            Target {
                rank: 2,
                point: Point::Index(17)
            }
        );
        assert_eq!(
            "1@all_reduce:3".parse::<Target>().unwrap().point,
            Point::Op {
                op: "all_reduce".to_owned(),
                nth: 3
            }
        );
        assert_eq!(
            "0@broadcast".parse::<Target>().unwrap().point,
            Point::Op {
                op: "broadcast".to_owned(),
                nth: 0
            }
        );
        assert_eq!(
            "0@bootstrap:20".parse::<Target>().unwrap().point,
            Point::Bootstrap { after_ms: 20 }
        );
        for bad in ["2", "x@1", "2@", "2@all reduce", "2@op:x"] {
            assert!(bad.parse::<Target>().is_err(), "{bad}");
        }
        for kind in [
            FaultKind::Kill,
            FaultKind::Stall,
            FaultKind::Cut,
            FaultKind::Drop,
        ] {
            let fault = Fault {
                kind,
                target: "3@all_gather:2".parse().unwrap(),
            };
            assert_eq!(Fault::from_arg(&fault.to_arg()).unwrap(), fault);
        }
        assert!(Fault::from_arg("melt:1@2").is_err());
    }

    #[test]
    fn trigger_counts_occurrences() {
        let point = Point::Op {
            op: "all_reduce".to_owned(),
            nth: 1,
        };
        let mut trigger = Trigger::default();
        let hits: Vec<bool> = ["all_reduce", "broadcast", "all_reduce", "all_reduce"]
            .iter()
            .enumerate()
            .map(|(i, op)| trigger.reached(&point, i as u64, op))
            .collect();
        assert_eq!(hits, [false, false, true, false]);
        let mut trigger = Trigger::default();
        assert!(!trigger.reached(&Point::Index(1), 0, "a"));
        assert!(trigger.reached(&Point::Index(1), 1, "a"));
    }

    #[test]
    fn chains_of_blame_lead_to_the_victim() {
        let errors = BTreeMap::from([
            (0, err("peer_failed", 3)),
            (1, err("group_failed", 2)),
            (3, err("peer_lost", 2)),
            (4, err("group_failed", 0)),
        ]);
        let verdict = judge(FaultKind::Kill, 2, &errors);
        assert!(verdict.values().all(Result::is_ok), "{verdict:?}");
    }

    #[test]
    fn wrong_errors_are_refused() {
        // A timeout does not explain a kill; a cycle of blame leads nowhere; silence fails.
        let errors = BTreeMap::from([
            (0, err("timeout", 2)),
            (1, err("peer_failed", 3)),
            (3, err("peer_failed", 1)),
            (4, None),
        ]);
        let verdict = judge(FaultKind::Kill, 2, &errors);
        assert!(verdict.values().all(Result::is_err), "{verdict:?}");
        // The same timeout is right for a stall.
        let errors = BTreeMap::from([(0, err("timeout", 2))]);
        assert!(judge(FaultKind::Stall, 2, &errors)[&0].is_ok());
        // A stall is named directly: blaming a survivor that blames the victim is wrong.
        let errors = BTreeMap::from([(0, err("group_failed", 3)), (3, err("timeout", 2))]);
        for kind in [FaultKind::Stall, FaultKind::Cut, FaultKind::Drop] {
            let verdict = judge(kind, 2, &errors);
            assert!(verdict[&0].is_err() && verdict[&3].is_ok(), "{verdict:?}");
        }
    }
}
