//! A wait's part in the chain of waits (see the `wait_chain` module): answering other
//! members' probes with what this rank waits in and on whom, also while a send is stuck
//! mid-message, and after a timeout walking the chain to the rank at fault or around a
//! deadlock.

use std::cell::Cell;
use std::time::{Duration, Instant};

use rlx_transport::blocked_send;

use super::{FailureScope, NOTICE_SLICE, Watch};
use crate::wait_chain::{self, Doing, Step, WaitChain};
use crate::{CollectiveError, Result, Transport, Waiter};

impl Watch<'_> {
    /// Runs `send` (a send to world rank `peer`, or an exchange whose send goes to it) so
    /// that while the transport waits for `peer` to read, this rank still answers the other
    /// members' wait probes: it waits on `peer` (see [`blocked_send`]). A rank stuck behind a
    /// silent peer, mid-message, is then never the one blamed for it. A malformed probe met
    /// meanwhile is the call's error once the send is over, unless the send failed first.
    pub(crate) fn answering_while_blocked<T>(
        &self,
        peer: u32,
        send: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        if self.scope == FailureScope::Operation {
            return send();
        }
        let malformed = Cell::new(None);
        let hook = || {
            if let Err(error) = self.answer_probes(peer) {
                let first = malformed.take();
                malformed.set(first.or(Some(error)));
            }
        };
        let sent = blocked_send::with_hook(&hook, send);
        match malformed.into_inner() {
            Some(error) if sent.is_ok() => Err(error),
            _ => sent,
        }
    }

    /// Answers, without waiting, every wait probe another member sent: this rank waits on
    /// world rank `waits_on`. A malformed probe is a protocol error of its sender.
    pub(crate) fn answer_probes(&self, waits_on: u32) -> Result<()> {
        if self.scope == FailureScope::Operation {
            return Ok(());
        }
        let tag = wait_chain::probe_tag(self.group);
        for (index, &peer) in self.members.iter().enumerate() {
            if index as u32 == self.rank {
                continue;
            }
            // A member gone or a transport stopped is for the wait that needs it to report.
            while let Ok(Some(probe)) = self.transport.recv_message(peer, tag, Duration::ZERO) {
                self.health.hear(wait_chain::decode_probe(peer, &probe)?);
                let answer = wait_chain::encode_answer(waits_on, &self.waits_in(waits_on));
                // Best effort: a prober that cannot be reached is failing on its own, and a
                // prober that does not read must not hold this wait up.
                let _ = self.transport.try_send_message(
                    peer,
                    wait_chain::answer_tag(self.group),
                    &[&answer],
                    NOTICE_SLICE,
                );
            }
        }
        Ok(())
    }

    /// The error to report for `error`: a timeout waiting on a member of a group-scoped
    /// operation names the rank at the end of the chain of waits that starts there (see the
    /// `wait_chain` module), or becomes the failure that reached this rank during the walk;
    /// every other error is returned as it is.
    pub(crate) fn blame(&self, error: CollectiveError) -> CollectiveError {
        let CollectiveError::Timeout {
            peer: Some(first),
            op,
            after,
        } = error
        else {
            return error;
        };
        let me = self.transport.rank();
        if self.scope == FailureScope::Operation
            || first == me
            || !self.members.contains(&first)
            || self.health.check().is_err()
        {
            return error;
        }
        match self.walk(first) {
            Ok(Verdict::Culprit(culprit)) => CollectiveError::Timeout {
                peer: Some(culprit),
                op,
                after,
            },
            Ok(Verdict::Deadlock(waits)) => CollectiveError::Deadlock {
                op,
                after: Some(after),
                found_by: me,
                waits,
            },
            Err(other) => other,
        }
    }

    /// This rank's wait on world rank `waits_on`, as probers and deadlock errors give it.
    pub(super) fn waiter(&self, waits_on: u32) -> Waiter {
        Waiter {
            rank: self.transport.rank(),
            waits_in: self.waits_in(waits_on),
            waits_on,
        }
    }

    /// What this rank waits in, for a prober: the operation and, for a receive from world
    /// rank `waits_on`, the messages from it that wait unreceived under other tags.
    fn waits_in(&self, waits_on: u32) -> String {
        let Doing::Recv { tag, dtype, .. } = self.doing else {
            return self.doing.to_string();
        };
        let others = unreceived_beside(self.transport, waits_on, tag);
        if others.is_empty() {
            return self.doing.to_string();
        }
        format!(
            "{}, while rank {waits_on} sent it what no receive took: {}",
            self.doing,
            CollectiveError::describe_unreceived(&others, Some(dtype))
        )
    }

    /// Follows the chain of waits from world rank `first`, which this rank timed out on, to
    /// the first rank that does not answer a probe, or back to a rank already in it; fails
    /// with a failure notice or a lost peer met on the way. A rank that does not answer but
    /// probed this rank earlier counts as having answered what it said then: it was waiting,
    /// not silent.
    fn walk(&self, first: u32) -> Result<Verdict> {
        let window = wait_chain::probe_window(self.transport.op_timeout());
        let mut chain = WaitChain::new(self.waiter(first));
        loop {
            let current = chain.current();
            let said = self.ask(current, first, window)?;
            let Some(said) = said.or_else(|| self.health.heard_from(current)) else {
                tracing::warn!(
                    group = self.group,
                    culprit = current,
                    chain = %chain.describe(),
                    "timed out; the chain of waits ends at rank {current}"
                );
                return Ok(Verdict::Culprit(current));
            };
            if !self.members.contains(&said.waits_on) {
                return Err(CollectiveError::protocol(
                    Some(current),
                    format!(
                        "wait probe answered with rank {}, not a member of group {}",
                        said.waits_on, self.group
                    ),
                ));
            }
            if let Step::Deadlock(waits) = chain.answered(said) {
                tracing::warn!(
                    group = self.group,
                    chain = %chain.describe(),
                    "timed out in a deadlock: the chain of waits closes on itself"
                );
                return Ok(Verdict::Deadlock(waits));
            }
        }
    }

    /// Probes world rank `peer` and waits up to `window` for its answer: what it waits in
    /// and on whom, or `None` when it does not answer. Meanwhile this rank keeps looking for
    /// failure notices and answers probes itself (it waits on `waits_on`).
    fn ask(&self, peer: u32, waits_on: u32, window: Duration) -> Result<Option<Waiter>> {
        let tag = wait_chain::answer_tag(self.group);
        let start = Instant::now();
        let probe = wait_chain::encode_probe(waits_on, &self.waits_in(waits_on));
        let mut probed = false;
        loop {
            // A rank whose socket does not take the probe (stopped, or cut off with its
            // buffers full) is asked again each slice, so that this rank never stops
            // answering probes itself; it does not answer within the window either.
            if !probed {
                probed = self.transport.try_send_message(
                    peer,
                    wait_chain::probe_tag(self.group),
                    &[&probe],
                    Duration::ZERO,
                )?;
            }
            let left = window.saturating_sub(start.elapsed());
            if let Some(answer) = self
                .transport
                .recv_message(peer, tag, left.min(NOTICE_SLICE))?
            {
                return wait_chain::decode_answer(peer, &answer).map(Some);
            }
            self.notices(waits_on)?;
            self.answer_probes(waits_on)?;
            if start.elapsed() >= window {
                return Ok(None);
            }
        }
    }
}

/// How a walk along the chain of waits ends.
#[derive(Debug)]
enum Verdict {
    /// At this world rank, which did not answer: the culprit.
    Culprit(u32),
    /// Back at a rank already in the chain: a deadlock, with every wait along the way.
    Deadlock(Vec<Waiter>),
}

/// The user tags and byte lengths of the messages from world rank `peer` that wait unreceived
/// under user tags other than `tag`: the usual cause of a point-to-point hang is a tag that
/// differs between sender and receiver.
pub(crate) fn unreceived_beside(transport: &dyn Transport, peer: u32, tag: u32) -> Vec<(u32, u64)> {
    transport
        .unreceived_from(peer)
        .into_iter()
        .filter(|(t, _)| t.is_user() && t.raw() != u64::from(tag))
        .map(|(t, bytes)| (t.raw() as u32, bytes))
        .collect()
}
