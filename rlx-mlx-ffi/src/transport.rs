//! [`MlxTransport`]: RLX's [`Transport`] over MLX's distributed send/recv, with MLX's
//! `all_sum`, `all_max`, `all_min`, `all_gather` and `sum_scatter` offered as
//! [`NativeCollectives`].
//!
//! # Design
//!
//! MLX's point-to-point calls carry no tag, block until done and cannot be cancelled; a
//! posted MLX receive busy-polls its socket; and the ring backend only talks to the two
//! neighbours, over the same sockets its collectives use. So:
//! - Every message goes out as a [`FIRST_LEN`]-byte first piece (a [`Header`] with source,
//!   destination, tag and length, then the start of the body) and, when the body is longer,
//!   further pieces. Small messages cost one MLX send.
//! - Each directly linked peer has a sender thread draining a queue and a receiver thread.
//!   A caller sends a small frame itself when its link is idle and queues everything else,
//!   so `send_message` never waits for the peer; a queued frame's body beyond its first
//!   piece is copied once, into an MLX array that MLX then sends as it is. The receiver posts
//!   an MLX receive only while somebody needs what comes through its link (a waiting receive,
//!   a native collective, forwarding in rings of four or more, closing), demultiplexes what
//!   arrives into an [`Inbox`] by `(source, tag)`, and forwards messages for other ranks one
//!   hop further round the ring. Receives wait on the inbox, so their deadlines hold although
//!   MLX's receive blocks.
//! - A native collective must own the links, or a posted receive or a queued frame would mix
//!   with the collective's bytes. Every rank sends a pause frame describing the operation
//!   (kind, dtype, reduction, byte length) behind its earlier frames on each link and waits
//!   until its sender threads have sent theirs and its receivers have read the peers'; the
//!   links are then quiet. MLX runs the collective on the transport's collective thread
//!   while the caller waits at most the operation timeout, and the link threads resume.
//!   Mismatched descriptors fail the call on both sides instead of corrupting data.
//!   When this rank's links are idle (nothing queued or being sent, no receive posted), the
//!   link threads are left out altogether: the collective thread takes the links, sends the
//!   pause frames, reads each link up to the peer's pause frame (delivering what arrives
//!   before it) and runs the collective, so the caller hands over once. The wire is the same
//!   either way, so ranks may take either path.
//! - Where some ranks are not linked (rings of four or more), a rank that pauses stops
//!   forwarding, and a rank still finishing its previous operation may wait for a message
//!   that only the paused rank can forward. So there every rank first announces the native
//!   collective to every other rank with ordinary messages, farthest first, and pauses its
//!   links only once all ranks have announced: by then every rank has issued everything it
//!   sent before the collective, and what a rank forwards for others is queued ahead of its
//!   pause frames.
//! - All-reduces of up to a few MiB skip MLX's collective where every rank is linked: a direct
//!   exchange of the contributions over the links (one message per 256 KiB piece and peer)
//!   needs no pause, and on a busy machine it avoids MLX's ring waiting for scheduler ticks
//!   between its busy-polling threads (see [`DIRECT_EXCHANGE_MAX`]).
//!
//! No process-wide lock is held across a blocking MLX call: a link's send lock is held while
//! a frame goes out on that link, and the per-transport collective lock keeps this
//! process's native collectives one at a time, which MLX requires anyway.
//!
//! Where each part lives: framing and routes in `route`, the link and collective threads in
//! `progress`, pauses and announcements in `pause`, the direct exchange in `exchange`, the
//! state they share in `shared`, and joining MLX's group in `bootstrap`. This module keeps
//! the [`Transport`] and [`NativeCollectives`] methods and the graceful close.
//!
//! # Failure
//!
//! A peer that dies closes its sockets; MLX fails the pending receive or collective, the
//! link is marked dead and receives from the ranks behind it fail with
//! [`CollectiveError::PeerLost`] (after a failed collective, every link). A peer that stops
//! participating is caught by the operation timeout, while pausing or inside MLX's
//! collective; the stuck MLX call is left to the collective thread and the transport is
//! unusable afterwards.
//!
//! [`FIRST_LEN`]: crate::shared::FIRST_LEN
//! [`DIRECT_EXCHANGE_MAX`]: crate::exchange::DIRECT_EXCHANGE_MAX
//! [`Inbox`]: rlx_transport::Inbox

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rlx_transport::inbox::Delivery;
use rlx_transport::{
    CollectiveError, DType, Failure, NativeCollectives, NativeOp, ReduceKind, Result, Tag,
    Transport,
};

