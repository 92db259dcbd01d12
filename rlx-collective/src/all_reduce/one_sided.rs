//! One-sided all-reduce: the segmented ring of `ring.rs` (reduce-scatter, then all-gather of
//! the finished blocks) with every hop a put-with-signal into the next rank's symmetric heap
//! instead of a matched send and receive. It runs when forced with
//! [`Algorithm::OneSidedRing`] on the world group of a transport that has a heap
//! ([`Transport::symmetric`](crate::Transport::symmetric)).
//!
//! The schedule, block and segment layout and the order in which partials are combined are
//! those of the two-sided ring, with the same kernels (partials travel in the wide type, each
//! block is narrowed once by its owner), so the result is bit-identical on every rank and
//! equal to the ring's.
//!
//! # The scratch region
//!
//! Every rank holds the same region of its heap (allocated collectively by the first one-sided
//! operation, or by [`ProcessGroup::enable_one_sided`](crate::ProcessGroup::enable_one_sided)):
//!
//! ```text
//! offset + 0    ready word   written only by the previous rank: "message m has landed"
//! offset + 8    credit word  written only by the next rank: "I have consumed message m"
//! offset + 64   2 banks of SLOTS slots, written only by the previous rank: each a 32-byte
//!               header + payload
//! ```
//!
//! Consecutive one-sided operations use the two banks in turn. Message `i` of the operation
//! with sequence number `seq` goes into slot `i % SLOTS` of its bank and sets the target's
//! ready word to `seq << 32 | (i + 1)`; the receiver, once it has copied the payload out, sets
//! the sender's credit word to the same value (after every second message, to halve the
//! credit traffic). A sender writes message `i >= SLOTS` only after the credit word reached
//! `seq << 32 | (i + 1 - SLOTS)` (the slot is free again).
//!
//! On entering an operation each rank grants `seq << 32` to its previous rank: it has finished
//! reading its slots for every earlier operation. A sender's first `SLOTS` messages wait for
//! the grant of the *previous* operation `p` (`credit >= p << 32`), which says that the next
//! rank is done with the operation before `p`, the last one to use this bank. That grant
//! normally arrived long before, so an operation starts without waiting a round trip, and a
//! rank may run one operation ahead of its neighbour without touching the bank the neighbour
//! still reads.
//!
//! Because sequence numbers grow, every signal value of an operation exceeds every value of
//! the operations before it, so the words are never reset and an earlier operation — even a
//! failed one whose puts are still in flight — can never satisfy a later one's wait: puts from
//! one rank to another are applied in issue order, so stale puts land before the new ones.
//! (A group's 32-bit sequence number wrapping around would break this, as it would break the
//! tags of the two-sided algorithms.)
//!
//! # Ordering and failures
//!
//! One-sided operations of one group share the region, so they run one at a time, in issue
//! order on every rank: each registers at issue ([`OneSided::on_issue`]) and waits for its turn
//! at the front of the queue, whatever thread it runs on.
//!
//! Each message's header carries the sender's buffer length, dtype and reduction, so a rank
//! passing another length gets [`CollectiveError::LengthMismatch`] from its neighbour's first
//! message. Waits on signal words are cut into short slices; between slices the operation
//! looks for the failure notices that a failing rank sends under the operation's tag (see
//! `op.rs`) and for the loss of the rank it waits for, so a peer's failure ends the wait
//! within a slice and a silent peer ends it after the transport's operation timeout, never a
//! hang.
//!
//! Every put targets a rank that still needs it (data the next rank has yet to consume,
//! credits the previous rank waits for), so a rank that finished and dropped its transport
//! never makes a put of a slower rank fail.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use rlx_transport::symmetric::{Cmp, Region, Signal, SymmetricOps};

use crate::layout::{self, Blocks};
use crate::op::{OpCtx, OpId};
use crate::select::Algorithm;
use crate::{CollectiveError, DType, ReduceKind, Result, kernels};

