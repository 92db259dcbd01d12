//! The progress engine: reads and writes the sockets of established links on the calling
//! threads, and feeds the [`State`](crate::matching::State) matching machine.
//!
//! How a receive makes progress (no thread hop on the latency path):
//! - The receiving thread posts its receive, then takes the *reader role* of every link to the
//!   peer it waits for, and reads those sockets itself: non-blocking reads in a short spin, then
//!   `poll(2)`. A frame for its own receive lands straight in its buffer.
//! - A thread that finds the links taken waits on the condition variable (a follower): the
//!   reader hands frames addressed to others over in buffers of their own and wakes them, and
//!   wakes them again when it releases the links so that one of them reads next.
//! - A sender whose write would block reads every free link meanwhile (so two ranks sending
//!   large messages to each other, or a ring of them, cannot deadlock), within the per-peer
//!   unexpected budget.
//! - A background watcher polls links that no caller has touched for a little while: it drains
//!   them into the budget and notices a lost peer at once even when nobody waits for it. A caller
//!   that wants a link the watcher holds kicks it through a wake-up socket.
//!
//! Failure: EOF, a reset or a protocol violation on any link marks the peer lost, shuts its
//! sockets down (so every thread polling them wakes) and wakes every waiter; `abort` does the
//! same for every peer and makes its wake-up socket readable forever.

use std::cell::RefCell;
use std::io::{self, IoSlice, Read};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rlx_transport::{CollectiveError, FAILURE_WIRE_LEN, Failure, Tag};

use crate::error::{Lost, protocol_lost};
use crate::frame::{FrameHeader, FrameKind, HEADER_LEN, Striping};
use crate::matching::{Begin, Holder, Landing, Outcome, PostId, State, Withdrawn};
use crate::sync::{Condvar, Mutex, lock};

/// Size of each link's staging buffer: small frames arrive many to a `read`.
const STAGING: usize = 64 * 1024;
/// Payloads at least this long (with nothing staged) are read straight into their destination.
const DIRECT_READ_MIN: u64 = 16 * 1024;
/// Default of [`EngineConfig::spin`]: how long a thread that waits for its own receive spins
/// on non-blocking reads before it blocks in `poll(2)` (a blocking wake-up costs ~30 µs on the
/// reference machine).
pub(crate) const DEFAULT_SPIN: Duration = Duration::from_micros(50);
/// The watcher leaves a link alone until no caller has released it for this long, so that it
/// never sits between back-to-back operations.
const WATCH_IDLE: Duration = Duration::from_millis(2);
/// The watcher's polling period (it also picks up newly idle links at this pace).
const WATCH_PERIOD: Duration = Duration::from_millis(20);
/// A sender reading other links while its write blocks re-checks who wants them this often.
const SENDER_POLL: Duration = Duration::from_millis(1);
/// How long a blocked sender waits for its socket alone before it reads other links too.
const LIGHT_WAIT: Duration = Duration::from_millis(1);
/// Most slices one vectored write takes.
const MAX_IOV: usize = 16;

/// Tuning shared by every link of a transport.
#[derive(Clone, Copy, Debug)]
pub(crate) struct EngineConfig {
    pub(crate) max_frame: u64,
    pub(crate) max_unexpected: u64,
    pub(crate) min_striped: u64,
    pub(crate) op_timeout: Duration,
    pub(crate) spin: Duration,
}

/// A raw destination address that crosses threads with the link state that uses it.
#[derive(Clone, Copy, Debug)]
struct RawDest(*mut u8);

// SAFETY: the pointer addresses the owned buffer of an arriving message, which lives in the
// matching state until every stripe of that message has been written (see `LinkRx::payload`);
// only the thread holding the link's reader role dereferences it, for the byte range of that
// link's stripe, which no other link writes.
unsafe impl Send for RawDest {}

#[derive(Clone, Copy, Debug)]
enum Land {
    Caller,
    Owned(RawDest),
    Discard,
}

#[derive(Debug)]
struct Payload {
    seq: u64,
    land: Land,
    /// Offset of the next byte inside the message.
    at: u64,
    remaining: u64,
}

