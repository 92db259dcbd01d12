//! The sockets this rank holds for its peers ([`PeerIo`], [`Link`]) and each link's receive
//! state (staging buffer, frame being read), shared by the receive, send and watcher paths.

use std::io;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use rlx_transport::CollectiveError;

use crate::error::{Lost, protocol_lost};
use crate::frame::{FrameHeader, HEADER_LEN};
use crate::matching::PostId;
use crate::sync::{AtomicBool, Mutex, MutexGuard, Ordering, lock};

use super::medium::{Inbound, Outbound};
use super::socket::{poll, pollfd, with_frame_slices};

/// How a frame of a header alone, written whole by [`Link::write_header_whole`], ended.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum HeaderSent {
    /// Every byte is written.
    Whole,
    /// The socket took nothing now; nothing is written.
    NotStarted,
    /// The transport was aborted while the rest waited for room.
    Aborted,
    /// Only `written` bytes left within the time allowed: the link cannot carry anything else.
    Stalled { written: usize },
}

/// Size of each link's staging buffer: small frames arrive many to a `read`.
const STAGING: usize = 64 * 1024;

/// A raw destination address that crosses threads with the link state that uses it.
#[derive(Clone, Copy, Debug)]
pub(super) struct RawDest(pub(super) *mut u8);

// SAFETY: the pointer addresses the owned buffer of an arriving message, which lives in the
// matching state until every stripe of that message has been written (see `LinkRx::payload`);
// only the thread holding the link's reader role dereferences it, for the byte range of that
// link's stripe, which no other link writes.
unsafe impl Send for RawDest {}

/// The receiving thread's own posted receive, while it reads.
pub(super) struct OwnReceive<'a> {
    pub(super) id: PostId,
    pub(super) buf: Option<&'a mut [u8]>,
}

/// Frames of `what` travel on link 0 only, where they keep their place in the message order.
pub(super) fn on_link_zero(from: u32, k: usize, what: &str) -> Result<(), Lost> {
    if k == 0 {
        return Ok(());
    }
    Err(protocol_lost(CollectiveError::protocol(
        Some(from),
        format!("{what} on link {k} (only link 0 carries them)"),
    )))
}

#[derive(Clone, Copy, Debug)]
pub(super) enum Destination {
    Caller,
    Owned(RawDest),
    Discard,
}

#[derive(Debug)]
pub(super) struct Payload {
    pub(super) seq: u64,
    pub(super) land: Destination,
    /// Offset of the next byte inside the message.
    pub(super) at: u64,
    pub(super) remaining: u64,
}

/// Receive-side state of one link; only the holder of the link's reader role touches it.
#[derive(Debug)]
pub(super) struct LinkRx {
    pub(super) staging: Box<[u8]>,
    pub(super) start: usize,
    pub(super) end: usize,
    pub(super) header: Option<FrameHeader>,
    pub(super) payload: Option<Payload>,
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

    pub(super) fn staged(&self) -> usize {
        self.end - self.start
    }

    /// Reads more bytes of `link` into the staging buffer, keeping what is unread.
    pub(super) fn fill(&mut self, link: &Link) -> io::Result<usize> {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        } else if self.end == self.staging.len() {
            self.staging.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        link.read(&mut self.staging[self.end..])
            .inspect(|&n| self.end += n)
    }
}

/// One TCP connection to a peer, and the media its bytes travel by (`medium.rs`).
#[derive(Debug)]
pub(crate) struct Link {
    pub(super) stream: TcpStream,
    pub(super) rx: Mutex<LinkRx>,
    /// Bytes arrived since the heartbeat monitor last looked (any byte proves the peer alive).
    heard: AtomicBool,
    /// The medium this link reads from since the peer switched it off the socket (link 0 to a
    /// shared-memory lane). Set once, by the holder of the reader role, and read by every
    /// thread that polls the link. A `std` cell even under loom: a medium's contents may live
    /// in memory the peer process writes.
    switched_in: OnceLock<Box<dyn Inbound>>,
}

impl Link {
    pub(crate) fn new(stream: TcpStream) -> Self {
        Self {
            stream,
            rx: Mutex::new(LinkRx::new()),
            heard: AtomicBool::new(false),
            switched_in: OnceLock::new(),
        }
    }

    /// The medium the link reads from: the socket, or what the peer switched it to.
    fn inbound(&self) -> &dyn Inbound {
        match self.switched_in.get() {
            Some(medium) => medium.as_ref(),
            None => &self.stream,
        }
    }

