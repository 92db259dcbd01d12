//! A rank blocked in a collective on a peer that is alive but slow (computing) sleeps after its
//! spin window, whether its receive waits or its send does (a large message to a rank of this host
//! waits until the peer has read it): over a 4 s wait the whole process (the waiting rank, the slow
//! rank's idle transport, both background watchers and their heartbeats) uses a few percent of one
//! core, measured from `/proc/self/stat`. The bound is generous (a loaded machine adds wake-up
//! latency, not CPU time); the figure it prints is what `RELIABILITY.md` reports.

#![cfg(all(feature = "tcp", target_os = "linux"))]

mod common;

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
    let world = common::tcp_world(2, common::free_port(), |rank, n, port| {
        common::loopback_builder(rank, n, port, Duration::from_secs(60))
    });
    let mut groups = world.into_iter();
    let (waiting, slow) = (groups.next().unwrap(), groups.next().unwrap());
    std::thread::scope(|s| {
        let peer = s.spawn(|| {
            slow.barrier().expect("the slow rank's barrier");
            std::thread::sleep(WAIT);
            let mut x = vec![1.0f32; len];
            slow.all_reduce(&mut x, ReduceKind::Sum)
                .expect("the slow rank's all-reduce");
        });
        waiting.barrier().expect("the waiting rank's barrier");
        let (started, cpu_before) = (Instant::now(), cpu_time());
        let mut x = vec![1.0f32; len];
        waiting
            .all_reduce(&mut x, ReduceKind::Sum)
            .expect("the waiting rank's all-reduce");
        let (waited, cpu) = (started.elapsed(), cpu_time() - cpu_before);
        assert!(x.iter().all(|&v| v == 2.0), "a wrong sum");
        peer.join().expect("the slow rank");
        let share = cpu.as_secs_f64() / waited.as_secs_f64();
        println!(
            "{len} floats: waited {:.2} s using {:.0} ms of CPU: {:.1}% of one core",
            waited.as_secs_f64(),
            cpu.as_secs_f64() * 1e3,
            share * 100.0
        );
        assert!(
            waited >= WAIT - Duration::from_millis(100),
            "the wait ended early"
        );
        assert!(
            share < 0.10,
            "a blocked rank used {:.1}% of a core",
            share * 100.0
        );
    });
}
