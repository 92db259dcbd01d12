//! What the doctor's launcher makes of the ranks' reports: the advice on routes, MTUs, lossy
//! links and the cabling, and the matrix it prints.

use std::fmt::Write as _;

use rlx_transport::Reach;
use rlx_transport::cabling::Cabling;

use crate::tcp_counters::Segments;

use super::RankReport;

/// What to fix, one sentence per problem found.
pub fn advise(reports: &[RankReport]) -> Vec<String> {
    let mut advice = Vec::new();
    let hosts: std::collections::BTreeSet<&str> = reports.iter().map(|r| r.host.as_str()).collect();
    for report in reports {
        for peer in &report.peers {
            let pair = format!("rank {} ↔ {}", report.rank, peer.peer);
            if let Some(segments) = peer.segments.filter(|s| s.lossy()) {
                advice.push(format!(
                    "{pair}: rank {} sent {} of {} TCP segments again during the bandwidth \
                     test ({}): the link drops or reorders packets, and operations over it will \
                     stall now and then; look at the interface's error and drop counters (`ip \
                     -s link`), the cable, and the driver's offloads (a virtual link such as \
                     veth reorders packets that different cores handle)",
                    report.rank,
                    segments.retransmitted,
                    segments.sent,
                    segments.percent(),
                ));
            }
            let Some(interface) = &peer.interface else {
                continue;
            };
            let tb = report.thunderbolt_links.first();
            if peer.wireless {
                let fix = match tb {
                    Some(link) => {
                        format!("set RLX_TB_IFNAME={link} (or RLX_SOCKET_IFNAME=={link})")
                    }
                    None => "set RLX_SOCKET_IFNAME to a wired interface".to_owned(),
                };
                advice.push(format!(
                    "{pair} goes over {interface}, a wireless link; {fix}"
                ));
            }
            if peer.loopback && hosts.len() > 1 {
                advice.push(format!(
                    "{pair} goes over loopback in a job of {} hosts: the peer's address is a \
                     loopback one; set RLX_SOCKET_IFNAME to the interface between the hosts",
                    hosts.len()
                ));
            }
            for (var, filter) in [
                ("RLX_SOCKET_IFNAME", &report.socket_ifname),
                ("RLX_TB_IFNAME", &report.tb_ifname),
            ] {
                let Some(spec) = filter else { continue };
                let matches = rlx_transport::ifname::IfnameFilter::parse(spec)
                    .is_ok_and(|f| f.matches(interface));
                if !matches && !peer.loopback {
                    advice.push(format!(
                        "{pair} goes over {interface}, which {var}={spec} does not name: the \
                         route to {} leaves through another interface",
                        peer.addr.as_deref().unwrap_or("the peer")
                    ));
                }
            }
        }
    }
    advise_on_cabling(reports, &mut advice);
    advice
}

/// The advice on the cabling: each hop of the rings that crosses other machines, and a pair
/// much slower than the others, which bounds every ring through it.
fn advise_on_cabling(reports: &[RankReport], advice: &mut Vec<String>) {
    advice.extend(missing_cables(reports));
    if let Some(order) = reports.first().map(|r| &r.ring_order) {
        for (i, &a) in order.iter().enumerate() {
            let b = order[(i + 1) % order.len()];
            if order.len() > 1 && reach_between(reports, a, b) == Some(Reach::Routed) {
                advice.push(format!(
                    "the rings' hop from rank {a} to rank {b} crosses other machines (no cable \
                     or switch joins them): its bytes load the cables of the ranks between, \
                     and a cable between {a} and {b} would take that load off them"
                ));
            }
        }
    }
    let rates = rates_slowest_first(reports);
    let median = rates.get(rates.len() / 2).map(|m| m.0);
    if let (Some(&(slowest, [a, b])), Some(median)) = (rates.first(), median) {
        if rates.len() >= 3 && slowest < median / 2.0 {
            advice.push(format!(
                "rank {a} ↔ {b} is the slowest pair ({slowest:.2} GB/s, the median pair \
                 {median:.2}): every ring through it runs at its speed; look at its cable (a \
                 Thunderbolt 4 cable among Thunderbolt 5 ones, a port of another speed)"
            ));
        }
    }
}

