//! `cargo xtask bench --report DIR`: the side-by-side report of `BENCHMARKS.md`, regenerated
//! by one command.
//!
//! It runs the same sweeps against Open MPI (and the other peers found) several times, each
//! run writing its JSON file and its plot into `DIR`, then reads the files back and writes
//! `DIR/report.md`: for every operation and size, RLX's and Open MPI's busbw (medians over the
//! runs), the ratio of each run and their median, and each target of the performance round
//! stated as met or missed. Ratios are taken within a run, where both systems met the same
//! machine state, and only then summarised: absolute figures drift between runs.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::args::BenchArgs;

/// One sweep of a report run: a name for its files, and the flags it changes.
struct SweepPlan {
    name: &'static str,
    op: &'static str,
    min_bytes: &'static str,
    max_bytes: &'static str,
    factor: u64,
    iters: u32,
    warmup: u32,
}

/// The sweeps of every run: the gather family and point-to-point at 1 and 32 MiB, the same at
/// 256 MiB with fewer iterations, and the 8 B all-reduce's latency.
const SWEEPS: [SweepPlan; 3] = [
    SweepPlan {
        name: "mid",
        op: "all",
        min_bytes: "1M",
        max_bytes: "32M",
        factor: 32,
        iters: 10,
        warmup: 3,
    },
    SweepPlan {
        name: "large",
        op: "all",
        min_bytes: "256M",
        max_bytes: "256M",
        factor: 2,
        iters: 4,
        warmup: 1,
    },
    SweepPlan {
        name: "latency",
        op: "all_reduce",
        min_bytes: "8",
        max_bytes: "8",
        factor: 2,
        iters: 5000,
        warmup: 200,
    },
];

/// The busbw ratio over Open MPI the round asks of every operation but the all-reduce.
const TARGET_RATIO: f64 = 1.5;
/// The all-reduce's busbw ratio at 32 MiB and above.
const ALL_REDUCE_RATIO: f64 = 2.5;
/// The 8 B all-reduce's time as a fraction of Open MPI's, at most.
const LATENCY_FRACTION: f64 = 0.7;

/// The part of a bench JSON file the report reads.
#[derive(Debug, Deserialize)]
struct RunFile {
    ranks: u32,
    iperf3_gbps: Vec<f64>,
    rows: Vec<MeasuredRow>,
}

/// The part of a measured row the report reads.
#[derive(Debug, Deserialize)]
struct MeasuredRow {
    system: String,
    op: String,
    bytes: u64,
    time_us: f64,
    busbw_gbps: f64,
}

/// Runs `runs` rounds of [`SWEEPS`] with the world of `base` and writes the report into
/// `dir` (with `base.rewrite`, writes it from the files of an earlier measurement).
pub(super) fn run(base: &BenchArgs, dir: &Path, runs: u32) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("could not create {}: {e}", dir.display()))?;
    let mut files: Vec<Vec<PathBuf>> = vec![Vec::new(); SWEEPS.len()];
    for run in 1..=runs {
        for (plan, files) in SWEEPS.iter().zip(&mut files) {
            let json = dir.join(format!("{}-{}-ranks-{run}.json", plan.name, base.ranks));
            if base.rewrite {
                files.push(json);
                continue;
            }
            let args = BenchArgs {
                op: plan.op.to_owned(),
                min_bytes: plan.min_bytes.to_owned(),
                max_bytes: plan.max_bytes.to_owned(),
                factor: plan.factor,
                iters: plan.iters,
                warmup: plan.warmup,
                dtype: "f32".to_owned(),
                redop: "sum".to_owned(),
                peers: true,
                json: Some(json.clone()),
                plot: (plan.name != "latency")
                    .then(|| dir.join(format!("{}-{}-ranks-{run}.svg", plan.name, base.ranks))),
                report: None,
                runs: 1,
                rewrite: false,
                compression: String::new(),
                kernels: false,
                ..base.clone()
            };
            println!(
                "# report: run {run} of {runs}, sweep {} ({} ranks)",
                plan.name, base.ranks
            );
            super::run(&args)?;
            files.push(json);
        }
    }
    let text = write_report(base, &files)?;
    let path = dir.join(format!("report-{}-ranks.md", base.ranks));
    std::fs::write(&path, text).map_err(|e| format!("could not write {}: {e}", path.display()))?;
    println!("# wrote {}", path.display());
    Ok(())
}

/// Reads one JSON file of a run.
fn read(path: &Path) -> Result<RunFile, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("could not read {}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{} is not a bench file: {e}", path.display()))
}

/// The median of `values` (the mean of the middle two for an even count); `None` when empty.
fn median(values: &[f64]) -> Option<f64> {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(sorted[n / 2]),
        _ => Some((sorted[n / 2 - 1] + sorted[n / 2]) / 2.0),
    }
}

