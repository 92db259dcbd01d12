//! Shared-memory lanes: link 0's byte stream to a rank of this host carried by a ring in a
//! shared-memory file instead of the loopback TCP connection.
//!
//! A small message over loopback TCP costs a `send` and a `recv` system call and the kernel's
//! TCP work in between, a few microseconds each way; a byte ring in memory both processes map
//! costs two memory copies. The lane changes nothing above the byte stream: the frames, their
//! order, the matching and the single-copy descriptors are those of TCP, so every rule of the
//! engine holds on a lane as it does on a socket.
//!
//! The protocol:
//! 1. Each rank willing to be read by the single-copy path makes one lane file per peer on this
//!    host (a `memfd` sealed against shrinking, as in `bounce.rs`) and names it (its descriptor
//!    number and a random id written in it) in its offer (`single_copy.rs`).
//! 2. The peer, once it proved the offer's process, opens the file through `/proc`, checks the
//!    seal, the size and the id, maps it and writes 1 into the file's `accepted` word.
//! 3. The sender, at its next send to that peer, writes a [`FrameKind::Lane`] frame on the TCP
//!    link and from then on writes everything of link 0 into the ring. The receiver reads TCP up
//!    to that frame, then reads the ring. A peer that did not map the file never sees the frame,
//!    and both stay on TCP.
//! 4. After the switch the TCP connection still carries heartbeats and one-byte wake-ups, which
//!    the receiver only notes as signs of life, and its end when the peer process dies or
//!    closes: a reader whose ring is empty reads the socket too, so a lost peer is noticed as
//!    before.
//!
//! The ring: the sender alone writes `head` (bytes ever written) and the data, the receiver
//! alone writes `tail` (bytes ever read), `sleeping` and `accepted`. Each side checks what the
//! other wrote (`head - tail` never above the ring's size), so a peer that scribbles on the file
//! is lost, never followed out of the mapping. A thread about to block in `poll(2)` on the link
//! sets `sleeping` and looks at the ring once more; a sender that wrote into the ring looks at
//! `sleeping` after its write (a full fence on both sides between the store and the load) and,
//! when it is set, writes one byte on the TCP connection to wake the poller. A sender whose ring
//! is full waits in naps of its own: nothing wakes it when the receiver drains the ring.
//!
//! [`FrameKind::Lane`]: crate::frame::FrameKind::Lane

use std::io::{self, IoSlice};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering, fence};

use super::sys::shared_memory::{self, SharedMap};
use crate::progress::medium::{Inbound, Outbound};
use crate::progress::socket::{read_some, send_vectored};
use crate::sync::{AtomicBool, Ordering as SyncOrdering};

/// Bytes before the ring: the words, each on a cache line of its own, and padding up to a page,
/// so that the data starts page-aligned.
const HEADER: usize = 4096;

/// Where each word lies in the file.
const HEAD_AT: usize = 0;
const ID_AT: usize = 8;
const TAIL_AT: usize = 128;
const SLEEPING_AT: usize = 256;
const ACCEPTED_AT: usize = 384;

/// Default ring size per peer (`RLX_LANE_BYTES`): about the largest message that does not go by
/// pull, so that a sender rarely waits for its peer to read. 64 KiB and 1 MiB rings measured no
/// faster, and every ring's pages stay resident in both processes once it has wrapped.
pub(crate) const DEFAULT_LANE_BYTES: u64 = 256 << 10;

/// The largest ring a receiver maps: a peer cannot make it reserve more address space.
const LARGEST_RING: usize = 64 << 20;

/// The word at byte `at` of a lane mapping.
fn word(map: &SharedMap, at: usize) -> &AtomicU64 {
    debug_assert!(at + 8 <= HEADER && at % 8 == 0);
    // SAFETY: every lane mapping is at least `HEADER` bytes and page-aligned, so the eight
    // bytes at an offset below `HEADER` that is a multiple of eight are an aligned `u64` that
    // lives as long as the mapping; both processes only ever access them atomically.
    unsafe { &*map.ptr().add(at).cast::<AtomicU64>() }
}

/// The sending end of a lane, kept under the peer's send lock.
#[derive(Debug)]
pub(crate) struct LaneOut {
    fd: OwnedFd,
    map: SharedMap,
    id: u64,
    ring: u64,
    /// Bytes ever written; `head` holds the same.
    head: u64,
}

