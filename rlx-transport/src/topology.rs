//! The link matrix of a job: for every pair of ranks, whether a cable joins them, a switch,
//! or only a route through other machines, and the addresses on each end.
//!
//! It is worked out from what every rank advertises at rendezvous: the networks of its
//! interfaces ([`Subnet`], an address and its prefix length). Two ranks with addresses in one
//! network reach each other without a router. A network that only those two ranks share is a
//! cable (a Thunderbolt cable or a point-to-point Ethernet link, each on its own small subnet
//! as MLX recommends for meshes); one that more ranks share is a switch (or a bridge, or one
//! host's loopback). Ranks with no network in common talk through routes, that is through
//! other machines. Every rank gets the same table from the store, so every rank computes the
//! same matrix, and plans made from it agree without a message.
//!
//! The matrix knows nothing of speed yet: a cable is taken to be at least as fast as a switch,
//! and a route to be the slowest (its bytes cross a third machine).

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;

/// One address of a rank and the length of its network prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Subnet {
    /// The rank's address in the network.
    pub addr: IpAddr,
    /// The prefix length (`30` for a `/30`).
    pub prefix: u8,
}

impl Subnet {
    /// Whether `self` and `other` are addresses of one network: the same family and prefix
    /// length, and the same leading `prefix` bits.
    pub fn same_network(&self, other: &Subnet) -> bool {
        self.network() == other.network()
    }

    /// What identifies the network.
    fn network(&self) -> NetworkId {
        match self.addr {
            IpAddr::V4(a) => (
                false,
                self.prefix,
                high_bits(u32::from(a).into(), 32, self.prefix),
            ),
            IpAddr::V6(a) => (true, self.prefix, high_bits(a.into(), 128, self.prefix)),
        }
    }
}

/// A network: whether it is IPv6, its prefix length and the leading bits of its addresses.
type NetworkId = (bool, u8, u128);

/// The leading `prefix` bits of a `width`-bit address (all of them when `prefix` exceeds it).
fn high_bits(addr: u128, width: u32, prefix: u8) -> u128 {
    let keep = u32::from(prefix).min(width);
    if keep == 0 { 0 } else { addr >> (width - keep) }
}

/// How one rank reaches another.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Reach {
    /// The rank itself.
    Itself,
    /// A network only these two ranks share: a cable between them.
    Cable,
    /// A network that more ranks share: a switch, a bridge, or one host.
    Switch,
    /// No network in common: the bytes cross other machines' routes.
    Routed,
}

impl Reach {
    /// The cost of one hop of a ring over this reach, for plans that follow the cables: a
    /// cable 1, a switch 2, a route 3 (it loads the links of a third machine too).
    pub const fn hop_cost(self) -> u32 {
        match self {
            Reach::Itself => 0,
            Reach::Cable => 1,
            Reach::Switch => 2,
            Reach::Routed => 3,
        }
    }

    /// How a rank reaches another this way, as the end of a sentence ("they reach each other
    /// through a switch").
    pub const fn as_words(self) -> &'static str {
        match self {
            Reach::Itself => "as one rank",
            Reach::Cable => "over a cable",
            Reach::Switch => "through a switch",
            Reach::Routed => "only through other machines' routes",
        }
    }

    /// The lower-case word used in logs and reports.
    pub const fn name(self) -> &'static str {
        match self {
            Reach::Itself => "itself",
            Reach::Cable => "cable",
            Reach::Switch => "switch",
            Reach::Routed => "routed",
        }
    }
}

impl fmt::Display for Reach {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One pair's entry of the matrix: the reach and, for a cable or a switch, the address of
/// each end in the network they share.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Link {
    /// How the first rank of the pair reaches the second.
    pub reach: Reach,
    /// The first rank's address in the shared network (`None` for a route or the rank
    /// itself).
    pub local: Option<IpAddr>,
    /// The second rank's address in that network.
    pub remote: Option<IpAddr>,
}

/// The link matrix of `size` ranks, indexed by rank (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topology {
    size: u32,
    links: Vec<Link>,
}

impl Topology {
    /// The matrix of ranks whose networks are `networks` (index = rank).
    pub fn from_networks(networks: &[Vec<Subnet>]) -> Topology {
        let size = networks.len();
        // How many ranks are on each network, counted once for every pair to look up.
        let mut members: HashMap<NetworkId, usize> = HashMap::new();
        for rank in networks {
            let mut on: Vec<_> = rank.iter().map(Subnet::network).collect();
            on.sort_unstable();
            on.dedup();
            for network in on {
                *members.entry(network).or_default() += 1;
            }
        }
        let mut links = Vec::with_capacity(size * size);
        for (i, mine) in networks.iter().enumerate() {
            for (j, theirs) in networks.iter().enumerate() {
                links.push(if i == j {
                    Link {
                        reach: Reach::Itself,
                        local: None,
                        remote: None,
                    }
                } else {
                    link_between(&members, mine, theirs)
                });
            }
        }
        Topology {
            size: u32::try_from(size).unwrap_or(u32::MAX),
            links,
        }
    }

