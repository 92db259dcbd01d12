//! Network namespaces for multi-host shapes on one machine (`--netns`, needs root).
//!
//! One namespace per rank, joined as `--topology` says (`cabling.rs` lays the cables out):
//! - a switch: a hub namespace holding a bridge, and in each rank a veth whose other end is
//!   enslaved to the bridge, named `thunderbolt0` when the switch is the only link (the
//!   Thunderbolt bridge `--netns` always emulated) and `eth0` beside cables;
//! - a cable: a veth pair between two rank namespaces, named `thunderbolt<i>` at each end, on
//!   a /30 of its own, so ranks without a cable between them have no route to each other.
//!
//! The veth pairs are created directly inside the namespaces (`ip -n A link add ... peer ...
//! netns B`), so the root namespace never sees an interface or an address of ours. An optional
//! `tbf` qdisc on both ends of every link emulates its class's rate (Thunderbolt 4 carries
//! about 20 Gbit/s of TCP).
//!
//! Every namespace name starts with [`PREFIX`], the launcher's process id and a number of its
//! own; namespaces left by a launcher that is no longer running (a crash, a `kill -9`) are
//! removed at the next start.

mod cabling;
mod routes;

use std::net::Ipv4Addr;
use std::process::Command;

pub use self::cabling::{Cable, Cabling, LinkClass, Plan, RankLink, Rates, Shape, plan};
pub use self::routes::{Route, identity_address};
use crate::job;

/// The prefix of every namespace this module creates.
pub const PREFIX: &str = "rlxtc-";

/// How long a new topology's links may take to report their carrier.
const CARRIER_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// The most ranks a switch takes (one /24).
const MAX_SWITCH_RANKS: u32 = 250;

/// The namespaces of one job. Dropping it deletes them all.
#[derive(Debug)]
pub struct Topology {
    key: String,
    hub: String,
    ranks: Vec<String>,
    plan: Plan,
}

impl Topology {
    /// Creates `world` rank namespaces cabled as `cabling` says, with the `tbf` rates of
    /// `rates` (`--rate`: `"20gbit"`, or `"tb=2gbit,eth=200mbit"`) on both ends of each link.
    pub fn create(world: u32, cabling: &Cabling, rates: Option<&str>) -> Result<Topology, String> {
        let plan = cabling::plan(cabling, world)?;
        if plan.star.is_some() && world > MAX_SWITCH_RANKS {
            return Err(format!(
                "--netns puts at most {MAX_SWITCH_RANKS} ranks on a switch (one /24), not {world}"
            ));
        }
        let rates = rates.map(Rates::parse).transpose()?.unwrap_or_default();
        remove_leftovers();
        // The counter keeps apart the topologies one process builds side by side (tests).
        static BUILT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let number = BUILT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let key = format!("{PREFIX}{}-{number}", std::process::id());
        job::install_interrupt_handler();
        job::register_cleanup(&key, delete_job);
        let mut topology = Topology {
            hub: format!("{key}-hub"),
            ranks: Vec::new(),
            key,
            plan,
        };
        // From here on, an early return drops `topology`, which deletes what exists so far.
        if topology.plan.star.is_some() {
            ip(&["netns", "add", &topology.hub])?;
            ip(&["-n", &topology.hub, "link", "add", "br0", "type", "bridge"])?;
            ip(&["-n", &topology.hub, "link", "set", "br0", "up"])?;
        }
        for rank in 0..world {
            let ns = format!("{}-r{rank}", topology.key);
            ip(&["netns", "add", &ns])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
            topology.ranks.push(ns);
        }
        topology.lay_cables(&rates)?;
        for rank in 0..world {
            topology.plug_into_switch(rank, &rates)?;
        }
        if !topology.plan.cables.is_empty() {
            for rank in 0..world {
                topology.route(rank)?;
            }
        }
        topology.wait_for_carrier()?;
        Ok(topology)
    }

    /// Gives `rank` its identity on `lo`, lets it forward for others, and routes every other
    /// rank's identity through the first link of the cheapest path there (`routes.rs`).
    fn route(&self, rank: u32) -> Result<(), String> {
        let ns = self.ns(rank)?;
        let identity = identity_address(rank);
        ip(&[
            "-n",
            ns,
            "addr",
            "add",
            &format!("{identity}/32"),
            "dev",
            "lo",
        ])?;
        run(Command::new("ip").args([
            "netns",
            "exec",
            ns,
            "sysctl",
            "-q",
            "-w",
            "net.ipv4.ip_forward=1",
        ]))?;
        let world = self.ranks.len() as u32;
        for route in self.plan.routes_of(rank, world) {
            ip(&[
                "-n",
                ns,
                "route",
                "add",
                &format!("{}/32", identity_address(route.to)),
                "via",
                &route.via.to_string(),
                "dev",
                &route.ifname,
                "src",
                &identity.to_string(),
            ])?;
        }
        Ok(())
    }

