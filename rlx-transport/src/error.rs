//! The one error type of RLX transport, shared by every transport and by the collectives.
//!
//! Which errors leave a group unusable ([`CollectiveError::is_fatal`]):
//! - [`CollectiveError::PeerLost`], [`CollectiveError::Aborted`], [`CollectiveError::Protocol`] and
//!   [`CollectiveError::Io`] mean a link is gone or cannot be trusted; every later operation that
//!   needs that peer fails too. Build a new group.
//! - [`CollectiveError::Timeout`] leaves the group usable only if the late peer never sends the
//!   bytes of the timed-out operation; in practice treat it like a lost peer.
//! - [`CollectiveError::GroupFailed`] is how the other ranks of a group learn about one of the
//!   failures above: the collectives send a group-wide notice when an operation fails fatally,
//!   and from then on every operation of that group fails on every rank.
//! - [`CollectiveError::LengthMismatch`], [`CollectiveError::InvalidArgument`],
//!   [`CollectiveError::UnknownRank`], [`CollectiveError::OutOfBounds`] and
//!   [`CollectiveError::Unsupported`] describe one call; the group stays usable for the next one.
//! - [`CollectiveError::PeerFailed`] is not fatal either: it reports that a peer's part of one
//!   operation failed for one of the reasons just listed (fatal reasons travel as
//!   [`CollectiveError::GroupFailed`] instead). Every rank has then left that operation, whose
//!   messages carry its own identity, so the next operation matches as usual.

use std::fmt;
use std::time::Duration;

use crate::DType;

