//! The scratch region of the one-sided all-reduce: its layout in the symmetric heap (the
//! control words and the two banks of slots described in the `one_sided` module docs) and
//! the group state that hands it, one operation at a time in issue order, to the operations
//! that use it.
//!
//! It knows nothing of operations beyond their sequence numbers, so the selector (which
//! publishes the region sizes) and the operation context (which carries the group's state)
//! can both use it without depending on the algorithm.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use rlx_transport::symmetric::Region;

use crate::{CollectiveError, Result};

/// See [`crate::select::DEFAULT_ONE_SIDED_REGION_BYTES`].
pub(crate) const DEFAULT_REGION_BYTES: u64 =
    CONTROL_BYTES + BANKS * SLOTS * (HEADER_BYTES as u64 + 512 * 1024);

/// See [`crate::select::MIN_ONE_SIDED_REGION_BYTES`]: the control words and room for one
/// 8-byte element in each slot.
pub(crate) const MIN_REGION_BYTES: u64 = CONTROL_BYTES + BANKS * SLOTS * (HEADER_BYTES as u64 + 8);

/// Banks of slots, used by consecutive operations in turn.
const BANKS: u64 = 2;

/// Slots per bank: a sender may run up to this many messages ahead of its neighbour's
/// consumption.
pub(super) const SLOTS: u64 = 4;
/// Bytes before the first slot: the ready and credit words, padded to a cache line so that
/// the two writers do not share one with the slots.
const CONTROL_BYTES: u64 = 64;
/// The header in front of every payload.
pub(super) const HEADER_BYTES: usize = 32;

/// A group's one-sided state: the queue that gives its one-sided operations their turns, and
/// the scratch region once allocated.
#[derive(Default)]
pub(crate) struct OneSided {
    gate: Mutex<Gate>,
    turn: Condvar,
}

#[derive(Default)]
struct Gate {
    /// Sequence numbers of the issued one-sided operations that have not finished, in issue
    /// order; the front one runs.
    queue: VecDeque<u32>,
    scratch: Option<Scratch>,
}

impl OneSided {
    /// Queues operation `seq`, which is being issued and will use the scratch region (see
    /// [`OpId::uses_one_sided_region`](crate::op::OpId::uses_one_sided_region)). Called on
    /// the issuing thread, so every rank queues the same operations in one order.
    pub(crate) fn register(&self, seq: u32) {
        self.gate.lock().queue.push_back(seq);
    }

    /// Removes operation `seq` from the queue (if it is there) and wakes the operations waiting
    /// for their turn. Called when the operation ends, however it ends, and when an issued
    /// operation will never run.
    pub(crate) fn release(&self, seq: u32) {
        let mut gate = self.gate.lock();
        if let Some(at) = gate.queue.iter().position(|&s| s == seq) {
            gate.queue.remove(at);
            self.turn.notify_all();
        }
    }

    /// A guard that releases `seq` when dropped.
    pub(crate) fn registration(&self, seq: u32) -> Registration<'_> {
        Registration { state: self, seq }
    }

    /// Waits until operation `seq` (named `op` in a timeout) is at the front of the queue and
    /// returns the scratch region as it stands; fails with `Timeout` after `timeout`.
    /// `Unsupported` for an operation that was not registered (a sub-group's).
    pub(super) fn wait_turn(
        &self,
        seq: u32,
        op: &'static str,
        timeout: Duration,
    ) -> Result<Option<Scratch>> {
        let deadline = Instant::now() + timeout;
        let mut gate = self.gate.lock();
        loop {
            match gate.queue.front() {
                Some(&front) if front == seq => return Ok(gate.scratch),
                _ if !gate.queue.contains(&seq) => {
                    return Err(CollectiveError::unsupported(
                        "the one-sided all-reduce runs on the world group only: a sub-group \
                         cannot allocate symmetric heap memory, which is collective over the \
                         whole world",
                    ));
                }
                _ => {}
            }
            if Instant::now() >= deadline {
                return Err(CollectiveError::Timeout {
                    peer: None,
                    op,
                    after: timeout,
                });
            }
            // Wakes on every release; the loop re-checks the queue and the deadline.
            let _ = self.turn.wait_until(&mut gate, deadline);
        }
    }

    /// Records the region the running operation allocated (or that it is gone).
    pub(super) fn set_scratch(&self, scratch: Option<Scratch>) {
        self.gate.lock().scratch = scratch;
    }
}

