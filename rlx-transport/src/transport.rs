//! The two-sided [`Transport`] contract that every backend implements and that the collectives
//! are written against (its failure notices are [`Failure`], in `failure.rs`), and the
//! capability hooks ([`NativeCollectives`], and [`SymmetricOps`] for transports with a
//! symmetric heap).

use std::time::Duration;

use crate::Failure;
use crate::admission::Admission;
use crate::error::FatalCause;
use crate::symmetric::{Cmp, Completion, Region, Signal, SymmetricHeap, SymmetricTransport};
use crate::{CollectiveError, DType, ReduceKind, Result, TRANSPORT_GROUP, Tag, Topology};

/// The default operation timeout: how long a blocking receive waits before it fails with
/// [`CollectiveError::Timeout`] (300 s, long enough for a slow first step of a large model;
/// `RLX_TIMEOUT_MS` overrides it in the launchers).
pub const DEFAULT_OP_TIMEOUT: Duration = Duration::from_secs(300);

/// The largest segment (bytes) the collectives cut their buffers into on a transport's
/// [`Transport::segment_hint`]; a larger hint counts as this. The collectives keep their
/// reusable segment buffers up to this size, so that no call faults in fresh pages for them.
pub const MAX_SEGMENT_HINT: usize = 4 << 20;

/// Counters of the messages a transport moved between this rank and the others since it was
/// built (messages to itself are not counted): see [`Transport::traffic`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Traffic {
    /// Payload bytes of the messages sent to other ranks (frame headers not included).
    pub sent_bytes: u64,
    /// Payload bytes received from other ranks.
    pub received_bytes: u64,
    /// Of `received_bytes`, those that landed in a buffer of the transport's own because no
    /// receive into a caller's buffer was waiting for them; the caller pays one more copy for
    /// each. Zero for a schedule whose receives are always posted in time.
    pub copied_bytes: u64,
    /// Of `received_bytes`, those read straight from the sender's memory by a transport's
    /// single-copy path between processes of one host, instead of through a socket.
    pub single_copy_bytes: u64,
    /// Of `single_copy_bytes`, those copied out of a shared-memory bounce buffer the sender
    /// copied them into (rather than read from the sender's own memory).
    pub bounced_bytes: u64,
}

impl Traffic {
    /// Counters with these values (for transports outside this crate).
    pub const fn new(sent_bytes: u64, received_bytes: u64, copied_bytes: u64) -> Self {
        Traffic {
            sent_bytes,
            received_bytes,
            copied_bytes,
            single_copy_bytes: 0,
            bounced_bytes: 0,
        }
    }

    /// These counters with `bytes` of the received ones read by a single-copy path.
    pub const fn with_single_copy(mut self, bytes: u64) -> Self {
        self.single_copy_bytes = bytes;
        self
    }

    /// These counters with `bytes` of the single-copy ones copied out of a bounce buffer.
    pub const fn with_bounced(mut self, bytes: u64) -> Self {
        self.bounced_bytes = bytes;
        self
    }
}

/// Two-sided, tagged, matched message passing between the ranks of one world.
///
/// Semantics every implementation keeps:
/// - A message is matched by `(source rank, tag)`; messages from one source with one tag arrive
///   in send order (FIFO). Messages with other tags never satisfy the receive.
/// - A send returns once the bytes are handed over; the caller's buffers may be reused at once.
/// - The length of a message comes from the wire and is never trusted beyond the
///   implementation's frame cap.
/// - Every blocking call ends: with data, with its deadline, with [`CollectiveError::PeerLost`]
///   when the peer is gone, or with [`CollectiveError::Aborted`] after [`Transport::abort`].
///
/// Implementors provide the `*_message` methods on full 64-bit [`Tag`]s; the `*_bytes` methods
/// are the user-facing point-to-point API on `u32` tags and refuse the reserved tag range.
pub trait Transport: Send + Sync {
    /// This process's rank, in `0..world_size()`.
    fn rank(&self) -> u32;

