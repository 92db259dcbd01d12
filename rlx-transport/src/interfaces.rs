//! The network interfaces of this host and their addresses, as `getifaddrs` lists them: the one
//! safe wrapper of that call in the workspace.
//!
//! `rlx-net` picks the address that `RLX_SOCKET_IFNAME` selects from this list, and `rlx-tb`
//! finds the Thunderbolt links and their IPv6 link-local addresses in it. It is read on Unix
//! (Linux and macOS, where RLX runs); elsewhere [`addresses`] answers
//! [`CollectiveError::Unsupported`](crate::CollectiveError::Unsupported), so every crate above
//! still builds.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};

use crate::Result;

/// One entry of the interface list: an interface with one of its addresses, or with none.
///
/// An interface appears once per address. Its link-layer entry (`AF_PACKET` on Linux, `AF_LINK`
/// on macOS) comes with `addr: None`, which is how an interface without any IP address is still
/// seen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InterfaceAddress {
    /// The interface name (`eth0`, `thunderbolt0`, `en5`).
    pub name: String,
    /// The IPv4 or IPv6 address of this entry; `None` for every other address family and for
    /// an entry without an address.
    pub addr: Option<IpAddr>,
    /// `IFF_UP`: the interface is administratively up.
    pub up: bool,
    /// `IFF_RUNNING`: the link has carrier.
    pub running: bool,
    /// The length of the address's network prefix, from its netmask (`24` for a
    /// `255.255.255.0`); `None` without an address or a netmask. Two hosts with addresses in
    /// one network of this length share a link (a cable or a switch) without a router.
    pub prefix: Option<u8>,
}

impl InterfaceAddress {
    /// Whether the interface can carry traffic now: administratively up and with carrier.
    pub fn is_up_and_running(&self) -> bool {
        self.up && self.running
    }
}

/// Every interface address of the calling thread's network namespace, in the order the system
/// lists them.
///
/// Call it when choosing an interface (at bootstrap or link discovery): it makes one system
/// call, does not block on the network, and returns a copy, so later changes to the interfaces
/// are not seen.
///
/// # Errors
///
/// [`CollectiveError::Io`](crate::CollectiveError::Io) naming `getifaddrs` when the system
/// call fails; [`CollectiveError::Unsupported`](crate::CollectiveError::Unsupported) off Unix.
///
/// # Examples
///
/// ```
/// use rlx_transport::interfaces;
///
/// let ipv4: Vec<_> = interfaces::addresses()?
///     .into_iter()
///     .filter(|entry| entry.is_up_and_running() && entry.addr.is_some_and(|ip| ip.is_ipv4()))
///     .map(|entry| entry.name)
///     .collect();
/// println!("interfaces with IPv4: {ipv4:?}");
/// # Ok::<(), rlx_transport::CollectiveError>(())
/// ```
pub fn addresses() -> Result<Vec<InterfaceAddress>> {
    os::addresses()
}

/// The local address the kernel's routing table would send traffic to `to` from (the local
/// end of the route), or `None` when there is no route. Connecting a UDP socket asks the kernel
/// for the route and sends nothing.
pub fn route_source(to: SocketAddr) -> Option<IpAddr> {
    let unspecified: IpAddr = match to {
        SocketAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        SocketAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
    };
    let udp = UdpSocket::bind((unspecified, 0)).ok()?;
    udp.connect(to).ok()?;
    udp.local_addr().ok().map(|local| local.ip())
}

#[cfg(unix)]
mod os {
    use std::ffi::CStr;
    use std::io;
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

    use super::InterfaceAddress;
    use crate::{CollectiveError, Result};

