//! The receive path over TCP: the engine's side of [`Links`], by which the receive loop of
//! [`Hub::recv`] reads the sockets of a peer itself (non-blocking reads in a short spin, then
//! `poll(2)`) once it holds their reader role; and the draining of links a thread holds for
//! nobody's receive in particular (a blocked sender, the watcher, a catch-up).

use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use rlx_transport::{CollectiveError, Tag};

use crate::error::Lost;
use crate::matching::{Holder, Outcome, PostId, Withdrawn};
use crate::sync::{Ordering, lock};

use super::Engine;
use super::hub::{DriveEnd, Hub, Links};
use super::link::{Destination, Link, OwnReceive, PeerIo, RawDest};
use super::reader::Service;
use super::socket::{POLL_FDS, WakeWrite, poll, pollfd};

/// Default of [`EngineConfig::landing_grace`](super::EngineConfig::landing_grace): how long a
/// receive whose message is landing in the caller's buffer goes on past its deadline without
/// a byte landing before it gives up (see [`Engine::still_landing`]). Bytes that keep coming
/// mean a live peer and a message that will end, so the receive takes it whole instead of
/// leaving it to a copy.
pub(crate) const LANDING_GRACE: Duration = Duration::from_millis(100);

impl Engine {
    /// Receives the next message from `from` under `tag`, landing it in `buf` when one is
    /// given. `Ok(None)` at the deadline. A receive that will not wait first catches up on
    /// every link if this process was stopped (`catch_up.rs`), so that it sees what arrived
    /// meanwhile.
    pub(crate) fn recv(
        &self,
        from: u32,
        tag: Tag,
        buf: Option<&mut [u8]>,
        timeout: Duration,
    ) -> Result<Option<Outcome>, CollectiveError> {
        if timeout.is_zero() {
            self.catch_up_if_needed();
        }
        self.hub.recv(self, from, tag, buf, timeout)
    }
}

impl Links for Engine {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn kick_watcher(&self) {
        if !self.watch_kicked.swap(true, Ordering::SeqCst) {
            let _ = (&self.watch_tx).write_all_nonblocking(b"k");
        }
    }

    fn shut_down(&self, peer: u32) {
        if let Some(Some(io)) = self.peers.get(peer as usize) {
            io.shutdown();
        }
    }

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
        let Some(Some(io)) = self.peers.get(from as usize) else {
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
                match self.service(from, k, link, &mut rx, Some(&mut own)) {
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
            if self.is_aborted() {
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
                    deadline = Some(now + self.cfg.landing_grace);
                    continue;
                }
                return DriveEnd::Deadline(self.withdraw_while_reading(from, io, &mut own));
            }
            let since = *spin_since.get_or_insert(now);
            if now.duration_since(since) < self.cfg.spin {
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

impl Engine {
    /// Services every held link until it is idle or parked, then releases them all.
    pub(super) fn drain_held(&self, held: &[(u32, usize)]) {
        let mut lost_peers: Vec<(u32, Lost)> = Vec::new();
        for &(rank, k) in held {
            if lost_peers.iter().any(|(r, _)| *r == rank) {
                continue;
            }
            let Some(Some(peer)) = self.peers.get(rank as usize) else {
                continue;
            };
            // A caller asked for this link meanwhile: it reads it into its own buffer, which
            // is better than landing its message here and copying it again.
            if lock(&self.hub.state).peers[rank as usize].links[k].wanted {
                continue;
            }
            let link = &peer.links[k];
            let mut rx = link.rx();
            // A bounded number of rounds keeps a busy link from starving the others.
            for _ in 0..64 {
                match self.service(rank, k, link, &mut rx, None) {
                    Ok(Service::Progress) => continue,
                    Ok(_) => break,
                    Err(lost) => {
                        lost_peers.push((rank, lost));
                        break;
                    }
                }
            }
        }
        {
            let mut st = lock(&self.hub.state);
            let now = Instant::now();
            for &(rank, k) in held {
                let slot = &mut st.peers[rank as usize].links[k];
                slot.holder = Holder::Free;
                // A caller waited for this link: the watcher leaves it to the callers for a
                // while. Otherwise a caller whose messages the watcher delivered (and so never
                // held the link, never refreshing this) would find the watcher back on the
                // link at once, and every later message would take the watcher's hand-off.
                // Links nobody asked for stay the watcher's, so it keeps draining them.
                if slot.wanted {
                    slot.released_at = now;
                }
                slot.wanted = false;
            }
            for peer in st.peers.iter_mut() {
                peer.drop_arriving_if_lost();
            }
        }
        for (rank, lost) in lost_peers {
            self.lose(rank, lost);
        }
        if !held.is_empty() {
            self.hub.wake();
        }
    }

    /// Whether link 0 from `peer` reads its shared-memory lane (for tests and tools).
    pub(crate) fn reads_lane_from(&self, peer: u32) -> bool {
        match self.peers.get(peer as usize) {
            Some(Some(io)) => io.links.first().is_some_and(Link::switched),
            _ => false,
        }
    }

    /// Whether the receive `id` from `from`, at its deadline, keeps reading because its message
    /// is landing in the caller's buffer and more of it landed since the last deadline
    /// (`landed`, updated). Giving up then would move the landed part, and every later byte,
    /// into a buffer of the transport's own as large as the message: the receive that comes
    /// back for it would copy it all again, and the process would hold the message twice.
    fn still_landing(&self, from: u32, id: PostId, landed: &mut Option<u64>) -> bool {
        let now = lock(&self.hub.state).landed_for(from, id);
        let moved = match (now, *landed) {
            (Some(now), Some(before)) => now > before,
            (Some(_), None) => true,
            (None, _) => false,
        };
        *landed = now;
        moved
    }

    /// The deadline passed while this thread reads for its own receive: withdraw it, and if
    /// its message was landing in the caller's buffer, point the links mid-stripe at the owned
    /// copy the matching state made.
    pub(super) fn withdraw_while_reading(
        &self,
        from: u32,
        io: &PeerIo,
        own: &mut OwnReceive<'_>,
    ) -> Option<Outcome> {
        let withdrawn = lock(&self.hub.state).withdraw(from, own.id, own.buf.as_deref());
        match withdrawn {
            Withdrawn::Finished(outcome) => Some(outcome),
            Withdrawn::Gone => None,
            Withdrawn::Moved { seq, base } => {
                for link in &io.links {
                    let mut rx = link.rx();
                    if let Some(p) = rx.payload.as_mut() {
                        if p.seq == seq && matches!(p.land, Destination::Caller) {
                            p.land = Destination::Owned(RawDest(base));
                        }
                    }
                }
                None
            }
        }
    }

    /// Blocks until a non-parked link to `from` is readable, abort, or `wait` passes.
    fn poll_links(&self, io: &PeerIo, from: u32, wait: Duration) {
        POLL_FDS.with(|fds| {
            let mut fds = fds.borrow_mut();
            fds.clear();
            let mut ready = false;
            {
                let st = lock(&self.hub.state);
                for (k, link) in io.links.iter().enumerate() {
                    if !st.peers[from as usize].links[k].parked {
                        fds.push(pollfd(link.fd(), libc::POLLIN));
                        ready |= link.before_poll();
                    }
                }
            }
            fds.push(pollfd(self.abort_rx.as_raw_fd(), libc::POLLIN));
            if !ready {
                poll(&mut fds, wait);
            }
            io.links.iter().for_each(Link::after_poll);
        });
    }
}
