//! The state an [`MlxTransport`](crate::MlxTransport) shares between its callers and its
//! threads: the links and their queues ([`Link`], [`Outgoing`]), the flags and per-link
//! bookkeeping guarded by one lock ([`State`]), which threads have ended ([`Exits`]), and the
//! [`Shared`] value that holds them all, with the guard that keeps one transport per MLX world
//! group ([`WorldGuard`]). Its methods here change that state (a failed link, a poll's
//! interest, a waiting receive's demand, closing); routing, sending, pausing and the direct
//! exchange extend [`Shared`] in modules of their own, which all build on this one.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rlx_transport::{CollectiveError, Inbox, Result, Tag};

use crate::backend::{Backend, Topology};
use crate::ffi::{Group, HostArray};
use crate::frame::Header;
use crate::pool::ArrayPool;
use crate::sync::{lock, wait};

/// Size of the first MLX message of every frame: the header and up to
/// `FIRST_LEN - HEADER_LEN` bytes of body.
pub(crate) const FIRST_LEN: usize = 256;

/// Bodies travel in MLX messages of at most this many bytes (MLX's ring moves at most 1 GiB
/// per socket call, and an MLX array holds at most `i32::MAX` elements).
pub(crate) const PIECE_LEN: usize = 1 << 30;

/// How long a poll that found nothing keeps its link read (see [`State::polled`]): longer
/// than the gap between the polls of a watching loop, short enough that an abandoned poll does
/// not keep a receive posted for long.
const POLL_INTEREST: Duration = Duration::from_millis(100);

/// How often a caller waiting for the collective thread, and the idle collective thread,
/// look for an abort or a close.
pub(crate) const ABORT_POLL: Duration = Duration::from_millis(50);

/// The largest message body accepted from the wire or from a caller.
pub const MAX_MESSAGE_LEN: u64 = 1 << 36;

/// What a sender thread sends next.
pub(crate) enum Outgoing {
    /// A data or failure frame.
    Frame(Header, Vec<u8>),
    /// A data frame whose body is `head` followed by the bytes of `rest`, an MLX array filled
    /// by the caller: MLX sends the array itself, so the body is copied once, into it.
    Staged(Header, Vec<u8>, HostArray),
    /// A pause frame; the sender then waits for the collective to end.
    Pause(Header),
    /// The goodbye frame; the sender then exits.
    Bye,
}

/// One directly linked peer and the queue of its sender thread.
pub(crate) struct Link {
    pub(crate) peer: u32,
    pub(crate) queue: Mutex<VecDeque<Outgoing>>,
    pub(crate) queued: Condvar,
    /// Held by whoever puts a frame on the link: the sender thread from taking a queued
    /// frame until it is sent (and while it is paused for a native collective), or a caller
    /// sending a small frame itself when nothing is queued. So frames never interleave, stay
    /// in order, and nothing is sent while a collective owns the link.
    pub(crate) sending: Mutex<()>,
}

impl Link {
    pub(crate) fn push(&self, item: Outgoing) {
        lock(&self.queue).push_back(item);
        self.queued.notify_one();
    }
}

/// Which of a transport's threads have ended and let go of it. Kept apart from `Shared`, so
/// that a thread can report its end after dropping its reference: once every thread has,
/// the caller's handle owns the group alone and dropping it releases MLX's group (for MPI,
/// that is what finalises MPI before the process exits).
pub(crate) struct Exits {
    pub(crate) done: Mutex<ExitState>,
    pub(crate) changed: Condvar,
}

pub(crate) struct ExitState {
    pub(crate) senders: Vec<bool>,
    pub(crate) receivers: Vec<bool>,
    pub(crate) collective: bool,
}

/// A transport thread's role, for [`Exits`].
#[derive(Clone, Copy)]
pub(crate) enum Role {
    Sender(usize),
    Receiver(usize),
    Collective,
}

impl Exits {
    pub(crate) fn mark(&self, role: Role) {
        let mut done = lock(&self.done);
        match role {
            Role::Sender(i) => done.senders[i] = true,
            Role::Receiver(i) => done.receivers[i] = true,
            Role::Collective => done.collective = true,
        }
        drop(done);
        self.changed.notify_all();
    }
}