use crate::backend::Backend;
use crate::ffi::{self, Group, HostArray, ShimError};
use crate::frame::{Header, Kind};
use crate::native::{MlxDtype, MlxReduce, ReducePlan};
use crate::pause::{Descriptor, descriptor};
use crate::pool::abandon_on_failure;
use crate::shared::{ABORT_POLL, Demand, MAX_MESSAGE_LEN, Shared};
use crate::sync::{lock, wait_timeout};

/// RLX's [`Transport`] over MLX's distributed module (`ring`, `jaccl` or `mpi`); see the
/// module docs for how tags, deadlines and native collectives are kept.
///
/// # Examples
///
/// ```no_run
/// use rlx_mlx_ffi::MlxTransport;
/// use rlx_transport::Transport;
///
/// // Launched by `mlx.launch` (or with MLX_HOSTFILE and MLX_RANK set by hand).
/// let t = MlxTransport::from_env()?;
/// if t.rank() == 0 {
///     t.send_bytes(1, 7, b"hello")?;
/// } else if t.rank() == 1 {
///     assert_eq!(t.recv_bytes(0, 7)?, b"hello");
/// }
/// # Ok::<(), rlx_transport::CollectiveError>(())
/// ```
pub struct MlxTransport {
    pub(crate) shared: Arc<Shared>,
}

impl fmt::Debug for MlxTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MlxTransport")
            .field("rank", &self.shared.rank)
            .field("world_size", &self.shared.world)
            .field("backend", &self.shared.backend)
            .field("op_timeout", &self.shared.op_timeout)
            .finish()
    }
}

impl MlxTransport {
    /// The backend this transport runs on (after resolving [`Backend::Any`]).
    pub fn backend(&self) -> Backend {
        self.shared.backend
    }

    /// Sets the largest all-reduce that runs as a direct exchange instead of MLX's own
    /// collective, in bytes of the contribution in the type MLX would reduce times the
    /// number of other ranks (default 16 MiB, or `RLX_MLX_DIRECT_MAX` at init; 0 sends every
    /// all-reduce through MLX). Only worlds where every rank is linked to every other
    /// exchange directly. Every rank must use the same limit: ranks that choose differently
    /// for one call wait for each other until the operation timeout.
    pub fn set_direct_exchange_max(&self, bytes: usize) {
        self.shared.direct_max.store(bytes, Ordering::Relaxed);
    }
}

impl Shared {
    /// Closes gracefully: tells every rank this one is done (behind all of its earlier
    /// messages on the same paths), waits up to the operation timeout until every rank has
    /// said the same (so messages this rank forwards for others are through), then sends the
    /// goodbye frames and waits for the link threads to finish.
    fn finish(&self) {
        let deadline = Instant::now() + self.op_timeout;
        // From here on the receivers read without demand: the notices and goodbyes below
        // must be read, and this rank may have to forward others' notices.
        lock(&self.state).always_receive = true;
        self.changed.notify_all();
        let fin = Tag::op(rlx_transport::TRANSPORT_GROUP, u32::MAX, u16::MAX);
        if self.check_usable().is_ok() {
            // Farthest first: a notice forwarded through a nearer rank then travels ahead of
            // this rank's notice to that rank, so the nearer rank forwards it before it
            // considers itself done.
            let mut peers: Vec<u32> = (0..self.world).filter(|&r| r != self.rank).collect();
            peers.sort_by_key(|&p| std::cmp::Reverse(self.hops_to(p)));
            for peer in peers {
                let _ = self.enqueue(
                    Header {
                        kind: Kind::Data,
                        src: self.rank,
                        dst: peer,
                        tag: fin.raw(),
                        len: 0,
                    },
                    Vec::new(),
                );
            }
            for peer in (0..self.world).filter(|&r| r != self.rank) {
                let left = deadline.saturating_duration_since(Instant::now());
                let _ = self.inbox.take(peer, fin, left);
            }
        }
        self.close(false);
        let mut done = lock(&self.exits.done);
        loop {
            // A thread of a dead link may sit in an MLX call that never returns (MLX stops
            // a failed socket's worker), so a dead link counts as finished.
            let (dead, stuck) = {
                let state = lock(&self.state);
                let dead: Vec<bool> = state.dead.iter().map(Option::is_some).collect();
                (dead, state.collective_stuck)
            };
            let senders = done.senders.iter().zip(&dead).all(|(&d, &x)| d || x);
            let receivers = done.receivers.iter().zip(&dead).all(|(&d, &x)| d || x);
            // Likewise the collective thread once a collective outlived its deadline.
            let collective = done.collective || stuck;
            let now = Instant::now();
            if (senders && receivers && collective) || now >= deadline {
                return;
            }
            done = wait_timeout(&self.exits.changed, done, (deadline - now).min(ABORT_POLL));
        }
    }
}