    /// Reads what the link has into `buf`, noting for the heartbeat monitor that the peer was
    /// heard from. Every read of an established link goes through here.
    pub(super) fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.inbound().read(buf, &self.heard)
    }

    /// Writes as much as the socket takes now of one frame (see [`PeerIo::write_frame`]),
    /// whether or not link 0 switched to another medium: heartbeats and the switch itself go
    /// here.
    pub(super) fn send_frame(
        &self,
        header: &[u8; HEADER_LEN],
        parts: &[&[u8]],
        offset: u64,
        len: u64,
        sent: u64,
    ) -> io::Result<usize> {
        with_frame_slices(header, parts, offset, len, sent, |slices| {
            (&self.stream).write(slices)
        })
    }

    /// Writes `header`, a frame without payload, on the socket (also where link 0 switched to
    /// another medium): nothing when the socket takes nothing now, else all of it, waiting for room up to
    /// `limit` while watching `abort_fd`, and giving up once `aborted` says so. A writable
    /// socket takes a header whole in practice; should it take only part, the rest must follow
    /// before any other frame, or the link is unusable ([`HeaderSent::Stalled`]).
    pub(super) fn write_header_whole(
        &self,
        header: &[u8; HEADER_LEN],
        limit: Duration,
        abort_fd: RawFd,
        aborted: impl Fn() -> bool,
    ) -> io::Result<HeaderSent> {
        let mut written = 0;
        let started = Instant::now();
        loop {
            match self.send_frame(header, &[], 0, 0, written as u64) {
                Ok(n) => written += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
            if written == 0 {
                return Ok(HeaderSent::NotStarted);
            }
            if written == HEADER_LEN {
                return Ok(HeaderSent::Whole);
            }
            if started.elapsed() >= limit {
                return Ok(HeaderSent::Stalled { written });
            }
            let mut fds = [
                pollfd(self.fd(), libc::POLLOUT),
                pollfd(abort_fd, libc::POLLIN),
            ];
            poll(&mut fds, Duration::from_millis(10));
            if aborted() {
                return Ok(HeaderSent::Aborted);
            }
        }
    }

    /// Whether the peer switched the link off its socket.
    pub(super) fn switched(&self) -> bool {
        self.switched_in.get().is_some()
    }

    /// Reads from `medium` from now on (the peer's switch frame arrived).
    pub(super) fn switch_inbound(&self, medium: Box<dyn Inbound>) {
        let _ = self.switched_in.set(medium);
    }

    /// Prepares to block in `poll(2)` on this link (see [`Inbound::before_poll`]). Returns
    /// whether bytes are waiting already (then the caller must not block).
    pub(super) fn before_poll(&self) -> bool {
        self.inbound().before_poll()
    }

    /// Undoes [`Link::before_poll`] once the poll is over.
    pub(super) fn after_poll(&self) {
        self.inbound().after_poll();
    }

    /// Whether bytes arrived since the last call.
    pub(super) fn take_heard(&self) -> bool {
        self.heard.swap(false, Ordering::Relaxed)
    }

    pub(super) fn fd(&self) -> RawFd {
        self.stream.as_raw_fd()
    }

    pub(super) fn rx(&self) -> MutexGuard<'_, LinkRx> {
        lock(&self.rx)
    }
}

/// The sending side of one peer, under its send lock.
#[derive(Debug)]
pub(super) struct TxState {
    pub(super) next_seq: u64,
    /// The medium link 0 writes to since this rank switched it off the socket (to a
    /// shared-memory lane, `same_host/switch.rs`); `None` while it writes the socket.
    pub(super) switched_out: Option<Box<dyn Outbound>>,
}

impl TxState {
    /// Whether a writer waiting for room on the `pending` links (bit `k` for link `k`) must
    /// nap for link 0: its medium has no descriptor that reports room.
    pub(super) fn naps_for_room(&self, pending: u64) -> bool {
        pending & 1 != 0
            && self
                .switched_out
                .as_ref()
                .is_some_and(|m| !m.room_by_poll())
    }
}

/// Everything this rank holds for one peer.
#[derive(Debug)]
pub(crate) struct PeerIo {
    pub(super) links: Vec<Link>,
    pub(super) addr: String,
    pub(super) tx: Mutex<TxState>,
}

impl PeerIo {
    pub(crate) fn new(streams: Vec<TcpStream>, addr: Option<SocketAddr>) -> Self {
        let addr = addr.map_or_else(|| "an unknown address".to_owned(), |a| a.to_string());
        Self {
            links: streams.into_iter().map(Link::new).collect(),
            addr,
            tx: Mutex::new(TxState {
                next_seq: 0,
                switched_out: None,
            }),
        }
    }

    /// Writes as much as link `k` takes now of one frame (header, then bytes
    /// `offset..offset+len` of the concatenated `parts`), of which `sent` bytes are written
    /// already: into the medium link 0 switched to, if it did, else into the socket.
    #[allow(
        clippy::too_many_arguments,
        reason = "one frame's pieces, as `frame_slices` takes them"
    )]
    pub(super) fn write_frame(
        &self,
        tx: &mut TxState,
        k: usize,
        header: &[u8; HEADER_LEN],
        parts: &[&[u8]],
        offset: u64,
        len: u64,
        sent: u64,
    ) -> io::Result<usize> {
        let link = &self.links[k];
        match tx.switched_out.as_mut().filter(|_| k == 0) {
            Some(medium) => with_frame_slices(header, parts, offset, len, sent, |slices| {
                medium.write(slices)
            }),
            None => link.send_frame(header, parts, offset, len, sent),
        }
    }

    /// Adds to `fds` a wait for room on each of the `pending` links (bit `k` for link `k`).
    pub(super) fn push_writable(&self, pending: u64, fds: &mut Vec<libc::pollfd>) {
        for (k, link) in self.links.iter().enumerate() {
            if pending & (1 << k) != 0 {
                fds.push(pollfd(link.fd(), libc::POLLOUT));
            }
        }
    }

    pub(super) fn shutdown(&self) {
        for link in &self.links {
            let _ = link.stream.shutdown(Shutdown::Both);
        }
    }

    /// Closes the sending side of every link: the peer reads what was sent, then the end of
    /// the stream.
    pub(super) fn shutdown_write(&self) {
        for link in &self.links {
            let _ = link.stream.shutdown(Shutdown::Write);
        }
    }
}