/// Switches a link whose peer runs on this host to Reno, the congestion control every kernel
/// has and lets any user choose; links to other hosts keep the host's choice.
///
/// Traffic between two processes of one host crosses the loopback device, where nothing is
/// congested, yet the host's default algorithm still runs on it. The reference machine's
/// default, BBR, paces every send at its estimate of the link's bandwidth, and that estimate
/// can collapse after a burst of large messages and stay low, so that every later message of
/// the connection arrives late. Two processes, each pinned to its own core, f32 sum, a 4 MiB
/// sweep and then 128 KiB, 512 KiB and 2 MiB, eight interleaved runs each: under BBR four runs
/// stayed slow (128 KiB in 92-100 µs against 41-45 µs in the other four; 512 KiB in
/// 321-377 µs, 2 MiB in 1.43-1.61 ms); under Reno none did (41-46 µs, 180-193 µs,
/// 0.87-0.96 ms). Reno does not pace.
///
/// Best effort: where the option does not exist (other systems, kernels without Reno as a
/// choice) the link keeps the default, which works, only slower.
#[cfg(any(target_os = "linux", target_os = "android", target_os = "freebsd"))]
fn same_host_congestion_control(stream: &TcpStream) {
    let same_host = match (stream.peer_addr(), stream.local_addr()) {
        (Ok(peer), Ok(local)) => peer.ip().is_loopback() || peer.ip() == local.ip(),
        _ => false,
    };
    if same_host {
        // Ignored on failure, as documented above.
        let _ = socket2::SockRef::from(stream).set_tcp_congestion(b"reno");
    }
}

/// Other systems have no per-socket congestion control to choose.
#[cfg(not(any(target_os = "linux", target_os = "android", target_os = "freebsd")))]
fn same_host_congestion_control(_stream: &TcpStream) {}

/// Receive-side state of one link; only the holder of the link's reader role touches it.
#[derive(Debug)]
struct LinkRx {
    staging: Box<[u8]>,
    start: usize,
    end: usize,
    header: Option<FrameHeader>,
    payload: Option<Payload>,
}

impl LinkRx {
    fn new() -> Self {
        Self {
            staging: vec![0u8; STAGING].into_boxed_slice(),
            start: 0,
            end: 0,
            header: None,
            payload: None,
        }
    }

    fn staged(&self) -> usize {
        self.end - self.start
    }

    /// Reads more bytes into the staging buffer, keeping what is unread.
    fn fill(&mut self, stream: &TcpStream) -> io::Result<usize> {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        } else if self.end == self.staging.len() {
            self.staging.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        read_some(stream, &mut self.staging[self.end..]).inspect(|&n| self.end += n)
    }
}

fn read_some(mut stream: &TcpStream, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match stream.read(buf) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

/// One TCP connection to a peer.
#[derive(Debug)]
pub(crate) struct Link {
    stream: TcpStream,
    rx: std::sync::Mutex<LinkRx>,
}

impl Link {
    pub(crate) fn new(stream: TcpStream) -> Self {
        Self {
            stream,
            rx: std::sync::Mutex::new(LinkRx::new()),
        }
    }

    fn fd(&self) -> RawFd {
        self.stream.as_raw_fd()
    }

    fn rx(&self) -> std::sync::MutexGuard<'_, LinkRx> {
        match self.rx.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }
}

#[derive(Debug)]
struct TxState {
    next_seq: u64,
}

/// Everything this rank holds for one peer.
#[derive(Debug)]
pub(crate) struct PeerIo {
    links: Vec<Link>,
    addr: String,
    tx: std::sync::Mutex<TxState>,
}

impl PeerIo {
    pub(crate) fn new(streams: Vec<TcpStream>, addr: Option<SocketAddr>) -> Self {
        let addr = addr.map_or_else(|| "an unknown address".to_owned(), |a| a.to_string());
        Self {
            links: streams.into_iter().map(Link::new).collect(),
            addr,
            tx: std::sync::Mutex::new(TxState { next_seq: 0 }),
        }
    }

    fn shutdown(&self) {
        for link in &self.links {
            let _ = link.stream.shutdown(Shutdown::Both);
        }
    }
}

/// The receiving thread's own posted receive, while it reads.
struct Own<'a> {
    id: PostId,
    buf: Option<&'a mut [u8]>,
}

