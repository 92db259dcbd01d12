//! Bootstrap of the Thunderbolt transport on top of `rlx-net`'s: checking that every address of
//! the rendezvous is reached over a Thunderbolt link, choosing the address this rank listens on
//! and advertises, and deciding which link each socket is pinned to.
//!
//! The decisions are plain functions of the links, the interfaces seen and a route lookup, so
//! the tests drive them with fake interfaces and fake routes. The rules:
//!
//! - A destination is reached over the link the kernel routes it through: the link that owns
//!   the local source address of the route. A destination routed through any other interface
//!   (Wi-Fi, Ethernet, loopback) is refused with an error naming that interface — never used.
//! - A scoped IPv6 link-local destination (`fe80::2%thunderbolt0`) is reached over the link of
//!   its scope, which must be a Thunderbolt link. An unscoped one (as the rendezvous store
//!   passes them on) is reached over the *home link*: the link of the rendezvous (store mode) or
//!   of this rank's first hostfile address.
//! - A local address to listen on must belong to a link; an unspecified one is pinned to the
//!   home link when the rank has one link. A rank cabled to several peers (several links) and
//!   a rank's *routed identity* (an address of its loopback interface that is not itself a
//!   loopback address, which other hosts reach through routes, as a router's) are listened on
//!   unpinned: such a listener serves every link, so each connection it accepts is checked
//!   like a connecting socket (the route back to the peer must leave through a link) and
//!   pinned to that link, or closed.
//! - Store mode: rank 0 hosts the store on an address of a link or on its routed identity;
//!   every other rank advertises the source address of its route to the store — the link's
//!   own address or its routed identity, never whatever the host name resolves to — and
//!   listens on it alone when it has one link, on every address (so that each peer reaches it
//!   at its end of the cable between them) when it has several.

use std::fmt;
use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};

use rlx_net::SocketRole;
use rlx_transport::{CollectiveError, Rendezvous, Result};
use socket2::Socket;

use crate::discovery::Interface;
use crate::pin::{is_link_local_v6, pin_socket};

/// The rendezvous with every address resolved the way `rlx-net` resolves it (the first address
/// of each hostfile entry; every address of the store's host, the first of which is used).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Resolved {
    /// Entry `r` holds rank `r`'s listening addresses, one per link.
    Hostfile(Vec<Vec<SocketAddr>>),
    /// The rendezvous store's addresses.
    Store(Vec<SocketAddr>),
}

impl Resolved {
    /// Resolves every address of `rendezvous`.
    pub(crate) fn resolve(rendezvous: &Rendezvous) -> Result<Resolved> {
        match rendezvous {
            Rendezvous::Hostfile(entries) => entries
                .iter()
                .map(|entry| {
                    entry
                        .iter()
                        .map(|a| rlx_transport::bootstrap::resolve(a).map(|found| found[0]))
                        .collect::<Result<Vec<_>>>()
                })
                .collect::<Result<Vec<_>>>()
                .map(Resolved::Hostfile),
            Rendezvous::Store { host, port } => {
                // `split_host_port` wants brackets around an IPv6 host.
                let address = if host.contains(':') {
                    format!("[{host}]:{port}")
                } else {
                    format!("{host}:{port}")
                };
                rlx_transport::bootstrap::resolve(&address).map(Resolved::Store)
            }
        }
    }
}

/// The local source address the kernel would use towards `dest` (connecting a UDP socket sends
/// no packet). The socket is not pinned, so this is the host's own routing decision.
pub(crate) fn kernel_route(dest: SocketAddr) -> io::Result<IpAddr> {
    let any: SocketAddr = match dest {
        SocketAddr::V4(_) => (std::net::Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let udp = UdpSocket::bind(any)?;
    udp.connect(dest)?;
    Ok(udp.local_addr()?.ip())
}

/// The Thunderbolt links of this rank, the other interfaces (to name them in errors) and the
/// home link; decides which link a socket is pinned to.
#[derive(Clone)]
pub(crate) struct LinkMap {
    links: Vec<Interface>,
    seen: Vec<Interface>,
    home: usize,
    /// The interface the kernel routes a destination through (`sys::route_interface`; tests
    /// give their own), asked only when the route's source is a routed identity.
    route_interface: fn(SocketAddr) -> Option<String>,
    /// The addresses of a peer's hostfile entry that are used
    /// (`rlx_transport::hostfile::usable_from_here`; tests give their own).
    usable: fn(&[SocketAddr]) -> Vec<SocketAddr>,
}

impl fmt::Debug for LinkMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LinkMap")
            .field("links", &self.names())
            .field("home", &self.links[self.home].name)
            .finish()
    }
}