/// Every failure of a transport or collective operation.
///
/// Messages are lowercase without a trailing period and name the peer rank where one is known.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CollectiveError {
    /// A buffer or message had a different length than this operation requires, here or on a
    /// peer (lengths in bytes; the message gives them in elements when the type is known).
    /// When the members said what they passed (`lengths`), the message names the rank whose
    /// length differs from the others' instead.
    #[error("{op}: length mismatch{}", mismatch(*peer, *expected, *got, *dtype, lengths))]
    LengthMismatch {
        /// The operation that found it (`"all_reduce"`, `"recv"`, `"get"`...).
        op: &'static str,
        /// The peer whose message or notice did not match, when one did.
        peer: Option<u32>,
        /// The length this rank (or, for a peer's notice, that peer) expected.
        expected: u64,
        /// The length that was found.
        got: u64,
        /// The element type the lengths count, when the operation knows it.
        dtype: Option<DType>,
        /// What each member that said so passed to the operation, as (world rank, bytes),
        /// this rank included: the collectives gather it after a mismatch from the members'
        /// failure notices. Empty when nobody said.
        lengths: Vec<(u32, u64)>,
    },
    /// A one-sided access fell outside the symmetric heap of `rank`.
    #[error(
        "out of bounds on rank {rank}: offset {offset} + len {len} exceeds heap size {heap_size}"
    )]
    OutOfBounds {
        /// The rank whose heap was addressed.
        rank: u32,
        /// Offset of the access in bytes.
        offset: u64,
        /// Length of the access in bytes.
        len: u64,
        /// Size of that rank's heap in bytes.
        heap_size: u64,
    },
    /// A rank number outside `0..world_size`.
    #[error("unknown rank {rank} in a world of size {world_size}")]
    UnknownRank {
        /// The rank that was named.
        rank: u32,
        /// The size of the world it was checked against.
        world_size: u32,
    },
    /// An operation waited longer than its deadline.
    #[error("{op} timed out after {after:?} waiting for {}", peer_name(*peer))]
    Timeout {
        /// The peer that was awaited, when one peer was.
        peer: Option<u32>,
        /// The operation that waited (`"recv"`, `"all_reduce"`, `"connect"`...).
        op: &'static str,
        /// How long it waited.
        after: Duration,
    },
    /// A receive waited in vain for `tag` while messages from the same peer under other tags
    /// wait unreceived: most likely one side uses the wrong tag. Fatal like the timeout it is.
    #[error(
        "{op} from peer rank {peer} under tag {tag} timed out after {after:?}; rank {peer} sent \
         this rank what no receive took: {}",
        unreceived_list(unreceived, *dtype)
    )]
    Unreceived {
        /// The operation that waited (`"recv"`).
        op: &'static str,
        /// The peer it waited for.
        peer: u32,
        /// The user tag it waited for.
        tag: u32,
        /// How long it waited.
        after: Duration,
        /// The user tags and lengths in bytes of the peer's messages that wait unreceived.
        unreceived: Vec<(u32, u64)>,
        /// The element type the receive expected, to give the lengths in elements.
        dtype: Option<DType>,
    },
    /// Ranks wait on each other, so none of them can go on: a receive under the wrong tag, a
    /// receive that no send matches, one rank in a collective while its peer waits in a
    /// receive. Found by following who waits on whom after a timeout; every rank of the
    /// cycle reports it, and no rank is blamed, since none is silent. Fatal.
    #[error("{}", deadlock(op, *after, *found_by, waits))]
    Deadlock {
        /// The operation that waited on this rank.
        op: &'static str,
        /// How long it waited before it timed out, when this rank found the deadlock itself
        /// (`None`: another rank's notice ended the wait).
        after: Option<Duration>,
        /// The world rank that found the deadlock by following the chain of waits.
        found_by: u32,
        /// What the ranks of the cycle (as far as this rank learned it) wait in and on whom,
        /// this rank's own wait among them.
        waits: Vec<Waiter>,
    },
    /// The connection to a peer closed, reset or the peer's process ended.
    #[error("peer rank {peer} lost: {reason}")]
    PeerLost {
        /// The rank that is gone.
        peer: u32,
        /// What was observed (and the peer's address where known).
        reason: String,
    },
    /// A peer reported that its side of this operation failed, so this side stops waiting.
    #[error("peer rank {peer} failed this operation: {detail}")]
    PeerFailed {
        /// The rank that reported the failure.
        peer: u32,
        /// What the peer reported.
        detail: String,
    },
    /// A rank of this group failed fatally ([`cause`](FatalCause) says how), so the group can
    /// no longer be trusted: this operation and every later one of the group fail on every
    /// rank. Build a new group.
    #[error("{}", group_failed(*peer, *cause, *reporter))]
    GroupFailed {
        /// The rank the failure is about: the lost, silent or misbehaving peer, or the rank whose
        /// own transport failed when no peer was to blame.
        peer: u32,
        /// What kind of failure it was.
        cause: FatalCause,
        /// The rank whose notice brought the news (this rank, when it saw the failure itself).
        reporter: u32,
    },
    /// The transport was aborted with [`Transport::abort`](crate::Transport::abort).
    #[error("transport aborted")]
    Aborted,
    /// Malformed, unexpected or hostile bytes arrived.
    #[error("protocol error from {}: {detail}", peer_name(*peer))]
    Protocol {
        /// The peer that sent them, when known.
        peer: Option<u32>,
        /// What was wrong with them.
        detail: String,
    },
    /// The transport or build cannot do this.
    #[error("unsupported: {what}")]
    Unsupported {
        /// What was asked for.
        what: String,
    },
    /// The caller passed an argument this operation refuses.
    #[error("invalid argument: {what}")]
    InvalidArgument {
        /// Which argument and why.
        what: String,
    },
    /// The configuration (environment, hostfile, builder) is missing or wrong.
    #[error("configuration error: {what}")]
    Config {
        /// What is missing or wrong, naming the variable or file.
        what: String,
    },
    /// An operating-system I/O call failed.
    #[error("i/o error with {}: {source}", peer_name(*peer))]
    Io {
        /// The peer the I/O was for, when there was one.
        peer: Option<u32>,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

/// `tag 7 (1024 bf16 elements, 2048 bytes), tag 9 (3 bytes)`.
fn unreceived_list(unreceived: &[(u32, u64)], dtype: Option<DType>) -> String {
    let one = |&(tag, bytes): &(u32, u64)| match dtype {
        Some(d) if bytes % d.size() as u64 == 0 => {
            format!(
                "tag {tag} ({} {d} elements, {bytes} bytes)",
                bytes / d.size() as u64
            )
        }
        _ => format!("tag {tag} ({bytes} bytes)"),
    };
    unreceived.iter().map(one).collect::<Vec<_>>().join(", ")
}

/// Two lengths in bytes, said in elements of `dtype` when both are whole numbers of them.
/// The text of [`CollectiveError::LengthMismatch`] after `length mismatch`: the rank whose
/// length differs from every other's when the members' `reported` lengths show one (`with
/// rank 2: it passed 1001 f32 elements where ranks 0, 1, 3 passed 1000`), every group of ranks
/// with its length when they show several, else what this rank expected and got from `peer`.
fn mismatch(
    peer: Option<u32>,
    expected: u64,
    got: u64,
    dtype: Option<DType>,
    reported: &[(u32, u64)],
) -> String {
    let groups = length_groups(reported);
    if groups.len() < 2 {
        return format!("{}: {}", with_peer(peer), lengths(expected, got, dtype));
    }
    let unit = |len: u64| match dtype {
        Some(dtype) if len % dtype.size() as u64 == 0 => {
            format!("{} {dtype} elements", len / dtype.size() as u64)
        }
        _ => format!("{len} bytes"),
    };
    // The rank that stands apart, or else (two lengths, two ranks) the peer this rank dealt
    // with, is named first.
    let apart = odd_one(&groups).or_else(|| {
        peer.filter(|&p| groups.len() == 2 && groups.iter().any(|(_, ranks)| ranks == &[p]))
    });
    if let Some(rank) = apart {
        let (odd, rest): (Vec<_>, Vec<_>) = groups.iter().partition(|(_, r)| r == &[rank]);
        if let ([(odd_len, _)], [(len, others)]) = (odd.as_slice(), rest.as_slice()) {
            return format!(
                " with rank {rank}: it passed {} where {} passed {}",
                unit(*odd_len),
                rank_list(others),
                unit(*len)
            );
        }
    }
    let parts: Vec<String> = groups
        .iter()
        .map(|(len, ranks)| format!("{} passed {}", rank_list(ranks), unit(*len)))
        .collect();
    format!(": {}", parts.join(", "))
}

/// The ranks of `reported` grouped by the length they passed, each group's ranks in order,
/// the largest group first (among equals, the smaller length).
fn length_groups(reported: &[(u32, u64)]) -> Vec<(u64, Vec<u32>)> {
    let mut groups: Vec<(u64, Vec<u32>)> = Vec::new();
    for &(rank, len) in reported {
        match groups.iter_mut().find(|(l, _)| *l == len) {
            Some((_, ranks)) => ranks.push(rank),
            None => groups.push((len, vec![rank])),
        }
    }
    for (_, ranks) in &mut groups {
        ranks.sort_unstable();
    }
    groups.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then(a.0.cmp(&b.0)));
    groups
}

