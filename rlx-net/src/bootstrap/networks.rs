//! The networks a rank registers in the store, and the link matrix every rank makes of the
//! table (see [`rlx_transport::topology`]).
//!
//! Only networks that can join two machines are registered: loopback is one host's own, and a
//! link-local network (IPv6 `fe80::/10`, IPv4 `169.254/16`) exists on every interface that has
//! one, so sharing it says nothing about a cable. An interface that is down is left out too.

use rlx_transport::Topology;
use rlx_transport::interfaces::{self, InterfaceAddress};
use rlx_transport::topology::Subnet;

use super::store::Registration;

/// The networks of this host's interfaces that are up, as the store should list them.
pub(super) fn of_this_host() -> Vec<Subnet> {
    match interfaces::addresses() {
        Ok(entries) => joining(&entries),
        Err(e) => {
            tracing::debug!(error = %e, "no networks registered: the interfaces cannot be read");
            Vec::new()
        }
    }
}

/// The networks of `entries` that can join two machines (see the module docs).
fn joining(entries: &[InterfaceAddress]) -> Vec<Subnet> {
    let mut out: Vec<Subnet> = Vec::new();
    for entry in entries.iter().filter(|e| e.is_up_and_running()) {
        let (Some(addr), Some(prefix)) = (entry.addr, entry.prefix) else {
            continue;
        };
        let local_only = match addr {
            std::net::IpAddr::V4(v4) => v4.is_loopback() || v4.is_link_local(),
            std::net::IpAddr::V6(v6) => v6.is_loopback() || v6.is_unicast_link_local(),
        };
        let network = Subnet { addr, prefix };
        if !local_only && !out.contains(&network) {
            out.push(network);
        }
    }
    out
}

/// The link matrix of the ranks of `table` (in rank order), logged at `debug`.
pub(super) fn topology(table: &[Registration]) -> Topology {
    let networks: Vec<Vec<Subnet>> = table.iter().map(|r| r.networks.clone()).collect();
    let topology = Topology::from_networks(&networks);
    tracing::debug!(?topology, "the link matrix from the ranks' networks");
    topology
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, addr: &str, prefix: u8, up: bool) -> InterfaceAddress {
        InterfaceAddress {
            name: name.into(),
            addr: Some(addr.parse().unwrap()),
            up,
            running: up,
            prefix: Some(prefix),
        }
    }

    #[test]
    fn only_networks_that_can_join_two_machines_are_registered() {
        let entries = vec![
            entry("lo", "127.0.0.1", 8, true),
            entry("lo", "::1", 128, true),
            entry("lo", "10.215.0.1", 32, true),
            entry("thunderbolt0", "10.216.0.1", 30, true),
            entry("thunderbolt0", "fe80::1", 64, true),
            entry("thunderbolt1", "10.216.0.5", 30, false),
            entry("en0", "169.254.3.4", 16, true),
            entry("en0", "192.168.1.7", 24, true),
        ];
        let kept: Vec<String> = joining(&entries)
            .iter()
            .map(|n| format!("{}/{}", n.addr, n.prefix))
            .collect();
        assert_eq!(kept, ["10.215.0.1/32", "10.216.0.1/30", "192.168.1.7/24"]);
    }
}
