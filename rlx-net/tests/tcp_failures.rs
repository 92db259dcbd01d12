//! Failure: `kill -9` of one rank of four in the middle of a pairwise exchange of 8 MiB
//! messages (every rank streams to and from every other), repeated; every survivor must fail
//! with `PeerLost` naming the killed rank, well within a bound, and end with no thread left.
//! In-process: abort wakes blocked calls, a dropped transport is seen as lost, a silent peer
//! is caught by the timeout, and dropping joins every thread.

mod common;

use std::io::{BufRead, BufReader};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::{free_port, now_ms, pattern, rlx_env, spawn, thread_count, threads_beyond, wait_all};
use rlx_net::TcpTransport;
use rlx_transport::{CollectiveError, Transport};

const VICTIM: u32 = 2;
const LEN: usize = 8 << 20;

/// Streams checked 8 MiB messages to and from every peer, one thread per peer, until one
/// fails; reports the first error and when it came, lingers (2 s) so the other survivors see the
/// victim's loss first, then aborts, joins and drops everything and counts the threads left
/// beyond those it started with.
fn pairwise_worker() -> Result<(), String> {
    // Counted before the transport exists: a runtime may run threads of its own, which are
    // not the transport's to end. ThreadSanitizer starts its background thread with the
    // process's first thread, so one started and joined first puts it in the count.
    std::thread::spawn(|| ())
        .join()
        .map_err(|_| "a first thread panicked")?;
    let before = thread_count();
    let t = Arc::new(common::from_env()?);
    let rank = t.rank();
    let peers = Arc::clone(&t);
    common::until_first_failure(&t, Duration::from_millis(2000), move |peer| {
        let t = &peers;
        let out = pattern(rank, 0, LEN);
        let want = pattern(peer, 0, LEN);
        let mut buf = vec![0u8; LEN];
        let mut rounds = 0u64;
        let tag = match rlx_transport::Tag::user(1) {
            Ok(tag) => tag,
            Err(e) => return e,
        };
        loop {
            if let Err(e) = t.send_bytes(peer, 1, &out) {
                break e;
            }
            match t.recv_message_into(peer, tag, &mut buf, t.op_timeout()) {
                Ok(Some(len)) if len == LEN && buf == want => rounds += 1,
                Ok(other) => {
                    break CollectiveError::protocol(
                        Some(peer),
                        format!("wrong message after {rounds} rounds: {other:?}"),
                    );
                }
                Err(e) => break e,
            }
            if rounds == 1 {
                println!("running with peer {peer}");
            }
        }
    })?;
    drop(t);
    println!(
        "threads left by the transport: {}",
        threads_beyond(before, Duration::from_secs(2))
    );
    Ok(())
}

fn worker(role: &str) -> Result<(), String> {
    match role {
        "pairwise" => pairwise_worker(),
        other => Err(format!("unknown role {other}")),
    }
}

fn kill_one_of_four_mid_transfer() {
    let mut worst = 0u128;
    // Three rounds by default; RLX_NET_TEST_KILL_ROUNDS=20 makes it a soak.
    let rounds: u32 = std::env::var("RLX_NET_TEST_KILL_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    for round in 0..rounds {
        let port = free_port();
        let mut children = common::Reaper::default();
        for rank in 0..4 {
            children
                .0
                .push(spawn("pairwise", &rlx_env(rank, 4, "127.0.0.1", port)));
        }
        // The kill lands mid-transfer: once the victim has finished a round with every peer
        // (an event, not a guess at how long start-up takes on a loaded machine).
        let victim_out = children.0[VICTIM as usize]
            .stdout
            .take()
            .expect("the victim's stdout is piped");
        let running = BufReader::new(victim_out)
            .lines()
            .map_while(Result::ok)
            .filter(|line| line.starts_with("running with peer"))
            .take(3)
            .count();
        assert_eq!(running, 3, "the victim ended before it ran with every peer");
        let killed_at = now_ms();
        children.0[VICTIM as usize]
            .kill()
            .expect("kill -9 the victim");
        // The victim's sockets close when its process has exited, which takes a while on a
        // loaded machine; its exit status is available from then on.
        let _ = children.0[VICTIM as usize].wait();
        let reaped_at = now_ms();
        let done = wait_all(children.take(), Duration::from_secs(60));
        for (rank, f) in done.iter().enumerate() {
            if rank as u32 == VICTIM {
                continue;
            }
            assert!(f.ok, "survivor {rank} failed in round {round}: {done:#?}");
            assert!(
                f.stdout.contains("running with peer"),
                "no transfer ran: {done:#?}"
            );
            let line = f
                .stdout
                .lines()
                .find(|l| l.starts_with("lost: "))
                .unwrap_or_else(|| panic!("survivor {rank} reported nothing: {done:#?}"));
            assert!(
                line.contains(&format!("PeerLost {{ peer: {VICTIM},")),
                "survivor {rank} blamed the wrong peer: {line}"
            );
            let at: u128 = line
                .rsplit(' ')
                .next()
                .and_then(|s| s.parse().ok())
                .expect("a timestamp");
            let after = at.saturating_sub(killed_at);
            if std::env::var_os("RLX_NET_TEST_VERBOSE").is_some() {
                println!(
                    "round {round}: survivor {rank} noticed {after} ms after the kill, {} ms after the victim was reaped ({} ms after the kill)",
                    at as i128 - reaped_at as i128,
                    reaped_at - killed_at
                );
            }
            worst = worst.max(after);
            assert!(after < 10_000, "survivor {rank} took {after} ms: {line}");
            assert!(
                f.stdout.contains("threads left by the transport: 0\n"),
                "survivor {rank} left threads: {}",
                f.stdout
            );
        }
    }
    println!("slowest survivor of {rounds} rounds noticed the kill after {worst} ms");
}