impl LaneOut {
    /// A lane file with a ring of `ring` bytes; `None` when the system refuses (the link stays
    /// on TCP).
    pub(in crate::progress) fn create(ring: u64) -> Option<Self> {
        let ring_len = usize::try_from(ring).ok()?.min(LARGEST_RING);
        let made = shared_memory::create(HEADER + ring_len)
            .and_then(|fd| shared_memory::map(&fd, HEADER + ring_len).map(|map| (fd, map)));
        let (fd, map) = match made {
            Ok(made) => made,
            Err(e) => {
                tracing::debug!(error = %e, "no shared-memory lane; the link stays on TCP");
                return None;
            }
        };
        let mut id = [0u8; 8];
        // Without randomness the id is the address of the mapping, which still tells a stale
        // descriptor number from this file in practice.
        let id = match getrandom::fill(&mut id) {
            Ok(()) => u64::from_ne_bytes(id) | 1,
            Err(_) => map.ptr() as usize as u64 | 1,
        };
        word(&map, ID_AT).store(id, Ordering::SeqCst);
        Some(Self {
            fd,
            map,
            id,
            ring: ring_len as u64,
            head: 0,
        })
    }

    /// The file's descriptor number and id, for the offer.
    pub(in crate::progress) fn name(&self) -> (u64, u64) {
        (self.fd.as_raw_fd() as u64, self.id)
    }

    /// Whether the peer mapped the ring and accepts frames through it.
    pub(in crate::progress) fn accepted(&self) -> bool {
        word(&self.map, ACCEPTED_AT).load(Ordering::Acquire) == 1
    }

    /// Copies as much of `slices` as fits into the ring. Returns the bytes written and whether
    /// the reader sleeps and must be woken; `WouldBlock` when the ring is full.
    fn write(&mut self, slices: &[IoSlice<'_>]) -> io::Result<(usize, bool)> {
        let tail = word(&self.map, TAIL_AT).load(Ordering::Acquire);
        let used = self.head.wrapping_sub(tail);
        if used > self.ring {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "the shared-memory lane's read position {tail} is not within {} bytes behind \
                     its write position {}",
                    self.ring, self.head
                ),
            ));
        }
        let mut room = self.ring - used;
        if room == 0 {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let mut written = 0usize;
        for slice in slices {
            if room == 0 {
                break;
            }
            let n = (slice.len() as u64).min(room) as usize;
            self.copy_in(self.head + written as u64, &slice[..n]);
            written += n;
            room -= n as u64;
        }
        self.head += written as u64;
        word(&self.map, HEAD_AT).store(self.head, Ordering::Release);
        // Pairs with the fence in `LaneIn::sleep`: either the reader sees the new head, or this
        // side sees it sleeping.
        fence(Ordering::SeqCst);
        let sleeping = word(&self.map, SLEEPING_AT).load(Ordering::Relaxed) != 0;
        Ok((written, sleeping))
    }

    /// Copies `bytes` into the ring at stream position `at`, wrapping at its end.
    fn copy_in(&self, at: u64, bytes: &[u8]) {
        let start = (at % self.ring) as usize;
        let first = bytes.len().min(self.ring as usize - start);
        // SAFETY: the ring is the `self.ring` bytes after `HEADER` in the mapping; `start +
        // first` and `bytes.len() - first` stay within it. The range written lies in the free
        // part of the ring, which the reader does not read until `head` says so.
        unsafe {
            let ring = self.map.ptr().add(HEADER);
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), ring.add(start), first);
            std::ptr::copy_nonoverlapping(bytes[first..].as_ptr(), ring, bytes.len() - first);
        }
    }
}

/// The receiving end of a lane: this rank's mapping of the peer's lane file. Only the holder of
/// link 0's reader role reads through it.
#[derive(Debug)]
pub(crate) struct LaneIn {
    map: SharedMap,
    ring: u64,
}

// SAFETY: through a shared reference the mapping is touched only by atomic operations on its
// words and by raw copies out of the ring in `read`, which only the holder of link 0's reader
// role calls (the role is held by one thread at a time, under the matching state's lock), so
// no two threads of this process ever copy the same bytes at once.
unsafe impl Sync for LaneIn {}

