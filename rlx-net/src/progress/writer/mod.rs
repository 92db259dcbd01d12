//! The writer: the frames of one message to one peer, written as the sockets take them — one
//! frame per stripe over the peer's links, or one descriptor frame when the same-host room
//! carries the message by single copy — under the send's two deadlines (its first byte, the
//! operation timeout).
//!
//! The writer knows neither the exchange nor how the same-host paths work: it asks the
//! same-host room once per message how the message travels ([`Carriage`]), and while it waits
//! for room it calls the [`ProgressHook`] it was given (an exchange's receive), or else reads
//! every free link of every peer (`recv.rs`), so that ranks sending to each other cannot
//! deadlock.

mod frames;
mod wait;

use std::cell::RefCell;
use std::time::{Duration, Instant};

use rlx_transport::{CollectiveError, Failure, Tag};

use crate::frame::FrameKind;
use crate::sync::{Mutex, lock};

use super::core::Core;
use super::hook::ProgressHook;
use super::link::{PeerIo, TxState};
use super::reader::Reader;
use super::same_host::{Carriage, SameHost};

use self::frames::{Frames, Outgoing};
use self::wait::{SendWait, try_lock_until};

thread_local! {
    /// The sends whose caller's work runs on this thread now (see
    /// [`WhileSending::CallerWork`]), as (engine address, destination rank): each holds its
    /// destination's links until its work is over, so a send to the same destination from
    /// inside that work would wait for itself.
    static OPEN: RefCell<Vec<(usize, u32)>> = const { RefCell::new(Vec::new()) };
}

/// The work a caller runs while its message is in flight, see
/// `Transport::try_send_message_during`.
pub(crate) type Meanwhile<'a> = &'a mut dyn FnMut() -> Result<(), CollectiveError>;

/// What a send does besides writing its message and waiting for the peer to take it.
pub(super) enum WhileSending<'a> {
    /// Nothing.
    Nothing,
    /// It moves other work on between its writes and while it waits (see [`ProgressHook`]).
    Hook(&'a mut dyn ProgressHook),
    /// It runs the caller's work once the message is handed over, before it waits for the
    /// peer to take it, so that the two overlap.
    CallerWork(Meanwhile<'a>),
}

/// Marks a send's work as running on this thread until it is dropped (also when the work
/// panics).
struct OpenSend(usize, u32);

impl OpenSend {
    fn enter(engine: usize, to: u32) -> Self {
        OPEN.with(|open| open.borrow_mut().push((engine, to)));
        Self(engine, to)
    }

    /// Whether work of a send of `engine` to `to` runs on this thread.
    fn running(engine: usize, to: u32) -> bool {
        OPEN.with(|open| open.borrow().contains(&(engine, to)))
    }
}

impl Drop for OpenSend {
    fn drop(&mut self) {
        OPEN.with(|open| {
            let mut open = open.borrow_mut();
            if let Some(i) = open.iter().rposition(|&entry| entry == (self.0, self.1)) {
                open.remove(i);
            }
        });
    }
}

/// The writer's view: the engine's core, the same-host room it asks how a message travels,
/// the reader that drains free links while a send waits, and the count of messages this rank
/// sent itself.
#[derive(Clone, Copy)]
pub(super) struct Writer<'a> {
    core: &'a Core,
    same_host: SameHost<'a>,
    reader: Reader<'a>,
    to_self: &'a Mutex<u64>,
}

impl<'a> Writer<'a> {
    pub(super) fn new(
        core: &'a Core,
        same_host: SameHost<'a>,
        reader: Reader<'a>,
        to_self: &'a Mutex<u64>,
    ) -> Self {
        Self {
            core,
            same_host,
            reader,
            to_self,
        }
    }
}

