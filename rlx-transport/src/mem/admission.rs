//! Admission for [`MemTransport`]: a thread joins a running in-process job with a
//! [`MemJoiner`] (taken from any rank of the job), and the job's leader admits it in
//! `ProcessGroup::grow`.
//!
//! Every world of one job shares one [`Desk`]: the joiners waiting for a place, and the worlds
//! the leader planned whose ranks have not all been claimed yet. A plan is the id of such a
//! world.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::MemTransport;
use crate::admission::{Admission, PendingJoiner};
use crate::sync::{Condvar, Mutex, lock};
use crate::{CollectiveError, Result, Transport};

/// A joiner's place, once the leader gave it one: (rank, world size, plan).
type Place = (u32, u32, Vec<u8>);

/// One joiner waiting at the desk.
struct Ticket {
    place: Mutex<Option<Place>>,
    given: Condvar,
    /// Which joiner this is, for messages.
    number: u64,
}

#[derive(Default)]
struct DeskState {
    waiting: VecDeque<Arc<Ticket>>,
    /// Planned worlds by id: each rank's transport until it is claimed.
    worlds: HashMap<u64, Vec<Option<Arc<MemTransport>>>>,
    next_id: u64,
    next_ticket: u64,
}

/// The admission desk every world of one in-process job shares.
#[derive(Default)]
pub(crate) struct Desk {
    state: Mutex<DeskState>,
    arrived: Condvar,
}

impl fmt::Debug for Desk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = lock(&self.state);
        f.debug_struct("Desk")
            .field("waiting", &state.waiting.len())
            .field("planned", &state.worlds.len())
            .finish()
    }
}

/// A handle with which a new thread joins a running in-process job; get one with
/// [`MemTransport::joiner`] and call [`MemJoiner::join`] on the new thread while the members
/// call `ProcessGroup::grow`.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use rlx_transport::{MemTransport, Transport};
///
/// let world = MemTransport::fan_out(1);
/// let joiner = world[0].joiner();
/// let newcomer = std::thread::spawn(move || joiner.join(Duration::from_secs(30)));
/// let admission = world[0].admission().unwrap();
/// let pending = admission.await_joiners(1, Duration::from_secs(30))?;
/// let plan = admission.plan_world(2)?;
/// for joiner in pending {
///     joiner.admit(1, 2, &plan)?;
/// }
/// let leader = admission.successor(&plan, 0, 2)?;
/// let newcomer = newcomer.join().unwrap()?;
/// assert_eq!((leader.world_size(), newcomer.rank()), (2, 1));
/// # Ok::<(), rlx_transport::CollectiveError>(())
/// ```
#[derive(Clone, Debug)]
pub struct MemJoiner {
    desk: Arc<Desk>,
}

impl MemJoiner {
    pub(super) fn new(desk: Arc<Desk>) -> Self {
        MemJoiner { desk }
    }

    /// Asks to join and waits up to `timeout` for the leader to admit this thread; returns
    /// its transport in the grown world. Fails with [`CollectiveError::Timeout`] when nobody
    /// admitted it in time.
    pub fn join(&self, timeout: Duration) -> Result<Arc<MemTransport>> {
        let ticket = {
            let mut state = lock(&self.desk.state);
            state.next_ticket += 1;
            let ticket = Arc::new(Ticket {
                place: Mutex::new(None),
                given: Condvar::new(),
                number: state.next_ticket,
            });
            state.waiting.push_back(Arc::clone(&ticket));
            ticket
        };
        self.desk.arrived.notify_all();
        let deadline = Instant::now() + timeout;
        let mut place = lock(&ticket.place);
        let (rank, size, plan) = loop {
            if let Some(given) = place.take() {
                break given;
            }
            let now = Instant::now();
            if now >= deadline {
                drop(place);
                let mut state = lock(&self.desk.state);
                let still_waiting = state.waiting.iter().any(|t| Arc::ptr_eq(t, &ticket));
                if still_waiting {
                    state.waiting.retain(|t| !Arc::ptr_eq(t, &ticket));
                    return Err(CollectiveError::Timeout {
                        peer: None,
                        op: "join",
                        after: timeout,
                    });
                }
                // The leader took this ticket just now: its place is on the way.
                drop(state);
                place = lock(&ticket.place);
                if let Some(given) = place.take() {
                    break given;
                }
                place = match ticket.given.wait_timeout(place, Duration::from_secs(5)) {
                    Ok((guard, _)) => guard,
                    Err(poisoned) => poisoned.into_inner().0,
                };
                if let Some(given) = place.take() {
                    break given;
                }
                return Err(CollectiveError::Timeout {
                    peer: None,
                    op: "join",
                    after: timeout,
                });
            }
            place = match ticket.given.wait_timeout(place, deadline - now) {
                Ok((guard, _)) => guard,
                Err(poisoned) => poisoned.into_inner().0,
            };
        };
        drop(place);
        let transport = claim(&self.desk, &plan, rank, size)?;
        Ok(transport)
    }
}