/// The operation name of [`ProcessGroup::enable_one_sided`](crate::ProcessGroup::enable_one_sided)
/// (it takes a sequence number and a turn like a one-sided all-reduce).
pub(crate) const ENABLE_OP: &str = "enable_one_sided";

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
const SLOTS: u64 = 4;
/// A receiver credits its sender after every this many messages (and after the last one the
/// sender waits for), which halves the credit traffic while the sender still has
/// `SLOTS - CREDIT_EVERY` slots of run-ahead. Must not exceed `SLOTS`.
const CREDIT_EVERY: u64 = 2;
/// Bytes before the first slot: the ready and credit words, padded to a cache line so that
/// the two writers do not share one with the slots.
const CONTROL_BYTES: u64 = 64;
/// The header in front of every payload.
const HEADER_BYTES: usize = 32;
/// How long one wait on a signal word lasts before the operation looks for failures.
const WAIT_SLICE: Duration = Duration::from_millis(10);

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
    /// Registers an operation that is being issued if it will use the scratch region: an
    /// all-reduce forced to [`Algorithm::OneSidedRing`] or an explicit enable, on the world
    /// group (a sub-group cannot allocate heap memory, which is collective over the world).
    /// Called on the issuing thread, so every rank queues the same operations in one order.
    pub(crate) fn on_issue(&self, id: &OpId) {
        let uses_region = id.name == ENABLE_OP
            || (id.name == "all_reduce" && id.settings.all_reduce == Algorithm::OneSidedRing);
        if id.is_world && uses_region {
            self.gate.lock().queue.push_back(id.seq);
        }
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

    /// Waits until `ctx`'s operation is at the front of the queue and returns the scratch
    /// region as it stands. `Unsupported` for an operation that was not registered (a
    /// sub-group's).
    fn wait_turn(&self, ctx: &OpCtx<'_>) -> Result<Option<Scratch>> {
        let seq = ctx.tag().seq();
        let deadline = Instant::now() + ctx.timeout();
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
                    op: ctx.name,
                    after: ctx.timeout(),
                });
            }
            // Wakes on every release; the loop re-checks the queue and the deadline.
            let _ = self.turn.wait_until(&mut gate, deadline);
        }
    }

    /// Records the region the running operation allocated (or that it is gone).
    fn set_scratch(&self, scratch: Option<Scratch>) {
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
struct Scratch {
    region: Region,
    /// Sequence number of the last operation that used the region (`None` while it is fresh).
    previous: Option<u32>,
    /// The bank the next operation uses.
    bank: u64,
}

impl Scratch {
    fn ready_word(&self) -> u64 {
        self.region.offset()
    }

    fn credit_word(&self) -> u64 {
        self.region.offset() + 8
    }

    /// A fresh region: zeroed words, nothing to wait for.
    fn fresh(region: Region) -> Scratch {
        Scratch {
            region,
            previous: None,
            bank: 0,
        }
    }

    /// The state for the operation after `seq`, which used this bank.
    fn after(self, seq: u32) -> Scratch {
        Scratch {
            previous: Some(seq),
            bank: (self.bank + 1) % BANKS,
            ..self
        }
    }

    /// Bytes per slot, a multiple of 8 so that every slot starts word-aligned.
    fn slot_bytes(&self) -> u64 {
        ((self.region.len() - CONTROL_BYTES) / (BANKS * SLOTS)) & !7
    }

    /// Payload bytes per slot.
    fn payload_bytes(&self) -> usize {
        (self.slot_bytes() - HEADER_BYTES as u64) as usize
    }

    /// Heap offset of the slot that message `index` of the operation uses.
    fn slot(&self, index: u64) -> u64 {
        let slot = self.bank * SLOTS + index % SLOTS;
        self.region.offset() + CONTROL_BYTES + slot * self.slot_bytes()
    }
}

/// The transport's heap, or `Unsupported` naming its absence.
fn heap_of<'a>(ctx: &OpCtx<'a>) -> Result<&'a dyn SymmetricOps> {
    ctx.transport.symmetric().ok_or_else(|| {
        CollectiveError::unsupported(
            "the one-sided all-reduce needs a transport with a symmetric heap, and this \
             transport has none (wrap it in rlx_transport::Symmetric)",
        )
    })
}

/// Checks a region size for [`ProcessGroup::enable_one_sided`](crate::ProcessGroup::enable_one_sided).
fn check_region_bytes(bytes: u64) -> Result<()> {
    if bytes < MIN_REGION_BYTES {
        return Err(CollectiveError::invalid(format!(
            "a one-sided region of {bytes} bytes is too small (at least {MIN_REGION_BYTES})"
        )));
    }
    Ok(())
}

/// Collective: (re)allocates the scratch region with `bytes` bytes, freeing the previous one.
pub(crate) fn enable(ctx: &OpCtx<'_>, state: &OneSided, bytes: u64) -> Result<()> {
    let _registration = state.registration(ctx.tag().seq());
    let ops = heap_of(ctx)?;
    let current = state.wait_turn(ctx)?;
    check_region_bytes(bytes)?;
    if let Some(old) = current {
        state.set_scratch(None);
        ops.free(old.region)?;
    }
    let region = ops.alloc(bytes)?;
    state.set_scratch(Some(Scratch::fresh(region)));
    Ok(())
}

