//! The socket-free heart of the engine: the matching state, its condition variable, the rule
//! for waking sleepers, and the receive loop (post, wait as a follower or take the reader role,
//! give up at the deadline, release, wake).
//!
//! Nothing here touches a socket or reads the system clock: the loop reaches the sockets and the
//! clock through [`Links`] (the clock, the watcher's wake-up, shutting a peer's connections
//! down: the engine's core implements it) and [`Drive`] (reading a peer's links for a posted
//! receive: the engine's receiver implements it), which the loom models implement with a fake
//! peer (a loom thread landing frames), so that the code that ships is the code that is
//! model-checked. Each is a generic parameter, monomorphised for the engine: no boxing or
//! indirect call on the latency path.

use std::time::{Duration, Instant};

use rlx_transport::{CollectiveError, Tag};

use crate::error::Lost;
use crate::matching::{Begin, Holder, Outcome, PostId, State, Withdrawn};
use crate::sync::{AtomicBool, AtomicUsize, Condvar, Mutex, MutexGuard, Ordering, lock};

/// Why a receiving thread stopped reading the links it held.
#[derive(Debug)]
pub(crate) enum DriveEnd {
    /// Its own receive finished.
    OwnDone,
    /// Every link is parked (the unexpected budget is used up); someone else must receive.
    Stalled,
    /// The deadline passed; the receive was withdrawn, and this is what it had finished with.
    Deadline(Option<Outcome>),
    /// Reading failed: the peer is lost for this reason.
    Lost(Lost),
    /// The transport was aborted.
    Aborted,
}

/// What the hub needs from the sockets and the clock: the clock, the watcher's wake-up and
/// shutting a peer's connections down.
pub(crate) trait Links {
    /// The clock that deadlines are measured on.
    fn now(&self) -> Instant;

    /// Asks the background watcher to hand back the links it holds, because a caller wants
    /// them. Called with the state locked.
    fn kick_watcher(&self);

    /// Shuts down the connections to `peer`, so that every thread reading them wakes up.
    fn shut_down(&self, peer: u32);
}

/// How the receive loop reads a peer's links once it holds their reader role: the reader's
/// side of the sockets, on top of what every caller of the hub provides ([`Links`]).
pub(crate) trait Drive: Links {
    /// Reads the links to `from`, whose reader role this thread holds, for the posted receive
    /// `id` (landing it in `buf` when one is given), until that receive finishes, every link is
    /// parked, `deadline` passes, the peer is lost or the transport is aborted. Called without
    /// the state lock.
    fn drive(
        &self,
        hub: &Hub,
        from: u32,
        id: PostId,
        buf: &mut Option<&mut [u8]>,
        deadline: Option<Instant>,
    ) -> DriveEnd;
}

/// The matching state of one transport and how threads wait for it to change.
#[derive(Debug)]
pub(crate) struct Hub {
    rank: u32,
    world: u32,
    pub(crate) state: Mutex<State>,
    changed: Condvar,
    aborted: AtomicBool,
    /// Set when this rank closes its transport: the ends of links it then reads are its own
    /// doing or the other ranks' departures, not failures worth a warning.
    closing: AtomicBool,
    /// Threads waiting on `changed`; notifying costs a system call, so only when non-zero.
    sleepers: AtomicUsize,
}

impl Hub {
    /// The state of rank `rank` in a world of `world`, with `links` links per peer, an
    /// unexpected budget of `budget` bytes per peer, and striping from `min_striped` bytes.
    pub(crate) fn new(rank: u32, world: u32, links: usize, budget: u64, min_striped: u64) -> Self {
        Self {
            rank,
            world,
            state: Mutex::new(State::new(world, links, budget, min_striped)),
            changed: Condvar::new(),
            aborted: AtomicBool::new(false),
            closing: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
        }
    }

    /// The hub with large unexpected messages waiting at most `hold` for their receives.
    pub(crate) fn holding_for(self, hold: Duration) -> Self {
        lock(&self.state).set_longest_hold(hold);
        self
    }

    /// Whether a large message of `peer` waits unread for its receive now.
    pub(crate) fn holds_message_from(&self, peer: u32) -> bool {
        lock(&self.state)
            .peers
            .get(peer as usize)
            .is_some_and(|p| p.hold_ends().is_some())
    }

