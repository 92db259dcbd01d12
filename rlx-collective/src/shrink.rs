//! The agreement behind [`ProcessGroup::shrink`](crate::ProcessGroup::shrink): the members of
//! a group that may have lost ranks agree on who is left, and every survivor leaves with the
//! same new group.
//!
//! It is a coordinator agreement with failover, run on the transport alone:
//! - Every rank keeps a set of *suspects*: members it has seen lost (a receive or send failed
//!   fatally), that did not answer in time, or that another member suspects. A suspect is
//!   excluded at the transport at once ([`Transport::exclude_peer`]), for good: its later bytes
//!   can never reach this rank, and it learns that it was excluded. Suspicion only grows, and
//!   it spreads: every proposal carries the sender's suspects.
//! - The coordinator is the lowest member nobody in view suspects. Every other rank sends it a
//!   *proposal* (its group-id proposal and its suspects). The coordinator waits for a proposal
//!   from every member it does not suspect, up to the operation timeout per member, then
//!   *decides*: the members it does not suspect, in old rank order, and the largest group-id
//!   proposal among them. It sends the decision to every member of it.
//! - A rank that receives a decision relays it to every other member of it before it leaves,
//!   so the decision reaches every survivor even when the coordinator dies while sending it,
//!   and excludes every member the decision leaves out. A rank that finds itself left out of a
//!   decision, or excluded by a member, fails with
//!   [`CollectiveError::GroupFailed`] naming itself ([`FatalCause::Excluded`]).
//! - While it collects, the coordinator tells the members that proposed to it that it is
//!   still at work, a few times per operation timeout. A rank whose coordinator is lost, or
//!   silent for a whole operation timeout, suspects it and proposes to the next one. A new
//!   coordinator that hears a relayed decision adopts it.
//!
//! What it guarantees: it ends on every rank (each wait is bounded and suspicion only grows);
//! every rank that leaves with a group leaves with the same members and id, unless a live rank
//! was falsely suspected, and a rank that is excluded fails instead of forming a group of its
//! own. A member that dies after the decision was made is still in the new group; the group's
//! first operation then fails with `GroupFailed` naming it, and the survivors shrink again.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::split::group_id_of;
use crate::{CollectiveError, FatalCause, Result, Tag, Transport};

/// The phase of a group's tag space that carries its shrink agreement (the sequence number is
/// the attempt); below the failure-notice and wait-chain phases, far above the phases
/// operations use.
pub(crate) const SHRINK_PHASE: u16 = u16::MAX - 3;

/// How long one blocking look for agreement messages lasts before the rank looks at every
/// member again.
const SLICE: Duration = Duration::from_millis(2);

/// Message kinds on the wire.
const PROPOSE: u8 = 1;
const DECIDE: u8 = 2;
const COLLECTING: u8 = 3;

/// How many times per operation timeout a collecting coordinator tells the members that
/// proposed to it that it is alive.
const BEATS_PER_TIMEOUT: u32 = 4;

/// What the survivors agreed on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Decision {
    /// The new group's id.
    pub(crate) group_id: u16,
    /// World ranks of the new group's members, in old rank order.
    pub(crate) members: Vec<u32>,
}

/// One agreement message.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Message {
    /// A member's group-id proposal and the members it suspects.
    Propose { proposal: u32, suspects: Vec<u32> },
    /// The coordinator's decision (or a member's relay of it).
    Decide(Decision),
    /// The coordinator is alive and still collecting proposals.
    Collecting,
}

impl Message {
    fn encode(&self) -> Vec<u8> {
        let (kind, head, ranks): (u8, u32, &[u32]) = match self {
            Message::Propose { proposal, suspects } => (PROPOSE, *proposal, suspects),
            Message::Decide(decision) => (DECIDE, u32::from(decision.group_id), &decision.members),
            Message::Collecting => (COLLECTING, 0, &[]),
        };
        let mut out = Vec::with_capacity(9 + 4 * ranks.len());
        out.push(kind);
        out.extend_from_slice(&head.to_le_bytes());
        out.extend_from_slice(&(ranks.len() as u32).to_le_bytes());
        for rank in ranks {
            out.extend_from_slice(&rank.to_le_bytes());
        }
        out
    }