/// What one (operation, size) cell gathered over the runs.
#[derive(Debug, Default)]
struct Cell {
    rlx: Vec<f64>,
    openmpi: Vec<f64>,
    /// RLX's busbw over Open MPI's, per run in which both measured it.
    ratios: Vec<f64>,
    /// The same for time (Open MPI's time over RLX's is the busbw ratio; this is RLX's over
    /// Open MPI's, the latency target's form).
    time_fractions: Vec<f64>,
    /// Open MPI's busbw over its shared-memory layer, where it ran.
    openmpi_sm: Vec<f64>,
    /// RLX's busbw over that, per run.
    sm_ratios: Vec<f64>,
}

/// Gathers every run's rows of one sweep into cells keyed by (operation, bytes).
fn cells(files: &[RunFile]) -> BTreeMap<(String, u64), Cell> {
    let mut cells: BTreeMap<(String, u64), Cell> = BTreeMap::new();
    for file in files {
        let find = |system: &str, op: &str, bytes: u64| {
            file.rows
                .iter()
                .find(|r| r.system == system && r.op == op && r.bytes == bytes)
        };
        for row in file.rows.iter().filter(|r| r.system == "rlx") {
            let cell = cells.entry((row.op.clone(), row.bytes)).or_default();
            cell.rlx.push(row.busbw_gbps);
            if let Some(peer) = find("openmpi", &row.op, row.bytes) {
                cell.openmpi.push(peer.busbw_gbps);
                if peer.busbw_gbps > 0.0 {
                    cell.ratios.push(row.busbw_gbps / peer.busbw_gbps);
                }
                if peer.time_us > 0.0 {
                    cell.time_fractions.push(row.time_us / peer.time_us);
                }
            }
            if let Some(peer) = find("openmpi-sm", &row.op, row.bytes) {
                cell.openmpi_sm.push(peer.busbw_gbps);
                if peer.busbw_gbps > 0.0 {
                    cell.sm_ratios.push(row.busbw_gbps / peer.busbw_gbps);
                }
            }
        }
    }
    cells
}

/// The size a measured byte count stands for: the sweep's power of two, which the bench rounds
/// down to whole elements per rank (1048572 bytes on 3 ranks is the 1 MiB point).
fn nominal(bytes: u64) -> String {
    let power = bytes.next_power_of_two();
    if (power - bytes) * 100 < power {
        super::plot::human_bytes(power)
    } else {
        super::plot::human_bytes(bytes)
    }
}

/// `1.23` or `-` for a missing figure.
fn figure(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| format!("{v:.2}"))
}

/// The per-run figures in brackets: `[0.97 0.91 2.01]`.
fn per_run(values: &[f64]) -> String {
    let inner: Vec<String> = values.iter().map(|v| format!("{v:.2}")).collect();
    format!("[{}]", inner.join(" "))
}