    /// Number of ranks in the world.
    fn world_size(&self) -> u32;

    /// Sends the concatenation of `parts` as one message to `to` under `tag`. Returns once the
    /// bytes are handed to the transport (they may still be in flight).
    fn send_message(&self, to: u32, tag: Tag, parts: &[&[u8]]) -> Result<()>;

    /// Waits up to `timeout` for the next message from `from` under `tag` and returns it, or
    /// `Ok(None)` when the deadline passes first. A zero timeout polls.
    fn recv_message(&self, from: u32, tag: Tag, timeout: Duration) -> Result<Option<Vec<u8>>>;

    /// Like [`Transport::recv_message`], but lands the message in `buf` and returns its length.
    /// A message longer than `buf` fails with [`CollectiveError::LengthMismatch`] (and is
    /// consumed). Transports override this to receive without allocating. A message that is
    /// landing in `buf` when the deadline passes may be received whole, past the deadline,
    /// while its bytes keep coming: giving up would leave the transport to hold the rest of it
    /// in a buffer of its own (TCP does so; see `rlx-net`).
    fn recv_message_into(
        &self,
        from: u32,
        tag: Tag,
        buf: &mut [u8],
        timeout: Duration,
    ) -> Result<Option<usize>> {
        let Some(message) = self.recv_message(from, tag, timeout)? else {
            return Ok(None);
        };
        let capacity = buf.len() as u64;
        let dst = buf
            .get_mut(..message.len())
            .ok_or(CollectiveError::LengthMismatch {
                op: "recv",
                peer: Some(from),
                expected: capacity,
                got: message.len() as u64,
                dtype: None,
                lengths: Vec::new(),
            })?;
        dst.copy_from_slice(&message);
        Ok(Some(message.len()))
    }

    /// Sends the concatenation of `parts` to `to` and receives the next message from `from`
    /// into `buf`, both under `tag`, as one exchange (a ring step, a pairwise swap): returns
    /// the received length, or `Ok(None)` when `timeout`, counted from the moment the send was
    /// handed over, passes first. The receive's errors are those of
    /// [`Transport::recv_message_into`]; a failed send fails the call and leaves any message
    /// that was arriving for a later receive.
    ///
    /// The default sends, then receives. Socket transports override it to post the receive
    /// before they write, so that the incoming message lands in `buf` while the outgoing one
    /// is still being written, instead of in a copy of their own.
    fn send_recv_into(
        &self,
        to: u32,
        from: u32,
        tag: Tag,
        parts: &[&[u8]],
        buf: &mut [u8],
        timeout: Duration,
    ) -> Result<Option<usize>> {
        self.send_message(to, tag, parts)?;
        self.recv_message_into(from, tag, buf, timeout)
    }

    /// What this transport has moved so far, for tests and tools that check an algorithm's
    /// traffic; `None` when the transport does not count it (the default).
    fn traffic(&self) -> Option<Traffic> {
        None
    }

    /// The messages from `from` that arrived (or are arriving) and wait for a receive, as
    /// (tag, length in bytes), oldest first: what a receive that waits in vain for another tag
    /// names as the likely mistake. Empty (the default) when the transport cannot tell.
    fn unreceived_from(&self, from: u32) -> Vec<(Tag, u64)> {
        let _ = from;
        Vec::new()
    }

    /// The smallest segment pipelined collectives among `members` (world ranks, this one
    /// among them) should cut their buffers into, when this transport moves large messages
    /// between them better in larger pieces than the collectives' defaults; `None` (the
    /// default) leaves the choice to the collectives.
    ///
    /// Every member cuts its buffers alike, so every member's transport must give the same
    /// answer for the same members: base it on facts both ends of every link see alike (where
    /// the peers run), never on a setting of one rank's. A transport whose messages between
    /// processes of one host cost a round trip each and no pipelining (a single-copy path)
    /// says so here. Hints above [`MAX_SEGMENT_HINT`] count as that.
    fn segment_hint(&self, members: &[u32]) -> Option<usize> {
        let _ = members;
        None
    }

