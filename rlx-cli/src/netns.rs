//! Network namespaces for multi-host shapes on one machine (`--netns`, needs root).
//!
//! Topology: one hub namespace holding a bridge, and one namespace per rank whose only link is
//! a veth named `thunderbolt0`, the other end enslaved to the bridge. The veth pairs are
//! created directly inside the namespaces (`ip -n HUB link add ... peer ... netns RANK`), so the
//! root namespace never sees an interface or an address of ours. An optional `tbf` qdisc on
//! every `thunderbolt0` emulates a link rate (Thunderbolt 4 carries about 20 Gbit/s of TCP).
//!
//! Every namespace name starts with [`PREFIX`] and the launcher's process id; namespaces left
//! by a launcher that is no longer running (a crash, a `kill -9`) are removed at the next start.

use std::net::Ipv4Addr;
use std::process::Command;

use crate::job;

/// The prefix of every namespace this module creates.
pub const PREFIX: &str = "rlxtc-";

/// The interface name every rank sees.
pub const IFNAME: &str = "thunderbolt0";

/// The namespaces of one job. Dropping it deletes them all.
#[derive(Debug)]
pub struct Topology {
    key: String,
    hub: String,
    ranks: Vec<String>,
}

impl Topology {
    /// Creates the hub and `world` rank namespaces, with a `tbf` rate limit (`"20gbit"`) on each
    /// rank's link when `rate` is given.
    pub fn create(world: u32, rate: Option<&str>) -> Result<Topology, String> {
        if world > 250 {
            return Err(format!(
                "--netns supports at most 250 ranks (one /24), not {world}"
            ));
        }
        remove_leftovers();
        let key = format!("{PREFIX}{}", std::process::id());
        job::install_interrupt_handler();
        job::register_cleanup(&key, delete_job);
        let mut topology = Topology {
            hub: format!("{key}-hub"),
            ranks: Vec::new(),
            key,
        };
        // From here on, an early return drops `topology`, which deletes what exists so far.
        ip(&["netns", "add", &topology.hub])?;
        ip(&["-n", &topology.hub, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &topology.hub, "link", "set", "br0", "up"])?;
        for rank in 0..world {
            let ns = format!("{}-r{rank}", topology.key);
            ip(&["netns", "add", &ns])?;
            topology.ranks.push(ns.clone());
            let hub_end = format!("v{rank}");
            ip(&[
                "-n",
                &topology.hub,
                "link",
                "add",
                &hub_end,
                "type",
                "veth",
                "peer",
                "name",
                IFNAME,
                "netns",
                &ns,
            ])?;
            ip(&[
                "-n",
                &topology.hub,
                "link",
                "set",
                &hub_end,
                "master",
                "br0",
                "up",
            ])?;
            let cidr = format!("{}/24", Self::address_of(rank));
            ip(&["-n", &ns, "addr", "add", &cidr, "dev", IFNAME])?;
            ip(&["-n", &ns, "link", "set", IFNAME, "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
            if let Some(rate) = rate {
                let burst = burst_bytes(rate)?.to_string();
                run(Command::new("ip").args([
                    "netns", "exec", &ns, "tc", "qdisc", "add", "dev", IFNAME, "root", "tbf",
                    "rate", rate, "burst", &burst, "latency", "50ms",
                ]))?;
            }
        }
        Ok(topology)
    }

    /// The address of `rank` on its `thunderbolt0` link.
    pub fn address_of(rank: u32) -> Ipv4Addr {
        // `create` refuses worlds above 250, so the last octet stays in 1..=250.
        Ipv4Addr::new(10, 213, 0, u8::try_from(rank + 1).unwrap_or(u8::MAX))
    }

    /// The namespace of `rank`.
    pub fn namespace_of(&self, rank: u32) -> Option<&str> {
        self.ranks.get(rank as usize).map(String::as_str)
    }

    /// Takes `rank`'s link away for good. With `drop_all`, both ends of its cable drop every
    /// packet (a `pfifo` queue of length 0 replaces the root qdisc, and any rate limit with it:
    /// this kernel has neither the `prio` qdisc nor the drop action of `matchall`); the link
    /// stays up. Otherwise its switch port goes down, as when a cable is pulled.
    pub fn cut(&self, rank: u32, drop_all: bool) -> Result<(), String> {
        let ns = self
            .namespace_of(rank)
            .ok_or_else(|| format!("there is no namespace of rank {rank} to cut"))?;
        let hub_end = format!("v{rank}");
        if drop_all {
            for (ns, dev) in [(ns, IFNAME), (self.hub.as_str(), hub_end.as_str())] {
                run(Command::new("ip").args([
                    "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root", "pfifo",
                    "limit", "0",
                ]))?;
            }
            Ok(())
        } else {
            ip(&["-n", &self.hub, "link", "set", &hub_end, "down"]).map(|_| ())
        }
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        delete_job(&self.key);
        job::unregister_cleanup(&self.key);
    }
}

/// The `tbf` bucket for `rate` (tc's syntax: `20gbit`, `800mbit`, `100mbps`...): at least one
/// timer tick's worth of bytes at that rate (tc-tbf(8): rate / HZ, with HZ taken as 250, the
/// smallest common value) so that the qdisc can reach the rate, and never below 64 KiB.
pub fn burst_bytes(rate: &str) -> Result<u64, String> {
    let lower = rate.trim().to_ascii_lowercase();
    let split = lower
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(lower.len());
    let (number, unit) = lower.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("--rate {rate:?} is not a rate such as 20gbit"))?;
    let bits_per_second = value
        * match unit {
            "bit" => 1.0,
            "kbit" => 1e3,
            "mbit" => 1e6,
            "gbit" => 1e9,
            "tbit" => 1e12,
            "bps" => 8.0,
            "kbps" => 8e3,
            "mbps" => 8e6,
            "gbps" => 8e9,
            _ => {
                return Err(format!(
                    "--rate {rate:?}: unknown unit {unit:?} (use bit, kbit, mbit, gbit, bps, kbps, mbps or gbps)"
                ));
            }
        };
    Ok(((bits_per_second / 8.0 / 250.0) as u64).max(64 * 1024))
}

/// Whether we can manage namespaces here (root and `ip` present); an error says what is missing.
pub fn check_available() -> Result<(), String> {
    // SAFETY: `geteuid` has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    if euid != 0 {
        return Err("--netns needs root (network namespaces and veth links)".to_owned());
    }
    run(Command::new("ip").args(["netns", "list"]))
        .map(|_| ())
        .map_err(|e| format!("--netns needs iproute2's `ip`: {e}"))
}

