//! What Linux and macOS share: the interface list of `getifaddrs` and `if_nametoindex` /
//! `if_indextoname`, wrapped safely.

use std::ffi::{CStr, CString};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use rlx_transport::{CollectiveError, Result};

/// One entry of `getifaddrs`: an interface name with one of its addresses (or none) and its
/// flags. An interface appears once per address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct IfAddr {
    pub(crate) name: String,
    pub(crate) addr: Option<IpAddr>,
    pub(crate) flags: u32,
}

impl IfAddr {
    /// Whether the flags say administratively up and running (carrier present).
    pub(crate) fn is_up(&self) -> bool {
        let up = libc::IFF_UP as u32;
        let running = libc::IFF_RUNNING as u32;
        self.flags & up != 0 && self.flags & running != 0
    }
}

fn io_error(call: &str) -> CollectiveError {
    let source = std::io::Error::last_os_error();
    CollectiveError::Io {
        peer: None,
        source: std::io::Error::new(source.kind(), format!("{call}: {source}")),
    }
}

/// Every interface address of the calling thread's network namespace.
pub(crate) fn if_addrs() -> Result<Vec<IfAddr>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `getifaddrs` stores the head of a list it allocated into `head`, or fails and
    // leaves it untouched; the list is freed below with `freeifaddrs`.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(io_error("getifaddrs"));
    }
    let mut out = Vec::new();
    let mut cursor = head;
    while !cursor.is_null() {
        // SAFETY: `cursor` is a node of the list returned by `getifaddrs`, valid until
        // `freeifaddrs`; nothing else mutates it.
        let entry = unsafe { &*cursor };
        if !entry.ifa_name.is_null() {
            // SAFETY: `ifa_name` is a NUL-terminated string owned by the list.
            let name = unsafe { CStr::from_ptr(entry.ifa_name) }
                .to_string_lossy()
                .into_owned();
            out.push(IfAddr {
                name,
                addr: ip_of(entry.ifa_addr),
                flags: entry.ifa_flags,
            });
        }
        cursor = entry.ifa_next;
    }
    // SAFETY: `head` came from a successful `getifaddrs` and is freed exactly once; no borrow of
    // the list outlives this point (names were copied).
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

/// The IP address in a `sockaddr` of `getifaddrs`, when it is IPv4 or IPv6.
fn ip_of(addr: *const libc::sockaddr) -> Option<IpAddr> {
    if addr.is_null() {
        return None;
    }
    // SAFETY: a non-null `ifa_addr` points at a sockaddr at least as large as its family's
    // structure; the family is read first and selects the structure that is read (unaligned
    // reads, since the list gives no alignment promise beyond the platform's).
    unsafe {
        match i32::from((*addr).sa_family) {
            libc::AF_INET => {
                let sin = std::ptr::read_unaligned(addr.cast::<libc::sockaddr_in>());
                Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(
                    sin.sin_addr.s_addr,
                ))))
            }
            libc::AF_INET6 => {
                let sin6 = std::ptr::read_unaligned(addr.cast::<libc::sockaddr_in6>());
                Some(IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)))
            }
            _ => None,
        }
    }
}

/// The index of interface `name`, or `None` when there is no such interface.
pub(crate) fn index_of(name: &str) -> Option<u32> {
    let name = CString::new(name).ok()?;
    // SAFETY: `name` is a valid NUL-terminated string for the duration of the call.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    (index != 0).then_some(index)
}

/// The name of interface `index`, or `None` when there is no such interface.
#[cfg_attr(
    not(target_os = "macos"),
    allow(dead_code, reason = "Linux reads the bound name directly")
)]
pub(crate) fn name_of(index: u32) -> Option<String> {
    let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: `buf` has the `IF_NAMESIZE` bytes `if_indextoname` may write, including the NUL.
    let got = unsafe { libc::if_indextoname(index, buf.as_mut_ptr()) };
    if got.is_null() {
        return None;
    }
    // SAFETY: on success `buf` holds a NUL-terminated name.
    let name = unsafe { CStr::from_ptr(buf.as_ptr()) };
    Some(name.to_string_lossy().into_owned())
}

/// Groups `getifaddrs` entries by interface, in first-seen order: `(name, up, addresses)`.
pub(crate) fn group_by_interface(entries: &[IfAddr]) -> Vec<(String, bool, Vec<IpAddr>)> {
    let mut out: Vec<(String, bool, Vec<IpAddr>)> = Vec::new();
    for entry in entries {
        let at = match out.iter().position(|(n, _, _)| *n == entry.name) {
            Some(at) => at,
            None => {
                out.push((entry.name.clone(), false, Vec::new()));
                out.len() - 1
            }
        };
        let slot = &mut out[at];
        slot.1 |= entry.is_up();
        if let Some(addr) = entry.addr {
            slot.2.push(addr);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_listed_with_its_index() {
        let entries = if_addrs().unwrap();
        assert!(entries.iter().any(|e| e.name == "lo" || e.name == "lo0"));
        let lo = entries
            .iter()
            .find(|e| e.name.starts_with("lo"))
            .map(|e| e.name.clone())
            .unwrap();
        let index = index_of(&lo).unwrap();
        assert_eq!(name_of(index).as_deref(), Some(lo.as_str()));
        assert_eq!(index_of("no-such-if0"), None);
        assert_eq!(index_of("bad\0name"), None);
    }

    #[test]
    fn entries_are_grouped_per_interface() {
        let up = (libc::IFF_UP | libc::IFF_RUNNING) as u32;
        let entries = vec![
            IfAddr {
                name: "a".into(),
                addr: None,
                flags: 0,
            },
            IfAddr {
                name: "b".into(),
                addr: Some("10.0.0.1".parse().unwrap()),
                flags: up,
            },
            IfAddr {
                name: "a".into(),
                addr: Some("fe80::1".parse().unwrap()),
                flags: up,
            },
        ];
        let grouped = group_by_interface(&entries);
        assert_eq!(grouped.len(), 2);
        assert_eq!(grouped[0].0, "a");
        assert!(grouped[0].1);
        assert_eq!(grouped[0].2, vec!["fe80::1".parse::<IpAddr>().unwrap()]);
        assert_eq!(grouped[1].2, vec!["10.0.0.1".parse::<IpAddr>().unwrap()]);
    }
}
