//! The bench's output: one row per measured size and system, the nccl-tests style table, the
//! summaries (time and busbw per system, the iperf3 ceiling, the compressed all-reduce), the
//! JSON file and the plot's series.

use std::path::PathBuf;

use rlx_collective::ReduceKind;
use serde::Serialize;

use super::Ceilings;
use super::args::BenchArgs;
use super::measure::{self, Combo, Step};
use super::plot;
use super::systems::System;
use crate::world::World;

/// One measured line of the table.
#[derive(Debug, Clone, Serialize)]
pub(super) struct Row {
    pub(super) system: String,
    pub(super) op: &'static str,
    pub(super) dtype: &'static str,
    pub(super) redop: &'static str,
    pub(super) root: i64,
    pub(super) bytes: u64,
    pub(super) count: u64,
    pub(super) iters: u32,
    pub(super) warmup: u32,
    pub(super) time_us: f64,
    /// The 90th and 99th percentile and the slowest of the iterations' times (µs): a size
    /// that sometimes falls into a slow mode shows here, not in the median.
    pub(super) p90_us: f64,
    pub(super) p99_us: f64,
    pub(super) max_us: f64,
    pub(super) algbw_gbps: f64,
    pub(super) busbw_gbps: f64,
    pub(super) wrong: u64,
    /// RLX's busbw over this system's (= this system's time over RLX's), for peers.
    pub(super) rlx_over_peer: Option<f64>,
    /// Bytes rank 0 sent, for a compressed all-reduce.
    pub(super) wire_bytes: Option<u64>,
    /// The plain all-reduce's time over this row's, for a compressed all-reduce.
    pub(super) speedup: Option<f64>,
    pub(super) iteration_us: Vec<f64>,
}

/// Whether `row` measured RLX (plain or compressed), whose wrong elements fail the command.
pub(super) fn is_rlx(row: &Row) -> bool {
    row.system == "rlx" || row.system.starts_with("rlx+")
}

/// For every size with compressed rows: the plain all-reduce's time and each format's time,
/// wire bytes per rank and speedup, the table `BENCHMARKS.md` quotes.
pub(super) fn print_compression_summary(rows: &[Row]) {
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

pub(super) fn row(
    args: &BenchArgs,
    combo: &Combo,
    step: &Step,
    system: &str,
    wrong: u64,
    micros: Vec<f64>,
) -> Row {
    let time_us = measure::median(&micros);
    let p90_us = measure::percentile(&micros, 0.90);
    let p99_us = measure::percentile(&micros, 0.99);
    let max_us = micros.iter().copied().fold(0.0, f64::max);
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
        p90_us,
        p99_us,
        max_us,
        algbw_gbps: algbw,
        busbw_gbps: busbw,
        wrong,
        rlx_over_peer: None,
        wire_bytes: None,
        speedup: None,
        iteration_us: micros,
    }
}

pub(super) fn print_header(args: &BenchArgs, world: &World, peers: &[System], notes: &[String]) {
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

pub(super) fn print_row(r: &Row, percentiles: bool) {
    let ratio = r
        .rlx_over_peer
        .map(|x| format!("{x:.2}x"))
        .unwrap_or_default();
    let compressed = match (r.wire_bytes, r.speedup) {
        (Some(wire), Some(speedup)) => format!("  wire {wire} B  speedup {speedup:.2}x"),
        (Some(wire), None) => format!("  wire {wire} B"),
        _ => String::new(),
    };
    let tails = if percentiles {
        format!(
            "  p90 {:.2} p99 {:.2} max {:.2} us",
            r.p90_us, r.p99_us, r.max_us
        )
    } else {
        String::new()
    };
    println!(
        " {:>11} {:>12} {:>6} {:>6} {:>5} {:>11.2} {:>8.3} {:>8.3} {:>7}  {:<8} {:>8}{compressed}{tails}",
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

/// One line per system and combo: the time at the smallest size and busbw from 512 KiB up, the
/// numbers the yardsticks of the spec are quoted in.
pub(super) fn print_summary(rows: &[Row], combos: &[Combo]) {
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

/// For every RLX row, its busbw as a fraction of the best one-way iperf3 figure, and of the
/// best figure each way of iperf3 running both ways at once when that was measured.
pub(super) fn print_ceiling(rows: &[Row], one_way: f64, both_ways: Option<f64>) {
    match both_ways {
        Some(both) => println!(
            "#\n# rlx busbw / iperf3 ceiling ({one_way:.2} GB/s one way; {both:.2} GB/s each \
             way both ways at once), sizes of 512 KiB and up:"
        ),
        None => println!(
            "#\n# rlx busbw / iperf3 ceiling ({one_way:.2} GB/s), sizes of 512 KiB and up:"
        ),
    }
    for r in rows
        .iter()
        .filter(|r| r.system == "rlx" && r.bytes >= 512 << 10)
    {
        let mut line = format!(
            "#   {:<28} {:>11} B  {:>6.3} GB/s  {:>5.2}x",
            format!("{} {} {}", r.op, r.dtype, r.redop),
            r.bytes,
            r.busbw_gbps,
            r.busbw_gbps / one_way
        );
        if let Some(both) = both_ways {
            line.push_str(&format!("  {:>5.2}x both ways", r.busbw_gbps / both));
        }
        println!("{line}");
    }
}

pub(super) fn plot_series(rows: &[Row], per_combo: bool) -> Vec<plot::Series> {
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

pub(super) fn write_json(
    path: &PathBuf,
    args: &BenchArgs,
    rows: &[Row],
    ceilings: &Ceilings,
    notes: &[String],
) -> Result<(), String> {
    let doc = serde_json::json!({
        "ranks": args.ranks,
        "transport": args.world.transport.name(),
        "netns": args.world.links.netns,
        "topology": args.world.links.topology.to_string(),
        "iters": args.iters,
        "warmup": args.warmup,
        "budget_bytes": measure::parse_size(&args.budget)?,
        "iperf3_gbps": ceilings.one_way,
        "iperf3_both_ways_gbps": ceilings.both_ways,
        "notes": notes,
        "rows": rows,
    });
    let text = serde_json::to_string_pretty(&doc)
        .map_err(|e| format!("could not encode the results: {e}"))?;
    std::fs::write(path, text).map_err(|e| format!("could not write {}: {e}", path.display()))
}