/// What one round of servicing a link achieved.
#[derive(Debug, PartialEq, Eq)]
enum Service {
    /// Bytes moved; call again.
    Progress,
    /// The socket has nothing more now.
    Idle,
    /// The next frame cannot be taken now (budget, or waiting for link 0).
    Parked,
    /// The caller's own receive finished.
    OwnDone,
}

/// Why a receiving thread stopped reading.
enum DriveEnd {
    OwnDone,
    Stalled,
    Deadline(Option<Outcome>),
    Lost(Lost),
    Aborted,
}

thread_local! {
    static POLL_FDS: RefCell<Vec<libc::pollfd>> = const { RefCell::new(Vec::new()) };
    static HELD: RefCell<Vec<(u32, usize)>> = const { RefCell::new(Vec::new()) };
}

/// The progress engine of one transport; see the module docs.
#[derive(Debug)]
pub(crate) struct Engine {
    rank: u32,
    world: u32,
    cfg: EngineConfig,
    peers: Vec<Option<PeerIo>>,
    state: Mutex<State>,
    changed: Condvar,
    aborted: AtomicBool,
    abort_tx: UnixStream,
    abort_rx: UnixStream,
    watch_tx: UnixStream,
    watch_rx: UnixStream,
    watch_kicked: AtomicBool,
    /// Threads waiting on `changed`; notifying costs a system call, so only when non-zero.
    sleepers: AtomicUsize,
    self_seq: std::sync::Mutex<u64>,
}

impl Engine {
    /// An engine over established links: `peers[r]` holds rank `r`'s links (`None` for this
    /// rank), every peer with the same number of links.
    pub(crate) fn new(
        rank: u32,
        world: u32,
        cfg: EngineConfig,
        peers: Vec<Option<PeerIo>>,
    ) -> io::Result<Self> {
        let links = peers
            .iter()
            .flatten()
            .map(|p| p.links.len())
            .max()
            .unwrap_or(1);
        for peer in peers.iter().flatten() {
            for link in &peer.links {
                link.stream.set_nonblocking(true)?;
                same_host_congestion_control(&link.stream);
            }
        }
        let (abort_tx, abort_rx) = UnixStream::pair()?;
        let (watch_tx, watch_rx) = UnixStream::pair()?;
        for s in [&abort_tx, &abort_rx, &watch_tx, &watch_rx] {
            s.set_nonblocking(true)?;
        }
        Ok(Self {
            rank,
            world,
            cfg,
            peers,
            state: Mutex::new(State::new(
                world,
                links,
                cfg.max_unexpected,
                cfg.min_striped,
            )),
            changed: Condvar::new(),
            aborted: AtomicBool::new(false),
            abort_tx,
            abort_rx,
            watch_tx,
            watch_rx,
            watch_kicked: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            self_seq: std::sync::Mutex::new(0),
        })
    }

    pub(crate) fn op_timeout(&self) -> Duration {
        self.cfg.op_timeout
    }

