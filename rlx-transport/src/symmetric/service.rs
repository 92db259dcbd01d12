//! The heap service as state machines without I/O: [`serve`] applies one request to the local
//! heap and produces the encoded response; [`Completions`] is the initiator's table of requests
//! in flight, matched to their responses by request id, which also answers `quiet`.
//!
//! Any two-sided transport carries them: the generic [`Symmetric`](super::Symmetric) moves the
//! bytes, and tests (including the loom models) drive these pieces directly.

use std::collections::HashMap;
use std::fmt;
use std::time::{Duration, Instant};

use crate::symmetric::heap::{HeapFault, SymmetricHeap};
use crate::symmetric::wire::{self, Request, Response, SignalOp};
use crate::sync::{Condvar, Mutex, MutexGuard, lock};
use crate::{CollectiveError, Result};

/// Applies `request` to `heap` and returns the encoded response for the initiator.
///
/// A refused request changes nothing and answers with a fault. A put-with-signal writes its
/// data before its signal, so a rank that sees the signal sees the data. A get allocates its
/// response only after the range is checked against the heap.
pub fn serve(heap: &SymmetricHeap, request: &Request<'_>) -> Vec<u8> {
    match *request {
        Request::Put { id, offset, data } => match heap.try_write(offset, data) {
            Ok(()) => wire::encode_ack(id).to_vec(),
            Err(fault) => wire::encode_fault(id, fault).to_vec(),
        },
        Request::PutSignal {
            id,
            offset,
            signal,
            data,
        } => {
            // Check both ranges before touching anything, so that a refused request changes
            // nothing.
            let checked = heap
                .check_range(offset, data.len() as u64)
                .and_then(|()| heap.check_word(signal.offset));
            let applied = checked.and_then(|()| {
                heap.try_write(offset, data)?;
                match signal.op {
                    SignalOp::Set => heap.try_store_u64(signal.offset, signal.value),
                    SignalOp::Add => heap.try_fetch_add(signal.offset, signal.value).map(|_| ()),
                }
            });
            match applied {
                Ok(()) => wire::encode_ack(id).to_vec(),
                Err(fault) => wire::encode_fault(id, fault).to_vec(),
            }
        }
        Request::Get { id, offset, len } => {
            if let Err(fault) = heap.check_range(offset, len) {
                return wire::encode_fault(id, fault).to_vec();
            }
            // The range check bounds `len` by the heap size, which fits in memory.
            let header = wire::encode_data_header(id);
            let mut out = vec![0u8; header.len() + len as usize];
            out[..header.len()].copy_from_slice(&header);
            match heap.try_read(offset, &mut out[header.len()..]) {
                Ok(()) => out,
                Err(fault) => wire::encode_fault(id, fault).to_vec(),
            }
        }
        Request::FetchAdd { id, offset, value } => match heap.try_fetch_add(offset, value) {
            Ok(old) => wire::encode_value(id, old).to_vec(),
            Err(fault) => wire::encode_fault(id, fault).to_vec(),
        },
        Request::CompareSwap {
            id,
            offset,
            expected,
            new,
        } => match heap.try_compare_swap(offset, expected, new) {
            Ok(old) => wire::encode_value(id, old).to_vec(),
            Err(fault) => wire::encode_fault(id, fault).to_vec(),
        },
    }
}

/// What kind of answer a request in flight expects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    /// A put or put-with-signal: an ack. Counted by [`Completions::quiet`].
    Put,
    /// A get of this many bytes: the data.
    Get {
        /// The number of bytes asked for.
        len: u64,
    },
    /// A fetch-and-add or compare-and-swap: the previous value.
    Atomic,
}

/// The successful result of a request.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A put landed.
    Ack,
    /// The bytes of a get.
    Data(Payload),
    /// The previous value of an atomic.
    Value(u64),
}

/// The bytes of a get as they arrived: the whole response message, so that a large get is
/// copied once, from here to the caller's buffer, instead of being moved out of it first.
#[derive(PartialEq, Eq)]
pub struct Payload {
    message: Vec<u8>,
}

impl fmt::Debug for Payload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Payload")
            .field("len", &self.bytes().len())
            .finish()
    }
}

