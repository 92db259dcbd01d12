//! Admitting new processes into a running job: the contract that lets
//! `ProcessGroup::grow` add ranks to a group, whatever the transport.
//!
//! Growing builds a *new world*: the group's members and the joiners form a fresh transport
//! (new links, a new tag space), in which the members keep their group ranks and the joiners
//! take the ranks after them. The old transport is left as it was, so nothing from before the
//! growth (a late contribution, a stale message) can ever reach the new world. The steps, on
//! the group's rank 0 (the *leader*):
//! 1. [`Admission::await_joiners`]: wait for the processes that asked to join (a joiner finds
//!    the leader through the job's rendezvous address and authenticates like a rank does);
//! 2. [`Admission::plan_world`]: plan the new world (for sockets: a fresh rendezvous hosted by
//!    the leader, under a job id of its own);
//! 3. hand the plan to every member (over the group) and to every joiner
//!    ([`PendingJoiner::admit`]);
//! 4. everyone, joiners included, builds its transport of the new world from the plan
//!    ([`Admission::successor`]).

use std::sync::Arc;
use std::time::Duration;

use crate::{Result, Transport};

/// What a transport that can admit new processes provides (see the module docs); reached
/// through [`Transport::admission`].
pub trait Admission: Send + Sync {
    /// On the leader: waits up to `timeout` until `count` processes have asked to join and
    /// proved they belong to the job; returns them in arrival order. Fails with
    /// [`CollectiveError::Timeout`](crate::CollectiveError::Timeout) when fewer came.
    fn await_joiners(&self, count: u32, timeout: Duration) -> Result<Vec<Box<dyn PendingJoiner>>>;

    /// On the leader: plans a new world of `size` ranks in which the leader is rank 0. The
    /// plan is opaque bytes that every member and joiner hands to [`Admission::successor`].
    fn plan_world(&self, size: u32) -> Result<Vec<u8>>;

    /// This process's transport in the planned world, as `rank` of `size`; it waits until
    /// every rank of the new world has arrived (up to the transport's connect timeout).
    fn successor(&self, plan: &[u8], rank: u32, size: u32) -> Result<Arc<dyn Transport>>;
}

/// A process that asked to join and waits for its place.
pub trait PendingJoiner: Send {
    /// Tells the joiner its rank in the new world, the world's size and the plan; it then
    /// builds its transport of the new world.
    fn admit(self: Box<Self>, rank: u32, size: u32, plan: &[u8]) -> Result<()>;

    /// Where the joiner came from, for messages.
    fn describe(&self) -> String;
}
