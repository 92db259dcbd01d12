//! Which of a peer's hostfile addresses this host connects to.
//!
//! A hostfile entry may list several addresses of one rank. Between machines on one network
//! they are its links (one socket each, as MLX's `ips` are). On a cabled cluster, where each
//! cable is a small network of its own, they are the rank's ends of its cables, and a peer
//! reaches only the one on the cable the two share: the others are in networks it has no part
//! in, often without a route. So a rank connects to a peer's addresses in this order of
//! preference: those *direct* from here (in a network of one of this host's interfaces, on
//! this host, or an IPv6 link-local address with its scope), else those the routing table
//! leads to, else every listed one (so that the error names what was tried). The sockets per
//! peer stay the longest entry's length, spread over the chosen addresses in turn, so both
//! ends of every pair agree on their number.
//!
//! Both the TCP bootstrap and the Thunderbolt transport's checks choose with
//! [`usable_addresses`], so they agree on the addresses used.

use std::net::{IpAddr, SocketAddr};

use crate::interfaces::{self, InterfaceAddress};
use crate::topology::Subnet;

/// The networks of this host's interfaces that are up, loopback and link-local included.
pub fn networks_here() -> Vec<Subnet> {
    interfaces::addresses()
        .unwrap_or_default()
        .iter()
        .filter(|entry| entry.is_up_and_running())
        .filter_map(subnet_of)
        .collect()
}

fn subnet_of(entry: &InterfaceAddress) -> Option<Subnet> {
    Some(Subnet {
        addr: entry.addr?,
        prefix: entry.prefix?,
    })
}

/// The addresses of `listed` (one rank's hostfile entry) that this host connects to (see the
/// module docs): `here` are this host's networks ([`networks_here`]), `routed` says whether
/// the routing table leads to an address ([`interfaces::route_source`] in use).
pub fn usable_addresses(
    listed: &[SocketAddr],
    here: &[Subnet],
    routed: &dyn Fn(SocketAddr) -> bool,
) -> Vec<SocketAddr> {
    let direct: Vec<SocketAddr> = listed
        .iter()
        .copied()
        .filter(|addr| is_direct(*addr, here))
        .collect();
    if !direct.is_empty() {
        return direct;
    }
    let reachable: Vec<SocketAddr> = listed.iter().copied().filter(|a| routed(*a)).collect();
    if reachable.is_empty() {
        listed.to_vec()
    } else {
        reachable
    }
}

/// [`usable_addresses`] for every entry of `table` but rank `me`'s own (which it listens on
/// whole), with this host's networks, read once, and its routing table.
pub fn usable_from_here(table: &[Vec<SocketAddr>], me: usize) -> Vec<Vec<SocketAddr>> {
    let here = networks_here();
    let routed = |addr| interfaces::route_source(addr).is_some();
    (0..)
        .zip(table)
        .map(|(rank, listed)| {
            if rank == me || listed.len() < 2 {
                listed.clone()
            } else {
                usable_addresses(listed, &here, &routed)
            }
        })
        .collect()
}

/// Whether `addr` is reached without a router: on this host, on a scoped link, or in one of
/// the networks `here`.
fn is_direct(addr: SocketAddr, here: &[Subnet]) -> bool {
    let ip = addr.ip();
    let scoped = matches!(addr, SocketAddr::V6(v6) if v6.scope_id() != 0);
    ip.is_loopback()
        || scoped
        || here.iter().any(|network| {
            !is_host_route(network)
                && network.same_network(&Subnet {
                    addr: ip,
                    prefix: network.prefix,
                })
        })
}

/// Whether `network` is one address alone (a /32 or /128, such as a routed identity on
/// loopback), which joins this host to no other.
fn is_host_route(network: &Subnet) -> bool {
    match network.addr {
        IpAddr::V4(_) => network.prefix >= 32,
        IpAddr::V6(_) => network.prefix >= 128,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(text: &str) -> SocketAddr {
        text.parse().unwrap()
    }

    fn net(text: &str) -> Subnet {
        let (addr, prefix) = text.split_once('/').unwrap();
        Subnet {
            addr: addr.parse().unwrap(),
            prefix: prefix.parse().unwrap(),
        }
    }

    /// Rank 0 of a ring of four: cables to rank 1 (10.214.0.0/30) and rank 3 (10.214.0.12/30),
    /// its identity 10.215.0.1/32 on loopback, and routes to the others' identities only.
    fn ring_rank_0() -> Vec<Subnet> {
        vec![
            net("127.0.0.1/8"),
            net("10.215.0.1/32"),
            net("10.214.0.1/30"),
            net("10.214.0.13/30"),
        ]
    }

    fn routes_to_identities(addr: SocketAddr) -> bool {
        addr.ip().to_string().starts_with("10.215.")
    }

    #[test]
    fn a_cabled_peer_is_reached_at_its_end_of_the_shared_cable() {
        let rank_1 = [sa("10.214.0.2:5"), sa("10.214.0.5:5"), sa("10.215.0.2:5")];
        let chosen = usable_addresses(&rank_1, &ring_rank_0(), &routes_to_identities);
        assert_eq!(chosen, [sa("10.214.0.2:5")]);
    }

    #[test]
    fn a_peer_without_a_shared_network_is_reached_where_routes_lead() {
        // Rank 2's cables go to ranks 1 and 3; only its identity is routed from rank 0. Its
        // identity is not in rank 0's /32, which joins nothing.
        let rank_2 = [sa("10.214.0.6:5"), sa("10.214.0.9:5"), sa("10.215.0.3:5")];
        let chosen = usable_addresses(&rank_2, &ring_rank_0(), &routes_to_identities);
        assert_eq!(chosen, [sa("10.215.0.3:5")]);
        let nowhere = usable_addresses(&rank_2, &ring_rank_0(), &|_| false);
        assert_eq!(nowhere, rank_2);
    }

    #[test]
    fn links_on_one_network_all_stay_and_scoped_or_local_ones_are_direct() {
        let two_links = [sa("192.168.1.2:5"), sa("192.168.1.3:5")];
        let here = [net("192.168.1.9/24")];
        assert_eq!(usable_addresses(&two_links, &here, &|_| true), two_links);
        let scoped: SocketAddr = "[fe80::2%7]:5".parse().unwrap();
        let mixed = [sa("10.9.9.9:5"), scoped, sa("127.0.0.1:5")];
        assert_eq!(
            usable_addresses(&mixed, &here, &|_| true),
            [scoped, sa("127.0.0.1:5")]
        );
    }
}