/// State shared by the callers and the link threads, guarded by `Shared::state`.
pub(crate) struct State {
    pub(crate) aborted: bool,
    pub(crate) closing: bool,
    /// Why the transport can no longer run collectives, once it cannot.
    pub(crate) broken: Option<String>,
    /// Per link: why it is dead, once it is.
    pub(crate) dead: Vec<Option<String>>,
    /// Per link: whether it died because the peer said goodbye (it then still waits for this
    /// rank's goodbye, which must go out).
    pub(crate) peer_left: Vec<bool>,
    /// Bumped when a native collective ends, releasing the paused link threads.
    pub(crate) epoch: u64,
    /// Per link: whether its sender has sent its pause and is waiting.
    pub(crate) sender_paused: Vec<bool>,
    /// Per link: the descriptor of the peer's pause, once its receiver has read it.
    pub(crate) peer_paused: Vec<Option<(u64, u64)>>,
    /// Per link: `(waiter id, source, tag)` of each caller waiting for a message that
    /// arrives through it. The receiver removes an entry when it delivers a matching message
    /// and the caller removes its own when it stops waiting, so the receiver never posts a
    /// receive nobody needs (MLX busy-polls a socket while one is posted). Two callers that
    /// wait for the same source and tag at once may leave one of them without demand; it
    /// then ends at its deadline.
    pub(crate) demand: Vec<Vec<(u64, u32, u64)>>,
    /// Per link: `(source, tag, until)` of recent polls (receives with a zero timeout) that
    /// found nothing. A poll cannot wait for the receiver, so it leaves this interest behind
    /// and the receiver reads the link until `until`; a later poll finds what arrived. This is
    /// how a loop that only polls (a group watching for failure notices) sees its messages.
    pub(crate) polled: Vec<Vec<(u32, u64, Instant)>>,
    /// How many native collectives wait for the peers' pause frames.
    pub(crate) pausing: usize,
    /// Per link: whether its receiver is reading from it (from deciding to post a receive
    /// until the frame is handled, including a park after a pause frame).
    pub(crate) receiving: Vec<bool>,
    /// Whether an MLX collective outlived its deadline: the collective thread may never come
    /// back from MLX, so closing does not wait for it.
    pub(crate) collective_stuck: bool,
    /// Whether the collective thread owns every link (see `Shared::own_idle_links`): the
    /// receivers then post nothing.
    pub(crate) owned: bool,
    /// Whether receivers keep a receive posted without demand (ring worlds of four or more,
    /// where this rank forwards other ranks' messages).
    pub(crate) always_receive: bool,
}

pub(crate) struct Shared {
    /// Held by the transport over MLX's world group (not by split ones).
    pub(crate) _world_guard: Option<WorldGuard>,
    pub(crate) group: Group,
    pub(crate) rank: u32,
    pub(crate) world: u32,
    pub(crate) backend: Backend,
    pub(crate) topology: Topology,
    /// Whether a frame may go out in one MLX send and be read in pieces (see
    /// [`Backend::is_byte_stream`]).
    pub(crate) byte_stream: bool,
    pub(crate) op_timeout: Duration,
    pub(crate) inbox: Inbox,
    pub(crate) links: Vec<Link>,
    /// Arrays kept between native collectives.
    pub(crate) arrays: ArrayPool,
    pub(crate) state: Mutex<State>,
    pub(crate) changed: Condvar,
    /// Keeps this process's native collectives one at a time.
    pub(crate) collective: Mutex<()>,
    /// The direct-exchange limit in bytes (see
    /// [`DIRECT_EXCHANGE_MAX`](crate::exchange::DIRECT_EXCHANGE_MAX)).
    pub(crate) direct_max: AtomicUsize,
    /// Sequence number of the next native collective's own messages (a direct exchange's
    /// contributions or an announcement): native collectives are issued in the same order on
    /// every rank, so every rank numbers them alike.
    pub(crate) native_seq: AtomicU32,
    /// Id of the next waiting receive (see `State::demand`).
    pub(crate) next_waiter: AtomicU64,
    /// Which threads have ended.
    pub(crate) exits: Arc<Exits>,
    /// MLX collectives for the collective thread to run.
    pub(crate) jobs: Mutex<VecDeque<Job>>,
    pub(crate) job_queued: Condvar,
}

/// A waiting receive's entry in [`State::demand`], removed when dropped (the receiver may
/// have removed it already on delivery).
pub(crate) struct Demand<'a> {
    shared: &'a Shared,
    index: usize,
    id: u64,
}