impl Payload {
    /// The data that was read.
    pub fn bytes(&self) -> &[u8] {
        self.message
            .get(wire::DATA_HEADER_LEN..)
            .unwrap_or_default()
    }

    /// The data as a vector of its own (moves the bytes down over the header).
    pub fn into_vec(mut self) -> Vec<u8> {
        let header = wire::DATA_HEADER_LEN.min(self.message.len());
        self.message.drain(..header);
        self.message
    }
}

/// Why a link stopped serving; kept so that every later call can build its own error.
#[derive(Clone, Debug)]
enum Down {
    Lost(String),
    Protocol(String),
    Aborted,
}

impl Down {
    fn of(error: &CollectiveError) -> Down {
        match error {
            CollectiveError::Aborted => Down::Aborted,
            CollectiveError::Protocol { detail, .. } => Down::Protocol(detail.clone()),
            other => Down::Lost(other.to_string()),
        }
    }

    fn error(&self, peer: u32) -> CollectiveError {
        match self {
            Down::Lost(reason) => CollectiveError::PeerLost {
                peer,
                reason: reason.clone(),
            },
            Down::Protocol(detail) => CollectiveError::protocol(Some(peer), detail.clone()),
            Down::Aborted => CollectiveError::Aborted,
        }
    }
}

/// A request's result as stored until its waiter collects it.
#[derive(Debug)]
enum Finished {
    Done(Outcome),
    Fault(HeapFault),
    Down(Down),
}

#[derive(Debug)]
enum Slot {
    /// In flight; `detached` once nobody will collect the result.
    Waiting { kind: OpKind, detached: bool },
    /// Answered, waiting for its waiter.
    Finished { kind: OpKind, finished: Finished },
}

#[derive(Debug, Default)]
struct State {
    next_id: u64,
    slots: HashMap<(u32, u64), Slot>,
    /// Puts in flight (waiting slots of kind put, detached or not).
    puts_in_flight: u64,
    /// The first failure, since the last [`Completions::quiet`], of a put that no handle will
    /// report (its handle was dropped), with its target.
    put_failure: Option<(u32, Finished)>,
    /// Links that are down, by peer.
    down: HashMap<u32, Down>,
    aborted: bool,
}

/// The initiator's table of requests in flight (see the module docs).
///
/// Request ids are unique per initiator; a response is matched by `(peer, id)`, so responses
/// may arrive in any order and several threads may wait for their own requests at once.
pub struct Completions {
    rank: u32,
    state: Mutex<State>,
    answered: Condvar,
}

impl fmt::Debug for Completions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = lock(&self.state);
        f.debug_struct("Completions")
            .field("rank", &self.rank)
            .field("in_flight", &state.slots.len())
            .field("puts_in_flight", &state.puts_in_flight)
            .finish()
    }
}

impl Completions {
    /// An empty table for initiator `rank`.
    pub fn new(rank: u32) -> Self {
        Self {
            rank,
            state: Mutex::new(State::default()),
            answered: Condvar::new(),
        }
    }

    /// Registers a request to `peer` and returns its id. Fails when the link to `peer` is down
    /// or the table was aborted, so nothing is sent on a dead link.
    pub fn begin(&self, peer: u32, kind: OpKind) -> Result<u64> {
        let mut state = lock(&self.state);
        if state.aborted {
            return Err(CollectiveError::Aborted);
        }
        if let Some(down) = state.down.get(&peer) {
            return Err(down.error(peer));
        }
        let id = state.next_id;
        state.next_id = state.next_id.wrapping_add(1);
        state.slots.insert(
            (peer, id),
            Slot::Waiting {
                kind,
                detached: false,
            },
        );
        if kind == OpKind::Put {
            state.puts_in_flight += 1;
        }
        Ok(id)
    }