impl LaneIn {
    /// Opens descriptor `fd` of process `pid`, checks that it is a lane file with id `id` that
    /// cannot shrink, maps it and accepts it.
    pub(in crate::progress) fn open(pid: u32, fd: u64, id: u64) -> io::Result<Self> {
        let (file, len) = shared_memory::open_peer_file(pid, fd)?;
        if len <= HEADER || len > HEADER + LARGEST_RING {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a lane file of {len} bytes"),
            ));
        }
        let map = shared_memory::map(&file, len)?;
        if word(&map, ID_AT).load(Ordering::SeqCst) != id {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the lane file's id is not the one offered",
            ));
        }
        let lane = Self {
            map,
            ring: (len - HEADER) as u64,
        };
        word(&lane.map, ACCEPTED_AT).store(1, Ordering::Release);
        Ok(lane)
    }

    /// Copies what the ring holds into `buf`, up to its length; 0 when the ring is empty.
    fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        let tail = word(&self.map, TAIL_AT).load(Ordering::Relaxed);
        let head = word(&self.map, HEAD_AT).load(Ordering::Acquire);
        let ready = head.wrapping_sub(tail);
        if ready > self.ring {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "the shared-memory lane's write position {head} is not within {} bytes ahead \
                     of its read position {tail}",
                    self.ring
                ),
            ));
        }
        let n = (ready.min(buf.len() as u64)) as usize;
        if n == 0 {
            return Ok(0);
        }
        let start = (tail % self.ring) as usize;
        let first = n.min(self.ring as usize - start);
        // SAFETY: as in `LaneOut::copy_in`: both ranges lie in the ring, in its filled part,
        // which the writer does not touch until `tail` moves past it.
        unsafe {
            let ring = self.map.ptr().add(HEADER);
            std::ptr::copy_nonoverlapping(ring.add(start), buf.as_mut_ptr(), first);
            std::ptr::copy_nonoverlapping(ring, buf.as_mut_ptr().add(first), n - first);
        }
        word(&self.map, TAIL_AT).store(tail + n as u64, Ordering::Release);
        Ok(n)
    }

    /// Says that the reader is about to block in `poll(2)`; returns whether the ring holds bytes
    /// already (then it must not block).
    fn sleep(&self) -> bool {
        word(&self.map, SLEEPING_AT).store(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        let head = word(&self.map, HEAD_AT).load(Ordering::SeqCst);
        head != word(&self.map, TAIL_AT).load(Ordering::Relaxed)
    }

    /// Says that the reader is awake again: senders need not wake it.
    fn wake(&self) {
        word(&self.map, SLEEPING_AT).store(0, Ordering::Relaxed);
    }
}

/// Link 0's outbound medium once this rank switched it to the lane: the ring, and a handle to
/// the link's socket to wake a reader that sleeps in `poll(2)` on it.
#[derive(Debug)]
pub(in crate::progress) struct LaneWriter {
    ring: LaneOut,
    socket: TcpStream,
}

impl LaneWriter {
    /// Writes link 0's bytes into `ring` from now on, waking its reader through `socket` (a
    /// second handle to the link's socket).
    pub(in crate::progress) fn new(ring: LaneOut, socket: TcpStream) -> Self {
        Self { ring, socket }
    }
}

impl Outbound for LaneWriter {
    fn write(&mut self, slices: &[IoSlice<'_>]) -> io::Result<usize> {
        let (written, sleeping) = self.ring.write(slices)?;
        if sleeping {
            // A full socket is readable already, which wakes the poller as well.
            let _ = send_vectored(&self.socket, &[IoSlice::new(&[0])]);
        }
        Ok(written)
    }

    fn room_by_poll(&self) -> bool {
        false
    }
}

/// Link 0's inbound medium once the peer switched it to its lane: the ring, and a handle to the
/// link's socket, which past the switch carries only wake-ups and heartbeats (signs of life)
/// and the end of the stream.
#[derive(Debug)]
pub(in crate::progress) struct LaneReader {
    ring: LaneIn,
    socket: TcpStream,
}

impl LaneReader {
    /// Reads link 0's bytes from `ring` from now on, and `socket` (a second handle to the
    /// link's socket) for the rest.
    pub(in crate::progress) fn new(ring: LaneIn, socket: TcpStream) -> Self {
        Self { ring, socket }
    }

