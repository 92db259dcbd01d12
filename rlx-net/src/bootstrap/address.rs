//! Address choice: which local address a rank listens on and advertises, IPv6 link-local
//! scopes, and the public address the store hands out for an advertised one.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use rlx_transport::CollectiveError;

use super::config::BootConfig;
use super::socket::unspecified;

/// Interface addresses of this host, by name (IPv4 and IPv6, link-local v6 excluded: without a
/// scope id other hosts could not use them).
fn interface_addresses() -> Result<Vec<(String, IpAddr)>, CollectiveError> {
    let entries = rlx_transport::interfaces::addresses()?;
    Ok(entries
        .into_iter()
        .filter_map(|entry| match entry.addr? {
            IpAddr::V6(v6) if is_link_local_v6(&v6) => None,
            ip => Some((entry.name, ip)),
        })
        .collect())
}

/// The scope id of the store's address when it is IPv6 link-local, as this host resolved it.
///
/// A link-local address means nothing without its link, and a scope id is an interface index
/// of the host that chose it, so none travels through the store (addresses are advertised
/// without one). When the store is reached over a link-local address, every link-local address
/// of the job is taken to be on that same link: this host's scope of the store applies to its
/// own listener and to every link-local address in the table.
pub(super) fn store_scope(master: &[SocketAddr]) -> Option<u32> {
    master.iter().find_map(|a| match a {
        SocketAddr::V6(v6) if is_link_local_v6(v6.ip()) && v6.scope_id() != 0 => {
            Some(v6.scope_id())
        }
        _ => None,
    })
}

/// `addr` with the scope id `scope` when it is IPv6 link-local and a scope is known.
pub(super) fn with_scope(mut addr: SocketAddr, scope: Option<u32>) -> SocketAddr {
    if let (SocketAddr::V6(v6), Some(scope)) = (&mut addr, scope) {
        if is_link_local_v6(v6.ip()) {
            v6.set_scope_id(scope);
        }
    }
    addr
}

fn is_link_local_v6(ip: &Ipv6Addr) -> bool {
    ip.segments()[0] & 0xffc0 == 0xfe80
}

/// The address this rank listens on and advertises in store mode.
pub(super) fn choose_ip(
    cfg: &BootConfig,
    master: &[SocketAddr],
) -> Result<(IpAddr, IpAddr), CollectiveError> {
    if let Some(ip) = cfg.bind_ip {
        return Ok((ip, ip));
    }
    let want_v6 = master.iter().all(SocketAddr::is_ipv6);
    if let Some(filter) = &cfg.ifname {
        let all = interface_addresses()?;
        let pick = all
            .iter()
            .filter(|(name, _)| filter.matches(name))
            .find(|(_, ip)| ip.is_ipv6() == want_v6)
            .or_else(|| all.iter().find(|(name, _)| filter.matches(name)));
        return match pick {
            Some((name, ip)) => {
                tracing::debug!(interface = %name, %ip, "RLX_SOCKET_IFNAME={filter} chose the address");
                Ok((*ip, *ip))
            }
            None => {
                let seen: Vec<String> = all.iter().map(|(n, ip)| format!("{n} ({ip})")).collect();
                Err(CollectiveError::config(format!(
                    "RLX_SOCKET_IFNAME={filter} matches no interface; this host has {}",
                    seen.join(", ")
                )))
            }
        };
    }
    // The local end of a route towards the store: the interface other hosts reach this one
    // on.
    for target in master {
        if let Some(local) = rlx_transport::interfaces::route_source(*target) {
            tracing::debug!(
                advertised = %local,
                store = %target,
                "advertising the local end of the route to the store"
            );
            return Ok((unspecified(local), local));
        }
    }
    let ip = master
        .first()
        .map_or(IpAddr::V4(Ipv4Addr::LOCALHOST), SocketAddr::ip);
    Ok((unspecified(ip), ip))
}

/// The address other ranks should use for `advertised`, which the store saw arrive from
/// `observed` (for rank 0: the store's own address as a remote rank reached it). A loopback or
/// unspecified advertisement is replaced by a non-loopback observed address, so a host name
/// that resolved to loopback is never handed to other hosts; with no such observation the job
/// is local and loopback is right.
pub(super) fn public_address(advertised: SocketAddr, observed: Option<IpAddr>) -> SocketAddr {
    let ip = advertised.ip();
    if !(ip.is_loopback() || ip.is_unspecified()) {
        return advertised;
    }
    let mut out = advertised;
    match observed.filter(|o| !o.is_loopback() && !o.is_unspecified()) {
        Some(seen) => out.set_ip(seen),
        None if ip.is_unspecified() => out.set_ip(loopback_of(ip)),
        None => {}
    }
    out
}

fn loopback_of(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn loopback_is_never_advertised_to_remote_ranks() {
        let remote: IpAddr = "10.1.2.3".parse().unwrap();
        assert_eq!(
            public_address(sa("127.0.1.1:5"), Some(remote)),
            sa("10.1.2.3:5")
        );
        assert_eq!(
            public_address(sa("0.0.0.0:5"), Some(remote)),
            sa("10.1.2.3:5")
        );
        assert_eq!(
            public_address(sa("192.168.0.9:5"), Some(remote)),
            sa("192.168.0.9:5")
        );
        // A local job keeps loopback.
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        assert_eq!(
            public_address(sa("127.0.0.1:5"), Some(lo)),
            sa("127.0.0.1:5")
        );
        assert_eq!(public_address(sa("0.0.0.0:5"), None), sa("127.0.0.1:5"));
        assert_eq!(public_address(sa("[::]:5"), None), sa("[::1]:5"));
    }
}
