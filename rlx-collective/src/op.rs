//! One issued collective operation: its tag, its members and the checked send/receive
//! primitives every algorithm is written with.
//!
//! Ranks here are group ranks; [`OpCtx`] maps them to the transport's world ranks. Every
//! receive is exact (a message of another length is a [`CollectiveError::LengthMismatch`]) and
//! bounded by the transport's operation timeout.
//!
//! When an algorithm fails, [`OpCtx::notify_failure`] tells every other member under the
//! operation's tag, so that their next receive of this operation fails at once instead of
//! waiting out the timeout; when the failure is fatal it also fails the whole group (see the
//! `health` module). Every wait of an operation goes through the group's [`Watch`], so that it
//! also ends promptly when the group fails elsewhere.

use std::time::Duration;

use crate::all_reduce::one_sided::region::OneSided;
use crate::cable_path::CablePath;
use crate::flight::FlightRecorder;
use crate::health::{FailureScope, Health, NOTICE_SLICE, Watch, slice_for};
use crate::islands::Islands;
use crate::length_census::{self, CENSUS_WINDOW};
use crate::ring_order::{RingOrder, RingSeat};
use crate::select::{Algorithm, CollectiveOp, Settings};
use crate::wait_chain::{ANSWER_PHASE, Doing};
use crate::{CollectiveError, DType, Failure, NativeCollectives, Result, Tag, Transport};

/// How many sends [`OpCtx::send_all_during`] keeps in flight at once. Each holds its link and
/// a level of the stack until the innermost work is over; sixteen copies at once already
/// outnumber the cores of the hosts this is for.
const SENDS_IN_FLIGHT: usize = 16;

/// What an issued operation is: the executor tells by it which group state the operation
/// uses, and messages and thread names name the operation by it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OpKind {
    /// One of the collectives that [`CollectiveOp`] names.
    Collective(CollectiveOp),
    /// One round of federated averaging.
    FederatedAverage,
    /// The collective allocation of the one-sided all-reduce's scratch region.
    EnableOneSided,
    /// An all-reduce with compressed frames on the wire.
    AllReduceCompressed,
}

impl OpKind {
    /// The snake-case name used in errors and thread names (`"all_reduce"`...).
    pub(crate) const fn name(self) -> &'static str {
        match self {
            OpKind::Collective(op) => op.name(),
            OpKind::FederatedAverage => "federated_average",
            OpKind::EnableOneSided => "enable_one_sided",
            OpKind::AllReduceCompressed => "all_reduce_compressed",
        }
    }
}

impl From<CollectiveOp> for OpKind {
    fn from(op: CollectiveOp) -> OpKind {
        OpKind::Collective(op)
    }
}

/// The context of one collective operation on one rank.
pub(crate) struct OpCtx<'a> {
    pub(crate) transport: &'a dyn Transport,
    members: &'a [u32],
    /// This rank's index in the group.
    pub(crate) rank: u32,
    /// Whether the group is the whole world (native collectives apply only then).
    is_world: bool,
    group: u16,
    seq: u32,
    tag: Tag,
    timeout: Duration,
    kind: OpKind,
    /// The group's settings as of the issue point.
    pub(crate) settings: Settings,
    watch: Watch<'a>,
    one_sided: &'a OneSided,
    flight: &'a FlightRecorder,
    cables: CableView<'a>,
}

/// What the group holds about its cables, for the algorithms that follow them: the order of
/// its rings, its islands (see [`crate::islands`]) and its line of cables (see
/// [`crate::cable_path`]), when its link matrix shows them.
#[derive(Clone, Copy)]
pub(crate) struct CableView<'a> {
    pub(crate) ring_order: &'a RingOrder,
    pub(crate) islands: Option<&'a Islands>,
    pub(crate) chain: Option<&'a CablePath>,
}

/// What [`OpCtx::new`] needs besides the group's transport, members, health and one-sided
/// state.
#[derive(Clone, Copy)]
pub(crate) struct OpId {
    pub(crate) group: u16,
    pub(crate) seq: u32,
    pub(crate) rank: u32,
    pub(crate) is_world: bool,
    pub(crate) kind: OpKind,
    pub(crate) settings: Settings,
    pub(crate) scope: FailureScope,
}

