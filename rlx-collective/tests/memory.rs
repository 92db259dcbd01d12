//! What a rank holds beyond its own buffers while large messages stream over TCP: two
//! processes on loopback (the single-copy path off, so every byte goes through the sockets as
//! it does between hosts) pass messages of 64 MiB: a message that arrives before its receive
//! is posted, a message received with deadlines of 1 ms (as a wait in slices does), then a
//! send-receive, a broadcast, an all-reduce and an all-gather; each rank measures its peak resident memory (`VmHWM`, reset through
//! `/proc/self/clear_refs` before each operation) above what it held when the operation began.
//! The excess must stay under 16 MiB: a second copy of a message (a buffer of the transport's
//! own as large as the message, into which it landed before its receive came, or into which a
//! receive that gave up at a slice's end moved it) costs 64 MiB.
//!
//! Before the fix this checks, a send-receive of 256 MiB kept one or two whole copies of the
//! incoming message (+257 and +447 MiB over `--netns`, RELIABILITY.md "Memory per rank"). Two
//! timing rules decide whether a copy is taken, and both are made long here so that a busy
//! machine's pauses cannot take one: how long a large message that arrives before its receive
//! waits unread for it (`longest_hold`), and how long a receive whose message is landing goes
//! on past its deadline without a byte (`landing_grace`). Both are hidden builder options.

#![cfg(all(feature = "tcp", target_os = "linux"))]

mod common;

use std::io::{BufRead, BufReader, Read};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::Reaper;
use rlx_collective::{ProcessGroup, ReduceKind, Tag, Transport};
use rlx_net::TcpTransport;

/// Set in a re-executed copy of this test binary: `rank,world,port` of the rank it runs.
const WORKER: &str = "RLX_MEMORY_WORKER";
/// The test that re-executes itself, as libtest names it.
const PROCESS_TEST: &str = "streaming_large_messages_keeps_no_second_copy";
/// Elements of each message: 64 MiB of `f32`.
const ELEMENTS: usize = 16 << 20;
/// The most a rank may hold above its buffers during one operation.
const LIMIT_KIB: u64 = 16 << 10;
/// What a rank prints per operation: `memory: OP EXCESS_KIB`.
const MARKER: &str = "memory: ";
/// Long enough that only the rules under test, never a pause, decide.
const PATIENCE: Duration = Duration::from_secs(60);

/// A field of `/proc/self/status`, in KiB.
fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/self/status"))
}

/// Runs `op` twice and returns the peak resident memory above what was resident before, in
/// KiB.
fn excess_of(group: &ProcessGroup, mut op: impl FnMut()) -> u64 {
    group.barrier().expect("a barrier");
    // Writing 5 resets the peak (VmHWM) to the current resident size.
    std::fs::write("/proc/self/clear_refs", "5").expect("reset VmHWM");
    let before = status_kib("VmRSS:");
    op();
    op();
    status_kib("VmHWM:").saturating_sub(before)
}

fn worker(spec: &str) {
    let (rank, n, port) = common::worker_spec(spec);
    let transport = common::loopback_builder(rank, n, port, PATIENCE)
        .single_copy(false)
        .longest_hold(PATIENCE)
        .landing_grace(PATIENCE)
        .build()
        .expect("a loopback world");
    let transport = Arc::new(transport);
    let group = ProcessGroup::new(Arc::clone(&transport) as Arc<dyn Transport>);
    let peer = 1 - rank;
    // Every buffer is touched before anything is measured.
    let mut x = vec![1.0f32; ELEMENTS];
    let mut y = vec![2.0f32; ELEMENTS];
    let mut gathered = vec![3.0f32; ELEMENTS * n as usize];
    let report = |op: &str, kib: u64| println!("{MARKER}{op} {kib}");
    let kib = excess_of(&group, || late_receive(&transport, rank, &x, &mut y));
    report("late_receive", kib);
    let kib = excess_of(&group, || sliced_receive(&transport, rank, &x, &mut y));
    report("sliced_receive", kib);
    let kib = excess_of(&group, || {
        let got = group
            .send_recv(peer, &x, peer, &mut y, 5)
            .expect("send_recv");
        assert_eq!(got, ELEMENTS);
    });
    report("send_recv", kib);
    let kib = excess_of(&group, || group.broadcast(0, &mut y).expect("broadcast"));
    report("broadcast", kib);
    let kib = excess_of(&group, || {
        x.fill(1.0);
        group
            .all_reduce(&mut x, ReduceKind::Sum)
            .expect("all_reduce");
        assert!(x.iter().all(|&v| v == n as f32), "all_reduce result");
    });
    report("all_reduce", kib);
    let kib = excess_of(&group, || {
        group
            .all_gather_into(&x, &mut gathered)
            .expect("all_gather")
    });
    report("all_gather", kib);
}

