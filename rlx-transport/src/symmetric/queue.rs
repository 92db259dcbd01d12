//! [`RequestQueue`]: the queue between a peer's heap reader and its server thread.
//!
//! The reader must never wait for the server (a server sending a large get response to a peer
//! that is itself serving one would otherwise stall the reader that takes this rank's
//! responses), so the queue is unbounded; the initiators' own flow keeps it short (see
//! [`Symmetric`](super::Symmetric)). Closing it wakes the server at once, so dropping a
//! transport never waits for a server to notice. Ending it is the gentler stop of a peer whose
//! stream of messages is over: the server still applies what the peer sent before it left.

use std::collections::VecDeque;

use crate::sync::{Condvar, Mutex, lock};

/// A FIFO of encoded requests that one reader pushes and one server pops, until it is
/// closed.
#[derive(Debug, Default)]
pub struct RequestQueue {
    state: Mutex<Queued>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct Queued {
    requests: VecDeque<Vec<u8>>,
    closed: bool,
    /// No request will be pushed any more, but those queued are still served.
    ended: bool,
}

impl RequestQueue {
    /// An empty, open queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends `request`; `false` (and the request is dropped) once the queue is closed or
    /// ended.
    pub fn push(&self, request: Vec<u8>) -> bool {
        let mut state = lock(&self.state);
        if state.closed || state.ended {
            return false;
        }
        state.requests.push_back(request);
        drop(state);
        self.changed.notify_one();
        true
    }

    /// Waits for the oldest request; `None` once the queue is closed, or once it is ended and
    /// empty. Requests pushed before a close are dropped with it: a closed queue belongs to a
    /// transport that is going away, or to a peer that is no longer trusted.
    pub fn pop(&self) -> Option<Vec<u8>> {
        let mut state = lock(&self.state);
        loop {
            if state.closed {
                return None;
            }
            if let Some(request) = state.requests.pop_front() {
                return Some(request);
            }
            if state.ended {
                return None;
            }
            state = match self.changed.wait(state) {
                Ok(guard) => guard,
                Err(poisoned) => poisoned.into_inner(),
            };
        }
    }

    /// Says that the peer's stream is over (it left, or its link failed): the server takes
    /// the requests already queued, then `pop` returns `None`. What a departed peer put before
    /// it left belongs in the heap like anything else it put; idempotent.
    pub fn end(&self) {
        lock(&self.state).ended = true;
        self.changed.notify_all();
    }

    /// Closes the queue, drops what it holds and wakes the server; idempotent.
    pub fn close(&self) {
        let mut state = lock(&self.state);
        state.closed = true;
        state.requests.clear();
        drop(state);
        self.changed.notify_all();
    }
}
