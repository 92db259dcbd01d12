//! `cargo xtask bench-ab`: an A/B benchmark of two builds of this binary, so that a change
//! meant to leave speed alone (a restructuring of the engine) can show that it did.
//!
//! The ranks of a bench are the binary that launched them re-executed, so a copied release
//! `xtask` is a self-contained build. Each round runs, for every world (ranks, loopback or
//! network namespaces) and size, the old build's `bench --json` and then the new one's, the
//! order swapped every round so that a machine slowly warming or cooling favours neither. Times
//! drift between runs far more than between two neighbouring runs, so the builds always meet
//! at the same size back to back. The table compares the medians over the rounds of each
//! row's time and flags the rows where the new build is more than [`SLOWER`] slower.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use clap::Args;
use serde::Deserialize;

use super::measure::{self, BenchOp};
use super::plot::human_bytes;
use crate::cmd::workspace_root;
use crate::netns;

/// The ratio of the medians (new time over old) above which a row is flagged as slower: runs
/// of one build on a quiet machine differ by a few percent, so less than this is noise.
const SLOWER: f64 = 1.05;

/// Lines of a failed run's log quoted in the error.
const LOG_TAIL_LINES: usize = 15;

/// Flags of `cargo xtask bench-ab` (the sweep flags as `bench` spells them).
#[derive(Debug, Clone, Args)]
pub(crate) struct AbArgs {
    /// The old build: a release xtask binary, e.g. a copy of target/release/xtask made before
    /// the change (a debug build would run target/release/xtask as its ranks).
    #[arg(long)]
    pub(crate) old: PathBuf,
    /// The new build: a release xtask binary, e.g. target/release/xtask.
    #[arg(long)]
    pub(crate) new: PathBuf,
    /// Rounds; each runs both builds once per world and size.
    #[arg(long, default_value_t = 3)]
    pub(crate) rounds: u32,
    /// Numbers of ranks, a comma-separated list.
    #[arg(long, default_value = "2,4")]
    pub(crate) ranks: String,
    /// Networks: loopback (ranks on this host), netns (each rank in its own network
    /// namespace, needs root), a comma-separated list.
    #[arg(long, default_value = "loopback,netns")]
    pub(crate) net: String,
    /// The tbf rate of the namespace links with netns (e.g. 20gbit), or none.
    #[arg(long, default_value = "20gbit")]
    pub(crate) rate: String,
    /// Operations, as for bench: a comma-separated list or all.
    #[arg(long, default_value = "all_reduce,sendrecv,all_gather")]
    pub(crate) op: String,
    /// Sizes in bytes (suffixes K, M, G), a comma-separated list; each is measured exactly.
    #[arg(long, default_value = "8,256K,32M,256M")]
    pub(crate) sizes: String,
    /// Directory for every run's JSON file and log, the copied builds and `ab.md` (default
    /// `target/bench-ab/<UTC timestamp>/`).
    #[arg(long)]
    pub(crate) out: Option<PathBuf>,
    /// Timed iterations per size, passed to bench (its default when not given).
    #[arg(short = 'n', long = "iters")]
    pub(crate) iters: Option<u32>,
    /// Warm-up iterations per size, passed to bench (its default when not given).
    #[arg(short = 'w', long = "warmup_iters")]
    pub(crate) warmup: Option<u32>,
}

/// The network a world's ranks talk over.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Net {
    /// Every rank on this host, over loopback (and the same-host fast paths).
    Loopback,
    /// Every rank in its own network namespace, over veth links (`bench --netns`).
    Netns,
}

impl Net {
    /// The name used in flags, file names and the table.
    const fn name(self) -> &'static str {
        match self {
            Net::Loopback => "loopback",
            Net::Netns => "netns",
        }
    }

    fn parse(s: &str) -> Result<Net, String> {
        match s.trim() {
            "loopback" => Ok(Net::Loopback),
            "netns" => Ok(Net::Netns),
            other => Err(format!(
                "unknown network {other:?} (expected loopback or netns)"
            )),
        }
    }
}

/// One world the builds are compared in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct World {
    ranks: u32,
    net: Net,
}

impl fmt::Display for World {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ranks over {}", self.ranks, self.net.name())
    }
}

/// Which of the two builds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Build {
    Old,
    New,
}

impl Build {
    const fn name(self) -> &'static str {
        match self {
            Build::Old => "old",
            Build::New => "new",
        }
    }
}

