//! One rank of `cargo xtask test-cluster --duration D`: a seeded random mix of collectives
//! (all-reduce, reduce-scatter, all-gather, broadcast) over random dtypes, reductions and
//! sizes up to 64 MiB, one to three of them in flight at once as non-blocking handles, every
//! result checked against the serial reference of `rlx_collective::conformance::reference`.
//!
//! Every rank draws the same plan from the seed, and every rank's inputs follow from (seed,
//! operation, rank), so each rank computes the reference for all of them without
//! communication. Rank 0 alone watches the clock: before each round the ranks agree, by an
//! all-reduce, whether to go on, so that all of them stop after the same operation.

use std::time::{Duration, Instant};

use half::{bf16, f16};
use rlx_collective::conformance::SplitMix;
use rlx_collective::conformance::reference::{self, Expected};
use rlx_collective::{CollectiveHandle, DType, ProcessGroup, ReduceKind};

use super::events::{ErrorRecord, Event, Usage};

/// The largest buffer one round moves in total (the sizes of the operations in flight add up
/// to at most this).
const ROUND_BYTES: u64 = 64 << 20;

/// How often a rank reports its count of checked operations and its resources (between two
/// rounds, so less often while rounds take longer), besides at its start and its end.
const REPORT_EVERY: Duration = Duration::from_secs(2);

/// The collectives of the mix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    AllReduce,
    ReduceScatter,
    AllGather,
    Broadcast,
}

impl Kind {
    const ALL: [Kind; 4] = [
        Kind::AllReduce,
        Kind::ReduceScatter,
        Kind::AllGather,
        Kind::Broadcast,
    ];

    fn name(self) -> &'static str {
        match self {
            Kind::AllReduce => "all_reduce",
            Kind::ReduceScatter => "reduce_scatter",
            Kind::AllGather => "all_gather",
            Kind::Broadcast => "broadcast",
        }
    }
}

/// One operation of the plan, the same on every rank.
#[derive(Debug, Clone, Copy)]
struct Planned {
    /// Its number over the whole soak (seeds its inputs).
    number: u64,
    kind: Kind,
    dtype: DType,
    reduce: ReduceKind,
    /// Elements of each rank's input.
    count: usize,
    root: u32,
}

impl Planned {
    fn name(&self) -> String {
        format!(
            "{} {} {} n={} (operation {})",
            self.kind.name(),
            self.dtype,
            self.reduce.name(),
            self.count,
            self.number
        )
    }
}

/// Draws one round of one to three operations whose buffers add up to at most
/// [`ROUND_BYTES`]; sizes are log-uniform, so most are small and a few are large. The first
/// rounds warm up: one collective of each kind at the full size, in f16 (the most elements,
/// so the largest reference), so that every rank's memory reaches its working peak within
/// the first window the launcher measures.
fn plan_round(rng: &mut SplitMix, next: &mut u64, world: u32) -> Vec<Planned> {
    if let Some(&kind) = Kind::ALL.get(*next as usize) {
        let count = ROUND_BYTES as usize / DType::F16.size();
        *next += 1;
        return vec![Planned {
            number: *next - 1,
            kind,
            dtype: DType::F16,
            reduce: ReduceKind::Sum,
            count: match kind {
                Kind::AllGather => count / world as usize,
                _ => count - count % world as usize,
            },
            root: 0,
        }];
    }
    let in_flight = 1 + rng.below(3);
    let per_op = ROUND_BYTES / in_flight;
    (0..in_flight)
        .map(|_| {
            let kind = Kind::ALL[rng.below(Kind::ALL.len() as u64) as usize];
            let dtype = DType::ALL[rng.below(DType::ALL.len() as u64) as usize];
            let reduce = ReduceKind::ALL[rng.below(ReduceKind::ALL.len() as u64) as usize];
            let magnitude = rng.below(27);
            let bytes = rng.below(1 << magnitude).min(per_op);
            let mut count = bytes as usize / dtype.size();
            match kind {
                // Each rank's input is one block of the gathered result.
                Kind::AllGather => count /= world as usize,
                // Equal blocks for every rank.
                Kind::ReduceScatter => count -= count % world as usize,
                Kind::AllReduce | Kind::Broadcast => {}
            }
            let root = rng.below(u64::from(world)) as u32;
            *next += 1;
            Planned {
                number: *next - 1,
                kind,
                dtype,
                reduce,
                count,
                root,
            }
        })
        .collect()
}

