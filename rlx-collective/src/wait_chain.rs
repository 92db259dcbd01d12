//! Finding the rank that is really unresponsive after a timeout: the wire format of the
//! "whom do you wait on?" probe and its answer, and the walk along the chain of waits.
//!
//! When a rank times out waiting on peer `p`, `p` may itself be waiting: in a ring, a stopped
//! rank makes its successor wait, whose successor waits on it, and so on, and whichever rank
//! times out first would otherwise blame the neighbour it waited on. So before it names a
//! culprit, the rank probes `p` under the group's reserved probe phase. Every wait of a group
//! answers probes between its slices with the rank it waits on and what it waits in (a rank
//! that walks a chain answers with its own timed-out wait), so the prober follows the answers
//! until a rank does not answer within [`probe_window`]: that rank is the culprit. A chain
//! that comes back to a rank already visited is a deadlock — ranks waiting on one another, as
//! after a receive under the wrong tag or mismatched operations — and no rank is blamed: the
//! error names every wait of the cycle.
//!
//! The state of the walk ([`WaitChain`]) and the encoding are plain code with no I/O; the
//! group's failure watch drives them over the transport.

use std::time::Duration;

use std::fmt;

use crate::{CollectiveError, DType, Result, Tag, Waiter};

/// The phase of every collective group's tag space (sequence number 0) that carries probes.
pub(crate) const PROBE_PHASE: u16 = u16::MAX - 1;
/// The phase (sequence number 0) that carries the answers to probes.
pub(crate) const ANSWER_PHASE: u16 = u16::MAX - 2;

/// The tag of `group`'s probes.
pub(crate) const fn probe_tag(group: u16) -> Tag {
    Tag::op(group, 0, PROBE_PHASE)
}

/// The tag of the answers to `group`'s probes.
pub(crate) const fn answer_tag(group: u16) -> Tag {
    Tag::op(group, 0, ANSWER_PHASE)
}

/// What a wait of a group is, as a rank tells those that probe it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Doing {
    /// Operation `seq` of the group, a collective named `op`.
    Collective {
        /// The operation's name (`"all_reduce"`).
        op: &'static str,
        /// Its sequence number in the group.
        seq: u32,
    },
    /// A receive from group rank `from` under user tag `tag`, of `dtype` elements.
    Recv {
        /// The group rank it receives from.
        from: u32,
        /// The user tag.
        tag: u32,
        /// The element type it expects.
        dtype: DType,
    },
    /// A send to group rank `to` under user tag `tag`.
    Send {
        /// The group rank it sends to.
        to: u32,
        /// The user tag.
        tag: u32,
    },
    /// The group's own upkeep, no call of the user's.
    Upkeep,
}

impl Doing {
    /// The operation's name, for errors (`"all_reduce"`, `"recv"`).
    pub(crate) fn op(self) -> &'static str {
        match self {
            Doing::Collective { op, .. } => op,
            Doing::Recv { .. } => "recv",
            Doing::Send { .. } => "send",
            Doing::Upkeep => "upkeep",
        }
    }
}

impl fmt::Display for Doing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Doing::Collective { op, seq } => write!(f, "{op} #{seq}"),
            Doing::Recv { from, tag, .. } => write!(f, "recv(from {from}, tag {tag})"),
            Doing::Send { to, tag } => write!(f, "send(to {to}, tag {tag})"),
            Doing::Upkeep => f.write_str("the group's upkeep"),
        }
    }
}

/// The first byte of a probe.
const PROBE_KIND: u8 = 1;
/// The first byte of an answer.
const ANSWER_KIND: u8 = 2;
/// The longest description of a wait on the wire, in bytes (its length travels as one byte).
const MAX_WAITS_IN: usize = u8::MAX as usize;

/// How long a prober waits for a rank's answer before it counts that rank as unresponsive: a
/// tenth of the operation timeout, at least 100 ms (a waiting rank answers within one wait
/// slice of about 10 ms, and a loaded machine may need several) and at most 2 s (the walk
/// comes on top of a timeout that already passed).
pub(crate) fn probe_window(op_timeout: Duration) -> Duration {
    (op_timeout / 10).clamp(Duration::from_millis(100), Duration::from_secs(2))
}