    /// The link matrix of the world this transport joined (see [`Topology`]): which ranks a
    /// cable joins, which a switch, which only a route. Every rank's transport must give the
    /// same matrix, as plans made from it must agree. `None` (the default) when the transport
    /// does not know, or no longer knows (a world that grew).
    fn topology(&self) -> Option<Topology> {
        None
    }

    /// Tells `to` that this rank's part of the operation under `tag` failed, so that `to`'s next
    /// receive from this rank under `tag` fails with the matching error instead of waiting for
    /// data that will never come. The default does nothing (peers then rely on their timeout).
    ///
    /// Implementations deliver a notice exactly like a message: matched by `(source, tag)`,
    /// FIFO with the messages of that pair, drained before a lost source's
    /// [`CollectiveError::PeerLost`], and never dropped for lack of a waiting receive. The
    /// collectives rely on this for their group-wide notices ([`Failure::GroupFailed`]), which
    /// they send under a reserved phase of the group's tag space to every member of a group
    /// that failed fatally and look for while they wait, whatever operation they are in.
    fn send_failure(&self, to: u32, tag: Tag, failure: Failure) -> Result<()> {
        let _ = (to, tag, failure);
        Ok(())
    }

    /// Sends a message that must not wait behind a peer that does not read: the control
    /// messages of the groups above (wait probes, their answers) go to ranks that may have
    /// stopped or been cut off, whose sockets are full. `Ok(false)` when the message could not
    /// start to leave within `wait`, and then nothing was sent and the link stays usable; once
    /// it has started, it is finished as [`Transport::send_message`] would. The default sends
    /// it as `send_message` does, which suits transports whose sends never wait on the peer.
    fn try_send_message(&self, to: u32, tag: Tag, parts: &[&[u8]], wait: Duration) -> Result<bool> {
        let _ = wait;
        self.send_message(to, tag, parts).map(|()| true)
    }

    /// [`Transport::try_send_message`] that runs `meanwhile`, work of the caller's own, while
    /// the message is in flight, and returns once both are over. A transport whose send ends
    /// only when the peer has read the message (a single copy between processes of one host)
    /// runs `meanwhile` between handing the message over and that end, so the caller's work
    /// and the peer's copy overlap; a collective that sends to several peers nests its sends
    /// this way and has all of them in flight at once. The default sends, then runs it.
    ///
    /// `meanwhile` runs exactly once if the message started to leave (`Ok(true)`) and never
    /// if it did not (`Ok(false)`) or the send failed first. Its error is the call's error,
    /// returned once the send has ended as it would have without `meanwhile`, so that a peer
    /// that is reading is not left with half a message. `meanwhile` must not send to `to`: in
    /// a transport that keeps the link to `to` for the message meanwhile, such a send would
    /// wait for the one it runs inside, and it fails with
    /// [`CollectiveError::InvalidArgument`] instead.
    fn try_send_message_during(
        &self,
        to: u32,
        tag: Tag,
        parts: &[&[u8]],
        wait: Duration,
        meanwhile: &mut dyn FnMut() -> Result<()>,
    ) -> Result<bool> {
        if !self.try_send_message(to, tag, parts, wait)? {
            return Ok(false);
        }
        meanwhile().map(|()| true)
    }

    /// [`Transport::send_failure`] under the rule of [`Transport::try_send_message`]: the
    /// groups' failure notices go to every member, and one member that does not read must not
    /// hold them back from the others.
    fn try_send_failure(
        &self,
        to: u32,
        tag: Tag,
        failure: Failure,
        wait: Duration,
    ) -> Result<bool> {
        let _ = wait;
        self.send_failure(to, tag, failure).map(|()| true)
    }

