//! Linux: Thunderbolt links from sysfs (driver `thunderbolt-net`, or a `thunderbolt*` name),
//! addresses from `getifaddrs`, pinning with `SO_BINDTODEVICE`, the interface of an IPv4 route
//! from `/proc/self/net/route` (the main table of the thread's namespace).
//!
//! sysfs shows the network namespace of whoever mounted it, so inside a namespace run the
//! process under `ip netns exec`, which mounts a matching sysfs.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;

use rlx_transport::interfaces::{self, InterfaceAddress};
use rlx_transport::{CollectiveError, Result};
use socket2::Socket;

use crate::discovery::{Evidence, Interface};
use crate::sys::unix;

/// Where the kernel lists the network interfaces.
pub(crate) const SYSFS_NET: &str = "/sys/class/net";

/// The name of the Linux driver of Thunderbolt networking (`drivers/net/thunderbolt`).
pub(crate) const THUNDERBOLT_NET_DRIVER: &str = "thunderbolt-net";

fn sysfs_error(path: &Path, source: io::Error) -> CollectiveError {
    CollectiveError::Io {
        peer: None,
        source: io::Error::new(
            source.kind(),
            format!("reading {}: {source}", path.display()),
        ),
    }
}

/// Reads a small sysfs attribute, trimmed; `None` when it is absent or unreadable (virtual
/// devices lack some attributes, and some are readable only by root).
fn attribute(dir: &Path, name: &str) -> Option<String> {
    std::fs::read_to_string(dir.join(name))
        .ok()
        .map(|s| s.trim().to_owned())
}