impl Transport for MlxTransport {
    fn rank(&self) -> u32 {
        self.shared.rank
    }

    fn world_size(&self) -> u32 {
        self.shared.world
    }

    fn send_message(&self, to: u32, tag: Tag, parts: &[&[u8]]) -> Result<()> {
        let s = &self.shared;
        s.check_usable()?;
        if to >= s.world {
            return Err(CollectiveError::UnknownRank {
                rank: to,
                world_size: s.world,
            });
        }
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if len as u64 > MAX_MESSAGE_LEN {
            return Err(CollectiveError::invalid(format!(
                "message of {len} bytes to rank {to} exceeds the MLX transport's limit of \
                 {MAX_MESSAGE_LEN}"
            )));
        }
        let body = parts.concat();
        if to == s.rank {
            return s.inbox.deliver(s.rank, tag, Delivery::Data(body));
        }
        s.send_or_enqueue(
            Header {
                kind: Kind::Data,
                src: s.rank,
                dst: to,
                tag: tag.raw(),
                len: len as u64,
            },
            body,
        )
    }

    fn recv_message(&self, from: u32, tag: Tag, timeout: Duration) -> Result<Option<Vec<u8>>> {
        let s = &self.shared;
        if from >= s.world {
            return Err(CollectiveError::UnknownRank {
                rank: from,
                world_size: s.world,
            });
        }
        s.check_usable()?;
        if let Some(message) = s.inbox.take(from, tag, Duration::ZERO)? {
            return Ok(Some(message));
        }
        if from == s.rank {
            return s.inbox.take(from, tag, timeout);
        }
        // MLX's ring busy-polls a socket while a receive is posted on it, so the link's
        // receiver posts one only while somebody waits for what comes through it.
        let Some(index) = s.link_index(s.last_hop_from(from)) else {
            return s.inbox.take(from, tag, timeout);
        };
        if timeout.is_zero() {
            s.note_poll(index, from, tag);
            return Ok(None);
        }
        let _demand = Demand::register(s, index, from, tag);
        s.inbox.take(from, tag, timeout)
    }

    fn send_failure(&self, to: u32, tag: Tag, failure: Failure) -> Result<()> {
        let s = &self.shared;
        s.check_usable()?;
        if to >= s.world {
            return Err(CollectiveError::UnknownRank {
                rank: to,
                world_size: s.world,
            });
        }
        if to == s.rank {
            return s.inbox.deliver(s.rank, tag, Delivery::Failure(failure));
        }
        let body = failure.encode().to_vec();
        s.send_or_enqueue(
            Header {
                kind: Kind::Failure,
                src: s.rank,
                dst: to,
                tag: tag.raw(),
                len: body.len() as u64,
            },
            body,
        )
    }

    fn op_timeout(&self) -> Duration {
        self.shared.op_timeout
    }

    fn abort(&self) {
        self.shared.close(true);
    }