impl Writer<'_> {
    /// Sends one message (or notice) to `to`; returns once every byte is written to the
    /// kernel.
    pub(crate) fn send(
        &self,
        to: u32,
        kind: FrameKind,
        tag: Tag,
        parts: &[&[u8]],
    ) -> Result<(), CollectiveError> {
        self.send_with(to, kind, tag, parts, WhileSending::Nothing, None)
            .map(|_| ())
    }

    /// [`Writer::send`] of a message that must not wait behind a peer that does not read:
    /// `Ok(false)` when its first byte could not leave within `wait` (another send to `to`
    /// holds the links that long, or the peer's socket stays full), and then nothing was sent
    /// and the link stays usable. Once a byte has left, the message is finished as
    /// [`Writer::send`] would.
    pub(crate) fn try_send(
        &self,
        to: u32,
        kind: FrameKind,
        tag: Tag,
        parts: &[&[u8]],
        wait: Duration,
    ) -> Result<bool, CollectiveError> {
        let by = Some(Instant::now() + wait);
        self.send_with(to, kind, tag, parts, WhileSending::Nothing, by)
    }

    /// [`Writer::try_send`] of a message that runs `meanwhile` once the message is handed
    /// over and before the send waits for the peer to take it (see
    /// `Transport::try_send_message_during`). `meanwhile` does not run when the message did not
    /// start (`Ok(false)`) or the send failed first; its error is returned once the send is
    /// over.
    pub(crate) fn try_send_during(
        &self,
        to: u32,
        tag: Tag,
        parts: &[&[u8]],
        wait: Duration,
        meanwhile: Meanwhile<'_>,
    ) -> Result<bool, CollectiveError> {
        let by = Some(Instant::now() + wait);
        let work = WhileSending::CallerWork(meanwhile);
        self.send_with(to, FrameKind::Data, tag, parts, work, by)
    }

    /// [`Writer::send`], doing `while_sending` meanwhile, and giving up before the first byte
    /// at `first_byte_by` when that is given (`Ok(false)`, see [`Writer::try_send`]).
    pub(super) fn send_with(
        &self,
        to: u32,
        kind: FrameKind,
        tag: Tag,
        parts: &[&[u8]],
        while_sending: WhileSending<'_>,
        first_byte_by: Option<Instant>,
    ) -> Result<bool, CollectiveError> {
        let total = self.check_send(to, parts)?;
        if to == self.core.rank {
            return self.send_to_self(kind, tag, parts).map(|()| true);
        }
        let io = self.core.peer_io(to)?;
        if let Some(lost) = lock(&self.core.hub.state).peers[to as usize].lost.clone() {
            return Err(lost.error(to));
        }
        let mut tx = match first_byte_by {
            None => lock(&io.tx),
            Some(by) => match try_lock_until(&io.tx, by) {
                Some(tx) => tx,
                None => return Ok(false),
            },
        };
        self.same_host.switch_to_lane(to, io, &mut tx)?;
        let (mut hook, work) = match while_sending {
            WhileSending::Nothing => (None, None),
            WhileSending::Hook(hook) => (Some(hook), None),
            WhileSending::CallerWork(work) => (None, Some(work)),
        };
        let seq = tx.next_seq;
        let msg = Outgoing {
            to,
            kind,
            tag,
            seq,
            parts,
            total,
        };
        let carriage = match kind {
            FrameKind::Data => self.same_host.carriage(to, seq, parts, hook.is_some()),
            _ => Carriage::Stream,
        };
        let mut frames = Frames::new(&msg, &carriage, io.links.len(), self.core.cfg.min_striped);
        let mut wait = SendWait::new(first_byte_by, self.core.cfg.op_timeout);
        if !self.write_frames(&msg, io, &mut tx, &mut frames, &mut hook, &mut wait)? {
            return Ok(false);
        }
        // An offer is the link's business, not a message: it has no place in the order.
        if kind != FrameKind::Offer {
            tx.next_seq += 1;
        }
        if let Carriage::SingleCopy { bounced, .. } = carriage {
            // The bounced head goes in at once, before the caller's work: the peer copies it
            // out right behind.
            if bounced.len > 0 {
                self.same_host.bounce_in(to, seq, parts, bounced);
            }
        }
        // The caller's work runs while the peer takes the message. Its error waits until the
        // send is over, so that a peer that is reading is not left with half a message.
        let worked = work.map_or(Ok(()), |work| {
            let _open = OpenSend::enter(self.address(), to);
            work()
        });
        if matches!(carriage, Carriage::SingleCopy { .. }) {
            // The link stays this message's (the send lock held) until the peer has read it,
            // so that nothing overtakes it and the caller's buffer stays untouched meanwhile.
            self.same_host
                .wait_taken(to, io, seq, total, hook, wait.deadline(Instant::now()))?;
        }
        if kind == FrameKind::Data {
            self.core.traffic.sent(total);
        }
        worked.map(|()| true)
    }

    /// The address of this engine's core, which tells its sends apart from another engine's
    /// on one thread.
    fn address(&self) -> usize {
        std::ptr::from_ref(self.core) as usize
    }

    /// Checks a send to `to` of `parts` before anything is locked: the rank exists, the send
    /// does not run inside the work of another send to `to`, the transport runs, and the
    /// message fits the frame cap. Returns the message's length.
    fn check_send(&self, to: u32, parts: &[&[u8]]) -> Result<u64, CollectiveError> {
        self.core.check_rank(to)?;
        if OpenSend::running(self.address(), to) {
            return Err(CollectiveError::invalid(format!(
                "a send to rank {to} started inside work that runs while another send to rank \
                 {to} is in flight; it would wait for that send, which waits for the work"
            )));
        }
        if self.core.is_aborted() {
            return Err(CollectiveError::Aborted);
        }
        let total: u64 = parts.iter().map(|p| p.len() as u64).sum();
        if total > self.core.cfg.max_frame {
            return Err(CollectiveError::invalid(format!(
                "message of {total} bytes to rank {to} exceeds the frame cap of {} bytes (RLX_MAX_FRAME_BYTES)",
                self.core.cfg.max_frame
            )));
        }
        Ok(total)
    }

    /// Writes every frame of `msg` to its peer, moving `hook` on meanwhile. `Ok(false)` when
    /// the first byte did not leave by the send's first-byte deadline (nothing was written).
    fn write_frames(
        &self,
        msg: &Outgoing<'_, '_>,
        io: &PeerIo,
        tx: &mut TxState,
        frames: &mut Frames<'_, '_>,
        hook: &mut Option<&mut dyn ProgressHook>,
        wait: &mut SendWait,
    ) -> Result<bool, CollectiveError> {
        let to = msg.to;
        loop {
            let mut progress = match frames.write_round(io, tx) {
                Ok((moved, started)) => {
                    wait.started |= started;
                    moved
                }
                Err(e) => {
                    let lost = self.core.lost_from_io(to, "writing", &e);
                    let err = lost.error(to);
                    self.core.lose(to, lost);
                    return Err(err);
                }
            };
            // Nothing may wait between a single-copy frame's last byte and its bounced head: a
            // peer that read the frame may already wait for that head (`bounce.rs`).
            if frames.all_written() {
                return Ok(true);
            }
            // The hook (an exchange's receive) moves on between writes, so both directions of
            // the link stream at once instead of one waiting for the other's socket to fill.
            if let Some(hook) = hook.as_deref_mut() {
                progress |= hook.serve();
            }
            if progress {
                wait.lane_full_since = None;
                continue;
            }
            if self.core.is_aborted() {
                return Err(CollectiveError::Aborted);
            }
            if let Some(lost) = lock(&self.core.hub.state).peers[to as usize].lost.clone() {
                return Err(lost.error(to));
            }
            let now = Instant::now();
            if !wait.started && wait.first_byte_by.is_some_and(|by| now >= by) {
                return Ok(false);
            }
            if wait.deadline(now).is_some_and(|d| now >= d) {
                if wait.started {
                    // Half a frame is on the wire: the link cannot carry anything else.
                    return Err(self.core.abandon_send(to, io, "mid-message"));
                }
                return Err(CollectiveError::Timeout {
                    peer: Some(to),
                    op: "send",
                    after: self.core.cfg.op_timeout,
                });
            }
            self.wait_for_room(io, tx, frames.pending(), hook, wait, now);
        }
    }

    fn send_to_self(
        &self,
        kind: FrameKind,
        tag: Tag,
        parts: &[&[u8]],
    ) -> Result<(), CollectiveError> {
        let mut seq = lock(self.to_self);
        let mut st = lock(&self.core.hub.state);
        match kind {
            FrameKind::Failure => {
                let bytes = parts.concat();
                let failure = Failure::decode(self.core.rank, &bytes)?;
                st.deliver_local_failure(self.core.rank, *seq, tag, failure);
            }
            _ => st.deliver_local(self.core.rank, *seq, tag, parts.concat()),
        }
        *seq += 1;
        drop(st);
        self.core.hub.wake();
        Ok(())
    }
}
