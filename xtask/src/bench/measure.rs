//! The arithmetic of the benchmark, shared by the launcher and every system it drives: the
//! operations and their nccl-tests bus-bandwidth factors, the size sweep, element counts,
//! iteration scaling, medians, and the line protocol (`Step` in, `Reply` out) that RLX's ranks
//! and the peer programs in `xtask/peers/` all speak.

use std::fmt;
use std::str::FromStr;

use rlx_collective::{Compression, DType, ReduceKind};

/// The operations `bench` measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum BenchOp {
    /// In-place all-reduce.
    AllReduce,
    /// All-gather (size = the gathered output, as in nccl-tests).
    AllGather,
    /// Reduce-scatter (size = the full input).
    ReduceScatter,
    /// Broadcast from rank 0.
    Broadcast,
    /// Reduce to rank 0.
    Reduce,
    /// All-to-all (size = each rank's whole buffer).
    AllToAll,
    /// Every rank sends to the next and receives from the previous at once.
    SendRecv,
    /// Gather to rank 0 (size = the root's gathered output).
    Gather,
    /// Scatter from rank 0 (size = the root's whole input).
    Scatter,
    /// The buffer as [`GRADIENT_TENSORS`] gradient tensors of 1 to 64 units each (as a model's
    /// 1–64 KiB tensors at 6.5 MiB), reduced by one `all_reduce_many`.
    AllReduceMany,
    /// The same tensors, one `all_reduce` each: what `all_reduce_many` replaces.
    AllReduceEach,
}

/// How many tensors `all_reduce_many` and `all_reduce_each` split the buffer into.
pub(crate) const GRADIENT_TENSORS: usize = 200;

/// The element counts of the gradient tensors of a buffer of `count` elements: tensor `i`
/// takes a share proportional to `1 + (37 i mod 64)`, and the last one the rounding rest.
pub(crate) fn gradient_tensors(count: u64) -> Vec<usize> {
    let weights: Vec<u64> = (0..GRADIENT_TENSORS as u64)
        .map(|i| 1 + (37 * i) % 64)
        .collect();
    let total: u64 = weights.iter().sum();
    let mut lengths: Vec<usize> = weights
        .iter()
        .map(|w| usize::try_from(count * w / total).unwrap_or(usize::MAX))
        .collect();
    let given: usize = lengths.iter().sum();
    if let Some(last) = lengths.last_mut() {
        *last += usize::try_from(count).unwrap_or(usize::MAX) - given;
    }
    lengths
}

impl BenchOp {
    /// Every operation, in the order `--op all` runs them.
    pub(crate) const ALL: [BenchOp; 9] = [
        BenchOp::AllReduce,
        BenchOp::AllGather,
        BenchOp::ReduceScatter,
        BenchOp::Broadcast,
        BenchOp::Reduce,
        BenchOp::AllToAll,
        BenchOp::SendRecv,
        BenchOp::Gather,
        BenchOp::Scatter,
    ];

    /// Operations that run only when named (RLX's own; the peers have no counterpart).
    pub(crate) const NAMED_ONLY: [BenchOp; 2] = [BenchOp::AllReduceMany, BenchOp::AllReduceEach];

