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

/// Which addresses of each hostfile entry rank `me` uses (one list per rank).
type UsableAddresses = fn(table: &[Vec<SocketAddr>], me: usize) -> Vec<Vec<SocketAddr>>;

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
    usable: UsableAddresses,
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
    let used = (map.usable)(table, rank as usize);
    for (peer, entry) in used.iter().enumerate() {
        if peer == rank as usize {
            continue;
        }
        for &addr in entry {
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
mod tests;