/// Releases an operation's place in the [`OneSided`] queue when dropped.
pub(crate) struct Registration<'a> {
    state: &'a OneSided,
    seq: u32,
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        self.state.release(self.seq);
    }
}

/// The scratch region, the offsets inside it (the same on every rank) and whose turn its
/// banks are.
#[derive(Clone, Copy, Debug)]
pub(super) struct Scratch {
    pub(super) region: Region,
    /// Sequence number of the last operation that used the region (`None` while it is fresh).
    pub(super) previous: Option<u32>,
    /// The bank the next operation uses.
    bank: u64,
}

impl Scratch {
    pub(super) fn ready_word(&self) -> u64 {
        self.region.offset()
    }

    pub(super) fn credit_word(&self) -> u64 {
        self.region.offset() + 8
    }

    /// A fresh region: zeroed words, nothing to wait for.
    pub(super) fn fresh(region: Region) -> Scratch {
        Scratch {
            region,
            previous: None,
            bank: 0,
        }
    }

    /// The state for the operation after `seq`, which used this bank.
    pub(super) fn after(self, seq: u32) -> Scratch {
        Scratch {
            previous: Some(seq),
            bank: (self.bank + 1) % BANKS,
            ..self
        }
    }

    /// Bytes per slot, a multiple of 8 so that every slot starts word-aligned.
    pub(super) fn slot_bytes(&self) -> u64 {
        ((self.region.len() - CONTROL_BYTES) / (BANKS * SLOTS)) & !7
    }

    /// Payload bytes per slot.
    pub(super) fn payload_bytes(&self) -> usize {
        (self.slot_bytes() - HEADER_BYTES as u64) as usize
    }

    /// Heap offset of the slot that message `index` of the operation uses.
    pub(super) fn slot(&self, index: u64) -> u64 {
        let slot = self.bank * SLOTS + index % SLOTS;
        self.region.offset() + CONTROL_BYTES + slot * self.slot_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn slots_are_aligned_and_disjoint() {
        for len in [
            MIN_REGION_BYTES,
            MIN_REGION_BYTES + 13,
            DEFAULT_REGION_BYTES,
        ] {
            let first = Scratch::fresh(test_region(len));
            let second = first.after(5);
            assert_eq!(second.previous, Some(5));
            assert_eq!(second.after(6).bank, first.bank);
            assert!(first.payload_bytes() >= 8);
            assert!(first.slot(0) >= first.credit_word() + 8);
            let mut slots = Vec::new();
            for scratch in [first, second] {
                assert_eq!(scratch.slot(SLOTS), scratch.slot(0));
                for i in 0..SLOTS {
                    assert_eq!(scratch.slot(i) % 8, 0);
                    let end = scratch.slot(i) + scratch.slot_bytes();
                    assert!(end <= first.region.offset() + len);
                    slots.push(scratch.slot(i));
                }
            }
            slots.sort_unstable();
            assert!(slots.windows(2).all(|w| w[1] - w[0] >= first.slot_bytes()));
        }
    }

    /// A region at a fixed offset, made the only way a `Region` can be made: by allocating it.
    fn test_region(len: u64) -> Region {
        let heap = rlx_transport::MemTransport::fan_out_symmetric(1, 8 << 20)
            .unwrap()
            .remove(0);
        rlx_transport::SymmetricTransport::alloc(&*heap, len).unwrap()
    }
}
