//! [`SimTransport`]: a world of thread ranks on a virtual clock, so that the collectives that
//! ship can be timed on networks and at world sizes this machine does not have.
//!
//! Messages travel as over [`MemTransport`] (real threads, real matching, real bytes), each
//! carrying the virtual moment it reaches its receiver, which the sender computes from the
//! [`Model`] (`model.rs`): the link it leaves by is busy for the message's length over the link
//! rate, and the route adds a latency per link. A receive moves the receiver's clock to when
//! the message has arrived (after the earlier messages on its incoming link) plus the
//! per-message overhead. Nothing reads a real clock for the model: the simulated time of an
//! algorithm that runs one thread per rank depends only on what each rank sends and receives
//! in its program order, so it is the same in every run, however many ranks share the two
//! cores. A rank's threads keep clocks of their own (the direct plans of a cable mesh run one
//! per cable): a thread the rank's owner starts begins where the owner stood, and the owner
//! goes on from the latest of them (`SimTransport::thread_clock`), so those plans are timed
//! as their cables run, at once. The owner catches up at every call, not only once its threads
//! are joined: an owner that exchanges beside its threads (as `per_cable::concurrently` in
//! `rlx-collective` does) starts after them, which makes such rows pessimistic and lets them
//! depend on the threads' order.
//!
//! What the model leaves out, on purpose: the cost of reductions (the transport does not see
//! them; the simulated time is the network's), contention on the middle links of a route
//! (`model.rs` says why), and the real timeouts, which still run on the real clock.

mod model;

use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::thread::ThreadId;
use std::time::Duration;

pub use model::{Link, Model, Route, Shape};

use crate::topology::Subnet;
use crate::{CollectiveError, MemTransport, Result, Tag, Topology, Transport};

/// The bytes before every payload: the virtual nanosecond its message reaches its receiver.
const STAMP_LEN: usize = 8;

thread_local! {
    /// This thread's clock for each rank it uses without owning it, by the rank's address
    /// (see [`SimTransport::thread_clock`]).
    static THREAD_CLOCKS: RefCell<HashMap<usize, u64>> = RefCell::new(HashMap::new());
}

/// What the ranks of one simulated world share: the model, each rank's clock and when each
/// link is next free.
struct Ledger {
    model: Model,
    world: u32,
    /// Each rank's clock as its owner thread (the first to use it) last left it, in
    /// nanoseconds: where the threads it starts begin.
    clocks: Vec<AtomicU64>,
    /// Each rank's latest moment over all its threads: when it finished what it did.
    latest: Vec<AtomicU64>,
    /// When each link that carried something is free again, in virtual nanoseconds, booked by
    /// senders (`Side::Sending`) and receivers (`Side::Receiving`) apart.
    links: Mutex<HashMap<(Link, Side), u64>>,
}

/// Who books a link: its senders, in the order each issues its sends, or its receivers, in
/// the order each takes its messages. The two never book one entry, so that no booking
/// depends on how a sender's and a receiver's threads interleave (a ring's cable carries its
/// sender's own messages and the messages forwarded over it, booked by either end).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Side {
    Sending,
    Receiving,
}

impl Ledger {
    /// Books `link` for `side` for `occupancy` nanoseconds from `ready` on, or from when it is
    /// free if later; returns when the booking begins.
    fn book(&self, link: Link, side: Side, ready: u64, occupancy: u64) -> u64 {
        let mut links = self.links.lock().unwrap_or_else(PoisonError::into_inner);
        let free = links.entry((link, side)).or_insert(0);
        let start = ready.max(*free);
        *free = start.saturating_add(occupancy);
        start
    }
}

/// One rank of a simulated world; see the module docs.
pub struct SimTransport {
    rank: u32,
    /// The thread that used this rank first (see [`SimTransport::thread_clock`]).
    owner: OnceLock<ThreadId>,
    inner: Arc<MemTransport>,
    ledger: Arc<Ledger>,
    topology: Option<Topology>,
}

impl fmt::Debug for SimTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimTransport")
            .field("rank", &self.rank)
            .field("world", &self.ledger.world)
            .field("model", &self.ledger.model)
            .finish()
    }
}