    /// How long blocking calls without an explicit deadline wait ([`DEFAULT_OP_TIMEOUT`] unless
    /// the transport was configured otherwise).
    fn op_timeout(&self) -> Duration {
        DEFAULT_OP_TIMEOUT
    }

    /// Wakes every blocked call on this transport with [`CollectiveError::Aborted`] and makes
    /// every later call fail the same way. Idempotent.
    fn abort(&self) {}

    /// Declares world rank `peer` dead on this rank, for good: from then on every receive from
    /// it fails with [`CollectiveError::PeerLost`] (what it had queued is dropped), every send
    /// to it fails the same way, and `peer` in turn sees this rank as lost. Nothing `peer`
    /// sends afterwards reaches this rank. Before the link closes, `peer` is told, best effort
    /// and without blocking, with a notice under [`EXCLUSION_TAG`](crate::EXCLUSION_TAG)
    /// ([`Failure::GroupFailed`] naming `peer`, cause
    /// [`FatalCause::Excluded`]); [`Transport::excluded_by`] looks for it. Idempotent;
    /// excluding this rank itself is refused.
    ///
    /// This is what lets survivors of a failure go on without a rank that stopped answering
    /// (`ProcessGroup::shrink`): a rank that was only slow can never mix its bytes with the
    /// survivors' new group. The default refuses with [`CollectiveError::Unsupported`], for
    /// backends whose peers are fixed for the life of the world.
    fn exclude_peer(&self, peer: u32) -> Result<()> {
        let _ = peer;
        Err(CollectiveError::unsupported(
            "this transport cannot exclude a peer (its links are fixed for the life of the world)",
        ))
    }

    /// Whether `peer` told this rank that it excluded it ([`Transport::exclude_peer`]); looks
    /// without waiting and consumes the notice.
    fn excluded_by(&self, peer: u32) -> bool {
        matches!(
            self.recv_message(peer, crate::EXCLUSION_TAG, Duration::ZERO),
            Err(CollectiveError::GroupFailed {
                cause: FatalCause::Excluded,
                ..
            })
        )
    }

    /// How this transport admits new processes into the job (`ProcessGroup::grow`), if it
    /// can; see the [`admission`](crate::admission) module.
    fn admission(&self) -> Option<&dyn Admission> {
        None
    }

    /// Collectives the backend runs natively (MLX's `all_sum`, ...), if any. `ProcessGroup` uses
    /// them for the world group where they meet its semantics.
    fn native_collectives(&self) -> Option<&dyn NativeCollectives> {
        None
    }

    /// The transport's symmetric heap, when it has one: the one-sided operations that code
    /// holding only a `dyn Transport` (such as `ProcessGroup`) can use. A transport that
    /// implements [`SymmetricTransport`] overrides this to return itself; the default, `None`,
    /// means "two-sided only".
    fn symmetric(&self) -> Option<&dyn SymmetricOps> {
        None
    }

    /// Sends `data` to `to` under the user tag `tag` (below [`crate::TAG_RESERVED_BASE`]).
    fn send_bytes(&self, to: u32, tag: u32, data: &[u8]) -> Result<()> {
        self.send_message(to, Tag::user(tag)?, &[data])
    }

    /// Receives the next message from `from` under the user tag `tag`, waiting at most
    /// [`Transport::op_timeout`].
    fn recv_bytes(&self, from: u32, tag: u32) -> Result<Vec<u8>> {
        let after = self.op_timeout();
        self.recv_message(from, Tag::user(tag)?, after)?
            .ok_or(CollectiveError::Timeout {
                peer: Some(from),
                op: "recv",
                after,
            })
    }

    /// Receives the next message from `from` under the user tag `tag`, or `Ok(None)` after
    /// `timeout`.
    fn recv_bytes_timeout(
        &self,
        from: u32,
        tag: u32,
        timeout: Duration,
    ) -> Result<Option<Vec<u8>>> {
        self.recv_message(from, Tag::user(tag)?, timeout)
    }

