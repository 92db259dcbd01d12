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
//!
//! This file holds the flags, the reports and the launcher's side; `advice.rs` reads the
//! reports (the advice and the printed matrix), `picture.rs` draws them (`--svg`), `rank.rs`
//! is what each rank measures.

mod advice;
mod picture;
mod rank;

pub use advice::{advise, render};
pub use picture::svg;
pub use rank::rank_main;

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
    /// Also draw the cluster as an SVG picture in this file: the ranks, their cables and
    /// switches labelled with the measured GB/s and round trip, a declared cable that is
    /// missing, and the plan of the collectives.
    #[arg(long)]
    pub svg: Option<std::path::PathBuf>,
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
    /// The cabling the job declares (`RLX_CABLING`, which `--netns --topology` sets), as the
    /// rank saw it.
    #[serde(default)]
    pub declared_cabling: Option<String>,
    /// What the collectives would run a 64 MiB all-reduce and all-gather with on this
    /// cabling (`ProcessGroup::planned_algorithm`), as `all_reduce direct`.
    #[serde(default)]
    pub plan: Vec<String>,
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
    if let Some(path) = &args.svg {
        std::fs::write(path, picture::svg(&reports))
            .map_err(|e| format!("could not write {}: {e}", path.display()))?;
        println!("the picture of the cluster is in {}", path.display());
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
