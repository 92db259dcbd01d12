//! How a native collective takes the links of an [`MlxTransport`](crate::MlxTransport) from
//! the transport's own traffic, so that MLX's collective bytes never mix with frames.
//!
//! Every rank sends each linked peer a pause frame carrying a [`Descriptor`] of the
//! collective (kind, dtype, reduction, byte length) behind its earlier frames, and waits
//! until its own pauses are out and the peers' have been read; MLX then runs the collective on
//! the collective thread, at most the operation timeout, and the link threads resume. Either
//! the link threads do this (`wait_for_pauses`) or, when every link is idle, the collective
//! thread alone (`own_idle_links`, `exchange_pauses`); the wire is the same. Worlds where some
//! ranks are not linked first announce the collective to every rank with ordinary messages
//! (`announce`), so that nothing a paused rank would have to forward is still on its way.
//! Mismatched descriptors fail the call on every rank that sees them. The `transport` module
//! docs give the reasons for this design.

use std::sync::MutexGuard;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::Instant;

use rlx_transport::{CollectiveError, DType, NativeOp, ReduceKind, Result, Tag};

use crate::ffi::{Group, ShimError};
use crate::frame::{Header, Kind};
use crate::progress::receive_one;
use crate::shared::{ABORT_POLL, Outgoing, Shared};
use crate::sync::{lock, wait_timeout};

/// What a pause frame announces: `(kind, dtype, reduction)` codes and the byte length.
pub(crate) type Descriptor = (u64, u64);

/// A descriptor of a native collective for the pause frame: `(kind, dtype, reduction)` packed
/// into the tag field and the byte length in the length field.
pub(crate) fn descriptor(
    op: NativeOp,
    dtype: DType,
    reduce: Option<ReduceKind>,
    bytes: usize,
) -> (u64, u64) {
    let kind: u64 = match op {
        NativeOp::AllReduce => 1,
        NativeOp::AllGather => 2,
        NativeOp::ReduceScatter => 3,
        _ => 0,
    };
    let code =
        (kind << 16) | (u64::from(dtype.code()) << 8) | u64::from(reduce.map_or(0, |r| r.code()));
    (code, bytes as u64)
}

/// A descriptor as the 16 bytes that start a direct exchange's contribution or an
/// announcement.
pub(crate) fn encode_descriptor(descriptor: Descriptor) -> [u8; 16] {
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&descriptor.0.to_le_bytes());
    bytes[8..].copy_from_slice(&descriptor.1.to_le_bytes());
    bytes
}

/// The descriptor at the start of a direct exchange's contribution or an announcement.
pub(crate) fn decode_descriptor(message: &[u8]) -> Option<Descriptor> {
    let code = message.get(..8)?.try_into().ok()?;
    let len = message.get(8..16)?.try_into().ok()?;
    Some((u64::from_le_bytes(code), u64::from_le_bytes(len)))
}

fn describe(descriptor: Option<(u64, u64)>) -> String {
    let Some((code, bytes)) = descriptor else {
        return "none".to_owned();
    };
    let kind = match code >> 16 {
        1 => "all_reduce",
        2 => "all_gather",
        3 => "reduce_scatter",
        _ => "unknown",
    };
    let dtype = DType::from_code((code >> 8) as u8).map_or("?", DType::name);
    let reduce = ReduceKind::ALL
        .into_iter()
        .find(|r| u64::from(r.code()) == code & 0xFF)
        .map_or("", ReduceKind::name);
    format!("{kind} {reduce} of {bytes} bytes of {dtype}")
}

/// Phase of the transport-group tags of native-collective announcements (see the module
/// docs).
pub(crate) const ANNOUNCE_PHASE: u16 = 0xFFFD;

/// What the collective thread reports of a native collective on owned links.
enum Owned<R> {
    /// The pauses matched and MLX ran the collective, with this result.
    Ran(Result<R, ShimError>),
    /// This peer's next native collective is a different one.
    Mismatch(u32, Option<Descriptor>),
    /// A link failed while the pause frames were exchanged.
    LinkFailed(String),
}