/// `count` elements of `dtype` for `rank`'s input to operation `number`, in ranges where no
/// reduction of a few ranks overflows or loses its exactness: small integers, floats near 1
/// for a product and in [-1, 1) otherwise.
fn input(seed: u64, op: &Planned, rank: u32, count: usize) -> Vec<u8> {
    let mut rng = SplitMix::seeded(
        seed ^ op.number.wrapping_mul(0x9E37_79B9_7F4A_7C15)
            ^ u64::from(rank).wrapping_mul(0xD1B5_4A32_D192_ED03),
    );
    let product = op.reduce == ReduceKind::Product;
    let mut out = Vec::with_capacity(count * op.dtype.size());
    for _ in 0..count {
        let bits = rng.next_u64();
        let unit = (bits >> 11) as f64 / (1u64 << 53) as f64;
        let float = if product {
            0.5 + unit
        } else {
            unit * 2.0 - 1.0
        };
        // Products of up to four ranks stay within i8: 3^4 = 81.
        let small = if product { 1 + bits % 3 } else { bits % 31 };
        match op.dtype {
            DType::F16 => out.extend(f16::from_f64(float).to_le_bytes()),
            DType::BF16 => out.extend(bf16::from_f64(float).to_le_bytes()),
            DType::F32 => out.extend((float as f32).to_le_bytes()),
            DType::F64 => out.extend(float.to_le_bytes()),
            DType::I8 => out.extend((small as i8 - if product { 0 } else { 15 }).to_le_bytes()),
            DType::U8 => out.push(small as u8),
            DType::I32 => out.extend((small as i32 - 15).to_le_bytes()),
            DType::I64 => out.extend((small as i64 - 15).to_le_bytes()),
            _ => out.extend(std::iter::repeat_n(0, op.dtype.size())),
        }
    }
    out
}

/// The elements `index` of `parts` equal blocks of `count` own.
fn block(count: usize, parts: usize, index: usize) -> std::ops::Range<usize> {
    let at = |i: usize| i * count / parts.max(1);
    at(index)..at(index + 1)
}

/// Starts `op` on `group` with this rank's input.
fn spawn(group: &ProcessGroup, seed: u64, op: &Planned) -> CollectiveHandle<Vec<u8>> {
    let me = group.rank();
    let data = input(seed, op, me, op.count);
    match op.kind {
        Kind::AllReduce => group.spawn_all_reduce_typed(data, op.dtype, op.reduce),
        Kind::ReduceScatter => group.spawn_reduce_scatter_typed(data, op.dtype, op.reduce),
        Kind::AllGather => group.spawn_all_gather_typed(data, op.dtype),
        Kind::Broadcast => {
            let data = if me == op.root {
                data
            } else {
                vec![0; op.count * op.dtype.size()]
            };
            group.spawn_broadcast_typed(op.root, data, op.dtype)
        }
    }
}

/// Checks `got`, this rank's result of `op`, against the serial reference.
fn check(group: &ProcessGroup, seed: u64, op: &Planned, got: &[u8]) -> Result<(), String> {
    let world = group.world_size();
    let inputs: Vec<Vec<u8>> = (0..world)
        .map(|rank| input(seed, op, rank, op.count))
        .collect();
    let expected = match op.kind {
        Kind::AllReduce => reference::reduce(op.dtype, op.reduce, &inputs),
        Kind::ReduceScatter => {
            let all = reference::reduce(op.dtype, op.reduce, &inputs);
            let mine = block(op.count, world as usize, group.rank() as usize);
            reference::slice(&all, op.dtype.size(), mine)
        }
        Kind::AllGather => Expected::Bytes(inputs.concat()),
        Kind::Broadcast => Expected::Bytes(inputs[op.root as usize].clone()),
    };
    reference::check(got, &expected)
}

