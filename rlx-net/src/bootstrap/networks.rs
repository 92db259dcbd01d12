//! The networks a rank registers in the store, and the link matrix every rank makes of the
//! table (see [`rlx_transport::topology`]).
//!
//! Only networks that can join two machines are registered: loopback is one host's own, and a
//! link-local network (IPv6 `fe80::/10`, IPv4 `169.254/16`) exists on every interface that has
//! one, so sharing it says nothing about a cable. An interface that is down is left out too.
//!
//! The matrix also says where to connect: a rank advertises one address (the local end of its
//! route to the store), which on a cabled cluster is often not the way to a given peer. A
//! peer that listens on every address is reached at its end of the cable between the two when
//! there is one, and at its address in a network the two share when the advertised one is in
//! none of this rank's networks (only routes lead there); see [`connect_addresses`].

use std::io::Write;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use rlx_transport::interfaces::{self, InterfaceAddress};
use rlx_transport::topology::{Link, Subnet};
use rlx_transport::{CollectiveError, Reach, Topology};

use super::store::{Registration, encode_networks, read_networks};

/// The networks of this host's interfaces that are up, as the store should list them.
pub(super) fn of_this_host() -> Vec<Subnet> {
    match interfaces::addresses() {
        Ok(entries) => joining(&entries),
        Err(e) => {
            tracing::debug!(error = %e, "no networks registered: the interfaces cannot be read");
            Vec::new()
        }
    }
}

/// The networks of `entries` that can join two machines (see the module docs).
fn joining(entries: &[InterfaceAddress]) -> Vec<Subnet> {
    let mut out: Vec<Subnet> = Vec::new();
    for entry in entries.iter().filter(|e| e.is_up_and_running()) {
        let (Some(addr), Some(prefix)) = (entry.addr, entry.prefix) else {
            continue;
        };
        let network = Subnet { addr, prefix };
        if !stays_on_host_or_link(addr) && !out.contains(&network) {
            out.push(network);
        }
    }
    out
}

/// The link matrix of a hostfile rendezvous, which lists no networks: every rank sends its
/// networks to every peer on link 0 of `links` (one short message each, which the socket
/// buffers hold, so no rank waits on another's reading) and reads theirs, by `deadline`.
pub(super) fn exchange(
    me: u32,
    links: &[Vec<TcpStream>],
    deadline: Instant,
) -> Result<Topology, CollectiveError> {
    let mine = of_this_host();
    let message = encode_networks(&mine);
    let peers = || (0u32..).zip(links).filter(|(peer, _)| *peer != me);
    for (peer, link) in peers() {
        let mut stream = first_link(peer, link)?;
        stream
            .write_all(&message)
            .map_err(|e| exchange_error(peer, "sending this rank's networks to", e))?;
    }
    let mut networks = vec![Vec::new(); links.len()];
    networks[me as usize] = mine;
    for (peer, link) in peers() {
        let stream = first_link(peer, link)?;
        let left = deadline.saturating_duration_since(Instant::now());
        stream
            .set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .and_then(|()| read_networks(&mut &*stream))
            .and_then(|theirs| {
                stream.set_read_timeout(None)?;
                networks[peer as usize] = theirs;
                Ok(())
            })
            .map_err(|e| exchange_error(peer, "reading the networks of", e))?;
    }
    let topology = Topology::from_networks(&networks);
    tracing::debug!(
        ?topology,
        "the link matrix from the networks the ranks exchanged"
    );
    Ok(topology)
}

fn first_link(peer: u32, link: &[TcpStream]) -> Result<&TcpStream, CollectiveError> {
    link.first().ok_or_else(|| {
        CollectiveError::config(format!("no link to rank {peer} to exchange networks on"))
    })
}

fn exchange_error(peer: u32, what: &str, e: std::io::Error) -> CollectiveError {
    CollectiveError::Io {
        peer: Some(peer),
        source: std::io::Error::new(e.kind(), format!("{what} rank {peer}: {e}")),
    }
}

/// The link matrix of the ranks of `table` (in rank order), logged at `debug`.
pub(super) fn topology(table: &[Registration]) -> Topology {
    let networks: Vec<Vec<Subnet>> = table.iter().map(|r| r.networks.clone()).collect();
    let topology = Topology::from_networks(&networks);
    tracing::debug!(?topology, "the link matrix from the ranks' networks");
    topology
}

/// The addresses rank `me` connects to for every rank of `table` (see the module docs).
pub(super) fn connect_addresses(
    me: u32,
    table: &[Registration],
    topology: &Topology,
) -> Vec<Vec<SocketAddr>> {
    let mine = table
        .get(me as usize)
        .map_or(&[][..], |r| r.networks.as_slice());
    (0u32..)
        .zip(table)
        .map(|(peer, reg)| {
            let link = topology.link(me, peer).filter(|_| peer != me);
            reg.addrs
                .iter()
                .map(
                    |&advertised| match link.filter(|_| reg.listens_everywhere) {
                        Some(link) => connect_address(peer, advertised, link, mine),
                        None => advertised,
                    },
                )
                .collect()
        })
        .collect()
}