    /// Wakes the threads waiting on the state. A waiter registers in `sleepers` while holding
    /// the state lock before it sleeps, and every caller changes the state under that lock
    /// before calling this, so a waiter either sees the change or is counted here.
    fn wake(&self) {
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            self.changed.notify_all();
        }
    }

    fn peer_io(&self, rank: u32) -> Result<&PeerIo, CollectiveError> {
        match self.peers.get(rank as usize) {
            Some(Some(p)) => Ok(p),
            _ => Err(CollectiveError::UnknownRank {
                rank,
                world_size: self.world,
            }),
        }
    }

    fn check_rank(&self, rank: u32) -> Result<(), CollectiveError> {
        if rank >= self.world {
            return Err(CollectiveError::UnknownRank {
                rank,
                world_size: self.world,
            });
        }
        Ok(())
    }

    /// The address of `rank`'s first link, for messages.
    pub(crate) fn peer_addr(&self, rank: u32) -> Option<SocketAddr> {
        let peer = self.peers.get(rank as usize)?.as_ref()?;
        peer.links.first()?.stream.peer_addr().ok()
    }

    // ----- failure -----------------------------------------------------------------------

    /// Marks `peer` lost, shuts its sockets down and wakes everyone.
    fn lose(&self, peer: u32, lost: Lost) {
        lock(&self.state).mark_lost(peer, lost);
        if let Some(Some(io)) = self.peers.get(peer as usize) {
            io.shutdown();
        }
        self.wake();
    }

    fn lost_from_io(&self, peer: u32, what: &str, err: &io::Error) -> Lost {
        let addr = self.peers.get(peer as usize).and_then(|p| p.as_ref());
        let addr = addr.map_or("an unknown address", |p| p.addr.as_str());
        Lost::Gone(format!("{what} with {addr} failed: {err}"))
    }

    fn lost_eof(&self, peer: u32) -> Lost {
        let addr = self.peers.get(peer as usize).and_then(|p| p.as_ref());
        let addr = addr.map_or("an unknown address", |p| p.addr.as_str());
        Lost::Gone(format!(
            "connection to {addr} closed (the process ended or crashed)"
        ))
    }

    /// Wakes every blocked call with `Aborted`, shuts every socket down; idempotent.
    pub(crate) fn abort(&self) {
        if self.aborted.swap(true, Ordering::SeqCst) {
            return;
        }
        lock(&self.state).aborted = true;
        let _ = (&self.abort_tx).write_all_nonblocking(b"!");
        for peer in self.peers.iter().flatten() {
            peer.shutdown();
        }
        self.wake();
    }

    pub(crate) fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::SeqCst)
    }

    /// Says goodbye on every link (best effort, never blocking), then shuts everything down.
    pub(crate) fn close(&self) {
        if !self.is_aborted() {
            let close = FrameHeader::whole(FrameKind::Close, Tag::from_raw(0), 0, 0).encode();
            for peer in self.peers.iter().flatten() {
                if let Ok(_tx) = peer.tx.try_lock() {
                    if let Some(link) = peer.links.first() {
                        let _ = send_vectored(&link.stream, &[IoSlice::new(&close)]);
                    }
                }
                for link in &peer.links {
                    let _ = link.stream.shutdown(Shutdown::Write);
                    // Closing a socket with unread bytes makes the kernel reset it, which
                    // discards what this side has not transmitted yet; read them away first.
                    let mut sink = [0u8; 4096];
                    for _ in 0..256 {
                        if !matches!(read_some(&link.stream, &mut sink), Ok(n) if n > 0) {
                            break;
                        }
                    }
                }
            }
        }
        self.abort();
    }

    // ----- receiving ---------------------------------------------------------------------

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

    /// Moves bytes on one link whose reader role this thread holds.
    fn service(
        &self,
        from: u32,
        k: usize,
        link: &Link,
        rx: &mut LinkRx,
        mut own: Option<&mut Own<'_>>,
    ) -> Result<Service, Lost> {
        let own_id = own.as_ref().map(|o| o.id);
        loop {
            if let Some(payload) = rx.payload.as_mut() {
                let n = self.move_payload(
                    from,
                    link,
                    payload,
                    &mut rx.staging,
                    &mut rx.start,
                    rx.end,
                    own.as_deref_mut(),
                )?;
                match n {
                    PayloadStep::Moved(n) => {
                        let seq = payload.seq;
                        if payload.remaining == 0 {
                            rx.payload = None;
                        }
                        if self.account(from, seq, n as u64, own_id)? {
                            return Ok(Service::OwnDone);
                        }
                        return Ok(Service::Progress);
                    }
                    PayloadStep::NeedFill => match rx.fill(&link.stream) {
                        Ok(0) => return Err(self.lost_eof(from)),
                        Ok(_) => continue,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            return Ok(Service::Idle);
                        }
                        Err(e) => return Err(self.lost_from_io(from, "reading", &e)),
                    },
                    PayloadStep::Idle => return Ok(Service::Idle),
                }
            }
            if rx.header.is_none() {
                if rx.staged() < HEADER_LEN {
                    match rx.fill(&link.stream) {
                        Ok(0) => return Err(self.lost_eof(from)),
                        Ok(_) => continue,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            return Ok(Service::Idle);
                        }
                        Err(e) => return Err(self.lost_from_io(from, "reading", &e)),
                    }
                }
                let mut bytes = [0u8; HEADER_LEN];
                bytes.copy_from_slice(&rx.staging[rx.start..rx.start + HEADER_LEN]);
                let header =
                    FrameHeader::decode(from, &bytes, self.cfg.max_frame).map_err(protocol_lost)?;
                rx.start += HEADER_LEN;
                rx.header = Some(header);
            }
            let Some(header) = rx.header else {
                continue;
            };
            match header.kind {
                FrameKind::Close => {
                    let addr = self.peers.get(from as usize).and_then(|p| p.as_ref());
                    let addr = addr.map_or("an unknown address", |p| p.addr.as_str());
                    return Err(Lost::Gone(format!(
                        "it closed its transport (connection to {addr})"
                    )));
                }
                FrameKind::Failure => {
                    if rx.staged() < FAILURE_WIRE_LEN {
                        match rx.fill(&link.stream) {
                            Ok(0) => return Err(self.lost_eof(from)),
                            Ok(_) => continue,
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                                return Ok(Service::Idle);
                            }
                            Err(e) => return Err(self.lost_from_io(from, "reading", &e)),
                        }
                    }
                    if k != 0 {
                        return Err(protocol_lost(CollectiveError::protocol(
                            Some(from),
                            format!("failure notice on link {k} (only link 0 carries them)"),
                        )));
                    }
                    let failure =
                        Failure::decode(from, &rx.staging[rx.start..rx.start + FAILURE_WIRE_LEN])
                            .map_err(protocol_lost)?;
                    let mut st = lock(&self.state);
                    let taken = st
                        .on_failure(from, header.seq, header.tag, failure)
                        .map_err(protocol_lost)?;
                    if !taken {
                        st.peers[from as usize].links[k].parked = true;
                        return Ok(Service::Parked);
                    }
                    let done = own_id.is_some_and(|id| st.is_done(from, id));
                    drop(st);
                    rx.start += FAILURE_WIRE_LEN;
                    rx.header = None;
                    self.wake();
                    if done {
                        return Ok(Service::OwnDone);
                    }
                    return Ok(Service::Progress);
                }
                FrameKind::Data => {
                    let mut st = lock(&self.state);
                    let landing = if header.offset == 0 {
                        if k != 0 {
                            return Err(protocol_lost(CollectiveError::protocol(
                                Some(from),
                                format!("message start on link {k} (only link 0 carries them)"),
                            )));
                        }
                        st.on_first_frame(from, &header, own_id)
                    } else {
                        st.on_stripe(from, k, &header, own_id)
                    }
                    .map_err(protocol_lost)?;
                    let land = match landing {
                        Landing::Park => {
                            st.peers[from as usize].links[k].parked = true;
                            return Ok(Service::Parked);
                        }
                        Landing::Caller => Land::Caller,
                        Landing::Owned(ptr) => Land::Owned(RawDest(ptr)),
                        Landing::Discard => Land::Discard,
                    };
                    st.peers[from as usize].links[k].parked = false;
                    rx.header = None;
                    if header.len == 0 {
                        let done = own_id.is_some_and(|id| st.is_done(from, id));
                        drop(st);
                        self.wake();
                        if done {
                            return Ok(Service::OwnDone);
                        }
                        return Ok(Service::Progress);
                    }
                    drop(st);
                    rx.payload = Some(Payload {
                        seq: header.seq,
                        land,
                        at: header.offset,
                        remaining: header.len,
                    });
                }
            }
        }
    }

    /// Moves the next piece of a payload: from the staging buffer, or straight from the socket
    /// when the piece is large and nothing is staged.
    #[allow(clippy::too_many_arguments, reason = "the split borrows of one LinkRx")]
    fn move_payload(
        &self,
        from: u32,
        link: &Link,
        payload: &mut Payload,
        staging: &mut [u8],
        start: &mut usize,
        end: usize,
        own: Option<&mut Own<'_>>,
    ) -> Result<PayloadStep, Lost> {
        let staged = end - *start;
        let want = payload.remaining.min(usize::MAX as u64) as usize;
        let at = payload.at as usize;
        let n = if staged > 0 {
            let n = staged.min(want);
            let src = &staging[*start..*start + n];
            match payload.land {
                Land::Caller => match own.and_then(|o| o.buf.as_deref_mut()) {
                    Some(buf) => buf[at..at + n].copy_from_slice(src),
                    None => return Err(internal_lost(from)),
                },
                Land::Owned(dest) => {
                    // SAFETY: see `RawDest`: `at + n` lies inside the message (checked when
                    // the frame header was decoded and matched) and this link alone writes
                    // this stripe's range while the message is arriving.
                    unsafe {
                        std::ptr::copy_nonoverlapping(src.as_ptr(), dest.0.add(at), n);
                    }
                }
                Land::Discard => {}
            }
            *start += n;
            n
        } else if payload.remaining >= DIRECT_READ_MIN && !matches!(payload.land, Land::Discard) {
            let result = match payload.land {
                Land::Caller => match own.and_then(|o| o.buf.as_deref_mut()) {
                    Some(buf) => read_some(&link.stream, &mut buf[at..at + want]),
                    None => return Err(internal_lost(from)),
                },
                Land::Owned(dest) => {
                    // SAFETY: as above; the slice covers exactly the unwritten rest of this
                    // link's stripe, which nothing else reads or writes meanwhile.
                    let slice = unsafe { std::slice::from_raw_parts_mut(dest.0.add(at), want) };
                    read_some(&link.stream, slice)
                }
                Land::Discard => Ok(0),
            };
            match result {
                Ok(0) => return Err(self.lost_eof(from)),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(PayloadStep::Idle),
                Err(e) => return Err(self.lost_from_io(from, "reading", &e)),
            }
        } else {
            return Ok(PayloadStep::NeedFill);
        };
        payload.at += n as u64;
        payload.remaining -= n as u64;
        Ok(PayloadStep::Moved(n))
    }

    /// Records `n` bytes of message `seq`; returns whether the caller's own receive is done.
    fn account(&self, from: u32, seq: u64, n: u64, own: Option<PostId>) -> Result<bool, Lost> {
        let mut st = lock(&self.state);
        let completed = st.on_bytes(from, seq, n).map_err(protocol_lost)?;
        let done = own.is_some_and(|id| st.is_done(from, id));
        drop(st);
        if completed && !done {
            self.wake();
        }
        Ok(done)
    }

    // ----- sending -----------------------------------------------------------------------

    /// Sends one message (or notice) to `to`; returns once every byte is written to the
    /// kernel.
    pub(crate) fn send(
        &self,
        to: u32,
        kind: FrameKind,
        tag: Tag,
        parts: &[&[u8]],
    ) -> Result<(), CollectiveError> {
        self.check_rank(to)?;
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
            return self.send_to_self(kind, tag, parts);
        }
        let io = self.peer_io(to)?;
        if let Some(lost) = lock(&self.state).peers[to as usize].lost.clone() {
            return Err(lost.error(to));
        }
        let mut tx = match io.tx.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        let seq = tx.next_seq;
        let stripes = match kind {
            FrameKind::Data => Striping::new(total, io.links.len(), self.cfg.min_striped),
            _ => Striping::new(total, 1, u64::MAX),
        };
        let mut headers = [[0u8; HEADER_LEN]; 64];
        let mut sent = [0u64; 64];
        let count = stripes.count().min(64);
        for (i, header) in headers.iter_mut().enumerate().take(count) {
            let (offset, len) = stripes.range(i);
            *header = FrameHeader {
                kind,
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
                match write_frame(
                    &io.links[i].stream,
                    &headers[i],
                    parts,
                    offset,
                    len,
                    sent[i],
                ) {
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
            if done {
                break;
            }
            if progress {
                continue;
            }
            if self.is_aborted() {
                return Err(CollectiveError::Aborted);
            }
            if let Some(lost) = lock(&self.state).peers[to as usize].lost.clone() {
                return Err(lost.error(to));
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                let after = self.cfg.op_timeout;
                if started {
                    // Half a frame is on the wire: the link cannot carry anything else.
                    self.lose(
                        to,
                        Lost::Gone(format!(
                            "a send to it timed out after {after:?} mid-message (link to {} unusable)",
                            io.addr
                        )),
                    );
                }
                return Err(CollectiveError::Timeout {
                    peer: Some(to),
                    op: "send",
                    after,
                });
            }
            let pending: u64 = (0..count)
                .filter(|&i| sent[i] < HEADER_LEN as u64 + stripes.range(i).1)
                .fold(0, |mask, i| mask | 1 << i);
            // Usually the peer is reading and the socket drains within microseconds: wait for
            // that alone first. Only when it does not (the peer may be blocked sending to us,
            // or in a ring of such senders) read every free link while waiting.
            if light {
                light = self.poll_writable(io, pending);
                if light {
                    continue;
                }
            }
            self.wait_writable(io, pending, deadline.map(|d| d - now));
        }
        tx.next_seq += 1;
        Ok(())
    }

    fn send_to_self(
        &self,
        kind: FrameKind,
        tag: Tag,
        parts: &[&[u8]],
    ) -> Result<(), CollectiveError> {
        let mut seq = match self.self_seq.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        let mut st = lock(&self.state);
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
        self.wake();
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
            {
                let mut st = lock(&self.state);
                for (rank, peer) in st.peers.iter_mut().enumerate() {
                    if peer.lost.is_some() || self.peers.get(rank).is_none_or(|p| p.is_none()) {
                        continue;
                    }
                    for (k, slot) in peer.links.iter_mut().enumerate() {
                        if slot.holder == Holder::Free && !slot.wanted && !slot.parked {
                            slot.holder = Holder::Sender;
                            held.push((rank as u32, k));
                        }
                    }
                }
            }
            let limit = if held.is_empty() {
                Duration::from_millis(100)
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
                for &(rank, k) in held.iter() {
                    if let Some(Some(p)) = self.peers.get(rank as usize) {
                        fds.push(pollfd(p.links[k].fd(), libc::POLLIN));
                    }
                }
                fds.push(pollfd(self.abort_rx.as_raw_fd(), libc::POLLIN));
                poll(&mut fds, wait);
            });
            self.drain_held(&held);
        });
    }

    /// Services every held link until it is idle or parked, then releases them all.
    fn drain_held(&self, held: &[(u32, usize)]) {
        let mut lost_peers: Vec<(u32, Lost)> = Vec::new();
        for &(rank, k) in held {
            if lost_peers.iter().any(|(r, _)| *r == rank) {
                continue;
            }
            let Some(Some(peer)) = self.peers.get(rank as usize) else {
                continue;
            };
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
            let mut st = lock(&self.state);
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
            self.wake();
        }
    }

    // ----- the watcher -------------------------------------------------------------------

    /// The background watcher's loop; returns after [`Engine::abort`].
    pub(crate) fn watch(&self) {
        let mut held: Vec<(u32, usize)> = Vec::new();
        let mut fds: Vec<libc::pollfd> = Vec::new();
        while !self.is_aborted() {
            held.clear();
            {
                let mut st = lock(&self.state);
                let now = Instant::now();
                for (rank, peer) in st.peers.iter_mut().enumerate() {
                    if peer.lost.is_some() || self.peers.get(rank).is_none_or(|p| p.is_none()) {
                        continue;
                    }
                    for (k, slot) in peer.links.iter_mut().enumerate() {
                        if slot.holder == Holder::Free
                            && !slot.wanted
                            && !slot.parked
                            && now.duration_since(slot.released_at) >= WATCH_IDLE
                        {
                            slot.holder = Holder::Background;
                            held.push((rank as u32, k));
                        }
                    }
                }
            }
            fds.clear();
            for &(rank, k) in &held {
                if let Some(Some(p)) = self.peers.get(rank as usize) {
                    fds.push(pollfd(p.links[k].fd(), libc::POLLIN));
                }
            }
            fds.push(pollfd(self.watch_rx.as_raw_fd(), libc::POLLIN));
            fds.push(pollfd(self.abort_rx.as_raw_fd(), libc::POLLIN));
            poll(&mut fds, WATCH_PERIOD);
            if fds[held.len()].revents != 0 {
                let mut sink = [0u8; 64];
                while matches!((&self.watch_rx).read(&mut sink), Ok(n) if n > 0) {}
                self.watch_kicked.store(false, Ordering::SeqCst);
            }
            let readable: Vec<(u32, usize)> = held
                .iter()
                .zip(fds.iter())
                .filter(|(_, fd)| fd.revents != 0)
                .map(|(h, _)| *h)
                .collect();
            // Links that were not readable are released without being touched.
            let idle: Vec<(u32, usize)> = held
                .iter()
                .filter(|h| !readable.contains(h))
                .copied()
                .collect();
            {
                let mut st = lock(&self.state);
                let now = Instant::now();
                for &(rank, k) in &idle {
                    let slot = &mut st.peers[rank as usize].links[k];
                    slot.holder = Holder::Free;
                    // A caller kicked the watcher for this link: it gets its turn before the
                    // watcher's next round could take the link back.
                    if slot.wanted {
                        slot.released_at = now;
                    }
                    slot.wanted = false;
                }
            }
            if !idle.is_empty() {
                self.wake();
            }
            self.drain_held(&readable);
        }
    }
}

