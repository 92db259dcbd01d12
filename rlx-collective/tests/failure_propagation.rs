//! Failure propagation: once one rank of a group fails fatally, every other rank fails
//! promptly with an error that names the rank at fault — whatever operation it is in,
//! including a rank that finished operation k and now waits in operation k+1 for a rank that
//! is still stuck in k — and every later operation of the group fails at once. Checked over
//! `MemTransport` and over `TcpTransport` on loopback, for worlds of 2 to 8 ranks.
//!
//! The operation timeout is long (120 s) and the bound on a failure's arrival generous
//! (10 s): a rank that only learns of the failure from its own timeout fails the test, while
//! a loaded machine cannot.

mod common;

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use rlx_collective::{CollectiveError, DType, ProcessGroup, ReduceKind, Transport};

/// Operation timeout of the worlds here: a hang shows up as this long a wait.
const OP_TIMEOUT: Duration = Duration::from_secs(120);
/// How soon every rank must hear of a failure: far below [`OP_TIMEOUT`], far above what the
/// notices need.
const PROMPT: Duration = Duration::from_secs(10);
/// How long the failing rank lets the others run ahead before it goes, so that most of them
/// are already waiting in a later operation when it does.
const HEAD_START: Duration = Duration::from_millis(50);

/// How the failing rank leaves.
#[derive(Clone, Copy, Debug)]
enum Exit {
    /// It aborts its transport.
    Abort,
    /// It drops its transport (its process would have ended).
    Drop,
}

impl Exit {
    fn leave(self, group: ProcessGroup) {
        thread::sleep(HEAD_START);
        match self {
            Exit::Abort => group.transport().abort(),
            Exit::Drop => drop(group),
        }
    }
}

/// The rank an error blames: the lost peer, or the culprit of a group-wide notice.
fn blamed(error: &CollectiveError) -> Option<u32> {
    match error {
        CollectiveError::PeerLost { peer, .. } | CollectiveError::GroupFailed { peer, .. } => {
            Some(*peer)
        }
        _ => None,
    }
}

/// Checks that `result` of `what` on `rank` is a fatal error blaming `culprit` that came
/// within [`PROMPT`].
fn assert_prompt_failure(
    result: &Result<(), CollectiveError>,
    elapsed: Duration,
    culprit: u32,
    rank: u32,
    what: &str,
) {
    match result {
        Err(error) if blamed(error) == Some(culprit) && error.is_fatal() => {
            assert!(
                error.to_string().contains(&format!("rank {culprit}")),
                "{what}: rank {rank}'s error does not name rank {culprit}: {error}"
            );
        }
        other => panic!("{what}: rank {rank} got {other:?}, expected a failure blaming {culprit}"),
    }
    assert!(
        elapsed < PROMPT,
        "{what}: rank {rank} took {elapsed:?} to fail (operation timeout {OP_TIMEOUT:?})"
    );
}

/// What one surviving rank saw: the operation that had to fail, its result and how long it
/// took, then the same for the operation it entered afterwards.
struct Seen {
    rank: u32,
    failed_op: &'static str,
    failed: (Result<(), CollectiveError>, Duration),
    later: (Result<(), CollectiveError>, Duration),
}

