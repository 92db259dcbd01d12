//! The flight recorder: every group keeps a bounded ring of its recent operations (sequence
//! number, operation, dtype, element count, algorithm, state, the peer it last waited on,
//! timestamps), so that when a job hangs
//! or fails, each rank can say what it was doing, and `cargo xtask flight-report` can name the
//! rank that never reached an operation.
//!
//! The ring is allocated once, with the group; recording an operation overwrites the slot of
//! its sequence number, so the steady state allocates nothing (only a failure's message is a
//! string). Point-to-point calls, which can take under a microsecond, have a ring of their own
//! written without a lock (`point_to_point.rs`), and every timestamp comes from a clock that
//! costs a few nanoseconds to read (`clock.rs`). It is dumped as JSON lines to `RLX_FLIGHT_RECORDER/rank-<world rank>.jsonl`
//! (`rank-<r>-group-<g>.jsonl` for a sub-group) when an operation fails fatally and when the
//! group is dropped, if that variable names a directory;
//! [`ProcessGroup::flight_record`](crate::ProcessGroup::flight_record) returns a snapshot at
//! any time.

mod clock;
#[cfg(not(rlx_loom))]
mod point_to_point;
#[cfg(rlx_loom)]
#[doc(hidden)]
pub mod point_to_point;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use parking_lot::Mutex;
use serde::Serialize;

use self::clock::Clock;
use self::point_to_point::CallRing;
pub(crate) use self::point_to_point::{Call, PointToPoint, Started};
use crate::{CollectiveError, DType, Result};

pub use crate::env::FLIGHT_DIR_VAR;

/// Operations a group remembers unless told otherwise.
pub const DEFAULT_FLIGHT_ENTRIES: usize = 2048;

/// Where an operation is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum FlightState {
    /// Issued on this rank, not started yet (a non-blocking operation in the worker's queue).
    Issued,
    /// Running.
    Running,
    /// Finished on this rank.
    Done,
    /// Failed on this rank (see [`FlightEntry::error`]).
    Failed,
}

/// One operation as the recorder saw it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FlightEntry {
    /// The group's id on the wire.
    pub group: u16,
    /// This rank's world rank.
    pub rank: u32,
    /// The operation's sequence number in the group; for a point-to-point call its number
    /// among this rank's point-to-point calls in the group.
    pub seq: u32,
    /// The operation (`"all_reduce"`, `"barrier"`, ..., or `"send"`, `"recv"`, `"send_recv"`).
    pub op: &'static str,
    /// For a point-to-point call, the world rank on the other side (the source of a receive).
    pub peer: Option<u32>,
    /// For a point-to-point call, its user tag.
    pub tag: Option<u32>,
    /// The element type, once the operation started (`"f32"`, ...).
    pub dtype: Option<&'static str>,
    /// Elements per rank of its input, once it started.
    pub elements: Option<u64>,
    /// The algorithm that runs it, once chosen (`"ring"`, `"native"`, ...).
    pub algorithm: Option<&'static str>,
    /// Where it is.
    pub state: FlightState,
    /// The world rank it last waited for a message from, if it waited at all.
    pub waiting_on: Option<u32>,
    /// When it was issued, in microseconds since the Unix epoch (comparable across hosts as
    /// far as their clocks agree).
    pub issued_us: u64,
    /// When it finished or failed, in the same clock.
    pub ended_us: Option<u64>,
    /// The error it failed with.
    pub error: Option<String>,
}

/// A group's ring of recent operations.
#[derive(Debug)]
pub(crate) struct FlightRecorder {
    group: u16,
    rank: u32,
    clock: Clock,
    slots: Mutex<Vec<Option<FlightEntry>>>,
    /// The point-to-point calls, a ring of their own: they are outside the group's sequence,
    /// and a loop of them must not push the collectives out of the record.
    calls: CallRing,
    next_call: AtomicU32,
    /// 0 for the job's first world; k for a world grown k times (`ProcessGroup::grow`), whose
    /// ranks are numbered anew and so write files of their own.
    generation: AtomicU32,
}

impl FlightRecorder {
    /// An empty recorder of `entries` slots (at least one) for group `group` on world rank
    /// `rank`.
    pub(crate) fn new(group: u16, rank: u32, entries: usize) -> Self {
        FlightRecorder {
            group,
            rank,
            clock: Clock::new(),
            slots: Mutex::new(vec![None; entries.max(1)]),
            calls: CallRing::new(entries),
            next_call: AtomicU32::new(0),
            generation: AtomicU32::new(0),
        }
    }

    /// Marks the recorder as one of a world grown `generation` times.
    pub(crate) fn set_generation(&self, generation: u32) {
        self.generation.store(generation, Ordering::Relaxed);
    }

