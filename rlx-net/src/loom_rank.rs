//! One rank whose sockets are replaced by loom-visible fakes, for the loom models in
//! `tests/loom_progress.rs` (compiled only under `cfg(rlx_loom)`).
//!
//! Receives run the engine's own receive loop ([`Hub::recv`]: post, wait as a follower or take
//! the reader role, give up at the deadline, release, wake) and its own loss and abort paths;
//! only what [`Links`] and [`Drive`] abstract is faked here. Each peer's connection is a
//! [`Wire`]: a queue of whole frames that a loom thread playing the peer fills, read by
//! whichever receiver holds the reader role, which lands each frame through the matching state
//! exactly as the socket reader does. Loom's condition variable never times out, so time is a
//! counter that a test moves forward with [`LoomRank::advance`], racing the other events;
//! moving it wakes every sleeper, as the expiry of a timed wait would.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use rlx_transport::{CollectiveError, Tag};

use crate::error::{Lost, protocol_lost};
use crate::frame::{FrameHeader, FrameKind};
use crate::matching::{Holder, Landing, Outcome, PostId, Withdrawn};
use crate::progress::{Drive, DriveEnd, Hub, Links};
use crate::sync::{AtomicUsize, Condvar, Mutex, Ordering, lock};

/// A peer's connection as the reading side sees it.
#[derive(Debug, Default)]
struct WireState {
    /// Frames sent and not read yet: sequence number, tag, payload.
    frames: VecDeque<(u64, Tag, Vec<u8>)>,
    /// The peer hung up after its last frame (the reader sees it once the frames are read).
    hung_up: bool,
    /// This side shut the connection down: reads fail at once.
    shut: bool,
}

#[derive(Debug, Default)]
struct Wire {
    state: Mutex<WireState>,
    readable: Condvar,
}

impl Wire {
    fn change(&self, f: impl FnOnce(&mut WireState)) {
        f(&mut lock(&self.state));
        self.readable.notify_all();
    }
}

/// A rank of the loom models; see the module docs.
#[derive(Debug)]
pub struct LoomRank {
    hub: Hub,
    wires: Vec<Wire>,
    start: Instant,
    /// Milliseconds the modelled clock has moved past `start`.
    elapsed_ms: AtomicUsize,
}

fn owned(from: u32, outcome: Outcome) -> Result<Vec<u8>, CollectiveError> {
    match outcome {
        Outcome::Owned(bytes) => Ok(bytes),
        Outcome::Landed(n) => Err(CollectiveError::protocol(
            Some(from),
            format!("{n} bytes landed in a buffer that was not given"),
        )),
        Outcome::Failure(f) => Err(f.into_error(from)),
        Outcome::TooLong { capacity, got } => Err(CollectiveError::LengthMismatch {
            op: "recv",
            peer: Some(from),
            expected: capacity as u64,
            got,
            dtype: None,
            lengths: Vec::new(),
        }),
    }
}

impl LoomRank {
    /// Rank 0 of a world of `world`, one link per peer, an unexpected budget of `budget` bytes.
    pub fn new(world: u32, budget: u64) -> Self {
        Self {
            hub: Hub::new(0, world, 1, budget, u64::MAX),
            wires: (0..world).map(|_| Wire::default()).collect(),
            start: Instant::now(),
            elapsed_ms: AtomicUsize::new(0),
        }
    }

    /// Receives the next message from `from` under `tag` into a new buffer, waiting at most
    /// `timeout` of the modelled clock; `Ok(None)` at the deadline.
    pub fn recv(
        &self,
        from: u32,
        tag: Tag,
        timeout: Duration,
    ) -> Result<Option<Vec<u8>>, CollectiveError> {
        self.hub
            .recv(self, from, tag, None, timeout)?
            .map(|o| owned(from, o))
            .transpose()
    }

    /// Like [`LoomRank::recv`], but lands the message in `buf`; returns its length.
    pub fn recv_into(
        &self,
        from: u32,
        tag: Tag,
        buf: &mut [u8],
        timeout: Duration,
    ) -> Result<Option<usize>, CollectiveError> {
        match self.hub.recv(self, from, tag, Some(buf), timeout)? {
            None => Ok(None),
            Some(Outcome::Landed(n)) => Ok(Some(n)),
            Some(Outcome::Owned(bytes)) => Ok(Some(bytes.len())),
            Some(other) => owned(from, other).map(|b| Some(b.len())),
        }
    }

    /// The peer `from` sends message `seq` (`payload` under `tag`) on its link.
    pub fn send_from(&self, from: u32, seq: u64, tag: Tag, payload: &[u8]) {
        self.wires[from as usize].change(|w| w.frames.push_back((seq, tag, payload.to_vec())));
    }

    /// The peer `from` hangs up after the frames it sent.
    pub fn hang_up(&self, from: u32) {
        self.wires[from as usize].change(|w| w.hung_up = true);
    }

    /// The background watcher finds the peer `from` gone (its frames not read yet are lost).
    pub fn lose(&self, from: u32) {
        self.hub
            .lose(self, from, Lost::Gone("modelled loss".to_owned()));
    }

    /// `Transport::abort`: as the engine does, record it, shut every connection down, wake.
    pub fn abort(&self) {
        if self.hub.abort() {
            for peer in 0..self.wires.len() as u32 {
                self.shut_down(peer);
            }
            self.hub.wake();
        }
    }

