//! The end of a job over TCP, across real processes: ranks that finish with
//! `ProcessGroup::finalize`, or that simply drop their group and exit as soon as their last
//! operation returned, end the job without a failed operation anywhere and without a warning
//! or an "aborted" line in their `info` diagnostics.
//!
//! The test re-executes its own binary once per rank; each rank writes its diagnostics (at
//! `info`) to its stderr, which the parent reads once the rank has exited.

#![cfg(all(feature = "tcp", unix))]

mod common;

use std::io::Read;
use std::sync::Arc;
use std::time::Duration;

use rlx_collective::{ProcessGroup, ReduceKind, Transport, bf16};

/// Set in a re-executed copy of this test binary: `rank,world,port,mode` of the rank it runs.
const WORKER: &str = "RLX_CLEAN_EXIT_WORKER";
/// The test that re-executes itself, as libtest names it.
const PROCESS_TEST: &str = "ranks_that_finish_end_the_job_quietly";
/// Ranks in the job.
const RANKS: u32 = 4;
/// Generous: a rank on a loaded machine is never taken for dead by these checks.
const OP_TIMEOUT: Duration = Duration::from_secs(60);

/// One rank: a few operations of every size class, then its end by `mode`.
fn worker(spec: &str) {
    let (prefix, mode) = spec.rsplit_once(',').expect("rank,world,port,mode");
    let (rank, n, port) = common::worker_spec(prefix);
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(tracing::Level::INFO)
        .init();
    let transport = common::loopback_builder(rank, n, port, OP_TIMEOUT)
        .build()
        .expect("a loopback world");
    let group = ProcessGroup::new(Arc::new(transport) as Arc<dyn Transport>);
    // 1 element, a prime count, and 8 MiB (large enough for the same-host paths).
    for len in [1usize, 4099, 2 << 20] {
        let mut x = vec![1.0f32; len];
        group
            .all_reduce(&mut x, ReduceKind::Sum)
            .expect("all_reduce");
        assert!(x.iter().all(|v| *v == n as f32), "all_reduce of {len}");
    }
    let hidden = vec![bf16::from_f32(0.25); 300_000];
    let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
    group.send(next, 3, &hidden).expect("send");
    let got: Vec<bf16> = group.recv(prev, 3).expect("recv");
    assert_eq!(got, hidden);
    let mut last = vec![rank as i64; 1 << 20];
    group
        .all_reduce(&mut last, ReduceKind::Max)
        .expect("the last all_reduce");
    assert!(last.iter().all(|v| *v == i64::from(n - 1)));
    match mode {
        "finalize" => group.finalize().expect("finalize"),
        // Leaves as soon as its last operation returned, while others may still be in it.
        _ => drop(group),
    }
    println!("finished");
}

#[test]
fn ranks_that_finish_end_the_job_quietly() {
    if let Ok(spec) = std::env::var(WORKER) {
        worker(&spec);
        return;
    }
    for mode in ["finalize", "drop"] {
        let port = common::free_port();
        let mut reaper = common::Reaper(
            (0..RANKS)
                .map(|rank| {
                    common::spawn_worker(
                        PROCESS_TEST,
                        WORKER,
                        format!("{rank},{RANKS},{port},{mode}"),
                    )
                })
                .collect(),
        );
        for (rank, child) in reaper.0.iter_mut().enumerate() {
            let mut stdout = String::new();
            let mut stderr = String::new();
            child
                .stdout
                .take()
                .expect("piped stdout")
                .read_to_string(&mut stdout)
                .expect("a rank's stdout");
            child
                .stderr
                .take()
                .expect("piped stderr")
                .read_to_string(&mut stderr)
                .expect("a rank's stderr");
            let status = child.wait().expect("a rank's exit");
            assert!(
                status.success() && stdout.contains("finished"),
                "{mode}: rank {rank} failed ({status})\nstdout:\n{stdout}\nstderr:\n{stderr}"
            );
            for noise in ["WARN", "ERROR", "aborted", "peer lost"] {
                assert!(
                    !stderr.contains(noise),
                    "{mode}: rank {rank} logged {noise:?} at its clean end:\n{stderr}"
                );
            }
        }
    }
}
