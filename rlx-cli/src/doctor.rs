//! `rlx doctor`: a pre-flight check of the links a job would use. It starts the ranks
//! the way a job starts (the same launch environment, `--netns` included), and every rank
//! reports, for each peer, the local interface and address the kernel routes to it through,
//! that interface's MTU, whether it is wireless or loopback, the round-trip time (median and
//! p99 of 8-byte ping-pongs), the bandwidth of a 32 MiB transfer over one socket and over the
//! configured sockets per peer (`RLX_SOCKETS_PER_PEER`), the TCP segments the sender had to
//! send again during that transfer (Linux only), and the clock skew; plus its host, its
//! Thunderbolt links, its version and compiled backends. The launcher prints the matrix and
//! advice, and flags every pair whose route leaves through a wireless interface, through
//! loopback between two hosts, or through an interface the configured
//! `RLX_SOCKET_IFNAME`/`RLX_TB_IFNAME` does not name, and every pair whose link drops or
//! reorders packets.

use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Args;
use serde::{Deserialize, Serialize};

use rlx_transport::interfaces::InterfaceAddress;

use crate::job::{ChildSpec, Job, Output, Stream};
use crate::tcp_counters::Segments;
use crate::world::{ProcessWorldArgs, World};

/// Flags of `rlx doctor`.
#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Number of ranks.
    #[arg(short = 'n', long = "ranks", default_value_t = 2)]
    pub ranks: u32,
    /// The transport, rendezvous and network namespaces, as for a job.
    #[command(flatten)]
    pub world: ProcessWorldArgs,
    /// Also write the ranks' reports and the advice as JSON to this file.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
    /// Sockets per peer the job will use (`RLX_SOCKETS_PER_PEER`); above one, the bandwidth is
    /// measured over one socket and over this many.
    #[arg(long, default_value_t = 1)]
    pub sockets_per_peer: u32,
}

/// The line prefix of a rank's report on its stdout.
const RESULT_PREFIX: &str = "doctor-result ";

/// Ping-pongs per pair.
const PINGS: usize = 200;

/// Bytes of the bandwidth transfer, in messages of [`CHUNK`].
const TRANSFER: usize = 32 << 20;
const CHUNK: usize = 1 << 20;

/// One rank's view of one peer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PeerReport {
    /// The peer's rank.
    pub peer: u32,
    /// The peer's address as the transport knows it.
    pub addr: Option<String>,
    /// The local interface the route to the peer leaves through.
    pub interface: Option<String>,
    /// The local address of that route.
    pub local: Option<String>,
    /// The interface's MTU.
    pub mtu: Option<u32>,
    /// Whether the interface is wireless.
    pub wireless: bool,
    /// Whether the route is loopback.
    pub loopback: bool,
    /// The median round-trip time of the ping-pongs, measured by the lower rank of the pair
    /// only.
    pub rtt_median_us: Option<f64>,
    /// Their 99th percentile.
    pub rtt_p99_us: Option<f64>,
    /// Over one socket per peer.
    pub gbytes_per_s: Option<f64>,
    /// Over the configured sockets per peer, when that is more than one.
    pub gbytes_per_s_configured: Option<f64>,
    /// TCP segments this host sent during the one-socket bandwidth transfer, and how many of
    /// them were sends again of lost or reordered ones (the host's counters, so other traffic
    /// of this host counts too; Linux only).
    pub segments: Option<Segments>,
    /// The peer's clock minus this rank's, estimated from the ping-pongs.
    pub skew_us: Option<f64>,
    /// How the link matrix says the peer is reached, with this rank's interface on the shared
    /// network (`cable thunderbolt1`, `switch eth0`, `routed`); `None` when the transport
    /// knows no matrix.
    #[serde(default)]
    pub link: Option<String>,
}

/// One rank's report.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RankReport {
    /// The reporting rank.
    pub rank: u32,
    /// Its host name.
    pub host: String,
    /// Its RLX version.
    pub version: String,
    /// The backends compiled into it.
    pub backends: Vec<String>,
    /// The Thunderbolt links the Thunderbolt transport would pin to.
    pub thunderbolt_links: Vec<String>,
    /// `RLX_SOCKET_IFNAME` as the rank saw it.
    pub socket_ifname: Option<String>,
    /// `RLX_TB_IFNAME` as the rank saw it.
    pub tb_ifname: Option<String>,
    /// Its view of each peer.
    pub peers: Vec<PeerReport>,
    /// The order in which the collectives' rings visit the ranks (see
    /// `ProcessGroup::ring_order`).
    #[serde(default)]
    pub ring_order: Vec<u32>,
}