/// Where to connect to `peer`, which advertised `advertised`, listens on every address and is
/// reached by `link` from a rank with the networks `mine` (see the module docs).
fn connect_address(peer: u32, advertised: SocketAddr, link: &Link, mine: &[Subnet]) -> SocketAddr {
    let take = link.reach == Reach::Cable
        || (link.reach == Reach::Switch && routed(advertised.ip(), mine));
    // A peer with this rank's own address is on this host; an address of the other family may
    // not be listened on (a socket bound to `::` can be IPv6 only).
    let here = |remote: &IpAddr| mine.iter().any(|n| n.addr == *remote);
    let family = |remote: &IpAddr| remote.is_ipv4() == advertised.is_ipv4();
    let direct = link
        .remote
        .filter(|remote| take && !here(remote) && family(remote) && *remote != advertised.ip());
    match direct {
        Some(ip) => {
            tracing::debug!(
                peer,
                %advertised,
                direct = %ip,
                "connecting over the network the two ranks share"
            );
            SocketAddr::new(ip, advertised.port())
        }
        None => advertised,
    }
}

/// Whether only routes lead to `ip` from a rank with the networks `mine`: it is in none of
/// them, and neither loopback (advertised by the ranks of one host only, which it reaches) nor
/// link-local (on the link it is scoped to).
fn routed(ip: IpAddr, mine: &[Subnet]) -> bool {
    !stays_on_host_or_link(ip) && !in_my_networks(ip, mine)
}

/// Whether `ip` is loopback or link-local: an address that names no network between machines.
fn stays_on_host_or_link(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback() || v4.is_link_local(),
        IpAddr::V6(v6) => v6.is_loopback() || v6.is_unicast_link_local(),
    }
}

/// Whether `ip` is an address of one of the networks `mine`.
fn in_my_networks(ip: IpAddr, mine: &[Subnet]) -> bool {
    mine.iter().any(|network| {
        network.same_network(&Subnet {
            addr: ip,
            prefix: network.prefix,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, addr: &str, prefix: u8, up: bool) -> InterfaceAddress {
        InterfaceAddress {
            name: name.into(),
            addr: Some(addr.parse().unwrap()),
            up,
            running: up,
            prefix: Some(prefix),
        }
    }

    #[test]
    fn only_networks_that_can_join_two_machines_are_registered() {
        let entries = vec![
            entry("lo", "127.0.0.1", 8, true),
            entry("lo", "::1", 128, true),
            entry("lo", "10.215.0.1", 32, true),
            entry("thunderbolt0", "10.216.0.1", 30, true),
            entry("thunderbolt0", "fe80::1", 64, true),
            entry("thunderbolt1", "10.216.0.5", 30, false),
            entry("en0", "169.254.3.4", 16, true),
            entry("en0", "192.168.1.7", 24, true),
        ];
        let kept: Vec<String> = joining(&entries)
            .iter()
            .map(|n| format!("{}/{}", n.addr, n.prefix))
            .collect();
        assert_eq!(kept, ["10.215.0.1/32", "10.216.0.1/30", "192.168.1.7/24"]);
    }

    fn registration(advertised: &str, networks: &[(&str, u8)], everywhere: bool) -> Registration {
        Registration {
            instance: 0,
            addrs: vec![format!("{advertised}:7000").parse().unwrap()],
            networks: networks
                .iter()
                .map(|&(addr, prefix)| Subnet {
                    addr: addr.parse().unwrap(),
                    prefix,
                })
                .collect(),
            listens_everywhere: everywhere,
        }
    }

    #[test]
    fn peers_are_reached_over_the_cable_between_them() {
        // Three Macs: a cable 0-1 (10.0.1.0/30) and 1-2 (10.0.2.0/30), all on Ethernet
        // 192.168.1.0/24, each advertising its Ethernet address (the store's network); rank 2
        // advertises an address of its own on no shared network, and rank 0 listens on one
        // address only.
        let table = vec![
            registration(
                "192.168.1.10",
                &[("10.0.1.1", 30), ("192.168.1.10", 24)],
                false,
            ),
            registration(
                "192.168.1.11",
                &[("10.0.1.2", 30), ("10.0.2.1", 30), ("192.168.1.11", 24)],
                true,
            ),
            registration("10.9.9.9", &[("10.0.2.2", 30), ("192.168.1.12", 24)], true),
        ];
        let networks: Vec<Vec<Subnet>> = table.iter().map(|r| r.networks.clone()).collect();
        let topology = Topology::from_networks(&networks);
        let from_2 = connect_addresses(2, &table, &topology);
        // Rank 1 over the cable; rank 0 where it listens, whatever the cabling.
        assert_eq!(from_2[1], ["10.0.2.1:7000".parse().unwrap()]);
        assert_eq!(from_2[0], ["192.168.1.10:7000".parse().unwrap()]);
        // Rank 2's advertised address is routed, so rank 0 takes its switch address.
        let from_0 = connect_addresses(0, &table, &topology);
        assert_eq!(from_0[2], ["192.168.1.12:7000".parse().unwrap()]);
        assert_eq!(from_0[1], ["10.0.1.2:7000".parse().unwrap()]);
        // A rank's own entry is left alone.
        assert_eq!(from_0[0], table[0].addrs);
        // Ranks of one host advertise loopback and have the host's addresses (so that two of
        // them alone on a network look cabled): loopback stays.
        let local = vec![
            registration("127.0.0.1", &[("192.168.1.10", 24)], true),
            registration("127.0.0.1", &[("192.168.1.10", 24)], true),
        ];
        let networks: Vec<Vec<Subnet>> = local.iter().map(|r| r.networks.clone()).collect();
        let from_1 = connect_addresses(1, &local, &Topology::from_networks(&networks));
        assert_eq!(from_1[0], local[0].addrs);
    }
}