/// Takes rank `rank`'s transport of the planned world `plan` (of `size` ranks).
fn claim(desk: &Desk, plan: &[u8], rank: u32, size: u32) -> Result<Arc<MemTransport>> {
    let id = plan
        .try_into()
        .map(u64::from_le_bytes)
        .map_err(|_| CollectiveError::invalid("an in-process world plan is 8 bytes"))?;
    let mut state = lock(&desk.state);
    let world = state
        .worlds
        .get_mut(&id)
        .ok_or_else(|| CollectiveError::invalid(format!("no planned in-process world {id}")))?;
    if world.len() != size as usize {
        return Err(CollectiveError::invalid(format!(
            "planned world {id} has {} ranks, not {size}",
            world.len()
        )));
    }
    let transport = world
        .get_mut(rank as usize)
        .and_then(Option::take)
        .ok_or_else(|| {
            CollectiveError::invalid(format!(
                "rank {rank} of planned world {id} is out of range or taken"
            ))
        })?;
    if world.iter().all(Option::is_none) {
        state.worlds.remove(&id);
    }
    Ok(transport)
}

impl PendingJoiner for Arc<Ticket> {
    fn admit(self: Box<Self>, rank: u32, size: u32, plan: &[u8]) -> Result<()> {
        *lock(&self.place) = Some((rank, size, plan.to_vec()));
        self.given.notify_all();
        Ok(())
    }

    fn describe(&self) -> String {
        format!("in-process joiner {}", self.number)
    }
}

impl Admission for MemTransport {
    fn await_joiners(&self, count: u32, timeout: Duration) -> Result<Vec<Box<dyn PendingJoiner>>> {
        let desk = &self.world.desk;
        let deadline = Instant::now() + timeout;
        let mut state = lock(&desk.state);
        while state.waiting.len() < count as usize {
            let now = Instant::now();
            if now >= deadline {
                return Err(CollectiveError::Timeout {
                    peer: None,
                    op: "grow (waiting for joiners)",
                    after: timeout,
                });
            }
            state = match desk.arrived.wait_timeout(state, deadline - now) {
                Ok((guard, _)) => guard,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
        Ok(state
            .waiting
            .drain(..count as usize)
            .map(|ticket| Box::new(ticket) as Box<dyn PendingJoiner>)
            .collect())
    }

    fn plan_world(&self, size: u32) -> Result<Vec<u8>> {
        let ranks = MemTransport::fan_out_in(size, self.op_timeout, Arc::clone(&self.world.desk));
        let mut state = lock(&self.world.desk.state);
        state.next_id += 1;
        let id = state.next_id;
        state
            .worlds
            .insert(id, ranks.into_iter().map(Some).collect());
        Ok(id.to_le_bytes().to_vec())
    }

    fn successor(&self, plan: &[u8], rank: u32, size: u32) -> Result<Arc<dyn Transport>> {
        Ok(claim(&self.world.desk, plan, rank, size)? as Arc<dyn Transport>)
    }
}