    /// Records the response `bytes` from `peer` (an encoded [`Response`]; the data of a get is
    /// moved, not copied). A response that matches no request in flight, or whose kind or
    /// length does not fit its request, is a protocol error: the link is marked down and the
    /// error is returned so the reader stops.
    pub fn complete(&self, peer: u32, bytes: Vec<u8>) -> Result<()> {
        let response = match wire::decode(peer, &bytes) {
            Ok(wire::Message::Response(response)) => response,
            Ok(wire::Message::Request(_)) => {
                return Err(self.protocol(peer, "a request where a response was expected"));
            }
            Err(err) => {
                self.fail_peer(peer, &err);
                return Err(err);
            }
        };
        let id = response.id();
        let mut state = lock(&self.state);
        let kind = match state.slots.get(&(peer, id)) {
            Some(Slot::Waiting { kind, .. }) => *kind,
            _ => {
                drop(state);
                return Err(self.protocol(peer, &format!("response to unknown request id {id}")));
            }
        };
        let finished = match (kind, response) {
            (_, Response::Fault { fault, .. }) => Finished::Fault(fault),
            (OpKind::Put, Response::Ack { .. }) => Finished::Done(Outcome::Ack),
            (OpKind::Atomic, Response::Value { value, .. }) => {
                Finished::Done(Outcome::Value(value))
            }
            (OpKind::Get { len }, Response::Data { data, .. }) => {
                if data.len() as u64 != len {
                    drop(state);
                    return Err(self.protocol(
                        peer,
                        &format!("get {id} asked for {len} bytes and received {}", data.len()),
                    ));
                }
                Finished::Done(Outcome::Data(Payload { message: bytes }))
            }
            (kind, other) => {
                drop(state);
                return Err(self.protocol(
                    peer,
                    &format!("response {other:?} does not answer a {kind:?} request"),
                ));
            }
        };
        Self::finish(&mut state, peer, id, finished);
        drop(state);
        self.answered.notify_all();
        Ok(())
    }

    /// Stores a result: in the slot if someone will collect it; otherwise a failed put becomes
    /// the failure that the next quiet reports.
    fn finish(state: &mut State, peer: u32, id: u64, finished: Finished) {
        let Some(Slot::Waiting { kind, detached }) = state.slots.remove(&(peer, id)) else {
            return;
        };
        if kind == OpKind::Put {
            state.puts_in_flight = state.puts_in_flight.saturating_sub(1);
            // A lost link leaves the group unusable, so quiet reports it even when a handle
            // reports it too.
            if let (None, Finished::Down(down)) = (&state.put_failure, &finished) {
                state.put_failure = Some((peer, Finished::Down(down.clone())));
            }
        }
        if detached {
            Self::orphaned(state, peer, kind, finished);
        } else {
            state
                .slots
                .insert((peer, id), Slot::Finished { kind, finished });
        }
    }

    /// Keeps the failure of a put whose result nobody will collect, for the next quiet.
    fn orphaned(state: &mut State, peer: u32, kind: OpKind, finished: Finished) {
        if kind == OpKind::Put
            && state.put_failure.is_none()
            && !matches!(finished, Finished::Done(_))
        {
            state.put_failure = Some((peer, finished));
        }
    }

    fn protocol(&self, peer: u32, detail: &str) -> CollectiveError {
        let err = CollectiveError::protocol(Some(peer), format!("heap service: {detail}"));
        self.fail_peer(peer, &err);
        err
    }

    /// Marks the link to `peer` down because of `error`: every request in flight to `peer`
    /// finishes with the matching error, and later requests to it fail at once.
    pub fn fail_peer(&self, peer: u32, error: &CollectiveError) {
        let mut state = lock(&self.state);
        let down = state
            .down
            .entry(peer)
            .or_insert_with(|| Down::of(error))
            .clone();
        let ids: Vec<u64> = state
            .slots
            .iter()
            .filter(|((p, _), slot)| *p == peer && matches!(slot, Slot::Waiting { .. }))
            .map(|((_, id), _)| *id)
            .collect();
        for id in ids {
            Self::finish(&mut state, peer, id, Finished::Down(down.clone()));
        }
        drop(state);
        self.answered.notify_all();
    }

    /// Fails every request in flight and every later one with `Aborted`.
    pub fn abort(&self) {
        let mut state = lock(&self.state);
        state.aborted = true;
        let keys: Vec<(u32, u64)> = state
            .slots
            .iter()
            .filter(|(_, slot)| matches!(slot, Slot::Waiting { .. }))
            .map(|(key, _)| *key)
            .collect();
        for (peer, id) in keys {
            Self::finish(&mut state, peer, id, Finished::Down(Down::Aborted));
        }
        drop(state);
        self.answered.notify_all();
    }

