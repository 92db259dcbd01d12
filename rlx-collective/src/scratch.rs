//! Segment buffers that reducing operations keep from one call to the next on the same thread.
//!
//! The segmented algorithms that fold what they receive into partials (the ring
//! reduce-scatter, and so the ring all-reduce; the binomial reduce) need two segment-sized
//! buffers per call. Allocating them afresh on every call cost a fault on every page they
//! touch: buffers of this size sit above the allocator's threshold for returning memory to the
//! kernel, so each call got new zeroed pages. The bytes a buffer holds when taken are stale;
//! every user overwrites what it reads.

use std::cell::RefCell;

use rlx_transport::MAX_SEGMENT_HINT;

/// Largest scratch buffer (bytes) a thread keeps between calls: a segment of the largest size
/// the collectives cut (a transport's hint up to [`MAX_SEGMENT_HINT`], 4 MiB, which TCP gives
/// among ranks of one host) widened to twice its size (4 MiB of f16 is 8 MiB of f32). The larger
/// ones that i8 and u8 widen into (8 bytes per element) are freed after the call rather than
/// held by every thread that ever reduced. With a limit below the hinted segments, their buffers
/// were freed after every call, and a 4-rank all-reduce of 32 MiB spent about 15% of its CPU time
/// faulting in and zeroing fresh pages.
const KEEP_LIMIT: usize = 2 * MAX_SEGMENT_HINT;

thread_local! {
    /// The scratch buffers the last reducing operation on this thread left behind.
    static SCRATCH: RefCell<Scratch> = const { RefCell::new(Scratch::new()) };
}

/// The two segment buffers of one reducing operation: what it sends, and where what it
/// receives lands.
///
/// In a profile of 512 KiB f32 all-reduces between two processes, the faults
/// and the zeroing took about 12% of the CPU time; keeping the buffers removes both.
pub(crate) struct Scratch {
    pub(crate) send: Vec<u8>,
    pub(crate) recv: Vec<u8>,
}

impl Scratch {
    const fn new() -> Self {
        Scratch {
            send: Vec::new(),
            recv: Vec::new(),
        }
    }

    /// This thread's buffers, at least `send_len` and `recv_len` bytes long (their contents
    /// are stale).
    pub(crate) fn take(send_len: usize, recv_len: usize) -> Scratch {
        let mut scratch =
            SCRATCH.with(|cell| std::mem::replace(&mut *cell.borrow_mut(), Scratch::new()));
        for (buf, len) in [(&mut scratch.send, send_len), (&mut scratch.recv, recv_len)] {
            if buf.len() < len {
                buf.resize(len, 0);
            }
        }
        scratch
    }

    /// Hands the buffers back for the next call on this thread, unless they are too big to keep.
    pub(crate) fn give_back(self) {
        if self.send.len().max(self.recv.len()) <= KEEP_LIMIT {
            SCRATCH.with(|cell| *cell.borrow_mut() = self);
        }
    }
}
