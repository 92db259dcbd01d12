//! The background watcher: polls links no caller has touched for a little while, drains them
//! into the unexpected budget and notices a lost peer even when nobody waits for it; it also
//! runs the heartbeat monitor (`heartbeat.rs`), and records when its rounds began, so that a
//! process that was stopped catches up before it looks (`catch_up.rs`).

use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use crate::matching::Holder;
use crate::sync::lock;

use super::CatchUp;
use super::heartbeat::Pulse;
use crate::progress::core::Core;
use crate::progress::reader::Reader;
use crate::progress::socket::{poll, pollfd};

/// The watcher leaves a link alone until no caller has released it for this long, so that it
/// never sits between back-to-back operations.
const WATCH_IDLE: Duration = Duration::from_millis(2);
/// The watcher's polling period (it also picks up newly idle links at this pace).
const WATCH_PERIOD: Duration = Duration::from_millis(20);

/// The watcher's view: the engine's core, the reader that drains what it finds, and the
/// catch-up clock its rounds keep.
pub(in crate::progress) struct Watcher<'a> {
    core: &'a Core,
    reader: Reader<'a>,
    catch_up: &'a CatchUp,
}

impl<'a> Watcher<'a> {
    pub(in crate::progress) fn new(
        core: &'a Core,
        reader: Reader<'a>,
        catch_up: &'a CatchUp,
    ) -> Self {
        Self {
            core,
            reader,
            catch_up,
        }
    }

    /// The background watcher's loop; returns once the transport is aborted or closed.
    pub(in crate::progress) fn watch(&self) {
        let mut held: Vec<(u32, usize)> = Vec::new();
        let mut due: Vec<(u32, usize)> = Vec::new();
        let mut fds: Vec<libc::pollfd> = Vec::new();
        let mut pulse = Pulse::new(self.core);
        let mut previous = Instant::now();
        while !self.core.is_aborted() {
            let began = Instant::now();
            if let Some(pulse) = pulse.as_mut() {
                pulse.tick(self.core);
            }
            held.clear();
            due.clear();
            let wait = self.take_idle_links(&mut held, &mut due);
            self.poll_idle_links(&held, &mut due, &mut fds, wait);
            let readable: Vec<(u32, usize)> = held
                .iter()
                .zip(fds.iter())
                .filter(|(h, fd)| fd.revents != 0 || due.contains(h))
                .map(|(h, _)| *h)
                .collect();
            self.release_unread(&held, &readable);
            self.reader.drain_held(&readable);
            self.catch_up.watcher_round(previous, began);
            previous = began;
        }
    }

    /// Takes the reader role of every free link no caller wants that has been idle for
    /// [`WATCH_IDLE`] (into `held`), and of parked links whose pulled message waited long
    /// enough (also into `due`: their frame was read already). Returns how long the round may
    /// wait at most.
    fn take_idle_links(
        &self,
        held: &mut Vec<(u32, usize)>,
        due: &mut Vec<(u32, usize)>,
    ) -> Duration {
        let mut wait = WATCH_PERIOD;
        let mut st = lock(&self.core.hub.state);
        let now = Instant::now();
        for (rank, peer) in st.peers.iter_mut().enumerate() {
            if peer.lost.is_some() || self.core.peers.get(rank).is_none_or(|p| p.is_none()) {
                continue;
            }
            // A large message parked while it waits for its receive is taken once its wait is
            // over, so that its sender is never left waiting for a receive that comes only
            // after a send of its own.
            let hold_over = match peer.hold_ends() {
                Some(end) if now >= end => true,
                Some(end) => {
                    wait = wait.min(end - now);
                    false
                }
                None => false,
            };
            for (k, slot) in peer.links.iter_mut().enumerate() {
                if slot.holder == Holder::Free
                    && !slot.wanted
                    && (!slot.parked || (k == 0 && hold_over))
                    && now.duration_since(slot.released_at) >= WATCH_IDLE
                {
                    slot.holder = Holder::Background;
                    held.push((rank as u32, k));
                    // Its frame was read already; the socket may have nothing more.
                    if slot.parked {
                        due.push((rank as u32, k));
                    }
                }
            }
        }
        wait
    }

    /// Polls the `held` links (their results in `fds`, in order), the kick socket and the abort
    /// socket for up to `wait`; a lane with bytes waiting goes into `due` at once, as a readable
    /// socket would. A kick is read away and re-armed.
    fn poll_idle_links(
        &self,
        held: &[(u32, usize)],
        due: &mut Vec<(u32, usize)>,
        fds: &mut Vec<libc::pollfd>,
        wait: Duration,
    ) {
        fds.clear();
        let mut ready = false;
        for &(rank, k) in held {
            if let Some(Some(p)) = self.core.peers.get(rank as usize) {
                fds.push(pollfd(p.links[k].fd(), libc::POLLIN));
                if p.links[k].before_poll() {
                    due.push((rank, k));
                    ready = true;
                }
            }
        }
        fds.push(pollfd(self.core.bell.fd(), libc::POLLIN));
        fds.push(pollfd(self.core.abort_rx.as_raw_fd(), libc::POLLIN));
        poll(fds, if ready { Duration::ZERO } else { wait });
        for &(rank, k) in held {
            if let Some(Some(p)) = self.core.peers.get(rank as usize) {
                p.links[k].after_poll();
            }
        }
        if fds[held.len()].revents != 0 {
            self.core.bell.heard();
        }
    }

    /// Releases the `held` links that are not `readable` without touching them.
    fn release_unread(&self, held: &[(u32, usize)], readable: &[(u32, usize)]) {
        let mut released = false;
        let mut st = lock(&self.core.hub.state);
        let now = Instant::now();
        for slot in held.iter().filter(|h| !readable.contains(h)) {
            let slot = &mut st.peers[slot.0 as usize].links[slot.1];
            slot.holder = Holder::Free;
            // A caller kicked the watcher for this link: it gets its turn before the watcher's
            // next round could take the link back.
            if slot.wanted {
                slot.released_at = now;
            }
            slot.wanted = false;
            released = true;
        }
        drop(st);
        if released {
            self.core.hub.wake();
        }
    }
}
