//! `cargo xtask bench`: an nccl-tests style sweep of RLX's collectives over real processes,
//! with `--peers` the same sweep on Open MPI, Gloo and MLX interleaved size by size, and
//! `iperf3` as the ceiling.
//!
//! Columns are nccl-tests': `size count type redop root time(us) algbw(GB/s) busbw(GB/s)
//! #wrong`, with its bus-bandwidth factors. Each iteration's time is the slowest rank's, the
//! reported time is the median over iterations, and `#wrong` counts the elements that differ
//! from the expected result after the last iteration. Any wrong element of RLX's makes the
//! command fail; nothing here asserts on time. `ab` compares two builds of this binary by
//! running their benches in turn (`cargo xtask bench-ab`).

pub(crate) mod ab;
mod args;
mod check;
mod kernels;
mod measure;
mod plot;
mod report;
mod side_by_side;
pub(crate) mod simulate;
mod systems;
pub(crate) mod worker;

use std::collections::HashSet;
use std::time::Duration;

use rlx_collective::{Compression, DType, ReduceKind};

use crate::ranks;
use crate::tcp_counters::Segments;
use crate::world::World;
pub(crate) use args::BenchArgs;
use measure::{BenchOp, Combo, Reply, Step};
use report::{
    Row, is_rlx, plot_series, print_ceiling, print_compression_summary, print_header, print_row,
    print_summary, row, write_json,
};
use systems::{IperfPath, MpiPath, Started, System};

