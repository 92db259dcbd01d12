//! `cargo xtask test-cluster`: a local multi-rank cluster that runs every collective on every
//! dtype and reduction over awkward sizes, each result checked against a serial reference.
//!
//! The launcher builds the rank binary once, starts the ranks with the environment a user's
//! launcher would set (see [`crate::world`]), shows one live progress line per rank, and ends
//! with a table. It fails on any wrong byte, on any error that should not have happened, and on
//! a hang — the global `--timeout` — naming each hung rank and the case it was in. With
//! `--kill`/`--stall` it instead checks that every survivor fails with the right error in time.

mod args;
mod cabling_checks;
mod events;
mod fault;
mod monitor;
mod progress;
mod report;
mod shrink;
mod soak;
mod soak_rank;
mod table;
mod trials;
mod view;
pub(crate) mod worker;

#[cfg(test)]
mod tests;

use std::time::{Duration, Instant};

use crate::flight_report;
use crate::job::{ChildSpec, Job};
use crate::ranks;
use crate::world::{TransportKind, World};
pub(crate) use args::{ClusterArgs, Scenario};
use fault::{Fault, FaultKind, Point};
use monitor::Monitor;

/// Runs the cluster described by `args`; `Err` when anything was wrong.
pub(crate) fn run(args: &ClusterArgs) -> Result<(), String> {
    if let Some(repeat) = args.repeat {
        return trials::run(args, repeat);
    }
    if let Some(duration) = args.duration {
        return soak::run(args, duration);
    }
    let fault = args.fault();
    if args.ranks == 0 {
        return Err("-n must be at least 1".to_owned());
    }
    if let Some(f) = &fault {
        if f.target.rank >= args.ranks {
            return Err(format!(
                "the fault's rank {} is not in a world of {} ranks",
                f.target.rank, args.ranks
            ));
        }
        if args.ranks < 2 {
            return Err("fault injection needs at least two ranks".to_owned());
        }
    }
    let in_bootstrap =
        matches!(&fault, Some(f) if matches!(f.target.point, Point::Bootstrap { .. }));
    if in_bootstrap
        && (args.kill.is_none() || args.shrink || args.world.transport == TransportKind::Mem)
    {
        return Err(
            "a fault in the bootstrap is a kill of a rank's process: it needs --kill, a \
             transport of separate processes and no --shrink"
                .to_owned(),
        );
    }
    if args.shrink && fault.is_none() {
        return Err("--shrink needs a fault to survive (--kill or --stall)".to_owned());
    }
    if args.rejoin && (args.kill.is_none() || args.world.transport == TransportKind::Mem) {
        return Err(
            "--rejoin restarts a killed rank's process: it needs --kill and a transport of \
             separate processes (tcp)"
                .to_owned(),
        );
    }
    // A victim that goes silent is noticed by an operation timeout: keep it short.
    let silent = matches!(&fault, Some(f) if f.kind.victim_lives_on());
    let timeout_ms = args.timeout_ms.or(silent.then_some(2000));
    let config = args.world.config(args.ranks, timeout_ms);
    config.validate()?;
    // Build first: a long build must not hold network namespaces or ports.
    let binary = ranks::rank_binary(args.world.transport)?;
    let world = World::prepare(&config)?;
    let mut rank_args = vec![
        "__rank".to_owned(),
        "--transport".to_owned(),
        args.world.transport.name().to_owned(),
        "--ranks".to_owned(),
        args.ranks.to_string(),
        "--iters".to_owned(),
        args.iters.to_string(),
        "--seed".to_owned(),
        args.seed.to_string(),
    ];
    if args.quick {
        rank_args.push("--quick".to_owned());
    }
    if let Some(f) = &fault {
        rank_args.extend(["--fault".to_owned(), f.to_arg()]);
    }
    if args.shrink {
        rank_args.push("--shrink".to_owned());
    }
    if args.rejoin {
        rank_args.push("--rejoin".to_owned());
    }
    // Over namespaces, the TCP and Thunderbolt transports learn the cabling from the ranks'
    // networks, and their rings must follow the cables.
    let links = &args.world.links;
    if links.netns && matches!(args.world.transport, TransportKind::Tcp | TransportKind::Tb) {
        rank_args.extend([
            "--routed-ring-hops".to_owned(),
            links.topology.routed_ring_hops().to_string(),
        ]);
    }
    // With a fault, every rank keeps a flight record, and the report on them must name the
    // faulty rank: what a user would run to find it.
    // A rank killed in the rendezvous leaves the ranks nothing to record.
    let flight_dir = match &fault {
        Some(_) if !in_bootstrap => {
            let dir = ranks::scratch_dir()?.join(format!("flight-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            Some(dir)
        }
        _ => None,
    };
    let specs: Vec<_> = (0..world.process_count())
        .map(|index| {
            let spec = world.child(index, &binary, rank_args.clone());
            match &flight_dir {
                Some(dir) => spec.env(
                    rlx_collective::flight::FLIGHT_DIR_VAR,
                    dir.display().to_string(),
                ),
                None => spec,
            }
        })
        .collect();
    println!(
        "test-cluster: {} ranks over {}{}{}{}",
        args.ranks,
        args.world.transport.name(),
        if args.world.links.netns {
            format!(
                ", one network namespace per rank, cabled {}",
                args.world.links.topology
            )
        } else {
            String::new()
        },
        args.world
            .links
            .rate
            .as_deref()
            .map(|r| format!(", links limited to {r}"))
            .unwrap_or_default(),
        fault
            .as_ref()
            .map(|f| format!(", {} rank {}", f.kind.name(), f.target))
            .unwrap_or_default(),
    );
    if args.shrink {
        println!("test-cluster: the survivors shrink to the ranks left and go on");
    }
    let result = supervise(
        args,
        Some(&world),
        &specs,
        fault.as_ref(),
        timeout_ms,
        flight_dir.as_deref(),
    );
    // The namespaces and the hostfile go only after every rank is reaped.
    drop(world);
    result
}

/// Starts the ranks of `specs` (of `world`, when they run in one the launcher prepared),
/// watches them to the end, reaps them and judges the run.
fn supervise(
    args: &ClusterArgs,
    world: Option<&World>,
    specs: &[ChildSpec],
    fault: Option<&Fault>,
    timeout_ms: Option<u64>,
    flight_dir: Option<&std::path::Path>,
) -> Result<(), String> {
    let started = Instant::now();
    let mut job = Job::spawn(specs)?;
    // With --rejoin the killed rank comes back as a replacement that joins the survivors.
    let replacement = fault
        .filter(|_| args.rejoin)
        .and_then(|f| specs.get(f.target.rank as usize))
        .map(|spec| spec.clone().args(["--join"]));
    // The flight report is read while the victim of a stall is still stopped: once resumed,
    // it records the operation it stopped before, as the survivors did.
    let mut check_flight = || match (flight_dir, fault) {
        (Some(dir), Some(fault)) if fault.kind.cuts_the_link() => {
            flight_report::check_names_survivors_operations(dir, fault.target.rank, args.ranks)
                .map_err(|e| format!("{e} ({})", fault.target))
        }
        (Some(dir), Some(fault)) => {
            flight_report::check_names_faulty_rank(dir, fault.target.rank, args.ranks)
                .map_err(|e| format!("{e} ({})", fault.target))
        }
        _ => Ok(()),
    };
    let mut cut_link = |rank: u32, kind: FaultKind| match world {
        Some(world) => world.cut_link(rank, kind == FaultKind::Drop),
        None => Err("there is no world whose links could be cut".to_owned()),
    };
    let mut monitor = Monitor::run(
        &mut job,
        args,
        fault,
        timeout_ms,
        replacement,
        &mut monitor::FaultHooks {
            before_resume: &mut check_flight,
            cut_link: &mut cut_link,
        },
    );
    // Ranks that reported exit once their stdin closes; after a hang or a fault there is
    // nothing to wait for.
    let grace = if monitor.hung || fault.is_some() {
        Duration::ZERO
    } else {
        Duration::from_secs(5)
    };
    job.finish(grace);
    drop(job);
    let flight = monitor.flight.take().unwrap_or_else(check_flight);
    monitor
        .report(args, fault, timeout_ms, started.elapsed())
        .and(flight)
}
