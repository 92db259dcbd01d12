//! The conformance suite: runs every collective × dtype × reduction × awkward size (× every
//! forced algorithm and several roots) on a [`ProcessGroup`] and checks every result byte
//! against a serial reference computed locally.
//!
//! Each rank calls [`run`] with the same [`ConformanceOptions`]; the cases are enumerated in
//! the same order everywhere, so they match like any other collectives. Inputs come from
//! (seed, case, rank), so each rank computes the reference for every rank's data without
//! communication. Integer results and Max/Min must match exactly; float sums, means and
//! products within the bound stated in `reference.rs`. Results that must be identical on all
//! ranks (all-reduce, all-gather, broadcast) are hashed and the hashes all-gathered, so a
//! rank-dependent rounding fails the case on every rank.
//!
//! The same entry point serves the thread-per-rank tests over [`MemTransport`] and the worker
//! processes of `cargo xtask test-cluster` over TCP.
//!
//! # Examples
//!
//! ```
//! use std::sync::Arc;
//! use rlx_collective::conformance::{self, ConformanceOptions};
//! use rlx_collective::{CollectiveOp, DType, MemTransport, ProcessGroup, Transport};
//!
//! let options = ConformanceOptions {
//!     ops: vec![CollectiveOp::AllReduce, CollectiveOp::Broadcast],
//!     dtypes: vec![DType::F32, DType::I8],
//!     sizes: vec![0, 7, 1000],
//!     ..ConformanceOptions::default()
//! };
//! let workers: Vec<_> = MemTransport::fan_out(3)
//!     .into_iter()
//!     .map(|t| {
//!         let options = options.clone();
//!         std::thread::spawn(move || {
//!             conformance::run(&ProcessGroup::new(t as Arc<dyn Transport>), &options)
//!         })
//!     })
//!     .collect();
//! for w in workers {
//!     let report = w.join().unwrap()?;
//!     assert_eq!(report.failures().count(), 0, "{}", report.summary());
//! }
//! # Ok::<(), rlx_collective::CollectiveError>(())
//! ```
//!
//! [`MemTransport`]: crate::MemTransport

mod data;
pub use data::SplitMix;
pub mod reference;

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use reference::Expected;

use crate::layout;
use crate::{Algorithm, CollectiveOp, DType, ProcessGroup, ReduceKind, Result};

/// The element counts every case runs with unless told otherwise: empty, tiny, odd, not
/// divisible by any world size, and past a 32 KiB segment boundary.
pub const DEFAULT_SIZES: [usize; 7] = [0, 1, 2, 7, 13, 1000, 65537];

/// Called after each case with its result (e.g. to print progress).
pub type ProgressFn = Arc<dyn Fn(&CaseResult) + Send + Sync>;

/// What [`run`] checks. Every rank must pass the same options.
#[derive(Clone)]
pub struct ConformanceOptions {
    /// The collectives to check.
    pub ops: Vec<CollectiveOp>,
    /// The element types.
    pub dtypes: Vec<DType>,
    /// The reductions (for all-reduce, reduce and reduce-scatter).
    pub reduces: Vec<ReduceKind>,
    /// Element counts per rank (per block for scatter and all-to-all).
    pub sizes: Vec<usize>,
    /// Also force each algorithm of [`CollectiveOp::algorithms`], not only `Auto`.
    pub algorithms: bool,
    /// Every rank as root for the rooted collectives (else rank 0 and the last rank).
    pub all_roots: bool,
    /// Caps the segment size for the whole run (so small sizes take multi-segment paths).
    pub max_segment_bytes: Option<usize>,
    /// Seed of the input data.
    pub seed: u64,
    /// Called after every case.
    pub progress: Option<ProgressFn>,
}

impl Default for ConformanceOptions {
    fn default() -> Self {
        ConformanceOptions {
            ops: CollectiveOp::ALL.to_vec(),
            dtypes: DType::ALL.to_vec(),
            reduces: ReduceKind::ALL.to_vec(),
            sizes: DEFAULT_SIZES.to_vec(),
            algorithms: true,
            all_roots: false,
            max_segment_bytes: None,
            seed: 0x5EED,
            progress: None,
        }
    }
}

impl ConformanceOptions {
    /// A CI-sized run: every collective, dtype and reduction on the sizes 0, 1, 7 and 1000,
    /// with each algorithm, and a 256-byte segment cap so that 1000 elements take the
    /// multi-segment paths.
    pub fn quick() -> Self {
        ConformanceOptions {
            sizes: vec![0, 1, 7, 1000],
            max_segment_bytes: Some(256),
            ..ConformanceOptions::default()
        }
    }
}