    /// The matrix of `n` ranks joined by a cable for each pair of `cables` (each a /30 of its
    /// own in 10.214.0.0/16, as the launcher's emulation lays them), and all also on one switch
    /// (10.213.0.0/24) when `switch`: a cabling described by its cables, for tests and
    /// simulations.
    ///
    /// ```
    /// use rlx_transport::{Reach, Topology};
    ///
    /// let chain = Topology::from_cables(3, &[(0, 2), (2, 1)], false);
    /// assert_eq!(chain.reach(0, 2), Reach::Cable);
    /// assert_eq!(chain.reach(0, 1), Reach::Routed);
    /// let beside = Topology::from_cables(3, &[(0, 2), (2, 1)], true);
    /// assert_eq!(beside.reach(0, 1), Reach::Switch);
    /// ```
    pub fn from_cables(n: u32, cables: &[(u32, u32)], switch: bool) -> Topology {
        let mut networks: Vec<Vec<Subnet>> = (0..n)
            .map(|rank| {
                let host = u32::from(std::net::Ipv4Addr::new(10, 213, 0, 1)) + rank;
                let on_switch = Subnet {
                    addr: std::net::Ipv4Addr::from(host).into(),
                    prefix: 24,
                };
                if switch { vec![on_switch] } else { Vec::new() }
            })
            .collect();
        let base = u32::from(std::net::Ipv4Addr::new(10, 214, 0, 0));
        for (index, &(a, b)) in (0u32..).zip(cables) {
            for (end, rank) in [(1, a), (2, b)] {
                if let Some(rank_networks) = networks.get_mut(rank as usize) {
                    rank_networks.push(Subnet {
                        addr: std::net::Ipv4Addr::from(base + 4 * index + end).into(),
                        prefix: 30,
                    });
                }
            }
        }
        Topology::from_networks(&networks)
    }

    /// The number of ranks.
    pub fn size(&self) -> u32 {
        self.size
    }

    /// How rank `from` reaches rank `to`; `None` when either is not a rank of the matrix.
    pub fn link(&self, from: u32, to: u32) -> Option<&Link> {
        if from >= self.size || to >= self.size {
            return None;
        }
        self.links
            .get(from as usize * self.size as usize + to as usize)
    }

    /// The reach from `from` to `to` ([`Reach::Routed`] for ranks the matrix does not know).
    pub fn reach(&self, from: u32, to: u32) -> Reach {
        self.link(from, to).map_or(Reach::Routed, |l| l.reach)
    }

    /// The matrix of the ranks `members` (world ranks of this matrix), indexed by their
    /// position in `members`; `None` when one of them is not a rank of this matrix.
    pub fn restricted(&self, members: &[u32]) -> Option<Topology> {
        let mut links = Vec::with_capacity(members.len() * members.len());
        for &from in members {
            for &to in members {
                links.push(*self.link(from, to)?);
            }
        }
        Some(Topology {
            size: u32::try_from(members.len()).ok()?,
            links,
        })
    }

    /// The hops of a ring through `ring` (ranks of this matrix, back to the first) that no
    /// cable or switch carries, each crossing other machines, as (from, to) pairs.
    pub fn routed_hops(&self, ring: &[u32]) -> Vec<(u32, u32)> {
        let n = ring.len();
        (0..n)
            .map(|i| (ring[i], ring[(i + 1) % n]))
            .filter(|&(a, b)| self.reach(a, b) == Reach::Routed)
            .collect()
    }

    /// Whether a cable joins every pair of distinct ranks, and there are at least three (two
    /// ranks have one cable whatever the plan).
    pub fn is_cable_mesh(&self) -> bool {
        self.size >= 3
            && self
                .links
                .iter()
                .all(|l| matches!(l.reach, Reach::Itself | Reach::Cable))
    }

    /// Whether every pair of distinct ranks is joined the same way (a star, one host, or a
    /// full mesh): then no order of the ranks is better than another.
    pub fn is_uniform(&self) -> bool {
        let mut reaches = self
            .links
            .iter()
            .map(|l| l.reach)
            .filter(|r| *r != Reach::Itself);
        match reaches.next() {
            Some(first) => reaches.all(|r| r == first),
            None => true,
        }
    }
}

