//! [`Delegate`]: the one way a transport that wraps another forwards the [`Transport`]
//! methods to it, so that a method added to the trait cannot be forgotten by a wrapper.
//!
//! A wrapper implements [`Delegate`] (its [`inner`](Delegate::inner) transport, and the few
//! methods it changes) and gets [`Transport`] from the blanket implementation here, which
//! sends every method through `Delegate`, whose defaults call the inner transport. A method
//! added to [`Transport`] is added to both traits in this file: the blanket implementation
//! denies `clippy::missing_trait_methods`, so one left out fails the lint instead of falling
//! back to the trait's default behind every wrapper's back.
//!
//! A transport that changes its inner one's sends (counting or failing them) is better off
//! implementing [`Transport`] itself from the four required methods: the trait's defaults
//! then route every send through its own `send_message`, which forwarding would bypass.

use std::time::Duration;

use crate::transport::SymmetricOps;
use crate::{Admission, Failure, NativeCollectives, Result, Tag, Topology, Traffic, Transport};

/// A transport that wraps [`inner`](Delegate::inner) and forwards every [`Transport`] method
/// to it, except those it overrides here (each with the meaning of the [`Transport`] method
/// of the same name).
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
///
/// use rlx_transport::{Delegate, MemTransport, NativeCollectives, Transport};
///
/// /// A transport that behaves as its inner one but hides its native collectives.
/// struct Plain(Arc<MemTransport>);
///
/// impl Delegate for Plain {
///     fn inner(&self) -> &dyn Transport {
///         &*self.0
///     }
///
///     fn native_collectives(&self) -> Option<&dyn NativeCollectives> {
///         None
///     }
/// }
///
/// let plain = Plain(MemTransport::fan_out(1).remove(0));
/// assert_eq!(Transport::world_size(&plain), 1);
/// ```
#[allow(
    missing_docs,
    reason = "each method is the Transport method of the same name"
)]
pub trait Delegate: Send + Sync {
    /// The transport every method not overridden goes to.
    fn inner(&self) -> &dyn Transport;

    fn rank(&self) -> u32 {
        self.inner().rank()
    }

    fn world_size(&self) -> u32 {
        self.inner().world_size()
    }

    fn send_message(&self, to: u32, tag: Tag, parts: &[&[u8]]) -> Result<()> {
        self.inner().send_message(to, tag, parts)
    }

    fn recv_message(&self, from: u32, tag: Tag, timeout: Duration) -> Result<Option<Vec<u8>>> {
        self.inner().recv_message(from, tag, timeout)
    }

    fn recv_message_into(
        &self,
        from: u32,
        tag: Tag,
        buf: &mut [u8],
        timeout: Duration,
    ) -> Result<Option<usize>> {
        self.inner().recv_message_into(from, tag, buf, timeout)
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
        self.inner()
            .send_recv_into(to, from, tag, parts, buf, timeout)
    }

    fn traffic(&self) -> Option<Traffic> {
        self.inner().traffic()
    }

    fn segment_hint(&self, members: &[u32]) -> Option<usize> {
        self.inner().segment_hint(members)
    }

    fn topology(&self) -> Option<Topology> {
        self.inner().topology()
    }

    fn unreceived_from(&self, from: u32) -> Vec<(Tag, u64)> {
        self.inner().unreceived_from(from)
    }

    fn send_failure(&self, to: u32, tag: Tag, failure: Failure) -> Result<()> {
        self.inner().send_failure(to, tag, failure)
    }

    fn try_send_message(&self, to: u32, tag: Tag, parts: &[&[u8]], wait: Duration) -> Result<bool> {
        self.inner().try_send_message(to, tag, parts, wait)
    }

    fn try_send_message_during(
        &self,
        to: u32,
        tag: Tag,
        parts: &[&[u8]],
        wait: Duration,
        meanwhile: &mut dyn FnMut() -> Result<()>,
    ) -> Result<bool> {
        self.inner()
            .try_send_message_during(to, tag, parts, wait, meanwhile)
    }

    fn try_send_failure(
        &self,
        to: u32,
        tag: Tag,
        failure: Failure,
        wait: Duration,
    ) -> Result<bool> {
        self.inner().try_send_failure(to, tag, failure, wait)
    }

    fn op_timeout(&self) -> Duration {
        self.inner().op_timeout()
    }

    fn abort(&self) {
        self.inner().abort();
    }

    fn exclude_peer(&self, peer: u32) -> Result<()> {
        self.inner().exclude_peer(peer)
    }

    fn excluded_by(&self, peer: u32) -> bool {
        self.inner().excluded_by(peer)
    }

    fn admission(&self) -> Option<&dyn Admission> {
        self.inner().admission()
    }