    /// Decodes a message from world rank `peer`; every rank it names must be one of `members`
    /// and appear once, and a decision must list them in group order.
    fn decode(peer: u32, bytes: &[u8], members: &[u32]) -> Result<Message> {
        let bad = |what: &str| {
            CollectiveError::protocol(Some(peer), format!("shrink agreement message: {what}"))
        };
        let word = |i: usize| -> Option<u32> {
            let start = 1 + 4 * i;
            bytes
                .get(start..start + 4)
                .and_then(|b| b.first_chunk::<4>())
                .map(|b| u32::from_le_bytes(*b))
        };
        let (Some(&kind), Some(head), Some(count)) = (bytes.first(), word(0), word(1)) else {
            return Err(bad("shorter than its header"));
        };
        if count as usize > members.len() || bytes.len() != 9 + 4 * count as usize {
            return Err(bad(&format!(
                "{} bytes for {count} ranks in a group of {}",
                bytes.len(),
                members.len()
            )));
        }
        let ranks: Vec<u32> = (0..count as usize).filter_map(|i| word(2 + i)).collect();
        let positions = ranks
            .iter()
            .map(|r| members.iter().position(|m| m == r))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| bad("names a rank outside the group"))?;
        if positions.windows(2).any(|w| w[0] >= w[1]) && kind == DECIDE {
            return Err(bad("decision not in group order"));
        }
        let mut seen = positions.clone();
        seen.sort_unstable();
        if seen.windows(2).any(|w| w[0] == w[1]) {
            return Err(bad("names a rank twice"));
        }
        match kind {
            PROPOSE => Ok(Message::Propose {
                proposal: head,
                suspects: ranks,
            }),
            DECIDE if !ranks.is_empty() => Ok(Message::Decide(Decision {
                group_id: group_id_of("shrink", head)?,
                members: ranks,
            })),
            DECIDE => Err(bad("empty decision")),
            COLLECTING if ranks.is_empty() && head == 0 => Ok(Message::Collecting),
            COLLECTING => Err(bad("a heartbeat with a body")),
            _ => Err(bad(&format!("unknown kind {kind}"))),
        }
    }
}

/// The error of a rank the survivors left out; `by` is the member that said so.
fn excluded(me: u32, by: u32) -> CollectiveError {
    CollectiveError::GroupFailed {
        peer: me,
        cause: FatalCause::Excluded,
        reporter: by,
    }
}

/// One rank's side of the agreement; see the module docs.
pub(crate) struct Agreement<'a> {
    transport: &'a dyn Transport,
    /// World ranks of the old group, in group order.
    members: &'a [u32],
    /// This rank's world rank.
    me: u32,
    tag: Tag,
    timeout: Duration,
    /// This rank's group-id proposal.
    proposal: u32,
    suspects: Vec<u32>,
    /// Proposals heard, by world rank (what a coordinator collects).
    heard: BTreeMap<u32, u32>,
    /// The coordinator this rank proposed to, and when it last heard from it (or proposed).
    proposed_to: Option<(u32, Instant)>,
    /// When this rank became coordinator.
    coordinating_since: Option<Instant>,
    /// When this rank, as coordinator, last told the members that it is alive.
    last_beat: Option<Instant>,
}

impl<'a> Agreement<'a> {
    /// Rank `me` (a world rank, one of `members`) of group `group`, attempt `attempt`,
    /// proposing group id `proposal`; members silent for `timeout` count as dead.
    pub(crate) fn new(
        transport: &'a dyn Transport,
        members: &'a [u32],
        group: u16,
        attempt: u32,
        proposal: u32,
        timeout: Duration,
    ) -> Self {
        Agreement {
            transport,
            members,
            me: transport.rank(),
            tag: Tag::op(group, attempt, SHRINK_PHASE),
            timeout,
            proposal,
            suspects: Vec::new(),
            heard: BTreeMap::new(),
            proposed_to: None,
            coordinating_since: None,
            last_beat: None,
        }
    }

