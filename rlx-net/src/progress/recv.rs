//! The receive path over TCP: the [`Receiver`], the engine's side of [`Drive`], by which the
//! receive loop of [`Hub::recv`] reads the sockets of a peer itself (non-blocking reads in a
//! short spin, then `poll(2)`) once it holds their reader role, landing frames through the
//! reader (`reader.rs`).

use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use rlx_transport::{CollectiveError, Tag};

use crate::matching::{Outcome, PostId};
use crate::sync::lock;

use super::core::Core;
use super::hub::{Drive, DriveEnd, Hub, Links};
use super::link::{Link, OwnReceive, PeerIo};
use super::liveness::CatchUp;
use super::reader::{Reader, Service};
use super::socket::{POLL_FDS, poll, pollfd};

/// Default of [`EngineConfig::landing_grace`](super::EngineConfig::landing_grace): how long a
/// receive whose message is landing in the caller's buffer goes on past its deadline without
/// a byte landing before it gives up (see [`Receiver::still_landing`]). Bytes that keep coming
/// mean a live peer and a message that will end, so the receive takes it whole instead of
/// leaving it to a copy.
pub(crate) const LANDING_GRACE: Duration = Duration::from_millis(100);

/// The receiver's view: the engine's core, the reader that lands what it reads, and the
/// catch-up clock it consults before a receive that will not wait.
#[derive(Clone, Copy)]
pub(super) struct Receiver<'a> {
    core: &'a Core,
    reader: Reader<'a>,
    catch_up: &'a CatchUp,
}

impl<'a> Receiver<'a> {
    pub(super) fn new(core: &'a Core, reader: Reader<'a>, catch_up: &'a CatchUp) -> Self {
        Self {
            core,
            reader,
            catch_up,
        }
    }

    /// Receives the next message from `from` under `tag`, landing it in `buf` when one is
    /// given. `Ok(None)` at the deadline. A receive that will not wait first catches up on
    /// every link if this process was stopped (`catch_up.rs`), so that it sees what arrived
    /// meanwhile.
    pub(super) fn recv(
        &self,
        from: u32,
        tag: Tag,
        buf: Option<&mut [u8]>,
        timeout: Duration,
    ) -> Result<Option<Outcome>, CollectiveError> {
        if timeout.is_zero() {
            self.catch_up.catch_up_if_needed(self.core, self.reader);
        }
        self.core.hub.recv(self, from, tag, buf, timeout)
    }
}

impl Links for Receiver<'_> {
    fn now(&self) -> Instant {
        self.core.now()
    }

    fn kick_watcher(&self) {
        self.core.kick_watcher();
    }

    fn shut_down(&self, peer: u32) {
        self.core.shut_down(peer);
    }
}

impl Drive for Receiver<'_> {
    /// Reads the links to `from` for the posted receive `id` until it finishes, stalls, hits
    /// its deadline or the peer is lost.
    fn drive(
        &self,
        _hub: &Hub,
        from: u32,
        id: PostId,
        buf: &mut Option<&mut [u8]>,
        mut deadline: Option<Instant>,
    ) -> DriveEnd {
        let Some(Some(io)) = self.core.peers.get(from as usize) else {
            return DriveEnd::Stalled;
        };
        let mut landed_at_deadline = None;
        let mut own = OwnReceive {
            id,
            buf: buf.as_deref_mut(),
        };
        let mut spin_since: Option<Instant> = None;
        loop {
            let mut progress = false;
            let mut all_parked = true;
            for (k, link) in io.links.iter().enumerate() {
                let mut rx = link.rx();
                match self.reader.service(from, k, link, &mut rx, Some(&mut own)) {
                    Ok(Service::OwnDone) => return DriveEnd::OwnDone,
                    Ok(Service::Progress) => {
                        progress = true;
                        all_parked = false;
                    }
                    Ok(Service::Idle) => all_parked = false,
                    Ok(Service::Parked) => {}
                    Err(lost) => return DriveEnd::Lost(lost),
                }
            }
            if self.core.is_aborted() {
                return DriveEnd::Aborted;
            }
            if progress {
                spin_since = None;
                continue;
            }
            if all_parked {
                return DriveEnd::Stalled;
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                if self.still_landing(from, id, &mut landed_at_deadline) {
                    deadline = Some(now + self.core.cfg.landing_grace);
                    continue;
                }
                return DriveEnd::Deadline(self.reader.withdraw_while_reading(from, io, &mut own));
            }
            let since = *spin_since.get_or_insert(now);
            if now.duration_since(since) < self.core.cfg.spin {
                // Yield rather than burn the core: when the peer process shares this core (a
                // loaded machine), a pure spin keeps it from sending what we wait for.
                std::thread::yield_now();
                continue;
            }
            let wait = deadline.map_or(Duration::from_secs(1), |d| d - now);
            self.poll_links(io, from, wait.min(Duration::from_secs(1)));
        }
    }
}

impl Receiver<'_> {
    /// Whether the receive `id` from `from`, at its deadline, keeps reading because its message
    /// is landing in the caller's buffer and more of it landed since the last deadline
    /// (`landed`, updated). Giving up then would move the landed part, and every later byte,
    /// into a buffer of the transport's own as large as the message: the receive that comes
    /// back for it would copy it all again, and the process would hold the message twice.
    fn still_landing(&self, from: u32, id: PostId, landed: &mut Option<u64>) -> bool {
        let now = lock(&self.core.hub.state).landed_for(from, id);
        let moved = match (now, *landed) {
            (Some(now), Some(before)) => now > before,
            (Some(_), None) => true,
            (None, _) => false,
        };
        *landed = now;
        moved
    }

    /// Blocks until a non-parked link to `from` is readable, abort, or `wait` passes.
    fn poll_links(&self, io: &PeerIo, from: u32, wait: Duration) {
        POLL_FDS.with(|fds| {
            let mut fds = fds.borrow_mut();
            fds.clear();
            let mut ready = false;
            {
                let st = lock(&self.core.hub.state);
                for (k, link) in io.links.iter().enumerate() {
                    if !st.peers[from as usize].links[k].parked {
                        fds.push(pollfd(link.fd(), libc::POLLIN));
                        ready |= link.before_poll();
                    }
                }
            }
            fds.push(pollfd(self.core.abort_rx.as_raw_fd(), libc::POLLIN));
            if !ready {
                poll(&mut fds, wait);
            }
            io.links.iter().for_each(Link::after_poll);
        });
    }
}