impl<'a> Demand<'a> {
    /// Asks the receiver of link `index` to read until a message from `from` with `tag`
    /// arrives.
    pub(crate) fn register(shared: &'a Shared, index: usize, from: u32, tag: Tag) -> Demand<'a> {
        let id = shared.next_waiter.fetch_add(1, Ordering::Relaxed);
        lock(&shared.state).demand[index].push((id, from, tag.raw()));
        shared.changed.notify_all();
        Demand { shared, index, id }
    }
}

impl Drop for Demand<'_> {
    fn drop(&mut self) {
        let mut state = lock(&self.shared.state);
        let demand = &mut state.demand[self.index];
        if let Some(at) = demand.iter().position(|e| e.0 == self.id) {
            demand.remove(at);
        }
    }
}

/// One MLX collective, run by the collective thread.
pub(crate) type Job = Box<dyn FnOnce(&Shared) + Send>;

/// Whether an `MlxTransport` over MLX's world group exists in this process.
static WORLD_TAKEN: AtomicBool = AtomicBool::new(false);

/// Marks MLX's world group as used by one transport until dropped.
pub(crate) struct WorldGuard;

impl WorldGuard {
    pub(crate) fn take() -> Result<Option<WorldGuard>> {
        if WORLD_TAKEN.swap(true, Ordering::AcqRel) {
            return Err(CollectiveError::config(
                "an MlxTransport over MLX's world group already exists in this process \
                 (MLX shares one group per process; use split for sub-groups)",
            ));
        }
        Ok(Some(WorldGuard))
    }
}

impl Drop for WorldGuard {
    fn drop(&mut self) {
        WORLD_TAKEN.store(false, Ordering::Release);
    }
}

impl Shared {
    /// Marks link `index` dead and every rank whose messages reach this rank through it lost.
    pub(crate) fn link_failed(&self, index: usize, reason: String) {
        let peer = self.links[index].peer;
        let mut state = lock(&self.state);
        if state.dead[index].is_none() {
            state.dead[index] = Some(reason.clone());
        }
        if state.broken.is_none() && !state.closing {
            state.broken = Some(format!("link to rank {peer} failed: {reason}"));
        }
        drop(state);
        self.changed.notify_all();
        for src in (0..self.world).filter(|&r| r != self.rank) {
            if self.last_hop_from(src) == peer {
                self.inbox.mark_lost(src, reason.clone());
            }
        }
    }

    /// After a failed MLX collective no link can be trusted: MLX may have stopped the worker
    /// of a socket (its later calls would never finish) and the others may hold a partial
    /// collective's bytes. Every link is marked dead and every peer lost.
    pub(crate) fn all_links_failed(&self, reason: String) {
        let mut state = lock(&self.state);
        state.broken = Some(reason.clone());
        for dead in &mut state.dead {
            if dead.is_none() {
                *dead = Some(reason.clone());
            }
        }
        drop(state);
        self.changed.notify_all();
        for peer in (0..self.world).filter(|&r| r != self.rank) {
            self.inbox.mark_lost(peer, reason.clone());
        }
    }

    /// Leaves the interest of a poll for messages from `from` with `tag` on link `index` (see
    /// [`State::polled`]), renewing an earlier one.
    pub(crate) fn note_poll(&self, index: usize, from: u32, tag: Tag) {
        let until = Instant::now() + POLL_INTEREST;
        let mut state = lock(&self.state);
        let polled = &mut state.polled[index];
        match polled.iter_mut().find(|e| (e.0, e.1) == (from, tag.raw())) {
            Some(entry) => entry.2 = until,
            None => polled.push((from, tag.raw(), until)),
        }
        drop(state);
        self.changed.notify_all();
    }

    pub(crate) fn check_usable(&self) -> Result<()> {
        let state = lock(&self.state);
        if state.aborted || state.closing {
            return Err(CollectiveError::Aborted);
        }
        Ok(())
    }

    /// Waits until the collective that paused the link threads has ended (or the transport
    /// is going away).
    pub(crate) fn park(&self, mut state: MutexGuard<'_, State>, index: usize) {
        let epoch = state.epoch;
        while state.epoch == epoch
            && !state.aborted
            && !state.closing
            && state.dead[index].is_none()
        {
            state = wait(&self.changed, state);
        }
    }

    /// Stops the transport: an abort fails every waiting and later call at once; a close
    /// lets the sender threads send what is queued and then their goodbye frames.
    pub(crate) fn close(&self, aborted: bool) {
        let mut state = lock(&self.state);
        let first = !state.closing && !state.aborted;
        if aborted {
            state.aborted = true;
        } else {
            state.closing = true;
        }
        drop(state);
        self.changed.notify_all();
        self.job_queued.notify_all();
        if aborted {
            self.inbox.abort();
        }
        if first {
            for link in &self.links {
                link.push(Outgoing::Bye);
            }
        }
    }
}
