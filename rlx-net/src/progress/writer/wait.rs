//! How a send waits for room on its peer's links ([`SendWait`]): yielding while a full
//! shared-memory lane drains, through the send's progress hook when it reads links of its own,
//! for the peer's sockets alone at first, and then reading every free link of every peer
//! meanwhile (`recv.rs`), so that ranks sending to each other, or a ring of them, cannot
//! deadlock.

use std::cell::RefCell;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use rlx_transport::blocked_send;

use super::Writer;
use crate::progress::hook::ProgressHook;
use crate::progress::hub::take_free_links;
use crate::progress::link::{PeerIo, TxState};
use crate::progress::socket::{POLL_FDS, poll, pollfd};
use crate::sync::{Mutex, MutexGuard, TryLockError, lock};

/// A sender reading other links while its write blocks re-checks who wants them this often.
const SENDER_POLL: Duration = Duration::from_millis(1);
/// How long a blocked sender waits for its socket alone before it reads other links too.
const LIGHT_WAIT: Duration = Duration::from_millis(1);

thread_local! {
    /// The links a blocked sender holds while it reads them, reused across calls.
    static HELD: RefCell<Vec<(u32, usize)>> = const { RefCell::new(Vec::new()) };
}

/// The deadlines of one send and how its waits escalate.
pub(super) struct SendWait {
    /// When a send that must not wait gives up, as long as no byte has left.
    pub(super) first_byte_by: Option<Instant>,
    /// The operation timeout, counted from the first moment the send could not go on.
    op_timeout: Duration,
    /// The deadline `op_timeout` makes, once known (`Some(None)`: none, the timeout being too
    /// long to add). It is set the first time the send has to wait: a send whose bytes the
    /// sockets take at once (every small message) never reads the clock for it.
    deadline: Option<Option<Instant>>,
    pub(super) started: bool,
    /// The send still waits for its own sockets alone (see [`LIGHT_WAIT`]).
    pub(super) light: bool,
    /// Since when link 0's shared-memory lane has been full.
    pub(super) lane_full_since: Option<Instant>,
}

impl SendWait {
    /// The waits of a send that gives up before its first byte at `first_byte_by`, when given,
    /// and after `op_timeout` in any case.
    pub(super) fn new(first_byte_by: Option<Instant>, op_timeout: Duration) -> Self {
        Self {
            first_byte_by,
            op_timeout,
            deadline: None,
            started: false,
            light: true,
            lane_full_since: None,
        }
    }

    /// The send's deadline, counted from `now` if this is the first time it is asked for.
    pub(super) fn deadline(&mut self, now: Instant) -> Option<Instant> {
        let op_timeout = self.op_timeout;
        *self
            .deadline
            .get_or_insert_with(|| now.checked_add(op_timeout))
    }

    /// The next moment the send must look up from its wait (its deadline is known by then).
    fn until(&self) -> Option<Instant> {
        let deadline = self.deadline.flatten();
        match self.first_byte_by.filter(|_| !self.started) {
            Some(by) => Some(deadline.map_or(by, |d| d.min(by))),
            None => deadline,
        }
    }
}