/// Every measured pair's bandwidth (GB/s over one socket) with the pair, the slowest first.
pub(super) fn rates_slowest_first(reports: &[RankReport]) -> Vec<(f64, [u32; 2])> {
    let mut rates: Vec<(f64, [u32; 2])> = reports
        .iter()
        .flat_map(|r| {
            r.peers
                .iter()
                .filter_map(move |p| Some((p.gbytes_per_s?, [r.rank, p.peer])))
        })
        .collect();
    rates.sort_by(|x, y| x.0.total_cmp(&y.0));
    rates
}

/// How rank `a` reaches rank `b` by the reports' link column (`cable thunderbolt1`, `switch
/// eth0`, `routed`), from either end; `None` when neither knows the matrix.
pub(super) fn reach_between(reports: &[RankReport], a: u32, b: u32) -> Option<Reach> {
    let seen_by = |from: u32, to: u32| {
        let report = reports.iter().find(|r| r.rank == from)?;
        let link = report
            .peers
            .iter()
            .find(|p| p.peer == to)?
            .link
            .as_deref()?;
        Some(match link.split_whitespace().next() {
            Some("cable") => Reach::Cable,
            Some("switch") => Reach::Switch,
            _ => Reach::Routed,
        })
    };
    seen_by(a, b).or_else(|| seen_by(b, a))
}

/// The cabling the ranks declare (`RLX_CABLING`), when they declare a readable one.
pub(super) fn declared_cabling(reports: &[RankReport]) -> Option<Cabling> {
    reports.first()?.declared_cabling.as_deref()?.parse().ok()
}

/// Every cable of the declared cabling that the link matrix lacks, as advice naming its ranks.
fn missing_cables(reports: &[RankReport]) -> Vec<String> {
    let Some(declared) = declared_cabling(reports) else {
        return Vec::new();
    };
    let world = reports.len() as u32;
    let reach = |a, b| reach_between(reports, a, b).unwrap_or(Reach::Routed);
    match declared.missing_cables(world, reach) {
        Ok(missing) => missing
            .into_iter()
            .map(|([a, b], found)| {
                format!(
                    "the cabling is declared {declared} (RLX_CABLING), but no cable joins ranks \
                     {a} and {b}: they reach each other {}; check that cable and its two \
                     ports (until then the collectives plan over the cables there are)",
                    found.as_words()
                )
            })
            .collect(),
        Err(error) => vec![format!("RLX_CABLING={declared}: {error}")],
    }
}

