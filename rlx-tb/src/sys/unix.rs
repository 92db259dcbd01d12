//! What Linux and macOS share: `if_nametoindex` / `if_indextoname`, wrapped safely, and the
//! grouping of the interface list (read by [`rlx_transport::interfaces`]) per interface.

use std::ffi::{CStr, CString};
use std::net::IpAddr;

use rlx_transport::interfaces::InterfaceAddress;

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

/// Groups interface-list entries by interface, in first-seen order: `(name, up, addresses)`,
/// where `up` means up and running.
pub(crate) fn group_by_interface(entries: &[InterfaceAddress]) -> Vec<(String, bool, Vec<IpAddr>)> {
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
        slot.1 |= entry.is_up_and_running();
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
        let entries = rlx_transport::interfaces::addresses().unwrap();
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
        let entry = |name: &str, addr: Option<&str>, up: bool| InterfaceAddress {
            name: name.into(),
            addr: addr.map(|a| a.parse().unwrap()),
            up,
            running: up,
            prefix: None,
        };
        let entries = vec![
            entry("a", None, false),
            entry("b", Some("10.0.0.1"), true),
            entry("a", Some("fe80::1"), true),
        ];
        let grouped = group_by_interface(&entries);
        assert_eq!(grouped.len(), 2);
        assert_eq!(grouped[0].0, "a");
        assert!(grouped[0].1);
        assert_eq!(grouped[0].2, vec!["fe80::1".parse::<IpAddr>().unwrap()]);
        assert_eq!(grouped[1].2, vec!["10.0.0.1".parse::<IpAddr>().unwrap()]);
    }
}
