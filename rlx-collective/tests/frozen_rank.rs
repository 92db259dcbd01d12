//! A rank frozen in the middle of an all-reduce loop is the rank every survivor names, as a
//! user's fault drill sees it: four processes over TCP on loopback with the default heartbeat
//! and fast paths, a 4 MiB `f32` all-reduce in a loop, one rank stopped with SIGSTOP, every
//! survivor exiting at its first error as a training script would. Each survivor's error must
//! name the frozen rank and no other, and describe it as silent (or say it heard of it from
//! another survivor), never as a process that closed its connection.
//!
//! Before the fix this checks, a survivor whose ring exchange had received its part but was
//! still sending to the frozen rank stopped reading the rank it had received from, missed its
//! heartbeats, and declared that live rank silent too; whichever loss reached the others first
//! was named (wrong in about 1 of 70 survivor errors; more with `RLX_DEBUG`). That mechanism
//! is checked deterministically by rlx-net's `tcp_liveness`
//! (`an_exchange_stuck_sending_still_hears_its_other_peer`); this drill checks the outcome a
//! user sees.
//!
//! Three trials, the frozen rank 1, 2 and 3 in turn; `FROZEN_TRIALS=100 cargo test -p
//! rlx-collective --test frozen_rank` runs the long form.

#![cfg(all(feature = "tcp", unix))]

mod common;

use std::io::{BufRead, BufReader, Read};
use std::process::Child;
use std::sync::Arc;
use std::time::Duration;

use common::Reaper;
use rlx_collective::{ProcessGroup, ReduceKind, Transport};

/// Set in a re-executed copy of this test binary: `rank,world,port` of the rank it runs.
const WORKER: &str = "RLX_FROZEN_RANK_WORKER";
/// The test that re-executes itself, as libtest names it.
const PROCESS_TEST: &str = "every_survivor_names_the_frozen_rank";
const WORLD: u32 = 4;
/// What a rank prints once its first all-reduce is done (libtest prints its own lines too).
const RUNNING: &str = "frozen-rank: running";
/// What a rank prints when it could not join the world.
const NO_WORLD: &str = "frozen-rank no world";
/// What a rank prints, before its error, when an all-reduce fails.
const FAILED: &str = "frozen-rank error: ";
/// Elements of each all-reduce: 4 MiB, a ring of large exchanges.
const ELEMENTS: usize = 1 << 20;
/// Far above the heartbeat's detection window (5 s): the silence rule, not the operation
/// timeout, finds the frozen rank.
const OP_TIMEOUT: Duration = Duration::from_secs(60);

fn worker(spec: &str) {
    let (rank, n, port) = common::worker_spec(spec);
    let transport = match common::loopback_builder(rank, n, port, OP_TIMEOUT).build() {
        Ok(transport) => transport,
        Err(error) => {
            println!("{NO_WORLD}: {error}");
            std::process::exit(2);
        }
    };
    let group = ProcessGroup::new(Arc::new(transport) as Arc<dyn Transport>);
    let mut x = vec![1.0f32; ELEMENTS];
    for round in 0u64.. {
        if let Err(error) = group.all_reduce(&mut x, ReduceKind::Sum) {
            println!("{FAILED}{error}");
            std::process::exit(3);
        }
        assert!(
            x.iter().all(|&v| v == n as f32),
            "rank {rank}: round {round} is not exact"
        );
        x.fill(1.0);
        if round == 0 {
            println!("{RUNNING}");
        }
    }
}

/// Reads a rank's output until a line holding `marker` (or saying that the rank could not
/// join the world), and returns the line from there on; `None` when the output ends first.
/// libtest writes `test NAME ... ` before the test's first line, so a marker need not start
/// its line.
fn line_with(lines: &mut impl BufRead, marker: &str) -> Option<String> {
    let mut line = String::new();
    loop {
        line.clear();
        if lines.read_line(&mut line).expect("a worker's output") == 0 {
            return None;
        }
        let found = [marker, NO_WORLD].iter().find_map(|m| line.find(m));
        if let Some(at) = found {
            return Some(line[at..].trim_end().to_owned());
        }
    }
}

/// Everything `child` wrote to its standard error, after ending it.
fn stderr_of(child: &mut Child) -> String {
    let _ = child.kill();
    let mut text = String::new();
    if let Some(mut err) = child.stderr.take() {
        let _ = err.read_to_string(&mut text);
    }
    text
}

/// Whether `error`, a survivor's, names `frozen` as the lost rank, and only it, without
/// calling it a process that closed its connection.
fn names_only(error: &str, frozen: u32) -> bool {
    let frozen = frozen.to_string();
    let named: Vec<&str> = error
        .split("peer rank ")
        .skip(1)
        .map(|rest| {
            let end = rest
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(rest.len());
            &rest[..end]
        })
        .collect();
    !named.is_empty() && named.iter().all(|r| *r == frozen) && !error.contains("closed")
}

/// One trial: four ranks, `frozen` stopped once it has run a round; returns each survivor's
/// error line.
fn trial(frozen: u32) -> Vec<(u32, String)> {
    let port = common::free_port();
    let mut reaper = Reaper(
        (0..WORLD)
            .map(|rank| {
                common::spawn_worker(PROCESS_TEST, WORKER, format!("{rank},{WORLD},{port}"))
            })
            .collect(),
    );
    let mut outputs: Vec<_> = reaper
        .0
        .iter_mut()
        .map(|child| BufReader::new(child.stdout.take().expect("a worker's stdout")))
        .collect();
    match line_with(&mut outputs[frozen as usize], RUNNING) {
        Some(line) if line == RUNNING => {}
        other => {
            let child = &mut reaper.0[frozen as usize];
            panic!(
                "rank {frozen} did not run ({other:?}): {}",
                stderr_of(child)
            );
        }
    }
    if common::freeze(&reaper.0[frozen as usize]).is_err() {
        let child = &mut reaper.0[frozen as usize];
        panic!(
            "rank {frozen} ended instead of stopping: {}",
            stderr_of(child)
        );
    }
    let mut errors = Vec::new();
    for rank in (0..WORLD).filter(|&r| r != frozen) {
        match line_with(&mut outputs[rank as usize], FAILED) {
            Some(line) if line.starts_with(NO_WORLD) => panic!("rank {rank}: {line}"),
            Some(line) => errors.push((rank, line)),
            None => {
                let child = &mut reaper.0[rank as usize];
                panic!("rank {rank} ended without an error: {}", stderr_of(child));
            }
        }
    }
    errors
}

#[test]
fn every_survivor_names_the_frozen_rank() {
    if let Ok(spec) = std::env::var(WORKER) {
        worker(&spec);
        return;
    }
    let trials: u32 = std::env::var("FROZEN_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let mut wrong = Vec::new();
    for t in 0..trials {
        let frozen = 1 + t % (WORLD - 1);
        for (rank, error) in trial(frozen) {
            if !names_only(&error, frozen) {
                wrong.push(format!(
                    "trial {t}, rank {frozen} frozen: rank {rank}: {error}"
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} survivor errors named another rank or called the frozen one closed:\n{}",
        wrong.len(),
        trials * (WORLD - 1),
        wrong.join("\n")
    );
}
