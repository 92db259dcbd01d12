//! Handles of non-blocking collectives: each `spawn_*` call issues its operation at once (it
//! takes its place in the group's sequence on the calling thread) and queues it on the group's
//! progress worker; [`CollectiveHandle::join`] waits for the result.

use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use crate::{CollectiveError, Result};

/// A collective running in the background; [`join`](CollectiveHandle::join) returns its result.
///
/// Dropping a handle without joining lets the operation finish on its own.
#[derive(Debug)]
#[must_use = "a non-blocking collective's errors are only seen through join()"]
pub struct CollectiveHandle<T> {
    state: State<T>,
}

#[derive(Debug)]
enum State<T> {
    Running(Arc<ResultSlot<T>>),
    /// The operation could not even be started (no worker thread could be spawned).
    Failed(CollectiveError),
}

/// The handle [`ProcessGroup::spawn_all_reduce`](crate::ProcessGroup::spawn_all_reduce)
/// returns.
pub type AllReduceHandle<T = f32> = CollectiveHandle<Vec<T>>;

/// Where the worker leaves an operation's result for its handle.
#[derive(Debug)]
pub(crate) struct ResultSlot<T> {
    result: Mutex<Option<Result<T>>>,
    filled: Condvar,
}

impl<T> ResultSlot<T> {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(ResultSlot {
            result: Mutex::new(None),
            filled: Condvar::new(),
        })
    }

    /// Stores the operation's result and wakes the joining thread.
    pub(crate) fn fill(&self, result: Result<T>) {
        *self.result.lock() = Some(result);
        self.filled.notify_all();
    }
}

impl<T> CollectiveHandle<T> {
    pub(crate) fn running(slot: Arc<ResultSlot<T>>) -> Self {
        CollectiveHandle {
            state: State::Running(slot),
        }
    }

    pub(crate) fn failed(error: CollectiveError) -> Self {
        CollectiveHandle {
            state: State::Failed(error),
        }
    }

    /// Whether the operation has finished (so [`join`](Self::join) will not block).
    pub fn is_finished(&self) -> bool {
        match &self.state {
            State::Running(slot) => slot.result.lock().is_some(),
            State::Failed(_) => true,
        }
    }

    /// Waits for the operation and returns its result. Never panics: a panic while the
    /// operation ran comes back as [`CollectiveError::PeerFailed`] naming this rank.
    pub fn join(self) -> Result<T> {
        match self.state {
            State::Failed(error) => Err(error),
            State::Running(slot) => {
                let mut result = slot.result.lock();
                loop {
                    if let Some(result) = result.take() {
                        return result;
                    }
                    slot.filled.wait(&mut result);
                }
            }
        }
    }
}