impl OpId {
    /// Whether the operation uses the one-sided scratch region, and so must take its place in
    /// the group's one-sided queue when it is issued: an all-reduce forced to
    /// [`Algorithm::OneSidedRing`] or an explicit enable, on the world group (a sub-group
    /// cannot allocate heap memory, which is collective over the world).
    pub(crate) fn uses_one_sided_region(&self) -> bool {
        let uses_region = match self.kind {
            OpKind::EnableOneSided => true,
            OpKind::Collective(CollectiveOp::AllReduce) => {
                self.settings.all_reduce == Algorithm::OneSidedRing
            }
            _ => false,
        };
        self.is_world && uses_region
    }
}

impl<'a> OpCtx<'a> {
    /// The context of operation `id` of the group with `members`, `health`, `one_sided`
    /// state and `cabling`, on `transport`.
    pub(crate) fn new(
        transport: &'a dyn Transport,
        members: &'a [u32],
        health: &'a Health,
        one_sided: &'a OneSided,
        flight: &'a FlightRecorder,
        cabling: CableView<'a>,
        id: OpId,
    ) -> Self {
        OpCtx {
            transport,
            members,
            rank: id.rank,
            is_world: id.is_world,
            group: id.group,
            seq: id.seq,
            tag: Tag::op(id.group, id.seq, 0),
            timeout: transport.op_timeout(),
            kind: id.kind,
            settings: id.settings,
            watch: Watch::new(transport, members, id.rank, id.group, health, id.scope).doing(
                Doing::Collective {
                    op: id.kind.name(),
                    seq: id.seq,
                },
            ),
            one_sided,
            flight,
            cables: cabling,
        }
    }