/// Runs the check with `binary __doctor-rank` as the ranks and prints the matrix and the
/// advice.
pub fn run(args: &DoctorArgs, binary: &Path) -> Result<(), String> {
    let config = args.world.world().config(args.ranks, Some(60_000));
    let job = |sockets: u32| -> Result<Vec<RankReport>, String> {
        let world = World::prepare(&config)?;
        let specs: Vec<ChildSpec> = (0..world.process_count())
            .map(|index| {
                world
                    .child(index, binary, vec!["__doctor-rank".to_owned()])
                    .env("RLX_SOCKETS_PER_PEER", sockets.to_string())
            })
            .collect();
        collect(&specs)
    };
    let mut reports = job(1)?;
    if args.sockets_per_peer > 1 {
        let striped = job(args.sockets_per_peer)?;
        for (one, many) in reports.iter_mut().zip(&striped) {
            for (peer, striped) in one.peers.iter_mut().zip(&many.peers) {
                peer.gbytes_per_s_configured = striped.gbytes_per_s;
            }
        }
    }
    let advice = advise(&reports);
    print!("{}", render(&reports, &advice));
    if let Some(path) = &args.json {
        let json = serde_json::json!({ "ranks": reports, "advice": advice });
        std::fs::write(path, json.to_string())
            .map_err(|e| format!("could not write {}: {e}", path.display()))?;
    }
    Ok(())
}

/// Runs the doctor ranks of `specs` and returns their reports in rank order.
pub fn collect(specs: &[ChildSpec]) -> Result<Vec<RankReport>, String> {
    let mut job = Job::spawn(specs)?;
    let mut reports = Vec::new();
    let mut errors = Vec::new();
    let mut closed = 0;
    let deadline = Instant::now() + Duration::from_secs(180);
    while closed < specs.len() && Instant::now() < deadline {
        match job.next(Duration::from_millis(50)) {
            Some(Output::Line {
                child,
                stream,
                text,
            }) => match (stream, text.strip_prefix(RESULT_PREFIX)) {
                (Stream::Stdout, Some(json)) => match serde_json::from_str::<RankReport>(json) {
                    Ok(report) => reports.push(report),
                    Err(e) => errors.push(format!("{}: bad report: {e}", job.label(child))),
                },
                (Stream::Stderr, _) => errors.push(format!("{}: {text}", job.label(child))),
                _ => {}
            },
            Some(Output::Closed { .. }) => closed += 1,
            None => {}
        }
    }
    let statuses = job.finish(Duration::from_secs(5));
    if reports.len() != specs.len() {
        return Err(format!(
            "{} of {} ranks reported ({statuses:?}): {}",
            reports.len(),
            specs.len(),
            errors.join("; ")
        ));
    }
    reports.sort_by_key(|r| r.rank);
    Ok(reports)
}

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