/// Runs the soak on `group` for `duration` (as rank 0's clock has it), reporting through
/// `emit`; returns the operations checked, or the report of what went wrong.
pub(super) fn run(
    group: &ProcessGroup,
    duration: Duration,
    seed: u64,
    emit: &dyn Fn(&Event),
) -> Result<u64, ErrorRecord> {
    let rank = group.rank();
    let started = Instant::now();
    let mut plan = SplitMix::seeded(seed);
    let mut next = 0;
    let mut checked = 0u64;
    let mut bytes = 0u64;
    // The first and the last report bracket the run, so that the launcher's first and last
    // windows each hold one however slowly the rounds go on a busy machine.
    let report = |checked: u64, bytes: u64| {
        emit(&Event::Soak {
            rank,
            ops: checked,
            bytes,
            usage: quiet_usage(),
        });
    };
    report(0, 0);
    let mut reported = Instant::now();
    loop {
        let mut stop = [i32::from(rank == 0 && started.elapsed() >= duration)];
        group
            .all_reduce(&mut stop, ReduceKind::Max)
            .map_err(|e| ErrorRecord::from_error(&e, Some("the soak's stop vote".to_owned())))?;
        if stop[0] != 0 {
            report(checked, bytes);
            return Ok(checked);
        }
        let round = plan_round(&mut plan, &mut next, group.world_size());
        let handles: Vec<_> = round.iter().map(|op| spawn(group, seed, op)).collect();
        for (op, handle) in round.iter().zip(handles) {
            let got = handle
                .join()
                .map_err(|e| ErrorRecord::from_error(&e, Some(op.name())))?;
            check(group, seed, op, &got).map_err(|detail| ErrorRecord {
                kind: "wrong".to_owned(),
                peer: None,
                message: format!("wrong result of {}: {detail}", op.name()),
                during: Some(op.name()),
            })?;
            checked += 1;
            bytes += got.len() as u64;
        }
        if reported.elapsed() >= REPORT_EVERY {
            reported = Instant::now();
            report(checked, bytes);
        }
    }
}

/// This process's resources between two rounds, when no buffer of the soak's operations is
/// alive: the allocator first hands the free memory it keeps back to the system, so that the
/// figure is what the process holds, not what it happened to free last.
fn quiet_usage() -> Option<Usage> {
    // glibc's allocator alone has `malloc_trim`; elsewhere the figure includes what the
    // allocator keeps.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` only returns free heap memory to the system; it takes no pointer
    // and is safe to call at any time.
    unsafe {
        libc::malloc_trim(0);
    }
    Usage::of(std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_stay_within_the_budget_and_blocks_are_equal() {
        let mut rng = SplitMix::seeded(3);
        let mut next = 0;
        for _ in 0..2000 {
            let round = plan_round(&mut rng, &mut next, 4);
            assert!((1..=3).contains(&round.len()));
            let total: usize = round.iter().map(|op| op.count * op.dtype.size()).sum();
            assert!(total as u64 <= ROUND_BYTES, "{round:?}");
            for op in &round {
                if op.kind == Kind::ReduceScatter {
                    assert_eq!(op.count % 4, 0);
                }
            }
        }
        assert_eq!(block(8, 4, 1), 2..4);
    }

    #[test]
    fn the_checks_catch_a_wrong_byte_in_threads_over_memory() {
        use std::sync::Arc;

        use rlx_collective::{MemTransport, Transport};

        let results: Vec<_> = MemTransport::fan_out(3)
            .into_iter()
            .map(|t| {
                std::thread::spawn(move || {
                    let group = ProcessGroup::new(t as Arc<dyn Transport>);
                    let mut rng = SplitMix::seeded(5);
                    let mut next = 0;
                    let mut checked = 0;
                    for _ in 0..20 {
                        let mut round = plan_round(&mut rng, &mut next, 3);
                        for op in &mut round {
                            // Small buffers keep the test fast.
                            op.count = op.count.min(3000) / 3 * 3;
                        }
                        let handles: Vec<_> = round.iter().map(|op| spawn(&group, 9, op)).collect();
                        for (op, handle) in round.iter().zip(handles) {
                            let mut got = handle.join().unwrap();
                            check(&group, 9, op, &got).unwrap();
                            // The last byte of the first element holds a float's exponent
                            // and an integer's high bits: flipping it is never within bounds.
                            if let Some(byte) = got.get_mut(op.dtype.size() - 1) {
                                *byte ^= 0x40;
                                assert!(check(&group, 9, op, &got).is_err(), "{op:?}");
                            }
                            checked += 1;
                        }
                    }
                    checked
                })
            })
            .collect();
        for result in results {
            assert!(result.join().unwrap() >= 20);
        }
    }
}