impl SimTransport {
    /// The ranks of a simulated world of `world` ranks on `model`, each at virtual time zero.
    /// Meshes, rings and chains report their cables as the link matrix
    /// ([`Transport::topology`]), so that the collectives plan for them as on real cables.
    pub fn fan_out(world: u32, model: Model) -> Vec<Arc<SimTransport>> {
        let ledger = Arc::new(Ledger {
            model,
            world,
            clocks: (0..world).map(|_| AtomicU64::new(0)).collect(),
            latest: (0..world).map(|_| AtomicU64::new(0)).collect(),
            links: Mutex::new(HashMap::new()),
        });
        let topology = cabling(world, model.shape);
        MemTransport::fan_out(world)
            .into_iter()
            .enumerate()
            .map(|(rank, inner)| {
                Arc::new(SimTransport {
                    rank: rank as u32,
                    owner: OnceLock::new(),
                    inner,
                    ledger: Arc::clone(&ledger),
                    topology: topology.clone(),
                })
            })
            .collect()
    }

    /// This rank's virtual time.
    pub fn now(&self) -> Duration {
        Duration::from_nanos(self.ledger.latest[self.rank as usize].load(Ordering::Relaxed))
    }

    /// The latest virtual time of any rank of the world: when the last of them finished.
    pub fn world_now(&self) -> Duration {
        let latest = self
            .ledger
            .latest
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .max()
            .unwrap_or(0);
        Duration::from_nanos(latest)
    }

    /// The calling thread's clock for this rank. Each thread of a rank has a clock of its own,
    /// so that threads that exchange over different cables at once (the direct plans of a
    /// mesh) do not wait for each other's messages. The first thread to use the rank owns it:
    /// a thread it starts begins at the owner's clock (the moment it forked them, since the
    /// owner waits meanwhile), and the owner, when it goes on, begins from the latest moment
    /// of all of them (the moment it joined them).
    fn thread_clock(&self) -> u64 {
        let rank = self.rank as usize;
        if self.owns() {
            let own = self.ledger.clocks[rank].load(Ordering::Relaxed);
            return own.max(self.ledger.latest[rank].load(Ordering::Relaxed));
        }
        let forked = || self.ledger.clocks[rank].load(Ordering::Relaxed);
        THREAD_CLOCKS.with(|clocks| *clocks.borrow_mut().entry(self.key()).or_insert_with(forked))
    }

    /// Sets the calling thread's clock for this rank to `moment`.
    fn set_thread_clock(&self, moment: u64) {
        let rank = self.rank as usize;
        if self.owns() {
            self.ledger.clocks[rank].store(moment, Ordering::Relaxed);
        } else {
            THREAD_CLOCKS.with(|clocks| clocks.borrow_mut().insert(self.key(), moment));
        }
        self.ledger.latest[rank].fetch_max(moment, Ordering::Relaxed);
    }

    /// Whether the calling thread owns this rank (the first thread to ask does).
    fn owns(&self) -> bool {
        let me = std::thread::current().id();
        *self.owner.get_or_init(|| me) == me
    }

    /// What tells this rank apart from every other in a thread's clocks.
    fn key(&self) -> usize {
        std::ptr::from_ref(self) as usize
    }

    /// The virtual moment a message of `bytes` sent now to `to` reaches it (and books the
    /// link it leaves by).
    fn dispatch(&self, to: u32, bytes: u64) -> u64 {
        let ledger = &self.ledger;
        let model = &ledger.model;
        let ready = self.thread_clock().saturating_add(model.overhead_ns());
        self.set_thread_clock(ready);
        if to == self.rank {
            return ready;
        }
        let route = model.route(ledger.world, self.rank, to);
        let occupancy = model.occupancy_ns(bytes);
        let start = ledger.book(route.first, Side::Sending, ready, occupancy);
        start
            .saturating_add(model.latency_ns(route.hops))
            .saturating_add(occupancy)
    }