    /// Blocks until every rank of the world has entered the barrier.
    ///
    /// The default is a dissemination barrier (⌈log2 n⌉ rounds of one send and one receive) on
    /// the transport's reserved group. It needs no sequence numbers: FIFO order per
    /// `(source, tag)` keeps consecutive barriers apart.
    fn barrier(&self) -> Result<()> {
        let n = self.world_size();
        let rank = self.rank();
        let timeout = self.op_timeout();
        let mut distance = 1u32;
        let mut round = 0u16;
        while distance < n {
            let to = (rank + distance) % n;
            let from = (rank + n - distance) % n;
            let tag = Tag::op(TRANSPORT_GROUP, 0, round);
            self.send_message(to, tag, &[])?;
            if self.recv_message(from, tag, timeout)?.is_none() {
                return Err(CollectiveError::Timeout {
                    peer: Some(from),
                    op: "barrier",
                    after: timeout,
                });
            }
            distance = distance.saturating_mul(2);
            round += 1;
        }
        Ok(())
    }
}

/// Which native collective [`NativeCollectives::supports`] is asked about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum NativeOp {
    /// In-place all-reduce.
    AllReduce,
    /// All-gather in rank order.
    AllGather,
    /// Reduce-scatter into equal blocks.
    ReduceScatter,
}

/// Collectives a backend runs itself over the whole world (MLX's `all_sum`, `all_gather`,
/// `sum_scatter`). Buffers are raw little-endian elements of `dtype`.
pub trait NativeCollectives: Send + Sync {
    /// Whether `op` on `dtype` with `reduce` (none for gathers) runs natively with RLX's
    /// semantics; when false the caller uses its own algorithms.
    fn supports(&self, op: NativeOp, dtype: DType, reduce: Option<ReduceKind>) -> bool;

    /// In-place all-reduce of `data` over the world.
    fn all_reduce(&self, data: &mut [u8], dtype: DType, reduce: ReduceKind) -> Result<()>;

    /// Gathers every rank's `local` into `out` (world_size × `local.len()` bytes, rank order).
    fn all_gather(&self, local: &[u8], out: &mut [u8], dtype: DType) -> Result<()>;

    /// Reduces `input` (world_size equal blocks) and leaves this rank's block in `out`.
    fn reduce_scatter(
        &self,
        input: &[u8],
        out: &mut [u8],
        dtype: DType,
        reduce: ReduceKind,
    ) -> Result<()>;
}

/// The dyn-compatible part of [`SymmetricTransport`], returned by [`Transport::symmetric`].
///
/// `SymmetricTransport` cannot be a trait object (its non-blocking handles are associated
/// types), so this trait offers what one-sided algorithms need without them: blocking and
/// detached puts with a signal, waiting on a local signal word, `quiet`, and the collective
/// `alloc`/`free`. Every `SymmetricTransport` implements it; the methods mean
/// exactly what the `SymmetricTransport` methods of the same names mean.
///
/// It is exported from [`crate::symmetric`] only, not from the crate root, because a value
/// whose type implements both traits would make calls such as `alloc` ambiguous wherever both
/// are imported.
pub trait SymmetricOps: Send + Sync {
    /// This rank's heap, for local reads of data that peers put (after the `wait_until` that
    /// orders it).
    fn heap(&self) -> &SymmetricHeap;

    /// Collective: see [`SymmetricTransport::alloc`].
    fn alloc(&self, len: u64) -> Result<Region>;

    /// Collective: see [`SymmetricTransport::free`].
    fn free(&self, region: Region) -> Result<()>;

    /// Writes `data` into `rank`'s heap at `offset`, then applies `signal` there; returns once
    /// the target applied both.
    fn put_signal(&self, rank: u32, offset: u64, data: &[u8], signal: Signal) -> Result<()>;

