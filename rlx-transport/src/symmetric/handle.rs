//! The handles of the non-blocking operations of [`Symmetric`](super::Symmetric): the requests
//! of one put or get in flight to a peer, and what waiting for them yields.

use std::time::Duration;

use crate::symmetric::Completion;
use crate::symmetric::service::{Completions, Outcome};
use crate::sync::Arc;
use crate::{CollectiveError, Result};

/// The requests of one operation in flight to a peer (one per chunk), as held by a handle.
/// Dropping it detaches the requests not yet waited for: they still count for quiet.
#[derive(Debug)]
pub(crate) struct Pending {
    pub(crate) completions: Arc<Completions>,
    pub(crate) peer: u32,
    pub(crate) ids: Vec<u64>,
    /// How many of `ids` have been waited for.
    pub(crate) next: usize,
    pub(crate) timeout: Duration,
}

impl Pending {
    fn is_done(&self) -> bool {
        self.ids[self.next..]
            .iter()
            .all(|&id| self.completions.is_finished(self.peer, id))
    }

    /// Waits for the requests in order and hands each outcome to `each`; stops at the first
    /// error (the requests after it are detached when `self` drops).
    pub(crate) fn wait_each(
        &mut self,
        op: &'static str,
        mut each: impl FnMut(Outcome) -> Result<()>,
    ) -> Result<()> {
        while let Some(&id) = self.ids.get(self.next) {
            self.next += 1;
            let outcome = self.completions.wait(self.peer, id, op, self.timeout)?;
            each(outcome)?;
        }
        Ok(())
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        for &id in &self.ids[self.next..] {
            self.completions.detach(self.peer, id);
        }
    }
}

#[derive(Debug)]
pub(crate) enum HandleState<T> {
    /// Completed locally (an operation on this rank's own heap).
    Ready(Result<T>),
    /// In flight to a peer.
    Pending(Pending),
}

/// The handle of a non-blocking put of a [`Symmetric`](super::Symmetric) transport. Dropping it without waiting
/// is fine: [`SymmetricTransport::quiet`](super::SymmetricTransport::quiet) still waits for the put and then reports its
/// failure; a handle that is held reports the failure itself.
#[derive(Debug)]
pub struct PutHandle {
    pub(crate) state: HandleState<()>,
}

impl Completion for PutHandle {
    type Output = ();

    fn is_done(&self) -> bool {
        match &self.state {
            HandleState::Pending(p) => p.is_done(),
            HandleState::Ready(_) => true,
        }
    }

    fn wait(self) -> Result<()> {
        match self.state {
            HandleState::Ready(result) => result,
            HandleState::Pending(mut pending) => {
                let peer = pending.peer;
                pending.wait_each("put", |outcome| match outcome {
                    Outcome::Ack => Ok(()),
                    other => Err(CollectiveError::protocol(
                        Some(peer),
                        format!("put answered with {other:?}"),
                    )),
                })
            }
        }
    }
}

/// The handle of a non-blocking get of a [`Symmetric`](super::Symmetric) transport.
#[derive(Debug)]
pub struct GetHandle {
    pub(crate) state: HandleState<Vec<u8>>,
    pub(crate) len: u64,
}

impl Completion for GetHandle {
    type Output = Vec<u8>;

    fn is_done(&self) -> bool {
        match &self.state {
            HandleState::Pending(p) => p.is_done(),
            HandleState::Ready(_) => true,
        }
    }

    fn wait(self) -> Result<Vec<u8>> {
        match self.state {
            HandleState::Ready(result) => result,
            HandleState::Pending(mut pending) => {
                let peer = pending.peer;
                let mut out: Option<Vec<u8>> = None;
                // `Completions::complete` checked every chunk's length, so the chunks add up to
                // `len`, which the range check bounded by the heap size.
                let len = self.len as usize;
                pending.wait_each("get", |outcome| match outcome {
                    Outcome::Data(payload) => {
                        match &mut out {
                            Some(out) => out.extend_from_slice(payload.bytes()),
                            None if payload.bytes().len() == len => out = Some(payload.into_vec()),
                            None => {
                                let mut first = Vec::with_capacity(len);
                                first.extend_from_slice(payload.bytes());
                                out = Some(first);
                            }
                        }
                        Ok(())
                    }
                    other => Err(CollectiveError::protocol(
                        Some(peer),
                        format!("get answered with {other:?}"),
                    )),
                })?;
                Ok(out.unwrap_or_default())
            }
        }
    }
}
