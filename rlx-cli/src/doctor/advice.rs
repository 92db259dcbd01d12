//! What the doctor's launcher makes of the ranks' reports: the advice on routes, MTUs, lossy
//! links and the cabling, and the matrix it prints.

use std::fmt::Write as _;

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
    let seen_by = |a: u32, b: u32| {
        let report = reports.iter().find(|r| r.rank == a)?;
        report.peers.iter().find(|p| p.peer == b)?.link.clone()
    };
    // The matrix is symmetric in reach: either end's report says it.
    let link = |a: u32, b: u32| seen_by(a, b).or_else(|| seen_by(b, a));
    if let Some(order) = reports.first().map(|r| &r.ring_order) {
        for (i, &a) in order.iter().enumerate() {
            let b = order[(i + 1) % order.len()];
            if order.len() > 1 && link(a, b).as_deref() == Some("routed") {
                advice.push(format!(
                    "the rings' hop from rank {a} to rank {b} crosses other machines (no cable \
                     or switch joins them): its bytes load the cables of the ranks between, \
                     and a cable between {a} and {b} would take that load off them"
                ));
            }
        }
    }
    let mut rates: Vec<(f64, u32, u32)> = reports
        .iter()
        .flat_map(|r| {
            r.peers
                .iter()
                .filter_map(move |p| Some((p.gbytes_per_s?, r.rank, p.peer)))
        })
        .collect();
    rates.sort_by(|x, y| x.0.total_cmp(&y.0));
    let median = rates.get(rates.len() / 2).map(|m| m.0);
    if let (Some(&(slowest, a, b)), Some(median)) = (rates.first(), median) {
        if rates.len() >= 3 && slowest < median / 2.0 {
            advice.push(format!(
                "rank {a} ↔ {b} is the slowest pair ({slowest:.2} GB/s, the median pair \
                 {median:.2}): every ring through it runs at its speed; look at its cable (a \
                 Thunderbolt 4 cable among Thunderbolt 5 ones, a port of another speed)"
            ));
        }
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
}