/// Runs the scenario on `groups` and checks what every survivor saw. The last rank leaves
/// (`exit`) instead of taking part. Rank 0 fails the first operation (a gather to it, which
/// needs the last rank); it then stays alive but issues nothing more until everyone else is
/// done with the second operation (`second`) — a stuck rank. Every other rank completes the
/// gather (it only sends) and enters the second operation, where it waits for rank 0 directly
/// or through other ranks: it must fail promptly. Finally every survivor enters a third
/// operation, which must fail at once with `GroupFailed`.
///
/// The survivors never assert on their own threads (a panic there would leave rank 0 waiting
/// for them forever): they report, and the checks run after every thread is joined.
fn a_rank_lost_in_op_k_fails_ranks_waiting_in_op_k_plus_1(
    groups: Vec<ProcessGroup>,
    exit: Exit,
    second: fn(&ProcessGroup) -> Result<(), CollectiveError>,
    what: &str,
) {
    let n = groups.len() as u32;
    let culprit = n - 1;
    let done = Arc::new(Barrier::new((n - 1) as usize));
    let what = format!("{what}, world {n}, {exit:?}");
    let threads: Vec<_> = groups
        .into_iter()
        .map(|group| {
            let done = Arc::clone(&done);
            thread::spawn(move || {
                let rank = group.rank();
                if rank == culprit {
                    exit.leave(group);
                    return None;
                }
                let timed = |op: &dyn Fn() -> Result<(), CollectiveError>| {
                    let start = Instant::now();
                    let result = op();
                    (result, start.elapsed())
                };
                let gathered = timed(&|| group.gather(0, &[rank as f32]).map(|_| ()));
                let (failed_op, failed) = if rank == 0 {
                    ("gather", gathered)
                } else {
                    match gathered {
                        (Ok(()), _) => ("second operation", timed(&|| second(&group))),
                        other => ("gather (which only sends here)", other),
                    }
                };
                done.wait();
                let later = timed(&|| group.barrier());
                Some(Seen {
                    rank,
                    failed_op,
                    failed,
                    later,
                })
            })
        })
        .collect();
    let seen: Vec<Seen> = threads
        .into_iter()
        .filter_map(|t| t.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
        .collect();
    assert_eq!(seen.len(), (n - 1) as usize, "{what}");
    for s in seen {
        let (result, elapsed) = &s.failed;
        let label = format!("{what}, {}", s.failed_op);
        assert_prompt_failure(result, *elapsed, culprit, s.rank, &label);
        let (later, elapsed) = &s.later;
        let label = format!("{what}, the barrier after it");
        assert_prompt_failure(later, *elapsed, culprit, s.rank, &label);
        assert!(
            matches!(later, Err(CollectiveError::GroupFailed { .. })),
            "{label}: rank {} got {later:?}, expected GroupFailed",
            s.rank
        );
    }
}

/// A broadcast from rank 0: every other rank waits for rank 0, directly or down the tree.
fn broadcast_from_0(group: &ProcessGroup) -> Result<(), CollectiveError> {
    let mut data = vec![0.5f32; 64];
    group.broadcast(0, &mut data)
}

/// An all-reduce: every rank needs every other, rank 0 included.
fn all_reduce(group: &ProcessGroup) -> Result<(), CollectiveError> {
    let mut data = vec![1.0f32; 1000];
    group.all_reduce(&mut data, ReduceKind::Sum)
}

/// A point-to-point receive from rank 0, which never sends.
fn recv_from_0(group: &ProcessGroup) -> Result<(), CollectiveError> {
    group.recv_typed(0, 11, DType::F32).map(|_| ())
}

fn mem_world(n: u32) -> Vec<ProcessGroup> {
    common::world_with_timeout(n, OP_TIMEOUT)
}

#[test]
fn mem_a_lost_rank_reaches_ranks_waiting_in_a_later_broadcast() {
    for exit in [Exit::Abort, Exit::Drop] {
        for n in 2..=8 {
            a_rank_lost_in_op_k_fails_ranks_waiting_in_op_k_plus_1(
                mem_world(n),
                exit,
                broadcast_from_0,
                "mem broadcast",
            );
        }
    }
}

#[test]
fn mem_a_lost_rank_reaches_ranks_waiting_in_a_later_all_reduce() {
    for n in 2..=8 {
        a_rank_lost_in_op_k_fails_ranks_waiting_in_op_k_plus_1(
            mem_world(n),
            Exit::Drop,
            all_reduce,
            "mem all_reduce",
        );
    }
}

#[test]
fn mem_a_lost_rank_reaches_ranks_blocked_in_a_point_to_point_receive() {
    for n in 2..=8 {
        a_rank_lost_in_op_k_fails_ranks_waiting_in_op_k_plus_1(
            mem_world(n),
            Exit::Abort,
            recv_from_0,
            "mem recv",
        );
    }
}

/// A mismatched length is not fatal: the ranks fail that operation, and the group goes on
/// (no group-wide notice is sent, so nothing fails later).
#[test]
fn a_length_mismatch_does_not_fail_the_group() {
    for n in 2..=8u32 {
        let results = common::on_each(mem_world(n), move |group| {
            let count = if group.rank() == n - 1 { 9 } else { 8 };
            let mut x = vec![1.0f32; count];
            let first = group.all_reduce(&mut x, ReduceKind::Sum);
            let mut y = vec![1.0f32; 8];
            let second = group.all_reduce(&mut y, ReduceKind::Sum).map(|()| y);
            (first, second)
        });
        for (rank, (first, second)) in results.into_iter().enumerate() {
            assert!(
                matches!(first, Err(CollectiveError::LengthMismatch { .. })),
                "world {n}: rank {rank} got {first:?}"
            );
            assert_eq!(
                second.unwrap_or_else(|e| panic!("world {n}: rank {rank} after a mismatch: {e}")),
                vec![n as f32; 8]
            );
        }
    }
}

/// The deadline of a federated round: the members that remain always make it (rank 0 stops
/// waiting for the lost one as soon as it is seen to be gone), even on a loaded machine.
const FEDERATED_DEADLINE: Duration = Duration::from_secs(10);

/// Federated averaging is built to go on without lost members, so a lost member fails no
/// round and does not fail the group: two rounds in a row average the members that remain.
#[test]
fn federated_rounds_go_on_without_a_lost_member() {
    for n in 3..=5u32 {
        let groups = mem_world(n);
        let results = common::on_each(groups, move |group| {
            if group.rank() == n - 1 {
                drop(group);
                return None;
            }
            let rounds: Vec<_> = (0..2)
                .map(|_| {
                    let mut x = vec![group.rank() as f32; 4];
                    let round = group.federated_average(&mut x, FEDERATED_DEADLINE);
                    (round, x)
                })
                .collect();
            Some(rounds)
        });
        let survivors = (n - 1) as f32;
        let mean = (0..n - 1).map(|r| r as f32).sum::<f32>() / survivors;
        for (rank, result) in results.into_iter().enumerate() {
            for (round, x) in result.into_iter().flatten() {
                let round = round.unwrap_or_else(|e| panic!("world {n}: rank {rank}: {e}"));
                if rank == 0 {
                    assert_eq!(round, (n - 1) as usize, "world {n}");
                }
                assert_eq!(x, vec![mean; 4], "world {n}: rank {rank}");
            }
        }
    }
}

#[cfg(feature = "tcp")]
mod tcp {
    use super::*;

    use std::io::{BufRead, BufReader, Read, Write};
    use std::process::Child;

    use common::Reaper;

    use rlx_net::TcpTransport;

    /// The TCP transport of `rank` in an `n`-rank world whose rendezvous is on `port`.
    fn tcp_rank(rank: u32, n: u32, port: u16) -> Result<TcpTransport, CollectiveError> {
        common::loopback_builder(rank, n, port, OP_TIMEOUT).build()
    }

    /// An `n`-rank TCP world on loopback, one transport per thread of this process.
    fn tcp_world(n: u32) -> Vec<ProcessGroup> {
        common::tcp_world(n, common::free_port(), |rank, n, port| {
            common::loopback_builder(rank, n, port, OP_TIMEOUT)
        })
    }

    /// Set in a re-executed copy of this test binary: `rank,world,port` of the rank it runs.
    const WORKER: &str = "RLX_FAILURE_PROPAGATION_WORKER";
    /// The test that re-executes itself, as libtest names it.
    const PROCESS_TEST: &str = "tcp::tcp_processes_a_killed_rank_reaches_ranks_in_later_operations";
    /// What the rank to be killed prints once its transport is up.
    const READY: &str = "rlx-worker-ready";
    /// How long the parent waits for a world's processes before it kills them and fails.
    const PROCESS_BOUND: Duration = Duration::from_secs(60);

    /// One rank of [`tcp_processes_a_killed_rank_reaches_ranks_in_later_operations`] in a
    /// process of its own. The last rank waits to be killed. Rank 0 fails its gather, then
    /// reads a line from stdin (sent once every other survivor has exited) before its later
    /// barrier, so it is stuck meanwhile. The others gather, then wait in a broadcast from
    /// rank 0. Any wrong outcome panics, which fails the process.
    fn worker(spec: &str) {
        let (rank, n, port) = common::worker_spec(spec);
        let transport = tcp_rank(rank, n, port).expect("a loopback world");
        let group = ProcessGroup::new(Arc::new(transport) as Arc<dyn Transport>);
        let culprit = n - 1;
        let what = format!("processes, world {n}");
        if rank == culprit {
            println!("{READY}");
            thread::sleep(PROCESS_BOUND);
            return;
        }
        let start = Instant::now();
        let gathered = group.gather(0, &[rank as f32]).map(|_| ());
        if rank == 0 {
            assert_prompt_failure(&gathered, start.elapsed(), culprit, rank, &what);
            let mut go = String::new();
            std::io::stdin()
                .read_line(&mut go)
                .expect("the parent's go-ahead");
        } else {
            gathered.unwrap_or_else(|e| panic!("{what}: rank {rank}'s gather: {e}"));
            let start = Instant::now();
            let result = broadcast_from_0(&group);
            assert_prompt_failure(&result, start.elapsed(), culprit, rank, &what);
        }
        let start = Instant::now();
        let later = group.barrier();
        assert_prompt_failure(&later, start.elapsed(), culprit, rank, &what);
        assert!(
            matches!(later, Err(CollectiveError::GroupFailed { .. })),
            "{what}: rank {rank}'s later barrier got {later:?}"
        );
    }

    /// Waits, until `deadline`, for `child` to exit; returns whether it succeeded and what it
    /// wrote.
    fn finish(child: &mut Child, deadline: Instant) -> (bool, String) {
        let status = loop {
            match child.try_wait().expect("the state of a worker") {
                Some(status) => break Some(status),
                None if Instant::now() >= deadline => break None,
                None => thread::sleep(Duration::from_millis(10)),
            }
        };
        if status.is_none() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let mut output = String::new();
        for pipe in [
            child.stdout.take().map(|p| Box::new(p) as Box<dyn Read>),
            child.stderr.take().map(|p| Box::new(p) as Box<dyn Read>),
        ]
        .into_iter()
        .flatten()
        {
            let mut pipe = pipe;
            let _ = pipe.read_to_string(&mut output);
        }
        match status {
            Some(status) => (status.success(), output),
            None => (
                false,
                format!("still running after {PROCESS_BOUND:?}\n{output}"),
            ),
        }
    }

    #[test]
    fn tcp_processes_a_killed_rank_reaches_ranks_in_later_operations() {
        if let Ok(spec) = std::env::var(WORKER) {
            worker(&spec);
            return;
        }
        for n in 2..=8u32 {
            let port = common::free_port();
            let mut reaper = Reaper(Vec::new());
            for rank in 0..n {
                let child =
                    common::spawn_worker(PROCESS_TEST, WORKER, format!("{rank},{n},{port}"));
                reaper.0.push(child);
            }
            let deadline = Instant::now() + PROCESS_BOUND;
            let victim = reaper.0.last_mut().expect("the last rank");
            let mut lines = BufReader::new(victim.stdout.take().expect("the last rank's stdout"));
            let mut line = String::new();
            while !line.contains(READY) {
                line.clear();
                let read = lines.read_line(&mut line).expect("the last rank's output");
                assert!(
                    read > 0,
                    "world {n}: the last rank ended before it was ready"
                );
            }
            thread::sleep(HEAD_START);
            victim.kill().expect("kill the last rank");
            let _ = victim.wait();
            for rank in (1..n - 1).rev() {
                let (ok, output) = finish(&mut reaper.0[rank as usize], deadline);
                assert!(ok, "world {n}: rank {rank} failed:\n{output}");
            }
            let root = &mut reaper.0[0];
            if let Some(stdin) = root.stdin.as_mut() {
                stdin.write_all(b"go\n").expect("rank 0's go-ahead");
            }
            let (ok, output) = finish(root, deadline);
            assert!(ok, "world {n}: rank 0 failed:\n{output}");
        }
    }

    #[test]
    fn tcp_a_lost_rank_reaches_ranks_waiting_in_a_later_broadcast() {
        for exit in [Exit::Abort, Exit::Drop] {
            for n in 2..=8 {
                a_rank_lost_in_op_k_fails_ranks_waiting_in_op_k_plus_1(
                    tcp_world(n),
                    exit,
                    broadcast_from_0,
                    "tcp broadcast",
                );
            }
        }
    }

    #[test]
    fn tcp_a_lost_rank_reaches_ranks_waiting_in_a_later_all_reduce() {
        for n in 2..=8 {
            a_rank_lost_in_op_k_fails_ranks_waiting_in_op_k_plus_1(
                tcp_world(n),
                Exit::Drop,
                all_reduce,
                "tcp all_reduce",
            );
        }
    }

    #[test]
    fn tcp_a_lost_rank_reaches_ranks_blocked_in_a_point_to_point_receive() {
        for n in 2..=8 {
            a_rank_lost_in_op_k_fails_ranks_waiting_in_op_k_plus_1(
                tcp_world(n),
                Exit::Abort,
                recv_from_0,
                "tcp recv",
            );
        }
    }
}