impl fmt::Debug for ConformanceOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConformanceOptions")
            .field("ops", &self.ops)
            .field("dtypes", &self.dtypes)
            .field("reduces", &self.reduces)
            .field("sizes", &self.sizes)
            .field("algorithms", &self.algorithms)
            .field("all_roots", &self.all_roots)
            .field("max_segment_bytes", &self.max_segment_bytes)
            .field("seed", &self.seed)
            .field("progress", &self.progress.is_some())
            .finish()
    }
}

/// The outcome of one case on this rank.
#[derive(Clone, Debug)]
pub struct CaseResult {
    /// A readable name, e.g. `all_reduce/f16/mean/n=13/ring`.
    pub name: String,
    /// The collective.
    pub op: CollectiveOp,
    /// The element type.
    pub dtype: DType,
    /// The reduction, for the reducing collectives.
    pub reduce: Option<ReduceKind>,
    /// Elements per rank (per block for scatter and all-to-all).
    pub count: usize,
    /// The forced algorithm (`Auto` when none).
    pub algorithm: Algorithm,
    /// The root, for the rooted collectives.
    pub root: Option<u32>,
    /// Whether every check passed.
    pub passed: bool,
    /// Why it failed (empty when it passed).
    pub detail: String,
    /// Wall time of the collective call itself.
    pub elapsed: Duration,
}

/// Every case's result on this rank.
#[derive(Clone, Debug)]
pub struct Report {
    rank: u32,
    world_size: u32,
    cases: Vec<CaseResult>,
}

impl Report {
    /// Every case, in the order run.
    pub fn cases(&self) -> &[CaseResult] {
        &self.cases
    }

    /// The cases that failed.
    pub fn failures(&self) -> impl Iterator<Item = &CaseResult> {
        self.cases.iter().filter(|c| !c.passed)
    }

    /// Whether every case passed.
    pub fn passed(&self) -> bool {
        self.cases.iter().all(|c| c.passed)
    }

    /// The rank this report is from.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// A short text summary: counts, then one line per failure.
    pub fn summary(&self) -> String {
        let failed = self.failures().count();
        let mut s = format!(
            "rank {}/{}: {} cases, {} passed, {failed} failed",
            self.rank,
            self.world_size,
            self.cases.len(),
            self.cases.len() - failed
        );
        for case in self.failures() {
            s.push_str(&format!("\n  FAIL {}: {}", case.name, case.detail));
        }
        s
    }
}

#[derive(Clone, Copy, Debug)]
struct Case {
    index: u64,
    op: CollectiveOp,
    dtype: DType,
    reduce: Option<ReduceKind>,
    count: usize,
    algorithm: Algorithm,
    root: Option<u32>,
}

impl Case {
    fn name(&self) -> String {
        let mut s = format!("{}/{}", self.op, self.dtype);
        if let Some(r) = self.reduce {
            s.push_str(&format!("/{r}"));
        }
        if let Some(root) = self.root {
            s.push_str(&format!("/root={root}"));
        }
        s.push_str(&format!("/n={}/{}", self.count, self.algorithm));
        s
    }
}

/// The cases of `options` on `group`; forced algorithms the group cannot run (the one-sided
/// all-reduce without a symmetric heap) are left out.
fn enumerate(options: &ConformanceOptions, group: &ProcessGroup) -> Vec<Case> {
    let world = group.world_size();
    let mut roots: Vec<u32> = if options.all_roots {
        (0..world).collect()
    } else {
        vec![0, world.saturating_sub(1)]
    };
    roots.dedup();
    let mut cases = Vec::new();
    let mut push = |op, dtype, reduce, count, algorithm, root| {
        cases.push(Case {
            index: cases.len() as u64,
            op,
            dtype,
            reduce,
            count,
            algorithm,
            root,
        });
    };
    for &op in &options.ops {
        let algorithms: Vec<Algorithm> = if options.algorithms {
            op.algorithms()
                .iter()
                .copied()
                .filter(|&a| group.supports_algorithm(op, a))
                .collect()
        } else {
            vec![Algorithm::Auto]
        };
        if op == CollectiveOp::Barrier {
            push(op, DType::U8, None, 0, Algorithm::Auto, None);
            continue;
        }
        for &dtype in &options.dtypes {
            for &count in &options.sizes {
                let reduces: Vec<Option<ReduceKind>> = match op {
                    CollectiveOp::AllReduce
                    | CollectiveOp::Reduce
                    | CollectiveOp::ReduceScatter => {
                        options.reduces.iter().copied().map(Some).collect()
                    }
                    _ => vec![None],
                };
                let rooted = matches!(
                    op,
                    CollectiveOp::Reduce
                        | CollectiveOp::Gather
                        | CollectiveOp::Scatter
                        | CollectiveOp::Broadcast
                );
                let case_roots: Vec<Option<u32>> = if rooted {
                    roots.iter().copied().map(Some).collect()
                } else {
                    vec![None]
                };
                for &reduce in &reduces {
                    for &root in &case_roots {
                        for &algorithm in &algorithms {
                            push(op, dtype, reduce, count, algorithm, root);
                        }
                    }
                }
            }
        }
    }
    cases
}