/// What bootstrap does with the links: the map that pins sockets, and the address to listen on
/// and advertise in store mode.
#[derive(Debug)]
pub(crate) struct Plan {
    pub(crate) map: LinkMap,
    pub(crate) bind: Option<IpAddr>,
}

impl LinkMap {
    /// `links` among the interfaces `seen`, the first link as home. Discovery never returns
    /// an empty list, but links given by the caller may be: a `Config` error.
    pub(crate) fn new(links: Vec<Interface>, seen: Vec<Interface>) -> Result<LinkMap> {
        if links.is_empty() {
            return Err(CollectiveError::config("no Thunderbolt link to use"));
        }
        Ok(LinkMap {
            links,
            seen,
            home: 0,
            route_interface: crate::sys::route_interface,
            usable: rlx_transport::hostfile::usable_from_here,
        })
    }

    /// The links, in discovery order.
    pub(crate) fn links(&self) -> &[Interface] {
        &self.links
    }

    /// The home link (see the module docs).
    pub(crate) fn home(&self) -> &Interface {
        &self.links[self.home]
    }

    fn names(&self) -> String {
        let names: Vec<String> = self
            .links
            .iter()
            .map(|l| {
                let addrs: Vec<String> = l.addrs.iter().map(ToString::to_string).collect();
                format!("{} [{}]", l.name, addrs.join(", "))
            })
            .collect();
        names.join(", ")
    }

    fn position(&self, link: &Interface) -> usize {
        self.links
            .iter()
            .position(|l| l.name == link.name)
            .unwrap_or(self.home)
    }

    fn by_index(&self, index: u32) -> std::result::Result<&Interface, String> {
        self.links.iter().find(|l| l.index == index).ok_or_else(|| {
            let name = self
                .seen
                .iter()
                .find(|i| i.index == index)
                .map_or_else(|| format!("index {index}"), |i| i.name.clone());
            format!(
                "scope {name} is not a Thunderbolt link in use (the links are {})",
                self.names()
            )
        })
    }

    fn owner_of(&self, ip: IpAddr) -> Option<&Interface> {
        self.links.iter().find(|l| l.addrs.contains(&ip))
    }

    /// Whether `ip` is this host's routed identity (see the module docs): an address of the
    /// interface that holds a loopback address, but not a loopback address itself.
    fn is_routed_identity(&self, ip: IpAddr) -> bool {
        !ip.is_loopback()
            && self
                .seen
                .iter()
                .any(|i| i.addrs.contains(&ip) && i.addrs.iter().any(|a| a.is_loopback()))
    }

    /// Whether a socket listening on `addr` serves several links and stays unpinned, its
    /// accepted connections each checked and pinned instead (see the module docs).
    fn listens_unpinned(&self, addr: SocketAddr) -> bool {
        let ip = addr.ip();
        (ip.is_unspecified() && self.links.len() > 1) || self.is_routed_identity(ip)
    }

    /// The link a socket listening on the local address `addr` is pinned to.
    pub(crate) fn for_local(&self, addr: SocketAddr) -> std::result::Result<&Interface, String> {
        if addr.ip().is_unspecified() {
            return Ok(self.home());
        }
        if let SocketAddr::V6(v6) = addr {
            if v6.scope_id() != 0 {
                return self.by_index(v6.scope_id());
            }
        }
        self.owner_of(addr.ip()).ok_or_else(|| {
            let elsewhere = self
                .seen
                .iter()
                .find(|i| i.addrs.contains(&addr.ip()))
                .map_or_else(
                    || "no interface of this host".to_owned(),
                    |i| format!("interface {}", i.name),
                );
            format!(
                "{} belongs to {elsewhere}, not to a Thunderbolt link in use (the links are {})",
                addr.ip(),
                self.names()
            )
        })
    }