/// The order of the builds in `round` (counted from 1): old first in odd rounds, new first in
/// even ones, so that a drift over the run adds to each build's times alike.
fn order(round: u32) -> [Build; 2] {
    if round % 2 == 1 {
        [Build::Old, Build::New]
    } else {
        [Build::New, Build::Old]
    }
}

/// What the flags ask for, parsed and checked before anything runs.
#[derive(Debug)]
struct Plan {
    rounds: u32,
    worlds: Vec<World>,
    ops: Vec<BenchOp>,
    sizes: Vec<u64>,
    rate: Option<String>,
    iters: Option<u32>,
    warmup: Option<u32>,
}

impl Plan {
    fn from_args(args: &AbArgs) -> Result<Plan, String> {
        if args.rounds == 0 {
            return Err("--rounds must be at least 1".to_owned());
        }
        let ops = measure::parse_list(&args.op, &BenchOp::ALL, |s| s.parse())?;
        let sizes = args
            .sizes
            .split(',')
            .map(|s| match measure::parse_size(s)? {
                0 => Err("a size of 0 bytes measures nothing".to_owned()),
                bytes => Ok(bytes),
            })
            .collect::<Result<Vec<u64>, String>>()?;
        let ranks = args
            .ranks
            .split(',')
            .map(|s| {
                s.trim()
                    .parse::<u32>()
                    .map_err(|_| format!("{s:?} is not a number of ranks"))
            })
            .collect::<Result<Vec<u32>, String>>()?;
        let least = if ops.contains(&BenchOp::SendRecv) {
            2
        } else {
            1
        };
        if let Some(few) = ranks.iter().find(|&&k| k < least) {
            return Err(format!("{few} ranks are too few for {}", args.op));
        }
        let nets = args
            .net
            .split(',')
            .map(Net::parse)
            .collect::<Result<Vec<Net>, String>>()?;
        let rate = match args.rate.trim() {
            "" | "none" => None,
            rate => Some(rate.to_owned()),
        };
        let worlds = ranks
            .iter()
            .flat_map(|&ranks| nets.iter().map(move |&net| World { ranks, net }))
            .collect();
        Ok(Plan {
            rounds: args.rounds,
            worlds,
            ops,
            sizes,
            rate,
            iters: args.iters,
            warmup: args.warmup,
        })
    }

    /// Refuses what cannot run here, the way `bench` would, before the first run.
    fn check_machine(&self) -> Result<(), String> {
        if self.worlds.iter().any(|w| w.net == Net::Netns) {
            netns::check_available()?;
            if let Some(rate) = &self.rate {
                netns::burst_bytes(rate)?;
            }
        }
        Ok(())
    }

    /// The `bench` command of `binary` for one world and size, writing `json`.
    fn command(&self, binary: &Path, world: World, size: u64, json: &Path) -> Command {
        let ops: Vec<&str> = self.ops.iter().map(|op| op.name()).collect();
        let size = size.to_string();
        let mut command = Command::new(binary);
        command
            .args(["bench", "--ranks", &world.ranks.to_string()])
            .args(["--op", &ops.join(","), "-b", &size, "-e", &size, "--json"])
            .arg(json);
        if world.net == Net::Netns {
            command.arg("--netns");
            if let Some(rate) = &self.rate {
                command.args(["--rate", rate]);
            }
        }
        if let Some(iters) = self.iters {
            command.args(["-n", &iters.to_string()]);
        }
        if let Some(warmup) = self.warmup {
            command.args(["-w", &warmup.to_string()]);
        }
        command
    }
}

/// The part of a bench JSON file (`report::write_json`) the comparison reads.
#[derive(Debug, Deserialize)]
struct BenchFile {
    ranks: u32,
    netns: bool,
    rows: Vec<BenchRow>,
}

/// The part of one measured row the comparison reads.
#[derive(Debug, Deserialize)]
struct BenchRow {
    system: String,
    op: String,
    time_us: f64,
}

/// One (operation, world, size) row of the comparison: its times, one per round, of each build.
#[derive(Debug, Default, Clone, PartialEq)]
struct Times {
    old: Vec<f64>,
    new: Vec<f64>,
}

/// A row's key: the operation's place in the plan (so the table keeps the order of `--op`),
/// the world and the size asked for (the bench rounds some sizes to whole elements per rank).
type Key = (usize, World, u64);

