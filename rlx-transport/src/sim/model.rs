//! The cost model of the simulated network, pure arithmetic on virtual nanoseconds: which
//! links a message crosses between two ranks of a [`Shape`], and how long each takes.
//!
//! A message of `b` bytes leaves its sender after the sender's per-message `overhead`, once
//! the first link of its route is free; it occupies that link for `b / rate`, crosses the
//! route's `hops` links with `latency` each (cut-through: the bytes stream through the ranks
//! between, which forward them as they come), and is received once the last link of the route
//! has carried it, after the links's earlier messages, plus the receiver's `overhead`. Every
//! link carries one direction: a cable's two directions, and a rank's port to a switch up and
//! down, are independent, as full-duplex Ethernet and Thunderbolt are.
//!
//! Links between are not charged: on a ring or chain a message that crosses other ranks
//! delays nobody's traffic on the middle cables. That keeps every charge in the order one
//! rank's own thread issues it, so that the simulated time of a single-threaded algorithm does
//! not depend on how the threads happen to be scheduled.

use std::fmt;
use std::time::Duration;

/// How the ranks are joined.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// Every rank has one port to a switch (the usual Ethernet cluster).
    Star,
    /// A cable between every pair of ranks (a Thunderbolt mesh).
    Mesh,
    /// A cable between each rank and the next, the last joined to the first; a message goes
    /// the shorter way round.
    Ring,
    /// A cable between each rank and the next, the ends not joined.
    Chain,
}

impl Shape {
    /// The shape's name in flags and tables.
    pub fn name(self) -> &'static str {
        match self {
            Shape::Star => "star",
            Shape::Mesh => "mesh",
            Shape::Ring => "ring",
            Shape::Chain => "chain",
        }
    }

    /// The shape named `name` (as [`Shape::name`] spells it).
    pub fn parse(name: &str) -> Option<Shape> {
        [Shape::Star, Shape::Mesh, Shape::Ring, Shape::Chain]
            .into_iter()
            .find(|shape| shape.name() == name)
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One direction of one link.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Link {
    /// Rank `r`'s port towards the switch.
    Up(u32),
    /// The switch's port towards rank `r`.
    Down(u32),
    /// The cable from one rank to another, in that direction.
    Cable(u32, u32),
}

/// The links a message crosses from one rank to another.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Route {
    /// The link it leaves its sender by.
    pub first: Link,
    /// The link it reaches its receiver by (the same as `first` on a direct cable).
    pub last: Link,
    /// How many links it crosses, each adding the latency.
    pub hops: u32,
}

/// The network every simulated message crosses.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Model {
    /// How the ranks are joined.
    pub shape: Shape,
    /// The latency of one link (α).
    pub latency: Duration,
    /// What one link carries each second, in each direction (β, in bytes).
    pub bytes_per_second: f64,
    /// What a rank spends on each message it sends or receives, besides the wire.
    pub overhead: Duration,
}

impl Model {
    /// A model of `shape` with links of `bits_per_second`, `latency` and `overhead`.
    pub fn new(shape: Shape, bits_per_second: f64, latency: Duration, overhead: Duration) -> Self {
        Model {
            shape,
            latency,
            bytes_per_second: bits_per_second / 8.0,
            overhead,
        }
    }

    /// The route from `from` to `to` in a world of `world` ranks (`from != to`).
    pub fn route(&self, world: u32, from: u32, to: u32) -> Route {
        let direct = Route {
            first: Link::Cable(from, to),
            last: Link::Cable(from, to),
            hops: 1,
        };
        match self.shape {
            Shape::Star => Route {
                first: Link::Up(from),
                last: Link::Down(to),
                hops: 1,
            },
            Shape::Mesh => direct,
            Shape::Ring => {
                let forward = (to + world - from) % world;
                let backward = world - forward;
                let step = |r: u32, ahead: bool| {
                    if ahead {
                        (r + 1) % world
                    } else {
                        (r + world - 1) % world
                    }
                };
                let ahead = forward <= backward;
                Route {
                    first: Link::Cable(from, step(from, ahead)),
                    last: Link::Cable(step(to, !ahead), to),
                    hops: forward.min(backward),
                }
            }
            Shape::Chain => {
                let ahead = to > from;
                let (next, before) = if ahead {
                    (from + 1, to - 1)
                } else {
                    (from - 1, to + 1)
                };
                Route {
                    first: Link::Cable(from, next),
                    last: Link::Cable(before, to),
                    hops: from.abs_diff(to),
                }
            }
        }
    }

    /// How long `bytes` occupy one link, in nanoseconds.
    pub fn occupancy_ns(&self, bytes: u64) -> u64 {
        if bytes == 0 || self.bytes_per_second <= 0.0 {
            return 0;
        }
        (bytes as f64 / self.bytes_per_second * 1e9).ceil() as u64
    }

    /// The latency of `hops` links, in nanoseconds.
    pub fn latency_ns(&self, hops: u32) -> u64 {
        nanos(self.latency).saturating_mul(u64::from(hops))
    }

    /// The per-message overhead, in nanoseconds.
    pub fn overhead_ns(&self) -> u64 {
        nanos(self.overhead)
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(shape: Shape) -> Model {
        Model::new(
            shape,
            8e9,
            Duration::from_micros(2),
            Duration::from_nanos(500),
        )
    }

    #[test]
    fn routes_follow_the_shape() {
        let star = model(Shape::Star).route(8, 3, 5);
        assert_eq!(
            (star.first, star.last, star.hops),
            (Link::Up(3), Link::Down(5), 1)
        );
        let mesh = model(Shape::Mesh).route(8, 3, 5);
        assert_eq!(
            (mesh.first, mesh.last, mesh.hops),
            (Link::Cable(3, 5), Link::Cable(3, 5), 1)
        );
        // Round the short way: 7 -> 0 -> 1 forwards, 1 -> 0 -> 7 backwards.
        let ring = model(Shape::Ring);
        let r = ring.route(8, 7, 1);
        assert_eq!(
            (r.first, r.last, r.hops),
            (Link::Cable(7, 0), Link::Cable(0, 1), 2)
        );
        let r = ring.route(8, 1, 7);
        assert_eq!(
            (r.first, r.last, r.hops),
            (Link::Cable(1, 0), Link::Cable(0, 7), 2)
        );
        let r = ring.route(8, 2, 3);
        assert_eq!(
            (r.first, r.last, r.hops),
            (Link::Cable(2, 3), Link::Cable(2, 3), 1)
        );
        let chain = model(Shape::Chain);
        let c = chain.route(8, 7, 0);
        assert_eq!(
            (c.first, c.last, c.hops),
            (Link::Cable(7, 6), Link::Cable(1, 0), 7)
        );
        let c = chain.route(8, 2, 4);
        assert_eq!(
            (c.first, c.last, c.hops),
            (Link::Cable(2, 3), Link::Cable(3, 4), 2)
        );
    }

    #[test]
    fn times_are_whole_nanoseconds() {
        let m = model(Shape::Star);
        // 8 Gbit/s is one byte a nanosecond.
        assert_eq!(m.occupancy_ns(1000), 1000);
        assert_eq!(m.occupancy_ns(0), 0);
        assert_eq!(m.latency_ns(3), 6000);
        assert_eq!(m.overhead_ns(), 500);
        assert_eq!(Shape::parse("chain"), Some(Shape::Chain));
        assert_eq!(Shape::parse("torus"), None);
    }
}
