//! A socket-free harness around the matching state for the loom models in
//! `tests/loom_progress.rs` (compiled only under `cfg(rlx_loom)`).
//!
//! It performs exactly the state transitions the progress engine performs: a receiver posts,
//! waits or gives up at its deadline; a reader thread (modelling the peer's socket) takes the
//! link's reader role, lands a frame and completes it; a peer is lost; the transport aborts.
//! Loom's condition variable never times out, so a deadline is modelled as an explicit
//! [`Model::give_up`] racing with the other events.

use rlx_transport::{CollectiveError, Tag};

use crate::error::Lost;
use crate::frame::{FrameHeader, FrameKind};
use crate::matching::{Begin, Holder, Landing, Outcome, State, Withdrawn};
use crate::sync::{Condvar, Mutex, lock};

/// A receive as [`Model::post`] started it.
#[derive(Debug)]
pub enum Posted {
    /// A queued message was there already.
    Ready(Vec<u8>),
    /// Posted under this id.
    Waiting(u64),
}

/// The matching state of one rank, with its condition variable.
#[derive(Debug)]
pub struct Model {
    state: Mutex<State>,
    changed: Condvar,
}

fn bytes(from: u32, outcome: Outcome) -> Result<Vec<u8>, CollectiveError> {
    match outcome {
        Outcome::Owned(b) => Ok(b),
        Outcome::Landed(n) => Ok(vec![0; n]),
        Outcome::Failure(f) => Err(f.into_error(from)),
        Outcome::TooLong { capacity, got } => Err(CollectiveError::LengthMismatch {
            expected: capacity as u64,
            got,
        }),
    }
}

impl Model {
    /// A rank with `world` peers of one link each and an unexpected budget of `budget` bytes.
    pub fn new(world: u32, budget: u64) -> Self {
        Self {
            state: Mutex::new(State::new(world, 1, budget, u64::MAX)),
            changed: Condvar::new(),
        }
    }

    /// Starts a receive from `from` under `tag`.
    pub fn post(&self, from: u32, tag: Tag) -> Result<Posted, CollectiveError> {
        let begun = lock(&self.state).begin_recv(from, tag, None)?;
        self.changed.notify_all();
        match begun {
            Begin::Ready(outcome) => bytes(from, outcome).map(Posted::Ready),
            Begin::Posted(id) => Ok(Posted::Waiting(id)),
        }
    }

    /// Blocks as a follower until the posted receive `id` finishes.
    pub fn wait(&self, from: u32, id: u64) -> Result<Vec<u8>, CollectiveError> {
        let mut st = lock(&self.state);
        loop {
            if let Some(result) = st.poll_post(from, id) {
                return result.and_then(|o| bytes(from, o));
            }
            st = match self.changed.wait(st) {
                Ok(g) => g,
                Err(p) => p.into_inner(),
            };
        }
    }

    /// The receive's deadline passed: withdraws it; returns the message if it finished first.
    pub fn give_up(&self, from: u32, id: u64) -> Option<Result<Vec<u8>, CollectiveError>> {
        let withdrawn = lock(&self.state).withdraw(from, id, None);
        self.changed.notify_all();
        match withdrawn {
            Withdrawn::Finished(outcome) => Some(bytes(from, outcome)),
            Withdrawn::Gone | Withdrawn::Moved { .. } => None,
        }
    }

    /// A receive with a zero deadline: the queued message, or nothing.
    pub fn poll(&self, from: u32, tag: Tag) -> Result<Option<Vec<u8>>, CollectiveError> {
        match self.post(from, tag)? {
            Posted::Ready(b) => Ok(Some(b)),
            Posted::Waiting(id) => self.give_up(from, id).transpose(),
        }
    }

    /// The reader of `from`'s link reads message `seq` (`payload` under `tag`): it takes the
    /// link's reader role, lands the payload outside the lock and completes the message.
    /// Returns `false` when the frame is parked (budget exhausted).
    pub fn arrive(
        &self,
        from: u32,
        seq: u64,
        tag: Tag,
        payload: &[u8],
    ) -> Result<bool, CollectiveError> {
        self.arrival(from, seq, tag, payload, false)
    }

    /// Like [`Model::arrive`], but waits while the frame is parked, as a reader does until a
    /// receive frees budget.
    pub fn arrive_blocking(
        &self,
        from: u32,
        seq: u64,
        tag: Tag,
        payload: &[u8],
    ) -> Result<(), CollectiveError> {
        self.arrival(from, seq, tag, payload, true).map(|_| ())
    }

    fn arrival(
        &self,
        from: u32,
        seq: u64,
        tag: Tag,
        payload: &[u8],
        block: bool,
    ) -> Result<bool, CollectiveError> {
        let header = FrameHeader::whole(FrameKind::Data, tag, seq, payload.len() as u64);
        let landing = {
            let mut st = lock(&self.state);
            loop {
                st.peers[from as usize].links[0].holder = Holder::Background;
                match st.on_first_frame(from, &header, None) {
                    Ok(Landing::Park) if block => {
                        st.peers[from as usize].links[0].holder = Holder::Free;
                        st = match self.changed.wait(st) {
                            Ok(g) => g,
                            Err(p) => p.into_inner(),
                        };
                    }
                    other => break other,
                }
            }
        };
        let result = match landing {
            Ok(Landing::Owned(ptr)) => {
                // SAFETY: as in the engine: the buffer lives in the matching state until the
                // message completes, and this thread holds the only link that writes it.
                unsafe { std::ptr::copy_nonoverlapping(payload.as_ptr(), ptr, payload.len()) };
                lock(&self.state)
                    .on_bytes(from, seq, payload.len() as u64)
                    .map(|_| true)
            }
            Ok(Landing::Park) => Ok(false),
            Ok(Landing::Caller | Landing::Discard) => lock(&self.state)
                .on_bytes(from, seq, payload.len() as u64)
                .map(|_| true),
            Err(e) => Err(e),
        };
        {
            let mut st = lock(&self.state);
            st.peers[from as usize].links[0].holder = Holder::Free;
            st.peers[from as usize].drop_arriving_if_lost();
        }
        self.changed.notify_all();
        result
    }

    /// The peer's connection failed.
    pub fn lose(&self, from: u32) {
        lock(&self.state).mark_lost(from, Lost::Gone("modelled loss".to_owned()));
        self.changed.notify_all();
    }

    /// `Transport::abort`.
    pub fn abort(&self) {
        lock(&self.state).aborted = true;
        self.changed.notify_all();
    }

    /// Unexpected bytes buffered for `from`.
    pub fn unexpected(&self, from: u32) -> u64 {
        lock(&self.state).unexpected_bytes_of(from)
    }
}