enum PayloadStep {
    Moved(usize),
    NeedFill,
    Idle,
}

fn internal_lost(from: u32) -> Lost {
    Lost::Protocol(format!(
        "frame from rank {from} addressed a receive buffer that is not present"
    ))
}

fn pollfd(fd: RawFd, events: libc::c_short) -> libc::pollfd {
    libc::pollfd {
        fd,
        events,
        revents: 0,
    }
}

/// `poll(2)` over `fds` for at most `wait`; errors and interrupts count as a wake-up (every
/// caller re-checks its state).
fn poll(fds: &mut [libc::pollfd], wait: Duration) {
    let ms = wait.as_millis().min(i32::MAX as u128) as libc::c_int;
    // Round a sub-millisecond wait up so the call sleeps instead of spinning.
    let ms = if ms == 0 && !wait.is_zero() { 1 } else { ms };
    // SAFETY: `fds` is a valid, exclusively borrowed array of `fds.len()` pollfd structures.
    unsafe {
        libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms);
    }
}

#[cfg(any(target_os = "linux", target_os = "android"))]
const SEND_FLAGS: libc::c_int = libc::MSG_NOSIGNAL;
#[cfg(not(any(target_os = "linux", target_os = "android")))]
const SEND_FLAGS: libc::c_int = 0;