/// The matrix and the advice, as the user reads them.
pub fn render(reports: &[RankReport], advice: &[String]) -> String {
    let mut out = String::new();
    for r in reports {
        let tb = if r.thunderbolt_links.is_empty() {
            "none".to_owned()
        } else {
            r.thunderbolt_links.join(", ")
        };
        let _ = writeln!(
            out,
            "rank {} on {}: rlx {} (backends {}), Thunderbolt links: {tb}",
            r.rank,
            r.host,
            r.version,
            r.backends.join(", ")
        );
    }
    let _ = writeln!(
        out,
        "\n{:<9} {:<22} {:<14} {:<20} {:>6} {:>10} {:>10} {:>9} {:>12} {:>10} {:>10}",
        "pair",
        "peer address",
        "interface",
        "link",
        "mtu",
        "rtt med",
        "rtt p99",
        "GB/s",
        "GB/s (cfg)",
        "resent",
        "skew"
    );
    let rate = |g: Option<f64>| g.map_or_else(|| "-".to_owned(), |g| format!("{g:.2}"));
    let us = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.1} us"));
    for r in reports {
        for p in r.peers.iter().filter(|p| p.rtt_median_us.is_some()) {
            let _ = writeln!(
                out,
                "{:<9} {:<22} {:<14} {:<20} {:>6} {:>10} {:>10} {:>9} {:>12} {:>10} {:>10}",
                format!("{} ↔ {}", r.rank, p.peer),
                p.addr.as_deref().unwrap_or("-"),
                p.interface.as_deref().unwrap_or("-"),
                p.link.as_deref().unwrap_or("-"),
                p.mtu.map_or_else(|| "-".to_owned(), |m| m.to_string()),
                us(p.rtt_median_us),
                us(p.rtt_p99_us),
                rate(p.gbytes_per_s),
                rate(p.gbytes_per_s_configured),
                p.segments.map_or_else(|| "-".to_owned(), Segments::percent),
                us(p.skew_us),
            );
        }
    }
    if let Some(first) = reports.first().filter(|r| !r.ring_order.is_empty()) {
        let order: Vec<String> = first.ring_order.iter().map(u32::to_string).collect();
        let _ = writeln!(
            out,
            "\nplan: the rings visit the ranks as {} (in rank order unless the cables make \
             another order cheaper)",
            order.join("-")
        );
        if !first.plan.is_empty() {
            let _ = writeln!(out, "plan at 64 MiB: {}", first.plan.join(", "));
        }
    }
    if advice.is_empty() {
        out.push_str("\nno problems found\n");
    } else {
        out.push_str("\nadvice:\n");
        for line in advice {
            let _ = writeln!(out, "  - {line}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::PeerReport;
    use super::super::rank::is_wireless;
    use super::*;

    fn rank(rank: u32, peer: PeerReport) -> RankReport {
        RankReport {
            rank,
            host: "h".to_owned(),
            version: "0".to_owned(),
            backends: vec!["tcp".to_owned()],
            thunderbolt_links: vec!["thunderbolt0".to_owned()],
            socket_ifname: None,
            tb_ifname: None,
            peers: vec![peer],
            ring_order: Vec::new(),
            declared_cabling: None,
            plan: Vec::new(),
        }
    }

    fn peer(interface: &str) -> PeerReport {
        PeerReport {
            peer: 1,
            addr: Some("10.0.0.2:1".to_owned()),
            interface: Some(interface.to_owned()),
            local: Some("10.0.0.1".to_owned()),
            mtu: Some(1500),
            wireless: is_wireless(interface),
            loopback: false,
            rtt_median_us: Some(10.0),
            rtt_p99_us: Some(20.0),
            gbytes_per_s: Some(1.0),
            gbytes_per_s_configured: None,
            segments: Some(Segments {
                sent: 23_000,
                retransmitted: 0,
            }),
            skew_us: Some(0.0),
            link: None,
        }
    }

    #[test]
    fn a_wireless_route_is_flagged_with_the_thunderbolt_fix() {
        let advice = advise(&[rank(0, peer("wlan0"))]);
        assert_eq!(advice.len(), 1, "{advice:?}");
        assert!(
            advice[0].contains("rank 0 ↔ 1 goes over wlan0"),
            "{advice:?}"
        );
        assert!(
            advice[0].contains("RLX_TB_IFNAME=thunderbolt0"),
            "{advice:?}"
        );
        assert!(advise(&[rank(0, peer("thunderbolt0"))]).is_empty());
    }

    #[test]
    fn a_lossy_link_is_flagged_and_a_clean_one_is_not() {
        let mut lossy = peer("thunderbolt0");
        lossy.segments = Some(Segments {
            sent: 23_000,
            retransmitted: 120,
        });
        let advice = advise(&[rank(0, lossy)]);
        assert_eq!(advice.len(), 1, "{advice:?}");
        assert!(
            advice[0].contains("rank 0 sent 120 of 23000 TCP segments again"),
            "{advice:?}"
        );
        assert!(advice[0].contains("(0.522%)"), "{advice:?}");
        let text = render(&[rank(0, peer("thunderbolt0"))], &[]);
        assert!(text.contains("0.000%"), "{text}");
    }

    #[test]
    fn a_route_outside_the_configured_interfaces_is_flagged() {
        let mut report = rank(0, peer("eth1"));
        report.socket_ifname = Some("=eth0".to_owned());
        let advice = advise(&[report]);
        assert!(
            advice
                .iter()
                .any(|a| a.contains("eth1, which RLX_SOCKET_IFNAME==eth0 does not name")),
            "{advice:?}"
        );
    }

    #[test]
    fn a_routed_hop_of_the_rings_and_a_slow_pair_are_flagged() {
        let pair = |rank_: u32, to: u32, link: &str, rate: f64| {
            let mut p = peer("thunderbolt0");
            p.peer = to;
            p.link = Some(link.to_owned());
            p.gbytes_per_s = Some(rate);
            rank(rank_, p)
        };
        // A chain 0-2-1 (ranks 0 and 1 have no cable), the ring 0-2-1, and 2 ↔ 1 slow.
        let mut reports = vec![
            pair(0, 1, "routed", 0.1),
            pair(0, 2, "cable thunderbolt0", 1.0),
            pair(2, 1, "cable thunderbolt1", 0.2),
        ];
        reports[0].ring_order = vec![0, 2, 1];
        reports.push(pair(1, 2, "cable thunderbolt0", 1.0));
        let advice = advise(&reports);
        assert!(
            advice
                .iter()
                .any(|a| a.contains("from rank 1 to rank 0 crosses")),
            "{advice:?}"
        );
        assert!(
            advice
                .iter()
                .any(|a| a.contains("rank 0 ↔ 1 is the slowest pair")),
            "{advice:?}"
        );
        let rendered = render(&reports, &advice);
        assert!(
            rendered.contains("plan: the rings visit the ranks as 0-2-1"),
            "{rendered}"
        );
        assert!(rendered.contains("cable thunderbolt1"), "{rendered}");
    }

    /// The reports of a 4-rank mesh declared as one, whose cable between ranks 1 and 3 is
    /// missing (they reach each other through the switch).
    fn mesh_missing_a_cable() -> Vec<RankReport> {
        (0..4u32)
            .map(|me| {
                let mut report = rank(me, peer("thunderbolt0"));
                report.peers = (0..4u32)
                    .filter(|&p| p != me)
                    .map(|to| {
                        let mut p = peer("thunderbolt0");
                        p.peer = to;
                        let switched = [me.min(to), me.max(to)] == [1, 3];
                        p.link = Some(
                            if switched {
                                "switch eth0"
                            } else {
                                "cable thunderbolt0"
                            }
                            .to_owned(),
                        );
                        p.gbytes_per_s = Some(if switched { 0.1 } else { 1.0 });
                        p
                    })
                    .collect();
                report.declared_cabling = Some("mesh+star".to_owned());
                report.ring_order = vec![0, 1, 2, 3];
                report.plan = vec!["all_reduce direct".to_owned()];
                report
            })
            .collect()
    }

    #[test]
    fn a_cable_missing_from_a_declared_mesh_is_named_and_drawn() {
        let reports = mesh_missing_a_cable();
        let advice = advise(&reports);
        let missing: Vec<&String> = advice
            .iter()
            .filter(|a| a.contains("no cable joins"))
            .collect();
        assert_eq!(missing.len(), 1, "{advice:?}");
        assert!(
            missing[0].contains("ranks 1 and 3: they reach each other through a switch"),
            "{advice:?}"
        );
        let picture = super::super::svg(&reports);
        assert!(picture.starts_with("<svg"), "{picture}");
        assert_eq!(picture.matches("missing cable").count(), 2, "{picture}");
        // Five cables drawn solid, each labelled with what was measured on it.
        assert_eq!(
            picture.matches("stroke-width=\"4\"").count(),
            5,
            "{picture}"
        );
        assert_eq!(picture.matches("1.00 GB/s · 10 µs").count(), 5, "{picture}");
        assert!(
            picture.contains("plan at 64 MiB: all_reduce direct"),
            "{picture}"
        );
        assert!(picture.contains(">rank 3<"), "{picture}");
        // Without a declaration nothing is missing, and the slow pair is drawn as measured.
        let undeclared: Vec<RankReport> = reports
            .into_iter()
            .map(|mut r| {
                r.declared_cabling = None;
                r
            })
            .collect();
        assert!(
            advise(&undeclared)
                .iter()
                .all(|a| !a.contains("no cable joins"))
        );
        let picture = super::super::svg(&undeclared);
        assert!(picture.contains("0.10 GB/s · 10 µs"), "{picture}");
        assert!(!picture.contains("stroke=\"#d00\""), "{picture}");
    }
}