/// FNV-1a over a result, to compare results across ranks cheaply (never 0, which stands for
/// "no result").
fn fingerprint(bytes: &[u8]) -> u64 {
    let h = bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    h.max(1)
}

struct Outcome {
    /// `Err` carries why the result is wrong; a collective error is returned separately.
    verdict: std::result::Result<(), String>,
    /// The result to compare across ranks, for the collectives whose results must match.
    shared_result: Option<Vec<u8>>,
    elapsed: Duration,
}

/// Runs every case of `options` on `group` and reports each one. Every member must call it
/// with the same options, and nothing else should use the group meanwhile: the run forces
/// algorithms and the segment cap on the group (and its clones) and restores them at the end.
///
/// A case whose collective fails with a recoverable error (a wrong length, an invalid
/// argument) is recorded as failed and the run goes on; an error that leaves the group
/// unusable ([`crate::CollectiveError::is_fatal`]) ends the run with that error.
pub fn run(group: &ProcessGroup, options: &ConformanceOptions) -> Result<Report> {
    let saved_segment = group.max_segment_bytes();
    let saved: Vec<(CollectiveOp, Algorithm)> = CollectiveOp::ALL
        .iter()
        .map(|&op| (op, group.algorithm(op)))
        .collect();
    group.set_max_segment_bytes(options.max_segment_bytes);
    let result = run_cases(group, options);
    group.set_max_segment_bytes(saved_segment);
    for (op, algorithm) in saved {
        // Restoring a value that was accepted before cannot fail.
        let _ = group.set_algorithm(op, algorithm);
    }
    result
}

fn run_cases(group: &ProcessGroup, options: &ConformanceOptions) -> Result<Report> {
    let world = group.world_size();
    let mut report = Report {
        rank: group.rank(),
        world_size: world,
        cases: Vec::new(),
    };
    for case in enumerate(options, group) {
        group.set_algorithm(case.op, case.algorithm)?;
        let outcome = match run_case(group, options, &case) {
            Ok(outcome) => outcome,
            Err(error) if error.is_fatal() => return Err(error),
            Err(error) => Outcome {
                verdict: Err(format!("collective failed: {error}")),
                shared_result: None,
                elapsed: Duration::ZERO,
            },
        };
        let mut verdict = outcome.verdict;
        // Whether to compare depends on the case only, never on this rank's outcome, so that
        // every rank issues the same collectives.
        let must_match = matches!(
            case.op,
            CollectiveOp::AllReduce | CollectiveOp::AllGather | CollectiveOp::Broadcast
        );
        if must_match {
            let hash = outcome.shared_result.as_deref().map_or(0, fingerprint);
            let hashes = group.all_gather_typed(&hash.to_le_bytes(), DType::U8)?;
            let mine = &hashes[group.rank() as usize * 8..][..8];
            if let Some(other) = hashes.chunks_exact(8).position(|h| h != mine) {
                if verdict.is_ok() {
                    verdict = Err(format!("result differs from rank {other}'s"));
                }
            }
        }
        let result = CaseResult {
            name: case.name(),
            op: case.op,
            dtype: case.dtype,
            reduce: case.reduce,
            count: case.count,
            algorithm: case.algorithm,
            root: case.root,
            passed: verdict.is_ok(),
            detail: verdict.err().unwrap_or_default(),
            elapsed: outcome.elapsed,
        };
        if let Some(progress) = &options.progress {
            progress(&result);
        }
        report.cases.push(result);
    }
    Ok(report)
}