/// The rank side (`__doctor-rank`): joins the job, measures every pair, prints its report.
pub fn rank_main() -> Result<(), String> {
    use rlx_transport::Transport;

    let t = rlx_net::TcpTransport::from_env().map_err(|e| format!("could not join: {e}"))?;
    let (me, n) = (t.rank(), t.world_size());
    let topology = t.topology();
    // The host's interfaces, read once for every peer's route and link.
    let interfaces = rlx_transport::interfaces::addresses().unwrap_or_default();
    let mut peers: Vec<PeerReport> = (0..n)
        .filter(|&p| p != me)
        .map(|peer| PeerReport {
            link: topology
                .as_ref()
                .and_then(|m| m.link(me, peer))
                .map(|link| link_words(link, &interfaces)),
            ..describe_peer(peer, t.peer_addr(peer), &interfaces)
        })
        .collect();
    // One pair at a time, so that measurements do not share the links or the cores.
    for a in 0..n {
        for b in a + 1..n {
            if me == a {
                let slot = peers.iter_mut().find(|p| p.peer == b);
                let measured = measure_as_initiator(&t, b)?;
                if let Some(slot) = slot {
                    slot.rtt_median_us = Some(measured.rtt_median_us);
                    slot.rtt_p99_us = Some(measured.rtt_p99_us);
                    slot.skew_us = Some(measured.skew_us);
                    slot.gbytes_per_s = Some(measured.gbytes_per_s);
                    slot.segments = measured.segments;
                }
            } else if me == b {
                measure_as_responder(&t, a)?;
            }
            t.barrier().map_err(|e| e.to_string())?;
        }
    }
    let report = RankReport {
        rank: me,
        host: hostname(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        backends: rlx_collective::compiled_backends()
            .into_iter()
            .map(str::to_owned)
            .collect(),
        thunderbolt_links: rlx_tb::discover()
            .map(|links| links.into_iter().map(|l| l.name).collect())
            .unwrap_or_default(),
        socket_ifname: std::env::var("RLX_SOCKET_IFNAME").ok(),
        tb_ifname: std::env::var("RLX_TB_IFNAME").ok(),
        peers,
        ring_order: rlx_collective::ProcessGroup::new(std::sync::Arc::new(t))
            .ring_order()
            .to_vec(),
    };
    let json = serde_json::to_string(&report).map_err(|e| e.to_string())?;
    println!("{RESULT_PREFIX}{json}");
    Ok(())
}

const PING_TAG: u32 = 11;
const DATA_TAG: u32 = 12;

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// What the lower rank of a pair measures towards the other.
struct Measured {
    rtt_median_us: f64,
    rtt_p99_us: f64,
    skew_us: f64,
    gbytes_per_s: f64,
    segments: Option<Segments>,
}

/// Ping-pongs, then a bandwidth transfer, towards `peer`.
fn measure_as_initiator(t: &rlx_net::TcpTransport, peer: u32) -> Result<Measured, String> {
    use rlx_transport::Transport;

    let mut rtts = Vec::with_capacity(PINGS);
    let mut skews = Vec::with_capacity(PINGS);
    for _ in 0..PINGS {
        let sent = now_ns();
        let started = Instant::now();
        t.send_bytes(peer, PING_TAG, &sent.to_le_bytes())
            .map_err(|e| e.to_string())?;
        let reply = t.recv_bytes(peer, PING_TAG).map_err(|e| e.to_string())?;
        let rtt = started.elapsed().as_secs_f64() * 1e6;
        let theirs = reply
            .get(..8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)
            .ok_or("a short ping reply")?;
        skews.push((theirs as f64 - sent as f64) / 1e3 - rtt / 2.0);
        rtts.push(rtt);
    }
    rtts.sort_by(f64::total_cmp);
    skews.sort_by(f64::total_cmp);
    let chunk = vec![0x5Au8; CHUNK];
    let before = Segments::now();
    let started = Instant::now();
    for _ in 0..TRANSFER / CHUNK {
        t.send_bytes(peer, DATA_TAG, &chunk)
            .map_err(|e| e.to_string())?;
    }
    t.recv_bytes(peer, DATA_TAG).map_err(|e| e.to_string())?;
    let gbytes_per_s = TRANSFER as f64 / started.elapsed().as_secs_f64() / 1e9;
    Ok(Measured {
        rtt_median_us: rtts[rtts.len() / 2],
        rtt_p99_us: rtts[rtts.len() * 99 / 100],
        skew_us: skews[skews.len() / 2],
        gbytes_per_s,
        segments: before.zip(Segments::now()).map(|(b, a)| b.until(a)),
    })
}

fn measure_as_responder(t: &rlx_net::TcpTransport, peer: u32) -> Result<(), String> {
    use rlx_transport::Transport;

    for _ in 0..PINGS {
        t.recv_bytes(peer, PING_TAG).map_err(|e| e.to_string())?;
        t.send_bytes(peer, PING_TAG, &now_ns().to_le_bytes())
            .map_err(|e| e.to_string())?;
    }
    for _ in 0..TRANSFER / CHUNK {
        t.recv_bytes(peer, DATA_TAG).map_err(|e| e.to_string())?;
    }
    t.send_bytes(peer, DATA_TAG, &[1])
        .map_err(|e| e.to_string())
}

/// A link of the matrix in words: its reach and, for a cable or a switch, this rank's
/// interface on the network it shares with the peer.
fn link_words(link: &rlx_transport::topology::Link, interfaces: &[InterfaceAddress]) -> String {
    match link.local.and_then(|ip| interface_of(ip, interfaces)) {
        Some(interface) => format!("{} {interface}", link.reach),
        None => link.reach.to_string(),
    }
}

/// The route to `addr` as the kernel chooses it: the local interface and address.
fn describe_peer(
    peer: u32,
    addr: Option<SocketAddr>,
    interfaces: &[InterfaceAddress],
) -> PeerReport {
    let route = addr.and_then(rlx_transport::interfaces::route_source);
    let interface = route.and_then(|ip| interface_of(ip, interfaces));
    PeerReport {
        peer,
        addr: addr.map(|a| a.to_string()),
        mtu: interface.as_deref().and_then(mtu_of),
        wireless: interface.as_deref().is_some_and(is_wireless),
        loopback: route.is_some_and(|ip| ip.is_loopback()),
        interface,
        local: route.map(|ip| ip.to_string()),
        rtt_median_us: None,
        rtt_p99_us: None,
        gbytes_per_s: None,
        gbytes_per_s_configured: None,
        segments: None,
        skew_us: None,
        link: None,
    }
}

/// The name of the interface of `interfaces` that has address `ip`.
fn interface_of(ip: IpAddr, interfaces: &[InterfaceAddress]) -> Option<String> {
    interfaces
        .iter()
        .find(|a| a.addr == Some(ip))
        .map(|a| a.name.clone())
}

/// The MTU the system reports for `interface` (Linux's sysfs; elsewhere unknown).
fn mtu_of(interface: &str) -> Option<u32> {
    std::fs::read_to_string(format!("/sys/class/net/{interface}/mtu"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Whether `interface` is wireless: Linux marks wireless devices in sysfs, and their names
/// start with `wl` on Linux (`wlan0`, `wlp2s0`); on a Mac, Wi-Fi is usually `en0`, which only
/// the system's own tools can tell apart, so names decide there.
fn is_wireless(interface: &str) -> bool {
    interface.starts_with("wl")
        || std::path::Path::new(&format!("/sys/class/net/{interface}/wireless")).exists()
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: `buf` is a valid, writable buffer of the length passed; gethostname writes at
    // most that many bytes.
    let ok = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0;
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    if ok {
        String::from_utf8_lossy(&buf[..end]).into_owned()
    } else {
        "unknown".to_owned()
    }
}

#[cfg(test)]
mod tests {
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
