//! Handles of non-blocking collectives: each `spawn_*` call issues its operation at once (it
//! takes its place in the group's sequence on the calling thread) and runs it on a thread of
//! its own; [`CollectiveHandle::join`] waits for the result.

use std::thread::JoinHandle;

use crate::{CollectiveError, Result};

/// A collective running in the background; [`join`](CollectiveHandle::join) returns its result.
///
/// Dropping a handle without joining lets the operation finish on its own.
#[derive(Debug)]
#[must_use = "a non-blocking collective's errors are only seen through join()"]
pub struct CollectiveHandle<T> {
    state: State<T>,
    op: &'static str,
    rank: u32,
}

#[derive(Debug)]
enum State<T> {
    Running(JoinHandle<Result<T>>),
    /// The operation could not even be started (no thread could be spawned).
    Failed(CollectiveError),
}

/// The handle [`ProcessGroup::spawn_all_reduce`](crate::ProcessGroup::spawn_all_reduce)
/// returns.
pub type AllReduceHandle<T = f32> = CollectiveHandle<Vec<T>>;

impl<T> CollectiveHandle<T> {
    pub(crate) fn new(
        spawned: std::io::Result<JoinHandle<Result<T>>>,
        op: &'static str,
        rank: u32,
    ) -> Self {
        let state = match spawned {
            Ok(handle) => State::Running(handle),
            Err(source) => State::Failed(CollectiveError::Io { peer: None, source }),
        };
        CollectiveHandle { state, op, rank }
    }

    /// Whether the operation has finished (so [`join`](Self::join) will not block).
    pub fn is_finished(&self) -> bool {
        match &self.state {
            State::Running(handle) => handle.is_finished(),
            State::Failed(_) => true,
        }
    }

    /// Waits for the operation and returns its result. Never panics: a panic on the
    /// operation's thread comes back as [`CollectiveError::PeerFailed`] naming this rank.
    pub fn join(self) -> Result<T> {
        match self.state {
            State::Failed(error) => Err(error),
            State::Running(handle) => handle.join().unwrap_or_else(|payload| {
                let why = payload
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".to_owned());
                Err(CollectiveError::PeerFailed {
                    peer: self.rank,
                    detail: format!("the thread running {} panicked: {why}", self.op),
                })
            }),
        }
    }
}