    /// Waits until every link of every rank has its carrier: the kernel reports a veth's
    /// carrier some time after both ends came up (its link watch runs up to a second late),
    /// and a rank that looked at its links before then would find them down.
    fn wait_for_carrier(&self) -> Result<(), String> {
        let deadline = std::time::Instant::now() + CARRIER_WAIT;
        for (rank, ns) in (0..).zip(&self.ranks) {
            for link in self.plan.links_of(rank) {
                let operstate = format!("/sys/class/net/{}/operstate", link.ifname);
                loop {
                    let state =
                        run(Command::new("ip").args(["netns", "exec", ns, "cat", &operstate]))?;
                    if state.trim() == "up" {
                        break;
                    }
                    if std::time::Instant::now() > deadline {
                        return Err(format!(
                            "rank {rank}'s link {} is still {} after {CARRIER_WAIT:?}",
                            link.ifname,
                            state.trim()
                        ));
                    }
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
            }
        }
        Ok(())
    }

    /// Lays every cable of the plan: a veth pair between the two ranks' namespaces, each end
    /// limited to the cable's rate.
    fn lay_cables(&self, rates: &Rates) -> Result<(), String> {
        for cable in &self.plan.cables {
            let [a, b] = cable
                .ends
                .map(|rank| self.link_to(rank, Some(cable.peer_of(rank))));
            let (a, b) = (a?, b?);
            let (ns_a, ns_b) = (self.ns(cable.ends[0])?, self.ns(cable.ends[1])?);
            ip(&[
                "-n", ns_a, "link", "add", &a.ifname, "type", "veth", "peer", "name", &b.ifname,
                "netns", ns_b,
            ])?;
            for (ns, link) in [(ns_a, &a), (ns_b, &b)] {
                configure(ns, link, rates.of(link.class))?;
            }
        }
        Ok(())
    }

    /// Plugs `rank` into the switch, if the plan has one.
    fn plug_into_switch(&self, rank: u32, rates: &Rates) -> Result<(), String> {
        if self.plan.star.is_none() {
            return Ok(());
        }
        let link = self.link_to(rank, None)?;
        let ns = self.ns(rank)?;
        let hub_end = format!("v{rank}");
        ip(&[
            "-n",
            &self.hub,
            "link",
            "add",
            &hub_end,
            "type",
            "veth",
            "peer",
            "name",
            &link.ifname,
            "netns",
            ns,
        ])?;
        ip(&[
            "-n", &self.hub, "link", "set", &hub_end, "master", "br0", "up",
        ])?;
        // Each rank limits what it sends, so every direction between two ranks meets the rate
        // once.
        configure(ns, &link, rates.of(link.class))
    }

    /// `rank`'s link to `peer` (its cable), or to the switch for `None`.
    fn link_to(&self, rank: u32, peer: Option<u32>) -> Result<RankLink, String> {
        self.plan
            .links_of(rank)
            .into_iter()
            .find(|link| link.peer == peer)
            .ok_or_else(|| format!("rank {rank} has no link to {peer:?} in this cabling"))
    }

    fn ns(&self, rank: u32) -> Result<&str, String> {
        self.namespace_of(rank)
            .ok_or_else(|| format!("there is no namespace of rank {rank}"))
    }

    /// Where the other ranks reach `rank`: its identity when there are cables (routed over
    /// them), else its address on the switch.
    pub fn address_of(&self, rank: u32) -> Ipv4Addr {
        if self.plan.cables.is_empty() {
            cabling::star_address(rank)
        } else {
            identity_address(rank)
        }
    }

    /// Every address of `rank`, as a hostfile lists them: its links' (cables, then the
    /// switch), then its identity when there are cables.
    pub fn addresses_of(&self, rank: u32) -> Vec<Ipv4Addr> {
        let mut addresses: Vec<Ipv4Addr> = self
            .plan
            .links_of(rank)
            .into_iter()
            .map(|link| link.address)
            .collect();
        if !self.plan.cables.is_empty() {
            addresses.push(identity_address(rank));
        }
        addresses
    }

    /// The interface a rank must advertise its address on, when there is one: the switch's
    /// when it is the only link; none when there are cables (the identity on `lo` is reached
    /// by routes, and the route to rank 0's identity names it as the source).
    pub fn advertised_ifname(&self) -> Option<&'static str> {
        match self.plan.star {
            Some((ifname, _)) if self.plan.cables.is_empty() => Some(ifname),
            _ => None,
        }
    }

