//! `cargo xtask bench`: an nccl-tests style sweep of RLX's collectives over real processes,
//! with `--peers` the same sweep on Open MPI, Gloo and MLX interleaved size by size, and
//! `iperf3` as the ceiling.
//!
//! Columns are nccl-tests': `size count type redop root time(us) algbw(GB/s) busbw(GB/s)
//! #wrong`, with its bus-bandwidth factors. Each iteration's time is the slowest rank's, the
//! reported time is the median over iterations, and `#wrong` counts the elements that differ
//! from the expected result after the last iteration. Any wrong element of RLX's makes the
//! command fail; nothing here asserts on time.

mod check;
mod kernels;
mod measure;
mod plot;
mod systems;
pub(crate) mod worker;

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use rlx_collective::{Compression, DType, ReduceKind};
use serde::Serialize;

use crate::world::{self, World, WorldArgs};
use measure::{BenchOp, Reply, Step};
use systems::{Started, System};

/// Flags of `cargo xtask bench` (nccl-tests' short flags where it has one).
#[derive(Debug, Clone, Args)]
pub(crate) struct BenchArgs {
    /// Operations: all_reduce, all_gather, reduce_scatter, broadcast, reduce, all_to_all,
    /// sendrecv, a comma-separated list, or all.
    #[arg(long, default_value = "all_reduce")]
    pub(crate) op: String,
    /// Smallest size in bytes (suffixes K, M, G).
    #[arg(short = 'b', long = "minbytes", default_value = "8")]
    pub(crate) min_bytes: String,
    /// Largest size in bytes (suffixes K, M, G).
    #[arg(short = 'e', long = "maxbytes", default_value = "256M")]
    pub(crate) max_bytes: String,
    /// Multiplication factor between sizes.
    #[arg(short = 'f', long = "stepfactor", default_value_t = 4)]
    pub(crate) factor: u64,
    /// Timed iterations per size (fewer for big sizes, see --budget).
    #[arg(short = 'n', long = "iters", default_value_t = 20)]
    pub(crate) iters: u32,
    /// Warm-up iterations per size.
    #[arg(short = 'w', long = "warmup_iters", default_value_t = 5)]
    pub(crate) warmup: u32,
    /// Element types: f16, bf16, f32, f64, i8, u8, i32, i64, a list, or all.
    #[arg(short = 'd', long = "datatype", default_value = "f32")]
    pub(crate) dtype: String,
    /// Reductions: sum, mean, max, min, prod, a list, or all.
    #[arg(short = 'o', long = "redop", default_value = "sum")]
    pub(crate) redop: String,
    /// Number of ranks.
    #[arg(long, default_value_t = 2)]
    pub(crate) ranks: u32,
    /// Transport, rendezvous and namespaces of RLX's ranks.
    #[command(flatten)]
    pub(crate) world: WorldArgs,
    /// Force algorithms, as OP=ALGORITHM[,...] (e.g. all_reduce=ring).
    #[arg(long, default_value = "")]
    pub(crate) algorithm: String,
    /// Bytes each size may move at most, which caps the iterations of big sizes.
    #[arg(long, default_value = "1G")]
    pub(crate) budget: String,
    /// Write every number (each iteration's time included) to this JSON file.
    #[arg(long)]
    pub(crate) json: Option<PathBuf>,
    /// Draw busbw against size as an SVG.
    #[arg(long)]
    pub(crate) plot: Option<PathBuf>,
    /// Also run Open MPI, Gloo and MLX (whichever are installed) and iperf3, interleaved.
    #[arg(long)]
    pub(crate) peers: bool,
    /// Also run `all_reduce_compressed` in these formats (none, bf16, fp16, int8, a list, or
    /// all) right after each f32 sum or mean all-reduce of the same size, reporting its time,
    /// busbw of the uncompressed bytes, wire bytes per rank and speedup over the plain one.
    #[arg(long, default_value = "")]
    pub(crate) compression: String,
    /// Measure the compression kernels (GB/s of f32 compressed and decompressed on one core,
    /// beside a memcpy) on a buffer of -e bytes instead of running ranks.
    #[arg(long)]
    pub(crate) kernels: bool,
}