/// What a one-sided all-reduce holds once it has its turn: the heap and the scratch region.
pub(crate) struct Prepared<'a> {
    ops: &'a dyn SymmetricOps,
    scratch: Scratch,
}

/// Waits for the operation's turn, allocates the scratch region if the group has none yet and
/// hands the other bank to the next operation. Every rank calls it for the same operations
/// whatever their buffers hold, so the collective allocation never waits for a rank that has
/// already failed its validation, and every rank turns the banks in step.
pub(crate) fn prepare<'a>(ctx: &OpCtx<'a>, state: &OneSided) -> Result<Prepared<'a>> {
    let ops = heap_of(ctx)?;
    let scratch = match state.wait_turn(ctx)? {
        Some(scratch) => scratch,
        None => {
            let bytes = DEFAULT_REGION_BYTES.min((ops.heap().size() / 2) & !7);
            check_region_bytes(bytes).map_err(|_| {
                CollectiveError::invalid(format!(
                    "the symmetric heap of {} bytes is too small for the one-sided all-reduce \
                     (half of it must hold at least {MIN_REGION_BYTES} bytes)",
                    ops.heap().size()
                ))
            })?;
            Scratch::fresh(ops.alloc(bytes)?)
        }
    };
    state.set_scratch(Some(scratch.after(ctx.tag().seq())));
    Ok(Prepared { ops, scratch })
}

/// All-reduces `data` in place over at least two ranks with the one-sided ring; segments are
/// at most `segment_bytes` of `dtype` elements and never larger than a slot.
pub(crate) fn run(
    ctx: &OpCtx<'_>,
    prepared: Prepared<'_>,
    data: &mut [u8],
    dtype: DType,
    reduce: ReduceKind,
    segment_bytes: usize,
) -> Result<()> {
    let Prepared { ops, scratch } = prepared;
    let n = ctx.size() as usize;
    let r = ctx.rank as usize;
    let esize = dtype.size();
    let wsize = kernels::wide_size(dtype)?;
    let blocks = Blocks::Balanced {
        count: data.len() / esize,
        parts: n,
    };
    let payload = scratch.payload_bytes();
    let rs_segments = layout::segment_count(
        blocks.max_len(),
        (segment_bytes / esize).min(payload / wsize),
    );
    let ag_segments = layout::segment_count(
        blocks.max_len(),
        (segment_bytes / esize).min(payload / esize),
    );
    let messages = (n as u64 - 1) * (rs_segments + ag_segments) as u64;
    if messages >= 1 << 32 {
        return Err(CollectiveError::invalid(format!(
            "a one-sided all-reduce of {} bytes would take {messages} messages per link, more \
             than its signal words count (enable a larger region)",
            data.len()
        )));
    }
    let stage_payload = (blocks.max_len().div_ceil(rs_segments) * wsize)
        .max(blocks.max_len().div_ceil(ag_segments) * esize);
    let mut stage = vec![0u8; HEADER_BYTES + stage_payload];

    let link = Link {
        ctx,
        ops,
        scratch,
        base: u64::from(ctx.tag().seq()) << 32,
        next: ctx.world_rank(((r + 1) % n) as u32)?,
        prev: ctx.world_rank(((r + n - 1) % n) as u32)?,
        header: Header {
            value: 0,
            data_bytes: data.len() as u64,
            dtype: dtype.code(),
            reduce: reduce.code(),
            payload_bytes: 0,
        },
    };
    link.grant()?;

    let mut index = 0u64;
    // Reduce-scatter: the index arithmetic of `reduce_scatter::ring`.
    for segment in 0..rs_segments {
        for step in 0..n - 1 {
            let send_block = (r + 2 * n - step - 1) % n;
            let send_range = blocks.segment(send_block, rs_segments, segment);
            let send_len = send_range.len() * wsize;
            if step == 0 {
                let own = &data[layout::bytes(send_range, esize)];
                kernels::widen(dtype, own, &mut stage[HEADER_BYTES..][..send_len])?;
            }
            link.send(index, &mut stage, send_len)?;

            let recv_block = (r + 2 * n - step - 2) % n;
            let recv_range = blocks.segment(recv_block, rs_segments, segment);
            let recv_len = recv_range.len() * wsize;
            let partial = &mut stage[HEADER_BYTES..][..recv_len];
            link.receive(index, messages, partial)?;
            let own = &mut data[layout::bytes(recv_range, esize)];
            kernels::accumulate_narrow(dtype, reduce, partial, own)?;
            if step == n - 2 {
                kernels::finish(dtype, reduce, n as u32, partial, own)?;
            }
            // Otherwise the stage now holds the partial to forward at the next step.
            index += 1;
        }
    }
    // All-gather of the narrow results: the index arithmetic of `all_gather::ring`.
    for segment in 0..ag_segments {
        for step in 0..n - 1 {
            let send_block = (r + n - step) % n;
            let send = layout::bytes(blocks.segment(send_block, ag_segments, segment), esize);
            let send_len = send.len();
            stage[HEADER_BYTES..][..send_len].copy_from_slice(&data[send]);
            link.send(index, &mut stage, send_len)?;

            let recv_block = (r + 2 * n - step - 1) % n;
            let recv = layout::bytes(blocks.segment(recv_block, ag_segments, segment), esize);
            link.receive(index, messages, &mut data[recv])?;
            index += 1;
        }
    }
    // Surfaces any refused put before the operation reports success.
    ops.quiet()
}

