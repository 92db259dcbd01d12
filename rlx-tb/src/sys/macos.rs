//! macOS: the Thunderbolt Bridge (`bridgeN` whose members are Thunderbolt ports) and the
//! Thunderbolt `enN` ports, pinned with `IP_BOUND_IF` / `IPV6_BOUND_IF`.
//!
//! Which `enN` is a Thunderbolt port is system metadata, not visible in `getifaddrs`: the
//! system's hardware-port list (`networksetup -listallhardwareports`) names them
//! "Thunderbolt 1", "Thunderbolt 2", ..., and `ifconfig -a` lists each bridge's members and each
//! port's media status (a port without a cable still has `IFF_RUNNING` set). The
//! parsers of both outputs and the classification are plain functions, compiled and tested on
//! every OS; only running the tools, `getifaddrs` and the socket options are macOS-only.

use crate::discovery::{Evidence, Interface};
use std::net::IpAddr;

/// One entry of the hardware-port list: the port's name and its device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct HardwarePort {
    pub(crate) port: String,
    pub(crate) device: String,
}

/// Parses the output of `networksetup -listallhardwareports` (blocks of `Hardware Port:`,
/// `Device:` and `Ethernet Address:` lines). Blocks without a device are skipped.
pub(crate) fn parse_hardware_ports(text: &str) -> Vec<HardwarePort> {
    let mut out = Vec::new();
    let mut port: Option<String> = None;
    for line in text.lines() {
        let line = line.trim();
        if let Some(name) = line.strip_prefix("Hardware Port:") {
            port = Some(name.trim().to_owned());
        } else if let Some(device) = line.strip_prefix("Device:") {
            let device = device.trim();
            if let (Some(port), false) = (port.take(), device.is_empty()) {
                out.push(HardwarePort {
                    port,
                    device: device.to_owned(),
                });
            }
        }
    }
    out
}

/// What `ifconfig` says about one interface: its bridge members and its media status.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct IfconfigBlock {
    pub(crate) name: String,
    /// `member:` lines (bridges only).
    pub(crate) members: Vec<String>,
    /// `status: active` / `status: inactive`, when the interface reports media status. macOS
    /// sets `IFF_RUNNING` on Thunderbolt ports without a cable, so this is the carrier.
    pub(crate) active: Option<bool>,
}

/// Parses the output of `ifconfig -a`: a block per interface, starting at an unindented
/// `name: flags=...` line.
pub(crate) fn parse_ifconfig(text: &str) -> Vec<IfconfigBlock> {
    let mut out: Vec<IfconfigBlock> = Vec::new();
    for line in text.lines() {
        if !line.starts_with(char::is_whitespace) {
            if let Some((name, _)) = line.split_once(": ") {
                out.push(IfconfigBlock {
                    name: name.to_owned(),
                    ..IfconfigBlock::default()
                });
            }
            continue;
        }
        let Some(block) = out.last_mut() else {
            continue;
        };
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("member:") {
            if let Some(member) = rest.split_whitespace().next() {
                block.members.push(member.to_owned());
            }
        } else if let Some(status) = line.strip_prefix("status:") {
            block.active = Some(status.trim() == "active");
        }
    }
    out
}

/// Whether a hardware port's name marks a Thunderbolt port (the bridge itself is not a port).
fn is_thunderbolt_port(port: &str) -> bool {
    port.starts_with("Thunderbolt") && port != "Thunderbolt Bridge"
}

/// Builds the interface list from the `getifaddrs` view (`(name, up, addresses, index)`), the
/// hardware ports and the `ifconfig` blocks. An interface whose media status is inactive is
/// down whatever its flags say.
pub(crate) fn classify(
    seen: Vec<(String, bool, Vec<IpAddr>, u32)>,
    ports: &[HardwarePort],
    blocks: &[IfconfigBlock],
) -> Vec<Interface> {
    let port_of = |device: &str| {
        ports
            .iter()
            .find(|p| p.device == device)
            .map(|p| p.port.as_str())
    };
    seen.into_iter()
        .map(|(name, up, addrs, index)| {
            let block = blocks.iter().find(|b| b.name == name);
            let members = block.map(|b| b.members.as_slice()).unwrap_or_default();
            let thunderbolt = if let Some(port) = port_of(&name).filter(|p| is_thunderbolt_port(p))
            {
                Some(Evidence::HardwarePort(port.to_owned()))
            } else {
                let all_thunderbolt = !members.is_empty()
                    && members
                        .iter()
                        .all(|m| port_of(m).is_some_and(is_thunderbolt_port));
                all_thunderbolt.then(|| Evidence::Bridge {
                    members: members.to_vec(),
                })
            };
            let carrier = block.and_then(|b| b.active).unwrap_or(true);
            Interface {
                name,
                index,
                up: up && carrier,
                addrs,
                thunderbolt,
                driver: None,
            }
        })
        .collect()
}

#[cfg(target_os = "macos")]
mod system {
    use std::io;
    use std::num::NonZeroU32;
    use std::process::Command;

