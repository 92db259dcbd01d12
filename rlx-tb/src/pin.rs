//! Keeping sockets on the Thunderbolt link: binding a `socket2::Socket` to an [`Interface`],
//! reading the binding back, and IPv6 link-local addresses with their scope id.
//!
//! Pin every socket — listening and connecting — before `bind`/`connect`: a pinned socket
//! cannot route through another interface, so a peer reachable only over Wi-Fi or Ethernet
//! fails to connect instead of being reached the wrong way.

use std::net::{IpAddr, Ipv6Addr, SocketAddr, SocketAddrV6};

use rlx_transport::{CollectiveError, Result};
use socket2::Socket;

use crate::discovery::Interface;
use crate::sys;

/// Binds `socket` to `interface` (`SO_BINDTODEVICE` on Linux, which needs `CAP_NET_RAW` on
/// older kernels; `IP_BOUND_IF`/`IPV6_BOUND_IF` by the socket's family on macOS). Call it
/// before `bind` or `connect`.
///
/// # Examples
///
/// ```no_run
/// use socket2::{Domain, Socket, Type};
///
/// let link = rlx_tb::discover()?.remove(0);
/// let socket = Socket::new(Domain::IPV4, Type::STREAM, None).map_err(|source| {
///     rlx_transport::CollectiveError::Io { peer: None, source }
/// })?;
/// rlx_tb::pin_socket(&socket, &link)?;
/// assert_eq!(rlx_tb::pinned_interface(&socket)?, Some(link.name.clone()));
/// # Ok::<(), rlx_transport::CollectiveError>(())
/// ```
pub fn pin_socket(socket: &Socket, interface: &Interface) -> Result<()> {
    sys::pin_socket(socket, interface)
}

/// The interface `socket` is pinned to, if any.
pub fn pinned_interface(socket: &Socket) -> Result<Option<String>> {
    sys::pinned_interface(socket)
}

/// Whether `addr` is an IPv6 link-local address (`fe80::/10`), which is ambiguous without a
/// scope id.
pub fn is_link_local_v6(addr: &Ipv6Addr) -> bool {
    addr.segments()[0] & 0xffc0 == 0xfe80
}

/// The socket address of `ip:port` reached over `interface`: IPv6 link-local addresses get the
/// interface's index as scope id (and fail without one); other addresses are returned as they
/// are.
pub fn scoped_addr(ip: IpAddr, port: u16, interface: &Interface) -> Result<SocketAddr> {
    match ip {
        IpAddr::V6(v6) if is_link_local_v6(&v6) => {
            if interface.index == 0 {
                return Err(CollectiveError::config(format!(
                    "link-local address {v6} needs the index of interface {}, which is unknown",
                    interface.name
                )));
            }
            Ok(SocketAddr::V6(SocketAddrV6::new(
                v6,
                port,
                0,
                interface.index,
            )))
        }
        other => Ok(SocketAddr::new(other, port)),
    }
}

/// Parses `address` as a hostfile writes it — `10.0.0.2`, `fe80::1%thunderbolt0`,
/// `[fe80::1%thunderbolt0]:5000` or `[fe80::1]:5000` — into the IP, the scope's interface
/// name (when given) and the port (when given).
pub fn parse_scoped(address: &str) -> Result<(IpAddr, Option<String>, Option<u16>)> {
    let bad = |why: &str| CollectiveError::config(format!("address {address:?}: {why}"));
    let (host, port) = match address.strip_prefix('[') {
        Some(rest) => {
            let (host, tail) = rest.split_once(']').ok_or_else(|| bad("missing ']'"))?;
            let port = match tail.strip_prefix(':') {
                Some(p) => Some(p.parse::<u16>().map_err(|_| bad("bad port"))?),
                None if tail.is_empty() => None,
                None => return Err(bad("unexpected text after ']'")),
            };
            (host, port)
        }
        None => match address.rsplit_once(':') {
            // One colon: IPv4 with a port. Several: a bare IPv6 address.
            Some((host, port)) if !host.contains(':') => (
                host,
                Some(port.parse::<u16>().map_err(|_| bad("bad port"))?),
            ),
            _ => (address, None),
        },
    };
    let (ip, scope) = match host.split_once('%') {
        Some((ip, scope)) if !scope.is_empty() => (ip, Some(scope.to_owned())),
        Some(_) => return Err(bad("empty scope after '%'")),
        None => (host, None),
    };
    let ip: IpAddr = ip.parse().map_err(|_| bad("not an IP address"))?;
    if scope.is_some() && !matches!(ip, IpAddr::V6(_)) {
        return Err(bad("a scope is only meaningful for IPv6"));
    }
    Ok((ip, scope, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_local_addresses_get_the_scope_of_their_interface() {
        let tb = Interface::new("thunderbolt0", 7, true);
        let addr = scoped_addr("fe80::2".parse().unwrap(), 4000, &tb).unwrap();
        assert_eq!(addr.to_string(), "[fe80::2%7]:4000");
        let global = scoped_addr("fd00::2".parse().unwrap(), 4000, &tb).unwrap();
        assert_eq!(global.to_string(), "[fd00::2]:4000");
        let v4 = scoped_addr("169.254.0.2".parse().unwrap(), 1, &tb).unwrap();
        assert_eq!(v4.to_string(), "169.254.0.2:1");
        let unknown = Interface::new("thunderbolt0", 0, true);
        assert!(scoped_addr("fe80::2".parse().unwrap(), 1, &unknown).is_err());
    }

    #[test]
    fn hostfile_addresses_parse_with_scopes_and_ports() {
        let v6: IpAddr = "fe80::1".parse().unwrap();
        assert_eq!(
            parse_scoped("fe80::1%thunderbolt0").unwrap(),
            (v6, Some("thunderbolt0".into()), None)
        );
        assert_eq!(
            parse_scoped("[fe80::1%bridge0]:5000").unwrap(),
            (v6, Some("bridge0".into()), Some(5000))
        );
        assert_eq!(parse_scoped("[fe80::1]:1").unwrap(), (v6, None, Some(1)));
        assert_eq!(
            parse_scoped("10.0.0.2:99").unwrap(),
            ("10.0.0.2".parse().unwrap(), None, Some(99))
        );
        assert_eq!(parse_scoped("fe80::1").unwrap(), (v6, None, None));
        for bad in [
            "10.0.0.2%eth0",
            "[fe80::1",
            "[fe80::1]x",
            "fe80::1%",
            "host:port",
            "10.0.0.2:99999",
            "",
        ] {
            assert!(parse_scoped(bad).is_err(), "{bad:?} parsed");
        }
    }
}