fn run_case(group: &ProcessGroup, options: &ConformanceOptions, case: &Case) -> Result<Outcome> {
    let n = group.world_size();
    let me = group.rank();
    let dtype = case.dtype;
    let esize = dtype.size();
    let input = |rank: u32, count: usize| {
        data::input(dtype, case.reduce, options.seed, case.index, rank, count)
    };
    let all_inputs = |count: usize| (0..n).map(|r| input(r, count)).collect::<Vec<_>>();
    let root = case.root.unwrap_or(0);
    let count = case.count;
    let reduce = case.reduce.unwrap_or(ReduceKind::Sum);
    // Times only the collective call, not the input generation or the reference.
    let timed = |call: &mut dyn FnMut() -> Result<()>| -> Result<Duration> {
        let start = Instant::now();
        call()?;
        Ok(start.elapsed())
    };
    let outcome = |verdict, shared_result, elapsed| Outcome {
        verdict,
        shared_result,
        elapsed,
    };
    match case.op {
        CollectiveOp::AllReduce => {
            let mut data = input(me, count);
            let elapsed = timed(&mut || group.all_reduce_typed(&mut data, dtype, reduce))?;
            let expected = reference::reduce(dtype, reduce, &all_inputs(count));
            let verdict = reference::check(&data, &expected);
            Ok(outcome(verdict, Some(data), elapsed))
        }
        CollectiveOp::Reduce => {
            let original = input(me, count);
            let mut data = original.clone();
            let elapsed = timed(&mut || group.reduce_typed(root, &mut data, dtype, reduce))?;
            let verdict = if me == root {
                reference::check(&data, &reference::reduce(dtype, reduce, &all_inputs(count)))
            } else if data != original {
                Err("a non-root rank's buffer changed".to_owned())
            } else {
                Ok(())
            };
            Ok(outcome(verdict, None, elapsed))
        }
        CollectiveOp::ReduceScatter => {
            let data = input(me, count);
            let mut block = Vec::new();
            let elapsed = timed(&mut || {
                block = group.reduce_scatter_typed(&data, dtype, reduce)?;
                Ok(())
            })?;
            let expected = reference::reduce(dtype, reduce, &all_inputs(count));
            let mine = layout::balanced(count, n as usize, me as usize);
            let verdict = reference::check(&block, &reference::slice(&expected, esize, mine));
            Ok(outcome(verdict, None, elapsed))
        }
        CollectiveOp::AllGather => {
            let local = input(me, count);
            let mut out = Vec::new();
            let elapsed = timed(&mut || {
                out = group.all_gather_typed(&local, dtype)?;
                Ok(())
            })?;
            let verdict = reference::check(&out, &Expected::Bytes(all_inputs(count).concat()));
            Ok(outcome(verdict, Some(out), elapsed))
        }
        CollectiveOp::Gather => {
            let local = input(me, count);
            let mut out = None;
            let elapsed = timed(&mut || {
                out = group.gather_typed(root, &local, dtype)?;
                Ok(())
            })?;
            let verdict = match (me == root, out) {
                (true, Some(out)) => {
                    reference::check(&out, &Expected::Bytes(all_inputs(count).concat()))
                }
                (false, None) => Ok(()),
                (true, None) => Err("the root got no result".to_owned()),
                (false, Some(_)) => Err("a non-root rank got a result".to_owned()),
            };
            Ok(outcome(verdict, None, elapsed))
        }
        CollectiveOp::Scatter => {
            let full = input(root, count * n as usize);
            let send = if me == root { full.clone() } else { Vec::new() };
            let mut recv = vec![0u8; count * esize];
            let elapsed = timed(&mut || group.scatter_typed(root, &send, &mut recv, dtype))?;
            let block = count * esize;
            let want = full[me as usize * block..(me as usize + 1) * block].to_vec();
            let verdict = reference::check(&recv, &Expected::Bytes(want));
            Ok(outcome(verdict, None, elapsed))
        }
        CollectiveOp::Broadcast => {
            let expected = input(root, count);
            let mut data = if me == root {
                expected.clone()
            } else {
                vec![0u8; count * esize]
            };
            let elapsed = timed(&mut || group.broadcast_typed(root, &mut data, dtype))?;
            let verdict = reference::check(&data, &Expected::Bytes(expected));
            Ok(outcome(verdict, Some(data), elapsed))
        }
        CollectiveOp::AllToAll => {
            let send = input(me, count * n as usize);
            let mut out = Vec::new();
            let elapsed = timed(&mut || {
                out = group.all_to_all_typed(&send, dtype)?;
                Ok(())
            })?;
            let block = count * esize;
            let want: Vec<u8> = all_inputs(count * n as usize)
                .iter()
                .flat_map(|send| send[me as usize * block..(me as usize + 1) * block].to_vec())
                .collect();
            let verdict = reference::check(&out, &Expected::Bytes(want));
            Ok(outcome(verdict, None, elapsed))
        }
        CollectiveOp::Barrier => {
            let elapsed = timed(&mut || group.barrier())?;
            Ok(outcome(Ok(()), None, elapsed))
        }
    }
}