/// Runs the benchmark described by `args`.
pub(crate) fn run(args: &BenchArgs) -> Result<(), String> {
    if let Some(dir) = &args.report {
        return side_by_side::run(args, dir, args.runs);
    }
    let compressions = if args.compression.trim().is_empty() {
        Vec::new()
    } else {
        measure::parse_list(&args.compression, &Compression::ALL, |s| {
            s.parse::<Compression>().map_err(|e| e.to_string())
        })?
    };
    if args.kernels {
        return kernels::run(measure::parse_size(&args.max_bytes)?, &compressions);
    }
    let ops = measure::parse_list(&args.op, &BenchOp::ALL, |s| s.parse())?;
    let dtypes = measure::parse_list(&args.dtype, &DType::ALL, |s| {
        s.parse::<DType>().map_err(|e| e.to_string())
    })?;
    let redops = measure::parse_list(&args.redop, &ReduceKind::ALL, |s| {
        s.parse::<ReduceKind>().map_err(|e| e.to_string())
    })?;
    let sizes = measure::sizes(
        measure::parse_size(&args.min_bytes)?,
        measure::parse_size(&args.max_bytes)?,
        args.factor,
    )?;
    let budget = measure::parse_size(&args.budget)?;
    if args.ranks < 2 && ops.contains(&BenchOp::SendRecv) {
        return Err("sendrecv needs at least two ranks".to_owned());
    }
    let mut combos = Vec::new();
    for &op in &ops {
        for &dtype in &dtypes {
            if op.reduces() {
                for &r in &redops {
                    combos.push(Combo {
                        op,
                        dtype,
                        redop: Some(r),
                    });
                }
            } else {
                combos.push(Combo {
                    op,
                    dtype,
                    redop: None,
                });
            }
        }
    }

    let config = args.world.config(args.ranks, None);
    config.validate()?;
    // Build first: a long build must not hold network namespaces or ports.
    let binary = ranks::rank_binary(args.world.transport)?;
    let world = World::prepare(&config)?;
    let rank_args = vec![
        "__bench-rank".to_owned(),
        "--transport".to_owned(),
        args.world.transport.name().to_owned(),
        "--ranks".to_owned(),
        args.ranks.to_string(),
        "--algorithm".to_owned(),
        args.algorithm.clone(),
    ];
    let specs: Vec<_> = (0..world.process_count())
        .map(|index| world.child(index, &binary, rank_args.clone()))
        .collect();
    let rlx = systems::start_rlx(&specs)?;

    let mut peers: Vec<System> = Vec::new();
    let mut notes: Vec<String> = Vec::new();
    let mut ceilings = Ceilings::default();
    if args.peers {
        // Open MPI's shared-memory layer is the fair comparison only where RLX's ranks may
        // use their single-copy path too: processes of one host, in one network namespace.
        let one_host = !world.config().netns && args.world.transport.name() == "tcp";
        for started in [
            systems::start_openmpi(args.ranks, MpiPath::Tcp),
            if one_host {
                systems::start_openmpi(args.ranks, MpiPath::SharedMemory)
            } else {
                Started::Skipped("openmpi-sm: skipped, the ranks are not on one host".to_owned())
            },
            systems::start_gloo(args.ranks),
            systems::start_mlx(args.ranks),
        ] {
            match started {
                Started::Running(system) => peers.push(*system),
                Started::Skipped(note) => notes.push(note),
            }
        }
    }
    let iperf_path = match (
        world.namespace_of(0),
        world.namespace_of(1),
        world.address_of(1),
    ) {
        (Some(client), Some(server), Some(address)) => IperfPath {
            namespaces: Some((client.to_owned(), server.to_owned())),
            server: address.to_string(),
        },
        _ => IperfPath::loopback(),
    };
    let measure_iperf = args.peers || world.config().netns;
    let mut ceiling_lines = Vec::new();
    if measure_iperf {
        ceiling_lines.push(measure_ceiling(
            &iperf_path,
            "before",
            &mut ceilings,
            &mut notes,
        ));
    }

    print_header(args, &world, &peers, &notes);
    for line in ceiling_lines.iter().flatten() {
        println!("{line}");
    }
    let mut sweep = Sweep {
        args,
        budget,
        rlx,
        peers,
        skipped: HashSet::new(),
        rows: Vec::new(),
        notes,
        compressions,
    };
    let namespaces: Vec<Option<&str>> = (0..args.ranks)
        .map(|rank| world.namespace_of(rank))
        .collect();
    let counters_before = read_counters(&namespaces);
    let result = sweep.run(&combos, &sizes);
    let resent_line = resent_during_sweep(&namespaces, &counters_before);
    let (rows, mut notes) = sweep.stop();
    if let Some(line) = resent_line {
        println!("#\n{line}");
    }
    if result.is_ok() && measure_iperf {
        // Over the same links, before the namespaces go with the world.
        if let Some(line) = measure_ceiling(&iperf_path, "after", &mut ceilings, &mut notes) {
            println!("#\n{line}");
        }
    }
    drop(world);
    result?;
    print_summary(&rows, &combos);
    print_compression_summary(&rows);
    let best = |figures: &[f64]| figures.iter().copied().reduce(f64::max);
    let ceiling = best(&ceilings.one_way);
    if let Some(ceiling) = ceiling {
        print_ceiling(&rows, ceiling, best(&ceilings.both_ways));
    }
    for note in &notes {
        println!("# note: {note}");
    }
    if let Some(path) = &args.json {
        write_json(path, args, &rows, &ceilings, &notes)?;
        println!("# wrote {}", path.display());
    }
    if let Some(path) = &args.plot {
        let series = plot_series(&rows, combos.len() > 1);
        let title = format!(
            "busbw, {} ranks ({} transport for rlx)",
            args.ranks,
            args.world.transport.name()
        );
        plot::draw(path, &title, &series, ceiling)?;
        println!("# wrote {}", path.display());
    }
    let wrong: u64 = rows.iter().filter(|r| is_rlx(r)).map(|r| r.wrong).sum();
    let peer_wrong: Vec<String> = rows
        .iter()
        .filter(|r| !is_rlx(r) && r.wrong > 0)
        .map(|r| {
            format!(
                "{} {} {} {} at {} B",
                r.system, r.op, r.dtype, r.redop, r.bytes
            )
        })
        .collect();
    if !peer_wrong.is_empty() {
        println!(
            "# warning: peers reported wrong elements: {}",
            peer_wrong.join("; ")
        );
    }
    let measured = rows.iter().filter(|r| is_rlx(r)).count();
    println!("# rlx: {measured} measurements, {wrong} wrong elements");
    if wrong > 0 {
        Err(format!("rlx produced {wrong} wrong elements"))
    } else {
        Ok(())
    }
}

/// The state of a sweep: the systems, what they could not run, and every row so far.
struct Sweep<'a> {
    args: &'a BenchArgs,
    budget: u64,
    rlx: System,
    peers: Vec<System>,
    /// (system, combo) pairs a peer refused; it is not asked again for other sizes.
    skipped: HashSet<(String, Combo)>,
    rows: Vec<Row>,
    notes: Vec<String>,
    /// The formats of `--compression`, run after each f32 sum or mean all-reduce.
    compressions: Vec<Compression>,
}