/// The one rank whose length differs when every other rank of at least two passed the same.
fn odd_one(groups: &[(u64, Vec<u32>)]) -> Option<u32> {
    match groups {
        [(_, most), (_, odd)] if odd.len() == 1 && most.len() > 1 => Some(odd[0]),
        _ => None,
    }
}

/// `rank 3` or `ranks 0, 1, 3`.
fn rank_list(ranks: &[u32]) -> String {
    let list: Vec<String> = ranks.iter().map(u32::to_string).collect();
    match ranks.len() {
        1 => format!("rank {}", list[0]),
        _ => format!("ranks {}", list.join(", ")),
    }
}

fn lengths(expected: u64, got: u64, dtype: Option<DType>) -> String {
    match dtype {
        Some(dtype) if expected % dtype.size() as u64 == 0 && got % dtype.size() as u64 == 0 => {
            let size = dtype.size() as u64;
            format!(
                "expected {} {dtype} elements, got {} ({expected} and {got} bytes)",
                expected / size,
                got / size
            )
        }
        _ => format!("expected {expected} bytes, got {got}"),
    }
}

/// The text of [`CollectiveError::Deadlock`]: how the wait ended, then the waits, `rank 0
/// waits on rank 1 in barrier #3; rank 1 waits on rank 0 in ...`.
fn deadlock(op: &str, after: Option<Duration>, found_by: u32, waits: &[Waiter]) -> String {
    let list: Vec<String> = waits.iter().map(Waiter::to_string).collect();
    match after {
        Some(after) => format!(
            "{op} timed out after {after:?} in a deadlock: {}",
            list.join("; ")
        ),
        None => format!(
            "{op} ended in a deadlock (found by rank {found_by}): {}",
            list.join("; ")
        ),
    }
}

