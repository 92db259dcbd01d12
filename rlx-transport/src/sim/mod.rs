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
//! cores. Algorithms that run several threads per rank (the direct plans of a cable mesh)
//! charge the rank's clock from each thread, which depends on their order only where two
//! threads use one link.
//!
//! What the model leaves out, on purpose: the cost of reductions (the transport does not see
//! them; the simulated time is the network's), contention on the middle links of a route
//! (`model.rs` says why), and the real timeouts, which still run on the real clock.

mod model;

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

pub use model::{Link, Model, Route, Shape};

use crate::topology::Subnet;
use crate::{CollectiveError, MemTransport, Result, Tag, Topology, Transport};

/// The bytes before every payload: the virtual nanosecond its message reaches its receiver.
const STAMP_LEN: usize = 8;

/// What the ranks of one simulated world share: the model, each rank's clock and when each
/// link is next free.
struct Ledger {
    model: Model,
    world: u32,
    /// Each rank's virtual now, in nanoseconds.
    clocks: Vec<AtomicU64>,
    /// When each link that carried something is free again, in virtual nanoseconds.
    links: Mutex<HashMap<Link, u64>>,
}

impl Ledger {
    /// Books `link` for `occupancy` nanoseconds from `ready` on, or from when it is free if
    /// later; returns when the booking begins.
    fn book(&self, link: Link, ready: u64, occupancy: u64) -> u64 {
        let mut links = self.links.lock().unwrap_or_else(PoisonError::into_inner);
        let free = links.entry(link).or_insert(0);
        let start = ready.max(*free);
        *free = start.saturating_add(occupancy);
        start
    }

    /// Moves `rank`'s clock to at least `moment`, then on by `step`; returns the new time.
    fn advance(&self, rank: u32, moment: u64, step: u64) -> u64 {
        let clock = &self.clocks[rank as usize];
        let mut now = clock.load(Ordering::Relaxed);
        loop {
            let next = now.max(moment).saturating_add(step);
            match clock.compare_exchange_weak(now, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return next,
                Err(seen) => now = seen,
            }
        }
    }
}

/// One rank of a simulated world; see the module docs.
pub struct SimTransport {
    rank: u32,
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
            links: Mutex::new(HashMap::new()),
        });
        let topology = cabling(world, model.shape);
        MemTransport::fan_out(world)
            .into_iter()
            .enumerate()
            .map(|(rank, inner)| {
                Arc::new(SimTransport {
                    rank: rank as u32,
                    inner,
                    ledger: Arc::clone(&ledger),
                    topology: topology.clone(),
                })
            })
            .collect()
    }

    /// This rank's virtual time.
    pub fn now(&self) -> Duration {
        Duration::from_nanos(self.ledger.clocks[self.rank as usize].load(Ordering::Relaxed))
    }

    /// The latest virtual time of any rank of the world: when the last of them finished.
    pub fn world_now(&self) -> Duration {
        let latest = self
            .ledger
            .clocks
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .max()
            .unwrap_or(0);
        Duration::from_nanos(latest)
    }

    /// The virtual moment a message of `bytes` sent now to `to` reaches it (and books the
    /// link it leaves by).
    fn dispatch(&self, to: u32, bytes: u64) -> u64 {
        let ledger = &self.ledger;
        let model = &ledger.model;
        let ready = ledger.advance(self.rank, 0, model.overhead_ns());
        if to == self.rank {
            return ready;
        }
        let route = model.route(ledger.world, self.rank, to);
        let occupancy = model.occupancy_ns(bytes);
        let start = ledger.book(route.first, ready, occupancy);
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
                let start = ledger.book(route.last, arrival.saturating_sub(occupancy), occupancy);
                done = start.saturating_add(occupancy);
            }
        }
        ledger.advance(self.rank, done, model.overhead_ns());
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
    fn a_cabled_shape_reports_its_cables() {
        let model = Model::new(Shape::Chain, 8e9, Duration::ZERO, Duration::ZERO);
        let world = SimTransport::fan_out(4, model);
        let topology = world[0].topology().expect("a chain has cables");
        assert_eq!(topology.reach(0, 1), crate::Reach::Cable);
        assert!(!matches!(topology.reach(0, 2), crate::Reach::Cable));
        assert!(star(2)[0].topology().is_none());
    }
}
