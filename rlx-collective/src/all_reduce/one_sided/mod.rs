//! One-sided all-reduce: the segmented ring of `ring.rs` (reduce-scatter, then all-gather of
//! the finished blocks) with every hop a put-with-signal into the next rank's symmetric heap
//! instead of a matched send and receive. It runs when forced with
//! [`Algorithm::OneSidedRing`](crate::Algorithm::OneSidedRing) on the world group of a transport that has a heap
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
//! order on every rank: each registers at issue ([`region::OneSided::register`]) and waits
//! for its turn at the front of the queue, whatever thread it runs on.
//!
//! Each message's header carries the sender's buffer length, dtype and reduction, so a rank
//! passing another length gets [`CollectiveError::LengthMismatch`] from its neighbour's first
//! message. Waits on signal words are cut into short slices; between slices the operation
//! looks for the failure notices that a failing rank sends under the operation's tag (see
//! [`OpCtx::notify_failure`]) and for the loss of the rank it waits for, so a peer's failure ends the wait
//! within a slice and a silent peer ends it after the transport's operation timeout, never a
//! hang.
//!
//! The region's layout arithmetic and the queue of one-sided operations live in [`region`], a
//! leaf that the selector and the operation context use too.
//!
//! Every put targets a rank that still needs it (data the next rank has yet to consume,
//! credits the previous rank waits for, and the grant, which every rank waits for before it
//! returns), so a rank that finished and dropped its transport
//! never makes a put of a slower rank fail. Nor does it make a wait fail: a rank waiting on a
//! neighbour that has left gives up only once the heap service has applied everything that
//! neighbour sent ([`SymmetricOps::source_finished`]) and the signal is still missing, because
//! the neighbour's last put may still be queued here when it drops its transport.

pub(crate) mod region;

use std::time::{Duration, Instant};

use rlx_transport::symmetric::{Cmp, Signal, SymmetricOps};

use crate::layout::{self, Blocks};
use crate::op::OpCtx;
use crate::{CollectiveError, DType, ReduceKind, Result, kernels};
use region::{DEFAULT_REGION_BYTES, HEADER_BYTES, MIN_REGION_BYTES, SLOTS, Scratch};

/// A receiver credits its sender after every this many messages (and after the last one the
/// sender waits for), which halves the credit traffic while the sender still has
/// `SLOTS - CREDIT_EVERY` slots of run-ahead. Must not exceed `SLOTS`.
const CREDIT_EVERY: u64 = 2;
/// How long one wait on a signal word lasts before the operation looks for failures.
const WAIT_SLICE: Duration = Duration::from_millis(10);

/// The transport's heap, or `Unsupported` naming its absence.
fn heap_of<'a>(ctx: &OpCtx<'a>) -> Result<&'a dyn SymmetricOps> {
    ctx.transport.symmetric().ok_or_else(|| {
        CollectiveError::unsupported(
            "the one-sided all-reduce needs a transport with a symmetric heap, and this \
             transport has none (wrap it in rlx_transport::Symmetric)",
        )
    })
}

