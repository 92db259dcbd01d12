//! `xtask __bench-rank`: one RLX rank (or, over the in-process transport, every rank) of
//! `cargo xtask bench`, driven by the line protocol of [`super::measure`].
//!
//! Method, the same in every system of the sweep: a barrier before each iteration, one
//! operation timed per iteration, in-place inputs restored from a pristine copy outside the
//! timing, outputs in buffers allocated once per size (as the MPI benchmark's are; RLX's
//! `*_into` forms), poisoned before the last iteration and checked after it; then the
//! per-iteration times are reduced with MAX and the wrong counts with SUM across the ranks,
//! outside the timed region, and rank 0 answers.

use std::io::BufRead;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use clap::Args;
use rlx_collective::{CollectiveError, Compressor, DType, ProcessGroup, ReduceKind};

use super::check::{self, POISON};
use super::measure::{self, BenchOp, Reply, Step};
use crate::ranks;
use crate::world::TransportKind;

/// The user tag of the sendrecv benchmark's messages.
const SENDRECV_TAG: u32 = 7;

/// Flags of the hidden `__bench-rank` subcommand (set by the bench launcher).
#[derive(Debug, Args)]
pub(crate) struct BenchRankArgs {
    /// Transport of this rank.
    #[arg(long, value_enum)]
    pub(crate) transport: TransportKind,
    /// World size (used by the in-process transport, which runs every rank here).
    #[arg(long)]
    pub(crate) ranks: u32,
    /// Algorithms to force, as OP=ALGORITHM[,...].
    #[arg(long, default_value = "")]
    pub(crate) algorithm: String,
}

/// Runs the rank(s) until stdin ends or says `quit`.
pub(crate) fn run(args: &BenchRankArgs) -> Result<(), String> {
    let groups = ranks::join(args.transport, args.ranks)?;
    for group in &groups {
        ranks::force_algorithms(group, &args.algorithm)?;
    }
    let stdin_lines = std::io::stdin().lock().lines().map_while(Result::ok);
    match <[ProcessGroup; 1]>::try_from(groups) {
        Ok([group]) => drive(&group, stdin_lines),
        Err(groups) => {
            // Every in-process rank gets its own copy of each command line.
            let mut senders = Vec::new();
            let mut threads = Vec::new();
            for group in groups {
                let (tx, rx) = mpsc::channel::<String>();
                senders.push(tx);
                threads.push(std::thread::spawn(move || drive(&group, rx.into_iter())));
            }
            for line in stdin_lines {
                for tx in &senders {
                    // A rank that stopped has reported why; the others still get the line.
                    let _ = tx.send(line.clone());
                }
            }
            drop(senders);
            let mut result = Ok(());
            for thread in threads {
                let outcome = thread
                    .join()
                    .unwrap_or_else(|_| Err("a rank thread panicked".to_owned()));
                result = result.and(outcome);
            }
            result
        }
    }
}

/// Answers every command of `lines` on `group`.
fn drive(group: &ProcessGroup, lines: impl Iterator<Item = String>) -> Result<(), String> {
    let leader = group.is_leader();
    group
        .barrier()
        .map_err(|e| format!("rank {}: first barrier failed: {e}", group.rank()))?;
    if leader {
        println!("ready");
    }
    let epoch = Instant::now();
    let real_clock = || epoch.elapsed();
    for line in lines {
        if line.trim() == "quit" {
            break;
        }
        let (reply, fatal) = match Step::parse(&line) {
            Ok(step) => match run_step(group, &step, &real_clock) {
                Ok(reply) => (reply, false),
                Err(e) => (Reply::Error(e.to_string()), e.is_fatal()),
            },
            Err(e) => (Reply::Error(e), false),
        };
        if leader {
            println!("{}", reply.to_line());
        } else if let Reply::Error(message) = &reply {
            eprintln!("rank {}: {message}", group.rank());
        }
        if fatal {
            return Err(format!(
                "rank {}: the group is unusable after the last error",
                group.rank()
            ));
        }
    }
    Ok(())
}