    /// The switch's interface when it is laid beside cables (islands, or a `+star`), which
    /// carries the traffic of ranks without a Thunderbolt path between them.
    pub fn ethernet_ifname(&self) -> Option<&'static str> {
        match self.plan.star {
            Some((ifname, _)) if !self.plan.cables.is_empty() => Some(ifname),
            _ => None,
        }
    }

    /// The cables and switch this topology was built from.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The namespace of `rank`.
    pub fn namespace_of(&self, rank: u32) -> Option<&str> {
        self.ranks.get(rank as usize).map(String::as_str)
    }

    /// Takes every link of `rank` away for good. With `drop_all`, both ends of each link drop
    /// every packet (a `pfifo` queue of length 0 replaces the root qdisc, and any rate limit
    /// with it: this kernel has neither the `prio` qdisc nor the drop action of `matchall`);
    /// the links stay up. Otherwise the far end of each goes down (its switch port, or the
    /// peer's end of a cable), as when the cables are pulled.
    pub fn cut(&self, rank: u32, drop_all: bool) -> Result<(), String> {
        let ns = self.ns(rank)?;
        for link in self.plan.links_of(rank) {
            let far = match link.peer {
                None => (self.hub.clone(), format!("v{rank}")),
                Some(peer) => (
                    self.ns(peer)?.to_owned(),
                    self.link_to(peer, Some(rank))?.ifname,
                ),
            };
            if drop_all {
                for (ns, dev) in [(ns, link.ifname.as_str()), (far.0.as_str(), far.1.as_str())] {
                    run(Command::new("ip").args([
                        "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root", "pfifo",
                        "limit", "0",
                    ]))?;
                }
            } else {
                ip(&["-n", &far.0, "link", "set", &far.1, "down"])?;
            }
        }
        Ok(())
    }
}

/// Gives `link` its address inside `ns`, brings it up and limits it to `rate`.
fn configure(ns: &str, link: &RankLink, rate: Option<&str>) -> Result<(), String> {
    let cidr = format!("{}/{}", link.address, link.prefix);
    ip(&["-n", ns, "addr", "add", &cidr, "dev", &link.ifname])?;
    ip(&["-n", ns, "link", "set", &link.ifname, "up"])?;
    match rate {
        Some(rate) => limit(ns, &link.ifname, rate),
        None => Ok(()),
    }
}

/// A `tbf` qdisc of `rate` on `dev` inside `ns`.
fn limit(ns: &str, dev: &str, rate: &str) -> Result<(), String> {
    let burst = burst_bytes(rate)?.to_string();
    run(Command::new("ip").args([
        "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate,
        "burst", &burst, "latency", "50ms",
    ]))
    .map(|_| ())
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

/// Deletes every namespace of the job whose names start with `key` (`rlxtc-PID-N`).
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

    /// What a TCP connection from `ns` to port 9 of `address` meets: `true` when the far
    /// kernel answers (refused: nothing listens there), `false` when there is no route.
    fn reaches(ns: &str, address: Ipv4Addr) -> bool {
        let script = format!("exec 3<>/dev/tcp/{address}/9");
        let output = Command::new("ip")
            .args(["netns", "exec", ns, "bash", "-c", &script])
            .output()
            .expect("ip netns exec");
        let said = String::from_utf8_lossy(&output.stderr);
        assert!(
            !output.status.success(),
            "something listens on {address}:9 in the test"
        );
        match () {
            () if said.contains("refused") => true,
            () if said.contains("unreachable") => false,
            () => panic!("connecting from {ns} to {address}: {said}"),
        }
    }

    /// Each cabling's links exist with their addresses and rates; a rank reaches a peer's
    /// link address only over a cable they share (or the switch), and every peer's identity
    /// through the routes.
    #[test]
    fn every_cabling_joins_exactly_the_cabled_pairs() {
        if !available_for_test("every_cabling_joins_exactly_the_cabled_pairs") {
            return;
        }
        for text in ["mesh", "ring", "chain+star", "islands:2x2"] {
            let cabling: Cabling = text.parse().unwrap();
            let topology = Topology::create(4, &cabling, Some("tb=1gbit,eth=100mbit")).unwrap();
            let plan = topology.plan().clone();
            for a in 0..4 {
                let ns = topology.namespace_of(a).unwrap();
                let listed = ip(&["-n", ns, "-o", "-4", "addr", "show"]).unwrap();
                let listed = listed.split_whitespace().collect::<Vec<_>>().join(" ");
                for link in plan.links_of(a) {
                    let shown = format!("{} inet {}/{}", link.ifname, link.address, link.prefix);
                    assert!(
                        listed.contains(&shown),
                        "{text}: rank {a} lacks {shown}: {listed}"
                    );
                    let qdisc = Command::new("tc")
                        .args(["-n", ns, "qdisc", "show", "dev", &link.ifname])
                        .output()
                        .expect("tc");
                    let rate = match link.class {
                        LinkClass::Thunderbolt => "rate 1Gbit",
                        LinkClass::Ethernet => "rate 100Mbit",
                    };
                    let qdisc = String::from_utf8_lossy(&qdisc.stdout);
                    assert!(
                        qdisc.contains(rate),
                        "{text}: rank {a}'s {}: {qdisc}",
                        link.ifname
                    );
                }
                for b in (0..4).filter(|b| *b != a) {
                    // Every rank reaches every other's identity, through the ranks between
                    // when there is no cable.
                    assert!(
                        reaches(ns, identity_address(b)),
                        "{text}: rank {a} to rank {b}"
                    );
                    for link in plan.links_of(b) {
                        let expected = link.peer.is_none_or(|peer| peer == a);
                        assert_eq!(
                            reaches(ns, link.address),
                            expected,
                            "{text}: rank {a} to rank {b}'s {} ({})",
                            link.ifname,
                            link.address
                        );
                    }
                }
            }
        }
    }
}