    /// See [`FlightRecorder::set_generation`].
    pub(crate) fn generation(&self) -> u32 {
        self.generation.load(Ordering::Relaxed)
    }

    fn now_us(&self) -> u64 {
        self.clock.now_us()
    }

    /// Records that operation `seq` (`op`) was issued.
    pub(crate) fn issued(&self, seq: u32, op: &'static str) {
        let entry = self.entry(seq, op, FlightState::Issued);
        let mut slots = self.slots.lock();
        let len = slots.len();
        slots[seq as usize % len] = Some(entry);
    }

    /// Records that the point-to-point call `call` started; returns the receipt for
    /// [`FlightRecorder::point_to_point_ended`].
    pub(crate) fn point_to_point_started(&self, call: Call) -> Started {
        let seq = self.next_call.fetch_add(1, Ordering::Relaxed);
        self.calls.started(seq, call, self.now_us())
    }

    /// The point-to-point call of `started` ended, with `error` if it failed.
    pub(crate) fn point_to_point_ended(&self, started: Started, error: Option<&CollectiveError>) {
        let error = error.map(ToString::to_string);
        self.calls.ended(started, self.now_us(), error);
    }

    /// A new entry of this recorder's group and rank.
    fn entry(&self, seq: u32, op: &'static str, state: FlightState) -> FlightEntry {
        FlightEntry {
            group: self.group,
            rank: self.rank,
            seq,
            op,
            peer: None,
            tag: None,
            dtype: None,
            elements: None,
            algorithm: None,
            state,
            waiting_on: None,
            issued_us: self.now_us(),
            ended_us: None,
            error: None,
        }
    }

    /// Applies `change` to operation `seq`'s entry, if the ring still holds it.
    fn update(&self, seq: u32, change: impl FnOnce(&mut FlightEntry)) {
        let mut slots = self.slots.lock();
        let len = slots.len();
        if let Some(entry) = slots[seq as usize % len].as_mut().filter(|e| e.seq == seq) {
            change(entry);
        }
    }

    /// Operation `seq` started running.
    pub(crate) fn running(&self, seq: u32) {
        self.update(seq, |e| e.state = FlightState::Running);
    }

    /// Operation `seq` moves `elements` elements of `dtype` per rank.
    pub(crate) fn data(&self, seq: u32, dtype: &'static str, elements: u64) {
        self.update(seq, |e| {
            e.dtype = Some(dtype);
            e.elements = Some(elements);
        });
    }

    /// The element type operation `seq` moves, once it started and while the ring holds it.
    pub(crate) fn dtype(&self, seq: u32) -> Option<DType> {
        let slots = self.slots.lock();
        let entry = slots[seq as usize % slots.len()].as_ref()?;
        entry.dtype.filter(|_| entry.seq == seq)?.parse().ok()
    }

    /// How many bytes operation `seq` moves per rank, once it started and while the ring
    /// holds it.
    pub(crate) fn data_bytes(&self, seq: u32) -> Option<u64> {
        let slots = self.slots.lock();
        let entry = slots[seq as usize % slots.len()].as_ref()?;
        if entry.seq != seq {
            return None;
        }
        let size = entry.dtype?.parse::<DType>().ok()?.size() as u64;
        entry.elements?.checked_mul(size)
    }

    /// Operation `seq` runs on `algorithm`.
    pub(crate) fn algorithm(&self, seq: u32, algorithm: &'static str) {
        self.update(seq, |e| e.algorithm = Some(algorithm));
    }

    /// Operation `seq` waits for a message from world rank `peer`.
    pub(crate) fn waiting(&self, seq: u32, peer: u32) {
        self.update(seq, |e| e.waiting_on = Some(peer));
    }

    /// Operation `seq` ended, with `error` if it failed.
    pub(crate) fn ended(&self, seq: u32, error: Option<&CollectiveError>) {
        let ended_us = self.now_us();
        self.update(seq, |e| finish(e, ended_us, error));
    }

    /// The recorded collectives, oldest first, then the point-to-point calls, oldest first.
    pub(crate) fn snapshot(&self) -> Vec<FlightEntry> {
        let mut entries: Vec<FlightEntry> = self.slots.lock().iter().flatten().cloned().collect();
        entries.sort_by_key(|e| e.seq);
        entries.extend(self.calls.snapshot(self.group, self.rank));
        entries
    }

    /// The file this recorder dumps to inside `dir`.
    pub(crate) fn file_in(&self, dir: &Path, is_world: bool) -> PathBuf {
        let name = if is_world {
            format!("rank-{}.jsonl", self.rank)
        } else {
            format!("rank-{}-group-{}.jsonl", self.rank, self.group)
        };
        // A grown world's files are kept apart from the first world's, whose ranks they
        // would otherwise overwrite.
        match self.generation() {
            0 => dir.join(name),
            generation => dir.join(format!("grown-{generation}-{name}")),
        }
    }