    fn native_collectives(&self) -> Option<&dyn NativeCollectives> {
        Some(self)
    }
}

/// Checks that a gather's output (a reduce-scatter's input) of `whole` bytes holds exactly one
/// `block` of bytes per rank of a world of `world` ranks.
fn check_world_blocks(op: &'static str, block: usize, whole: usize, world: u32) -> Result<()> {
    let expected = block as u64 * u64::from(world);
    if whole as u64 != expected {
        return Err(CollectiveError::LengthMismatch {
            op,
            peer: None,
            expected,
            got: whole as u64,
            dtype: None,
            lengths: Vec::new(),
        });
    }
    Ok(())
}

fn check_elements(what: &str, len: usize, dtype: DType) -> Result<usize> {
    if len % dtype.size() != 0 {
        return Err(CollectiveError::invalid(format!(
            "{what} holds {len} bytes, not a whole number of {dtype} elements"
        )));
    }
    let count = len / dtype.size();
    if count > i32::MAX as usize {
        return Err(CollectiveError::unsupported(format!(
            "{what} of {count} elements exceeds MLX's limit of {} elements per call",
            i32::MAX
        )));
    }
    Ok(count)
}

impl MlxTransport {
    /// Runs the native collective `run` from an MLX array holding `input` (elements of
    /// `in_dtype`) into one of `out_count` elements of `out_dtype`, and reads the result into
    /// `result`. With nothing to move, the ranks still pause and check that they agree on the
    /// call.
    fn native_in_to_out(
        &self,
        op: &'static str,
        desc: Descriptor,
        (in_dtype, input): (MlxDtype, &[u8]),
        (out_dtype, out_count): (MlxDtype, usize),
        result: &mut [u8],
        run: fn(&Group, &HostArray, &mut HostArray) -> Result<(), ShimError>,
    ) -> Result<()> {
        let s = &self.shared;
        let failed = |e: ShimError| e.into_error(op);
        let arrays = if input.is_empty() || out_count == 0 {
            None
        } else {
            Some((
                s.arrays.filled(in_dtype, input).map_err(failed)?,
                s.arrays.blank(out_dtype, out_count).map_err(failed)?,
            ))
        };
        let done = s.native(op, desc, move |g| {
            let Some((input, mut output)) = arrays else {
                return Ok(None);
            };
            match run(g, &input, &mut output) {
                Ok(()) => Ok(Some((input, output))),
                Err(e) => Err(abandon_on_failure(e, (input, output))),
            }
        })?;
        if let Some((input, output)) = done {
            output.read_into(result).map_err(failed)?;
            s.arrays.give_back(input);
            s.arrays.give_back(output);
        }
        Ok(())
    }
}

impl NativeCollectives for MlxTransport {
    fn supports(&self, op: NativeOp, dtype: DType, reduce: Option<ReduceKind>) -> bool {
        if self.shared.world == 1 {
            return true;
        }
        let plan = reduce.and_then(|r| ReducePlan::new(dtype, r));
        match op {
            NativeOp::AllReduce => plan.is_some(),
            NativeOp::AllGather => reduce.is_none(),
            NativeOp::ReduceScatter => {
                self.shared.backend.has_sum_scatter()
                    && plan.is_some_and(|p| p.op == MlxReduce::Sum)
            }
            _ => false,
        }
    }