fn abort_wakes_blocked_calls() {
    let w: Vec<Arc<TcpTransport>> =
        common::in_process::local_world(2, |b| b.op_timeout(Duration::from_secs(60)))
            .into_iter()
            .map(Arc::new)
            .collect();
    let blocked = {
        let t = Arc::clone(&w[0]);
        thread::spawn(move || t.recv_bytes(1, 3))
    };
    thread::sleep(Duration::from_millis(100));
    let start = Instant::now();
    w[0].abort();
    assert!(matches!(
        blocked.join().unwrap(),
        Err(CollectiveError::Aborted)
    ));
    assert!(start.elapsed() < Duration::from_secs(5));
    assert!(matches!(
        w[0].send_bytes(1, 0, b"x"),
        Err(CollectiveError::Aborted)
    ));
    assert!(matches!(
        w[0].recv_bytes(1, 0),
        Err(CollectiveError::Aborted)
    ));
    w[0].abort();
    let err = w[1].recv_bytes(0, 3).unwrap_err();
    assert!(
        matches!(err, CollectiveError::PeerLost { peer: 0, .. }),
        "{err}"
    );
}

fn a_dropped_transport_is_a_lost_peer() {
    let mut w = common::in_process::local_world(3, |b| b.op_timeout(Duration::from_secs(60)));
    let survivor = Arc::new(w.remove(0));
    let blocked = {
        let t = Arc::clone(&survivor);
        thread::spawn(move || t.recv_bytes(2, 0))
    };
    thread::sleep(Duration::from_millis(100));
    let gone = w.pop().unwrap();
    drop(gone);
    let err = blocked.join().unwrap().unwrap_err();
    assert!(
        matches!(err, CollectiveError::PeerLost { peer: 2, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("closed its transport"), "{err}");
    // Rank 1 is untouched.
    w[0].send_bytes(0, 4, b"still here").unwrap();
    assert_eq!(survivor.recv_bytes(1, 4).unwrap(), b"still here");
    let err = survivor.send_bytes(2, 0, b"late").unwrap_err();
    assert!(
        matches!(err, CollectiveError::PeerLost { peer: 2, .. }),
        "{err}"
    );
}

fn a_silent_peer_times_out() {
    let w = common::in_process::local_world(2, |b| b.op_timeout(Duration::from_millis(300)));
    let start = Instant::now();
    let err = w[0].recv_bytes(1, 9).unwrap_err();
    assert!(
        matches!(
            err,
            CollectiveError::Timeout {
                peer: Some(1),
                op: "recv",
                ..
            }
        ),
        "{err}"
    );
    assert!(start.elapsed() >= Duration::from_millis(300));
}

fn dropping_ends_every_thread() {
    let before = thread_count();
    let w = common::in_process::local_world(3, |b| b.op_timeout(Duration::from_secs(30)));
    assert!(thread_count() > before, "each transport runs a watcher");
    w[0].send_bytes(1, 0, b"x").unwrap();
    assert_eq!(w[1].recv_bytes(0, 0).unwrap(), b"x");
    drop(w);
    assert_eq!(threads_beyond(before, Duration::from_secs(2)), 0);
}

fn main() {
    common::run(
        &[
            ("abort_wakes_blocked_calls", abort_wakes_blocked_calls),
            (
                "a_dropped_transport_is_a_lost_peer",
                a_dropped_transport_is_a_lost_peer,
            ),
            ("a_silent_peer_times_out", a_silent_peer_times_out),
            ("dropping_ends_every_thread", dropping_ends_every_thread),
            (
                "kill_one_of_four_mid_transfer",
                kill_one_of_four_mid_transfer,
            ),
        ],
        worker,
    );
}