    use rlx_transport::{CollectiveError, Result};
    use socket2::Socket;

    use super::{classify, parse_hardware_ports, parse_ifconfig};
    use crate::discovery::Interface;
    use crate::sys::unix;

    fn tool_output(program: &str, args: &[&str]) -> Result<String> {
        let described = format!("{program} {}", args.join(" "));
        let output = Command::new(program)
            .args(args)
            .output()
            .map_err(|source| CollectiveError::Io {
                peer: None,
                source: io::Error::new(source.kind(), format!("running {described}: {source}")),
            })?;
        if !output.status.success() {
            return Err(CollectiveError::config(format!(
                "{described} failed with {}: {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            )));
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// The contract's `list_interfaces`: `getifaddrs`, the hardware-port list and the members
    /// of every bridge.
    pub(crate) fn list_interfaces() -> Result<Vec<Interface>> {
        let entries = rlx_transport::interfaces::addresses()?;
        let seen: Vec<_> = unix::group_by_interface(&entries)
            .into_iter()
            .map(|(name, up, addrs)| {
                let index = unix::index_of(&name).unwrap_or(0);
                (name, up, addrs, index)
            })
            .collect();
        let ports = parse_hardware_ports(&tool_output(
            "/usr/sbin/networksetup",
            &["-listallhardwareports"],
        )?);
        let blocks = parse_ifconfig(&tool_output("/sbin/ifconfig", &["-a"])?);
        Ok(classify(seen, &ports, &blocks))
    }

    fn socket_error(what: String, source: io::Error) -> CollectiveError {
        CollectiveError::Io {
            peer: None,
            source: io::Error::new(source.kind(), format!("{what}: {source}")),
        }
    }

    /// Whether `socket` is an IPv6 socket. macOS has no `SO_DOMAIN`; `getsockname` of an
    /// unbound socket still reports its family.
    fn is_ipv6(socket: &Socket) -> Result<bool> {
        let local = socket
            .local_addr()
            .map_err(|e| socket_error("getsockname".to_owned(), e))?;
        Ok(i32::from(local.family()) == libc::AF_INET6)
    }

    /// The contract's `pin_socket`: `IP_BOUND_IF` or `IPV6_BOUND_IF` by the socket's family.
    pub(crate) fn pin_socket(socket: &Socket, interface: &Interface) -> Result<()> {
        let index = NonZeroU32::new(interface.index).ok_or_else(|| {
            CollectiveError::config(format!("interface {} has no index", interface.name))
        })?;
        if is_ipv6(socket)? {
            socket
                .bind_device_by_index_v6(Some(index))
                .map_err(|e| socket_error(format!("IPV6_BOUND_IF {}", interface.name), e))
        } else {
            socket
                .bind_device_by_index_v4(Some(index))
                .map_err(|e| socket_error(format!("IP_BOUND_IF {}", interface.name), e))
        }
    }

    /// The contract's `route_interface`: not read on macOS (it would take a routing socket),
    /// so a rank whose route source is a routed identity is refused there, as before.
    pub(crate) fn route_interface(_dest: std::net::SocketAddr) -> Option<String> {
        None
    }

    /// The contract's `pinned_interface`: reads `IP_BOUND_IF` / `IPV6_BOUND_IF` back.
    pub(crate) fn pinned_interface(socket: &Socket) -> Result<Option<String>> {
        let index = if is_ipv6(socket)? {
            socket.device_index_v6()
        } else {
            socket.device_index_v4()
        }
        .map_err(|e| socket_error("getsockopt IP_BOUND_IF".to_owned(), e))?;
        Ok(index.and_then(|i| unix::name_of(i.get())))
    }
}

#[cfg(target_os = "macos")]
pub(crate) use system::{list_interfaces, pin_socket, pinned_interface, route_interface};

#[cfg(test)]
mod tests {
    use super::*;

    const PORTS: &str = "\
Hardware Port: Ethernet
Device: en0
Ethernet Address: 3c:a6:f6:00:00:01

Hardware Port: Thunderbolt Bridge
Device: bridge0
Ethernet Address: 36:a0:00:00:00:01

Hardware Port: Wi-Fi
Device: en1
Ethernet Address: 3c:a6:f6:00:00:02

Hardware Port: Thunderbolt 1
Device: en2
Ethernet Address: 36:a0:00:00:00:02

Hardware Port: Thunderbolt 2
Device: en3
Ethernet Address: 36:a0:00:00:00:03

Hardware Port: Thunderbolt 3
Device: en4
Ethernet Address: 36:a0:00:00:00:04

VLAN Configurations
===================
";

    const IFCONFIG: &str = "\
lo0: flags=8049<UP,LOOPBACK,RUNNING,MULTICAST> mtu 16384
\tinet 127.0.0.1 netmask 0xff000000
en0: flags=8863<UP,BROADCAST,SMART,RUNNING,SIMPLEX,MULTICAST> mtu 1500
\tether 3c:a6:f6:00:00:01
\tstatus: active
en2: flags=8963<UP,BROADCAST,SMART,RUNNING,PROMISC,SIMPLEX,MULTICAST> mtu 1500
\tmedia: autoselect <full-duplex>
\tstatus: active
en3: flags=8963<UP,BROADCAST,SMART,RUNNING,PROMISC,SIMPLEX,MULTICAST> mtu 1500
\tstatus: active
en4: flags=8963<UP,BROADCAST,SMART,RUNNING,PROMISC,SIMPLEX,MULTICAST> mtu 1500
\tstatus: active
en5: flags=8963<UP,BROADCAST,SMART,RUNNING,PROMISC,SIMPLEX,MULTICAST> mtu 1500
\tstatus: inactive
bridge0: flags=8863<UP,BROADCAST,SMART,RUNNING,SIMPLEX,MULTICAST> mtu 1500
\toptions=63<RXCSUM,TXCSUM,TSO4,TSO6>
\tether 36:a0:00:00:00:01
\tConfiguration:
\t\tid 0:0:0:0:0:0 priority 0 hellotime 0 fwddelay 0
\tmember: en2 flags=3<LEARNING,DISCOVER>
\t        ifmaxaddr 0 port 9 priority 0 path cost 0
\tmember: en3 flags=3<LEARNING,DISCOVER>
\t        ifmaxaddr 0 port 10 priority 0 path cost 0
\tinet6 fe80::1c2b:aaaa:bbbb:cccc%bridge0 prefixlen 64 scopeid 0xb
\tstatus: active
";

    fn blocks() -> Vec<IfconfigBlock> {
        parse_ifconfig(IFCONFIG)
    }

    fn seen(names: &[(&str, bool)]) -> Vec<(String, bool, Vec<IpAddr>, u32)> {
        names
            .iter()
            .enumerate()
            .map(|(i, (n, up))| ((*n).to_owned(), *up, Vec::new(), i as u32 + 1))
            .collect()
    }

    #[test]
    fn hardware_ports_and_ifconfig_parse() {
        let ports = parse_hardware_ports(PORTS);
        assert_eq!(ports.len(), 6);
        assert_eq!(
            ports[3],
            HardwarePort {
                port: "Thunderbolt 1".into(),
                device: "en2".into()
            }
        );
        let blocks = blocks();
        let names: Vec<_> = blocks.iter().map(|b| b.name.as_str()).collect();
        assert_eq!(names, ["lo0", "en0", "en2", "en3", "en4", "en5", "bridge0"]);
        assert_eq!(blocks[6].members, ["en2", "en3"]);
        assert_eq!(blocks[6].active, Some(true));
        assert_eq!(blocks[5].active, Some(false));
        assert_eq!(blocks[0].active, None);
        assert!(blocks[1].members.is_empty());
    }

    #[test]
    fn the_thunderbolt_bridge_and_ports_are_recognised() {
        let ports = [
            parse_hardware_ports(PORTS),
            vec![HardwarePort {
                port: "Thunderbolt 4".into(),
                device: "en5".into(),
            }],
        ]
        .concat();
        let list = classify(
            seen(&[
                ("lo0", true),
                ("en0", true),
                ("en1", true),
                ("en2", true),
                ("en3", true),
                ("en4", true),
                ("en5", true),
                ("bridge0", true),
            ]),
            &ports,
            &blocks(),
        );
        let evidence: Vec<_> = list
            .iter()
            .map(|i| (i.name.as_str(), i.thunderbolt.clone()))
            .collect();
        assert_eq!(evidence[..3], [("lo0", None), ("en0", None), ("en1", None)]);
        assert_eq!(
            evidence[3].1,
            Some(Evidence::HardwarePort("Thunderbolt 1".into()))
        );
        assert_eq!(
            evidence[7].1,
            Some(Evidence::Bridge {
                members: vec!["en2".into(), "en3".into()]
            })
        );
        // en5 has its flags up but no cable: down.
        assert!(!list[6].up);
        // The bridged ports give way to the bridge; the third, unbridged port is its own link.
        let links = crate::discovery::select_links(&list, None).unwrap();
        let names: Vec<_> = links.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(names, ["en4", "bridge0"]);
    }

    #[test]
    fn a_bridge_with_other_members_is_not_thunderbolt() {
        let ports = parse_hardware_ports(PORTS);
        let blocks = vec![
            IfconfigBlock {
                name: "bridge1".into(),
                members: vec!["en0".into(), "en2".into()],
                active: Some(true),
            },
            IfconfigBlock {
                name: "bridge2".into(),
                ..IfconfigBlock::default()
            },
        ];
        let list = classify(
            seen(&[
                ("en0", true),
                ("bridge1", true),
                ("bridge2", true),
                ("en2", false),
            ]),
            &ports,
            &blocks,
        );
        assert_eq!(list[1].thunderbolt, None);
        assert_eq!(list[2].thunderbolt, None);
        let err = crate::discovery::select_links(&list, None)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("en2 (hardware port \"Thunderbolt 1\", down)"),
            "{err}"
        );
    }
}