impl Sweep<'_> {
    /// Runs `step` (the plain all-reduce that took `plain_us`) again compressed in every
    /// format of `--compression`, printing a row for each.
    fn run_compressed(&mut self, combo: &Combo, step: &Step, plain_us: f64) -> Result<(), String> {
        let applies = combo.op == BenchOp::AllReduce
            && combo.dtype == DType::F32
            && matches!(combo.redop, Some(ReduceKind::Sum | ReduceKind::Mean));
        if !applies {
            return Ok(());
        }
        for &compression in &self.compressions.clone() {
            let step = Step {
                compression: Some(compression),
                ..*step
            };
            let system = format!("rlx+{compression}");
            match self.rlx.step(&step, step_timeout(&step)) {
                Ok(Reply::Ran {
                    wrong,
                    micros,
                    wire_bytes,
                }) => {
                    let mut r = row(self.args, combo, &step, &system, wrong, micros);
                    r.wire_bytes = wire_bytes;
                    r.speedup = (r.time_us > 0.0).then(|| plain_us / r.time_us);
                    print_row(&r, self.args.percentiles);
                    self.rows.push(r);
                }
                Ok(Reply::Skip(reason)) => println!("# {system} skipped: {reason}"),
                Ok(Reply::Error(message)) => {
                    return Err(format!(
                        "{system} failed {} at {} B: {message}",
                        combo.label(),
                        step.bytes()
                    ));
                }
                Err(e) => return Err(format!("{e}; last output: {}", self.rlx.log_tail())),
            }
        }
        Ok(())
    }

    /// Runs every combo and size on RLX, then on each peer, printing as it goes.
    fn run(&mut self, combos: &[Combo], sizes: &[u64]) -> Result<(), String> {
        for combo in combos {
            println!("#\n# {}", combo.label());
            for &size in sizes {
                let count = measure::count_for(combo.op, size, combo.dtype, self.args.ranks);
                let step_bytes = count * combo.dtype.size() as u64;
                let (iters, warmup) =
                    measure::iterations(self.args.iters, self.args.warmup, step_bytes, self.budget);
                let step = Step {
                    op: combo.op,
                    dtype: combo.dtype,
                    redop: combo.redop,
                    count,
                    iters,
                    warmup,
                    compression: None,
                };
                let timeout = step_timeout(&step);
                let ours = match self.rlx.step(&step, timeout) {
                    Ok(Reply::Ran { wrong, micros, .. }) => {
                        row(self.args, combo, &step, "rlx", wrong, micros)
                    }
                    Ok(Reply::Skip(reason)) => {
                        println!("# rlx skipped {}: {reason}", combo.label());
                        break;
                    }
                    Ok(Reply::Error(message)) => {
                        return Err(format!(
                            "rlx failed {} at {size} B: {message}",
                            combo.label()
                        ));
                    }
                    Err(e) => return Err(format!("{e}; last output: {}", self.rlx.log_tail())),
                };
                print_row(&ours, self.args.percentiles);
                let our_time = ours.time_us;
                self.rows.push(ours);
                self.run_compressed(combo, &step, our_time)?;
                let mut index = 0;
                while index < self.peers.len() {
                    let peer = &mut self.peers[index];
                    let key = (peer.name.clone(), *combo);
                    if self.skipped.contains(&key) {
                        index += 1;
                        continue;
                    }
                    match peer.step(&step, timeout) {
                        Ok(Reply::Ran { wrong, micros, .. }) => {
                            let mut r = row(self.args, combo, &step, &peer.name, wrong, micros);
                            r.rlx_over_peer = (our_time > 0.0).then(|| r.time_us / our_time);
                            print_row(&r, self.args.percentiles);
                            self.rows.push(r);
                        }
                        Ok(Reply::Skip(reason)) => {
                            println!("#   {} cannot run {}: {reason}", peer.name, combo.label());
                            self.skipped.insert(key);
                        }
                        Ok(Reply::Error(message)) => {
                            println!("#   {} failed {}: {message}", peer.name, combo.label());
                            self.skipped.insert(key);
                        }
                        Err(e) => {
                            self.notes.push(format!(
                                "{} dropped from the sweep: {e}; last output: {}",
                                peer.name,
                                peer.log_tail()
                            ));
                            println!("#   {} dropped: {e}", peer.name);
                            self.peers.remove(index).stop();
                            continue;
                        }
                    }
                    index += 1;
                }
            }
        }
        Ok(())
    }

    /// Asks every system to quit and reaps it.
    fn stop(self) -> (Vec<Row>, Vec<String>) {
        self.rlx.stop();
        for peer in self.peers {
            peer.stop();
        }
        (self.rows, self.notes)
    }
}

/// The TCP counters of every rank's network namespace, in rank order (none for a rank outside
/// a namespace of its own).
fn read_counters(namespaces: &[Option<&str>]) -> Vec<Option<Segments>> {
    namespaces
        .iter()
        .map(|ns| ns.and_then(Segments::in_namespace))
        .collect()
}