/// For a test that needs namespaces: whether it can run. When it cannot, it says why on stderr
/// and the test returns early.
///
/// # Panics
///
/// Under `CI=true`, where CI runs as root with iproute2, when namespaces are not available:
/// there the test fails instead of skipping.
pub fn available_for_test(test: &str) -> bool {
    match check_available() {
        Ok(()) => true,
        Err(reason) => {
            assert!(!crate::in_ci(), "CI=true, yet {test} cannot run: {reason}");
            eprintln!("{test} skipped: {reason}");
            false
        }
    }
}

/// Deletes every namespace of the job whose names start with `key` (`rlxtc-PID`).
fn delete_job(key: &str) {
    for ns in list_namespaces() {
        if ns
            .strip_prefix(key)
            .is_some_and(|rest| rest.starts_with('-'))
        {
            // A namespace that is already gone is what we want; nothing to report.
            let _ = run(Command::new("ip").args(["netns", "del", &ns]));
        }
    }
}

/// Deletes namespaces of earlier launchers that are no longer running.
fn remove_leftovers() {
    for ns in list_namespaces() {
        let Some(rest) = ns.strip_prefix(PREFIX) else {
            continue;
        };
        let pid = rest.split('-').next().unwrap_or_default();
        let alive = !pid.is_empty() && std::path::Path::new("/proc").join(pid).exists();
        if !alive {
            eprintln!("rlx: removing namespace {ns} left by an earlier run");
            // Failing to remove a leftover is reported by the `ip netns add` that clashes.
            let _ = run(Command::new("ip").args(["netns", "del", &ns]));
        }
    }
}

fn list_namespaces() -> Vec<String> {
    let Ok(listing) = run(Command::new("ip").args(["netns", "list"])) else {
        return Vec::new();
    };
    listing
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| name.starts_with(PREFIX))
        .map(str::to_owned)
        .collect()
}

fn ip(args: &[&str]) -> Result<String, String> {
    run(Command::new("ip").args(args))
}

/// Runs `command` to completion and returns its stdout; a failure carries its stderr.
fn run(command: &mut Command) -> Result<String, String> {
    let output = command
        .output()
        .map_err(|e| format!("could not run {command:?}: {e}"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(format!(
            "{command:?} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bursts_cover_one_tick_at_the_rate() {
        assert_eq!(burst_bytes("20gbit").unwrap(), 10_000_000);
        assert_eq!(burst_bytes("800mbit").unwrap(), 400_000);
        assert_eq!(burst_bytes("1mbit").unwrap(), 64 * 1024);
        assert_eq!(burst_bytes("100mbps").unwrap(), 400_000);
        assert!(burst_bytes("fast").is_err() && burst_bytes("20 furlongs").is_err());
    }

    #[test]
    fn addresses_are_in_one_subnet() {
        assert_eq!(Topology::address_of(0).to_string(), "10.213.0.1");
        assert_eq!(Topology::address_of(249).to_string(), "10.213.0.250");
    }
}