/// The fixed-size header in front of every payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Header {
    /// The signal value of the message (`seq << 32 | index + 1`).
    value: u64,
    /// Length of the sender's whole buffer.
    data_bytes: u64,
    dtype: u8,
    reduce: u8,
    /// Length of the payload after the header.
    payload_bytes: u64,
}

impl Header {
    fn encode(&self, out: &mut [u8]) {
        out[..8].copy_from_slice(&self.value.to_le_bytes());
        out[8..16].copy_from_slice(&self.data_bytes.to_le_bytes());
        out[16] = self.dtype;
        out[17] = self.reduce;
        out[18..24].fill(0);
        out[24..32].copy_from_slice(&self.payload_bytes.to_le_bytes());
    }

    fn decode(bytes: &[u8; HEADER_BYTES]) -> Header {
        let word = |at: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&bytes[at..at + 8]);
            u64::from_le_bytes(w)
        };
        Header {
            value: word(0),
            data_bytes: word(8),
            dtype: bytes[16],
            reduce: bytes[17],
            payload_bytes: word(24),
        }
    }
}

/// This rank's two neighbours in one operation: puts to the next rank, signals from the
/// previous one.
struct Link<'a> {
    ctx: &'a OpCtx<'a>,
    ops: &'a dyn SymmetricOps,
    scratch: Scratch,
    /// `seq << 32`: the signal values of this operation start above it.
    base: u64,
    /// World rank of the next rank (the one this rank puts to).
    next: u32,
    /// World rank of the previous rank (the one that puts to this rank).
    prev: u32,
    /// This rank's header; `value` and `payload_bytes` are filled per message.
    header: Header,
}

