//! Network namespaces for the link-cut tests: a hub namespace holding a bridge, and one
//! namespace per rank whose only interface, `eth0`, is a veth whose other end (`v{rank}`) is a
//! port of that bridge, as if every rank were a machine cabled to one switch. A link is cut by
//! taking the switch port down (`ip link set v{rank} down`: the cable is pulled, nothing is
//! reset) or by a `tc` rule on both ends that drops every packet. Everything created is
//! removed on drop, on every path.

use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Why this process cannot create namespaces, if it cannot: that needs root, iproute2's `ip`
/// and `tc`.
pub(crate) fn unavailable() -> Option<&'static str> {
    // SAFETY: `geteuid` has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root for network namespaces");
    }
    for tool in ["ip", "tc"] {
        let works = Command::new(tool)
            .arg("-V")
            .output()
            .is_ok_and(|out| out.status.success());
        if !works {
            return Some("needs iproute2's `ip` and `tc` for network namespaces");
        }
    }
    None
}

/// Runs `program` with `args`; its stdout, or an error with its stderr.
fn run(program: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("{program}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn ip(args: &[&str]) -> Result<(), String> {
    run("ip", args).map(drop)
}

fn tc(args: &[&str]) -> Result<(), String> {
    run("tc", args).map(drop)
}

/// How a link is cut.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Cut {
    /// The switch port goes down: the cable is pulled.
    LinkDown,
    /// A `tc` rule on both ends of the cable drops every packet: the link looks up but carries
    /// nothing, as behind a dead switch or a firewall.
    DropAll,
}

/// A hub with a bridge and one namespace per rank (see the module docs).
#[derive(Debug)]
pub(crate) struct Switch {
    hub: String,
    ranks: Vec<String>,
}

static SWITCHES: AtomicU32 = AtomicU32::new(0);

impl Switch {
    /// The IPv4 address of `rank`.
    pub(crate) fn addr(rank: u32) -> String {
        format!("10.201.0.{}", rank + 1)
    }

    /// Creates the hub and `world` rank namespaces, every link up.
    pub(crate) fn create(world: u32) -> Result<Switch, String> {
        let tag = format!(
            "rlxlv{}n{}",
            std::process::id(),
            SWITCHES.fetch_add(1, Ordering::Relaxed)
        );
        let mut switch = Switch {
            hub: format!("{tag}hub"),
            ranks: Vec::new(),
        };
        // From here on, `switch` removes whatever was created if a step fails.
        ip(&["netns", "add", &switch.hub])?;
        let hub = switch.hub.clone();
        ip(&["-n", &hub, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &hub, "link", "set", "br0", "up"])?;
        for rank in 0..world {
            let ns = format!("{tag}r{rank}");
            ip(&["netns", "add", &ns])?;
            switch.ranks.push(ns.clone());
            let port = format!("v{rank}");
            ip(&[
                "-n", &hub, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns",
                &ns,
            ])?;
            ip(&["-n", &hub, "link", "set", &port, "master", "br0", "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
            let cidr = format!("{}/24", Self::addr(rank));
            ip(&["-n", &ns, "addr", "add", &cidr, "dev", "eth0"])?;
            ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
        }
        for ns in &switch.ranks {
            let deadline = Instant::now() + Duration::from_secs(10);
            while !run("ip", &["-n", ns, "link", "show", "eth0"])?.contains("state UP") {
                if Instant::now() > deadline {
                    return Err(format!("eth0 in {ns} never came up"));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(switch)
    }

    /// The namespace of `rank`.
    pub(crate) fn netns(&self, rank: u32) -> &str {
        &self.ranks[rank as usize]
    }

    /// Cuts `rank`'s cable in the way `how` says.
    pub(crate) fn cut(&self, rank: u32, how: Cut) -> Result<(), String> {
        let port = format!("v{rank}");
        match how {
            Cut::LinkDown => ip(&["-n", &self.hub, "link", "set", &port, "down"]),
            // A FIFO that holds no packet drops every packet handed to it. This kernel has
            // neither the `prio` qdisc nor the `matchall` classifier's drop action, which would
            // say the same thing more directly; the zero-length FIFO works on any kernel.
            Cut::DropAll => {
                for (ns, dev) in [
                    (self.hub.as_str(), port.as_str()),
                    (self.netns(rank), "eth0"),
                ] {
                    tc(&[
                        "-n", ns, "qdisc", "add", "dev", dev, "root", "pfifo", "limit", "0",
                    ])?;
                }
                Ok(())
            }
        }
    }
}

impl Drop for Switch {
    fn drop(&mut self) {
        for ns in self.ranks.iter().chain([&self.hub]) {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
    }
}
