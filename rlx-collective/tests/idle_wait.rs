//! A rank blocked in a collective on a peer that is alive but slow (computing) sleeps after its
//! spin window, whether its receive waits or its send does (a large message to a rank of this host
//! waits until the peer has read it): while the peer computes, the whole process (the waiting rank,
//! the slow rank's idle transport, both background watchers and their heartbeats) uses a few
//! percent of one core, measured from `/proc/self/stat`. The figure it prints is what
//! `BENCHMARKS.md` reports.
//!
//! Nothing here depends on how fast the machine runs the threads. The slow rank measures the
//! process's CPU time over the middle of its computation, when the waiting rank is surely
//! blocked (its spin window, microseconds to a few milliseconds, is long over) and nothing
//! else of the test runs: a loaded machine delays a sleeping thread's wake-ups but adds no CPU
//! time to it, while a waiting rank that spins uses most of a core even on a loaded one. And
//! the waiting rank's clock starts before the barrier that starts the slow rank's, so its
//! wait cannot look shorter than the computation.

#![cfg(all(feature = "tcp", target_os = "linux"))]

mod common;

use std::sync::mpsc;
use std::time::{Duration, Instant};

use rlx_collective::ReduceKind;

/// How long the slow rank computes before it joins the all-reduce.
const WAIT: Duration = Duration::from_secs(4);

/// CPU time (user + system) this process used so far.
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    // The command name may hold spaces; the fields after its closing parenthesis do not.
    let after = &stat[stat.rfind(')').expect("a stat line") + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 =
        fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
    // The kernel reports in clock ticks of 1/100 s on every Linux configuration Rust runs on.
    Duration::from_millis(ticks * 10)
}

/// 256 KiB goes over the sockets; 16 MiB by the single-copy path between the two ranks of
/// this host, where the waiting rank's send waits for the slow rank to take its message.
#[test]
fn a_rank_waiting_on_a_slow_peer_sleeps() {
    for len in [1 << 16, 4 << 20] {
        waits_asleep(len);
    }
}

/// One rank waits in an all-reduce of `len` floats while the other computes.
fn waits_asleep(len: usize) {
    /// How long after the waiting rank enters the all-reduce the measured window opens, and
    /// how long before the slow rank joins it the window closes.
    const SETTLE: Duration = Duration::from_millis(500);
    let world = common::tcp_world(2, common::free_port(), |rank, n, port| {
        common::loopback_builder(rank, n, port, Duration::from_secs(60))
    });
    let mut groups = world.into_iter();
    let (waiting, slow) = (groups.next().unwrap(), groups.next().unwrap());
    // The waiting rank says when it is about to enter the all-reduce.
    let (entering, wait_for_entry) = mpsc::channel::<()>();
    std::thread::scope(|s| {
        let peer = s.spawn(move || {
            let mut x = vec![1.0f32; len];
            slow.barrier().expect("the slow rank's barrier");
            wait_for_entry
                .recv_timeout(Duration::from_secs(60))
                .expect("the waiting rank never entered the all-reduce");
            // The computation: WAIT in all, the middle of it measured.
            std::thread::sleep(SETTLE);
            let (from, cpu_before) = (Instant::now(), cpu_time());
            std::thread::sleep(WAIT - 2 * SETTLE);
            let (window, cpu) = (from.elapsed(), cpu_time() - cpu_before);
            std::thread::sleep(SETTLE);
            slow.all_reduce(&mut x, ReduceKind::Sum)
                .expect("the slow rank's all-reduce");
            (window, cpu)
        });
        let mut x = vec![1.0f32; len];
        let started = Instant::now();
        waiting.barrier().expect("the waiting rank's barrier");
        entering.send(()).expect("the slow rank is there");
        waiting
            .all_reduce(&mut x, ReduceKind::Sum)
            .expect("the waiting rank's all-reduce");
        let waited = started.elapsed();
        assert!(x.iter().all(|&v| v == 2.0), "a wrong sum");
        let (window, cpu) = peer.join().expect("the slow rank");
        let share = cpu.as_secs_f64() / window.as_secs_f64();
        println!(
            "{len} floats: waited {:.2} s; over {:.2} s of it used {:.0} ms of CPU: {:.1}% of one core",
            waited.as_secs_f64(),
            window.as_secs_f64(),
            cpu.as_secs_f64() * 1e3,
            share * 100.0
        );
        assert!(waited >= WAIT, "the wait ended early");
        assert!(
            share < 0.10,
            "a blocked rank used {:.1}% of a core",
            share * 100.0
        );
    });
}
