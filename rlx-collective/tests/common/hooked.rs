//! One wrapper for the tests that change a little of how a rank's in-process transport
//! behaves: an operation timeout of its own (fixed, or changed while the rank runs), a check
//! before every send that can make the rank die there, and a notice after every message
//! handed over. Everything else is forwarded to the [`MemTransport`] inside, so the
//! collectives see no other difference; one wrapper, so that a method the collectives start
//! to use is forwarded for every such test at once.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rlx_collective::{Admission, CollectiveError, Failure, MemTransport, Tag, Transport};

/// Called before every send (a message or a failure notice) with its destination; an error
/// is returned in place of the send.
pub(crate) type BeforeSend = Box<dyn Fn(u32) -> Result<(), CollectiveError> + Send + Sync>;

/// Called after a message was handed over, with its destination and tag.
pub(crate) type AfterSend = Box<dyn Fn(u32, Tag) + Send + Sync>;

/// A rank's transport with the hooks of this module.
pub(crate) struct Hooked {
    inner: Arc<MemTransport>,
    op_timeout: Option<Arc<Mutex<Duration>>>,
    before_send: Option<BeforeSend>,
    after_send: Option<AfterSend>,
}

impl Hooked {
    /// `inner`, unchanged until a hook is added.
    pub(crate) fn new(inner: Arc<MemTransport>) -> Self {
        Self {
            inner,
            op_timeout: None,
            before_send: None,
            after_send: None,
        }
    }

    /// The transport inside.
    pub(crate) fn inner(&self) -> &Arc<MemTransport> {
        &self.inner
    }

    /// Gives the rank the operation timeout in `timeout`, which the test may change while the
    /// rank runs.
    pub(crate) fn op_timeout(mut self, timeout: Arc<Mutex<Duration>>) -> Self {
        self.op_timeout = Some(timeout);
        self
    }

    /// Gives the rank the fixed operation timeout `timeout`.
    pub(crate) fn fixed_op_timeout(self, timeout: Duration) -> Self {
        self.op_timeout(Arc::new(Mutex::new(timeout)))
    }

    /// Runs `hook` before every send.
    pub(crate) fn before_send(
        mut self,
        hook: impl Fn(u32) -> Result<(), CollectiveError> + Send + Sync + 'static,
    ) -> Self {
        self.before_send = Some(Box::new(hook));
        self
    }

    /// Runs `hook` after every message handed over.
    pub(crate) fn after_send(mut self, hook: impl Fn(u32, Tag) + Send + Sync + 'static) -> Self {
        self.after_send = Some(Box::new(hook));
        self
    }

    fn check_send(&self, to: u32) -> Result<(), CollectiveError> {
        self.before_send.as_ref().map_or(Ok(()), |hook| hook(to))
    }
}

impl std::fmt::Debug for Hooked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hooked")
            .field("rank", &self.inner.rank())
            .field("op_timeout", &self.op_timeout)
            .finish_non_exhaustive()
    }
}

// Not a `Delegate`: the hooks must see every send, and the trait's provided methods route
// every send (`send_recv_into`, `try_send_*`) through `send_message` and `send_failure`,
// which forwarding would bypass. What the group needs beyond sends is forwarded below.
impl Transport for Hooked {
    fn rank(&self) -> u32 {
        self.inner.rank()
    }
    fn world_size(&self) -> u32 {
        self.inner.world_size()
    }
    fn send_message(&self, to: u32, tag: Tag, parts: &[&[u8]]) -> Result<(), CollectiveError> {
        self.check_send(to)?;
        self.inner.send_message(to, tag, parts)?;
        if let Some(hook) = &self.after_send {
            hook(to, tag);
        }
        Ok(())
    }
    fn recv_message(
        &self,
        from: u32,
        tag: Tag,
        timeout: Duration,
    ) -> Result<Option<Vec<u8>>, CollectiveError> {
        self.inner.recv_message(from, tag, timeout)
    }
    fn send_failure(&self, to: u32, tag: Tag, failure: Failure) -> Result<(), CollectiveError> {
        self.check_send(to)?;
        self.inner.send_failure(to, tag, failure)
    }
    fn op_timeout(&self) -> Duration {
        match &self.op_timeout {
            Some(timeout) => *timeout.lock().unwrap_or_else(|p| p.into_inner()),
            None => self.inner.op_timeout(),
        }
    }
    fn abort(&self) {
        self.inner.abort();
    }
    fn exclude_peer(&self, peer: u32) -> Result<(), CollectiveError> {
        self.inner.exclude_peer(peer)
    }
    fn admission(&self) -> Option<&dyn Admission> {
        self.inner.admission()
    }
}
