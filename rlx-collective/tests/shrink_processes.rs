//! `ProcessGroup::shrink` across real processes over TCP on loopback: a rank frozen with
//! SIGSTOP is declared dead by the survivors after the operation timeout; they shrink and
//! run exact collectives without it; when it is resumed with SIGCONT it fails with an error
//! naming itself as excluded (never a silent success), and nothing it sends reaches the
//! survivors.
//!
//! The test re-executes its own binary once per rank. Ranks talk to the parent through
//! their standard streams: each prints `ready` once its transport is up, the survivors print
//! `shrunk` once they have checked their collectives on the new group, and then wait for a
//! line on stdin (sent after the frozen rank has been resumed and has exited) before their
//! final check and exit.

#![cfg(all(feature = "tcp", unix))]

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::Reaper;
use common::checked::{plan, run_checked};
use rlx_collective::{CollectiveError, FatalCause, ProcessGroup, ReduceKind, Tag, Transport};

/// Set in a re-executed copy of this test binary: `rank,world,port` of the rank it runs.
const WORKER: &str = "RLX_SHRINK_PROCESS_WORKER";
/// The test that re-executes itself, as libtest names it.
const PROCESS_TEST: &str = "a_sigstopped_rank_is_excluded_and_fails_when_it_resumes";
/// The operation timeout of the ranks: how long a frozen rank takes to be declared dead. It is
/// also how late a live survivor may be, on a busy machine, before it is taken for dead too,
/// and a tenth of it how long a waiting survivor has to answer another's probe: with 1 s a
/// survivor descheduled for 100 ms could be blamed and left out of the new group.
const OP_TIMEOUT: Duration = Duration::from_secs(5);
/// The ranks' heartbeat interval: a silence window (five beats) far longer than the operation
/// timeout, so that the operation timeout, not the liveness check, declares the frozen rank
/// dead, as this test is about.
const HEARTBEAT: Duration = Duration::from_secs(10);
/// How long the parent gives the whole job.
const BOUND: Duration = Duration::from_secs(90);
/// The rank that is frozen.
const FROZEN: u32 = 2;

fn worker(spec: &str) {
    let (rank, n, port) = common::worker_spec(spec);
    let transport = common::loopback_builder(rank, n, port, OP_TIMEOUT)
        .heartbeat(HEARTBEAT)
        .build()
        .expect("a loopback world");
    let group = ProcessGroup::new(Arc::new(transport) as Arc<dyn Transport>);
    group.barrier().expect("the first barrier");
    println!("ready");
    // The parent freezes rank FROZEN now, while it waits here, and lets the others go on only
    // once it has stopped.
    let mut go = String::new();
    std::io::stdin().read_line(&mut go).expect("the go-ahead");
    let mut x = [1.0f32; 16];
    let first = group.all_reduce(&mut x, ReduceKind::Sum);
    if rank == FROZEN {
        // Resumed long after the survivors went on. Its all-reduce may still complete, and
        // then exactly: with a small buffer (recursive doubling) every input it needs may
        // have reached its socket before it froze, though nobody got its own. Its next
        // all-reduce, its shrink and its sends must fail, each with a clear error.
        let later = match first {
            Ok(()) => {
                assert_eq!(x, [n as f32; 16], "the frozen rank's all-reduce");
                group.all_reduce(&mut x, ReduceKind::Sum)
            }
            failed => failed,
        };
        assert!(
            matches!(&later, Err(e) if e.is_fatal()),
            "the frozen rank's all-reduce: {later:?}"
        );
        match group.shrink() {
            Err(CollectiveError::GroupFailed {
                peer,
                cause: FatalCause::Excluded,
                ..
            }) if peer == FROZEN => {}
            other => panic!("the frozen rank's shrink: {other:?}"),
        }
        for to in (0..n).filter(|&r| r != FROZEN) {
            let sent = group.send(to, 9, &[7.0f32]);
            assert!(sent.is_err(), "a send to rank {to} succeeded");
        }
        println!("excluded");
        return;
    }
    let error = first.expect_err("rank FROZEN is frozen");
    assert!(error.is_fatal(), "{error}");
    let shrunk = group.shrink().expect("the survivors' shrink");
    let survivors: Vec<u32> = (0..n).filter(|&r| r != FROZEN).collect();
    assert_eq!(shrunk.members(), survivors);
    for (step, (op, len)) in plan(u64::from(n), 100).into_iter().enumerate() {
        run_checked(&shrunk, op, step as u64, len)
            .unwrap_or_else(|e| panic!("rank {rank}: {op} step {step} on the shrunk group: {e}"));
    }
    println!("shrunk");
    std::io::stdin()
        .read_line(&mut go)
        .expect("the second go-ahead");
    // The frozen rank has run and exited meanwhile: nothing of it arrived.
    let stray =
        group
            .transport()
            .recv_message(FROZEN, Tag::user(9).expect("a user tag"), Duration::ZERO);
    assert!(
        !matches!(stray, Ok(Some(_))),
        "rank {rank} received the excluded rank's message"
    );
    let mut y = [1.0f32; 5];
    shrunk
        .all_reduce(&mut y, ReduceKind::Sum)
        .expect("the shrunk group still works");
    assert_eq!(y, [survivors.len() as f32; 5]);
    println!("done");
}