/// Every interface under `root` (normally [`SYSFS_NET`]), sorted by name, with index, driver,
/// up state and Thunderbolt evidence but no addresses.
pub(crate) fn scan_sysfs(root: &Path) -> Result<Vec<Interface>> {
    let entries = std::fs::read_dir(root).map_err(|e| sysfs_error(root, e))?;
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| sysfs_error(root, e))?;
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        let dir = entry.path();
        let index = attribute(&dir, "ifindex")
            .and_then(|s| s.parse::<u32>().ok())
            .unwrap_or(0);
        let driver = std::fs::read_link(dir.join("device").join("driver"))
            .ok()
            .and_then(|target| target.file_name().map(|n| n.to_string_lossy().into_owned()));
        let flags = attribute(&dir, "flags")
            .and_then(|s| u32::from_str_radix(s.trim_start_matches("0x"), 16).ok());
        let admin_up = flags.is_some_and(|f| f & libc::IFF_UP as u32 != 0);
        let carrier = attribute(&dir, "operstate").is_none_or(|state| state != "down");
        let thunderbolt = if driver.as_deref() == Some(THUNDERBOLT_NET_DRIVER) {
            Some(Evidence::Driver)
        } else if name.starts_with("thunderbolt") {
            Some(Evidence::Name)
        } else {
            None
        };
        out.push(Interface {
            index,
            up: admin_up && carrier,
            addrs: Vec::new(),
            thunderbolt,
            driver,
            name,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// Adds the addresses of `entries` (the interface list) to the interfaces of the same name.
pub(crate) fn merge_addresses(interfaces: &mut [Interface], entries: &[InterfaceAddress]) {
    for (name, _, addrs) in unix::group_by_interface(entries) {
        if let Some(interface) = interfaces.iter_mut().find(|i| i.name == name) {
            interface.addrs = addrs;
        }
    }
}

/// The contract's `list_interfaces`: sysfs for identity, `getifaddrs` for addresses.
pub(crate) fn list_interfaces() -> Result<Vec<Interface>> {
    let mut interfaces = scan_sysfs(Path::new(SYSFS_NET))?;
    let entries = interfaces::addresses()?;
    // sysfs can belong to another network namespace than this thread; trust the thread's own
    // view for what exists and its index, and sysfs only for the driver evidence.
    let grouped = unix::group_by_interface(&entries);
    interfaces.retain(|i| grouped.iter().any(|(n, _, _)| *n == i.name));
    for (name, up, _) in &grouped {
        match interfaces.iter_mut().find(|i| i.name == *name) {
            Some(interface) => {
                interface.index = unix::index_of(name).unwrap_or(interface.index);
                interface.up = *up;
            }
            None => {
                let mut interface =
                    Interface::new(name.clone(), unix::index_of(name).unwrap_or(0), *up);
                if name.starts_with("thunderbolt") {
                    interface.thunderbolt = Some(Evidence::Name);
                }
                interfaces.push(interface);
            }
        }
    }
    merge_addresses(&mut interfaces, &entries);
    Ok(interfaces)
}

/// The contract's `pin_socket`: `SO_BINDTODEVICE` to the interface's name.
pub(crate) fn pin_socket(socket: &Socket, interface: &Interface) -> Result<()> {
    socket
        .bind_device(Some(interface.name.as_bytes()))
        .map_err(|source| CollectiveError::Io {
            peer: None,
            source: io::Error::new(
                source.kind(),
                format!("SO_BINDTODEVICE {}: {source}", interface.name),
            ),
        })
}

/// The contract's `pinned_interface`: reads `SO_BINDTODEVICE` back.
pub(crate) fn pinned_interface(socket: &Socket) -> Result<Option<String>> {
    let device = socket.device().map_err(|source| CollectiveError::Io {
        peer: None,
        source: io::Error::new(
            source.kind(),
            format!("getsockopt SO_BINDTODEVICE: {source}"),
        ),
    })?;
    Ok(device.map(|name| String::from_utf8_lossy(&name).into_owned()))
}

/// The contract's `route_interface`: the longest-prefix IPv4 route of the main table that is
/// up, the lowest metric first among equals; `None` for IPv6 or when the table is unreadable.
pub(crate) fn route_interface(dest: SocketAddr) -> Option<String> {
    let IpAddr::V4(v4) = dest.ip() else {
        return None;
    };
    let table = std::fs::read_to_string("/proc/self/net/route").ok()?;
    ipv4_route_interface(&table, v4)
}

/// The interface `table` (the text of `/proc/net/route`) routes `dest` through. The kernel
/// prints each address as the hexadecimal of its in-memory (network order) 32-bit word, so
/// the bytes of the parsed number in native order are the address.
pub(crate) fn ipv4_route_interface(table: &str, dest: Ipv4Addr) -> Option<String> {
    const RTF_UP: u32 = 0x1;
    let word = |field: &str| u32::from_str_radix(field, 16).ok();
    let address = |field: &str| word(field).map(|w| Ipv4Addr::from(w.to_ne_bytes()));
    let mut best: Option<(u32, u32, &str)> = None;
    for line in table.lines().skip(1) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [
            iface,
            destination,
            _gateway,
            flags,
            _refcnt,
            _use,
            metric,
            mask,
            ..,
        ] = fields.as_slice()
        else {
            continue;
        };
        let (Some(network), Some(flags), Some(metric), Some(mask)) = (
            address(destination),
            word(flags),
            metric.parse::<u32>().ok(),
            address(mask),
        ) else {
            continue;
        };
        let mask = u32::from(mask);
        if flags & RTF_UP == 0 || u32::from(dest) & mask != u32::from(network) & mask {
            continue;
        }
        let prefix = mask.count_ones();
        let better = best.is_none_or(|(p, m, _)| prefix > p || (prefix == p && metric < m));
        if better {
            best = Some((prefix, metric, iface));
        }
    }
    best.map(|(_, _, iface)| (*iface).to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn the_route_table_names_the_interface_of_the_longest_prefix() {
        let table = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
                     eth0\t00000000\t0101A8C0\t0003\t0\t0\t100\t00000000\t0\t0\t0\n\
                     thunderbolt0\t0000D60A\t00000000\t0001\t0\t0\t0\tFCFFFFFF\t0\t0\t0\n\
                     thunderbolt1\t0100D70A\t0100D60A\t0007\t0\t0\t0\tFFFFFFFF\t0\t0\t0\n\
                     thunderbolt2\t0200D70A\t0100D60A\t0006\t0\t0\t0\tFFFFFFFF\t0\t0\t0\n";
        let via = |ip: &str| ipv4_route_interface(table, ip.parse().unwrap());
        assert_eq!(via("10.215.0.1").as_deref(), Some("thunderbolt1"));
        assert_eq!(via("10.214.0.2").as_deref(), Some("thunderbolt0"));
        // A route that is not up is passed over for the default.
        assert_eq!(via("10.215.0.2").as_deref(), Some("eth0"));
        assert_eq!(via("8.8.8.8").as_deref(), Some("eth0"));
        assert_eq!(
            ipv4_route_interface("Iface\n", "1.2.3.4".parse().unwrap()),
            None
        );
    }

    /// A fake `/sys` tree in the temporary directory, removed on drop.
    struct FakeSysfs {
        root: PathBuf,
    }

    impl FakeSysfs {
        fn new(test: &str) -> Self {
            let root =
                std::env::temp_dir().join(format!("rlx-tb-sysfs-{test}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&root);
            std::fs::create_dir_all(root.join("class/net")).unwrap();
            std::fs::create_dir_all(root.join("bus/drivers")).unwrap();
            FakeSysfs { root }
        }

        fn net(&self) -> PathBuf {
            self.root.join("class/net")
        }

        /// Adds an interface the way the kernel lays it out: attributes in its directory and a
        /// `device/driver` symlink to the driver's directory.
        fn add(&self, name: &str, index: u32, flags: &str, operstate: &str, driver: Option<&str>) {
            let dir = self.net().join(name);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("ifindex"), format!("{index}\n")).unwrap();
            std::fs::write(dir.join("flags"), format!("{flags}\n")).unwrap();
            std::fs::write(dir.join("operstate"), format!("{operstate}\n")).unwrap();
            if let Some(driver) = driver {
                let driver_dir = self.root.join("bus/drivers").join(driver);
                std::fs::create_dir_all(&driver_dir).unwrap();
                std::fs::create_dir_all(dir.join("device")).unwrap();
                std::os::unix::fs::symlink(&driver_dir, dir.join("device/driver")).unwrap();
            }
        }
    }

    impl Drop for FakeSysfs {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }

    #[test]
    fn thunderbolt_links_by_driver_and_by_name() {
        let sys = FakeSysfs::new("links");
        sys.add("lo", 1, "0x9", "unknown", None);
        sys.add("eth0", 2, "0x1003", "up", Some("e1000e"));
        sys.add("tbt-a", 5, "0x1003", "up", Some("thunderbolt-net"));
        sys.add("thunderbolt0", 4, "0x1003", "up", None);
        sys.add("thunderbolt1", 6, "0x1002", "down", Some("thunderbolt-net"));
        let seen = scan_sysfs(&sys.net()).unwrap();
        let summary: Vec<_> = seen
            .iter()
            .map(|i| (i.name.as_str(), i.index, i.up, i.thunderbolt.clone()))
            .collect();
        assert_eq!(
            summary,
            vec![
                ("eth0", 2, true, None),
                ("lo", 1, true, None),
                ("tbt-a", 5, true, Some(Evidence::Driver)),
                ("thunderbolt0", 4, true, Some(Evidence::Name)),
                ("thunderbolt1", 6, false, Some(Evidence::Driver)),
            ]
        );
        assert_eq!(seen[0].driver.as_deref(), Some("e1000e"));
        // Several links: both that are up are selected; the one that is down is not.
        let links = crate::discovery::select_links(&seen, None).unwrap();
        let names: Vec<_> = links.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(names, ["tbt-a", "thunderbolt0"]);
    }

    #[test]
    fn no_thunderbolt_link_in_the_tree_is_a_config_error() {
        let sys = FakeSysfs::new("none");
        sys.add("lo", 1, "0x9", "unknown", None);
        sys.add("enp3s0", 2, "0x1003", "up", Some("r8169"));
        sys.add("wlp2s0", 3, "0x1003", "up", Some("iwlwifi"));
        let seen = scan_sysfs(&sys.net()).unwrap();
        let err = crate::discovery::select_links(&seen, None).unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, CollectiveError::Config { .. }));
        for name in ["lo", "enp3s0 (not Thunderbolt, driver r8169)", "wlp2s0"] {
            assert!(text.contains(name), "{text}");
        }
    }

    #[test]
    fn a_missing_tree_is_an_io_error_naming_the_path() {
        let err = scan_sysfs(Path::new("/nonexistent/rlx/sysfs")).unwrap_err();
        assert!(matches!(err, CollectiveError::Io { .. }));
        assert!(err.to_string().contains("/nonexistent/rlx/sysfs"), "{err}");
    }

    #[test]
    fn addresses_are_merged_by_name() {
        let mut interfaces = vec![Interface::new("thunderbolt0", 4, true)];
        let entries = vec![
            InterfaceAddress {
                name: "thunderbolt0".into(),
                addr: Some("fe80::2".parse().unwrap()),
                up: false,
                running: false,
                prefix: None,
            },
            InterfaceAddress {
                name: "other".into(),
                addr: Some("10.0.0.1".parse().unwrap()),
                up: false,
                running: false,
                prefix: None,
            },
        ];
        merge_addresses(&mut interfaces, &entries);
        assert_eq!(
            interfaces[0].addrs,
            vec!["fe80::2".parse::<std::net::IpAddr>().unwrap()]
        );
    }

    #[test]
    fn the_real_host_lists_loopback() {
        let seen = list_interfaces().unwrap();
        assert!(
            seen.iter().any(|i| i.name == "lo" && i.index > 0),
            "{seen:?}"
        );
    }
}