    /// Reads away what the socket holds, noting in `heard` that the peer is alive. Returns
    /// whether the stream ended.
    fn drain_socket(&self, heard: &AtomicBool) -> io::Result<bool> {
        let mut sink = [0u8; 256];
        loop {
            match read_some(&self.socket, &mut sink) {
                Ok(0) => return Ok(true),
                Ok(_) => heard.store(true, SyncOrdering::Relaxed),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) => return Err(e),
            }
        }
    }
}

impl Inbound for LaneReader {
    /// The ring first; once it is empty the socket too, for its signs of life and its end.
    fn read(&self, buf: &mut [u8], heard: &AtomicBool) -> io::Result<usize> {
        let mut n = self.ring.read(buf)?;
        if n == 0 {
            let ended = self.drain_socket(heard);
            // What the peer wrote before its last wake-up, its end or a reset (a peer that
            // exits with wake-ups unread resets the connection) may have arrived after the
            // first look.
            n = self.ring.read(buf)?;
            if n == 0 {
                return match ended? {
                    true => Ok(0),
                    false => Err(io::ErrorKind::WouldBlock.into()),
                };
            }
        }
        heard.store(true, SyncOrdering::Relaxed);
        Ok(n)
    }

    /// Says that the reader sleeps, so that the peer wakes it through the socket.
    fn before_poll(&self) -> bool {
        self.ring.sleep()
    }

    fn after_poll(&self) {
        self.ring.wake();
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    fn lane(ring: u64) -> (LaneOut, LaneIn) {
        let out = LaneOut::create(ring).unwrap();
        let (fd, id) = out.name();
        let lane_in = LaneIn::open(std::process::id(), fd, id).unwrap();
        (out, lane_in)
    }

    #[test]
    fn bytes_wrap_around_the_ring_in_order() {
        let (mut out, lane_in) = lane(1000);
        assert!(out.accepted());
        let mut sent = Vec::new();
        let mut got = Vec::new();
        let mut next = 0u8;
        for round in 0..50 {
            let chunk: Vec<u8> = (0..(round * 37 % 700 + 1))
                .map(|_| {
                    next = next.wrapping_add(7);
                    next
                })
                .collect();
            let (a, b) = chunk.split_at(chunk.len() / 2);
            let n = match out.write(&[IoSlice::new(a), IoSlice::new(b)]) {
                Ok((n, sleeping)) => {
                    assert!(!sleeping);
                    n
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
                Err(e) => panic!("{e}"),
            };
            sent.extend_from_slice(&chunk[..n]);
            let mut buf = vec![0u8; 333];
            loop {
                let k = lane_in.read(&mut buf).unwrap();
                if k == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..k]);
            }
        }
        assert!(sent.len() > 10_000);
        assert_eq!(got, sent);
    }

    #[test]
    fn a_full_ring_blocks_and_a_sleeping_reader_is_reported() {
        let (mut out, lane_in) = lane(64);
        assert!(!lane_in.sleep(), "an empty ring has nothing to read");
        let (n, sleeping) = out.write(&[IoSlice::new(&[1u8; 100])]).unwrap();
        assert_eq!((n, sleeping), (64, true));
        assert_eq!(
            out.write(&[IoSlice::new(&[1u8])]).unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
        assert!(lane_in.sleep(), "a full ring has bytes to read");
        lane_in.wake();
        let mut buf = [0u8; 10];
        assert_eq!(lane_in.read(&mut buf).unwrap(), 10);
        assert_eq!(out.write(&[IoSlice::new(&[2u8; 20])]).unwrap(), (10, false));
    }

    #[test]
    fn a_scribbled_ring_is_refused_by_both_ends() {
        let (mut out, lane_in) = lane(64);
        word(&lane_in.map, HEAD_AT).store(1000, Ordering::SeqCst);
        let err = lane_in.read(&mut [0u8; 8]).unwrap_err();
        assert!(err.to_string().contains("write position 1000"), "{err}");
        word(&lane_in.map, TAIL_AT).store(500, Ordering::SeqCst);
        let err = out.write(&[IoSlice::new(&[0u8; 8])]).unwrap_err();
        assert!(err.to_string().contains("read position 500"), "{err}");
        let (fd, _) = out.name();
        assert!(
            LaneIn::open(std::process::id(), fd, 12345).is_err(),
            "a wrong id"
        );
    }
}