/// The buffers of one step on one rank.
struct Buffers {
    /// The input as generated (restored before every in-place iteration).
    pristine: Vec<u8>,
    /// The in-place buffer (all-reduce, reduce, broadcast).
    work: Vec<u8>,
    /// The output of the operations that have one, allocated once for every iteration.
    out: Vec<u8>,
    /// What `out` is filled with before the last iteration, so that an element the operation
    /// failed to write shows as wrong.
    poison: Vec<u8>,
    /// A compressed all-reduce's f32 input, its in-place buffer and its compressor (whose
    /// error feedback carries from one iteration to the next, as in training).
    compressed: Option<(Vec<f32>, Vec<f32>, Compressor)>,
}

/// Runs one step and returns rank 0's answer (the other ranks' return value is ignored),
/// timing each iteration on `clock` (the time since any fixed moment): the real clock for the
/// bench, a simulated rank's virtual clock for `simulate`.
pub(crate) fn run_step(
    group: &ProcessGroup,
    step: &Step,
    clock: &dyn Fn() -> Duration,
) -> Result<Reply, CollectiveError> {
    let rank = group.rank();
    let world = group.world_size();
    let dtype = step.dtype;
    let redop = match (step.op.reduces(), step.redop) {
        (true, Some(redop)) => redop,
        (true, None) => return Ok(Reply::Skip(format!("{} needs a reduction", step.op))),
        (false, _) => ReduceKind::Sum,
    };
    if step.compression.is_some()
        && (step.op != BenchOp::AllReduce
            || dtype != DType::F32
            || !matches!(redop, ReduceKind::Sum | ReduceKind::Mean))
    {
        return Ok(Reply::Skip(
            "compression applies to f32 sum and mean all-reduces".to_owned(),
        ));
    }
    let count = step.count;
    let block = if step.op.blocked() {
        count / u64::from(world)
    } else {
        count
    };
    let mut buffers = Buffers::for_step(step, redop, rank, world, block);
    let micros = timed_iterations(group, step, redop, &mut buffers, clock)?;
    let wire_bytes = buffers
        .compressed
        .as_ref()
        .map(|(_, _, compressor)| compressor.last_wire_bytes());
    let wrong = count_wrong(group, step, redop, block, &buffers);
    // Outside the timed region: the slowest rank's time per iteration and the total of wrong
    // elements over every rank.
    let mut slowest: Vec<u8> = micros.iter().flat_map(|t| t.to_le_bytes()).collect();
    group.all_reduce_typed(&mut slowest, DType::F64, ReduceKind::Max)?;
    let mut wrong_total = i64::try_from(wrong).unwrap_or(i64::MAX).to_le_bytes();
    group.all_reduce_typed(&mut wrong_total, DType::I64, ReduceKind::Sum)?;
    let micros = slowest
        .chunks_exact(8)
        .map(|c| f64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
        .collect();
    Ok(Reply::Ran {
        wrong: u64::try_from(i64::from_le_bytes(wrong_total)).unwrap_or(0),
        micros,
        wire_bytes,
    })
}

impl Buffers {
    /// The buffers of `step` on `rank` of `world` (`block` elements per rank for the blocked
    /// operations): inputs from the check's values, outputs poisoned.
    fn for_step(step: &Step, redop: ReduceKind, rank: u32, world: u32, block: u64) -> Buffers {
        let (dtype, count) = (step.dtype, step.count);
        let pristine = match step.op {
            // A compressed all-reduce keeps its f32 buffers of its own (see below).
            _ if step.compression.is_some() => Vec::new(),
            BenchOp::AllReduce
            | BenchOp::AllReduceMany
            | BenchOp::AllReduceEach
            | BenchOp::Reduce
            | BenchOp::ReduceScatter => check::encode(
                dtype,
                (0..count).map(|i| check::reduce_input(redop, rank, world, i)),
            ),
            BenchOp::Broadcast if rank != 0 => check::encode(dtype, (0..count).map(|_| POISON)),
            BenchOp::Broadcast => check::encode(dtype, (0..count).map(|i| check::data_value(0, i))),
            BenchOp::AllGather | BenchOp::Gather => {
                check::encode(dtype, (0..block).map(|i| check::data_value(rank, i)))
            }
            BenchOp::Scatter if rank != 0 => Vec::new(),
            BenchOp::Scatter => check::encode(dtype, (0..count).map(|i| check::data_value(0, i))),
            BenchOp::AllToAll | BenchOp::SendRecv => {
                check::encode(dtype, (0..count).map(|i| check::data_value(rank, i)))
            }
        };
        let compressed = step.compression.map(|compression| {
            let values: Vec<f32> = (0..count)
                .map(|i| check::reduce_input(redop, rank, world, i) as f32)
                .collect();
            (values.clone(), values, Compressor::new(compression))
        });
        let out_count = match step.op {
            _ if step.compression.is_some() => 0,
            BenchOp::ReduceScatter | BenchOp::Scatter => block,
            BenchOp::Gather if rank != 0 => 0,
            BenchOp::AllGather | BenchOp::AllToAll | BenchOp::SendRecv | BenchOp::Gather => count,
            BenchOp::AllReduce
            | BenchOp::AllReduceMany
            | BenchOp::AllReduceEach
            | BenchOp::Reduce
            | BenchOp::Broadcast => 0,
        };
        let poison = check::encode(dtype, (0..out_count).map(|_| POISON));
        Buffers {
            work: pristine.clone(),
            pristine,
            out: poison.clone(),
            poison,
            compressed,
        }
    }
}

/// Runs `step`'s warm-up and timed iterations on `buffers`, each after a barrier and timed on
/// `clock`; returns this rank's time of each timed iteration, in microseconds.
fn timed_iterations(
    group: &ProcessGroup,
    step: &Step,
    redop: ReduceKind,
    buffers: &mut Buffers,
    clock: &dyn Fn() -> Duration,
) -> Result<Vec<f64>, CollectiveError> {
    let total = step.warmup + step.iters.max(1);
    let mut micros = Vec::with_capacity(total as usize);
    for iteration in 0..total {
        let in_place = matches!(
            step.op,
            BenchOp::AllReduce
                | BenchOp::AllReduceMany
                | BenchOp::AllReduceEach
                | BenchOp::Reduce
                | BenchOp::Broadcast
        );
        if let Some((pristine, work, _)) = &mut buffers.compressed {
            work.copy_from_slice(pristine);
        } else if in_place {
            buffers.work.copy_from_slice(&buffers.pristine);
        }
        if iteration + 1 == total {
            buffers.out.copy_from_slice(&buffers.poison);
        }
        group.barrier()?;
        let started = clock();
        once(group, step, redop, buffers)?;
        let elapsed = clock().saturating_sub(started);
        if iteration >= step.warmup {
            micros.push(elapsed.as_secs_f64() * 1e6);
        }
    }
    Ok(micros)
}

/// `work` (`count` elements of `size` bytes) cut into the gradient tensors of
/// [`measure::gradient_tensors`].
fn gradient_views(work: &mut [u8], count: u64, size: usize) -> Vec<&mut [u8]> {
    let mut rest = work;
    let mut views = Vec::new();
    for len in measure::gradient_tensors(count) {
        let (head, tail) = rest.split_at_mut((len * size).min(rest.len()));
        views.push(head);
        rest = tail;
    }
    views
}

/// One timed operation.
fn once(
    group: &ProcessGroup,
    step: &Step,
    redop: ReduceKind,
    b: &mut Buffers,
) -> Result<(), CollectiveError> {
    let dtype = step.dtype;
    if let Some((_, work, compressor)) = &mut b.compressed {
        return group.all_reduce_compressed(work, redop, compressor);
    }
    match step.op {
        BenchOp::AllReduce => group.all_reduce_typed(&mut b.work, dtype, redop),
        BenchOp::AllReduceMany => {
            let mut tensors = gradient_views(&mut b.work, step.count, dtype.size());
            group.all_reduce_many_typed(&mut tensors, dtype, redop)
        }
        BenchOp::AllReduceEach => {
            for tensor in gradient_views(&mut b.work, step.count, dtype.size()) {
                group.all_reduce_typed(tensor, dtype, redop)?;
            }
            Ok(())
        }
        BenchOp::Reduce => group.reduce_typed(0, &mut b.work, dtype, redop),
        BenchOp::Broadcast => group.broadcast_typed(0, &mut b.work, dtype),
        BenchOp::ReduceScatter => {
            group.reduce_scatter_typed_into(&b.pristine, &mut b.out, dtype, redop)
        }
        BenchOp::AllGather => group.all_gather_typed_into(&b.pristine, &mut b.out, dtype),
        BenchOp::AllToAll => group.all_to_all_typed_into(&b.pristine, &mut b.out, dtype),
        BenchOp::Gather => group.gather_typed_into(0, &b.pristine, &mut b.out, dtype),
        BenchOp::Scatter => group.scatter_typed(0, &b.pristine, &mut b.out, dtype),
        BenchOp::SendRecv => {
            let world = group.world_size();
            let next = (group.rank() + 1) % world;
            let prev = (group.rank() + world - 1) % world;
            group
                .send_recv_typed(next, &b.pristine, prev, &mut b.out, SENDRECV_TAG, dtype)
                .map(|_| ())
        }
    }
}

/// This rank's wrong elements after the last iteration.
fn count_wrong(
    group: &ProcessGroup,
    step: &Step,
    redop: ReduceKind,
    block: u64,
    b: &Buffers,
) -> u64 {
    let (rank, world, dtype, count) = (group.rank(), group.world_size(), step.dtype, step.count);
    let reduced = |i| check::reduce_expected(redop, dtype, world, i);
    if let (Some((_, work, _)), Some(compression)) = (&b.compressed, step.compression) {
        let bytes: Vec<u8> = work.iter().flat_map(|x| x.to_le_bytes()).collect();
        let allowed = check::compressed_tolerance(compression, redop, world);
        return check::count_wrong_within(dtype, &bytes, count, reduced, |_| allowed);
    }
    match step.op {
        BenchOp::AllReduce | BenchOp::AllReduceMany | BenchOp::AllReduceEach => {
            check::count_wrong(dtype, &b.work, count, reduced)
        }
        BenchOp::Reduce if rank == 0 => check::count_wrong(dtype, &b.work, count, reduced),
        BenchOp::Reduce => 0,
        BenchOp::Broadcast => {
            check::count_wrong(dtype, &b.work, count, |i| check::data_value(0, i))
        }
        BenchOp::ReduceScatter => {
            let start = u64::from(rank) * block;
            check::count_wrong(dtype, &b.out, block, |i| reduced(start + i))
        }
        BenchOp::AllGather => check::count_wrong(dtype, &b.out, count, |i| {
            check::data_value((i / block) as u32, i % block)
        }),
        BenchOp::AllToAll => check::count_wrong(dtype, &b.out, count, |i| {
            check::data_value((i / block) as u32, u64::from(rank) * block + i % block)
        }),
        BenchOp::SendRecv => {
            let prev = (rank + world - 1) % world;
            check::count_wrong(dtype, &b.out, count, |i| check::data_value(prev, i))
        }
        BenchOp::Gather if rank == 0 => check::count_wrong(dtype, &b.out, count, |i| {
            check::data_value((i / block) as u32, i % block)
        }),
        BenchOp::Gather => 0,
        BenchOp::Scatter => check::count_wrong(dtype, &b.out, block, |i| {
            check::data_value(0, u64::from(rank) * block + i)
        }),
    }
}
