//! The flight recorder's ring of point-to-point calls, written without a lock.
//!
//! A point-to-point message between two ranks of one host takes under a microsecond, so
//! recording it must cost a few tens of nanoseconds, not the hundred that a locked ring of
//! full entries cost. Each slot is a handful of atomics behind a header word saying whose slot
//! it is (the call's number) and where that call is:
//! - a call's start takes the slot with one compare-and-swap of the header to "being written",
//!   stores its fields and publishes them with a release store of the header;
//! - a call's end is one compare-and-swap of the header alone, which holds the state and the
//!   call's duration, so an end never writes a field that a later call of the same slot owns;
//! - a reader copies a slot and keeps the copy only if the header still names the same call
//!   afterwards (a sequence lock), so it never returns a mixture of two calls.
//!
//! A failure's message is the only string: failures are rare, so they wait in a short list
//! under a lock, put there before the header says the call failed. A start that finds its slot
//! being written by another call (one ring length of calls apart, racing) or already holding a
//! later call leaves its call unrecorded rather than wait.

// The ring is public only to the loom models (`tests/loom_flight.rs`); elsewhere the module is
// private to the recorder.
#![cfg_attr(not(rlx_loom), allow(unreachable_pub))]

use crate::sync::{AtomicU64, Mutex, Ordering, fence};

use super::{FlightEntry, FlightState};
use crate::DType;

/// The three point-to-point calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PointToPoint {
    /// A send.
    Send,
    /// A receive.
    Recv,
    /// A send and a receive as one exchange.
    SendRecv,
}

impl PointToPoint {
    const ALL: [PointToPoint; 3] = [
        PointToPoint::Send,
        PointToPoint::Recv,
        PointToPoint::SendRecv,
    ];

    /// The name the flight record gives the call.
    pub fn name(self) -> &'static str {
        match self {
            PointToPoint::Send => "send",
            PointToPoint::Recv => "recv",
            PointToPoint::SendRecv => "send_recv",
        }
    }
}

/// What a point-to-point call is, as its start records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Call {
    /// Which call.
    pub kind: PointToPoint,
    /// The world rank on the other side (the source of a receive).
    pub peer: u32,
    /// The user tag.
    pub tag: u32,
    /// The element type.
    pub dtype: DType,
    /// How many elements, when known (a receive learns it only when its message arrives).
    pub elements: Option<u64>,
}

// The header's low three bits: where the call is.
const EMPTY: u64 = 0;
const WRITING: u64 = 1;
const RUNNING: u64 = 2;
const DONE: u64 = 3;
const FAILED: u64 = 4;
const STATE_BITS: u32 = 3;
/// The call's duration in milliseconds sits between the state and the call's number; a call
/// longer than this (about six days) records this.
const MAX_DURATION_MS: u64 = (1 << (32 - STATE_BITS)) - 1;
/// `elements` of a call that does not know its length.
const UNKNOWN: u64 = u64::MAX;

fn header(seq: u32, duration_ms: u64, state: u64) -> u64 {
    (u64::from(seq) << 32) | (duration_ms.min(MAX_DURATION_MS) << STATE_BITS) | state
}

fn seq_of(header: u64) -> u32 {
    (header >> 32) as u32
}

fn state_of(header: u64) -> u64 {
    header & ((1 << STATE_BITS) - 1)
}

fn duration_ms_of(header: u64) -> u64 {
    (header >> STATE_BITS) & MAX_DURATION_MS
}

/// One call's slot.
#[derive(Debug)]
struct Slot {
    header: AtomicU64,
    /// The peer in the high half, the tag in the low half.
    peer_tag: AtomicU64,
    /// The call's kind in the low byte, the dtype's index in `DType::ALL` in the next.
    kind_dtype: AtomicU64,
    elements: AtomicU64,
    issued_us: AtomicU64,
}

/// A started call's receipt for [`CallRing::ended`].
#[derive(Clone, Copy, Debug)]
pub struct Started {
    seq: u32,
    issued_us: u64,
}

/// The ring of the latest point-to-point calls.
#[derive(Debug)]
pub struct CallRing {
    slots: Box<[Slot]>,
    /// The messages of failed calls, oldest first, at most one per slot.
    failures: Mutex<Vec<(u32, String)>>,
}

impl CallRing {
    /// A ring of `len` slots (at least one).
    pub fn new(len: usize) -> Self {
        let slots = (0..len.max(1))
            .map(|_| Slot {
                header: AtomicU64::new(EMPTY),
                peer_tag: AtomicU64::new(0),
                kind_dtype: AtomicU64::new(0),
                elements: AtomicU64::new(0),
                issued_us: AtomicU64::new(0),
            })
            .collect();
        CallRing {
            slots,
            failures: Mutex::new(Vec::new()),
        }
    }

    fn slot(&self, seq: u32) -> &Slot {
        &self.slots[seq as usize % self.slots.len()]
    }