    fn all_reduce(&self, data: &mut [u8], dtype: DType, reduce: ReduceKind) -> Result<()> {
        let s = &self.shared;
        check_elements("all_reduce buffer", data.len(), dtype)?;
        if s.world == 1 {
            return s.check_usable();
        }
        let plan = ReducePlan::new(dtype, reduce).ok_or_else(|| {
            CollectiveError::unsupported(format!(
                "MLX has no native {reduce} all-reduce of {dtype}"
            ))
        })?;
        let desc = descriptor(NativeOp::AllReduce, dtype, Some(reduce), data.len());
        let wire_len = data.len() / dtype.size() * plan.wire.size();
        let direct_max = s.direct_max.load(Ordering::Relaxed);
        if direct_max > 0
            && wire_len.saturating_mul(s.world as usize - 1) <= direct_max
            && s.links.len() + 1 == s.world as usize
        {
            return s.exchange_all_reduce(data, plan, desc);
        }
        let failed = |e: ShimError| e.into_error("all_reduce");
        // The MLX array is filled here, on the caller's thread, straight from the caller's
        // bytes when MLX can reduce them as they are, else from their widened copy.
        let array = match (data.is_empty(), plan.in_place()) {
            (true, _) => None,
            (false, true) => Some(s.arrays.filled(plan.wire, data).map_err(failed)?),
            (false, false) => Some(
                s.arrays
                    .filled(plan.wire, &plan.widen(data))
                    .map_err(failed)?,
            ),
        };
        let op = plan.op;
        let reduced = s.native("all_reduce", desc, move |g| {
            let Some(mut array) = array else {
                return Ok(None);
            };
            match g.all_reduce(op, &mut array) {
                Ok(()) => Ok(Some(array)),
                Err(e) => Err(abandon_on_failure(e, array)),
            }
        })?;
        let Some(reduced) = reduced else {
            return Ok(());
        };
        if plan.in_place() {
            reduced.read_into(data).map_err(failed)?;
            s.arrays.give_back(reduced);
            return Ok(());
        }
        let mut wire = vec![0u8; reduced.nbytes()];
        reduced.read_into(&mut wire).map_err(failed)?;
        s.arrays.give_back(reduced);
        plan.narrow(&wire, data, s.world)
    }

    fn all_gather(&self, local: &[u8], out: &mut [u8], dtype: DType) -> Result<()> {
        let s = &self.shared;
        check_elements("all_gather input", local.len(), dtype)?;
        check_world_blocks("native all_gather", local.len(), out.len(), s.world)?;
        if s.world == 1 {
            out.copy_from_slice(local);
            return s.check_usable();
        }
        check_elements("all_gather output", out.len(), DType::U8)?;
        let desc = descriptor(NativeOp::AllGather, dtype, None, local.len());
        // Gathers move bytes, so they travel as MLX uint8 whatever the dtype.
        self.native_in_to_out(
            "all_gather",
            desc,
            (MlxDtype::U8, local),
            (MlxDtype::U8, out.len()),
            out,
            Group::all_gather,
        )
    }

    fn reduce_scatter(
        &self,
        input: &[u8],
        out: &mut [u8],
        dtype: DType,
        reduce: ReduceKind,
    ) -> Result<()> {
        let s = &self.shared;
        check_elements("reduce_scatter output", out.len(), dtype)?;
        check_world_blocks("native reduce_scatter", out.len(), input.len(), s.world)?;
        if s.world == 1 {
            out.copy_from_slice(input);
            return s.check_usable();
        }
        let plan = ReducePlan::new(dtype, reduce)
            .filter(|_| self.supports(NativeOp::ReduceScatter, dtype, Some(reduce)))
            .ok_or_else(|| {
                CollectiveError::unsupported(format!(
                    "MLX's {} backend has no native {reduce} reduce-scatter of {dtype}",
                    s.backend
                ))
            })?;
        check_elements("reduce_scatter input", input.len(), dtype)?;
        let desc = descriptor(NativeOp::ReduceScatter, dtype, Some(reduce), input.len());
        let count = out.len() / dtype.size();
        let mut wire = vec![0u8; count * plan.wire.size()];
        self.native_in_to_out(
            "reduce_scatter",
            desc,
            (plan.wire, &plan.widen(input)),
            (plan.wire, count),
            &mut wire,
            Group::sum_scatter,
        )?;
        plan.narrow(&wire, out, s.world)
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // MPI must be finalised before the process exits, and MLX finalises it only when its
        // world group is destroyed; once the last user of the group is gone, MLX's cache is
        // the only holder left.
        if self.backend == Backend::Mpi {
            ffi::clear_backends();
        }
    }
}

impl Drop for MlxTransport {
    fn drop(&mut self) {
        self.shared.finish();
        self.shared.inbox.close(format!(
            "rank {} dropped its MLX transport",
            self.shared.rank
        ));
    }
}