impl Link<'_> {
    /// Tells the previous rank that this rank's slots are free for this operation.
    fn grant(&self) -> Result<()> {
        let credit = self.scratch.credit_word();
        self.ops
            .put_signal_detached(self.prev, credit, &[], Signal::set(credit, self.base))
    }

    /// Puts message `index` — the header, then `stage[HEADER_BYTES..][..len]` — into the next
    /// rank's slot once that slot is free.
    fn send(&self, index: u64, stage: &mut [u8], len: usize) -> Result<()> {
        let free = if index < SLOTS {
            // The next rank's grant for the previous operation: it is done with the one before,
            // the last one to use this bank.
            self.scratch.previous.map_or(0, |p| u64::from(p) << 32)
        } else {
            self.base | (index + 1 - SLOTS)
        };
        self.wait_word(self.scratch.credit_word(), free, self.next)?;
        let value = self.base | (index + 1);
        Header {
            value,
            payload_bytes: len as u64,
            ..self.header
        }
        .encode(&mut stage[..HEADER_BYTES]);
        self.ops.put_signal_detached(
            self.next,
            self.scratch.slot(index),
            &stage[..HEADER_BYTES + len],
            Signal::set(self.scratch.ready_word(), value),
        )
    }

    /// Waits for message `index` from the previous rank, checks its header against this
    /// rank's call, copies its payload into `out` and frees the slot when the previous rank
    /// will need it again in this operation, which has `messages` messages per link. (The
    /// last slots are not credited: the next operation's grant frees them, and the previous
    /// rank may already have finished and left.)
    fn receive(&self, index: u64, messages: u64, out: &mut [u8]) -> Result<()> {
        let value = self.base | (index + 1);
        self.wait_word(self.scratch.ready_word(), value, self.prev)?;
        let heap = self.ops.heap();
        let slot = self.scratch.slot(index);
        let mut raw = [0u8; HEADER_BYTES];
        heap.read(slot, &mut raw)?;
        let theirs = Header::decode(&raw);
        self.check(&theirs, value, out.len())?;
        heap.read(slot + HEADER_BYTES as u64, out)?;
        // The sender waits for the counts 1..=messages - SLOTS; a credit at each multiple of
        // CREDIT_EVERY and at the last of them reaches every one of those in time.
        let consumed = index + 1;
        let last_needed = messages.saturating_sub(SLOTS);
        if consumed > last_needed || (consumed % CREDIT_EVERY != 0 && consumed != last_needed) {
            return Ok(());
        }
        let credit = self.scratch.credit_word();
        self.ops
            .put_signal_detached(self.prev, credit, &[], Signal::set(credit, value))
    }

    /// Compares the previous rank's header with what this rank expects.
    fn check(&self, theirs: &Header, value: u64, payload_bytes: usize) -> Result<()> {
        let peer = self.prev;
        let mine = &self.header;
        if theirs.data_bytes != mine.data_bytes {
            return Err(CollectiveError::LengthMismatch {
                expected: mine.data_bytes,
                got: theirs.data_bytes,
            });
        }
        if (theirs.dtype, theirs.reduce) != (mine.dtype, mine.reduce) {
            let name = |dtype: u8, reduce: u8| {
                let dtype = DType::from_code(dtype).map_or("an unknown dtype", DType::name);
                let reduce = ReduceKind::ALL
                    .into_iter()
                    .find(|kind| kind.code() == reduce)
                    .map_or("an unknown reduction", ReduceKind::name);
                format!("{dtype} with {reduce}")
            };
            return Err(CollectiveError::invalid(format!(
                "rank {peer} all-reduces {} while this rank all-reduces {}",
                name(theirs.dtype, theirs.reduce),
                name(mine.dtype, mine.reduce)
            )));
        }
        if theirs.value != value || theirs.payload_bytes != payload_bytes as u64 {
            return Err(CollectiveError::protocol(
                Some(peer),
                format!(
                    "one-sided message {:#x} of {} bytes found where message {value:#x} of \
                     {payload_bytes} bytes was signalled",
                    theirs.value, theirs.payload_bytes
                ),
            ));
        }
        Ok(())
    }

    /// Waits until this rank's word at `offset` reaches `value`, set by world rank `peer`.
    /// Between short slices it looks for failure notices of this operation (see
    /// [`Link::check_peers`]); gives up after the operation timeout.
    fn wait_word(&self, offset: u64, value: u64, peer: u32) -> Result<()> {
        let timeout = self.ctx.timeout();
        let start = Instant::now();
        loop {
            match self.ops.wait_until(offset, Cmp::Ge, value, WAIT_SLICE) {
                Ok(_) => return Ok(()),
                Err(CollectiveError::Timeout { .. }) => {}
                Err(other) => return Err(other),
            }
            self.check_peers(peer)?;
            if start.elapsed() >= timeout {
                return Err(self.ctx.timed_out(peer, timeout));
            }
        }
    }

    /// Fails with the first failure notice another member sent under this operation's tag,
    /// with any message there (the one-sided algorithm sends none), or when `awaited` (the
    /// world rank whose signal this rank waits for) is gone. Other members that are gone are
    /// no reason to fail: they may have finished their part and left, and one that crashed
    /// stops the chain at its own neighbour, whose failure notice then arrives here.
    fn check_peers(&self, awaited: u32) -> Result<()> {
        for member in (0..self.ctx.size()).filter(|&m| m != self.ctx.rank) {
            let peer = self.ctx.world_rank(member)?;
            match self.ctx.recv_within(member, Duration::ZERO) {
                Ok(None) => {}
                Ok(Some(message)) => {
                    return Err(CollectiveError::protocol(
                        Some(peer),
                        format!(
                            "unexpected message of {} bytes during a one-sided all-reduce",
                            message.len()
                        ),
                    ));
                }
                Err(CollectiveError::PeerLost { .. }) if peer != awaited => {}
                Err(other) => return Err(other),
            }
        }
        Ok(())
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

    #[test]
    fn headers_round_trip() {
        let header = Header {
            value: 7 << 32 | 3,
            data_bytes: 4000,
            dtype: DType::BF16.code(),
            reduce: ReduceKind::Mean.code(),
            payload_bytes: 96,
        };
        let mut raw = [0xAAu8; HEADER_BYTES];
        header.encode(&mut raw);
        assert_eq!(Header::decode(&raw), header);
    }

    /// A region at a fixed offset, made the only way a `Region` can be made: by allocating it.
    fn test_region(len: u64) -> Region {
        let heap = rlx_transport::MemTransport::fan_out_symmetric(1, 8 << 20)
            .unwrap()
            .remove(0);
        rlx_transport::SymmetricTransport::alloc(&*heap, len).unwrap()
    }
}