    pub(super) fn addresses() -> Result<Vec<InterfaceAddress>> {
        let mut out = Vec::new();
        // SAFETY: `getifaddrs` either fails and leaves `head` null, or stores in it a list it
        // allocated; only then is the list walked and freed. Every node reached through
        // `ifa_next` stays valid until `freeifaddrs`, and nothing else writes to the list. A
        // non-null `ifa_name` is a NUL-terminated string of the list, copied before the list is
        // freed. A non-null `ifa_addr` points at a `sockaddr` at least as large as the structure
        // its `sa_family` names; the family is read first and selects the one structure that is
        // read, with unaligned reads because a `sockaddr` is only aligned for its own fields,
        // less than `sockaddr_in6` needs. `freeifaddrs` runs exactly once, on the head
        // `getifaddrs` returned, after the last read of the list.
        let listed = unsafe {
            let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
            if libc::getifaddrs(&mut head) != 0 {
                Err(io::Error::last_os_error())
            } else {
                let mut cursor = head;
                while let Some(entry) = cursor.as_ref() {
                    if !entry.ifa_name.is_null() {
                        let sockaddr = entry.ifa_addr;
                        let addr = if sockaddr.is_null() {
                            None
                        } else {
                            match i32::from((&raw const (*sockaddr).sa_family).read_unaligned()) {
                                libc::AF_INET => Some(IpAddr::V4(ipv4(
                                    &sockaddr.cast::<libc::sockaddr_in>().read_unaligned(),
                                ))),
                                libc::AF_INET6 => Some(IpAddr::V6(ipv6(
                                    &sockaddr.cast::<libc::sockaddr_in6>().read_unaligned(),
                                ))),
                                _ => None,
                            }
                        };
                        let prefix = if addr.is_some() && !entry.ifa_netmask.is_null() {
                            prefix_of(entry.ifa_netmask)
                        } else {
                            None
                        };
                        out.push(InterfaceAddress {
                            name: CStr::from_ptr(entry.ifa_name)
                                .to_string_lossy()
                                .into_owned(),
                            addr,
                            prefix,
                            up: has_flag(entry.ifa_flags.into(), libc::IFF_UP),
                            running: has_flag(entry.ifa_flags.into(), libc::IFF_RUNNING),
                        });
                    }
                    cursor = entry.ifa_next;
                }
                libc::freeifaddrs(head);
                Ok(())
            }
        };
        match listed {
            Ok(()) => Ok(out),
            Err(source) => Err(CollectiveError::Io {
                peer: None,
                source: io::Error::new(source.kind(), format!("getifaddrs: {source}")),
            }),
        }
    }

    /// The prefix length of a netmask: its leading one bits, for an IPv4 or IPv6 mask.
    ///
    /// # Safety
    ///
    /// `mask` points at a `sockaddr` at least as large as the structure its `sa_family`
    /// names, as `getifaddrs` lists them.
    unsafe fn prefix_of(mask: *const libc::sockaddr) -> Option<u8> {
        // SAFETY: the caller vouches for `mask`; the family is read first and selects the one
        // structure read, unaligned as in `addresses`.
        let bits = unsafe {
            match i32::from((&raw const (*mask).sa_family).read_unaligned()) {
                libc::AF_INET => {
                    u32::from(ipv4(&mask.cast::<libc::sockaddr_in>().read_unaligned()))
                        .leading_ones()
                }
                libc::AF_INET6 => {
                    u128::from(ipv6(&mask.cast::<libc::sockaddr_in6>().read_unaligned()))
                        .leading_ones()
                }
                _ => return None,
            }
        };
        u8::try_from(bits).ok()
    }

    /// The IPv4 address of a `sockaddr_in` (stored in network byte order).
    fn ipv4(sin: &libc::sockaddr_in) -> Ipv4Addr {
        Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr))
    }

    /// The IPv6 address of a `sockaddr_in6`; its scope id is the interface itself, so it is
    /// not kept.
    fn ipv6(sin6: &libc::sockaddr_in6) -> Ipv6Addr {
        Ipv6Addr::from(sin6.sin6_addr.s6_addr)
    }

    /// Whether `flags` (an `ifa_flags`, widened because its width differs between systems) has
    /// `flag` (an `IFF_*` constant) set.
    fn has_flag(flags: u64, flag: libc::c_int) -> bool {
        // The `IFF_*` constants are small positive bit masks, declared as `c_int` by libc while
        // `ifa_flags` is unsigned; the cast keeps their bits.
        flags & (flag as u64) != 0
    }
}

#[cfg(not(unix))]
mod os {
    use super::InterfaceAddress;
    use crate::{CollectiveError, Result};

    pub(super) fn addresses() -> Result<Vec<InterfaceAddress>> {
        Err(CollectiveError::unsupported(format!(
            "listing network interfaces on {}: RLX reads them with getifaddrs, on Unix only",
            std::env::consts::OS
        )))
    }
}

#[cfg(all(test, unix))]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};

    use super::*;

    #[test]
    fn loopback_is_listed_up_with_its_ipv4_address() {
        let entries = addresses().unwrap();
        let loopback = entries
            .iter()
            .find(|e| e.addr == Some(IpAddr::V4(Ipv4Addr::LOCALHOST)))
            .unwrap_or_else(|| panic!("no entry has 127.0.0.1: {entries:?}"));
        assert!(loopback.name.starts_with("lo"), "{loopback:?}");
        assert!(loopback.is_up_and_running(), "{loopback:?}");
        assert_eq!(loopback.prefix, Some(8), "{loopback:?}");
    }
}