    /// Moves the modelled clock forward by `by`. The move is made under the state lock and
    /// then announced to every sleeper, as the expiry of a timed wait wakes its sleeper.
    pub fn advance(&self, by: Duration) {
        {
            let _st = lock(&self.hub.state);
            self.elapsed_ms
                .fetch_add(by.as_millis() as usize, Ordering::SeqCst);
        }
        self.hub.wake();
        for wire in &self.wires {
            wire.change(|_| {});
        }
    }

    /// The background watcher takes the reader role of the link to `from`, as it does with a
    /// link no caller touched for a while.
    pub fn watcher_takes(&self, from: u32) {
        lock(&self.hub.state).peers[from as usize].links[0].holder = Holder::Background;
    }

    /// The background watcher gives the link to `from` back, as at the end of its round: free,
    /// no longer wanted, and everyone woken.
    pub fn watcher_releases(&self, from: u32) {
        {
            let mut st = lock(&self.hub.state);
            let slot = &mut st.peers[from as usize].links[0];
            slot.holder = Holder::Free;
            slot.wanted = false;
        }
        self.hub.wake();
    }

    /// A catch-up's sweep ([`Hub::take_for_sweep`]) waiting until `until` past the start of
    /// the modelled clock at most: returns the peers whose link it took, and gives them back.
    pub fn sweep(&self, until: Duration) -> Vec<u32> {
        let taken = self.hub.take_for_sweep(self, self.start + until);
        for &(peer, _) in &taken {
            self.hub.release_links(self, peer);
        }
        taken.into_iter().map(|(peer, _)| peer).collect()
    }

    /// Unexpected bytes buffered for `from`.
    pub fn unexpected(&self, from: u32) -> u64 {
        lock(&self.hub.state).unexpected_bytes_of(from)
    }

    /// Lands one frame read by the holder of the reader role, as the socket reader does;
    /// `None` when the caller should read on.
    fn land(
        &self,
        from: u32,
        id: PostId,
        buf: &mut Option<&mut [u8]>,
        (seq, tag, payload): (u64, Tag, Vec<u8>),
    ) -> Result<Option<DriveEnd>, (u64, Tag, Vec<u8>)> {
        let header = FrameHeader::whole(FrameKind::Data, tag, seq, payload.len() as u64);
        let mut st = lock(&self.hub.state);
        let landing = match st.on_first_frame(from, &header, Some(id)) {
            Ok(landing) => landing,
            Err(e) => return Ok(Some(DriveEnd::Lost(protocol_lost(e)))),
        };
        match landing {
            Landing::Park => {
                st.peers[from as usize].links[0].parked = true;
                return Err((seq, tag, payload));
            }
            Landing::Caller => match buf.as_deref_mut() {
                Some(b) => b[..payload.len()].copy_from_slice(&payload),
                None => {
                    return Ok(Some(DriveEnd::Lost(Lost::Protocol(
                        "landed in a buffer that is not present".to_owned(),
                    ))));
                }
            },
            Landing::Owned(ptr) => {
                // SAFETY: as in the engine: the buffer lives in the matching state until the
                // message completes, and only this thread, holding the link, writes it.
                unsafe { std::ptr::copy_nonoverlapping(payload.as_ptr(), ptr, payload.len()) };
            }
            Landing::Discard => {}
        }
        st.peers[from as usize].links[0].parked = false;
        let completed = if payload.is_empty() {
            true
        } else {
            match st.on_bytes(from, seq, payload.len() as u64) {
                Ok(c) => c,
                Err(e) => return Ok(Some(DriveEnd::Lost(protocol_lost(e)))),
            }
        };
        let done = st.is_done(from, id);
        drop(st);
        if completed && !done {
            self.hub.wake();
        }
        Ok(done.then_some(DriveEnd::OwnDone))
    }
}

impl Links for LoomRank {
    fn now(&self) -> Instant {
        self.start + Duration::from_millis(self.elapsed_ms.load(Ordering::SeqCst) as u64)
    }

    fn kick_watcher(&self) {}

    fn shut_down(&self, peer: u32) {
        if let Some(wire) = self.wires.get(peer as usize) {
            wire.change(|w| w.shut = true);
        }
    }
}

impl Drive for LoomRank {
    fn drive(
        &self,
        hub: &Hub,
        from: u32,
        id: PostId,
        buf: &mut Option<&mut [u8]>,
        deadline: Option<Instant>,
    ) -> DriveEnd {
        let wire = &self.wires[from as usize];
        let mut w = lock(&wire.state);
        loop {
            if w.shut {
                return DriveEnd::Lost(Lost::Gone("connection shut down".to_owned()));
            }
            if let Some(frame) = w.frames.pop_front() {
                drop(w);
                match self.land(from, id, buf, frame) {
                    Ok(Some(end)) => return end,
                    Ok(None) => {}
                    Err(parked) => {
                        lock(&wire.state).frames.push_front(parked);
                        return DriveEnd::Stalled;
                    }
                }
                w = lock(&wire.state);
                continue;
            }
            if w.hung_up {
                return DriveEnd::Lost(Lost::Gone("the peer hung up".to_owned()));
            }
            if hub.is_aborted() {
                return DriveEnd::Aborted;
            }
            if deadline.is_some_and(|d| self.now() >= d) {
                drop(w);
                let withdrawn = lock(&hub.state).withdraw(from, id, buf.as_deref());
                return DriveEnd::Deadline(match withdrawn {
                    Withdrawn::Finished(outcome) => Some(outcome),
                    Withdrawn::Gone | Withdrawn::Moved { .. } => None,
                });
            }
            w = match wire.readable.wait(w) {
                Ok(g) => g,
                Err(p) => p.into_inner(),
            };
        }
    }
}
