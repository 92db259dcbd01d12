//! What a group knows of its members' cables, from the link matrix of its transport: the
//! order of its rings, its islands, its line of cables, whether a cable joins every pair; the
//! settings `Auto` chooses by; and which algorithms that follow the cables the group can run.
//! Made once, when the group is, and said at `info`.

use rlx_transport::{Reach, Topology};

use crate::cable_path::CablePath;
use crate::islands::Islands;
use crate::op::CableView;
use crate::ring_order::RingOrder;
use crate::select::{Algorithm, CableShape, Settings};

/// See the module docs.
#[derive(Debug)]
pub(super) struct CablePlan {
    ring_order: RingOrder,
    islands: Option<Islands>,
    chain: Option<CablePath>,
    cabled_mesh: bool,
    /// Whether a cable joins some members (the flat plans are for switches and one host).
    any_cable: bool,
}

impl CablePlan {
    /// The plan of a new group `group_id` of `size` members whose link matrix is `topology`.
    pub(super) fn of(topology: Option<&Topology>, size: u32, group_id: u16) -> CablePlan {
        let plan = CablePlan {
            ring_order: RingOrder::following(topology, size),
            islands: Islands::find(topology, size),
            chain: CablePath::find(topology, size),
            cabled_mesh: topology.is_some_and(Topology::is_cable_mesh),
            any_cable: topology.is_some_and(|t| {
                (0..size).any(|a| (a + 1..size).any(|b| t.reach(a, b) == Reach::Cable))
            }),
        };
        plan.say(topology, size, group_id);
        plan
    }

    /// Says at `info` every way the cables change the plans.
    fn say(&self, topology: Option<&Topology>, size: u32, group_id: u16) {
        let order = &self.ring_order;
        if let Some(topology) = topology.filter(|_| !order.is_rank_order()) {
            tracing::info!(
                group = group_id,
                ring = %order,
                rank_order_routed_hops = RingOrder::ranks(size).routed_hops(topology).len(),
                routed_hops = order.routed_hops(topology).len(),
                "rings follow the cables: ring order {order}"
            );
        }
        if let Some(islands) = &self.islands {
            tracing::info!(
                group = group_id,
                %islands,
                "{} islands of cables joined by a slower network: {islands}; large all-reduces \
                 run in two levels (inside each island, then across on 1/{} of the data)",
                islands.count(),
                islands.island_size()
            );
        }
        if let Some(path) = &self.chain {
            tracing::info!(
                group = group_id,
                line = ?path.ranks(),
                "the members are cabled in a line: large all-reduces run along it both ways"
            );
        }
        if self.cabled_mesh {
            tracing::info!(
                group = group_id,
                "a cable joins every pair of members: all-reduce and all-gather exchange with \
                 every peer at once"
            );
        }
    }

    /// The settings `Auto` chooses by on this cabling.
    pub(super) fn settings(&self) -> Settings {
        let cables = if self.cabled_mesh {
            CableShape::Mesh
        } else if self.islands.is_some() {
            CableShape::Islands
        } else if self.chain.is_some() {
            CableShape::Line
        } else if self.any_cable {
            CableShape::OtherCables
        } else {
            CableShape::Flat
        };
        Settings {
            cables,
            ..Settings::default()
        }
    }

    /// The order of the group's rings.
    pub(super) fn ring_order(&self) -> &RingOrder {
        &self.ring_order
    }

    /// What an operation's context sees of the plan.
    pub(super) fn view(&self) -> CableView<'_> {
        CableView {
            ring_order: &self.ring_order,
            islands: self.islands.as_ref(),
            chain: self.chain.as_ref(),
        }
    }

    /// Whether the cabling lets `algorithm` run (every algorithm that does not follow the
    /// cables can).
    pub(super) fn allows(&self, algorithm: Algorithm) -> bool {
        match algorithm {
            Algorithm::TwoLevel => self.islands.is_some(),
            Algorithm::BidirectionalChain => self.chain.is_some(),
            _ => true,
        }
    }
}

/// The cabling an algorithm that follows the cables needs, in words, for the error of a group
/// that lacks it.
pub(super) fn needed_by(algorithm: Algorithm) -> Option<&'static str> {
    match algorithm {
        Algorithm::TwoLevel => Some(
            "islands: at least two groups of members, all of the same size (two or more), \
             joined among themselves by cables and to each other only by a switch or routes",
        ),
        Algorithm::BidirectionalChain => Some(
            "members cabled in a line: three or more, each cabled to the one before and the \
             one after it and to no other",
        ),
        _ => None,
    }
}
