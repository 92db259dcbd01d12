//! The send path: writes a message's frames (striped over the links of a peer, or one
//! single-copy frame to a rank of this host), and while a write blocks reads every free link so
//! that ranks sending to each other cannot deadlock.

use std::cell::RefCell;
use std::io;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use rlx_transport::{CollectiveError, Failure, Tag, blocked_send};

use crate::error::Lost;
use crate::frame::{FrameHeader, FrameKind, HEADER_LEN, Striping};
use crate::matching::Holder;
use crate::sync::{Mutex, MutexGuard, TryLockError, lock};

use super::Engine;
use super::exchange::Companion;
use super::hub::take_free_links;
use super::link::{Link, PeerIo, TxState};
use super::same_host::Bounced;
use super::same_host::DESCRIPTOR_LEN;
use super::service::Service;
use super::socket::{POLL_FDS, poll, pollfd};

/// A sender reading other links while its write blocks re-checks who wants them this often.
const SENDER_POLL: Duration = Duration::from_millis(1);
/// How long a blocked sender waits for its socket alone before it reads other links too.
const LIGHT_WAIT: Duration = Duration::from_millis(1);

thread_local! {
    /// The links a blocked sender holds while it reads them, reused across calls.
    static HELD: RefCell<Vec<(u32, usize)>> = const { RefCell::new(Vec::new()) };
    /// The sends whose caller's work runs on this thread now (see [`Alongside::Work`]), as
    /// (engine address, destination rank): each holds its destination's links until its work
    /// is over, so a send to the same destination from inside that work would wait for itself.
    static OPEN: RefCell<Vec<(usize, u32)>> = const { RefCell::new(Vec::new()) };
}

/// How a frame of a header alone, written whole by [`Engine::send_header_whole`], ended.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Whole {
    /// Every byte is written.
    Sent,
    /// The socket took nothing now; nothing is written.
    NotStarted,
    /// The transport was aborted while the rest waited for room.
    Aborted,
}

/// The work a caller runs while its message is in flight, see
/// `Transport::try_send_message_during`.
pub(crate) type Meanwhile<'a> = &'a mut dyn FnMut() -> Result<(), CollectiveError>;