/// Every time measured so far.
type Samples = BTreeMap<Key, Times>;

/// Adds RLX's time of every planned operation in `file`, one run of `build` in `world` at
/// `size`, to `samples`; a file of another world, or without a planned operation, is an error.
fn record(
    samples: &mut Samples,
    ops: &[BenchOp],
    world: World,
    size: u64,
    build: Build,
    file: &BenchFile,
) -> Result<(), String> {
    if file.ranks != world.ranks || file.netns != (world.net == Net::Netns) {
        return Err(format!(
            "holds {} ranks{}, not {world}",
            file.ranks,
            if file.netns { " in namespaces" } else { "" }
        ));
    }
    for (index, op) in ops.iter().enumerate() {
        let row = file
            .rows
            .iter()
            .find(|r| r.system == "rlx" && r.op == op.name())
            .ok_or_else(|| format!("has no rlx row for {op}"))?;
        let times = samples.entry((index, world, size)).or_default();
        match build {
            Build::Old => times.old.push(row.time_us),
            Build::New => times.new.push(row.time_us),
        }
    }
    Ok(())
}

/// One line of the comparison table.
#[derive(Debug, PartialEq)]
struct Compared {
    op: BenchOp,
    world: World,
    size: u64,
    old: f64,
    new: f64,
    /// New median over old median; `None` when the old median is zero.
    ratio: Option<f64>,
    times: Times,
}

impl Compared {
    /// Whether the new build is more than [`SLOWER`] slower in this row.
    fn slower(&self) -> bool {
        self.ratio.is_some_and(|r| r > SLOWER)
    }
}

/// The comparison of every row: medians over the rounds and their ratio.
fn compare(samples: &Samples, ops: &[BenchOp]) -> Vec<Compared> {
    samples
        .iter()
        .filter_map(|(&(index, world, size), times)| {
            let op = *ops.get(index)?;
            let old = measure::median(&times.old);
            let new = measure::median(&times.new);
            Some(Compared {
                op,
                world,
                size,
                old,
                new,
                ratio: (old > 0.0).then(|| new / old),
                times: times.clone(),
            })
        })
        .collect()
}

/// The table's header.
const HEADER: [&str; 10] = [
    "op",
    "ranks",
    "net",
    "size",
    "old (us)",
    "new (us)",
    "new/old",
    "old per round (us)",
    "new per round (us)",
    "flag",
];

/// A time in µs to at least three significant digits (0.97, 38.5, 1234), so that the rounding
/// of small times does not hide a difference the ratio shows.
fn micros(t: f64) -> String {
    if t < 100.0 {
        format!("{t:.2}")
    } else if t < 1000.0 {
        format!("{t:.1}")
    } else {
        format!("{t:.0}")
    }
}

/// The cells of one row, in the order of [`HEADER`].
fn cells(row: &Compared) -> [String; 10] {
    let per_round = |times: &[f64]| {
        let each: Vec<String> = times.iter().map(|&t| micros(t)).collect();
        each.join(" ")
    };
    [
        row.op.name().to_owned(),
        row.world.ranks.to_string(),
        row.world.net.name().to_owned(),
        human_bytes(row.size),
        micros(row.old),
        micros(row.new),
        row.ratio
            .map_or_else(|| "-".to_owned(), |r| format!("{r:.3}")),
        per_round(&row.times.old),
        per_round(&row.times.new),
        if row.slower() { "SLOWER" } else { "" }.to_owned(),
    ]
}