impl BenchArgs {
    /// The smoke sweep of `cargo xtask ci`: every operation, dtype and reduction on a few
    /// small sizes over three TCP ranks; only the `#wrong` column decides.
    pub(crate) fn smoke() -> BenchArgs {
        BenchArgs {
            op: "all".to_owned(),
            min_bytes: "8".to_owned(),
            max_bytes: "64K".to_owned(),
            factor: 64,
            iters: 2,
            warmup: 1,
            dtype: "all".to_owned(),
            redop: "all".to_owned(),
            ranks: 3,
            world: WorldArgs::tcp(),
            algorithm: String::new(),
            budget: "1G".to_owned(),
            json: None,
            plot: None,
            peers: false,
            compression: "all".to_owned(),
            kernels: false,
        }
    }
}

/// One measured line of the table.
#[derive(Debug, Clone, Serialize)]
struct Row {
    system: String,
    op: &'static str,
    dtype: &'static str,
    redop: &'static str,
    root: i64,
    bytes: u64,
    count: u64,
    iters: u32,
    warmup: u32,
    time_us: f64,
    algbw_gbps: f64,
    busbw_gbps: f64,
    wrong: u64,
    /// RLX's busbw over this system's (= this system's time over RLX's), for peers.
    rlx_over_peer: Option<f64>,
    /// Bytes rank 0 sent, for a compressed all-reduce.
    wire_bytes: Option<u64>,
    /// The plain all-reduce's time over this row's, for a compressed all-reduce.
    speedup: Option<f64>,
    iteration_us: Vec<f64>,
}

/// A (operation, dtype, reduction) combination of the sweep.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Combo {
    op: BenchOp,
    dtype: DType,
    redop: Option<ReduceKind>,
}

impl Combo {
    fn label(&self) -> String {
        match self.redop {
            Some(r) => format!("{} {} {}", self.op, self.dtype, r),
            None => format!("{} {}", self.op, self.dtype),
        }
    }
}

