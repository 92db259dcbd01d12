//! Finding the rank that is really unresponsive after a timeout: the wire format of the
//! "whom do you wait on?" probe and its answer, and the walk along the chain of waits.
//!
//! When a rank times out waiting on peer `p`, `p` may itself be waiting: in a ring, a stopped
//! rank makes its successor wait, whose successor waits on it, and so on, and whichever rank
//! times out first would otherwise blame the neighbour it waited on. So before it names a
//! culprit, the rank probes `p` under the group's reserved probe phase. Every wait of a group
//! answers probes between its slices with the rank it waits on (a rank that walks a chain
//! answers with the rank it timed out on), so the prober follows the answers until a rank does
//! not answer within [`probe_window`]: that rank is the culprit. A chain that comes back to a
//! rank already visited (ranks waiting on one another, as after mismatched operations) blames
//! the rank the prober waited on.
//!
//! The state of the walk ([`WaitChain`]) and the encoding are plain code with no I/O; the
//! group's failure watch drives them over the transport.

use std::time::Duration;

use crate::{CollectiveError, Result, Tag};

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

/// The first byte of a probe.
const PROBE_KIND: u8 = 1;
/// The first byte of an answer.
const ANSWER_KIND: u8 = 2;
/// Encoded length of an answer: its kind and the world rank the answering rank waits on, a
/// little-endian `u32`.
pub(crate) const ANSWER_LEN: usize = 5;

/// How long a prober waits for a rank's answer before it counts that rank as unresponsive: a
/// tenth of the operation timeout, at least 100 ms (a waiting rank answers within one wait
/// slice of about 10 ms, and a loaded machine may need several) and at most 2 s (the walk
/// comes on top of a timeout that already passed).
pub(crate) fn probe_window(op_timeout: Duration) -> Duration {
    (op_timeout / 10).clamp(Duration::from_millis(100), Duration::from_secs(2))
}

/// A probe. It carries nothing else: any answer from the probed rank tells that it is alive
/// and whom it waits on now, whichever of this rank's probes it answers.
pub(crate) const PROBE: [u8; 1] = [PROBE_KIND];

/// Checks a probe received from world rank `peer`.
pub(crate) fn decode_probe(peer: u32, bytes: &[u8]) -> Result<()> {
    if bytes == PROBE {
        Ok(())
    } else {
        Err(malformed(peer, "wait probe", bytes.len()))
    }
}

/// The answer to a probe: this rank waits on world rank `waits_on`.
pub(crate) fn encode_answer(waits_on: u32) -> [u8; ANSWER_LEN] {
    let mut out = [0u8; ANSWER_LEN];
    out[0] = ANSWER_KIND;
    out[1..].copy_from_slice(&waits_on.to_le_bytes());
    out
}

/// The awaited rank of an answer received from world rank `peer`.
pub(crate) fn decode_answer(peer: u32, bytes: &[u8]) -> Result<u32> {
    match *bytes {
        [ANSWER_KIND, w0, w1, w2, w3] => Ok(u32::from_le_bytes([w0, w1, w2, w3])),
        _ => Err(malformed(peer, "wait probe answer", bytes.len())),
    }
}

fn malformed(peer: u32, what: &str, len: usize) -> CollectiveError {
    CollectiveError::protocol(Some(peer), format!("malformed {what} of {len} bytes"))
}

/// Where a walk along a chain of waits is: the ranks probed so far, in order.
#[derive(Debug)]
pub(crate) struct WaitChain {
    /// This rank, which the chain must not come back to.
    me: u32,
    /// The probed ranks; the first is the rank this rank timed out on, the last the one
    /// being probed now.
    chain: Vec<u32>,
}

/// What the walk does after an answer.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Probe this rank next.
    Probe(u32),
    /// The walk is over: this rank is the culprit.
    Culprit(u32),
}

impl WaitChain {
    /// The walk of rank `me`, which timed out waiting on world rank `first`.
    pub(crate) fn new(me: u32, first: u32) -> Self {
        WaitChain {
            me,
            chain: vec![first],
        }
    }

    /// The rank probed now.
    pub(crate) fn current(&self) -> u32 {
        self.chain.last().copied().unwrap_or(self.me)
    }

    /// The rank probed now answered that it waits on `next`, a member of the group: probe
    /// `next`, unless the chain closes on itself (then blame the first rank, for lack of a
    /// rank that is not waiting).
    pub(crate) fn answered(&mut self, next: u32) -> Step {
        if next == self.me || self.chain.contains(&next) {
            return Step::Culprit(self.chain[0]);
        }
        self.chain.push(next);
        Step::Probe(next)
    }

    /// The chain for a log line: `rank 3 waits on rank 2, which waits on rank 1`.
    pub(crate) fn describe(&self) -> String {
        let mut text = String::new();
        for (index, rank) in self.chain.iter().enumerate() {
            match index {
                0 => text.push_str(&format!("rank {rank}")),
                1 => text.push_str(&format!(" waits on rank {rank}")),
                _ => text.push_str(&format!(", which waits on rank {rank}")),
            }
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_and_answers_round_trip_and_bad_bytes_are_refused() {
        assert!(decode_probe(1, &PROBE).is_ok());
        assert_eq!(
            decode_answer(1, &encode_answer(u32::MAX)).unwrap(),
            u32::MAX
        );
        let answer = encode_answer(2);
        for bad in [&[][..], &answer[..], &[PROBE_KIND; 2], &[0]] {
            assert!(decode_probe(1, bad).is_err(), "{bad:?}");
        }
        for bad in [
            &[][..],
            &answer[..4],
            &PROBE[..],
            &[ANSWER_KIND; 6],
            &[3, 0, 0, 0, 0],
        ] {
            assert!(
                matches!(
                    decode_answer(1, bad),
                    Err(CollectiveError::Protocol { peer: Some(1), .. })
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn the_walk_follows_answers_and_stops_at_a_cycle() {
        let mut walk = WaitChain::new(0, 3);
        assert_eq!(walk.answered(2), Step::Probe(2));
        assert_eq!(walk.answered(1), Step::Probe(1));
        assert_eq!(walk.current(), 1);
        assert_eq!(
            walk.describe(),
            "rank 3 waits on rank 2, which waits on rank 1"
        );
        // Rank 1 waits on rank 3, which is already in the chain: nobody here is silent.
        assert_eq!(walk.answered(3), Step::Culprit(3));
        let mut walk = WaitChain::new(0, 1);
        assert_eq!(walk.answered(0), Step::Culprit(1));
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