/// Under `--netns`, the line that says how many TCP segments each rank's namespace sent again
/// during the sweep: a link that drops or reorders packets makes some iterations wait for
/// retransmissions, which shows as a p99 far above the median (`--percentiles`) and as runs
/// slower than the iperf3 ceiling would allow.
fn resent_during_sweep(namespaces: &[Option<&str>], before: &[Option<Segments>]) -> Option<String> {
    resent_line(before, &read_counters(namespaces))
}

/// The line of [`resent_during_sweep`] from the counters before and after, in rank order.
fn resent_line(before: &[Option<Segments>], after: &[Option<Segments>]) -> Option<String> {
    let ranks: Vec<String> = before
        .iter()
        .zip(after)
        .enumerate()
        .filter_map(|(rank, (b, a))| {
            let during = b.zip(*a).map(|(b, a)| b.until(a))?;
            Some(format!(
                "rank {rank} {} of {} ({})",
                during.retransmitted,
                during.sent,
                during.percent()
            ))
        })
        .collect();
    if ranks.is_empty() {
        return None;
    }
    Some(format!(
        "# TCP segments sent again during the sweep, every system's traffic: {}",
        ranks.join(", ")
    ))
}

/// A generous bound on one step: start-up slack plus every iteration at 20 MB/s.
fn step_timeout(step: &Step) -> Duration {
    let iterations = u64::from(step.iters + step.warmup + 2);
    Duration::from_secs(60) + Duration::from_micros(step.bytes().saturating_mul(iterations) / 20)
}

/// Streams of the parallel iperf3 measurement: what one TCP stream cannot fill, several may
/// (a fast link, or loopback with more cores than one stream uses).
const IPERF_PARALLEL_STREAMS: u32 = 4;

/// What iperf3 carried over the ranks' path, in GB/s, every measurement of the run.
#[derive(Debug, Default)]
pub(crate) struct Ceilings {
    /// One direction at a time, as iperf3 measures by default: the figure a link is sold by.
    pub(crate) one_way: Vec<f64>,
    /// Each direction while the other carries as much (`--bidir`), per direction. Every
    /// operation whose ranks send and receive at once (an exchange, a ring, a pairwise swap)
    /// moves bytes this way; where the hosts' cores rather than the link bound TCP, this is
    /// its ceiling.
    pub(crate) both_ways: Vec<f64>,
}

/// Measures iperf3 over `path` with one stream and with [`IPERF_PARALLEL_STREAMS`], one way
/// and both ways at once, adding them to `ceilings`; returns the line that reports them
/// (`when` = before or after the sweep), or `None` with a note when iperf3 cannot run.
fn measure_ceiling(
    path: &IperfPath,
    when: &str,
    ceilings: &mut Ceilings,
    notes: &mut Vec<String>,
) -> Option<String> {
    let mut one_way = Vec::new();
    let mut both_ways = Vec::new();
    for both in [false, true] {
        for streams in [1, IPERF_PARALLEL_STREAMS] {
            match systems::iperf3(3, path, streams, both) {
                Ok(gbps) => {
                    let (figures, line) = if both {
                        (&mut ceilings.both_ways, &mut both_ways)
                    } else {
                        (&mut ceilings.one_way, &mut one_way)
                    };
                    figures.push(gbps);
                    line.push(format!("{streams} stream(s) {gbps:.2} GB/s"));
                }
                Err(note) => {
                    if !notes.contains(&note) {
                        notes.push(note);
                    }
                    return None;
                }
            }
        }
    }
    Some(format!(
        "# iperf3 {}, {when} the sweep: {}; both ways at once, each way: {}",
        path.describe(),
        one_way.join(", "),
        both_ways.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_resent_line_names_every_rank_whose_counters_were_read() {
        let at = |sent, retransmitted| {
            Some(Segments {
                sent,
                retransmitted,
            })
        };
        let line = resent_line(
            &[at(100, 1), None, at(0, 0)],
            &[at(20_100, 5), at(7, 7), at(10_000, 0)],
        )
        .unwrap();
        assert_eq!(
            line,
            "# TCP segments sent again during the sweep, every system's traffic: \
             rank 0 4 of 20000 (0.020%), rank 2 0 of 10000 (0.000%)"
        );
        assert_eq!(resent_line(&[], &[]), None, "no namespaces, no line");
        assert_eq!(resent_line(&[None], &[at(1, 0)]), None);
    }
}