impl Shared {
    /// Runs `run` on MLX with every link paused; see the module docs.
    ///
    /// The MLX call itself runs on the collective thread while the caller waits at most the
    /// operation timeout: MLX cannot cancel a collective whose peer stopped halfway, so a
    /// caller that gives up leaves the call (and the arrays it owns) to that thread and the
    /// transport unusable.
    pub(crate) fn native<R: Send + 'static>(
        &self,
        op: &'static str,
        descriptor: Descriptor,
        run: impl FnOnce(&Group) -> Result<R, ShimError> + Send + 'static,
    ) -> Result<R> {
        let _one_at_a_time = lock(&self.collective);
        {
            let state = lock(&self.state);
            if state.aborted || state.closing {
                return Err(CollectiveError::Aborted);
            }
            if let Some(reason) = &state.broken {
                return Err(CollectiveError::Io {
                    peer: None,
                    source: std::io::Error::other(format!(
                        "MLX transport unusable for {op}: {reason}"
                    )),
                });
            }
        }
        if let Some(held) = self.own_idle_links() {
            return self.native_on_owned_links(op, descriptor, run, held);
        }
        if self.links.len() + 1 < self.world as usize {
            self.announce(op, descriptor)?;
        }
        lock(&self.state).pausing += 1;
        self.changed.notify_all();
        let mut held = Vec::new();
        let paused = self.wait_for_pauses(op, descriptor, &mut held);
        lock(&self.state).pausing -= 1;
        let mismatch = match paused {
            Ok(mismatch) => mismatch,
            Err(error) => {
                // Some pause frames may be out and others not: no link is in a known state
                // any more, so none is used again (and the parked link threads exit).
                self.all_links_failed(format!("{op} failed while pausing the links: {error}"));
                return Err(error);
            }
        };
        let result = match mismatch {
            Some((peer, theirs)) => Err(self.mismatch(op, descriptor, peer, theirs)),
            None => self
                .run_on_collective_thread(op, move |shared| run(&shared.group))
                .and_then(|r| self.mlx_outcome(op, r)),
        };
        let mut state = lock(&self.state);
        state.sender_paused.iter_mut().for_each(|p| *p = false);
        state.peer_paused.iter_mut().for_each(|p| *p = None);
        state.epoch += 1;
        drop(state);
        self.changed.notify_all();
        drop(held);
        result
    }

    /// The error of native collective `ours` on this rank when `peer`'s next native collective
    /// is `theirs`.
    pub(crate) fn mismatch(
        &self,
        op: &'static str,
        ours: Descriptor,
        peer: u32,
        theirs: Option<Descriptor>,
    ) -> CollectiveError {
        CollectiveError::invalid(format!(
            "native {op} on rank {} ({}) does not match rank {peer}'s next native collective \
             ({}); every rank must issue the same native collectives in the same order",
            self.rank,
            describe(Some(ours)),
            describe(theirs)
        ))
    }

    /// The caller's result of an MLX collective that ran: a failure MLX did not refuse up
    /// front leaves the links in an unknown state.
    fn mlx_outcome<R>(&self, op: &'static str, outcome: Result<R, ShimError>) -> Result<R> {
        outcome.map_err(|e| {
            if !e.refused {
                self.all_links_failed(format!("MLX {op} failed: {e}"));
            }
            e.into_error(op)
        })
    }

    /// Takes every link for the collective thread when all of them are idle here: nothing
    /// queued or being sent, no receive posted (see the module docs). Returns the links' send
    /// locks, held until the collective ends; `None` when some link is busy, and in worlds
    /// that forward, whose receivers always read.
    fn own_idle_links(&self) -> Option<Vec<MutexGuard<'_, ()>>> {
        if self.links.len() + 1 < self.world as usize {
            return None;
        }
        let mut held = Vec::with_capacity(self.links.len());
        for link in &self.links {
            let sending = link.sending.try_lock().ok()?;
            if !lock(&link.queue).is_empty() {
                return None;
            }
            held.push(sending);
        }
        let mut state = lock(&self.state);
        let busy = state.always_receive
            || state.receiving.iter().any(|&r| r)
            || state.dead.iter().any(Option::is_some);
        if busy {
            return None;
        }
        state.owned = true;
        Some(held)
    }

    /// The fast way of [`Shared::native`], with every link owned by this rank's collective
    /// thread: that thread sends the pause frames, reads the peers' (delivering what arrives
    /// before them as the receivers would) and runs the collective, so the caller hands over
    /// once and the link threads are not involved at all.
    fn native_on_owned_links<R: Send + 'static>(
        &self,
        op: &'static str,
        descriptor: Descriptor,
        run: impl FnOnce(&Group) -> Result<R, ShimError> + Send + 'static,
        held: Vec<MutexGuard<'_, ()>>,
    ) -> Result<R> {
        let outcome = self.run_on_collective_thread(op, move |shared| {
            match shared.exchange_pauses(descriptor) {
                Ok(None) => Owned::Ran(run(&shared.group)),
                Ok(Some((peer, theirs))) => Owned::Mismatch(peer, theirs),
                Err(reason) => Owned::LinkFailed(reason),
            }
        });
        let result = match outcome {
            Err(error) => Err(error),
            Ok(Owned::Ran(ran)) => self.mlx_outcome(op, ran),
            Ok(Owned::Mismatch(peer, theirs)) => Err(self.mismatch(op, descriptor, peer, theirs)),
            Ok(Owned::LinkFailed(reason)) => {
                self.all_links_failed(format!("{op} failed while pausing the links: {reason}"));
                Err(CollectiveError::Io {
                    peer: None,
                    source: std::io::Error::other(reason),
                })
            }
        };
        lock(&self.state).owned = false;
        self.changed.notify_all();
        drop(held);
        result
    }

    /// The header of this rank's pause frame to `peer` for native collective `descriptor`.
    fn pause_frame(&self, peer: u32, descriptor: Descriptor) -> Header {
        Header {
            kind: Kind::Pause,
            src: self.rank,
            dst: peer,
            tag: descriptor.0,
            len: descriptor.1,
        }
    }

    /// On the collective thread, with every link owned: sends this rank's pause frame for
    /// `descriptor` on every link, then reads each link up to the peer's pause frame. Returns
    /// the first peer whose descriptor differs, or why a link failed.
    fn exchange_pauses(
        &self,
        descriptor: Descriptor,
    ) -> Result<Option<(u32, Option<Descriptor>)>, String> {
        for (index, link) in self.links.iter().enumerate() {
            let pause = self.pause_frame(link.peer, descriptor);
            if let Err(e) = self.send_frame(link.peer, &pause, &[]) {
                let reason = format!("MLX send to rank {} failed: {e}", link.peer);
                self.link_failed(index, reason.clone());
                return Err(reason);
            }
        }
        let mut mismatch = None;
        for (index, link) in self.links.iter().enumerate() {
            let theirs = loop {
                match receive_one(self, index) {
                    Ok(Some(theirs)) => break theirs,
                    Ok(None) => {}
                    Err(reason) => {
                        self.link_failed(index, reason.clone());
                        return Err(reason);
                    }
                }
            };
            if theirs != descriptor && mismatch.is_none() {
                mismatch = Some((link.peer, Some(theirs)));
            }
        }
        Ok(mismatch)
    }

    /// The sequence number of the next native collective's messages. Numbers 0 and
    /// `u32::MAX` of the transport's group belong to the barrier and the closing notices.
    pub(crate) fn next_native_seq(&self) -> u32 {
        1 + self.native_seq.fetch_add(1, Ordering::Relaxed) % (u32::MAX - 1)
    }

    /// Tells every other rank that this one has reached native collective `descriptor` and
    /// waits, at most the operation timeout, until all have said the same (see the module
    /// docs). The links are not touched, so a rank that never comes leaves the transport
    /// usable. Only worlds that forward call this, and their receivers always read, so the
    /// announcements need no demand.
    fn announce(&self, op: &'static str, descriptor: Descriptor) -> Result<()> {
        let tag = Tag::op(
            rlx_transport::TRANSPORT_GROUP,
            self.next_native_seq(),
            ANNOUNCE_PHASE,
        );
        let body = encode_descriptor(descriptor);
        // Farthest first: an announcement forwarded through a nearer rank is then read by
        // that rank before the nearer rank's own one, so a rank that has all announcements
        // has also queued every announcement it forwards.
        let mut peers: Vec<u32> = (0..self.world).filter(|&r| r != self.rank).collect();
        peers.sort_by_key(|&p| std::cmp::Reverse(self.hops_to(p)));
        for &peer in &peers {
            self.send_or_enqueue(
                Header {
                    kind: Kind::Data,
                    src: self.rank,
                    dst: peer,
                    tag: tag.raw(),
                    len: body.len() as u64,
                },
                body.to_vec(),
            )?;
        }
        let deadline = Instant::now() + self.op_timeout;
        for peer in peers {
            let left = deadline.saturating_duration_since(Instant::now());
            let theirs = self
                .inbox
                .take(peer, tag, left)?
                .ok_or(CollectiveError::Timeout {
                    peer: Some(peer),
                    op,
                    after: self.op_timeout,
                })?;
            let theirs = decode_descriptor(&theirs);
            if theirs != Some(descriptor) {
                return Err(self.mismatch(op, descriptor, peer, theirs));
            }
        }
        Ok(())
    }

    /// Hands `run` to the collective thread and waits for its result, at most the operation
    /// timeout (waking early on abort).
    fn run_on_collective_thread<T: Send + 'static>(
        &self,
        op: &'static str,
        run: impl FnOnce(&Shared) -> T + Send + 'static,
    ) -> Result<T> {
        let (tx, rx) = mpsc::channel();
        lock(&self.jobs).push_back(Box::new(move |shared: &Shared| {
            let _ = tx.send(run(shared));
        }));
        self.job_queued.notify_one();
        let deadline = Instant::now() + self.op_timeout;
        loop {
            let now = Instant::now();
            if now >= deadline {
                lock(&self.state).collective_stuck = true;
                self.all_links_failed(format!(
                    "MLX {op} did not finish within {:?}",
                    self.op_timeout
                ));
                return Err(CollectiveError::Timeout {
                    peer: None,
                    op,
                    after: self.op_timeout,
                });
            }
            match rx.recv_timeout((deadline - now).min(ABORT_POLL)) {
                Ok(result) => return Ok(result),
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if lock(&self.state).aborted {
                        return Err(CollectiveError::Aborted);
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(CollectiveError::Io {
                        peer: None,
                        source: std::io::Error::other(format!(
                            "the collective thread dropped {op} without a result"
                        )),
                    });
                }
            }
        }
    }

    /// Sends this rank's pause frames and waits until every link is quiet; returns the
    /// first linked peer whose next native collective differs from this one, if any. Send
    /// locks of links whose pause this thread sent itself are left in `held`.
    fn wait_for_pauses<'a>(
        &'a self,
        op: &'static str,
        descriptor: Descriptor,
        held: &mut Vec<MutexGuard<'a, ()>>,
    ) -> Result<Option<(u32, Option<Descriptor>)>> {
        for (index, link) in self.links.iter().enumerate() {
            let pause = self.pause_frame(link.peer, descriptor);
            // An idle link gets its pause from this thread, which then holds the link's send
            // lock until the collective ends (saving the sender thread's wake-up); a busy one
            // gets it behind its queued frames from the sender thread, which then waits.
            if let Ok(sending) = link.sending.try_lock() {
                if lock(&link.queue).is_empty() && lock(&self.state).dead[index].is_none() {
                    if let Err(e) = self.send_frame(link.peer, &pause, &[]) {
                        let reason = format!("MLX send to rank {} failed: {e}", link.peer);
                        self.link_failed(index, reason);
                        continue;
                    }
                    lock(&self.state).sender_paused[index] = true;
                    self.changed.notify_all();
                    held.push(sending);
                    continue;
                }
            }
            link.push(Outgoing::Pause(pause));
        }
        let deadline = Instant::now() + self.op_timeout;
        let mut state = lock(&self.state);
        loop {
            if state.aborted {
                return Err(CollectiveError::Aborted);
            }
            if let Some((index, reason)) = state
                .dead
                .iter()
                .enumerate()
                .find_map(|(i, d)| d.as_ref().map(|r| (i, r.clone())))
            {
                return Err(CollectiveError::PeerLost {
                    peer: self.links[index].peer,
                    reason,
                });
            }
            let waiting = (0..self.links.len())
                .find(|&i| !state.sender_paused[i] || state.peer_paused[i].is_none());
            let Some(waiting) = waiting else { break };
            let now = Instant::now();
            if now >= deadline {
                return Err(CollectiveError::Timeout {
                    peer: Some(self.links[waiting].peer),
                    op,
                    after: self.op_timeout,
                });
            }
            state = wait_timeout(&self.changed, state, deadline - now);
        }
        let mismatch = (0..self.links.len())
            .find(|&i| state.peer_paused[i] != Some(descriptor))
            .map(|i| (self.links[i].peer, state.peer_paused[i]));
        drop(state);
        Ok(mismatch)
    }
}