/// The text of [`CollectiveError::GroupFailed`]: a deadlock involves no single rank, so its
/// notice names the rank that found it rather than a culprit.
fn group_failed(peer: u32, cause: FatalCause, reporter: u32) -> String {
    match cause {
        FatalCause::Deadlock => format!(
            "group unusable after a deadlock (ranks waiting on each other) found by rank {reporter}"
        ),
        _ => format!(
            "group unusable after a fatal failure involving peer rank {peer} ({cause}), reported \
             by rank {reporter}"
        ),
    }
}

/// One rank's wait in a [`CollectiveError::Deadlock`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Waiter {
    /// The waiting rank (a world rank).
    pub rank: u32,
    /// What it waits in, as it says it: `barrier #3`, `recv(from 0, tag 8)`, with the
    /// messages from its peer that wait unreceived under other tags.
    pub waits_in: String,
    /// The world rank it waits on.
    pub waits_on: u32,
}

impl fmt::Display for Waiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rank {} waits on rank {} in {}",
            self.rank, self.waits_on, self.waits_in
        )
    }
}

fn with_peer(peer: Option<u32>) -> String {
    peer.map_or_else(String::new, |rank| format!(" with rank {rank}"))
}

fn peer_name(peer: Option<u32>) -> String {
    match peer {
        Some(rank) => format!("peer rank {rank}"),
        None => "an unknown peer".to_owned(),
    }
}

impl CollectiveError {
    /// The rank whose length differs from every other's among `reported` (world rank, bytes
    /// passed), as [`CollectiveError::LengthMismatch`] names it; `None` when no single rank
    /// stands apart (two ranks, or several groups).
    pub fn odd_length(reported: &[(u32, u64)]) -> Option<u32> {
        odd_one(&length_groups(reported))
    }

    /// Shorthand for [`CollectiveError::InvalidArgument`].
    pub fn invalid(what: impl Into<String>) -> Self {
        Self::InvalidArgument { what: what.into() }
    }

    /// The text [`CollectiveError::Unreceived`] gives its messages (user tag and length in
    /// bytes each), in elements of `dtype` where they are whole numbers of them: `tag 7 (1024
    /// bf16 elements, 2048 bytes)`.
    pub fn describe_unreceived(unreceived: &[(u32, u64)], dtype: Option<DType>) -> String {
        unreceived_list(unreceived, dtype)
    }

    /// Shorthand for [`CollectiveError::Config`].
    pub fn config(what: impl Into<String>) -> Self {
        Self::Config { what: what.into() }
    }

    /// Shorthand for [`CollectiveError::Unsupported`].
    pub fn unsupported(what: impl Into<String>) -> Self {
        Self::Unsupported { what: what.into() }
    }

    /// Shorthand for [`CollectiveError::Protocol`].
    pub fn protocol(peer: Option<u32>, detail: impl Into<String>) -> Self {
        Self::Protocol {
            peer,
            detail: detail.into(),
        }
    }

    /// Whether this error means the group can no longer be trusted (see the module docs).
    pub fn is_fatal(&self) -> bool {
        self.fatal_cause().is_some()
    }

    /// The kind of fatal failure this error is, or `None` when it describes one call only (see
    /// the module docs).
    pub fn fatal_cause(&self) -> Option<FatalCause> {
        match self {
            Self::PeerLost { .. } => Some(FatalCause::PeerLost),
            Self::Timeout { .. } | Self::Unreceived { .. } => Some(FatalCause::Timeout),
            Self::Deadlock { .. } => Some(FatalCause::Deadlock),
            Self::Aborted => Some(FatalCause::Aborted),
            Self::Protocol { .. } => Some(FatalCause::Protocol),
            Self::Io { .. } => Some(FatalCause::Io),
            Self::GroupFailed { cause, .. } => Some(*cause),
            Self::LengthMismatch { .. }
            | Self::OutOfBounds { .. }
            | Self::UnknownRank { .. }
            | Self::PeerFailed { .. }
            | Self::Unsupported { .. }
            | Self::InvalidArgument { .. }
            | Self::Config { .. } => None,
        }
    }
}