/// What a send does besides writing its message and waiting for it to leave.
pub(super) enum Alongside<'a, 'c> {
    /// Nothing.
    Nothing,
    /// It moves an exchange's receive on between its writes and while the peer takes the
    /// message (see [`Companion`]).
    Exchange(&'a mut Companion<'c>),
    /// It runs the caller's work once the message is handed over, before it waits for the
    /// peer to take it, so that the two overlap.
    Work(Meanwhile<'a>),
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

impl Engine {
    /// Sends one message (or notice) to `to`; returns once every byte is written to the
    /// kernel.
    pub(crate) fn send(
        &self,
        to: u32,
        kind: FrameKind,
        tag: Tag,
        parts: &[&[u8]],
    ) -> Result<(), CollectiveError> {
        self.send_with(to, kind, tag, parts, Alongside::Nothing, None)
            .map(|_| ())
    }

    /// [`Engine::send`] of a message that must not wait behind a peer that does not read:
    /// `Ok(false)` when its first byte could not leave within `wait` (another send to `to`
    /// holds the links that long, or the peer's socket stays full), and then nothing was sent
    /// and the link stays usable. Once a byte has left, the message is finished as
    /// [`Engine::send`] would.
    pub(crate) fn try_send(
        &self,
        to: u32,
        kind: FrameKind,
        tag: Tag,
        parts: &[&[u8]],
        wait: Duration,
    ) -> Result<bool, CollectiveError> {
        let by = Some(Instant::now() + wait);
        self.send_with(to, kind, tag, parts, Alongside::Nothing, by)
    }

    /// [`Engine::try_send`] of a message that runs `meanwhile` once the message is handed
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
        let work = Alongside::Work(meanwhile);
        self.send_with(to, FrameKind::Data, tag, parts, work, by)
    }

    /// [`Engine::send`], doing `alongside` meanwhile, and giving up before the first byte at
    /// `first_byte_by` when that is given (`Ok(false)`, see [`Engine::try_send`]).
    pub(super) fn send_with(
        &self,
        to: u32,
        kind: FrameKind,
        tag: Tag,
        parts: &[&[u8]],
        alongside: Alongside<'_, '_>,
        first_byte_by: Option<Instant>,
    ) -> Result<bool, CollectiveError> {
        self.check_rank(to)?;
        let engine = std::ptr::from_ref(self) as usize;
        if OpenSend::running(engine, to) {
            return Err(CollectiveError::invalid(format!(
                "a send to rank {to} started inside work that runs while another send to rank \
                 {to} is in flight; it would wait for that send, which waits for the work"
            )));
        }
        let (mut companion, work) = match alongside {
            Alongside::Nothing => (None, None),
            Alongside::Exchange(c) => (Some(c), None),
            Alongside::Work(w) => (None, Some(w)),
        };
        if self.is_aborted() {
            return Err(CollectiveError::Aborted);
        }
        let total: u64 = parts.iter().map(|p| p.len() as u64).sum();
        if total > self.cfg.max_frame {
            return Err(CollectiveError::invalid(format!(
                "message of {total} bytes to rank {to} exceeds the frame cap of {} bytes (RLX_MAX_FRAME_BYTES)",
                self.cfg.max_frame
            )));
        }
        if to == self.rank {
            return self.send_to_self(kind, tag, parts).map(|()| true);
        }
        let io = self.peer_io(to)?;
        if let Some(lost) = lock(&self.hub.state).peers[to as usize].lost.clone() {
            return Err(lost.error(to));
        }
        let mut tx = match first_byte_by {
            None => lock(&io.tx),
            Some(by) => match try_lock_until(&io.tx, by) {
                Some(tx) => tx,
                None => return Ok(false),
            },
        };
        self.switch_to_lane(to, io, &mut tx)?;
        let seq = tx.next_seq;
        // A large message to a rank of this host goes as a descriptor the peer reads it by
        // (`single_copy.rs`); the frame's lengths stay the message's.
        let pull = kind == FrameKind::Data && self.pulls_to(to, total, parts.len());
        let bounced = match pull {
            true => self.prepare_bounce(to, &mut tx.bounce, seq, total, companion.is_some()),
            false => Bounced::default(),
        };
        let descriptor = pull.then(|| self.offer(to, seq, parts, bounced));
        let descriptor_parts: [&[u8]; 1] = [descriptor.as_ref().map_or(&[][..], |d| &d[..])];
        let wire: &[&[u8]] = if pull { &descriptor_parts } else { parts };
        let stripes = match kind {
            _ if pull => Striping::new(DESCRIPTOR_LEN as u64, 1, u64::MAX),
            FrameKind::Data => Striping::new(total, io.links.len(), self.cfg.min_striped),
            _ => Striping::new(total, 1, u64::MAX),
        };
        let frame_kind = if pull { FrameKind::Pull } else { kind };
        let mut headers = [[0u8; HEADER_LEN]; 64];
        let mut sent = [0u64; 64];
        let count = stripes.count().min(64);
        for (i, header) in headers.iter_mut().enumerate().take(count) {
            let (offset, len) = if pull { (0, total) } else { stripes.range(i) };
            *header = FrameHeader {
                kind: frame_kind,
                tag,
                seq,
                total,
                offset,
                len,
            }
            .encode();
        }
        let deadline = Instant::now().checked_add(self.cfg.op_timeout);
        let mut started = false;
        let mut light = true;
        let mut lane_full_since: Option<Instant> = None;
        loop {
            let mut progress = false;
            let mut done = true;
            for i in 0..count {
                let (offset, len) = stripes.range(i);
                let frame_len = HEADER_LEN as u64 + len;
                if sent[i] == frame_len {
                    continue;
                }
                done = false;
                match io.write_frame(&mut tx, i, &headers[i], wire, offset, len, sent[i]) {
                    Ok(n) => {
                        sent[i] += n as u64;
                        progress |= n > 0;
                        started = true;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => {
                        let lost = self.lost_from_io(to, "writing", &e);
                        let err = lost.error(to);
                        self.lose(to, lost);
                        return Err(err);
                    }
                }
            }
            // Nothing may wait between a pulled frame's last byte and its bounced head: a peer
            // that read the frame may already wait for that head (`bounce.rs`).
            if done || (0..count).all(|i| sent[i] == HEADER_LEN as u64 + stripes.range(i).1) {
                break;
            }
            // The exchange's receive moves on between writes, so both directions of the
            // link stream at once instead of one waiting for the other's socket to fill.
            if let Some(c) = companion.as_deref_mut() {
                progress |= self.serve_companion(c);
            }
            if progress {
                lane_full_since = None;
                continue;
            }
            if self.is_aborted() {
                return Err(CollectiveError::Aborted);
            }
            if let Some(lost) = lock(&self.hub.state).peers[to as usize].lost.clone() {
                return Err(lost.error(to));
            }
            let now = Instant::now();
            if !started && first_byte_by.is_some_and(|by| now >= by) {
                return Ok(false);
            }
            if deadline.is_some_and(|d| now >= d) {
                if started {
                    // Half a frame is on the wire: the link cannot carry anything else.
                    return Err(self.abandon_send(to, io, "mid-message"));
                }
                return Err(CollectiveError::Timeout {
                    peer: Some(to),
                    op: "send",
                    after: self.cfg.op_timeout,
                });
            }
            let pending: u64 = (0..count)
                .filter(|&i| sent[i] < HEADER_LEN as u64 + stripes.range(i).1)
                .fold(0, |mask, i| mask | 1 << i);
            // A full lane has no socket to poll, and nothing wakes this side when the peer
            // drains it: yield while the peer is likely reading, then wait in short naps.
            let lane_full = pending & 1 != 0 && tx.on_lane();
            let pending = pending & !u64::from(lane_full);
            if lane_full {
                let since = *lane_full_since.get_or_insert(now);
                if now.duration_since(since) < self.cfg.spin {
                    std::thread::yield_now();
                    continue;
                }
            }
            if let Some(c) = companion.as_deref_mut().filter(|c| c.reading()) {
                if self.wait_exchange(io, pending, c) {
                    continue;
                }
            }
            // Usually the peer is reading and the socket drains within microseconds: wait for
            // that alone first. Only when it does not (the peer may be blocked sending to us,
            // or in a ring of such senders) read every free link while waiting.
            if light && !lane_full {
                light = self.poll_writable(io, pending);
                if light {
                    continue;
                }
            }
            let until = match first_byte_by.filter(|_| !started) {
                Some(by) => Some(deadline.map_or(by, |d| d.min(by))),
                None => deadline,
            };
            let mut wait = until.map(|d| d.saturating_duration_since(now));
            if lane_full {
                wait = Some(wait.map_or(SENDER_POLL, |w| w.min(SENDER_POLL)));
            }
            self.wait_writable(io, pending, wait);
        }
        // An offer is the link's business, not a message: it has no place in the order.
        if kind != FrameKind::Offer {
            tx.next_seq += 1;
        }
        // The bounced head goes in at once, before the caller's work: the peer copies it out
        // right behind.
        if bounced.len > 0 {
            self.bounce_in(&tx.bounce, seq, parts, bounced);
        }
        // The caller's work runs while the peer copies the message. Its error waits until the
        // send is over, so that a peer that is reading is not left with half a message.
        let worked = work.map_or(Ok(()), |work| {
            let _open = OpenSend::enter(engine, to);
            work()
        });
        if pull {
            // The link stays this message's (the send lock held) until the peer has read it,
            // so that nothing overtakes it and the caller's buffer stays untouched meanwhile.
            self.wait_taken(to, io, seq, total, companion, deadline)?;
        }
        if kind == FrameKind::Data {
            self.traffic.sent(total);
        }
        worked.map(|()| true)
    }

    /// Moves link 0 to `to` onto its shared-memory lane once the peer mapped it (`lane.rs`):
    /// the switch frame goes on the socket, everything after it into the ring. A socket that
    /// takes nothing now leaves the switch to a later send.
    fn switch_to_lane(
        &self,
        to: u32,
        io: &PeerIo,
        tx: &mut TxState,
    ) -> Result<(), CollectiveError> {
        let Some(lane) = tx.lane.as_mut().filter(|l| !l.switched && l.accepted()) else {
            return Ok(());
        };
        let Some(link) = io.links.first() else {
            return Ok(());
        };
        let header = FrameHeader::whole(FrameKind::Lane, Tag::from_raw(0), 0, 0).encode();
        let limit = self.cfg.op_timeout;
        match self.send_header_whole(to, io, link, &header, "a lane switch", limit) {
            Ok(Whole::Sent) => {
                lane.switched = true;
                tracing::debug!(peer = to, "link 0 writes into the shared-memory lane");
                Ok(())
            }
            Ok(Whole::NotStarted) => Ok(()),
            Ok(Whole::Aborted) => Err(CollectiveError::Aborted),
            Err(lost) => {
                let err = lost.error(to);
                self.lose(to, lost);
                Err(err)
            }
        }
    }

    /// Writes `header`, a frame without payload, on `link`'s socket to `rank`: nothing when the
    /// socket takes nothing now, else all of it, waiting for room up to `limit`. A writable
    /// socket takes 48 bytes whole in practice; should it take only part, the rest must follow
    /// before any other frame, or the link is unusable, and the peer is lost past `limit`.
    pub(super) fn send_header_whole(
        &self,
        rank: u32,
        io: &PeerIo,
        link: &Link,
        header: &[u8; HEADER_LEN],
        what: &str,
        limit: Duration,
    ) -> Result<Whole, Lost> {
        let mut sent = 0;
        let started = Instant::now();
        loop {
            match link.send_frame(header, &[], 0, 0, sent as u64) {
                Ok(n) => sent += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(self.lost_from_io(rank, &format!("sending {what}"), &e)),
            }
            if sent == 0 {
                return Ok(Whole::NotStarted);
            }
            if sent == HEADER_LEN {
                return Ok(Whole::Sent);
            }
            if started.elapsed() >= limit {
                return Err(Lost::Gone(format!(
                    "{what} to {} stalled after {sent} of {HEADER_LEN} bytes (link unusable)",
                    io.addr
                )));
            }
            let mut fds = [
                pollfd(link.fd(), libc::POLLOUT),
                pollfd(self.abort_rx.as_raw_fd(), libc::POLLIN),
            ];
            poll(&mut fds, Duration::from_millis(10));
            if self.is_aborted() {
                return Ok(Whole::Aborted);
            }
        }
    }

    /// A send to `to` that reached its deadline `when` the link was left in a state nothing
    /// else can follow: the peer is lost, and the send's error is a timeout naming it.
    pub(super) fn abandon_send(&self, to: u32, io: &PeerIo, when: &str) -> CollectiveError {
        let after = self.cfg.op_timeout;
        self.lose(
            to,
            Lost::Gone(format!(
                "a send to it timed out after {after:?} {when} (link to {} unusable)",
                io.addr
            )),
        );
        CollectiveError::Timeout {
            peer: Some(to),
            op: "send",
            after,
        }
    }

    fn send_to_self(
        &self,
        kind: FrameKind,
        tag: Tag,
        parts: &[&[u8]],
    ) -> Result<(), CollectiveError> {
        let mut seq = lock(&self.self_seq);
        let mut st = lock(&self.hub.state);
        match kind {
            FrameKind::Failure => {
                let bytes = parts.concat();
                let failure = Failure::decode(self.rank, &bytes)?;
                st.deliver_local_failure(self.rank, *seq, tag, failure);
            }
            _ => st.deliver_local(self.rank, *seq, tag, parts.concat()),
        }
        *seq += 1;
        drop(st);
        self.hub.wake();
        Ok(())
    }

    /// Waits up to [`LIGHT_WAIT`] for one of the `pending` links of `io` to become writable;
    /// returns whether one did.
    fn poll_writable(&self, io: &PeerIo, pending: u64) -> bool {
        POLL_FDS.with(|fds| {
            let mut fds = fds.borrow_mut();
            fds.clear();
            for (i, link) in io.links.iter().enumerate() {
                if pending & (1 << i) != 0 {
                    fds.push(pollfd(link.fd(), libc::POLLOUT));
                }
            }
            let links = fds.len();
            fds.push(pollfd(self.abort_rx.as_raw_fd(), libc::POLLIN));
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
                &mut lock(&self.hub.state),
                |rank| self.peers.get(rank as usize).is_some_and(Option::is_some),
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
                for (i, link) in io.links.iter().enumerate() {
                    if pending & (1 << i) != 0 {
                        fds.push(pollfd(link.fd(), libc::POLLOUT));
                    }
                }
                let held_links = || {
                    held.iter()
                        .filter_map(|&(rank, k)| match self.peers.get(rank as usize) {
                            Some(Some(p)) => Some(&p.links[k]),
                            _ => None,
                        })
                };
                let mut ready = false;
                for link in held_links() {
                    fds.push(pollfd(link.fd(), libc::POLLIN));
                    ready |= link.before_poll();
                }
                fds.push(pollfd(self.abort_rx.as_raw_fd(), libc::POLLIN));
                if !ready {
                    poll(&mut fds, wait);
                }
                held_links().for_each(Link::after_poll);
            });
            self.drain_held(&held);
        });
        blocked_send::waiting();
    }

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
}

/// Takes `mutex` if it becomes free before `by`: another send to the same peer holds it for as
/// long as that peer does not read, and a message that must not wait gives up instead.
fn try_lock_until<T>(mutex: &Mutex<T>, by: Instant) -> Option<MutexGuard<'_, T>> {
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