    /// The group's line of cables, when it is cabled as one.
    pub(crate) fn chain(&self) -> Option<&'a CablePath> {
        self.cables.chain
    }

    /// The group's islands, when it has some.
    pub(crate) fn islands(&self) -> Option<&'a Islands> {
        self.cables.islands
    }

    /// The world ranks of the group ranks `ranks`.
    pub(crate) fn world_ranks(&self, ranks: &[u32]) -> Result<Vec<u32>> {
        ranks.iter().map(|&r| self.world_rank(r)).collect()
    }

    /// This operation run by the world ranks `members` alone, this rank being `members[rank]`,
    /// under its own `phase`, its rings in `ring_order` (over positions in `members`): one level
    /// of a two-level plan, on which the flat algorithms run unchanged. Its waits still watch
    /// the whole group, and a failure it tells goes to every member of the group.
    pub(crate) fn within<'b>(
        &'b self,
        members: &'b [u32],
        rank: u32,
        phase: u16,
        ring_order: &'b RingOrder,
    ) -> OpCtx<'b> {
        OpCtx {
            members,
            rank,
            is_world: false,
            cables: CableView {
                ring_order,
                islands: None,
                chain: None,
            },
            ..self.phase(phase)
        }
    }

    /// This rank's seat in a ring of the group run by `algorithm`: in rank order for
    /// [`Algorithm::RankOrderRing`], in the group's ring order otherwise.
    pub(crate) fn ring_seat(&self, algorithm: Algorithm) -> RingSeat<'a> {
        let order = (algorithm != Algorithm::RankOrderRing).then_some(self.cables.ring_order);
        RingSeat::new(order, self.members.len(), self.rank)
    }

    /// Records that a ring in `seat`'s order runs the operation, saying when that order is not
    /// rank order.
    pub(crate) fn record_ring(&self, seat: &RingSeat<'_>) {
        self.record_algorithm(if seat.is_rank_order() {
            "ring"
        } else {
            "ring in cable order"
        });
    }

    /// The same operation on another phase (a second channel, e.g. the result of a federated
    /// round, which must not be confused with contributions).
    pub(crate) fn phase(&self, phase: u16) -> OpCtx<'a> {
        debug_assert!(
            phase < ANSWER_PHASE,
            "phase {phase} carries failure notices or wait probes"
        );
        OpCtx {
            tag: Tag::op(self.group, self.seq, phase),
            settings: self.settings,
            ..*self
        }
    }

    /// Number of ranks in the group.
    pub(crate) fn size(&self) -> u32 {
        self.members.len() as u32
    }

    /// The operation's tag (phase 0 unless made with [`OpCtx::phase`]).
    pub(crate) fn tag(&self) -> Tag {
        self.tag
    }

    /// The operation's name, for errors (`"all_reduce"`...).
    pub(crate) fn name(&self) -> &'static str {
        self.kind.name()
    }

    /// The group's one-sided state: the queue of its operations that use the scratch region
    /// of the one-sided all-reduce, and that region once allocated.
    pub(crate) fn one_sided(&self) -> &'a OneSided {
        self.one_sided
    }

    /// The transport's operation timeout.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Fails once the group has failed; called before an operation starts.
    pub(crate) fn check_group(&self) -> Result<()> {
        self.watch.check()
    }

    /// Native collectives, when the transport has them and this group is the world.
    pub(crate) fn native(&self) -> Option<&'a dyn NativeCollectives> {
        if self.is_world {
            self.transport.native_collectives()
        } else {
            None
        }
    }

    /// The segment size of a pipelined algorithm moving `bytes` in elements of `elem_size`:
    /// the group's settings, raised to the transport's hint for these members.
    pub(crate) fn segment_bytes(&self, bytes: usize, elem_size: usize) -> usize {
        let hint = self.transport.segment_hint(self.members);
        self.settings.segment_bytes(bytes, elem_size, hint)
    }

    /// The world rank of group rank `rank`.
    pub(crate) fn world_rank(&self, rank: u32) -> Result<u32> {
        self.members
            .get(rank as usize)
            .copied()
            .ok_or(CollectiveError::UnknownRank {
                rank,
                world_size: self.size(),
            })
    }

    /// Checks that `root` names a member.
    pub(crate) fn check_root(&self, root: u32) -> Result<()> {
        self.world_rank(root).map(|_| ())
    }

    /// Sends `bytes` to group rank `to` under this operation's tag.
    pub(crate) fn send(&self, to: u32, bytes: &[u8]) -> Result<()> {
        self.send_parts(to, &[bytes])
    }

    /// Sends the concatenation of `parts` to group rank `to`. A send that cannot start (the
    /// peer does not read) waits in slices, between which it looks for failure notices and
    /// answers wait probes like a receive; one stuck mid-message answers probes from inside
    /// the transport. A rank stuck behind a silent peer is so never taken for the silent one.
    pub(crate) fn send_parts(&self, to: u32, parts: &[&[u8]]) -> Result<()> {
        self.send_alongside(to, parts, None)
    }

    /// Sends `bytes` to group rank `to` as [`OpCtx::send`] does, running `meanwhile` while the
    /// message is in flight (see [`Transport::try_send_message_during`]): where the peer copies
    /// the message itself, this rank's own work, or its sends to other peers nested in the same
    /// way, overlap that copy. `meanwhile` must not send to `to`.
    pub(crate) fn send_during(
        &self,
        to: u32,
        bytes: &[u8],
        meanwhile: &mut dyn FnMut() -> Result<()>,
    ) -> Result<()> {
        self.send_alongside(to, &[bytes], Some(meanwhile))
    }

    /// Sends `block(rank)` to every group rank in `to` and runs `meanwhile`, with up to
    /// [`SENDS_IN_FLIGHT`] of the sends and then `meanwhile` in flight at once: each send runs
    /// the next while its message is in flight (see [`OpCtx::send_during`]), so that where
    /// peers copy their messages themselves they copy them at the same time, and this rank's
    /// own work overlaps the last of them.
    pub(crate) fn send_all_during<'b>(
        &self,
        to: &[u32],
        block: &dyn Fn(u32) -> &'b [u8],
        meanwhile: &mut dyn FnMut() -> Result<()>,
    ) -> Result<()> {
        // Nesting is bounded, since each level holds a frame of the stack and a link.
        let last = to.len().saturating_sub(1) / SENDS_IN_FLIGHT * SENDS_IN_FLIGHT;
        for batch in to[..last].chunks(SENDS_IN_FLIGHT) {
            self.send_nested(batch, block, &mut || Ok(()))?;
        }
        self.send_nested(&to[last..], block, meanwhile)
    }

    /// Sends `block(rank)` to every rank in `to`, each send running the next, the last
    /// running `meanwhile`.
    fn send_nested<'b>(
        &self,
        to: &[u32],
        block: &dyn Fn(u32) -> &'b [u8],
        meanwhile: &mut dyn FnMut() -> Result<()>,
    ) -> Result<()> {
        match to.split_first() {
            None => meanwhile(),
            Some((&first, rest)) => self.send_during(first, block(first), &mut || {
                self.send_nested(rest, block, &mut *meanwhile)
            }),
        }
    }

    /// [`OpCtx::send_parts`], running `meanwhile` (when given) while the message is in flight.
    fn send_alongside(
        &self,
        to: u32,
        parts: &[&[u8]],
        mut meanwhile: Option<&mut dyn FnMut() -> Result<()>>,
    ) -> Result<()> {
        let peer = self.world_rank(to)?;
        let mut first = true;
        let sent = self.watch.wait(self.timeout, NOTICE_SLICE, peer, |slice| {
            if !std::mem::take(&mut first) {
                self.flight.waiting(self.seq, peer);
            }
            self.watch
                .answering_while_blocked(peer, || match meanwhile.as_deref_mut() {
                    None => self
                        .transport
                        .try_send_message(peer, self.tag, parts, slice),
                    Some(work) => self
                        .transport
                        .try_send_message_during(peer, self.tag, parts, slice, work),
                })
                .map(|sent| sent.then_some(()))
        })?;
        sent.ok_or_else(|| self.timed_out(peer, self.timeout))
    }

    /// Receives the next message of this operation from group rank `from` into `buf`, which it
    /// must fill exactly.
    pub(crate) fn recv_into(&self, from: u32, buf: &mut [u8]) -> Result<()> {
        let peer = self.world_rank(from)?;
        self.flight.waiting(self.seq, peer);
        let expected = buf.len();
        let got = self
            .watch
            .wait(self.timeout, slice_for(expected), peer, |deadline| {
                self.transport
                    .recv_message_into(peer, self.tag, buf, deadline)
            })?;
        self.landed(peer, expected, got)
    }

    /// Sends `bytes` to group rank `to` and receives the next message of this operation from
    /// group rank `from` into `buf`, which it must fill exactly, as one exchange: the transport
    /// lands the incoming message in `buf` while it writes the outgoing one (see
    /// [`Transport::send_recv_into`]). Every step of a ring or of a pairwise exchange is one.
    pub(crate) fn send_recv_into(
        &self,
        to: u32,
        bytes: &[u8],
        from: u32,
        buf: &mut [u8],
    ) -> Result<()> {
        let to = self.world_rank(to)?;
        let peer = self.world_rank(from)?;
        self.watch.check()?;
        self.flight.waiting(self.seq, peer);
        let expected = buf.len();
        let mut sent = false;
        let got = self
            .watch
            .wait(self.timeout, slice_for(expected), peer, |deadline| {
                if std::mem::replace(&mut sent, true) {
                    self.transport
                        .recv_message_into(peer, self.tag, buf, deadline)
                } else {
                    // Until its send is over, the exchange waits on `to`.
                    self.watch.answering_while_blocked(to, || {
                        self.transport
                            .send_recv_into(to, peer, self.tag, &[bytes], buf, deadline)
                    })
                }
            })?;
        self.landed(peer, expected, got)
    }

    /// The end of a receive of `expected` bytes from world rank `peer`: `got` bytes, or none
    /// within the operation timeout.
    fn landed(&self, peer: u32, expected: usize, got: Option<usize>) -> Result<()> {
        match got {
            Some(got) if got == expected => Ok(()),
            Some(got) => Err(CollectiveError::LengthMismatch {
                op: self.name(),
                peer: Some(peer),
                expected: expected as u64,
                got: got as u64,
                dtype: None,
                lengths: Vec::new(),
            }),
            None => Err(self.timed_out(peer, self.timeout)),
        }
    }

    /// Receives the next message of this operation from group rank `from`, whatever its
    /// length, or `Ok(None)` after `timeout`. A zero `timeout` polls: it also looks for a
    /// group-wide notice from `from`, so that a loop polling every member in turn notices a
    /// failure of the group.
    pub(crate) fn recv_within(&self, from: u32, timeout: Duration) -> Result<Option<Vec<u8>>> {
        let peer = self.world_rank(from)?;
        self.flight.waiting(self.seq, peer);
        if timeout.is_zero() {
            self.watch.check()?;
            self.watch.poll_notice_of(peer)?;
            return self.transport.recv_message(peer, self.tag, Duration::ZERO);
        }
        self.watch.wait(timeout, NOTICE_SLICE, peer, |deadline| {
            self.transport.recv_message(peer, self.tag, deadline)
        })
    }

    /// Checks that `bytes` is a whole number of `dtype` elements and records in the flight
    /// recorder how many this operation moves per rank; every algorithm module calls it first.
    pub(crate) fn start(&self, dtype: DType, bytes: usize) -> Result<()> {
        crate::check_dtype_len(bytes, dtype)?;
        self.flight
            .data(self.seq, dtype.name(), (bytes / dtype.size()) as u64);
        Ok(())
    }

    /// Records in the flight recorder the algorithm that runs this operation.
    pub(crate) fn record_algorithm(&self, algorithm: &'static str) {
        self.flight.algorithm(self.seq, algorithm);
    }

    /// The last look of an operation that succeeded here: fails with
    /// [`CollectiveError::GroupFailed`] when a member has already declared the group failed.
    /// A wait looks for those notices only between its slices, so an operation whose data had
    /// all arrived (a rank resumed after a stall, whose peers timed out waiting for it and
    /// announced it) would otherwise report success for a group its members gave up on.
    pub(crate) fn last_look(&self) -> Result<()> {
        self.watch.poll_notices()
    }

    /// Answers, without waiting, the wait probes of other members: this rank waits on world
    /// rank `waits_on` (for waits that do not go through a receive of this context).
    pub(crate) fn answer_probes(&self, waits_on: u32) -> Result<()> {
        self.watch.answer_probes(waits_on)
    }

    /// The error this rank reports for `error`, once it has told the other members (see
    /// [`OpCtx::notify_failure`]). A length mismatch is told first: the error then waits for
    /// the other members' notices, which say what each passed (see the `length_census`
    /// module), and they wait for this rank's.
    pub(crate) fn fail(&self, error: CollectiveError) -> CollectiveError {
        if matches!(error, CollectiveError::LengthMismatch { .. }) {
            self.notify_failure(&error);
            return self.explain(error);
        }
        let error = self.explain(error);
        self.notify_failure(&error);
        error
    }

    /// The error this rank reports for `error`: a length mismatch names this operation, its
    /// element type (the transport it came through knows only that it received bytes) and
    /// what every member passed, and a timeout waiting on a member names the rank that is
    /// really unresponsive (see [`Watch::blame`]).
    fn explain(&self, error: CollectiveError) -> CollectiveError {
        match error {
            CollectiveError::LengthMismatch {
                peer,
                expected,
                got,
                dtype,
                lengths,
                ..
            } => {
                let mut known = lengths;
                if let (Some(own), Ok(me)) = (self.own_bytes(), self.world_rank(self.rank)) {
                    known.push((me, own));
                }
                let window = CENSUS_WINDOW.min(self.timeout);
                let lengths =
                    length_census::gather(self.transport, self.tag, self.members, known, window);
                CollectiveError::LengthMismatch {
                    op: self.name(),
                    peer: CollectiveError::odd_length(&lengths).or(peer),
                    expected,
                    got,
                    dtype: dtype.or_else(|| self.flight.dtype(self.seq)),
                    lengths,
                }
            }
            other => self.watch.blame(other),
        }
    }

    /// How many bytes this rank passed to the operation, once it started.
    fn own_bytes(&self) -> Option<u64> {
        self.flight.data_bytes(self.seq)
    }

    /// The timeout error for waiting on world rank `peer`.
    pub(crate) fn timed_out(&self, peer: u32, after: Duration) -> CollectiveError {
        CollectiveError::Timeout {
            peer: Some(peer),
            op: self.name(),
            after,
        }
    }

    /// Tells every other member that this rank's part failed with `error` (best effort: a
    /// member that cannot be told is already failing on its own), and, when `error` is fatal,
    /// fails the group (see the module docs).
    pub(crate) fn notify_failure(&self, error: &CollectiveError) {
        let failure = match (error, self.watch.group_notice(error)) {
            (&CollectiveError::LengthMismatch { expected, got, .. }, _) => {
                Failure::LengthMismatch {
                    expected,
                    got,
                    own: self.own_bytes(),
                }
            }
            (_, Some((notice, _))) => notice,
            (_, None) => Failure::Failed,
        };
        tracing::debug!(?failure, "sending the failure notice to every member");
        self.watch.tell_members(self.tag, failure);
        self.watch.on_failure(error);
    }
}