    fn native_collectives(&self) -> Option<&dyn NativeCollectives> {
        self.inner().native_collectives()
    }

    fn symmetric(&self) -> Option<&dyn SymmetricOps> {
        self.inner().symmetric()
    }

    fn send_bytes(&self, to: u32, tag: u32, data: &[u8]) -> Result<()> {
        self.inner().send_bytes(to, tag, data)
    }

    fn recv_bytes(&self, from: u32, tag: u32) -> Result<Vec<u8>> {
        self.inner().recv_bytes(from, tag)
    }

    fn recv_bytes_timeout(
        &self,
        from: u32,
        tag: u32,
        timeout: Duration,
    ) -> Result<Option<Vec<u8>>> {
        self.inner().recv_bytes_timeout(from, tag, timeout)
    }

    fn barrier(&self) -> Result<()> {
        self.inner().barrier()
    }
}

// Every method, including those `Transport` provides: one left to the trait's default would
// bypass the wrapper's inner transport without anyone noticing.
#[deny(clippy::missing_trait_methods)]
impl<D: Delegate> Transport for D {
    fn rank(&self) -> u32 {
        Delegate::rank(self)
    }

    fn world_size(&self) -> u32 {
        Delegate::world_size(self)
    }

    fn send_message(&self, to: u32, tag: Tag, parts: &[&[u8]]) -> Result<()> {
        Delegate::send_message(self, to, tag, parts)
    }

    fn recv_message(&self, from: u32, tag: Tag, timeout: Duration) -> Result<Option<Vec<u8>>> {
        Delegate::recv_message(self, from, tag, timeout)
    }

    fn recv_message_into(
        &self,
        from: u32,
        tag: Tag,
        buf: &mut [u8],
        timeout: Duration,
    ) -> Result<Option<usize>> {
        Delegate::recv_message_into(self, from, tag, buf, timeout)
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
        Delegate::send_recv_into(self, to, from, tag, parts, buf, timeout)
    }

    fn traffic(&self) -> Option<Traffic> {
        Delegate::traffic(self)
    }

    fn segment_hint(&self, members: &[u32]) -> Option<usize> {
        Delegate::segment_hint(self, members)
    }

    fn topology(&self) -> Option<Topology> {
        Delegate::topology(self)
    }

    fn unreceived_from(&self, from: u32) -> Vec<(Tag, u64)> {
        Delegate::unreceived_from(self, from)
    }

    fn send_failure(&self, to: u32, tag: Tag, failure: Failure) -> Result<()> {
        Delegate::send_failure(self, to, tag, failure)
    }

    fn try_send_message(&self, to: u32, tag: Tag, parts: &[&[u8]], wait: Duration) -> Result<bool> {
        Delegate::try_send_message(self, to, tag, parts, wait)
    }

    fn try_send_message_during(
        &self,
        to: u32,
        tag: Tag,
        parts: &[&[u8]],
        wait: Duration,
        meanwhile: &mut dyn FnMut() -> Result<()>,
    ) -> Result<bool> {
        Delegate::try_send_message_during(self, to, tag, parts, wait, meanwhile)
    }

    fn try_send_failure(
        &self,
        to: u32,
        tag: Tag,
        failure: Failure,
        wait: Duration,
    ) -> Result<bool> {
        Delegate::try_send_failure(self, to, tag, failure, wait)
    }

    fn op_timeout(&self) -> Duration {
        Delegate::op_timeout(self)
    }

    fn abort(&self) {
        Delegate::abort(self);
    }

    fn exclude_peer(&self, peer: u32) -> Result<()> {
        Delegate::exclude_peer(self, peer)
    }

    fn excluded_by(&self, peer: u32) -> bool {
        Delegate::excluded_by(self, peer)
    }

    fn admission(&self) -> Option<&dyn Admission> {
        Delegate::admission(self)
    }

    fn native_collectives(&self) -> Option<&dyn NativeCollectives> {
        Delegate::native_collectives(self)
    }

    fn symmetric(&self) -> Option<&dyn SymmetricOps> {
        Delegate::symmetric(self)
    }

    fn send_bytes(&self, to: u32, tag: u32, data: &[u8]) -> Result<()> {
        Delegate::send_bytes(self, to, tag, data)
    }

    fn recv_bytes(&self, from: u32, tag: u32) -> Result<Vec<u8>> {
        Delegate::recv_bytes(self, from, tag)
    }

    fn recv_bytes_timeout(
        &self,
        from: u32,
        tag: u32,
        timeout: Duration,
    ) -> Result<Option<Vec<u8>>> {
        Delegate::recv_bytes_timeout(self, from, tag, timeout)
    }

    fn barrier(&self) -> Result<()> {
        Delegate::barrier(self)
    }
}