    fn wait_for<'a>(
        &'a self,
        mut state: MutexGuard<'a, State>,
        deadline: Option<Instant>,
    ) -> (MutexGuard<'a, State>, bool) {
        let remaining = match deadline {
            Some(deadline) => {
                let now = Instant::now();
                if now >= deadline {
                    return (state, false);
                }
                Some(deadline - now)
            }
            None => None,
        };
        state = match remaining {
            Some(remaining) => match self.answered.wait_timeout(state, remaining) {
                Ok((guard, _)) => guard,
                Err(poisoned) => poisoned.into_inner().0,
            },
            None => match self.answered.wait(state) {
                Ok(guard) => guard,
                Err(poisoned) => poisoned.into_inner(),
            },
        };
        (state, true)
    }

    /// Whether request `id` to `peer` has been answered (its result is waiting for
    /// [`Completions::wait`]).
    pub fn is_finished(&self, peer: u32, id: u64) -> bool {
        !matches!(
            lock(&self.state).slots.get(&(peer, id)),
            Some(Slot::Waiting { .. })
        )
    }

    /// Waits up to `timeout` for the result of request `id` to `peer` (`op` names the operation
    /// in a timeout error). On timeout the request is detached: its late answer is dropped.
    pub fn wait(&self, peer: u32, id: u64, op: &'static str, timeout: Duration) -> Result<Outcome> {
        let deadline = Instant::now().checked_add(timeout);
        let mut state = lock(&self.state);
        loop {
            match state.slots.remove(&(peer, id)) {
                Some(Slot::Finished { finished, .. }) => {
                    return match finished {
                        Finished::Done(outcome) => Ok(outcome),
                        Finished::Fault(fault) => Err(fault.into_error(peer)),
                        Finished::Down(down) => Err(down.error(peer)),
                    };
                }
                Some(waiting @ Slot::Waiting { .. }) => {
                    state.slots.insert((peer, id), waiting);
                }
                None => {
                    return Err(CollectiveError::invalid(format!(
                        "request {id} to rank {peer} is not in flight on rank {}",
                        self.rank
                    )));
                }
            }
            let (guard, in_time) = self.wait_for(state, deadline);
            state = guard;
            if !in_time {
                Self::detach_locked(&mut state, peer, id);
                return Err(CollectiveError::Timeout {
                    peer: Some(peer),
                    op,
                    after: timeout,
                });
            }
        }
    }

    /// Forgets the result of request `id` to `peer` (its handle was dropped); a put still counts
    /// for quiet until it is answered, and its failure goes to the next quiet.
    pub fn detach(&self, peer: u32, id: u64) {
        Self::detach_locked(&mut lock(&self.state), peer, id);
    }

    /// Withdraws request `id` to `peer` that was never sent: it stops counting for quiet and its
    /// slot is dropped.
    pub fn cancel(&self, peer: u32, id: u64) {
        let mut state = lock(&self.state);
        if let Some(Slot::Waiting { kind, .. }) = state.slots.remove(&(peer, id)) {
            if kind == OpKind::Put {
                state.puts_in_flight = state.puts_in_flight.saturating_sub(1);
            }
        }
        drop(state);
        self.answered.notify_all();
    }

    fn detach_locked(state: &mut State, peer: u32, id: u64) {
        match state.slots.get_mut(&(peer, id)) {
            Some(Slot::Waiting { detached, .. }) => *detached = true,
            Some(Slot::Finished { .. }) => {
                if let Some(Slot::Finished { kind, finished }) = state.slots.remove(&(peer, id)) {
                    Self::orphaned(state, peer, kind, finished);
                }
            }
            None => {}
        }
    }

    /// Waits up to `timeout` until every put registered so far has been answered, then reports
    /// the first failure since the previous quiet and clears it: a lost link under any put, or a
    /// fault from the target for a put whose handle was dropped (a put whose handle is still
    /// held, or was waited, reports its fault through that handle only).
    pub fn quiet(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now().checked_add(timeout);
        let mut state = lock(&self.state);
        while state.puts_in_flight > 0 {
            if state.aborted {
                return Err(CollectiveError::Aborted);
            }
            let (guard, in_time) = self.wait_for(state, deadline);
            state = guard;
            if !in_time && state.puts_in_flight > 0 {
                return Err(CollectiveError::Timeout {
                    peer: None,
                    op: "quiet",
                    after: timeout,
                });
            }
        }
        match state.put_failure.take() {
            None => Ok(()),
            Some((peer, Finished::Fault(fault))) => Err(fault.into_error(peer)),
            Some((peer, Finished::Down(down))) => Err(down.error(peer)),
            Some((_, Finished::Done(_))) => Ok(()),
        }
    }

    /// Fails with the link's error when `peer` is down or the table is aborted.
    pub fn check_link(&self, peer: u32) -> Result<()> {
        let state = lock(&self.state);
        if state.aborted {
            return Err(CollectiveError::Aborted);
        }
        match state.down.get(&peer) {
            Some(down) => Err(down.error(peer)),
            None => Ok(()),
        }
    }
}

