//! The receive path: a receiving thread posts its receive, takes the reader role of the links
//! to its peer and reads them itself, or waits as a follower while another thread reads.

use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rlx_transport::{CollectiveError, Tag};

use crate::error::Lost;
use crate::matching::{Begin, Holder, Outcome, PostId, State, Withdrawn};
use crate::sync::lock;

use super::Engine;
use super::link::{Land, PeerIo, RawDest};
use super::service::{Own, Service};
use super::socket::{POLL_FDS, WakeWrite, poll, pollfd};

/// Why a receiving thread stopped reading.
enum DriveEnd {
    OwnDone,
    Stalled,
    Deadline(Option<Outcome>),
    Lost(Lost),
    Aborted,
}

impl Engine {
    /// Receives the next message from `from` under `tag`, landing it in `buf` when one is
    /// given. `Ok(None)` at the deadline.
    pub(crate) fn recv(
        &self,
        from: u32,
        tag: Tag,
        mut buf: Option<&mut [u8]>,
        timeout: Duration,
    ) -> Result<Option<Outcome>, CollectiveError> {
        self.check_rank(from)?;
        let deadline = Instant::now().checked_add(timeout);
        let mut st = lock(&self.state);
        let id = match st.begin_recv(from, tag, buf.as_ref().map(|b| b.len()))? {
            Begin::Ready(outcome) => {
                drop(st);
                self.wake();
                return Ok(Some(outcome));
            }
            Begin::Posted(id) => {
                // Claiming a message that was still arriving frees budget a stalled reader
                // may be waiting for (notifying under the lock is fine).
                self.wake();
                id
            }
        };
        let is_self = from == self.rank;
        let mut stalled = false;
        loop {
            if let Some(result) = st.poll_post(from, id) {
                return result.map(Some);
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return Ok(match st.withdraw(from, id, buf.as_deref()) {
                    Withdrawn::Finished(outcome) => Some(outcome),
                    Withdrawn::Gone | Withdrawn::Moved { .. } => None,
                });
            }
            let acquired = !is_self && !stalled && self.try_acquire(&mut st, from, id);
            if !acquired {
                let wait = deadline.map_or(Duration::from_secs(3600), |d| d - now);
                self.sleepers.fetch_add(1, Ordering::SeqCst);
                st = match self.changed.wait_timeout(st, wait) {
                    Ok((g, _)) => g,
                    Err(p) => p.into_inner().0,
                };
                self.sleepers.fetch_sub(1, Ordering::SeqCst);
                stalled = false;
                continue;
            }
            drop(st);
            let end = self.drive(from, id, &mut buf, deadline);
            st = lock(&self.state);
            let parked_any = self.release(&mut st, from);
            drop(st);
            self.wake();
            match end {
                DriveEnd::OwnDone | DriveEnd::Aborted => {}
                DriveEnd::Stalled => stalled = parked_any,
                DriveEnd::Deadline(outcome) => return Ok(outcome),
                DriveEnd::Lost(lost) => self.lose(from, lost),
            }
            st = lock(&self.state);
        }
    }

    /// Takes the reader role of every link to `from`, or marks the held ones wanted.
    fn try_acquire(&self, st: &mut State, from: u32, id: PostId) -> bool {
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
        if kick && !self.watch_kicked.swap(true, Ordering::SeqCst) {
            let _ = (&self.watch_tx).write_all_nonblocking(b"k");
        }
        false
    }

    /// Releases the reader role of every link to `from`; returns whether any is parked.
    fn release(&self, st: &mut State, from: u32) -> bool {
        let now = Instant::now();
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

    /// Reads the links to `from` for the posted receive `id` until it finishes, stalls, hits
    /// its deadline or the peer is lost.
    fn drive(
        &self,
        from: u32,
        id: PostId,
        buf: &mut Option<&mut [u8]>,
        deadline: Option<Instant>,
    ) -> DriveEnd {
        let Some(Some(io)) = self.peers.get(from as usize) else {
            return DriveEnd::Stalled;
        };
        let mut own = Own {
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

    /// The deadline passed while this thread reads for its own receive: withdraw it, and if
    /// its message was landing in the caller's buffer, point the links mid-stripe at the owned
    /// copy the matching state made.
    fn withdraw_while_reading(&self, from: u32, io: &PeerIo, own: &mut Own<'_>) -> Option<Outcome> {
        let withdrawn = lock(&self.state).withdraw(from, own.id, own.buf.as_deref());
        match withdrawn {
            Withdrawn::Finished(outcome) => Some(outcome),
            Withdrawn::Gone => None,
            Withdrawn::Moved { seq, base } => {
                for link in &io.links {
                    let mut rx = link.rx();
                    if let Some(p) = rx.payload.as_mut() {
                        if p.seq == seq && matches!(p.land, Land::Caller) {
                            p.land = Land::Owned(RawDest(base));
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
            {
                let st = lock(&self.state);
                for (k, link) in io.links.iter().enumerate() {
                    if !st.peers[from as usize].links[k].parked {
                        fds.push(pollfd(link.fd(), libc::POLLIN));
                    }
                }
            }
            fds.push(pollfd(self.abort_rx.as_raw_fd(), libc::POLLIN));
            poll(&mut fds, wait);
        });
    }
}