    /// Runs the agreement to its end on this rank.
    pub(crate) fn run(mut self) -> Result<Decision> {
        if !self.members.contains(&self.me) {
            return Err(CollectiveError::invalid(format!(
                "shrink: rank {} is not a member of the group",
                self.me
            )));
        }
        loop {
            let coordinator = self.coordinator();
            if coordinator == self.me {
                let since = *self.coordinating_since.get_or_insert_with(Instant::now);
                if self.waiting().is_empty() {
                    return self.decide();
                }
                if since.elapsed() >= self.timeout {
                    for peer in self.waiting() {
                        tracing::warn!(peer, "shrink: no proposal within the timeout");
                        self.suspect(peer)?;
                    }
                    continue;
                }
                self.beat()?;
            } else {
                match self.proposed_to {
                    Some((to, since)) if to == coordinator => {
                        if since.elapsed() >= self.timeout {
                            tracing::warn!(coordinator, "shrink: the coordinator is silent");
                            self.suspect(coordinator)?;
                            continue;
                        }
                    }
                    _ => {
                        let proposal = Message::Propose {
                            proposal: self.proposal,
                            suspects: self.suspects.clone(),
                        };
                        self.proposed_to = Some((coordinator, Instant::now()));
                        if let Err(error) = self.send(coordinator, &proposal) {
                            self.on_peer_error(coordinator, error)?;
                            continue;
                        }
                    }
                }
            }
            if let Some(decision) = self.look(coordinator)? {
                return Ok(decision);
            }
        }
    }

    /// As coordinator: tells the members that proposed that it is alive, when it is time to.
    fn beat(&mut self) -> Result<()> {
        let period = self.timeout / BEATS_PER_TIMEOUT;
        if self.last_beat.is_some_and(|at| at.elapsed() < period) {
            return Ok(());
        }
        self.last_beat = Some(Instant::now());
        let proposed: Vec<u32> = self.heard.keys().copied().collect();
        for peer in proposed {
            if let Err(error) = self.send(peer, &Message::Collecting) {
                self.on_peer_error(peer, error)?;
            }
        }
        Ok(())
    }

    /// The lowest member this rank does not suspect (this rank at the latest).
    fn coordinator(&self) -> u32 {
        self.members
            .iter()
            .copied()
            .find(|m| !self.suspects.contains(m))
            .unwrap_or(self.me)
    }

    /// The members a coordinator still waits for.
    fn waiting(&self) -> Vec<u32> {
        self.live_others()
            .filter(|m| !self.heard.contains_key(m))
            .collect()
    }