fn send_vectored(stream: &TcpStream, slices: &[IoSlice<'_>]) -> io::Result<usize> {
    loop {
        match socket2::SockRef::from(stream).send_vectored_with_flags(slices, SEND_FLAGS) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

/// Writes as much as the socket takes of one frame (header, then bytes `offset..offset+len`
/// of the concatenated `parts`), of which `sent` bytes are already written.
fn write_frame(
    stream: &TcpStream,
    header: &[u8; HEADER_LEN],
    parts: &[&[u8]],
    offset: u64,
    len: u64,
    sent: u64,
) -> io::Result<usize> {
    let mut slices: [IoSlice<'_>; MAX_IOV] = [IoSlice::new(&[]); MAX_IOV];
    let mut n = 0;
    if sent < HEADER_LEN as u64 {
        slices[0] = IoSlice::new(&header[sent as usize..]);
        n = 1;
    }
    // Position inside the message of the next payload byte to write.
    let body_sent = sent.saturating_sub(HEADER_LEN as u64);
    let mut from = offset + body_sent;
    let end = offset + len;
    let mut part_start = 0u64;
    for part in parts {
        if n == MAX_IOV || from >= end {
            break;
        }
        let part_end = part_start + part.len() as u64;
        if part_end > from {
            let lo = (from - part_start) as usize;
            let hi = (end.min(part_end) - part_start) as usize;
            if hi > lo {
                slices[n] = IoSlice::new(&part[lo..hi]);
                n += 1;
                from = part_start + hi as u64;
            }
        }
        part_start = part_end;
    }
    if n == 0 {
        return Ok(0);
    }
    send_vectored(stream, &slices[..n])
}

/// Writing one byte to a non-blocking wake-up socket: a full buffer already means "awake".
trait WakeWrite {
    fn write_all_nonblocking(self, bytes: &[u8]) -> io::Result<()>;
}

impl WakeWrite for &UnixStream {
    fn write_all_nonblocking(self, bytes: &[u8]) -> io::Result<()> {
        let mut s = self;
        match io::Write::write(&mut s, bytes) {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(()),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(any(target_os = "linux", target_os = "android", target_os = "freebsd"))]
    #[test]
    fn links_to_this_host_use_reno() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        for stream in [&client, &server] {
            same_host_congestion_control(stream);
            let name = socket2::SockRef::from(stream).tcp_congestion().unwrap();
            // The kernel reports the name in a fixed-size, NUL-padded field.
            let name: Vec<u8> = name.into_iter().take_while(|&b| b != 0).collect();
            assert_eq!(name, b"reno");
        }
    }
}
