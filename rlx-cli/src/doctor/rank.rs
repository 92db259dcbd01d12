//! One doctor rank: joins the job as a rank does, measures every peer (route, MTU, round
//! trips, bandwidth, segments sent again, clock skew) and prints its report for the launcher.

use rlx_collective::CollectiveOp;

use super::*;

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
    let group = rlx_collective::ProcessGroup::new(std::sync::Arc::new(t));
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
        ring_order: group.ring_order().to_vec(),
        declared_cabling: std::env::var(rlx_collective::CABLING_VAR).ok(),
        plan: [CollectiveOp::AllReduce, CollectiveOp::AllGather]
            .into_iter()
            .map(|op| format!("{op} {}", group.planned_algorithm(op, PLANNED_BYTES)))
            .collect(),
    };
    let json = serde_json::to_string(&report).map_err(|e| e.to_string())?;
    println!("{RESULT_PREFIX}{json}");
    Ok(())
}

/// The size the reported plan is for: large enough that the plans for the cabling apply.
const PLANNED_BYTES: usize = 64 << 20;

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
pub(super) fn is_wireless(interface: &str) -> bool {
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