/// Rank 0 sends `x`; rank 1 posts its receive only once the message has arrived and waits,
/// unread, for it (seen through `holds_message_from`), or after 10 s: a message taken into a
/// buffer of the transport's as it arrived would be there by then.
fn late_receive(transport: &TcpTransport, rank: u32, x: &[f32], y: &mut [f32]) {
    let tag = Tag::user(6).expect("a user tag");
    if rank == 0 {
        let bytes: &[u8] = bytemuck::cast_slice(x);
        transport.send_message(1, tag, &[bytes]).expect("send");
        return;
    }
    let until = Instant::now() + Duration::from_secs(10);
    while !transport.holds_message_from(0) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(1));
    }
    let got = transport
        .recv_message_into(0, tag, bytemuck::cast_slice_mut(y), PATIENCE)
        .expect("receive");
    assert_eq!(got, Some(ELEMENTS * 4));
}

/// Rank 0 sends `x`; rank 1 receives it with deadlines of 1 ms, as a wait in slices does, so
/// that a deadline passes while the message lands: the receive must take it whole then, not
/// move what landed into a buffer of the transport's for the next one.
fn sliced_receive(transport: &TcpTransport, rank: u32, x: &[f32], y: &mut [f32]) {
    let tag = Tag::user(7).expect("a user tag");
    if rank == 0 {
        let bytes: &[u8] = bytemuck::cast_slice(x);
        transport.send_message(1, tag, &[bytes]).expect("send");
        return;
    }
    let buf: &mut [u8] = bytemuck::cast_slice_mut(y);
    let until = Instant::now() + PATIENCE;
    loop {
        let got = transport
            .recv_message_into(0, tag, buf, Duration::from_millis(1))
            .expect("receive");
        if let Some(len) = got {
            assert_eq!(len, ELEMENTS * 4);
            return;
        }
        assert!(Instant::now() < until, "the message never came");
    }
}

#[test]
fn streaming_large_messages_keeps_no_second_copy() {
    if let Ok(spec) = std::env::var(WORKER) {
        worker(&spec);
        return;
    }
    let port = common::free_port();
    let mut reaper = Reaper(
        (0..2)
            .map(|rank| common::spawn_worker(PROCESS_TEST, WORKER, format!("{rank},2,{port}")))
            .collect(),
    );
    let mut excess = Vec::new();
    for (rank, child) in reaper.0.iter_mut().enumerate() {
        let out = BufReader::new(child.stdout.take().expect("a worker's stdout"));
        for line in out.lines().map_while(Result::ok) {
            if let Some(at) = line.find(MARKER) {
                excess.push((rank, line[at + MARKER.len()..].to_owned()));
            }
        }
        let status = child.wait().expect("a worker's end");
        let mut err = String::new();
        if let Some(mut pipe) = child.stderr.take() {
            let _ = pipe.read_to_string(&mut err);
        }
        assert!(status.success(), "rank {rank} failed ({status}):\n{err}");
    }
    assert_eq!(
        excess.len(),
        12,
        "every rank reports six operations: {excess:?}"
    );
    println!("KiB above the buffers (rank, operation and KiB): {excess:?}");
    for (rank, line) in &excess {
        let (op, kib) = line.split_once(' ').expect("OP KIB");
        let kib: u64 = kib.parse().expect("KiB");
        assert!(
            kib <= LIMIT_KIB,
            "rank {rank}'s {op} of 64 MiB held {kib} KiB above its buffers (limit {LIMIT_KIB}): \
             {excess:?}"
        );
    }
}