/// Reads a rank's stdout until a line ending in `want`, or its end; fails the test past
/// `deadline`.
fn expect_line(lines: &mut impl BufRead, want: &str, rank: usize, deadline: Instant) {
    let mut line = String::new();
    loop {
        assert!(
            Instant::now() < deadline,
            "rank {rank} never printed {want:?}"
        );
        line.clear();
        let read = lines.read_line(&mut line).expect("a worker's output");
        if read == 0 {
            // The rank ended early; `finish` reports how, with what it wrote to stderr.
            return;
        }
        if line.trim_end().ends_with(want) {
            return;
        }
    }
}

/// Lets a rank go on with a line on its stdin; a rank that ended already fails the test with
/// how it ended and what it wrote to stderr (not with the broken pipe).
fn go_ahead(child: &mut Child, rank: usize, deadline: Instant) {
    let stdin = child.stdin.as_mut().expect("a worker's stdin");
    if let Err(e) = stdin.write_all(b"go\n") {
        finish(child, rank, deadline);
        panic!("rank {rank} ended before its go-ahead: {e}");
    }
}

fn signal(child: &Child, which: &str) {
    let status = Command::new("kill")
        .args([which, &child.id().to_string()])
        .status()
        .expect("kill(1)");
    assert!(status.success(), "kill {which} failed");
}

/// Freezes a rank with SIGSTOP and returns once it has stopped (see [`common::freeze`]); a
/// rank that ended instead fails the test with how it ended.
fn freeze(child: &mut Child, rank: usize, deadline: Instant) {
    if common::freeze(child).is_err() {
        finish(child, rank, deadline);
        panic!("rank {rank} ended instead of stopping");
    }
}

fn finish(child: &mut Child, rank: usize, deadline: Instant) {
    loop {
        if let Some(status) = child.try_wait().expect("a worker's state") {
            let mut err = String::new();
            if let Some(mut pipe) = child.stderr.take() {
                let _ = pipe.read_to_string(&mut err);
            }
            assert!(status.success(), "rank {rank} failed ({status}):\n{err}");
            return;
        }
        assert!(Instant::now() < deadline, "rank {rank} is still running");
        thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_sigstopped_rank_is_excluded_and_fails_when_it_resumes() {
    if let Ok(spec) = std::env::var(WORKER) {
        worker(&spec);
        return;
    }
    let n = 4u32;
    let port = rlx_transport::ports::free_loopback_ports(1).expect("a free port")[0];
    let deadline = Instant::now() + BOUND;
    let mut reaper = Reaper(Vec::new());
    for rank in 0..n {
        let spec = format!("{rank},{n},{port}");
        reaper
            .0
            .push(common::spawn_worker(PROCESS_TEST, WORKER, spec));
    }
    let mut outputs: Vec<_> = reaper
        .0
        .iter_mut()
        .map(|c| BufReader::new(c.stdout.take().expect("a worker's stdout")))
        .collect();
    for (rank, out) in outputs.iter_mut().enumerate() {
        expect_line(out, "ready", rank, deadline);
    }
    freeze(&mut reaper.0[FROZEN as usize], FROZEN as usize, deadline);
    for (rank, child) in reaper.0.iter_mut().enumerate() {
        go_ahead(child, rank, deadline);
    }
    for (rank, out) in outputs.iter_mut().enumerate() {
        if rank as u32 != FROZEN {
            expect_line(out, "shrunk", rank, deadline);
        }
    }
    signal(&reaper.0[FROZEN as usize], "-CONT");
    expect_line(
        &mut outputs[FROZEN as usize],
        "excluded",
        FROZEN as usize,
        deadline,
    );
    finish(&mut reaper.0[FROZEN as usize], FROZEN as usize, deadline);
    for (rank, child) in reaper.0.iter_mut().enumerate() {
        if rank as u32 != FROZEN {
            go_ahead(child, rank, deadline);
        }
    }
    for (rank, out) in outputs.iter_mut().enumerate() {
        if rank as u32 != FROZEN {
            expect_line(out, "done", rank, deadline);
            finish(&mut reaper.0[rank], rank, deadline);
        }
    }
}