    /// Records that call number `seq` (numbers are unique and grow) started at `issued_us`.
    pub fn started(&self, seq: u32, call: Call, issued_us: u64) -> Started {
        let receipt = Started { seq, issued_us };
        let slot = self.slot(seq);
        let current = slot.header.load(Ordering::Relaxed);
        let later = seq_of(current).wrapping_sub(seq) as i32 > 0;
        if state_of(current) == WRITING || (state_of(current) != EMPTY && later) {
            return receipt;
        }
        let taken = slot.header.compare_exchange(
            current,
            header(seq, 0, WRITING),
            Ordering::Acquire,
            Ordering::Relaxed,
        );
        if taken.is_err() {
            return receipt;
        }
        // Whoever sees a field stored below must also see the slot as being written.
        fence(Ordering::Release);
        let dtype = DType::ALL
            .iter()
            .position(|d| *d == call.dtype)
            .unwrap_or(0) as u64;
        let kind = PointToPoint::ALL
            .iter()
            .position(|k| *k == call.kind)
            .unwrap_or(0) as u64;
        slot.peer_tag.store(
            (u64::from(call.peer) << 32) | u64::from(call.tag),
            Ordering::Relaxed,
        );
        slot.kind_dtype
            .store(kind | (dtype << 8), Ordering::Relaxed);
        slot.elements
            .store(call.elements.unwrap_or(UNKNOWN), Ordering::Relaxed);
        slot.issued_us.store(issued_us, Ordering::Relaxed);
        slot.header
            .store(header(seq, 0, RUNNING), Ordering::Release);
        receipt
    }

    /// Records that the call of `started` ended at `ended_us`, failed with `error` if given.
    pub fn ended(&self, started: Started, ended_us: u64, error: Option<String>) {
        let duration_ms = ended_us.saturating_sub(started.issued_us) / 1000;
        let state = match error {
            Some(error) => {
                let mut failures = self.failures.lock();
                if failures.len() >= self.slots.len() {
                    failures.remove(0);
                }
                failures.push((started.seq, error));
                FAILED
            }
            None => DONE,
        };
        // A call whose slot a later call took keeps no record, so a failed exchange is fine.
        let _ = self.slot(started.seq).header.compare_exchange(
            header(started.seq, 0, RUNNING),
            header(started.seq, duration_ms, state),
            Ordering::Release,
            Ordering::Relaxed,
        );
    }

    /// The recorded calls, oldest first, as entries of `group` on world rank `rank`.
    pub fn snapshot(&self, group: u16, rank: u32) -> Vec<FlightEntry> {
        let mut entries: Vec<FlightEntry> = self
            .slots
            .iter()
            .filter_map(|slot| read(slot, group, rank))
            .collect();
        entries.sort_by_key(|e| e.seq);
        let failures = self.failures.lock();
        for entry in entries
            .iter_mut()
            .filter(|e| e.state == FlightState::Failed)
        {
            entry.error = failures
                .iter()
                .rev()
                .find(|(seq, _)| *seq == entry.seq)
                .map(|(_, error)| error.clone());
        }
        entries
    }
}

/// A consistent copy of `slot`'s call, if it holds one: a few tries while writers race it.
fn read(slot: &Slot, group: u16, rank: u32) -> Option<FlightEntry> {
    for _ in 0..8 {
        let before = slot.header.load(Ordering::Acquire);
        match state_of(before) {
            EMPTY => return None,
            WRITING => continue,
            _ => {}
        }
        let peer_tag = slot.peer_tag.load(Ordering::Relaxed);
        let kind_dtype = slot.kind_dtype.load(Ordering::Relaxed);
        let elements = slot.elements.load(Ordering::Relaxed);
        let issued_us = slot.issued_us.load(Ordering::Relaxed);
        // Had any load above seen a later call's field, the header read below would show
        // that call's number or its writing.
        fence(Ordering::Acquire);
        let after = slot.header.load(Ordering::Relaxed);
        if seq_of(after) != seq_of(before) || state_of(after) == WRITING {
            continue;
        }
        let kind = PointToPoint::ALL[(kind_dtype & 0xff) as usize % 3];
        let dtype = DType::ALL[((kind_dtype >> 8) as usize) % DType::ALL.len()];
        let (state, ended_us) = match state_of(after) {
            DONE => (
                FlightState::Done,
                Some(issued_us + duration_ms_of(after) * 1000),
            ),
            FAILED => (
                FlightState::Failed,
                Some(issued_us + duration_ms_of(after) * 1000),
            ),
            _ => (FlightState::Running, None),
        };
        let peer = (peer_tag >> 32) as u32;
        return Some(FlightEntry {
            group,
            rank,
            seq: seq_of(after),
            op: kind.name(),
            peer: Some(peer),
            tag: Some(peer_tag as u32),
            dtype: Some(dtype.name()),
            elements: (elements != UNKNOWN).then_some(elements),
            algorithm: None,
            state,
            waiting_on: Some(peer),
            issued_us,
            ended_us,
            error: None,
        });
    }
    None
}
