//! Unit tests of the bootstrap decisions, with fake interfaces and fake routes (and, in the
//! last ones, the host's real loopback).

use super::*;
use crate::discovery::Evidence;
use std::net::SocketAddrV6;

fn iface(name: &str, index: u32, addrs: &[&str], tb: bool) -> Interface {
    Interface {
        addrs: addrs.iter().map(|a| a.parse().unwrap()).collect(),
        thunderbolt: tb.then_some(Evidence::Name),
        ..Interface::new(name, index, true)
    }
}

/// A host with two Thunderbolt links and an Ethernet port.
fn host() -> LinkMap {
    let tb0 = iface("thunderbolt0", 4, &["10.1.0.1", "fe80::1"], true);
    let tb1 = iface("thunderbolt1", 5, &["10.2.0.1", "fe80::11"], true);
    let eth = iface("eth0", 2, &["192.168.1.9", "fe80::99"], false);
    let lo = iface("lo", 1, &["127.0.0.1"], false);
    let mut map = LinkMap::new(vec![tb0.clone(), tb1.clone()], vec![lo, eth, tb0, tb1]).unwrap();
    // Every listed address is used, whatever this test host's own networks are.
    map.usable = |table, _| table.to_vec();
    map
}

/// Routes by /24: 10.1.0.x through thunderbolt0, 10.2.0.x through thunderbolt1, the rest
/// through eth0.
fn route(dest: SocketAddr) -> io::Result<IpAddr> {
    let text = dest.ip().to_string();
    let source = if text.starts_with("10.1.0.") {
        "10.1.0.1"
    } else if text.starts_with("10.2.0.") {
        "10.2.0.1"
    } else if text.starts_with("127.") {
        "127.0.0.1"
    } else if dest.is_ipv4() {
        "192.168.1.9"
    } else {
        return Err(io::Error::new(
            io::ErrorKind::NetworkUnreachable,
            "unreachable",
        ));
    };
    Ok(source.parse().unwrap())
}

fn sa(text: &str) -> SocketAddr {
    text.parse().unwrap()
}

fn scoped(ip: &str, port: u16, scope: u32) -> SocketAddr {
    SocketAddr::V6(SocketAddrV6::new(ip.parse().unwrap(), port, 0, scope))
}

#[test]
fn peers_are_pinned_to_the_link_their_route_leaves_through() {
    let map = host();
    assert_eq!(
        map.for_peer(sa("10.1.0.2:1"), &route).unwrap().name,
        "thunderbolt0"
    );
    assert_eq!(
        map.for_peer(sa("10.2.0.7:1"), &route).unwrap().name,
        "thunderbolt1"
    );
    let err = map.for_peer(sa("192.168.1.20:1"), &route).unwrap_err();
    assert!(err.contains("leaves through eth0"), "{err}");
    assert!(err.contains("thunderbolt0 [10.1.0.1, fe80::1]"), "{err}");
    let err = map.for_peer(sa("127.0.0.1:1"), &route).unwrap_err();
    assert!(err.contains("leaves through lo"), "{err}");
    let err = map.for_peer(sa("[fd00::5]:1"), &route).unwrap_err();
    assert!(err.contains("no route to [fd00::5]:1"), "{err}");
}

#[test]
fn link_local_peers_follow_their_scope_or_the_home_link() {
    let map = host();
    let far = scoped("fe80::2", 9, 5);
    assert_eq!(map.for_peer(far, &route).unwrap().name, "thunderbolt1");
    let err = map.for_peer(scoped("fe80::2", 9, 2), &route).unwrap_err();
    assert!(
        err.contains("scope eth0 is not a Thunderbolt link"),
        "{err}"
    );
    assert_eq!(
        map.for_peer(sa("[fe80::2]:9"), &route).unwrap().name,
        "thunderbolt0"
    );
}

#[test]
fn listeners_are_pinned_to_the_link_that_owns_their_address() {
    let map = host();
    assert_eq!(
        map.for_local(sa("10.2.0.1:5")).unwrap().name,
        "thunderbolt1"
    );
    assert_eq!(map.for_local(sa("0.0.0.0:5")).unwrap().name, "thunderbolt0");
    assert_eq!(
        map.for_local(scoped("fe80::11", 5, 5)).unwrap().name,
        "thunderbolt1"
    );
    assert_eq!(
        map.for_local(sa("[fe80::11]:5")).unwrap().name,
        "thunderbolt1"
    );
    let err = map.for_local(sa("192.168.1.9:5")).unwrap_err();
    assert!(err.contains("belongs to interface eth0"), "{err}");
    let err = map.for_local(sa("10.9.9.9:5")).unwrap_err();
    assert!(err.contains("no interface of this host"), "{err}");
}

/// `host()` with thunderbolt1 alone as its link.
fn one_link_host() -> LinkMap {
    let map = host();
    let tb1 = map.links[1].clone();
    LinkMap::new(vec![tb1], map.seen).unwrap()
}