    /// The socket setup hook of `rlx-net`: pins `socket` to the link its `role` calls for, or
    /// refuses it (an `InvalidInput` error saying why) when no Thunderbolt link fits.
    pub(crate) fn pin(&self, socket: &Socket, role: SocketRole) -> io::Result<()> {
        let link = match role {
            SocketRole::Listen(addr) if self.listens_unpinned(addr) => {
                tracing::debug!(%addr, "listening unpinned: every accepted connection is checked");
                return Ok(());
            }
            SocketRole::Listen(addr) => self.for_local(addr),
            SocketRole::Connect(addr) | SocketRole::Accepted(addr) => {
                self.for_peer(addr, &kernel_route)
            }
            other => Err(format!("no pinning rule for a socket to {other:?}")),
        }
        .map_err(|why| io::Error::new(io::ErrorKind::InvalidInput, why))?;
        pin_socket(socket, link).map_err(|e| match e {
            CollectiveError::Io { source, .. } => source,
            other => io::Error::other(other.to_string()),
        })
    }

    /// The link a socket connecting to `dest` is pinned to, with `route` giving the kernel's
    /// source address towards a destination.
    pub(crate) fn for_peer(
        &self,
        dest: SocketAddr,
        route: &dyn Fn(SocketAddr) -> io::Result<IpAddr>,
    ) -> std::result::Result<&Interface, String> {
        if let SocketAddr::V6(v6) = dest {
            if v6.scope_id() != 0 {
                return self.by_index(v6.scope_id());
            }
            if is_link_local_v6(v6.ip()) {
                return Ok(self.home());
            }
        }
        let source = route(dest).map_err(|e| format!("no route to {dest}: {e}"))?;
        if self.owner_of(source).is_none() && self.is_routed_identity(source) {
            return self.by_route_interface(dest, source);
        }
        self.owner_of(source).ok_or_else(|| {
            let via = self
                .seen
                .iter()
                .find(|i| i.addrs.contains(&source))
                .map_or_else(|| "another interface".to_owned(), |i| i.name.clone());
            format!(
                "the route to {dest} leaves through {via} (source address {source}), which is \
                 not a Thunderbolt link in use (the links are {}); refusing to use it (name it in \
                 RLX_TB_IFNAME beside the links, e.g. RLX_TB_IFNAME=thunderbolt,{via}, to let \
                 this traffic use it)",
                self.names()
            )
        })
    }
}

/// Checks the rendezvous of `rank` against the links and decides the home link and the store
/// mode address (see the module docs). Every refusal is a `Config` error naming the address.
pub(crate) fn plan(
    rank: u32,
    resolved: &Resolved,
    mut map: LinkMap,
    route: &dyn Fn(SocketAddr) -> io::Result<IpAddr>,
) -> Result<Plan> {
    let refuse = |what: String| CollectiveError::config(what);
    match resolved {
        Resolved::Hostfile(table) => plan_hostfile(rank, table, map, route),
        Resolved::Store(master) => {
            let store = master
                .first()
                .copied()
                .ok_or_else(|| refuse("the rendezvous store has no address".to_owned()))?;
            if rank == 0 {
                return host_store(store, map);
            }
            let link = map.for_peer(store, route).map_err(|why| {
                refuse(format!(
                    "rank {rank} cannot reach the rendezvous store at {store} over Thunderbolt: {why}"
                ))
            })?;
            let position = map.position(link);
            let bind = match store {
                SocketAddr::V6(v6) if is_link_local_v6(v6.ip()) => {
                    let link = &map.links[position];
                    link.link_local_v6().next().map(IpAddr::V6).ok_or_else(|| {
                        refuse(format!(
                            "the rendezvous store at {store} is link-local, but link {} has no \
                             IPv6 link-local address",
                            link.name
                        ))
                    })?
                }
                _ => {
                    let source = route(store).map_err(|e| {
                        refuse(format!("no route to the rendezvous store at {store}: {e}"))
                    })?;
                    // One link: listen on its address alone. Several, or a routed identity:
                    // `rlx-net` listens on every address and advertises this source.
                    if map.links.len() > 1 || map.owner_of(source).is_none() {
                        map.home = position;
                        return Ok(Plan { map, bind: None });
                    }
                    source
                }
            };
            map.home = position;
            Ok(Plan {
                map,
                bind: Some(bind),
            })
        }
    }
}