    /// Receives a message of `bytes` from `from` that reaches this rank at `arrival`: after
    /// the earlier messages on its incoming link, and this rank's overhead.
    fn take(&self, from: u32, arrival: u64, bytes: u64) {
        let ledger = &self.ledger;
        let model = &ledger.model;
        let mut done = arrival;
        if from != self.rank {
            let route = model.route(ledger.world, from, self.rank);
            if route.last != route.first {
                let occupancy = model.occupancy_ns(bytes);
                let ready = arrival.saturating_sub(occupancy);
                let start = ledger.book(route.last, Side::Receiving, ready, occupancy);
                done = start.saturating_add(occupancy);
            }
        }
        let now = self.thread_clock().max(done);
        self.set_thread_clock(now.saturating_add(model.overhead_ns()));
    }

    /// Splits a received message into its stamp and payload, and charges its receipt.
    fn unstamp(&self, from: u32, mut message: Vec<u8>) -> Result<Vec<u8>> {
        let stamp = message
            .get(..STAMP_LEN)
            .and_then(|s| <[u8; STAMP_LEN]>::try_from(s).ok())
            .ok_or_else(|| {
                CollectiveError::protocol(
                    Some(from),
                    format!("simulated message lacks its {STAMP_LEN}-byte time stamp"),
                )
            })?;
        message.drain(..STAMP_LEN);
        self.take(from, u64::from_le_bytes(stamp), message.len() as u64);
        Ok(message)
    }
}

/// The link matrix of the cables of `shape` (`None` for a star, whose ranks share a switch as
/// in a plain cluster): each cable a /30 of its own, as the cablings of the test cluster.
fn cabling(world: u32, shape: Shape) -> Option<Topology> {
    let cables: Vec<(u32, u32)> = match shape {
        Shape::Star => return None,
        Shape::Mesh => (0..world)
            .flat_map(|a| (a + 1..world).map(move |b| (a, b)))
            .collect(),
        Shape::Ring if world > 2 => (0..world).map(|a| (a, (a + 1) % world)).collect(),
        Shape::Ring | Shape::Chain => (1..world).map(|b| (b - 1, b)).collect(),
    };
    let mut networks: Vec<Vec<Subnet>> = vec![Vec::new(); world as usize];
    for (i, &(a, b)) in cables.iter().enumerate() {
        let base = 0x0a00_0000u32.wrapping_add((i as u32) << 2);
        for (end, rank) in [(1, a), (2, b)] {
            networks[rank as usize].push(Subnet {
                addr: IpAddr::V4(Ipv4Addr::from(base + end)),
                prefix: 30,
            });
        }
    }
    Some(Topology::from_networks(&networks))
}

impl Transport for SimTransport {
    fn rank(&self) -> u32 {
        self.rank
    }

    fn world_size(&self) -> u32 {
        self.ledger.world
    }

    fn send_message(&self, to: u32, tag: Tag, parts: &[&[u8]]) -> Result<()> {
        if to >= self.ledger.world {
            return Err(CollectiveError::UnknownRank {
                rank: to,
                world_size: self.ledger.world,
            });
        }
        let bytes: u64 = parts.iter().map(|p| p.len() as u64).sum();
        let stamp = self.dispatch(to, bytes).to_le_bytes();
        let mut stamped: Vec<&[u8]> = Vec::with_capacity(parts.len() + 1);
        stamped.push(&stamp);
        stamped.extend_from_slice(parts);
        self.inner.send_message(to, tag, &stamped)
    }

    fn recv_message(&self, from: u32, tag: Tag, timeout: Duration) -> Result<Option<Vec<u8>>> {
        match self.inner.recv_message(from, tag, timeout)? {
            Some(message) => self.unstamp(from, message).map(Some),
            None => Ok(None),
        }
    }

    fn unreceived_from(&self, from: u32) -> Vec<(Tag, u64)> {
        let stamp = STAMP_LEN as u64;
        self.inner
            .unreceived_from(from)
            .into_iter()
            .map(|(tag, len)| (tag, len.saturating_sub(stamp)))
            .collect()
    }

    fn topology(&self) -> Option<Topology> {
        self.topology.clone()
    }