/// `host()` with the routed identity 10.215.0.3 on `lo`, routed through thunderbolt1.
fn identity_host() -> LinkMap {
    let mut map = host();
    map.seen[0].addrs.push("10.215.0.3".parse().unwrap());
    map.route_interface = |dest| {
        let far = dest.ip().to_string();
        far.starts_with("10.215.")
            .then(|| "thunderbolt1".to_owned())
    };
    map
}

/// `route`, with the other identities of 10.215.0.0/24 leaving from this host's.
fn identity_route(dest: SocketAddr) -> io::Result<IpAddr> {
    if dest.ip().to_string().starts_with("10.215.") {
        return Ok("10.215.0.3".parse().unwrap());
    }
    route(dest)
}

#[test]
fn a_store_rank_advertises_its_link_address_and_rank_0_hosts_on_a_link() {
    let store = Resolved::Store(vec![sa("10.2.0.1:29500")]);
    let p = plan(0, &store, one_link_host(), &route).unwrap();
    assert_eq!(p.bind, Some("10.2.0.1".parse().unwrap()));
    assert_eq!(p.map.home().name, "thunderbolt1");

    let store = Resolved::Store(vec![sa("10.2.0.3:29500")]);
    let p = plan(2, &store, one_link_host(), &route).unwrap();
    assert_eq!(p.bind, Some("10.2.0.1".parse().unwrap()));
    assert_eq!(p.map.home().name, "thunderbolt1");

    // With several links, a rank listens on every address (its peers come over each).
    let p = plan(2, &store, host(), &route).unwrap();
    assert_eq!(p.bind, None);
    assert_eq!(p.map.home().name, "thunderbolt1");
    let store = Resolved::Store(vec![sa("10.2.0.1:29500")]);
    let p = plan(0, &store, host(), &route).unwrap();
    assert_eq!(p.bind, None);
    assert_eq!(p.map.home().name, "thunderbolt1");

    let link_local = Resolved::Store(vec![scoped("fe80::3", 29500, 4)]);
    let p = plan(1, &link_local, host(), &route).unwrap();
    assert_eq!(p.bind, Some("fe80::1".parse().unwrap()));
    assert_eq!(p.map.home().name, "thunderbolt0");
}