/// A probe from a rank that waits on world rank `waits_on` in `waits_in`. The prober says
/// what it waits in, so that the probed rank can name the whole cycle of a deadlock even
/// when the prober has already given up by the time it would answer the probed rank's probe.
pub(crate) fn encode_probe(waits_on: u32, waits_in: &str) -> Vec<u8> {
    encode(PROBE_KIND, waits_on, waits_in)
}

/// The answer to a probe: this rank waits on world rank `waits_on` in `waits_in`.
pub(crate) fn encode_answer(waits_on: u32, waits_in: &str) -> Vec<u8> {
    encode(ANSWER_KIND, waits_on, waits_in)
}

/// A probe received from world rank `peer`: what `peer` waits in and on whom.
pub(crate) fn decode_probe(peer: u32, bytes: &[u8]) -> Result<Waiter> {
    decode(PROBE_KIND, peer, bytes).ok_or_else(|| malformed(peer, "wait probe", bytes.len()))
}

/// An answer received from world rank `peer`: what `peer` waits in and on whom.
pub(crate) fn decode_answer(peer: u32, bytes: &[u8]) -> Result<Waiter> {
    decode(ANSWER_KIND, peer, bytes)
        .ok_or_else(|| malformed(peer, "wait probe answer", bytes.len()))
}

/// Kind, awaited world rank (little-endian `u32`), the length of the description (one byte)
/// and the description, cut at a character boundary to fit.
fn encode(kind: u8, waits_on: u32, waits_in: &str) -> Vec<u8> {
    let mut end = waits_in.len().min(MAX_WAITS_IN);
    while !waits_in.is_char_boundary(end) {
        end -= 1;
    }
    let text = &waits_in.as_bytes()[..end];
    let mut out = Vec::with_capacity(6 + text.len());
    out.push(kind);
    out.extend_from_slice(&waits_on.to_le_bytes());
    out.push(text.len() as u8);
    out.extend_from_slice(text);
    out
}

fn decode(kind: u8, peer: u32, bytes: &[u8]) -> Option<Waiter> {
    let (&[found, w0, w1, w2, w3, len], text) = bytes.split_first_chunk::<6>()?;
    if found != kind || text.len() != usize::from(len) {
        return None;
    }
    Some(Waiter {
        rank: peer,
        waits_in: std::str::from_utf8(text).ok()?.to_owned(),
        waits_on: u32::from_le_bytes([w0, w1, w2, w3]),
    })
}

fn malformed(peer: u32, what: &str, len: usize) -> CollectiveError {
    CollectiveError::protocol(Some(peer), format!("malformed {what} of {len} bytes"))
}

/// Where a walk along a chain of waits is: this rank's own wait and the answers so far.
#[derive(Debug)]
pub(crate) struct WaitChain {
    /// This rank's wait: on the rank it timed out on, the first one probed.
    me: Waiter,
    /// The probed ranks' answers, in order; the rank probed now is the one the last answer
    /// waits on.
    answers: Vec<Waiter>,
}

/// What the walk does after an answer.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Probe this rank next.
    Probe(u32),
    /// The chain closed on itself: ranks wait on each other. The waits from this rank's own
    /// to the last answer, which waits on a rank already in the chain.
    Deadlock(Vec<Waiter>),
}

impl WaitChain {
    /// The walk of a rank whose wait `me` timed out.
    pub(crate) fn new(me: Waiter) -> Self {
        WaitChain {
            me,
            answers: Vec::new(),
        }
    }

    /// The rank probed now.
    pub(crate) fn current(&self) -> u32 {
        self.answers.last().unwrap_or(&self.me).waits_on
    }

    /// The rank probed now (`said.rank`) answered what it waits in and on whom: probe that
    /// rank next, unless the chain closes on itself.
    pub(crate) fn answered(&mut self, said: Waiter) -> Step {
        let next = said.waits_on;
        self.answers.push(said);
        let closes = next == self.me.rank || self.answers.iter().any(|answer| answer.rank == next);
        if closes {
            let mut waits = vec![self.me.clone()];
            waits.extend(self.answers.iter().cloned());
            return Step::Deadlock(waits);
        }
        Step::Probe(next)
    }