/// Waits until `ctx`'s operation has its turn at the group's scratch region and returns the
/// region as it stands.
fn wait_turn(ctx: &OpCtx<'_>) -> Result<Option<Scratch>> {
    ctx.one_sided()
        .wait_turn(ctx.tag().seq(), ctx.name(), ctx.timeout())
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
pub(crate) fn enable(ctx: &OpCtx<'_>, bytes: u64) -> Result<()> {
    let state = ctx.one_sided();
    let _registration = state.registration(ctx.tag().seq());
    let ops = heap_of(ctx)?;
    let current = wait_turn(ctx)?;
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
pub(crate) fn prepare<'a>(ctx: &OpCtx<'a>) -> Result<Prepared<'a>> {
    let ops = heap_of(ctx)?;
    let scratch = match wait_turn(ctx)? {
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
    ctx.one_sided()
        .set_scratch(Some(scratch.after(ctx.tag().seq())));
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
    let plan = Plan::new(n, data.len(), dtype, segment_bytes, scratch.payload_bytes())?;
    let mut stage = vec![0u8; HEADER_BYTES + plan.stage_payload];
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
    plan.reduce_scatter(&link, &mut stage, data, reduce)?;
    plan.all_gather(&link, &mut stage, data)?;
    // The next rank's grant for this operation is the one put this rank does not otherwise
    // wait for (its first sends wait for the previous operation's grant). It normally landed
    // long ago; waiting for it means that no put of a slower neighbour targets this rank after
    // it has returned and perhaps dropped its transport.
    link.wait_word(link.scratch.credit_word(), link.base, link.next)?;
    // Surfaces any refused put before the operation reports success.
    ops.quiet()
}

/// How one rank's one-sided all-reduce is cut: its blocks, the segments of each phase (each
/// must fit the scratch region's payload, widened for the reduce-scatter) and the messages
/// per link.
struct Plan {
    n: usize,
    dtype: DType,
    esize: usize,
    wsize: usize,
    blocks: Blocks,
    rs_segments: usize,
    ag_segments: usize,
    /// Messages per link over both phases: each is one signal value.
    messages: u64,
    /// The largest payload a stage holds.
    stage_payload: usize,
}

impl Plan {
    /// The plan of `len` bytes of `dtype` over `n` ranks, in segments of at most
    /// `segment_bytes` and at most `payload` bytes of the scratch region.
    fn new(
        n: usize,
        len: usize,
        dtype: DType,
        segment_bytes: usize,
        payload: usize,
    ) -> Result<Self> {
        let esize = dtype.size();
        let wsize = kernels::wide_size(dtype)?;
        let blocks = Blocks::Balanced {
            count: len / esize,
            parts: n,
        };
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
                "a one-sided all-reduce of {len} bytes would take {messages} messages per link, \
                 more than its signal words count (enable a larger region)"
            )));
        }
        let stage_payload = (blocks.max_len().div_ceil(rs_segments) * wsize)
            .max(blocks.max_len().div_ceil(ag_segments) * esize);
        Ok(Self {
            n,
            dtype,
            esize,
            wsize,
            blocks,
            rs_segments,
            ag_segments,
            messages,
            stage_payload,
        })
    }

    /// The reduce-scatter, with the index arithmetic of `reduce_scatter::ring`: messages 0 to
    /// `(n - 1) * rs_segments - 1`.
    fn reduce_scatter(
        &self,
        link: &Link<'_>,
        stage: &mut [u8],
        data: &mut [u8],
        reduce: ReduceKind,
    ) -> Result<()> {
        let (n, r, dtype) = (self.n, link.ctx.rank as usize, self.dtype);
        let mut index = 0u64;
        for segment in 0..self.rs_segments {
            for step in 0..n - 1 {
                let (send_block, recv_block) = layout::reduce_scatter_step(r, n, step);
                let send_range = self.blocks.segment(send_block, self.rs_segments, segment);
                let send_len = send_range.len() * self.wsize;
                if step == 0 {
                    let own = &data[layout::bytes(send_range, self.esize)];
                    kernels::widen(dtype, own, &mut stage[HEADER_BYTES..][..send_len])?;
                }
                link.send(index, stage, send_len)?;

                let recv_range = self.blocks.segment(recv_block, self.rs_segments, segment);
                let recv_len = recv_range.len() * self.wsize;
                let partial = &mut stage[HEADER_BYTES..][..recv_len];
                link.receive(index, self.messages, partial)?;
                let own = &mut data[layout::bytes(recv_range, self.esize)];
                kernels::accumulate_narrow(dtype, reduce, partial, own)?;
                if step == n - 2 {
                    kernels::finish(dtype, reduce, n as u32, partial, own)?;
                }
                // Otherwise the stage now holds the partial to forward at the next step.
                index += 1;
            }
        }
        Ok(())
    }

    /// The all-gather of the narrow results, with the index arithmetic of `all_gather::ring`:
    /// the messages after the reduce-scatter's.
    fn all_gather(&self, link: &Link<'_>, stage: &mut [u8], data: &mut [u8]) -> Result<()> {
        let (n, r) = (self.n, link.ctx.rank as usize);
        let mut index = ((n - 1) * self.rs_segments) as u64;
        for segment in 0..self.ag_segments {
            for step in 0..n - 1 {
                let (send_block, recv_block) = layout::all_gather_step(r, n, step);
                let send_range = self.blocks.segment(send_block, self.ag_segments, segment);
                let send = layout::bytes(send_range, self.esize);
                let send_len = send.len();
                stage[HEADER_BYTES..][..send_len].copy_from_slice(&data[send]);
                link.send(index, stage, send_len)?;

                let recv_range = self.blocks.segment(recv_block, self.ag_segments, segment);
                let recv = layout::bytes(recv_range, self.esize);
                link.receive(index, self.messages, &mut data[recv])?;
                index += 1;
            }
        }
        Ok(())
    }
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
                op: self.ctx.name(),
                peer: Some(peer),
                expected: mine.data_bytes,
                got: theirs.data_bytes,
                dtype: None,
                lengths: Vec::new(),
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
            match self.check_peers(peer) {
                Err(CollectiveError::PeerLost { peer: lost, .. })
                    if lost == peer && !self.ops.source_finished(peer) =>
                {
                    // The awaited rank has left, but what it put before leaving may still be
                    // on its way through this rank's heap service: a rank that finished its
                    // part may drop its transport while its last put is being applied here.
                }
                Err(lost @ CollectiveError::PeerLost { .. }) => {
                    // Everything the awaited rank sent has been applied: the word is final.
                    return match self.ops.wait_until(offset, Cmp::Ge, value, Duration::ZERO) {
                        Ok(_) => Ok(()),
                        Err(_) => Err(lost),
                    };
                }
                other => other?,
            }
            self.ctx.answer_probes(peer)?;
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
}