impl LinkMap {
    /// The link of a route whose source is the routed identity `source`: the interface the
    /// kernel sends `dest` through, which must be a link.
    fn by_route_interface(
        &self,
        dest: SocketAddr,
        source: IpAddr,
    ) -> std::result::Result<&Interface, String> {
        let name = (self.route_interface)(dest).ok_or_else(|| {
            format!(
                "the route to {dest} starts at this host's routed identity {source}, and the \
                 interface it leaves through cannot be read here"
            )
        })?;
        self.links.iter().find(|l| l.name == name).ok_or_else(|| {
            format!(
                "the route to {dest} leaves through {name} (source address {source}), which is \
                 not a Thunderbolt link in use (the links are {}); refusing to use it (name it in \
                 RLX_TB_IFNAME beside the links, e.g. RLX_TB_IFNAME=thunderbolt,{name}, to \
                 let this traffic use it)",
                self.names()
            )
        })
    }
}

/// The hostfile side of [`plan`]: this rank listens on each of its own addresses (pinned to
/// the link that owns it, or unpinned on its routed identity), and reaches each peer at the
/// addresses of its entry that rlx-net will use (`rlx_transport::hostfile`), each over a link.
fn plan_hostfile(
    rank: u32,
    table: &[Vec<SocketAddr>],
    mut map: LinkMap,
    route: &dyn Fn(SocketAddr) -> io::Result<IpAddr>,
) -> Result<Plan> {
    let refuse = |what: String| CollectiveError::config(what);
    let mine = table.get(rank as usize).ok_or_else(|| {
        refuse(format!(
            "the hostfile lists {} ranks, so rank {rank} has no entry",
            table.len()
        ))
    })?;
    for (i, addr) in mine.iter().enumerate() {
        if map.is_routed_identity(addr.ip()) {
            continue;
        }
        let link = map.for_local(*addr).map_err(|why| {
            refuse(format!(
                "rank {rank} cannot listen on its hostfile address {addr}: {why}"
            ))
        })?;
        if i == 0 {
            map.home = map.position(link);
        }
    }
    for (peer, entry) in table.iter().enumerate() {
        if peer == rank as usize {
            continue;
        }
        for addr in (map.usable)(entry) {
            map.for_peer(addr, route).map_err(|why| {
                refuse(format!(
                    "rank {rank} cannot reach rank {peer} at {addr} over Thunderbolt: {why}"
                ))
            })?;
        }
    }
    Ok(Plan { map, bind: None })
}

/// Rank 0's side of store mode: the store at `store`, an address of a link (listened on
/// alone when it is the only link) or the rank's routed identity (see the module docs).
fn host_store(store: SocketAddr, mut map: LinkMap) -> Result<Plan> {
    if map.is_routed_identity(store.ip()) {
        return Ok(Plan { map, bind: None });
    }
    let link = map.for_local(store).map_err(|why| {
        CollectiveError::config(format!(
            "rank 0 hosts the rendezvous store at {store}, which it cannot do over \
             Thunderbolt: {why}"
        ))
    })?;
    map.home = map.position(link);
    let bind = (map.links.len() == 1).then_some(store.ip());
    Ok(Plan { map, bind })
}

#[cfg(test)]
mod tests {
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
        let mut map =
            LinkMap::new(vec![tb0.clone(), tb1.clone()], vec![lo, eth, tb0, tb1]).unwrap();
        // Every listed address is used, whatever this test host's own networks are.
        map.usable = <[SocketAddr]>::to_vec;
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
        map.usable = |entry| {
            let shared = entry
                .iter()
                .filter(|a| a.ip().to_string().starts_with("10.2."));
            shared.copied().collect()
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
}