    /// The chain for a log line: `rank 3 waits on rank 2, which waits on rank 1`.
    pub(crate) fn describe(&self) -> String {
        let mut text = format!("rank {}", self.me.waits_on);
        for (index, answer) in self.answers.iter().enumerate() {
            let joint = if index == 0 {
                " waits on"
            } else {
                ", which waits on"
            };
            text.push_str(&format!("{joint} rank {}", answer.waits_on));
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiter(rank: u32, waits_in: &str, waits_on: u32) -> Waiter {
        Waiter {
            rank,
            waits_in: waits_in.to_owned(),
            waits_on,
        }
    }

    #[test]
    fn probes_and_answers_round_trip_and_bad_bytes_are_refused() {
        let probe = encode_probe(3, "barrier #2");
        assert_eq!(decode_probe(1, &probe).unwrap(), waiter(1, "barrier #2", 3));
        let answer = encode_answer(u32::MAX, "recv(from 0, tag 8)");
        assert_eq!(
            decode_answer(2, &answer).unwrap(),
            waiter(2, "recv(from 0, tag 8)", u32::MAX)
        );
        let mut bad_utf8 = encode_answer(0, "ab");
        *bad_utf8.last_mut().unwrap() = 0xff;
        let mut long = encode_answer(0, "ab");
        long.push(b'c');
        for bad in [&[][..], &answer[..5], &probe[..], &long, &bad_utf8, &[3; 6]] {
            assert!(
                matches!(
                    decode_answer(1, bad),
                    Err(CollectiveError::Protocol { peer: Some(1), .. })
                ),
                "{bad:?}"
            );
        }
        assert!(decode_probe(1, &answer).is_err());
    }

    #[test]
    fn a_long_description_is_cut_at_a_character_boundary() {
        let text = "é".repeat(200);
        let decoded = decode_probe(0, &encode_probe(1, &text)).unwrap();
        assert_eq!(decoded.waits_in.len(), 254);
        assert!(text.starts_with(&decoded.waits_in));
    }

    #[test]
    fn the_walk_follows_answers_and_a_cycle_is_a_deadlock() {
        let mut walk = WaitChain::new(waiter(0, "all_reduce #4", 3));
        assert_eq!(walk.current(), 3);
        assert_eq!(
            walk.answered(waiter(3, "recv(from 2, tag 1)", 2)),
            Step::Probe(2)
        );
        assert_eq!(walk.answered(waiter(2, "barrier #5", 1)), Step::Probe(1));
        assert_eq!(walk.current(), 1);
        assert_eq!(
            walk.describe(),
            "rank 3 waits on rank 2, which waits on rank 1"
        );
        // Rank 1 waits on rank 3, which is already in the chain: nobody here is silent.
        let Step::Deadlock(waits) = walk.answered(waiter(1, "barrier #5", 3)) else {
            panic!("a cycle");
        };
        assert_eq!(waits.len(), 4);
        assert_eq!(waits[0], waiter(0, "all_reduce #4", 3));
        assert_eq!(waits[3], waiter(1, "barrier #5", 3));
        let mut walk = WaitChain::new(waiter(0, "barrier #1", 1));
        assert_eq!(
            walk.answered(waiter(1, "recv(from 0, tag 8)", 0)),
            Step::Deadlock(vec![
                waiter(0, "barrier #1", 1),
                waiter(1, "recv(from 0, tag 8)", 0)
            ])
        );
    }

    #[test]
    fn the_window_is_a_tenth_of_the_timeout_within_bounds() {
        assert_eq!(
            probe_window(Duration::from_secs(3)),
            Duration::from_millis(300)
        );
        assert_eq!(
            probe_window(Duration::from_millis(10)),
            Duration::from_millis(100)
        );
        assert_eq!(
            probe_window(Duration::from_secs(300)),
            Duration::from_secs(2)
        );
    }
}