    /// Starts [`SymmetricOps::put_signal`] without waiting for it: `data` may be reused at
    /// once, and a failure that is not known yet is reported by the next
    /// [`SymmetricOps::quiet`].
    fn put_signal_detached(
        &self,
        rank: u32,
        offset: u64,
        data: &[u8],
        signal: Signal,
    ) -> Result<()>;

    /// See [`SymmetricTransport::quiet`]: waits until every put issued so far was applied.
    fn quiet(&self) -> Result<()>;

    /// See [`SymmetricTransport::wait_until`].
    fn wait_until(&self, offset: u64, cmp: Cmp, value: u64, timeout: Duration) -> Result<u64>;

    /// See [`SymmetricTransport::source_finished`].
    fn source_finished(&self, rank: u32) -> bool;
}

impl<S: SymmetricTransport> SymmetricOps for S {
    fn heap(&self) -> &SymmetricHeap {
        SymmetricTransport::heap(self)
    }

    fn alloc(&self, len: u64) -> Result<Region> {
        SymmetricTransport::alloc(self, len)
    }

    fn free(&self, region: Region) -> Result<()> {
        SymmetricTransport::free(self, region)
    }

    fn put_signal(&self, rank: u32, offset: u64, data: &[u8], signal: Signal) -> Result<()> {
        SymmetricTransport::put_signal(self, rank, offset, data, signal)
    }

    fn put_signal_detached(
        &self,
        rank: u32,
        offset: u64,
        data: &[u8],
        signal: Signal,
    ) -> Result<()> {
        let handle = SymmetricTransport::put_signal_nbi(self, rank, offset, data, signal)?;
        // A handle that already holds its result (a put to this rank's own heap, or a fast
        // peer) reports it now; the others report through `quiet` once dropped.
        if handle.is_done() {
            handle.wait()
        } else {
            Ok(())
        }
    }

    fn quiet(&self) -> Result<()> {
        SymmetricTransport::quiet(self)
    }

    fn wait_until(&self, offset: u64, cmp: Cmp, value: u64, timeout: Duration) -> Result<u64> {
        SymmetricTransport::wait_until(self, offset, cmp, value, timeout)
    }

    fn source_finished(&self, rank: u32) -> bool {
        SymmetricTransport::source_finished(self, rank)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(not(rlx_loom))]
    #[test]
    fn only_transports_with_a_heap_offer_symmetric_ops() {
        use crate::symmetric::{Cmp, Signal};
        use crate::{MemTransport, Symmetric};

        let plain: std::sync::Arc<dyn Transport> = MemTransport::fan_out(1).remove(0);
        assert!(plain.symmetric().is_none());

        let with_heap: std::sync::Arc<Symmetric<MemTransport>> =
            MemTransport::fan_out_symmetric(1, 256).unwrap().remove(0);
        let as_dyn: std::sync::Arc<dyn Transport> = with_heap;
        let ops = as_dyn
            .symmetric()
            .expect("a symmetric transport offers its heap");
        let region = ops.alloc(64).unwrap();
        let flag = region.offset();
        let data = region.at(8, 3).unwrap();
        ops.put_signal_detached(0, data, b"abc", Signal::set(flag, 7))
            .unwrap();
        assert_eq!(
            ops.wait_until(flag, Cmp::Ge, 7, Duration::from_secs(5))
                .unwrap(),
            7
        );
        let mut got = [0u8; 3];
        ops.heap().read(data, &mut got).unwrap();
        assert_eq!(&got, b"abc");
        // Out of bounds is refused at once for a put to this rank's own heap.
        assert!(
            ops.put_signal_detached(0, u64::MAX - 1, b"x", Signal::set(flag, 8))
                .is_err()
        );
        ops.quiet().unwrap();
        ops.free(region).unwrap();
    }
}