    /// The snake-case name used in flags, tables and the line protocol.
    pub(crate) const fn name(self) -> &'static str {
        match self {
            BenchOp::AllReduce => "all_reduce",
            BenchOp::AllGather => "all_gather",
            BenchOp::ReduceScatter => "reduce_scatter",
            BenchOp::Broadcast => "broadcast",
            BenchOp::Reduce => "reduce",
            BenchOp::AllToAll => "all_to_all",
            BenchOp::SendRecv => "sendrecv",
            BenchOp::Gather => "gather",
            BenchOp::Scatter => "scatter",
            BenchOp::AllReduceMany => "all_reduce_many",
            BenchOp::AllReduceEach => "all_reduce_each",
        }
    }

    /// Whether the operation combines values (and so takes a reduction).
    pub(crate) const fn reduces(self) -> bool {
        matches!(
            self,
            BenchOp::AllReduce
                | BenchOp::ReduceScatter
                | BenchOp::Reduce
                | BenchOp::AllReduceMany
                | BenchOp::AllReduceEach
        )
    }

    /// The root, for rooted operations (nccl-tests prints -1 otherwise).
    pub(crate) const fn root(self) -> Option<u32> {
        match self {
            BenchOp::Broadcast | BenchOp::Reduce | BenchOp::Gather | BenchOp::Scatter => Some(0),
            _ => None,
        }
    }

    /// Whether the buffer is split into one block per rank (the count must divide evenly).
    pub(crate) const fn blocked(self) -> bool {
        matches!(
            self,
            BenchOp::AllGather
                | BenchOp::ReduceScatter
                | BenchOp::AllToAll
                | BenchOp::Gather
                | BenchOp::Scatter
        )
    }

    /// nccl-tests' factor from algorithm bandwidth to bus bandwidth on `ranks` ranks.
    pub(crate) fn busbw_factor(self, ranks: u32) -> f64 {
        let n = f64::from(ranks.max(1));
        match self {
            BenchOp::AllReduce | BenchOp::AllReduceMany | BenchOp::AllReduceEach => {
                2.0 * (n - 1.0) / n
            }
            BenchOp::AllGather
            | BenchOp::ReduceScatter
            | BenchOp::AllToAll
            | BenchOp::Gather
            | BenchOp::Scatter => (n - 1.0) / n,
            BenchOp::Broadcast | BenchOp::Reduce | BenchOp::SendRecv => 1.0,
        }
    }
}

/// A (operation, dtype, reduction) combination of the sweep.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Combo {
    pub(crate) op: BenchOp,
    pub(crate) dtype: DType,
    pub(crate) redop: Option<ReduceKind>,
}

impl Combo {
    pub(crate) fn label(&self) -> String {
        match self.redop {
            Some(r) => format!("{} {} {}", self.op, self.dtype, r),
            None => format!("{} {}", self.op, self.dtype),
        }
    }
}

impl fmt::Display for BenchOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for BenchOp {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let wanted = s.trim().to_ascii_lowercase().replace('-', "_");
        let known = BenchOp::ALL.into_iter().chain(BenchOp::NAMED_ONLY);
        known.clone().find(|op| op.name() == wanted).ok_or_else(|| {
            let names: Vec<&str> = known.map(BenchOp::name).collect();
            format!(
                "unknown operation {s:?} (expected {} or all)",
                names.join(", ")
            )
        })
    }
}

/// Parses a comma-separated list or `all` into the values it names.
pub(crate) fn parse_list<T: Copy>(
    s: &str,
    all: &[T],
    one: impl Fn(&str) -> Result<T, String>,
) -> Result<Vec<T>, String> {
    if s.trim().eq_ignore_ascii_case("all") {
        return Ok(all.to_vec());
    }
    s.split(',').map(|part| one(part.trim())).collect()
}

/// Parses a byte size: `8`, `1K`, `256M`, `1G` (binary units, as nccl-tests), also `256MiB`.
pub(crate) fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let value: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a size (e.g. 8, 64K, 256M, 1G)"))?;
    let shift = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        _ => return Err(format!("{s:?} has an unknown unit (use K, M or G)")),
    };
    value
        .checked_mul(1 << shift)
        .ok_or_else(|| format!("{s:?} is too large"))
}

/// The sweep `min, min·factor, ...` up to `max`, plus `max` itself when the steps skip it (so
/// that `-b 8 -e 256M -f 4` ends at 256 MiB, where the yardsticks are quoted).
pub(crate) fn sizes(min: u64, max: u64, factor: u64) -> Result<Vec<u64>, String> {
    if min == 0 || min > max {
        return Err(format!("need 0 < -b ({min}) <= -e ({max})"));
    }
    if factor < 2 {
        return Err(format!("-f must be at least 2, not {factor}"));
    }
    let mut out = Vec::new();
    let mut size = min;
    while size <= max {
        out.push(size);
        match size.checked_mul(factor) {
            Some(next) => size = next,
            None => break,
        }
    }
    if out.last() != Some(&max) {
        out.push(max);
    }
    Ok(out)
}