/// The report's text from the files of every sweep (`files[sweep][run]`).
fn write_report(base: &BenchArgs, files: &[Vec<PathBuf>]) -> Result<String, String> {
    let mut out = String::new();
    let runs = files.first().map_or(0, Vec::len);
    let _ = writeln!(
        out,
        "# Side by side with Open MPI: {} ranks, {} transport, f32 sum\n",
        base.ranks,
        base.world.transport.name()
    );
    let _ = writeln!(
        out,
        "Written by `cargo xtask bench --report DIR --ranks {}` from {runs} runs; busbw in \
         GB/s, medians over the runs; ratio = RLX / Open MPI within each run, then the median of \
         those ratios (each run's in brackets). `openmpi` is Open MPI over its TCP layer, the \
         targets' yardstick; `openmpi-sm` over its shared-memory layer (one cross-memory-attach \
         copy for large messages, as RLX's single-copy path between ranks of one host), where \
         the ranks share a host.\n",
        base.ranks
    );
    let mut ceilings = Vec::new();
    let mut verdicts = Vec::new();
    for (plan, paths) in SWEEPS.iter().zip(files) {
        let loaded = paths
            .iter()
            .map(|p| read(p))
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(file) = loaded.first() {
            if file.ranks != base.ranks {
                return Err(format!(
                    "{} holds {} ranks, not {}",
                    paths[0].display(),
                    file.ranks,
                    base.ranks
                ));
            }
        }
        ceilings.extend(loaded.iter().flat_map(|f| f.iperf3_gbps.iter().copied()));
        let cells = cells(&loaded);
        if plan.name == "latency" {
            for ((op, bytes), cell) in &cells {
                let fraction = median(&cell.time_fractions);
                let _ = writeln!(
                    out,
                    "{op} of {bytes} B: RLX's time is {} of Open MPI's {}.\n",
                    figure(fraction),
                    per_run(&cell.time_fractions)
                );
                verdicts.push(verdict(
                    &format!("{op} {bytes} B time ≤ {LATENCY_FRACTION}× Open MPI's"),
                    fraction.map(|f| f <= LATENCY_FRACTION),
                    fraction,
                ));
            }
            continue;
        }
        let _ = writeln!(
            out,
            "### {} sizes\n\n| op | bytes | rlx | openmpi | ratio | openmpi-sm | ratio to sm |\n\
             |---|---|---|---|---|---|---|",
            plan.name
        );
        for ((op, bytes), cell) in &cells {
            let ratio = median(&cell.ratios);
            let _ = writeln!(
                out,
                "| {op} | {} | {} | {} | {} {} | {} | {} {} |",
                nominal(*bytes),
                figure(median(&cell.rlx)),
                figure(median(&cell.openmpi)),
                figure(ratio),
                per_run(&cell.ratios),
                figure(median(&cell.openmpi_sm)),
                figure(median(&cell.sm_ratios)),
                per_run(&cell.sm_ratios)
            );
            let (wanted, applies) = if op == "all_reduce" {
                (ALL_REDUCE_RATIO, *bytes >= 32 << 20)
            } else {
                (TARGET_RATIO, true)
            };
            if applies && op != "broadcast" && op != "reduce" {
                verdicts.push(verdict(
                    &format!("{op} at {} ≥ {wanted}× Open MPI", nominal(*bytes)),
                    ratio.map(|r| r >= wanted),
                    ratio,
                ));
            }
        }
        out.push('\n');
    }
    if let (Some(low), Some(high)) = (
        ceilings.iter().copied().reduce(f64::min),
        ceilings.iter().copied().reduce(f64::max),
    ) {
        let _ = writeln!(
            out,
            "iperf3 over the same path in the same runs: {low:.2}–{high:.2} GB/s.\n"
        );
    }
    let _ = writeln!(out, "### Targets\n");
    for line in verdicts {
        let _ = writeln!(out, "- {line}");
    }
    Ok(out)
}

/// One target's line: met, missed, or not measured, with the ratio.
fn verdict(target: &str, met: Option<bool>, figure_of: Option<f64>) -> String {
    match met {
        Some(true) => format!("met: {target} ({})", figure(figure_of)),
        Some(false) => format!("missed: {target} ({})", figure(figure_of)),
        None => format!("not measured: {target} (Open MPI gave no figure)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(system: &str, op: &str, bytes: u64, time_us: f64, busbw: f64) -> MeasuredRow {
        MeasuredRow {
            system: system.to_owned(),
            op: op.to_owned(),
            bytes,
            time_us,
            busbw_gbps: busbw,
        }
    }

    #[test]
    fn medians_take_the_middle() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[f64::NAN, 1.0]), Some(1.0));
    }

    #[test]
    fn sizes_rounded_to_whole_elements_keep_their_sweep_label() {
        assert_eq!(nominal(1048572), nominal(1 << 20));
        assert_eq!(nominal(1 << 20), super::super::plot::human_bytes(1 << 20));
        assert_eq!(nominal(8), super::super::plot::human_bytes(8));
        assert_eq!(nominal(1000), super::super::plot::human_bytes(1000));
    }

    #[test]
    fn ratios_are_taken_within_each_run() {
        let runs = [
            RunFile {
                ranks: 2,
                iperf3_gbps: vec![2.0],
                rows: vec![
                    row("rlx", "sendrecv", 1 << 20, 10.0, 3.0),
                    row("openmpi", "sendrecv", 1 << 20, 20.0, 1.0),
                ],
            },
            RunFile {
                ranks: 2,
                iperf3_gbps: vec![2.5],
                rows: vec![
                    row("rlx", "sendrecv", 1 << 20, 10.0, 1.0),
                    row("openmpi", "sendrecv", 1 << 20, 10.0, 2.0),
                    row("rlx", "gather", 1 << 20, 10.0, 1.0),
                ],
            },
        ];
        let cells = cells(&runs);
        let cell = &cells[&("sendrecv".to_owned(), 1 << 20)];
        assert_eq!(cell.ratios, vec![3.0, 0.5]);
        assert_eq!(cell.time_fractions, vec![0.5, 1.0]);
        let gather = &cells[&("gather".to_owned(), 1 << 20)];
        assert!(gather.ratios.is_empty());
        assert_eq!(
            verdict("x", None, None),
            "not measured: x (Open MPI gave no figure)"
        );
        assert_eq!(verdict("x", Some(true), Some(1.5)), "met: x (1.50)");
    }
}
