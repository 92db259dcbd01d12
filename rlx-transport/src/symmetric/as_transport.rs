//! [`Symmetric`] as a two-sided [`Transport`] itself: every call goes to the carrying
//! transport, except `abort`, which also fails the heap's waits, and `barrier`, which quiets
//! this rank's puts first.

use std::time::Duration;

use crate::symmetric::{Symmetric, SymmetricTransport};
use crate::{Failure, NativeCollectives, Result, Tag, Transport};

impl<T: Transport + 'static> Transport for Symmetric<T> {
    fn rank(&self) -> u32 {
        self.carrier().rank()
    }

    fn world_size(&self) -> u32 {
        self.carrier().world_size()
    }

    fn send_message(&self, to: u32, tag: Tag, parts: &[&[u8]]) -> Result<()> {
        self.carrier().send_message(to, tag, parts)
    }

    fn recv_message(&self, from: u32, tag: Tag, timeout: Duration) -> Result<Option<Vec<u8>>> {
        self.carrier().recv_message(from, tag, timeout)
    }

    fn recv_message_into(
        &self,
        from: u32,
        tag: Tag,
        buf: &mut [u8],
        timeout: Duration,
    ) -> Result<Option<usize>> {
        self.carrier().recv_message_into(from, tag, buf, timeout)
    }

    fn traffic(&self) -> Option<crate::Traffic> {
        self.carrier().traffic()
    }

    fn send_recv_into(
        &self,
        to: u32,
        from: u32,
        tag: Tag,
        parts: &[&[u8]],
        buf: &mut [u8],
        timeout: Duration,
    ) -> Result<Option<usize>> {
        self.carrier()
            .send_recv_into(to, from, tag, parts, buf, timeout)
    }

    fn send_failure(&self, to: u32, tag: Tag, failure: Failure) -> Result<()> {
        self.carrier().send_failure(to, tag, failure)
    }

    fn try_send_message(&self, to: u32, tag: Tag, parts: &[&[u8]], wait: Duration) -> Result<bool> {
        self.carrier().try_send_message(to, tag, parts, wait)
    }

    fn try_send_message_during(
        &self,
        to: u32,
        tag: Tag,
        parts: &[&[u8]],
        wait: Duration,
        meanwhile: &mut dyn FnMut() -> Result<()>,
    ) -> Result<bool> {
        self.carrier()
            .try_send_message_during(to, tag, parts, wait, meanwhile)
    }

    fn segment_hint(&self, members: &[u32]) -> Option<usize> {
        self.carrier().segment_hint(members)
    }

    fn try_send_failure(
        &self,
        to: u32,
        tag: Tag,
        failure: Failure,
        wait: Duration,
    ) -> Result<bool> {
        self.carrier().try_send_failure(to, tag, failure, wait)
    }

    fn op_timeout(&self) -> Duration {
        self.carrier().op_timeout()
    }

    fn exclude_peer(&self, peer: u32) -> Result<()> {
        self.carrier().exclude_peer(peer)
    }

    fn abort(&self) {
        self.abort_heap();
        self.carrier().abort();
    }

    fn native_collectives(&self) -> Option<&dyn NativeCollectives> {
        self.carrier().native_collectives()
    }

    /// This transport is its own heap: code holding only a `dyn Transport` reaches the
    /// one-sided operations through this.
    fn symmetric(&self) -> Option<&dyn crate::symmetric::SymmetricOps> {
        Some(self)
    }

    /// Quiets this rank's puts, then runs the carrying transport's barrier: when it returns on
    /// any rank, every rank's puts from before the barrier have been applied.
    fn barrier(&self) -> Result<()> {
        self.quiet()?;
        self.carrier().barrier()
    }
}