/// How a rank with networks `mine` reaches one with `theirs`: by the shared network with the
/// fewest ranks on it (a cable before a switch), or by a route.
fn link_between(members: &HashMap<NetworkId, usize>, mine: &[Subnet], theirs: &[Subnet]) -> Link {
    let mut best: Option<(usize, &Subnet, &Subnet)> = None;
    for a in mine {
        for b in theirs.iter().filter(|b| a.same_network(b)) {
            // Every rank's networks were counted, so the count is there; two (this pair) is
            // the least it can be.
            let members = members.get(&a.network()).copied().unwrap_or(2);
            if best.is_none_or(|(fewest, _, _)| members < fewest) {
                best = Some((members, a, b));
            }
        }
    }
    match best {
        Some((members, a, b)) => Link {
            reach: if members <= 2 {
                Reach::Cable
            } else {
                Reach::Switch
            },
            local: Some(a.addr),
            remote: Some(b.addr),
        },
        None => Link {
            reach: Reach::Routed,
            local: None,
            remote: None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(addr: &str, prefix: u8) -> Subnet {
        Subnet {
            addr: addr.parse().unwrap(),
            prefix,
        }
    }

    #[test]
    fn networks_compare_by_their_prefix() {
        assert!(net("10.0.0.1", 30).same_network(&net("10.0.0.2", 30)));
        assert!(!net("10.0.0.1", 30).same_network(&net("10.0.0.5", 30)));
        assert!(!net("10.0.0.1", 30).same_network(&net("10.0.0.2", 24)));
        assert!(net("fd00::1", 64).same_network(&net("fd00::2", 64)));
        assert!(!net("fd00::1", 64).same_network(&net("10.0.0.1", 64)));
        assert!(net("10.0.0.1", 0).same_network(&net("192.168.0.1", 0)));
    }

    #[test]
    fn a_chain_of_cables_with_a_switch_beside_it() {
        // Ranks 0-1-2 cabled in a chain (a /30 per cable) and all on one /24 switch.
        let networks = vec![
            vec![net("192.168.0.1", 24), net("10.0.0.1", 30)],
            vec![
                net("192.168.0.2", 24),
                net("10.0.0.2", 30),
                net("10.0.0.5", 30),
            ],
            vec![net("192.168.0.3", 24), net("10.0.0.6", 30)],
        ];
        let t = Topology::from_networks(&networks);
        assert_eq!(t.reach(0, 0), Reach::Itself);
        assert_eq!(t.reach(0, 1), Reach::Cable);
        assert_eq!(t.reach(1, 2), Reach::Cable);
        assert_eq!(t.reach(0, 2), Reach::Switch);
        let link = t.link(2, 1).unwrap();
        assert_eq!(link.local, Some("10.0.0.6".parse().unwrap()));
        assert_eq!(link.remote, Some("10.0.0.5".parse().unwrap()));
        assert!(!t.is_uniform());
        // Without the switch, the ends of the chain only have a route.
        let cables: Vec<Vec<Subnet>> = networks.iter().map(|r| r[1..].to_vec()).collect();
        let t = Topology::from_networks(&cables);
        assert_eq!(t.reach(0, 2), Reach::Routed);
        assert_eq!(t.routed_hops(&[0, 1, 2]), [(2, 0)]);
        assert_eq!(t.routed_hops(&[0, 2, 1]), [(0, 2)]);
        assert_eq!(t.link(0, 2).unwrap().local, None);
        // The matrix of ranks 2 and 0 only, in that order.
        let sub = t.restricted(&[2, 0]).unwrap();
        assert_eq!(sub.size(), 2);
        assert_eq!(sub.reach(0, 1), Reach::Routed);
        assert_eq!(t.restricted(&[0, 3]), None);
        assert_eq!(t.reach(0, 9), Reach::Routed);
    }

    #[test]
    fn one_host_and_a_star_are_uniform() {
        let host = vec![vec![net("127.0.0.1", 8)]; 4];
        let t = Topology::from_networks(&host);
        assert!(t.is_uniform());
        assert_eq!(t.reach(3, 0), Reach::Switch);
        // Two ranks of one network are a cable: as uniform as can be.
        let pair = vec![vec![net("10.0.0.1", 30)], vec![net("10.0.0.2", 30)]];
        let t = Topology::from_networks(&pair);
        assert_eq!(t.reach(0, 1), Reach::Cable);
        assert!(t.is_uniform());
        assert!(Topology::from_networks(&[]).is_uniform());
        assert!(!t.is_cable_mesh());
        let mesh = vec![
            vec![net("10.0.0.1", 30), net("10.0.0.5", 30)],
            vec![net("10.0.0.2", 30), net("10.0.0.9", 30)],
            vec![net("10.0.0.6", 30), net("10.0.0.10", 30)],
        ];
        assert!(Topology::from_networks(&mesh).is_cable_mesh());
        assert!(!Topology::from_networks(&host).is_cable_mesh());
    }
}