    fn op_timeout(&self) -> Duration {
        self.inner.op_timeout()
    }

    fn abort(&self) {
        self.inner.abort();
    }

    fn exclude_peer(&self, peer: u32) -> Result<()> {
        self.inner.exclude_peer(peer)
    }

    fn excluded_by(&self, peer: u32) -> bool {
        self.inner.excluded_by(peer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn star(world: u32) -> Vec<Arc<SimTransport>> {
        // 8 Gbit/s: a byte a nanosecond; 1 µs a link, 100 ns a message.
        let model = Model::new(
            Shape::Star,
            8e9,
            Duration::from_micros(1),
            Duration::from_nanos(100),
        );
        SimTransport::fan_out(world, model)
    }

    #[test]
    fn a_message_costs_its_latency_bytes_and_overheads() {
        let world = star(2);
        let tag = Tag::user(1).expect("a user tag");
        world[0]
            .send_message(1, tag, &[&[7u8; 1000]])
            .expect("send");
        let got = world[1]
            .recv_message(0, tag, Duration::from_secs(10))
            .expect("recv")
            .expect("a message");
        assert_eq!(got, vec![7u8; 1000]);
        // Sender: 100 ns overhead; wire: 1000 ns latency + 1000 ns bytes; receiver: 100 ns.
        assert_eq!(world[0].now(), Duration::from_nanos(100));
        assert_eq!(world[1].now(), Duration::from_nanos(2200));
        assert_eq!(world[0].world_now(), Duration::from_nanos(2200));
    }

    #[test]
    fn messages_into_one_port_queue_behind_each_other() {
        let world = star(3);
        let tag = Tag::user(1).expect("a user tag");
        for from in [0, 1] {
            world[from]
                .send_message(2, tag, &[&[1u8; 1000]])
                .expect("send");
        }
        for from in [0, 1] {
            world[2]
                .recv_message(from, tag, Duration::from_secs(10))
                .expect("recv")
                .expect("a message");
        }
        // Both arrive at 2100 on their own; the switch's port to rank 2 carries the second
        // after the first: 2100 + 100 (overhead), then 3100 + 100.
        assert_eq!(world[2].now(), Duration::from_nanos(3200));
    }

    #[test]
    fn threads_of_one_rank_exchange_over_their_cables_at_once() {
        let model = Model::new(
            Shape::Mesh,
            8e9,
            Duration::from_micros(1),
            Duration::from_nanos(100),
        );
        let world = SimTransport::fan_out(3, model);
        let tag = Tag::user(1).expect("a user tag");
        let wait = Duration::from_secs(10);
        std::thread::scope(|scope| {
            for peer in [1, 2] {
                let rank = &world[peer as usize];
                scope.spawn(move || {
                    let got = rank.recv_message(0, tag, wait).expect("recv");
                    rank.send_message(0, tag, &[&got.expect("a message")])
                });
            }
            // Rank 0's own thread uses it first (a message to itself: 200 ns), then forks a
            // thread per cable.
            world[0].send_message(0, tag, &[]).expect("send to self");
            world[0].recv_message(0, tag, wait).expect("recv from self");
            std::thread::scope(|cables| {
                for peer in [1, 2] {
                    let zero = &world[0];
                    cables.spawn(move || {
                        zero.send_message(peer, tag, &[&[9u8; 1000]])?;
                        zero.recv_message(peer, tag, wait)
                    });
                }
            });
        });
        // Each cable alone: out 300 + 2000 = 2300, the peer's turn 200, back 2000, in 100.
        assert_eq!(world[0].now(), Duration::from_nanos(4600));
    }

    #[test]
    fn a_cabled_shape_reports_its_cables() {
        let model = Model::new(Shape::Chain, 8e9, Duration::ZERO, Duration::ZERO);
        let world = SimTransport::fan_out(4, model);
        let topology = world[0].topology().expect("a chain has cables");
        assert_eq!(topology.reach(0, 1), crate::Reach::Cable);
        assert!(!matches!(topology.reach(0, 2), crate::Reach::Cable));
        assert!(star(2)[0].topology().is_none());
    }
}