/// The kinds of failure after which a group can no longer be trusted: the fatal variants of
/// [`CollectiveError`], as a group-wide failure notice carries them
/// ([`Failure::GroupFailed`](crate::Failure::GroupFailed)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FatalCause {
    /// A peer closed, crashed or reset ([`CollectiveError::PeerLost`]).
    PeerLost,
    /// A wait outlasted the operation timeout ([`CollectiveError::Timeout`]).
    Timeout,
    /// A transport was aborted ([`CollectiveError::Aborted`]).
    Aborted,
    /// Malformed or unexpected bytes arrived ([`CollectiveError::Protocol`]).
    Protocol,
    /// An operating-system I/O call failed ([`CollectiveError::Io`]).
    Io,
    /// The survivors of a failure declared the rank dead and went on without it (see
    /// [`Transport::exclude_peer`](crate::Transport::exclude_peer)): it was unreachable or did
    /// not answer within the operation timeout.
    Excluded,
    /// Ranks of the group wait on each other ([`CollectiveError::Deadlock`]).
    Deadlock,
}

impl FatalCause {
    /// The cause's code in a failure notice on the wire.
    pub const fn code(self) -> u8 {
        match self {
            FatalCause::PeerLost => 1,
            FatalCause::Timeout => 2,
            FatalCause::Aborted => 3,
            FatalCause::Protocol => 4,
            FatalCause::Io => 5,
            FatalCause::Excluded => 6,
            FatalCause::Deadlock => 7,
        }
    }

    /// The cause [`FatalCause::code`] encoded, or `None` for a code this build does not know.
    pub const fn from_code(code: u8) -> Option<FatalCause> {
        match code {
            1 => Some(FatalCause::PeerLost),
            2 => Some(FatalCause::Timeout),
            3 => Some(FatalCause::Aborted),
            4 => Some(FatalCause::Protocol),
            5 => Some(FatalCause::Io),
            6 => Some(FatalCause::Excluded),
            7 => Some(FatalCause::Deadlock),
            _ => None,
        }
    }
}

impl fmt::Display for FatalCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FatalCause::PeerLost => "peer lost",
            FatalCause::Timeout => "timed out",
            FatalCause::Aborted => "transport aborted",
            FatalCause::Protocol => "protocol error",
            FatalCause::Io => "i/o error",
            FatalCause::Excluded => "declared dead by the survivors",
            FatalCause::Deadlock => "ranks waiting on each other",
        })
    }
}

/// Shorthand for results of this crate.
pub type Result<T, E = CollectiveError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    fn mismatch_text(peer: u32, lengths: &[(u32, u64)]) -> String {
        CollectiveError::LengthMismatch {
            op: "all_reduce",
            peer: Some(peer),
            expected: 16,
            got: 20,
            dtype: Some(DType::F32),
            lengths: lengths.to_vec(),
        }
        .to_string()
    }

    /// The members' lengths name the rank that stands apart, whichever rank reports; two
    /// ranks name each other; several groups are listed; without them, this rank's view.
    #[test]
    fn a_length_mismatch_names_the_rank_whose_length_differs() {
        let four = [(0, 4000), (1, 4000), (2, 4004), (3, 4000)];
        for peer in [1, 3] {
            assert_eq!(
                mismatch_text(peer, &four),
                "all_reduce: length mismatch with rank 2: it passed 1001 f32 elements where \
                 ranks 0, 1, 3 passed 1000 f32 elements"
            );
        }
        assert_eq!(CollectiveError::odd_length(&four), Some(2));
        let two = [(0, 4000), (1, 4004)];
        assert_eq!(
            mismatch_text(0, &two),
            "all_reduce: length mismatch with rank 0: it passed 1000 f32 elements where rank 1 \
             passed 1001 f32 elements"
        );
        assert_eq!(CollectiveError::odd_length(&two), None);
        let split = [(0, 4000), (1, 4000), (2, 4004), (3, 4004)];
        assert_eq!(
            mismatch_text(1, &split),
            "all_reduce: length mismatch: ranks 0, 1 passed 1000 f32 elements, ranks 2, 3 \
             passed 1001 f32 elements"
        );
        assert_eq!(
            mismatch_text(1, &[(0, 16)]),
            "all_reduce: length mismatch with rank 1: expected 4 f32 elements, got 5 (16 and \
             20 bytes)"
        );
    }
}