    /// Writes the snapshot to `path` as JSON lines, replacing an earlier dump atomically: the
    /// lines go to a temporary file that is then renamed, so a rank killed while it rewrites
    /// its record (a launcher ending the job after a failure) leaves the previous record whole,
    /// never a truncated one.
    pub(crate) fn dump_to(&self, path: &Path) -> Result<()> {
        let io = |source| CollectiveError::Io { peer: None, source };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let mut text = Vec::new();
        for entry in self.snapshot() {
            serde_json::to_writer(&mut text, &entry)
                .map_err(|e| io(std::io::Error::other(e.to_string())))?;
            text.push(b'\n');
        }
        let partial = path.with_extension("jsonl.partial");
        std::fs::File::create(&partial)
            .and_then(|mut file| file.write_all(&text))
            .and_then(|()| std::fs::rename(&partial, path))
            .map_err(io)
    }

    /// Dumps to `RLX_FLIGHT_RECORDER` when it is set (and not `0`); a failure to write is logged, never
    /// raised (the error being reported matters more).
    pub(crate) fn dump_if_asked(&self, is_world: bool) {
        let Some(dir) = crate::env::read(FLIGHT_DIR_VAR) else {
            return;
        };
        let path = self.file_in(Path::new(&dir), is_world);
        match self.dump_to(&path) {
            Ok(()) => tracing::info!(path = %path.display(), "wrote the flight record"),
            Err(error) => {
                tracing::warn!(path = %path.display(), %error, "could not write the flight record");
            }
        }
    }
}

/// Marks `entry` ended at `ended_us`: failed with `error`, or done.
fn finish(entry: &mut FlightEntry, ended_us: u64, error: Option<&CollectiveError>) {
    entry.ended_us = Some(ended_us);
    match error {
        Some(error) => {
            entry.state = FlightState::Failed;
            entry.error = Some(error.to_string());
        }
        None => entry.state = FlightState::Done,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_keeps_the_latest_operations_in_order() {
        let recorder = FlightRecorder::new(1, 3, 4);
        for seq in 0..6 {
            recorder.issued(seq, "barrier");
            recorder.running(seq);
            recorder.ended(seq, None);
        }
        recorder.issued(6, "all_reduce");
        recorder.running(6);
        recorder.data(6, "bf16", 1000);
        recorder.algorithm(6, "ring");
        recorder.waiting(6, 2);
        let entries = recorder.snapshot();
        let seqs: Vec<u32> = entries.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, [3, 4, 5, 6]);
        let last = &entries[3];
        assert_eq!(
            (last.op, last.state, last.waiting_on),
            ("all_reduce", FlightState::Running, Some(2))
        );
        assert_eq!(
            (last.dtype, last.elements, last.algorithm),
            (Some("bf16"), Some(1000), Some("ring"))
        );
        // An update for an operation the ring no longer holds changes nothing.
        recorder.ended(2, Some(&CollectiveError::Aborted));
        assert_eq!(recorder.snapshot(), entries);
    }

    #[test]
    fn point_to_point_calls_keep_the_latest_in_a_ring_of_their_own() {
        let recorder = FlightRecorder::new(1, 3, 4);
        recorder.issued(0, "barrier");
        let call = |kind, tag, elements| Call {
            kind,
            peer: 2,
            tag,
            dtype: DType::BF16,
            elements,
        };
        for tag in 0..5 {
            let started = recorder.point_to_point_started(call(PointToPoint::Send, tag, Some(9)));
            recorder.point_to_point_ended(started, None);
        }
        let failed = recorder.point_to_point_started(call(PointToPoint::SendRecv, 5, Some(4)));
        recorder.point_to_point_ended(failed, Some(&CollectiveError::Aborted));
        recorder.point_to_point_started(call(PointToPoint::Recv, 6, None));
        let entries = recorder.snapshot();
        // The collective comes first, then the last four of the seven calls, in order.
        let summary: Vec<_> = entries.iter().map(|e| (e.op, e.tag, e.state)).collect();
        assert_eq!(
            summary,
            [
                ("barrier", None, FlightState::Issued),
                ("send", Some(3), FlightState::Done),
                ("send", Some(4), FlightState::Done),
                ("send_recv", Some(5), FlightState::Failed),
                ("recv", Some(6), FlightState::Running),
            ]
        );
        let failed = &entries[3];
        assert_eq!(failed.error, Some(CollectiveError::Aborted.to_string()));
        assert!(
            failed
                .ended_us
                .is_some_and(|ended| ended >= failed.issued_us)
        );
        let running = &entries[4];
        assert_eq!((running.peer, running.waiting_on), (Some(2), Some(2)));
        assert_eq!((running.dtype, running.elements), (Some("bf16"), None));
        assert_eq!(running.ended_us, None);
    }
}
