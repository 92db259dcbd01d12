//! A network namespace's TCP segment counters (`OutSegs` and `RetransSegs` of Linux's
//! `/proc/net/snmp`), read around a measurement to tell whether its link dropped or reordered
//! packets. Both the doctor and the bench read them; elsewhere than Linux they are unknown.

use std::process::Command;

use serde::{Deserialize, Serialize};

/// TCP segments sent, and how many of them were sends again of lost or reordered ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segments {
    /// Segments sent.
    pub sent: u64,
    /// Of them, those sent again.
    pub retransmitted: u64,
}

impl Segments {
    /// The counters of this process's network namespace.
    pub fn now() -> Option<Segments> {
        parse(&std::fs::read_to_string("/proc/net/snmp").ok()?)
    }

    /// The counters of the named network namespace (`ip netns exec`, which mounts that
    /// namespace's view of `/proc/net`).
    pub fn in_namespace(namespace: &str) -> Option<Segments> {
        let output = Command::new("ip")
            .args(["netns", "exec", namespace, "cat", "/proc/net/snmp"])
            .output()
            .ok()?;
        if !output.status.success() {
            return None;
        }
        parse(&String::from_utf8_lossy(&output.stdout))
    }

    /// What was counted between `self` and `later`.
    pub fn until(self, later: Segments) -> Segments {
        Segments {
            sent: later.sent.saturating_sub(self.sent),
            retransmitted: later.retransmitted.saturating_sub(self.retransmitted),
        }
    }

    /// Whether a link lost or reordered enough packets to stall operations now and then. A
    /// healthy wired link sends nothing again in a transfer of tens of megabytes; one in ten
    /// thousand segments already costs a ring collective whole round trips (and at worst a
    /// retransmission timeout of 200 ms) a few times per gigabyte.
    pub fn lossy(self) -> bool {
        self.retransmitted >= 10 && self.retransmitted.saturating_mul(10_000) >= self.sent
    }

    /// The share of segments sent again, as tables and advice print it.
    pub fn percent(self) -> String {
        let share = self.retransmitted as f64 * 100.0 / self.sent.max(1) as f64;
        format!("{share:.3}%")
    }
}

/// `OutSegs` and `RetransSegs` from the text of `/proc/net/snmp`, whose `Tcp:` counters come
/// as a line of names followed by a line of values.
fn parse(snmp: &str) -> Option<Segments> {
    let mut tcp = snmp.lines().filter(|l| l.starts_with("Tcp:"));
    let (names, values) = (tcp.next()?, tcp.next()?);
    let value = |name: &str| {
        let at = names.split_whitespace().position(|n| n == name)?;
        values.split_whitespace().nth(at)?.parse().ok()
    };
    Some(Segments {
        sent: value("OutSegs")?,
        retransmitted: value("RetransSegs")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_counters_are_read_by_name() {
        let snmp = "Ip: Forwarding DefaultTTL\nIp: 1 64\n\
            Tcp: RtoAlgorithm ActiveOpens InSegs OutSegs RetransSegs InErrs\n\
            Tcp: 1 7 1000 2000 30 0\n\
            Udp: InDatagrams\nUdp: 5\n";
        let before = parse(snmp).unwrap();
        assert_eq!(
            before,
            Segments {
                sent: 2000,
                retransmitted: 30
            }
        );
        let after = Segments {
            sent: 402_000,
            retransmitted: 70,
        };
        let during = before.until(after);
        assert_eq!(during.retransmitted, 40);
        assert!(during.lossy(), "40 of 400 000 is one in ten thousand");
        assert_eq!(during.percent(), "0.010%");
        assert!(
            !Segments {
                sent: 400_000,
                retransmitted: 39
            }
            .lossy()
        );
        assert!(
            !Segments {
                sent: 50,
                retransmitted: 9
            }
            .lossy(),
            "too few to judge"
        );
        assert_eq!(parse("Tcp: OutSegs\n"), None);
        assert_eq!(parse("Tcp: OutSegs\nTcp: x\n"), None);
    }

    /// A namespace of its own starts with no TCP traffic: its counters, read through `ip netns
    /// exec`, are its own and not the host's.
    #[test]
    fn a_fresh_namespace_has_counters_of_its_own() {
        if !crate::netns::available_for_test("a_fresh_namespace_has_counters_of_its_own") {
            return;
        }
        let name = format!("rlxcount-{}", std::process::id());
        let added = Command::new("ip").args(["netns", "add", &name]).status();
        assert!(added.is_ok_and(|s| s.success()), "ip netns add {name}");
        let counters = Segments::in_namespace(&name);
        let _ = Command::new("ip").args(["netns", "del", &name]).status();
        assert_eq!(
            counters,
            Some(Segments {
                sent: 0,
                retransmitted: 0
            })
        );
        assert_eq!(Segments::in_namespace("rlxcount-no-such-namespace"), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_hosts_counters_are_readable() {
        let counters = Segments::now().expect("/proc/net/snmp has Tcp: lines");
        assert!(counters.sent >= counters.retransmitted, "{counters:?}");
    }
}