    /// Wakes the threads waiting on the state. A waiter registers in `sleepers` while holding
    /// the state lock before it sleeps, and every caller changes the state under that lock
    /// before calling this, so a waiter either sees the change or is counted here.
    pub(crate) fn wake(&self) {
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            self.changed.notify_all();
        }
    }

    /// Sleeps on the state for at most `wait`, counted in `sleepers` meanwhile.
    fn sleep<'a>(&self, st: MutexGuard<'a, State>, wait: Duration) -> MutexGuard<'a, State> {
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        let st = match self.changed.wait_timeout(st, wait) {
            Ok((g, _)) => g,
            Err(p) => p.into_inner().0,
        };
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
        st
    }

    /// Whether [`Hub::abort`] was called.
    pub(crate) fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::SeqCst)
    }

    /// Records the abort; returns `false` when it was recorded before. The caller then shuts the
    /// sockets down and calls [`Hub::wake`].
    ///
    /// The state learns of the abort before the flag is raised, under the state lock: a reader
    /// that sees the flag and gives up its links must find the state aborted when it next locks
    /// it, or it would take the links again and spin until the state caught up.
    pub(crate) fn abort(&self) -> bool {
        let mut st = lock(&self.state);
        if st.aborted {
            return false;
        }
        st.aborted = true;
        self.aborted.store(true, Ordering::SeqCst);
        true
    }

    /// Notes that this rank is closing its transport (see [`Hub::lose`]).
    pub(crate) fn begin_close(&self) {
        self.closing.store(true, Ordering::SeqCst);
    }

    /// Marks `peer` lost, shuts its connections down and wakes everyone.
    pub(crate) fn lose<L: Links>(&self, links: &L, peer: u32, lost: Lost) {
        let closing = self.closing.load(Ordering::SeqCst);
        match &lost {
            Lost::Gone(reason) if closing => {
                tracing::debug!(peer, %reason, "link ended while closing")
            }
            Lost::Gone(reason) => tracing::warn!(peer, %reason, "peer lost"),
            // A departure is how every job ends: no warning, in case nobody needed the peer.
            Lost::Departed(reason) => tracing::debug!(peer, %reason, "peer closed its transport"),
            Lost::Protocol(detail) => tracing::warn!(peer, %detail, "peer broke the protocol"),
        }
        lock(&self.state).mark_lost(peer, lost);
        links.shut_down(peer);
        self.wake();
    }

    /// Excludes `peer` for good: marks it lost with `lost`, drops what it queued and wakes
    /// everyone. The caller closes the connections' sending side.
    pub(crate) fn exclude(&self, peer: u32, lost: Lost) {
        tracing::warn!(peer, "peer excluded: declared dead by this rank");
        lock(&self.state).exclude(peer, lost);
        self.wake();
    }

    /// Receives the next message from `from` under `tag`, landing it in `buf` when one is
    /// given. `Ok(None)` at the deadline.
    pub(crate) fn recv<L: Drive>(
        &self,
        links: &L,
        from: u32,
        tag: Tag,
        buf: Option<&mut [u8]>,
        timeout: Duration,
    ) -> Result<Option<Outcome>, CollectiveError> {
        let mut st = lock(&self.state);
        if timeout.is_zero() && from < self.world {
            // A receive that will not wait and finds nothing queued ends as posting and
            // withdrawing it would, without that bookkeeping: every look for failure notices
            // between the slices of a wait, and after every operation, is such a receive.
            if let Some(end) = st.empty_handed(from, tag) {
                return end;
            }
        }
        let (st, id) = match self.post(st, from, tag, buf.as_ref().map(|b| b.len()))? {
            (st, Begin::Posted(id)) => (st, id),
            (st, Begin::Ready(outcome)) => {
                drop(st);
                self.wake();
                return Ok(Some(outcome));
            }
        };
        // The clock is read only by a receive that may wait: a message already queued, or a
        // look that finds nothing, ends above without it.
        let deadline = links.now().checked_add(timeout);
        self.complete(links, st, from, id, buf, deadline, false)
    }

    /// Posts a receive from `from` under `tag` (landing in a caller's buffer of `capacity`
    /// bytes when one is given), or finds its message already queued.
    pub(crate) fn post<'a>(
        &self,
        mut st: MutexGuard<'a, State>,
        from: u32,
        tag: Tag,
        capacity: Option<usize>,
    ) -> Result<(MutexGuard<'a, State>, Begin), CollectiveError> {
        if from >= self.world {
            return Err(CollectiveError::UnknownRank {
                rank: from,
                world_size: self.world,
            });
        }
        let begin = st.begin_recv(from, tag, capacity)?;
        if matches!(begin, Begin::Posted(_)) {
            // Claiming a message that was still arriving frees budget a stalled reader may be
            // waiting for (notifying under the lock is fine).
            self.wake();
        }
        Ok((st, begin))
    }

    /// Waits for the posted receive `id` from `from` until `deadline`: as a follower, or
    /// reading the links itself. `holding` says this thread already holds the reader role of
    /// every link to `from` for `id` (an exchange that read them while it sent), so it reads
    /// them at once without asking for them again.
    #[allow(
        clippy::too_many_arguments,
        reason = "the state of one receive, handed over whole"
    )]
    pub(crate) fn complete<'s, L: Drive>(
        &'s self,
        links: &L,
        mut st: MutexGuard<'s, State>,
        from: u32,
        id: PostId,
        mut buf: Option<&mut [u8]>,
        deadline: Option<Instant>,
        holding: bool,
    ) -> Result<Option<Outcome>, CollectiveError> {
        let is_self = from == self.rank;
        let mut stalled = false;
        let mut holding = holding;
        loop {
            if !holding {
                if let Some(result) = st.poll_post(from, id) {
                    return result.map(Some);
                }
            }
            // The reader role checks the deadline itself (`Drive::drive`), so the clock is read
            // here only on the way to sleep: a receive whose message is on its way reads it
            // once less.
            let acquired = std::mem::take(&mut holding)
                || (!is_self && !stalled && self.try_acquire(links, &mut st, from, id));
            if !acquired {
                let now = links.now();
                if deadline.is_some_and(|d| now >= d) {
                    return Ok(match st.withdraw(from, id, buf.as_deref()) {
                        Withdrawn::Finished(outcome) => Some(outcome),
                        Withdrawn::Gone | Withdrawn::Moved { .. } => None,
                    });
                }
                let wait = deadline.map_or(Duration::from_secs(3600), |d| d - now);
                st = self.sleep(st, wait);
                stalled = false;
                continue;
            }
            drop(st);
            let end = links.drive(self, from, id, &mut buf, deadline);
            st = lock(&self.state);
            let parked_any = release(&mut st, from, links.now());
            drop(st);
            self.wake();
            match end {
                DriveEnd::OwnDone | DriveEnd::Aborted => {}
                DriveEnd::Stalled => stalled = parked_any,
                DriveEnd::Deadline(outcome) => return Ok(outcome),
                DriveEnd::Lost(lost) => self.lose(links, from, lost),
            }
            st = lock(&self.state);
        }
    }

    /// Takes the reader role of every link to `from`, or marks the held ones wanted.
    pub(crate) fn try_acquire<L: Links>(
        &self,
        links: &L,
        st: &mut State,
        from: u32,
        id: PostId,
    ) -> bool {
        let peer = &mut st.peers[from as usize];
        if peer.lost.is_some() {
            return false;
        }
        if peer.links.iter().all(|l| l.holder == Holder::Free) {
            for slot in &mut peer.links {
                slot.holder = Holder::Receiver(id);
            }
            return true;
        }
        let mut kick = false;
        for slot in &mut peer.links {
            if slot.holder != Holder::Free {
                slot.wanted = true;
                kick |= slot.holder == Holder::Background;
            }
        }
        if kick {
            links.kick_watcher();
        }
        false
    }
}

