//! `ProcessGroup::abort` from another thread: eight threads of one rank blocked in different
//! operations (point-to-point receives and non-blocking collectives) all wake with an abort
//! error, and the peer waiting on that rank fails naming it. Over `MemTransport` and over
//! `TcpTransport` on loopback.

mod common;

use std::thread;
use std::time::{Duration, Instant};

use rlx_collective::{CollectiveError, FatalCause, ProcessGroup, ReduceKind};

/// Long enough that only the abort can end the waits here.
const OP_TIMEOUT: Duration = Duration::from_secs(60);

/// Whether `error` is what an aborted rank's own call returns.
fn is_abort(error: &CollectiveError) -> bool {
    matches!(
        error,
        CollectiveError::Aborted
            | CollectiveError::GroupFailed {
                cause: FatalCause::Aborted,
                ..
            }
    )
}

/// Rank 0 blocks eight threads, rank 1 waits for rank 0; a ninth thread of rank 0 aborts.
/// Returns how long the slowest of rank 0's calls took to return after the abort.
fn eight_blocked_calls_wake(world: Vec<ProcessGroup>, what: &str) -> Duration {
    let mut world = world.into_iter();
    let (zero, one) = (world.next().unwrap(), world.next().unwrap());
    let peer = thread::spawn(move || one.recv::<f32>(0, 99));
    let mut calls: Vec<thread::JoinHandle<Result<(), CollectiveError>>> = Vec::new();
    for tag in 0..4 {
        let group = zero.clone();
        calls.push(thread::spawn(move || group.recv::<f32>(1, tag).map(|_| ())));
    }
    let all_reduce = zero.spawn_all_reduce(vec![1.0f32; 64], ReduceKind::Sum);
    calls.push(thread::spawn(move || all_reduce.join().map(|_| ())));
    let all_gather = zero.spawn_all_gather(vec![1.0f32; 64]);
    calls.push(thread::spawn(move || all_gather.join().map(|_| ())));
    let reduce_scatter = zero.spawn_reduce_scatter(vec![1.0f32; 128], ReduceKind::Sum);
    calls.push(thread::spawn(move || reduce_scatter.join().map(|_| ())));
    let barrier = zero.spawn_barrier();
    calls.push(thread::spawn(move || barrier.join()));
    // Let every call block first.
    thread::sleep(Duration::from_millis(200));
    let aborted_at = Instant::now();
    let aborter = {
        let group = zero.clone();
        thread::spawn(move || group.abort())
    };
    aborter.join().expect("the aborting thread");
    let mut slowest = Duration::ZERO;
    for (i, call) in calls.into_iter().enumerate() {
        let result = call.join().expect("a blocked thread");
        slowest = slowest.max(aborted_at.elapsed());
        match result {
            Err(error) if is_abort(&error) => {}
            other => panic!("{what}: call {i} after the abort: {other:?}"),
        }
    }
    assert!(
        slowest < OP_TIMEOUT / 2,
        "{what}: the calls woke only after {slowest:?}"
    );
    match peer.join().expect("the peer") {
        Err(
            CollectiveError::GroupFailed { peer: 0, .. }
            | CollectiveError::PeerLost { peer: 0, .. },
        ) => {}
        other => panic!("{what}: the peer got {other:?}"),
    }
    slowest
}

#[test]
fn mem_abort_wakes_eight_blocked_calls() {
    let slowest = eight_blocked_calls_wake(common::world_with_timeout(2, OP_TIMEOUT), "mem");
    eprintln!("mem: the slowest of 8 blocked calls returned {slowest:?} after the abort");
}

#[cfg(feature = "tcp")]
#[test]
fn tcp_abort_wakes_eight_blocked_calls() {
    let world = common::tcp_world(2, common::free_port(), |rank, n, port| {
        common::loopback_builder(rank, n, port, OP_TIMEOUT)
    });
    let slowest = eight_blocked_calls_wake(world, "tcp");
    eprintln!("tcp: the slowest of 8 blocked calls returned {slowest:?} after the abort");
}