/// The table as aligned text for the terminal, one `#` line per row.
fn text_table(rows: &[Compared]) -> String {
    let lines: Vec<[String; 10]> = std::iter::once(HEADER.map(str::to_owned))
        .chain(rows.iter().map(cells))
        .collect();
    let mut widths = [0; 10];
    for line in &lines {
        for (width, cell) in widths.iter_mut().zip(line) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for line in &lines {
        let mut text = String::from("#");
        for (column, (cell, width)) in line.iter().zip(widths).enumerate() {
            // Names read best from the left, numbers from the right.
            if matches!(column, 0 | 2 | 9) {
                let _ = write!(text, " {cell:<width$}");
            } else {
                let _ = write!(text, " {cell:>width$}");
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    }
    out
}

/// The table as markdown, to paste into BENCHMARKS.md.
fn markdown_table(rows: &[Compared]) -> String {
    let mut out = format!("| {} |\n", HEADER.join(" | "));
    out.push_str(&format!("|{}\n", "---|".repeat(HEADER.len())));
    for row in rows {
        out.push_str(&format!("| {} |\n", cells(row).join(" | ")));
    }
    out
}

/// The closing line: how many rows the new build lost, or that it lost none.
fn verdict(rows: &[Compared]) -> String {
    let slower: Vec<String> = rows
        .iter()
        .filter(|r| r.slower())
        .map(|r| format!("{} {} {}", r.op, r.world, human_bytes(r.size)))
        .collect();
    let percent = (SLOWER - 1.0) * 100.0;
    if slower.is_empty() {
        format!(
            "no row is more than {percent:.0}% slower in the new build ({} rows)",
            rows.len()
        )
    } else {
        format!(
            "{} of {} rows are more than {percent:.0}% slower in the new build: {}",
            slower.len(),
            rows.len(),
            slower.join("; ")
        )
    }
}

/// `YYYYMMDD-HHMMSS` in UTC for `secs` seconds after the Unix epoch, the default directory's
/// name (days to a civil date by Howard Hinnant's algorithm, as no date crate is a dependency).
fn timestamp(secs: u64) -> String {
    let (days, time) = (secs / 86_400, secs % 86_400);
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    format!(
        "{year:04}{month:02}{day:02}-{:02}{:02}{:02}",
        time / 3600,
        time / 60 % 60,
        time % 60
    )
}

/// Refuses a `--old` or `--new` (`name`) that is not a file, before anything is created.
fn check_binary(binary: &Path, name: &str) -> Result<(), String> {
    if binary.is_file() {
        return Ok(());
    }
    Err(format!(
        "--{name} {}: no such file (build it with cargo build --release -p xtask)",
        binary.display()
    ))
}

/// Copies `binary` into `out` as `name`: a rebuild while the rounds run must not change what
/// they measure, and the directory then holds exactly the builds its numbers belong to.
fn snapshot(binary: &Path, out: &Path, name: &str) -> Result<PathBuf, String> {
    let copy = out.join(format!("xtask-{name}"));
    fs::copy(binary, &copy).map_err(|e| {
        format!(
            "could not copy {} to {}: {e}",
            binary.display(),
            copy.display()
        )
    })?;
    Ok(copy)
}

/// Runs `command` with its output in `log`; a failure carries the log's last lines.
fn run_logged(command: &mut Command, log: &Path) -> Result<(), String> {
    let file = File::create(log).map_err(|e| format!("could not create {}: {e}", log.display()))?;
    let err = file
        .try_clone()
        .map_err(|e| format!("could not open {}: {e}", log.display()))?;
    // The child stays in our process group, so Ctrl-C reaches the bench too, which then
    // removes its ranks and network namespaces itself.
    let status = command
        .stdout(file)
        .stderr(err)
        .status()
        .map_err(|e| format!("could not start it: {e}"))?;
    if status.success() {
        return Ok(());
    }
    let text = fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let tail = lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n");
    Err(format!("{status}; the end of {}:\n{tail}", log.display()))
}

/// Reads one run's JSON file.
fn read(path: &Path) -> Result<BenchFile, String> {
    let text =
        fs::read_to_string(path).map_err(|e| format!("could not read {}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{} is not a bench file: {e}", path.display()))
}

/// One run: a build in a world at a size, in a round.
#[derive(Clone, Copy, Debug)]
struct Run {
    round: u32,
    world: World,
    size: u64,
    build: Build,
}

impl Run {
    /// The name of its files in the output directory, before the extension.
    fn stem(self) -> String {
        format!(
            "round{}-{}ranks-{}-{}-{}",
            self.round,
            self.world.ranks,
            self.world.net.name(),
            human_bytes(self.size),
            self.build.name()
        )
    }
}

/// The state of the rounds: the plan, the copied builds and every time so far.
struct Rounds<'a> {
    plan: &'a Plan,
    out: &'a Path,
    /// The old and the new build as given, in that order, to name them in errors.
    given: [&'a Path; 2],
    /// Their copies in the output directory, which the rounds run.
    binaries: [PathBuf; 2],
    samples: Samples,
}

impl Rounds<'_> {
    /// Runs one build once and records its times; an error names the build, round and world.
    fn run(&mut self, run: Run) -> Result<f64, String> {
        let which = usize::from(run.build == Build::New);
        let (given, binary) = (self.given[which], &self.binaries[which]);
        let json = self.out.join(format!("{}.json", run.stem()));
        let log = self.out.join(format!("{}.log", run.stem()));
        // A file left by an earlier run into the same directory must not pass for this one's.
        let _ = fs::remove_file(&json);
        let mut command = self.plan.command(binary, run.world, run.size, &json);
        let started = Instant::now();
        let failed = |e: String| {
            format!(
                "the {} build ({}, run as {}) failed in round {}, {} at {}: {e}",
                run.build.name(),
                given.display(),
                binary.display(),
                run.round,
                run.world,
                human_bytes(run.size)
            )
        };
        run_logged(&mut command, &log).map_err(failed)?;
        let seconds = started.elapsed().as_secs_f64();
        let file = read(&json).map_err(failed)?;
        record(
            &mut self.samples,
            &self.plan.ops,
            run.world,
            run.size,
            run.build,
            &file,
        )
        .map_err(|e| failed(format!("{} {e}", json.display())))?;
        Ok(seconds)
    }

    /// Every round, world and size, each build once, printing a line per pair.
    fn run_all(&mut self) -> Result<(), String> {
        let plan = self.plan;
        for round in 1..=plan.rounds {
            for &world in &plan.worlds {
                for &size in &plan.sizes {
                    let mut line = format!(
                        "# round {round}/{}, {world}, {}:",
                        plan.rounds,
                        human_bytes(size)
                    );
                    for build in order(round) {
                        let seconds = self.run(Run {
                            round,
                            world,
                            size,
                            build,
                        })?;
                        let _ = write!(line, " {} {seconds:.1} s", build.name());
                        line.push(if build == order(round)[0] { ',' } else { '.' });
                    }
                    println!("{line}");
                }
            }
        }
        Ok(())
    }
}

/// Runs the A/B benchmark described by `args`.
pub(crate) fn run(args: &AbArgs) -> Result<(), String> {
    let plan = Plan::from_args(args)?;
    plan.check_machine()?;
    check_binary(&args.old, "old")?;
    check_binary(&args.new, "new")?;
    let out = match &args.out {
        Some(dir) => dir.clone(),
        None => {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            workspace_root()
                .join("target")
                .join("bench-ab")
                .join(timestamp(now))
        }
    };
    fs::create_dir_all(&out).map_err(|e| format!("could not create {}: {e}", out.display()))?;
    let binaries = [
        snapshot(&args.old, &out, "old")?,
        snapshot(&args.new, &out, "new")?,
    ];
    let runs = plan.rounds as usize * plan.worlds.len() * plan.sizes.len() * 2;
    println!(
        "# bench-ab: old {}, new {}; {runs} bench runs into {}",
        args.old.display(),
        args.new.display(),
        out.display()
    );
    let mut rounds = Rounds {
        plan: &plan,
        out: &out,
        given: [&args.old, &args.new],
        binaries,
        samples: Samples::new(),
    };
    rounds.run_all()?;
    let rows = compare(&rounds.samples, &plan.ops);
    let verdict = verdict(&rows);
    println!(
        "#\n# time = median over the rounds of each run's time (itself a median over iterations)"
    );
    print!("{}", text_table(&rows));
    println!("# {verdict}");
    let markdown = format!(
        "A/B of two builds by `cargo xtask bench-ab`: old `{}`, new `{}`, {} round(s), the order \
         of the builds swapped every round; time = median over the rounds of each run's median \
         time; new/old above {SLOWER} is flagged SLOWER.\n\n{}\n{verdict}.\n",
        args.old.display(),
        args.new.display(),
        plan.rounds,
        markdown_table(&rows)
    );
    let path = out.join("ab.md");
    fs::write(&path, markdown).map_err(|e| format!("could not write {}: {e}", path.display()))?;
    println!("# wrote {}", path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use rlx_collective::{DType, ReduceKind};

    use super::super::args::BenchArgs;
    use super::super::measure::{Combo, Step};
    use super::super::report::{self, Row};
    use super::*;

    fn args(ranks: &str, net: &str, op: &str, sizes: &str) -> AbArgs {
        AbArgs {
            old: PathBuf::from("old"),
            new: PathBuf::from("new"),
            rounds: 3,
            ranks: ranks.to_owned(),
            net: net.to_owned(),
            rate: "20gbit".to_owned(),
            op: op.to_owned(),
            sizes: sizes.to_owned(),
            out: None,
            iters: None,
            warmup: None,
        }
    }

    fn file(ranks: u32, netns: bool, rows: &[(&str, &str, f64)]) -> BenchFile {
        BenchFile {
            ranks,
            netns,
            rows: rows
                .iter()
                .map(|&(system, op, time_us)| BenchRow {
                    system: system.to_owned(),
                    op: op.to_owned(),
                    time_us,
                })
                .collect(),
        }
    }

    const TWO: World = World {
        ranks: 2,
        net: Net::Loopback,
    };

    #[test]
    fn the_defaults_plan_the_engine_room_comparison() {
        let plan = Plan::from_args(&args(
            "2,4",
            "loopback,netns",
            "all_reduce,sendrecv,all_gather",
            "8,256K,32M,256M",
        ))
        .unwrap();
        assert_eq!(plan.sizes, vec![8, 256 << 10, 32 << 20, 256 << 20]);
        assert_eq!(
            plan.ops,
            vec![BenchOp::AllReduce, BenchOp::SendRecv, BenchOp::AllGather]
        );
        assert_eq!(plan.worlds.len(), 4);
        assert_eq!(
            plan.worlds[1],
            World {
                ranks: 2,
                net: Net::Netns
            }
        );
        assert_eq!(plan.rate.as_deref(), Some("20gbit"));
    }

    #[test]
    fn bad_flags_are_refused_before_anything_runs() {
        let refused = |a: AbArgs| Plan::from_args(&a).unwrap_err();
        assert!(refused(args("2", "wifi", "all_reduce", "8")).contains("wifi"));
        assert!(refused(args("1", "loopback", "sendrecv", "8")).contains("too few"));
        assert!(refused(args("two", "loopback", "all_reduce", "8")).contains("\"two\""));
        assert!(refused(args("2", "loopback", "all_reduce", "8,0")).contains("0 bytes"));
        assert!(refused(args("2", "loopback", "allreduce", "8")).contains("unknown operation"));
        let mut none = args("2", "netns", "all_reduce", "8");
        none.rate = "none".to_owned();
        assert_eq!(Plan::from_args(&none).unwrap().rate, None);
    }

    #[test]
    fn each_size_is_one_exact_bench_run() {
        let mut a = args("4", "netns", "all_reduce,all_gather", "256K");
        a.iters = Some(5);
        let plan = Plan::from_args(&a).unwrap();
        let world = plan.worlds[0];
        let command = plan.command(Path::new("/tmp/x"), world, 256 << 10, Path::new("r.json"));
        let words: Vec<String> = command
            .get_args()
            .map(|s| s.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            words.join(" "),
            "bench --ranks 4 --op all_reduce,all_gather -b 262144 -e 262144 --json r.json \
             --netns --rate 20gbit -n 5"
        );
    }

    #[test]
    fn the_builds_take_turns_going_first() {
        assert_eq!(order(1), [Build::Old, Build::New]);
        assert_eq!(order(2), [Build::New, Build::Old]);
        assert_eq!(order(3), order(1));
    }

    #[test]
    fn records_keep_rlx_rows_of_the_planned_operations_per_build() {
        let ops = [BenchOp::AllReduce, BenchOp::SendRecv];
        let mut samples = Samples::new();
        let one = file(
            2,
            false,
            &[
                ("rlx", "all_reduce", 10.0),
                ("rlx+bf16", "all_reduce", 99.0),
                ("rlx", "sendrecv", 20.0),
            ],
        );
        record(&mut samples, &ops, TWO, 8, Build::Old, &one).unwrap();
        record(&mut samples, &ops, TWO, 8, Build::New, &one).unwrap();
        assert_eq!(samples[&(0, TWO, 8)].old, vec![10.0]);
        assert_eq!(samples[&(0, TWO, 8)].new, vec![10.0]);
        assert_eq!(samples[&(1, TWO, 8)].old, vec![20.0]);

        let missing = file(2, false, &[("rlx", "all_reduce", 10.0)]);
        let e = record(&mut samples, &ops, TWO, 8, Build::Old, &missing).unwrap_err();
        assert_eq!(e, "has no rlx row for sendrecv");
        let elsewhere = file(2, true, &[]);
        let e = record(&mut samples, &ops, TWO, 8, Build::Old, &elsewhere).unwrap_err();
        assert_eq!(e, "holds 2 ranks in namespaces, not 2 ranks over loopback");
    }

    #[test]
    fn medians_over_rounds_decide_and_only_beyond_five_percent_is_flagged() {
        let ops = [BenchOp::AllReduce, BenchOp::AllGather];
        let mut samples = Samples::new();
        samples.insert(
            (0, TWO, 8),
            Times {
                old: vec![100.0, 300.0, 110.0],
                new: vec![105.0, 90.0, 500.0],
            },
        );
        samples.insert(
            (1, TWO, 8),
            Times {
                old: vec![100.0, 100.0],
                new: vec![106.0, 108.0],
            },
        );
        let rows = compare(&samples, &ops);
        assert_eq!((rows[0].old, rows[0].new), (110.0, 105.0));
        assert!(
            !rows[0].slower(),
            "one slow round does not make a row slower"
        );
        assert_eq!(rows[1].ratio, Some(1.07));
        assert!(rows[1].slower());
        let at_limit = Compared {
            ratio: Some(SLOWER),
            ..compare(&samples, &ops).remove(0)
        };
        assert!(!at_limit.slower(), "exactly 5% is within the noise");
        assert_eq!(
            verdict(&rows),
            "1 of 2 rows are more than 5% slower in the new build: \
             all_gather 2 ranks over loopback 8"
        );
        assert_eq!(
            verdict(&rows[..1]),
            "no row is more than 5% slower in the new build (1 rows)"
        );
    }

    #[test]
    fn tables_show_medians_ratio_rounds_and_the_flag() {
        let mut samples = Samples::new();
        samples.insert(
            (0, TWO, 256 << 10),
            Times {
                old: vec![400.0, 410.0],
                new: vec![500.0, 520.0],
            },
        );
        let rows = compare(&samples, &[BenchOp::AllReduce]);
        let markdown = markdown_table(&rows);
        let lines: Vec<&str> = markdown.lines().collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[1], "|---|---|---|---|---|---|---|---|---|---|");
        assert_eq!(
            lines[2],
            "| all_reduce | 2 | loopback | 256K | 405.0 | 510.0 | 1.259 | 400.0 410.0 | 500.0 520.0 | SLOWER |"
        );
        assert_eq!(
            [micros(0.974), micros(38.46), micros(1234.4)],
            ["0.97", "38.46", "1234"]
        );
        let text = text_table(&rows);
        assert_eq!(
            text,
            "# op         ranks net      size old (us) new (us) new/old old per round (us) new per round (us) flag\n\
             # all_reduce     2 loopback 256K    405.0    510.0   1.259        400.0 410.0        500.0 520.0 SLOWER\n"
        );
    }

    #[test]
    fn timestamps_are_utc_civil_dates() {
        assert_eq!(timestamp(0), "19700101-000000");
        assert_eq!(timestamp(951_782_400), "20000229-000000");
        assert_eq!(timestamp(1_700_000_000), "20231114-221320");
    }

    #[test]
    fn the_reader_understands_what_bench_writes() {
        let mut bench = BenchArgs::smoke();
        bench.ranks = 4;
        bench.world.links.netns = true;
        let combo = Combo {
            op: BenchOp::AllReduce,
            dtype: DType::F32,
            redop: Some(ReduceKind::Sum),
        };
        let step = Step {
            op: combo.op,
            dtype: combo.dtype,
            redop: combo.redop,
            count: 2,
            iters: 3,
            warmup: 1,
            compression: None,
        };
        let row: Row = report::row(&bench, &combo, &step, "rlx", 0, vec![3.0, 1.0, 2.0]);
        let path = std::env::temp_dir().join(format!("bench-ab-test-{}.json", std::process::id()));
        report::write_json(&path, &bench, &[row], &Default::default(), &[]).unwrap();
        let read_back = read(&path);
        let _ = fs::remove_file(&path);
        let file = read_back.unwrap();
        let world = World {
            ranks: 4,
            net: Net::Netns,
        };
        let mut samples = Samples::new();
        record(
            &mut samples,
            &[BenchOp::AllReduce],
            world,
            8,
            Build::New,
            &file,
        )
        .unwrap();
        assert_eq!(samples[&(0, world, 8)].new, vec![2.0]);
    }
}
