//! The sockets this rank holds for its peers ([`PeerIo`], [`Link`]) and each link's receive
//! state (staging buffer, frame being read), shared by the receive, send and watcher paths.

use std::io;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

use crate::frame::FrameHeader;
use crate::sync::{AtomicBool, Mutex, MutexGuard, Ordering, lock};

use super::bounce::Bounce;
use super::socket::read_some;

/// Size of each link's staging buffer: small frames arrive many to a `read`.
const STAGING: usize = 64 * 1024;

/// Tuning shared by every link of a transport.
#[derive(Clone, Copy, Debug)]
pub(crate) struct EngineConfig {
    pub(crate) max_frame: u64,
    pub(crate) max_unexpected: u64,
    pub(crate) min_striped: u64,
    pub(crate) op_timeout: Duration,
    pub(crate) spin: Duration,
    /// Heartbeat interval of every link (zero: no heartbeats, no silence detection); see
    /// `heartbeat.rs`.
    pub(crate) heartbeat: Duration,
    /// The smallest message sent to a rank of this host by the single-copy path
    /// (`single_copy.rs`); `u64::MAX` turns the path off.
    pub(crate) min_single_copy: u64,
    /// The largest head of a pulled message bounced through shared memory (`bounce.rs`); 0
    /// bounces nothing.
    pub(crate) max_bounced: u64,
}

/// A raw destination address that crosses threads with the link state that uses it.
#[derive(Clone, Copy, Debug)]
pub(super) struct RawDest(pub(super) *mut u8);

// SAFETY: the pointer addresses the owned buffer of an arriving message, which lives in the
// matching state until every stripe of that message has been written (see `LinkRx::payload`);
// only the thread holding the link's reader role dereferences it, for the byte range of that
// link's stripe, which no other link writes.
unsafe impl Send for RawDest {}

#[derive(Clone, Copy, Debug)]
pub(super) enum Land {
    Caller,
    Owned(RawDest),
    Discard,
}

#[derive(Debug)]
pub(super) struct Payload {
    pub(super) seq: u64,
    pub(super) land: Land,
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

/// One TCP connection to a peer.
#[derive(Debug)]
pub(crate) struct Link {
    pub(super) stream: TcpStream,
    pub(super) rx: Mutex<LinkRx>,
    /// Bytes arrived since the heartbeat monitor last looked (any byte proves the peer alive).
    heard: AtomicBool,
}

impl Link {
    pub(crate) fn new(stream: TcpStream) -> Self {
        Self {
            stream,
            rx: Mutex::new(LinkRx::new()),
            heard: AtomicBool::new(false),
        }
    }

    /// Reads what the socket has into `buf`, noting for the heartbeat monitor that the peer
    /// was heard from. Every read of an established link goes through here.
    pub(super) fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        let n = read_some(&self.stream, buf)?;
        if n > 0 {
            self.heard.store(true, Ordering::Relaxed);
        }
        Ok(n)
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

#[derive(Debug)]
pub(super) struct TxState {
    pub(super) next_seq: u64,
    /// The bounce file of messages to this peer (`bounce.rs`), made at the first one.
    pub(super) bounce: Option<Bounce>,
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
                bounce: None,
            }),
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