impl Hub {
    /// Takes the reader role of every link that is free and not parked, for a catch-up that
    /// reads them all once. Links the background watcher holds are asked for (marked wanted,
    /// the watcher kicked) and waited for until `deadline`; links a receiver or a blocked
    /// sender holds are left to it, and so are links another thread already asked for.
    /// Returns the links taken, as `(peer, link)`; the caller releases them.
    pub(crate) fn take_for_sweep<L: Links>(
        &self,
        links: &L,
        deadline: Instant,
    ) -> Vec<(u32, usize)> {
        let mut taken = Vec::new();
        let mut st = lock(&self.state);
        loop {
            let waiting = take_free_links(&mut st, |rank| rank != self.rank, true, &mut taken);
            let now = links.now();
            if !waiting || now >= deadline {
                return taken;
            }
            links.kick_watcher();
            st = self.sleep(st, deadline - now);
        }
    }

    /// Gives up the reader role of every link to `from` that this thread held, and wakes the
    /// threads that may want them.
    pub(crate) fn release_links<L: Links>(&self, links: &L, from: u32) {
        release(&mut lock(&self.state), from, links.now());
        self.wake();
    }
}

/// Takes the reader role (as [`Holder::Sender`]: a thread reading for nobody in particular) of
/// every link that is free, not parked and not wanted by another thread, of every peer that is
/// not lost and for which `reads(rank)` holds, and appends them to `taken`. With
/// `ask_watcher`, links the background watcher holds are marked wanted; returns whether any
/// was, so that the caller can wait for them.
pub(crate) fn take_free_links(
    st: &mut State,
    reads: impl Fn(u32) -> bool,
    ask_watcher: bool,
    taken: &mut Vec<(u32, usize)>,
) -> bool {
    let mut asked = false;
    for (rank, peer) in st.peers.iter_mut().enumerate() {
        if peer.lost.is_some() || !reads(rank as u32) {
            continue;
        }
        for (k, slot) in peer.links.iter_mut().enumerate() {
            match slot.holder {
                Holder::Free if !slot.parked && !slot.wanted => {
                    slot.holder = Holder::Sender;
                    taken.push((rank as u32, k));
                }
                Holder::Background if ask_watcher => {
                    slot.wanted = true;
                    asked = true;
                }
                _ => {}
            }
        }
    }
    asked
}

/// Releases the reader role of every link to `from` at `now`; returns whether any is parked.
fn release(st: &mut State, from: u32, now: Instant) -> bool {
    let peer = &mut st.peers[from as usize];
    let mut parked = false;
    for slot in &mut peer.links {
        slot.holder = Holder::Free;
        slot.wanted = false;
        slot.released_at = now;
        parked |= slot.parked;
    }
    peer.drop_arriving_if_lost();
    parked
}