#[test]
fn a_store_behind_another_interface_is_a_config_error() {
    let store = Resolved::Store(vec![sa("192.168.1.20:29500")]);
    let err = plan(1, &store, host(), &route).unwrap_err();
    assert!(matches!(err, CollectiveError::Config { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("rendezvous store at 192.168.1.20:29500"),
        "{text}"
    );
    assert!(text.contains("leaves through eth0"), "{text}");
    // Rank 0 may not host the store on its Ethernet address, nor on loopback.
    let store = Resolved::Store(vec![sa("192.168.1.9:29500")]);
    let text = plan(0, &store, host(), &route).unwrap_err().to_string();
    assert!(text.contains("belongs to interface eth0"), "{text}");
    let store = Resolved::Store(vec![sa("127.0.0.1:29500")]);
    let text = plan(0, &store, host(), &route).unwrap_err().to_string();
    assert!(text.contains("belongs to interface lo"), "{text}");
}

#[test]
fn a_routed_identity_is_listened_on_unpinned_and_its_routes_leave_by_their_interface() {
    let map = identity_host();
    assert!(map.listens_unpinned(sa("10.215.0.3:5")));
    assert!(map.listens_unpinned(sa("0.0.0.0:5")));
    assert!(!one_link_host().listens_unpinned(sa("0.0.0.0:5")));
    assert!(!map.listens_unpinned(sa("127.0.0.1:5")));
    assert!(!map.listens_unpinned(sa("10.2.0.1:5")));
    // A peer's identity is reached through the interface its route leaves by.
    let link = map.for_peer(sa("10.215.0.1:7"), &identity_route).unwrap();
    assert_eq!(link.name, "thunderbolt1");
    let mut blind = identity_host();
    blind.route_interface = |_| Some("eth0".to_owned());
    let err = blind
        .for_peer(sa("10.215.0.1:7"), &identity_route)
        .unwrap_err();
    assert!(err.contains("leaves through eth0"), "{err}");
    assert!(err.contains("RLX_TB_IFNAME=thunderbolt,eth0"), "{err}");
    blind.route_interface = |_| None;
    let err = blind
        .for_peer(sa("10.215.0.1:7"), &identity_route)
        .unwrap_err();
    assert!(err.contains("cannot be read here"), "{err}");

    // Rank 0 hosts the store on its identity; another rank advertises its own.
    let store = Resolved::Store(vec![sa("10.215.0.3:29500")]);
    let p = plan(0, &store, identity_host(), &identity_route).unwrap();
    assert_eq!(p.bind, None);
    let store = Resolved::Store(vec![sa("10.215.0.1:29500")]);
    let p = plan(2, &store, identity_host(), &identity_route).unwrap();
    assert_eq!(p.bind, None);
    assert_eq!(p.map.home().name, "thunderbolt1");
}

#[test]
fn a_hostfile_of_cable_ends_checks_only_the_addresses_used() {
    // Rank 0 lists its cable end and its routed identity; rank 1 lists an end on a cable
    // rank 0 is not on (10.9.0.0/24, routed through eth0 here) and one it shares.
    let table = Resolved::Hostfile(vec![
        vec![sa("10.2.0.1:5000"), sa("10.215.0.3:5000")],
        vec![sa("10.9.0.2:5000"), sa("10.2.0.7:5000")],
    ]);
    let mut map = identity_host();
    map.usable = |table, _| {
        let shared = |entry: &Vec<SocketAddr>| {
            let on_the_cable = entry
                .iter()
                .filter(|a| a.ip().to_string().starts_with("10.2."));
            on_the_cable.copied().collect()
        };
        table.iter().map(shared).collect()
    };
    let p = plan(0, &table, map, &identity_route).unwrap();
    assert_eq!(p.map.home().name, "thunderbolt1");
    // Every listed address, if it were used, would take rank 1's far one through eth0.
    let text = plan(0, &table, identity_host(), &identity_route)
        .unwrap_err()
        .to_string();
    assert!(text.contains("rank 1 at 10.9.0.2:5000"), "{text}");
}

#[test]
fn hostfile_addresses_are_checked_for_every_rank_and_link() {
    let table = Resolved::Hostfile(vec![
        vec![sa("10.2.0.1:5000"), sa("10.1.0.1:5001")],
        vec![sa("10.2.0.2:5000"), sa("10.1.0.2:5001")],
    ]);
    let p = plan(0, &table, host(), &route).unwrap();
    assert_eq!(p.bind, None);
    assert_eq!(p.map.home().name, "thunderbolt1");

    let table = Resolved::Hostfile(vec![
        vec![sa("10.1.0.1:5000")],
        vec![sa("192.168.1.20:5000")],
    ]);
    let text = plan(0, &table, host(), &route).unwrap_err().to_string();
    assert!(
        text.contains("cannot reach rank 1 at 192.168.1.20:5000"),
        "{text}"
    );
    let text = plan(1, &table, host(), &route).unwrap_err().to_string();
    assert!(
        text.contains("rank 1 cannot listen on its hostfile address"),
        "{text}"
    );
    let text = plan(3, &table, host(), &route).unwrap_err().to_string();
    assert!(text.contains("rank 3 has no entry"), "{text}");
}

#[test]
fn addresses_resolve_like_rlx_net_does() {
    let r = Resolved::resolve(&Rendezvous::Store {
        host: "::1".into(),
        port: 7,
    })
    .unwrap();
    assert_eq!(r, Resolved::Store(vec![sa("[::1]:7")]));
    let r = Resolved::resolve(&Rendezvous::Hostfile(vec![
        vec!["127.0.0.1:1".into(), "[::1]:2".into()],
        vec!["127.0.0.2:3".into()],
    ]))
    .unwrap();
    assert_eq!(
        r,
        Resolved::Hostfile(vec![
            vec![sa("127.0.0.1:1"), sa("[::1]:2")],
            vec![sa("127.0.0.2:3")]
        ])
    );
    assert!(Resolved::resolve(&Rendezvous::Hostfile(vec![vec!["nope".into()]])).is_err());
}

#[test]
fn the_hook_pins_real_sockets_and_refuses_other_routes() {
    let seen = crate::sys::list_interfaces().unwrap();
    let lo = seen.iter().find(|i| i.name == "lo").unwrap().clone();
    let map = LinkMap::new(vec![lo], seen).unwrap();
    let socket = || Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    let listener = socket();
    map.pin(&listener, SocketRole::Listen(sa("127.0.0.1:0")))
        .unwrap();
    assert_eq!(
        crate::pinned_interface(&listener).unwrap().as_deref(),
        Some("lo")
    );
    let connector = socket();
    map.pin(&connector, SocketRole::Connect(sa("127.0.0.1:9")))
        .unwrap();
    assert_eq!(
        crate::pinned_interface(&connector).unwrap().as_deref(),
        Some("lo")
    );
    // TEST-NET-1 is routed through the default route, if any, never through loopback.
    let stranger = socket();
    let err = map
        .pin(&stranger, SocketRole::Connect(sa("192.0.2.1:9")))
        .unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{err}");
    assert_eq!(crate::pinned_interface(&stranger).unwrap(), None);
    // An accepted connection is pinned to the link its peer is reached by, or refused.
    let accepted = socket();
    map.pin(&accepted, SocketRole::Accepted(sa("127.0.0.1:9")))
        .unwrap();
    assert_eq!(
        crate::pinned_interface(&accepted).unwrap().as_deref(),
        Some("lo")
    );
    let from_afar = socket();
    let err = map
        .pin(&from_afar, SocketRole::Accepted(sa("192.0.2.1:9")))
        .unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{err}");
    assert_eq!(crate::pinned_interface(&from_afar).unwrap(), None);
}

#[test]
fn the_kernel_routes_loopback_through_loopback() {
    assert_eq!(
        kernel_route(sa("127.0.0.1:9")).unwrap(),
        "127.0.0.1".parse::<IpAddr>().unwrap()
    );
}