impl Writer<'_> {
    /// Waits a while for room on the `pending` links of `io`: on a full lane by yielding, then
    /// in short naps; through the hook when it reads links of its own; for the peer's sockets
    /// alone at first; and then reading every free link meanwhile.
    pub(super) fn wait_for_room(
        &self,
        io: &PeerIo,
        tx: &TxState,
        pending: u64,
        hook: &mut Option<&mut dyn ProgressHook>,
        wait: &mut SendWait,
        now: Instant,
    ) {
        // A full medium without a descriptor for its room (a lane) has no socket to poll, and
        // nothing wakes this side when the peer drains it: yield while the peer is likely
        // reading, then wait in short naps.
        let lane_full = tx.naps_for_room(pending);
        let pending = pending & !u64::from(lane_full);
        if lane_full {
            let since = *wait.lane_full_since.get_or_insert(now);
            if now.duration_since(since) < self.core.cfg.spin {
                std::thread::yield_now();
                return;
            }
        }
        if let Some(hook) = hook.as_deref_mut().filter(|h| h.reading()) {
            if hook.wait(io, pending) {
                return;
            }
        }
        // Usually the peer is reading and the socket drains within microseconds: wait for
        // that alone first. Only when it does not (the peer may be blocked sending to us, or
        // in a ring of such senders) read every free link while waiting.
        if wait.light && !lane_full {
            wait.light = self.poll_writable(io, pending);
            if wait.light {
                return;
            }
        }
        let mut limit = wait.until().map(|d| d.saturating_duration_since(now));
        if lane_full {
            limit = Some(limit.map_or(SENDER_POLL, |w| w.min(SENDER_POLL)));
        }
        self.wait_writable(io, pending, limit);
    }

    /// Waits up to [`LIGHT_WAIT`] for one of the `pending` links of `io` to become writable;
    /// returns whether one did.
    fn poll_writable(&self, io: &PeerIo, pending: u64) -> bool {
        POLL_FDS.with(|fds| {
            let mut fds = fds.borrow_mut();
            fds.clear();
            io.push_writable(pending, &mut fds);
            let links = fds.len();
            fds.push(pollfd(self.core.abort_rx.as_raw_fd(), libc::POLLIN));
            poll(&mut fds, LIGHT_WAIT);
            fds[..links].iter().any(|fd| fd.revents != 0)
        })
    }

    /// Waits until one of the `pending` links of `io` is writable, reading every free link of
    /// every peer meanwhile so that senders facing each other both make progress.
    fn wait_writable(&self, io: &PeerIo, pending: u64, wait: Option<Duration>) {
        HELD.with(|held| {
            let mut held = held.borrow_mut();
            held.clear();
            take_free_links(
                &mut lock(&self.core.hub.state),
                |rank| {
                    self.core
                        .peers
                        .get(rank as usize)
                        .is_some_and(Option::is_some)
                },
                false,
                &mut held,
            );
            // With nothing else to read the wait is long, unless a layer above has duties
            // to run while this send waits (see `rlx_transport::blocked_send`).
            let limit = if held.is_empty() && !blocked_send::hooked() {
                Duration::from_millis(100)
            } else if held.is_empty() {
                blocked_send::HOOK_INTERVAL
            } else {
                SENDER_POLL
            };
            let wait = wait.map_or(limit, |w| w.min(limit));
            POLL_FDS.with(|fds| {
                let mut fds = fds.borrow_mut();
                fds.clear();
                io.push_writable(pending, &mut fds);
                let held_links = || {
                    held.iter()
                        .filter_map(|&(rank, k)| match self.core.peers.get(rank as usize) {
                            Some(Some(p)) => Some(&p.links[k]),
                            _ => None,
                        })
                };
                let mut ready = false;
                for link in held_links() {
                    fds.push(pollfd(link.fd(), libc::POLLIN));
                    ready |= link.before_poll();
                }
                fds.push(pollfd(self.core.abort_rx.as_raw_fd(), libc::POLLIN));
                if !ready {
                    poll(&mut fds, wait);
                }
                held_links().for_each(|link| link.after_poll());
            });
            self.reader.drain_held(&held);
        });
        blocked_send::waiting();
    }
}

/// Takes `mutex` if it becomes free before `by`: another send to the same peer holds it for as
/// long as that peer does not read, and a message that must not wait gives up instead.
pub(super) fn try_lock_until<T>(mutex: &Mutex<T>, by: Instant) -> Option<MutexGuard<'_, T>> {
    loop {
        match mutex.try_lock() {
            Ok(guard) => return Some(guard),
            Err(TryLockError::Poisoned(poisoned)) => return Some(poisoned.into_inner()),
            Err(TryLockError::WouldBlock) if Instant::now() < by => {
                std::thread::sleep(Duration::from_micros(200));
            }
            Err(TryLockError::WouldBlock) => return None,
        }
    }
}