/// Elements for a buffer of `bytes` bytes of `dtype` for `op` on `ranks` ranks: at least one,
/// and for blocked operations a non-zero multiple of the world size.
pub(crate) fn count_for(op: BenchOp, bytes: u64, dtype: DType, ranks: u32) -> u64 {
    let count = (bytes / dtype.size() as u64).max(1);
    if op.blocked() {
        let n = u64::from(ranks.max(1));
        (count - count % n).max(n)
    } else {
        count
    }
}

/// Timed and warm-up iterations for a buffer of `bytes`: as asked for small buffers, fewer for
/// big ones so that each size moves about `budget` bytes (never fewer than 2 timed and 1
/// warm-up iteration), which keeps a sweep to 256 MiB practical.
pub(crate) fn iterations(iters: u32, warmup: u32, bytes: u64, budget: u64) -> (u32, u32) {
    let affordable = u32::try_from(budget / bytes.max(1)).unwrap_or(u32::MAX);
    (
        iters.min(affordable.max(2)).max(1),
        warmup.min((affordable / 4).max(1)),
    )
}

/// The median of `values` (the mean of the middle two for an even count); 0 for none.
pub(crate) fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    match n {
        0 => 0.0,
        _ if n % 2 == 1 => sorted[n / 2],
        _ => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// The `q` quantile (0..=1) of `values` by the nearest-rank rule: the smallest value that at
/// least `q` of them do not exceed; 0 for none.
pub(crate) fn percentile(values: &[f64], q: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q.clamp(0.0, 1.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Algorithm and bus bandwidth in GB/s (10^9 bytes per second, as nccl-tests) of moving
/// `bytes` in `micros` microseconds.
pub(crate) fn bandwidths(op: BenchOp, bytes: u64, micros: f64, ranks: u32) -> (f64, f64) {
    if micros <= 0.0 {
        return (0.0, 0.0);
    }
    let algbw = bytes as f64 / (micros * 1e3);
    (algbw, algbw * op.busbw_factor(ranks))
}

/// One command of the line protocol: run `op` on `count` elements, `warmup` then `iters`
/// timed iterations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Step {
    /// The operation.
    pub(crate) op: BenchOp,
    /// The element type.
    pub(crate) dtype: DType,
    /// The reduction (only for reducing operations).
    pub(crate) redop: Option<ReduceKind>,
    /// Elements, with the meaning of [`count_for`].
    pub(crate) count: u64,
    /// Timed iterations.
    pub(crate) iters: u32,
    /// Untimed warm-up iterations.
    pub(crate) warmup: u32,
    /// For an all-reduce: run `all_reduce_compressed` in this format instead (RLX only; the
    /// peers never see such a step).
    pub(crate) compression: Option<Compression>,
}

impl Step {
    /// The command line: `<op> <dtype> <redop|none> <count> <iters> <warmup>`, then the
    /// compression format when there is one.
    pub(crate) fn to_line(self) -> String {
        let line = format!(
            "{} {} {} {} {} {}",
            self.op,
            self.dtype,
            self.redop.map_or("none", ReduceKind::name),
            self.count,
            self.iters,
            self.warmup
        );
        match self.compression {
            Some(compression) => format!("{line} {compression}"),
            None => line,
        }
    }

    /// Parses [`Step::to_line`]'s form.
    pub(crate) fn parse(line: &str) -> Result<Step, String> {
        let words: Vec<&str> = line.split_whitespace().collect();
        let (compression, words) = match words.as_slice() {
            [first @ .., last] if first.len() == 6 => (Some(*last), first),
            all => (None, all),
        };
        let [op, dtype, redop, count, iters, warmup] = words else {
            return Err(format!("malformed command {line:?}"));
        };
        let compression = compression
            .map(|name| name.parse::<Compression>().map_err(|e| e.to_string()))
            .transpose()?;
        let number = |w: &str| {
            w.parse::<u64>()
                .map_err(|_| format!("{w:?} is not a number"))
        };
        let redop = match *redop {
            "none" => None,
            name => Some(name.parse::<ReduceKind>().map_err(|e| e.to_string())?),
        };
        Ok(Step {
            op: op.parse()?,
            dtype: dtype.parse::<DType>().map_err(|e| e.to_string())?,
            redop,
            count: number(count)?,
            iters: u32::try_from(number(iters)?).map_err(|_| "too many iterations".to_owned())?,
            warmup: u32::try_from(number(warmup)?).map_err(|_| "too many iterations".to_owned())?,
            compression,
        })
    }

    /// Bytes of the buffer the size column reports.
    pub(crate) fn bytes(self) -> u64 {
        self.count * self.dtype.size() as u64
    }
}

/// The answer to a [`Step`].
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Reply {
    /// Ran: wrong elements summed over the ranks, and each timed iteration's slowest-rank
    /// time in microseconds.
    Ran {
        /// Elements that differed from the expected values.
        wrong: u64,
        /// Per-iteration times.
        micros: Vec<f64>,
        /// Bytes rank 0 sent in the last iteration, when the system counts them (RLX's
        /// compressed all-reduce).
        wire_bytes: Option<u64>,
    },
    /// The system cannot run this step (no such dtype or reduction); not an error.
    Skip(String),
    /// The step failed.
    Error(String),
}

impl Reply {
    /// The reply line: `ok <wrong> [wire=<bytes>] <t_1> ...`, `skip <reason>` or
    /// `error <message>`.
    pub(crate) fn to_line(&self) -> String {
        match self {
            Reply::Ran {
                wrong,
                micros,
                wire_bytes,
            } => {
                let times: Vec<String> = micros.iter().map(|t| format!("{t:.3}")).collect();
                let wire = wire_bytes.map(|b| format!("wire={b} ")).unwrap_or_default();
                format!("ok {wrong} {wire}{}", times.join(" "))
            }
            Reply::Skip(reason) => format!("skip {}", one_line(reason)),
            Reply::Error(message) => format!("error {}", one_line(message)),
        }
    }

    /// Parses a reply line; `None` when the line is not one (a stray log line).
    pub(crate) fn parse(line: &str) -> Option<Reply> {
        let (head, rest) = line.trim().split_once(' ').unwrap_or((line.trim(), ""));
        match head {
            "ok" => {
                let mut words = rest.split_whitespace().peekable();
                let wrong = words.next()?.parse().ok()?;
                let wire_bytes = match words.peek().and_then(|w| w.strip_prefix("wire=")) {
                    Some(bytes) => {
                        let bytes = bytes.parse().ok()?;
                        words.next();
                        Some(bytes)
                    }
                    None => None,
                };
                let micros = words
                    .map(str::parse)
                    .collect::<Result<Vec<f64>, _>>()
                    .ok()?;
                Some(Reply::Ran {
                    wrong,
                    micros,
                    wire_bytes,
                })
            }
            "skip" => Some(Reply::Skip(rest.to_owned())),
            "error" => Some(Reply::Error(rest.to_owned())),
            _ => None,
        }
    }
}

fn one_line(text: &str) -> String {
    text.replace(['\n', '\r'], " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_follow_nccl_tests_and_end_at_max() {
        assert_eq!(parse_size("256M").unwrap(), 256 << 20);
        assert_eq!(parse_size("8").unwrap(), 8);
        assert_eq!(parse_size("64KiB").unwrap(), 64 << 10);
        assert!(parse_size("1T").is_err() && parse_size("M").is_err());
        let s = sizes(8, 256 << 20, 4).unwrap();
        assert_eq!(s.first(), Some(&8));
        assert_eq!(s[1], 32);
        assert_eq!(s[s.len() - 2], 128 << 20);
        assert_eq!(s.last(), Some(&(256 << 20)));
        assert_eq!(sizes(8, 32, 2).unwrap(), [8, 16, 32]);
        assert!(sizes(0, 8, 2).is_err() && sizes(8, 4, 2).is_err() && sizes(8, 64, 1).is_err());
    }

    #[test]
    fn percentiles_take_the_nearest_rank() {
        let values: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        assert_eq!(percentile(&values, 0.90), 90.0);
        assert_eq!(percentile(&values, 0.99), 99.0);
        assert_eq!(percentile(&values, 1.0), 100.0);
        assert_eq!(percentile(&[7.0], 0.5), 7.0);
        assert_eq!(percentile(&[], 0.9), 0.0);
    }

    #[test]
    fn bus_bandwidth_factors_are_nccl_tests() {
        assert_eq!(BenchOp::AllReduce.busbw_factor(4), 1.5);
        assert_eq!(BenchOp::AllGather.busbw_factor(4), 0.75);
        assert_eq!(BenchOp::AllToAll.busbw_factor(2), 0.5);
        assert_eq!(BenchOp::Broadcast.busbw_factor(8), 1.0);
        let (alg, bus) = bandwidths(BenchOp::AllReduce, 2_000_000, 1000.0, 2);
        assert!((alg - 2.0).abs() < 1e-12 && (bus - 2.0).abs() < 1e-12);
    }

    #[test]
    fn counts_and_iterations() {
        assert_eq!(count_for(BenchOp::AllReduce, 8, DType::F32, 3), 2);
        assert_eq!(count_for(BenchOp::AllGather, 8, DType::F64, 2), 2);
        assert_eq!(count_for(BenchOp::AllToAll, 40, DType::F32, 3), 9);
        assert_eq!(iterations(20, 5, 8, 1 << 30), (20, 5));
        assert_eq!(iterations(20, 5, 256 << 20, 1 << 30), (4, 1));
        assert_eq!(iterations(20, 5, 1 << 30, 1 << 20), (2, 1));
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
    }

    #[test]
    fn protocol_round_trips() {
        let step = Step {
            op: BenchOp::ReduceScatter,
            dtype: DType::BF16,
            redop: Some(ReduceKind::Product),
            count: 1024,
            iters: 3,
            warmup: 1,
            compression: None,
        };
        assert_eq!(step.to_line(), "reduce_scatter bf16 prod 1024 3 1");
        assert_eq!(Step::parse(&step.to_line()).unwrap(), step);
        let compressed = Step {
            compression: Some(Compression::Int8),
            ..step
        };
        assert_eq!(
            compressed.to_line(),
            "reduce_scatter bf16 prod 1024 3 1 int8"
        );
        assert_eq!(Step::parse(&compressed.to_line()).unwrap(), compressed);
        assert!(Step::parse("all_reduce f32 sum 8 1 1 int4").is_err());
        assert!(Step::parse("all_reduce f32 sum 8").is_err());
        let reply = Reply::Ran {
            wrong: 2,
            micros: vec![1.5, 2.25],
            wire_bytes: None,
        };
        assert_eq!(Reply::parse(&reply.to_line()), Some(reply));
        let counted = Reply::Ran {
            wrong: 0,
            micros: vec![3.0],
            wire_bytes: Some(4096),
        };
        assert_eq!(counted.to_line(), "ok 0 wire=4096 3.000");
        assert_eq!(Reply::parse(&counted.to_line()), Some(counted));
        assert_eq!(
            Reply::parse("skip no such\ntype"),
            Some(Reply::Skip("no such\ntype".to_owned()))
        );
        assert_eq!(Reply::parse("Warning: something"), None);
    }
}
