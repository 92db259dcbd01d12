//! How every rank of a cabled topology reaches every other: each rank has an address of its
//! own on `lo` (its identity, in 10.215.0.0/16), and a host route to every other rank's
//! identity through the first link of the cheapest path there, with its own identity as the
//! source. A rank forwards what is not for it (IP forwarding is on in every rank namespace), so
//! in a chain or a ring a message to a rank without a cable crosses the ranks between, as it
//! would between machines that route for each other; the transports see one address per rank
//! and need to know nothing of the cables.
//!
//! A hop over a cable costs 2 and a hop over the switch 3: a direct cable wins over the
//! switch, and the switch wins over two cables (a chain with a switch alongside reaches its
//! far ranks over the switch, as islands reach each other).

use std::net::Ipv4Addr;

use super::cabling::{Plan, star_address};

/// The cost of a hop over a cable.
const CABLE_HOP: u32 = 2;
/// The cost of a hop over the switch.
const SWITCH_HOP: u32 = 3;

/// `rank`'s identity: its address on `lo`, which every other rank has a route to.
pub fn identity_address(rank: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 215, 0, 0)) + rank + 1)
}

/// A host route of one rank: to `to`'s identity, through `via` on its interface `ifname`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    /// The rank the route reaches.
    pub to: u32,
    /// The next hop: the neighbour's address on the link.
    pub via: Ipv4Addr,
    /// The interface the route leaves by.
    pub ifname: String,
}

/// One step out of a rank: a neighbour, the cost, the neighbour's address on the link and the
/// interface the step leaves by.
struct Step {
    to: u32,
    cost: u32,
    via: Ipv4Addr,
    ifname: String,
}

impl Plan {
    /// The steps out of `rank`: over each of its cables, then over the switch to every other
    /// rank of `world`.
    fn steps_from(&self, rank: u32, world: u32) -> Vec<Step> {
        let mut steps = Vec::new();
        for link in self.links_of(rank) {
            match link.peer {
                Some(peer) => {
                    let cable = self
                        .cables
                        .iter()
                        .find(|c| c.ends.contains(&rank) && c.ends.contains(&peer));
                    if let Some(cable) = cable {
                        steps.push(Step {
                            to: peer,
                            cost: CABLE_HOP,
                            via: cable.address(peer),
                            ifname: link.ifname,
                        });
                    }
                }
                None => steps.extend((0..world).filter(|r| *r != rank).map(|to| Step {
                    to,
                    cost: SWITCH_HOP,
                    via: star_address(to),
                    ifname: link.ifname.clone(),
                })),
            }
        }
        steps
    }

    /// `rank`'s routes to every other rank of `world` it can reach, each through the first
    /// step of a cheapest path (ties go to the step listed first: cables by peer, then the
    /// switch).
    pub fn routes_of(&self, rank: u32, world: u32) -> Vec<Route> {
        let n = world as usize;
        let steps: Vec<Vec<Step>> = (0..world).map(|r| self.steps_from(r, world)).collect();
        // Dijkstra over at most a few hundred ranks: the quadratic scan is plenty.
        let mut cost = vec![u32::MAX; n];
        let mut first: Vec<Option<usize>> = vec![None; n];
        let mut done = vec![false; n];
        cost[rank as usize] = 0;
        for _ in 0..n {
            let Some(at) = (0..n)
                .filter(|&r| !done[r] && cost[r] != u32::MAX)
                .min_by_key(|&r| cost[r])
            else {
                break;
            };
            done[at] = true;
            for (index, step) in steps[at].iter().enumerate() {
                let to = step.to as usize;
                let through = cost[at] + step.cost;
                if through < cost[to] {
                    cost[to] = through;
                    first[to] = if at == rank as usize {
                        Some(index)
                    } else {
                        first[at]
                    };
                }
            }
        }
        let own = &steps[rank as usize];
        (0..world)
            .filter_map(|to| {
                let step = &own[first[to as usize]?];
                Some(Route {
                    to,
                    via: step.via,
                    ifname: step.ifname.clone(),
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::super::cabling::{Cabling, plan};
    use super::*;

    /// `rank`'s routes as (to, interface) pairs.
    fn routes(topology: &str, world: u32, rank: u32) -> Vec<(u32, String)> {
        let plan = plan(&topology.parse::<Cabling>().unwrap(), world).unwrap();
        plan.routes_of(rank, world)
            .into_iter()
            .map(|r| (r.to, r.ifname))
            .collect()
    }

    fn named(pairs: &[(u32, &str)]) -> Vec<(u32, String)> {
        pairs.iter().map(|(r, i)| (*r, (*i).to_owned())).collect()
    }

    #[test]
    fn a_mesh_reaches_every_rank_over_its_own_cable() {
        let expected = named(&[
            (0, "thunderbolt0"),
            (2, "thunderbolt1"),
            (3, "thunderbolt2"),
        ]);
        assert_eq!(routes("mesh", 4, 1), expected);
        assert_eq!(routes("mesh+star", 4, 1), expected);
    }

    #[test]
    fn a_chain_goes_through_the_ranks_between_unless_a_switch_is_shorter() {
        // Rank 0 of 0-1-2-3: everything leaves by its one cable, to rank 1.
        let chain = "thunderbolt0";
        assert_eq!(
            routes("chain", 4, 0),
            named(&[(1, chain), (2, chain), (3, chain)])
        );
        let plan = plan(&"chain".parse::<Cabling>().unwrap(), 4).unwrap();
        let to_three = &plan.routes_of(0, 4)[2];
        assert_eq!(to_three.via.to_string(), "10.214.0.2");
        // With a switch, the far ranks are one switch hop away.
        assert_eq!(
            routes("chain+star", 4, 0),
            named(&[(1, chain), (2, "eth0"), (3, "eth0")])
        );
        // A ring goes the short way round: rank 0 reaches 3 over its own cable.
        assert_eq!(
            routes("ring", 5, 0),
            named(&[
                (1, "thunderbolt0"),
                (2, "thunderbolt0"),
                (3, "thunderbolt1"),
                (4, "thunderbolt1")
            ])
        );
    }

    #[test]
    fn ranks_numbered_against_the_cabling_route_along_the_cables() {
        // The chain 0-2-1-3: rank 0's one cable goes to rank 2, which forwards to 1 and 3.
        let plan = plan(&"chain:0-2-1-3".parse::<Cabling>().unwrap(), 4).unwrap();
        let routes = plan.routes_of(0, 4);
        assert!(routes.iter().all(|r| r.ifname == "thunderbolt0"));
        assert!(routes.iter().all(|r| r.via.to_string() == "10.214.0.2"));
        let from_one: Vec<(u32, String)> = plan
            .routes_of(1, 4)
            .into_iter()
            .map(|r| (r.to, r.ifname))
            .collect();
        assert_eq!(
            from_one,
            named(&[
                (0, "thunderbolt0"),
                (2, "thunderbolt0"),
                (3, "thunderbolt1")
            ])
        );
    }

    #[test]
    fn islands_meet_over_the_switch() {
        assert_eq!(
            routes("islands:2x2", 4, 2),
            named(&[(0, "eth0"), (1, "eth0"), (3, "thunderbolt0")])
        );
        let plan = plan(&"islands:2x2".parse::<Cabling>().unwrap(), 4).unwrap();
        assert_eq!(plan.routes_of(2, 4)[0].via.to_string(), "10.213.0.1");
    }

    #[test]
    fn identities_are_one_per_rank() {
        assert_eq!(identity_address(0).to_string(), "10.215.0.1");
        assert_eq!(identity_address(255).to_string(), "10.215.1.0");
    }
}