    /// The members other than this rank that it does not suspect.
    fn live_others(&self) -> impl Iterator<Item = u32> + '_ {
        self.members
            .iter()
            .copied()
            .filter(|&m| m != self.me && !self.suspects.contains(&m))
    }

    fn send(&self, to: u32, message: &Message) -> Result<()> {
        self.transport
            .send_message(to, self.tag, &[&message.encode()])
    }

    /// Suspects `peer` for good and excludes it at the transport.
    fn suspect(&mut self, peer: u32) -> Result<()> {
        if peer == self.me || self.suspects.contains(&peer) {
            return Ok(());
        }
        self.suspects.push(peer);
        self.heard.remove(&peer);
        self.transport.exclude_peer(peer)
    }

    /// Handles a failed exchange with `peer`: an exclusion notice ends this rank's part, an
    /// abort is returned, anything else fatal makes `peer` a suspect.
    fn on_peer_error(&mut self, peer: u32, error: CollectiveError) -> Result<()> {
        if self.transport.excluded_by(peer) {
            return Err(excluded(self.me, peer));
        }
        match error {
            CollectiveError::Aborted => Err(error),
            CollectiveError::GroupFailed {
                cause: FatalCause::Excluded,
                reporter,
                ..
            } => Err(excluded(self.me, reporter)),
            error if error.is_fatal() => {
                tracing::warn!(peer, %error, "shrink: suspecting a member");
                self.suspect(peer)
            }
            error => Err(error),
        }
    }

    /// Looks once at every live member without waiting, then waits a slice on `focus` (the
    /// coordinator, or for a coordinator the first member it waits for); returns a decision
    /// once one is in.
    fn look(&mut self, coordinator: u32) -> Result<Option<Decision>> {
        let focus = if coordinator == self.me {
            self.waiting().first().copied()
        } else {
            Some(coordinator)
        };
        let peers: Vec<u32> = self.live_others().collect();
        for peer in peers {
            if self.suspects.contains(&peer) {
                continue;
            }
            let wait = if Some(peer) == focus {
                SLICE
            } else {
                Duration::ZERO
            };
            match self.transport.recv_message(peer, self.tag, wait) {
                Ok(None) => {}
                Ok(Some(bytes)) => {
                    let message = Message::decode(peer, &bytes, self.members)?;
                    if let Some(decision) = self.on_message(peer, message)? {
                        return Ok(Some(decision));
                    }
                }
                Err(error) => self.on_peer_error(peer, error)?,
            }
        }
        Ok(None)
    }

    fn on_message(&mut self, from: u32, message: Message) -> Result<Option<Decision>> {
        match message {
            Message::Propose { proposal, suspects } => {
                self.heard.insert(from, proposal);
                for peer in suspects {
                    self.suspect(peer)?;
                }
                Ok(None)
            }
            Message::Decide(decision) => self.adopt(from, decision).map(Some),
            Message::Collecting => {
                if let Some((to, heard)) = &mut self.proposed_to {
                    if *to == from {
                        *heard = Instant::now();
                    }
                }
                Ok(None)
            }
        }
    }

    /// Leaves with `decision` (received from `from`): relays it, excludes whom it leaves out.
    fn adopt(&mut self, from: u32, decision: Decision) -> Result<Decision> {
        if !decision.members.contains(&self.me) {
            return Err(excluded(self.me, from));
        }
        let relay = Message::Decide(decision.clone());
        for &peer in &decision.members {
            if peer != self.me && peer != from {
                // Best effort: a member that cannot be reached fails in the new group's
                // first operation instead.
                let _ = self.send(peer, &relay);
            }
        }
        for &peer in self.members {
            if !decision.members.contains(&peer) {
                self.suspect(peer)?;
            }
        }
        tracing::info!(group = decision.group_id, members = ?decision.members, "shrink: decided");
        Ok(decision)
    }

    /// The coordinator's decision: every member it does not suspect, the largest proposal.
    fn decide(&mut self) -> Result<Decision> {
        let members: Vec<u32> = self
            .members
            .iter()
            .copied()
            .filter(|m| !self.suspects.contains(m))
            .collect();
        let id = self
            .heard
            .iter()
            .filter(|(rank, _)| members.contains(rank))
            .map(|(_, &proposal)| proposal)
            .fold(self.proposal, u32::max);
        let decision = Decision {
            group_id: group_id_of("shrink", id)?,
            members,
        };
        let message = Message::Decide(decision.clone());
        for &peer in &decision.members {
            if peer != self.me {
                let _ = self.send(peer, &message);
            }
        }
        tracing::info!(group = decision.group_id, members = ?decision.members, "shrink: decided as coordinator");
        Ok(decision)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_membership_phases_are_apart_from_the_other_reserved_phases() {
        let reserved = [
            crate::health::GROUP_NOTICE_PHASE,
            crate::wait_chain::PROBE_PHASE,
            crate::wait_chain::ANSWER_PHASE,
        ];
        assert!(!reserved.contains(&SHRINK_PHASE));
        assert!(!reserved.contains(&(SHRINK_PHASE - 1)), "the grow phase");
    }

    #[test]
    fn messages_round_trip() {
        let members = [0, 2, 5, 7];
        for message in [
            Message::Propose {
                proposal: 9,
                suspects: vec![7, 2],
            },
            Message::Propose {
                proposal: 3,
                suspects: vec![],
            },
            Message::Decide(Decision {
                group_id: 12,
                members: vec![0, 5, 7],
            }),
            Message::Collecting,
        ] {
            assert_eq!(
                Message::decode(2, &message.encode(), &members).unwrap(),
                message
            );
        }
    }

    #[test]
    fn hostile_messages_are_protocol_errors_naming_the_peer() {
        let members = [0, 1, 2];
        let decide = |ranks: &[u32]| {
            Message::Decide(Decision {
                group_id: 4,
                members: ranks.to_vec(),
            })
            .encode()
        };
        let mut huge = decide(&[0, 1]);
        huge[5..9].copy_from_slice(&u32::MAX.to_le_bytes());
        let cases: Vec<Vec<u8>> = vec![
            vec![],
            vec![DECIDE, 1, 0],
            huge,
            decide(&[0, 9]),
            decide(&[1, 0]),
            decide(&[1, 1]),
            decide(&[]),
            {
                let mut unknown = decide(&[0]);
                unknown[0] = 7;
                unknown
            },
        ];
        for bytes in cases {
            let err = Message::decode(1, &bytes, &members).unwrap_err();
            assert!(
                matches!(err, CollectiveError::Protocol { peer: Some(1), .. }),
                "{bytes:?}: {err}"
            );
        }
        let mut zero_id = decide(&[0]);
        zero_id[1..5].copy_from_slice(&0u32.to_le_bytes());
        assert!(Message::decode(1, &zero_id, &members).is_err());
    }
}