/// Runs the benchmark described by `args`.
pub(crate) fn run(args: &BenchArgs) -> Result<(), String> {
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
    let binary = world::rank_binary(args.world.transport)?;
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
    let mut ceilings: Vec<f64> = Vec::new();
    if args.peers {
        for started in [
            systems::start_openmpi(args.ranks),
            systems::start_gloo(args.ranks),
            systems::start_mlx(args.ranks),
        ] {
            match started {
                Started::Running(system) => peers.push(*system),
                Started::Skipped(note) => notes.push(note),
            }
        }
        measure_ceiling(&mut ceilings, &mut notes);
    }

    print_header(args, &world, &peers, &notes);
    if let Some(gbps) = ceilings.first() {
        println!("# iperf3, one TCP stream over loopback, before the sweep: {gbps:.2} GB/s");
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
    let result = sweep.run(&combos, &sizes);
    let (rows, mut notes) = sweep.stop();
    drop(world);
    result?;

    if args.peers {
        measure_ceiling(&mut ceilings, &mut notes);
        if let Some(gbps) = ceilings.get(1) {
            println!("#\n# iperf3, one TCP stream over loopback, after the sweep: {gbps:.2} GB/s");
        }
    }
    print_summary(&rows, &combos);
    print_compression_summary(&rows);
    let ceiling = ceilings.iter().copied().reduce(f64::max);
    if let Some(ceiling) = ceiling {
        print_ceiling(&rows, ceiling);
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

/// Whether `row` measured RLX (plain or compressed), whose wrong elements fail the command.
fn is_rlx(row: &Row) -> bool {
    row.system == "rlx" || row.system.starts_with("rlx+")
}

/// For every size with compressed rows: the plain all-reduce's time and each format's time,
/// wire bytes per rank and speedup, the table `BENCHMARKS.md` quotes.
fn print_compression_summary(rows: &[Row]) {
    let compressed: Vec<&Row> = rows.iter().filter(|r| r.speedup.is_some()).collect();
    if compressed.is_empty() {
        return;
    }
    println!("#\n# compressed all-reduce: time(ms), wire bytes per rank, speedup over plain");
    for plain in rows.iter().filter(|r| r.system == "rlx") {
        let same =
            |r: &&&Row| r.bytes == plain.bytes && r.redop == plain.redop && r.dtype == plain.dtype;
        let mut line = format!(
            "#   {:>9} {:<4} plain {:>9.2} ms",
            plot::human_bytes(plain.bytes),
            plain.redop,
            plain.time_us / 1e3
        );
        let mut any = false;
        for r in compressed.iter().filter(same) {
            any = true;
            line.push_str(&format!(
                " | {} {:>9.2} ms {:>6.1} MiB {:>5.2}x",
                r.system.trim_start_matches("rlx+"),
                r.time_us / 1e3,
                r.wire_bytes.unwrap_or(0) as f64 / f64::from(1 << 20),
                r.speedup.unwrap_or(0.0)
            ));
        }
        if any {
            println!("{line}");
        }
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
                    print_row(&r);
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
                print_row(&ours);
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
                            print_row(&r);
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

/// A generous bound on one step: start-up slack plus every iteration at 20 MB/s.
fn step_timeout(step: &Step) -> Duration {
    let iterations = u64::from(step.iters + step.warmup + 2);
    Duration::from_secs(60) + Duration::from_micros(step.bytes().saturating_mul(iterations) / 20)
}

fn row(
    args: &BenchArgs,
    combo: &Combo,
    step: &Step,
    system: &str,
    wrong: u64,
    micros: Vec<f64>,
) -> Row {
    let time_us = measure::median(&micros);
    let (algbw, busbw) = measure::bandwidths(combo.op, step.bytes(), time_us, args.ranks);
    Row {
        system: system.to_owned(),
        op: combo.op.name(),
        dtype: combo.dtype.name(),
        redop: combo.redop.map_or("none", ReduceKind::name),
        root: combo.op.root().map_or(-1, i64::from),
        bytes: step.bytes(),
        count: step.count,
        iters: step.iters,
        warmup: step.warmup,
        time_us,
        algbw_gbps: algbw,
        busbw_gbps: busbw,
        wrong,
        rlx_over_peer: None,
        wire_bytes: None,
        speedup: None,
        iteration_us: micros,
    }
}

fn print_header(args: &BenchArgs, world: &World, peers: &[System], notes: &[String]) {
    let config = world.config();
    println!(
        "# rlx bench: {} ranks over {}{}, iterations {} (fewer when a size would move more than {}), warm-up {}",
        config.size,
        config.transport.name(),
        if config.netns {
            " in network namespaces"
        } else {
            ""
        },
        args.iters,
        args.budget,
        args.warmup
    );
    println!(
        "# time = median over iterations of the slowest rank's time; #wrong = elements that differ from the expected result"
    );
    if args.peers {
        let names: Vec<&str> = peers.iter().map(|p| p.name.as_str()).collect();
        println!(
            "# peers: {} (rlx/peer = peer time / rlx time = rlx busbw / peer busbw)",
            if names.is_empty() {
                "none".to_owned()
            } else {
                names.join(", ")
            }
        );
        for note in notes {
            println!("# {note}");
        }
    }
    if !args.compression.trim().is_empty() {
        println!(
            "# rlx+<format>: all_reduce_compressed right after the plain all_reduce of the same \
             size; busbw counts the uncompressed f32 bytes; wire = bytes rank 0 sent; speedup = \
             plain time / compressed time"
        );
    }
    println!(
        "#{:>11} {:>12} {:>6} {:>6} {:>5} {:>11} {:>8} {:>8} {:>7}  {:<8} {:>8}",
        "size",
        "count",
        "type",
        "redop",
        "root",
        "time",
        "algbw",
        "busbw",
        "#wrong",
        "system",
        "rlx/peer"
    );
    println!(
        "#{:>11} {:>12} {:>6} {:>6} {:>5} {:>11} {:>8} {:>8} {:>7}",
        "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", ""
    );
}

fn print_row(r: &Row) {
    let ratio = r
        .rlx_over_peer
        .map(|x| format!("{x:.2}x"))
        .unwrap_or_default();
    let compressed = match (r.wire_bytes, r.speedup) {
        (Some(wire), Some(speedup)) => format!("  wire {wire} B  speedup {speedup:.2}x"),
        (Some(wire), None) => format!("  wire {wire} B"),
        _ => String::new(),
    };
    println!(
        " {:>11} {:>12} {:>6} {:>6} {:>5} {:>11.2} {:>8.3} {:>8.3} {:>7}  {:<8} {:>8}{compressed}",
        r.bytes,
        r.count,
        r.dtype,
        r.redop,
        r.root,
        r.time_us,
        r.algbw_gbps,
        r.busbw_gbps,
        r.wrong,
        r.system,
        ratio
    );
}

fn measure_ceiling(ceilings: &mut Vec<f64>, notes: &mut Vec<String>) {
    match systems::iperf3(3) {
        Ok(gbps) => ceilings.push(gbps),
        Err(note) => {
            if !notes.contains(&note) {
                notes.push(note);
            }
        }
    }
}

/// One line per system and combo: the time at the smallest size and busbw from 512 KiB up, the
/// numbers the yardsticks of the spec are quoted in.
fn print_summary(rows: &[Row], combos: &[Combo]) {
    let Some(smallest) = rows.iter().map(|r| r.bytes).min() else {
        return;
    };
    let mut large: Vec<u64> = rows
        .iter()
        .map(|r| r.bytes)
        .filter(|&b| b >= 512 << 10)
        .collect();
    large.sort_unstable();
    large.dedup();
    let mut systems: Vec<&str> = Vec::new();
    for r in rows {
        if !systems.contains(&r.system.as_str()) {
            systems.push(&r.system);
        }
    }
    print!("#\n# summary: time(us) at {smallest} B, then busbw(GB/s) at");
    for bytes in &large {
        print!(" {}", plot::human_bytes(*bytes));
    }
    println!();
    for combo in combos {
        let name = |r: &Row| {
            r.op == combo.op.name()
                && r.dtype == combo.dtype.name()
                && r.redop == combo.redop.map_or("none", ReduceKind::name)
        };
        for system in &systems {
            let of = |bytes: u64| {
                rows.iter()
                    .find(|r| name(r) && r.system == *system && r.bytes == bytes)
            };
            let Some(first) = of(smallest) else { continue };
            let mut line = format!(
                "#   {:<24} {:<8} {:>10.2}",
                combo.label(),
                system,
                first.time_us
            );
            for &bytes in &large {
                match of(bytes) {
                    Some(r) => line.push_str(&format!(" {:>6.3}", r.busbw_gbps)),
                    None => line.push_str(&format!(" {:>6}", "-")),
                }
            }
            println!("{line}");
        }
    }
}

/// For every RLX row, its busbw as a fraction of the iperf3 ceiling.
fn print_ceiling(rows: &[Row], ceiling: f64) {
    println!("#\n# rlx busbw / iperf3 ceiling ({ceiling:.2} GB/s), sizes of 512 KiB and up:");
    for r in rows
        .iter()
        .filter(|r| r.system == "rlx" && r.bytes >= 512 << 10)
    {
        println!(
            "#   {:<28} {:>11} B  {:>6.3} GB/s  {:>5.2}x",
            format!("{} {} {}", r.op, r.dtype, r.redop),
            r.bytes,
            r.busbw_gbps,
            r.busbw_gbps / ceiling
        );
    }
}

fn plot_series(rows: &[Row], per_combo: bool) -> Vec<plot::Series> {
    let mut series: Vec<plot::Series> = Vec::new();
    for r in rows {
        let label = if per_combo {
            format!("{} {} {} {}", r.system, r.op, r.dtype, r.redop)
        } else {
            r.system.clone()
        };
        match series.iter_mut().find(|s| s.label == label) {
            Some(s) => s.points.push((r.bytes, r.busbw_gbps)),
            None => series.push(plot::Series {
                label,
                points: vec![(r.bytes, r.busbw_gbps)],
            }),
        }
    }
    series
}

fn write_json(
    path: &PathBuf,
    args: &BenchArgs,
    rows: &[Row],
    ceilings: &[f64],
    notes: &[String],
) -> Result<(), String> {
    let doc = serde_json::json!({
        "ranks": args.ranks,
        "transport": args.world.transport.name(),
        "netns": args.world.netns,
        "iters": args.iters,
        "warmup": args.warmup,
        "budget_bytes": measure::parse_size(&args.budget)?,
        "iperf3_gbps": ceilings,
        "notes": notes,
        "rows": rows,
    });
    let text = serde_json::to_string_pretty(&doc)
        .map_err(|e| format!("could not encode the results: {e}"))?;
    std::fs::write(path, text).map_err(|e| format!("could not write {}: {e}", path.display()))
}