#[cfg(all(test, not(rlx_loom)))]
mod tests {
    use super::*;
    use crate::symmetric::wire::{Message, Signal};

    fn decode_response(bytes: &[u8]) -> Response<'_> {
        match wire::decode(0, bytes).unwrap() {
            Message::Response(response) => response,
            other => panic!("expected a response, got {other:?}"),
        }
    }

    #[test]
    fn serve_applies_and_answers() {
        let heap = SymmetricHeap::new(1, 64).unwrap();
        let reply = serve(
            &heap,
            &Request::PutSignal {
                id: 3,
                offset: 5,
                signal: Signal::add(32, 2),
                data: b"xyz",
            },
        );
        assert_eq!(decode_response(&reply), Response::Ack { id: 3 });
        assert_eq!(heap.load_u64(32).unwrap(), 2);
        let reply = serve(
            &heap,
            &Request::Get {
                id: 4,
                offset: 5,
                len: 3,
            },
        );
        assert_eq!(
            decode_response(&reply),
            Response::Data {
                id: 4,
                data: b"xyz"
            }
        );
        let reply = serve(
            &heap,
            &Request::CompareSwap {
                id: 5,
                offset: 32,
                expected: 2,
                new: 10,
            },
        );
        assert_eq!(decode_response(&reply), Response::Value { id: 5, value: 2 });
        let reply = serve(
            &heap,
            &Request::FetchAdd {
                id: 6,
                offset: 32,
                value: 1,
            },
        );
        assert_eq!(
            decode_response(&reply),
            Response::Value { id: 6, value: 10 }
        );
    }

    #[test]
    fn refused_requests_change_nothing() {
        let heap = SymmetricHeap::new(1, 64).unwrap();
        let huge = Request::Get {
            id: 1,
            offset: 8,
            len: u64::MAX,
        };
        assert!(matches!(
            decode_response(&serve(&heap, &huge)),
            Response::Fault {
                id: 1,
                fault: HeapFault::OutOfBounds { .. }
            }
        ));
        // The data fits but the signal word does not: neither is written.
        let reply = serve(
            &heap,
            &Request::PutSignal {
                id: 2,
                offset: 0,
                signal: Signal::set(60, 1),
                data: b"abcd",
            },
        );
        assert!(matches!(
            decode_response(&reply),
            Response::Fault { id: 2, .. }
        ));
        let mut first = [0u8; 4];
        heap.read(0, &mut first).unwrap();
        assert_eq!(first, [0; 4]);
        let reply = serve(
            &heap,
            &Request::FetchAdd {
                id: 3,
                offset: 12,
                value: 1,
            },
        );
        assert_eq!(
            decode_response(&reply),
            Response::Fault {
                id: 3,
                fault: HeapFault::Misaligned { offset: 12 }
            }
        );
    }

    #[test]
    fn responses_match_by_id_in_any_order() {
        let table = Completions::new(0);
        let a = table.begin(1, OpKind::Atomic).unwrap();
        let b = table.begin(1, OpKind::Get { len: 2 }).unwrap();
        assert_ne!(a, b);
        table
            .complete(1, [&wire::encode_data_header(b)[..], b"hi"].concat())
            .unwrap();
        table
            .complete(1, wire::encode_value(a, 7).to_vec())
            .unwrap();
        let t = Duration::ZERO;
        assert_eq!(table.wait(1, a, "fetch_add", t).unwrap(), Outcome::Value(7));
        match table.wait(1, b, "get", t).unwrap() {
            Outcome::Data(payload) => {
                assert_eq!(payload.bytes(), b"hi");
                assert_eq!(payload.into_vec(), b"hi");
            }
            other => panic!("a get answered with {other:?}"),
        }
    }

    #[test]
    fn unsolicited_or_mismatched_responses_take_the_link_down() {
        let table = Completions::new(0);
        let err = table
            .complete(2, wire::encode_ack(99).to_vec())
            .unwrap_err();
        assert!(matches!(
            err,
            CollectiveError::Protocol { peer: Some(2), .. }
        ));
        assert!(matches!(
            table.begin(2, OpKind::Put),
            Err(CollectiveError::Protocol { .. })
        ));
        let id = table.begin(3, OpKind::Get { len: 4 }).unwrap();
        let short = [&wire::encode_data_header(id)[..], b"ab"].concat();
        assert!(table.complete(3, short).is_err());
        assert!(matches!(
            table.wait(3, id, "get", Duration::ZERO),
            Err(CollectiveError::Protocol { .. })
        ));
    }

    #[test]
    fn quiet_waits_for_puts_and_reports_orphaned_faults_once() {
        let table = Completions::new(0);
        let p1 = table.begin(1, OpKind::Put).unwrap();
        let p2 = table.begin(2, OpKind::Put).unwrap();
        table.detach(1, p1);
        assert!(matches!(
            table.quiet(Duration::from_millis(5)),
            Err(CollectiveError::Timeout { op: "quiet", .. })
        ));
        table.complete(1, wire::encode_ack(p1).to_vec()).unwrap();
        let fault = HeapFault::OutOfBounds {
            offset: 60,
            len: 8,
            heap_size: 64,
        };
        table
            .complete(2, wire::encode_fault(p2, fault).to_vec())
            .unwrap();
        // The failed put's handle is still held: it, not quiet, reports the fault.
        table.quiet(Duration::ZERO).unwrap();
        assert!(matches!(
            table.wait(2, p2, "put", Duration::ZERO),
            Err(CollectiveError::OutOfBounds { rank: 2, .. })
        ));
        // A failed put whose handle was dropped, before or after the answer, goes to quiet once.
        let p3 = table.begin(2, OpKind::Put).unwrap();
        table.detach(2, p3);
        table
            .complete(2, wire::encode_fault(p3, fault).to_vec())
            .unwrap();
        let p4 = table.begin(1, OpKind::Put).unwrap();
        table
            .complete(1, wire::encode_fault(p4, fault).to_vec())
            .unwrap();
        table.detach(1, p4);
        assert!(matches!(
            table.quiet(Duration::ZERO),
            Err(CollectiveError::OutOfBounds {
                rank: 2,
                offset: 60,
                ..
            })
        ));
        table.quiet(Duration::ZERO).unwrap();
    }

    #[test]
    fn a_cancelled_put_does_not_hold_up_quiet() {
        let table = Completions::new(0);
        let put = table.begin(1, OpKind::Put).unwrap();
        table.cancel(1, put);
        table.quiet(Duration::ZERO).unwrap();
        assert!(table.wait(1, put, "put", Duration::ZERO).is_err());
        // The link stays usable.
        table.begin(1, OpKind::Put).unwrap();
    }

    #[test]
    fn a_lost_peer_fails_what_is_in_flight() {
        let table = Completions::new(0);
        let put = table.begin(1, OpKind::Put).unwrap();
        let get = table.begin(1, OpKind::Get { len: 1 }).unwrap();
        table.fail_peer(
            1,
            &CollectiveError::PeerLost {
                peer: 1,
                reason: "closed".into(),
            },
        );
        assert!(matches!(
            table.wait(1, get, "get", Duration::ZERO),
            Err(CollectiveError::PeerLost { peer: 1, .. })
        ));
        assert!(matches!(
            table.quiet(Duration::ZERO),
            Err(CollectiveError::PeerLost { peer: 1, .. })
        ));
        assert!(table.is_finished(1, put));
        assert!(table.begin(1, OpKind::Atomic).is_err());
        table.abort();
        assert!(matches!(
            table.begin(2, OpKind::Atomic),
            Err(CollectiveError::Aborted)
        ));
    }
}
