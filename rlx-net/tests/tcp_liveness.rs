//! Liveness independent of the operation timeout: a peer that stops sending anything (a
//! process stopped with SIGSTOP, a pulled cable, a link that drops every packet) is lost within
//! five heartbeat intervals, and every survivor's error names it; a peer that merely computes
//! for a long time without calling its transport is not.
//!
//! - `sigstop_is_caught_under_the_default_timeout`: three ranks exchange messages pairwise
//!   under the default operation timeout (300 s) and heartbeat (1 s); one is stopped; both
//!   survivors must fail naming it within a few seconds, and the stopped rank, once resumed,
//!   must fail too instead of hanging.
//! - `a_computing_rank_is_not_lost`: in one process, a rank sleeps for three detection windows
//!   while its peer waits on it and pushes more than its unexpected budget at it; everything
//!   arrives and nobody is lost.
//! - In network namespaces (root only; ignored with the reason otherwise, failing under
//!   `CI=true`): three ranks, one rank's cable cut by taking its switch port down or by a `tc`
//!   rule that drops every packet, during a transfer and while the links are idle; both
//!   survivors must fail naming it within the window.
//!
//! `RLX_NET_TEST_LIVENESS_ROUNDS=N` repeats each multi-process scenario N times and prints the
//! detection times (min/median/max).

mod common;
mod netns;

use std::io::{BufRead, BufReader, Lines};
use std::process::ChildStdout;
use std::sync::{Arc, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use common::{Finished, Reaper, free_port, now_ms, pattern, spawn_in, wait_all};
use netns::{Cut, Switch};
use rlx_net::{TcpTransport, TcpTransportBuilder};
use rlx_transport::{CollectiveError, LaunchEnv, Tag, Transport};

/// The rank that is stopped or cut off.
const VICTIM: u32 = 1;
/// Ranks of the multi-process worlds.
const WORLD: u32 = 3;
/// Message size of the transfers.
const LEN: usize = 256 << 10;
/// The default detection window: five beats of 1 s.
const WINDOW_MS: u128 = 5_000;
/// How late after the window a survivor may still notice (a loaded machine schedules the
/// watcher late, and silence is measured to a quarter beat).
const SLACK_MS: u128 = 2_500;
/// The tag under which the idle workers wait for a message that never comes.
const NEVER: u32 = 2;

/// Rounds of each multi-process scenario.
fn rounds() -> u32 {
    std::env::var("RLX_NET_TEST_LIVENESS_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

/// One thread per peer, each exchanging checked messages with its peer (`idle` false) or
/// waiting for a message that never comes (`idle` true), until one fails; prints the first
/// failure and when it came, lingers so the other survivors see the loss themselves, then
/// aborts and joins.
fn exchange_worker(idle: bool) -> Result<(), String> {
    let t = Arc::new(transport_from_env()?);
    t.barrier().map_err(|e| format!("first barrier: {e}"))?;
    println!("ready");
    let rank = t.rank();
    let peers = Arc::clone(&t);
    common::until_first_failure(&t, Duration::from_millis(1500), move |peer| {
        if idle {
            wait_forever(&*peers, peer)
        } else {
            exchange(&*peers, rank, peer)
        }
    })
}

/// The worker's transport from the environment; with `RLX_NET_TEST_USER_TIMEOUT_MS` set (by
/// the measurement of the kernel's own detection), every link socket also gets that
/// `TCP_USER_TIMEOUT` (set on the listener, accepted sockets inherit it).
fn transport_from_env() -> Result<TcpTransport, String> {
    let Some(ms) = std::env::var("RLX_NET_TEST_USER_TIMEOUT_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    else {
        return common::from_env();
    };
    let env = LaunchEnv::from_env().map_err(|e| e.to_string())?;
    TcpTransport::builder()
        .launch_env(env)
        .tuning_env()
        .map_err(|e| e.to_string())?
        .socket_setup(move |socket, _| user_timeout(socket, Duration::from_millis(ms)))
        .build()
        .map_err(|e| format!("build: {e}"))
}

/// Sets `TCP_USER_TIMEOUT` on `socket`: an option of Linux only (these tests run in Linux
/// network namespaces; elsewhere they only type-check).
fn user_timeout(socket: &socket2::Socket, after: Duration) -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    return socket.set_tcp_user_timeout(Some(after));
    #[cfg(not(target_os = "linux"))]
    return Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        format!(
            "TCP_USER_TIMEOUT ({after:?}) exists on Linux only, not for socket {:?}",
            socket.local_addr().ok().and_then(|a| a.as_socket())
        ),
    ));
}

/// Sends and receives checked messages with `peer` until something fails.
fn exchange(t: &dyn Transport, rank: u32, peer: u32) -> CollectiveError {
    let out = pattern(rank, 0, LEN);
    let want = pattern(peer, 0, LEN);
    let mut buf = vec![0u8; LEN];
    let tag = match Tag::user(1) {
        Ok(tag) => tag,
        Err(e) => return e,
    };
    loop {
        if let Err(e) = t.send_bytes(peer, 1, &out) {
            return e;
        }
        match t.recv_message_into(peer, tag, &mut buf, t.op_timeout()) {
            Ok(Some(len)) if len == LEN && buf == want => {}
            Ok(None) => return timed_out(t, peer),
            Ok(other) => {
                return CollectiveError::protocol(Some(peer), format!("wrong message: {other:?}"));
            }
            Err(e) => return e,
        }
        thread::sleep(Duration::from_millis(2));
    }
}

/// Waits, under the operation timeout, for a message from `peer` that nobody sends.
fn wait_forever(t: &dyn Transport, peer: u32) -> CollectiveError {
    let mut buf = [0u8; 8];
    let tag = match Tag::user(NEVER) {
        Ok(tag) => tag,
        Err(e) => return e,
    };
    match t.recv_message_into(peer, tag, &mut buf, t.op_timeout()) {
        Ok(None) => timed_out(t, peer),
        Ok(got) => CollectiveError::protocol(Some(peer), format!("unexpected message: {got:?}")),
        Err(e) => e,
    }
}

/// What a receive from `peer` that reached the operation timeout reports.
fn timed_out(t: &dyn Transport, peer: u32) -> CollectiveError {
    CollectiveError::Timeout {
        peer: Some(peer),
        op: "recv",
        after: t.op_timeout(),
    }
}

fn worker(role: &str) -> Result<(), String> {
    match role {
        "transfer" => exchange_worker(false),
        "idle" => exchange_worker(true),
        other => Err(format!("unknown role {other}")),
    }
}

/// The environment of rank `rank`: a store on rank 0 at `host:port`, and the default
/// operation timeout and heartbeat (neither variable set) unless `extra` sets them.
fn env(rank: u32, host: &str, port: u16, extra: &[(String, String)]) -> Vec<(String, String)> {
    let mut env = vec![
        ("RLX_RANK".into(), rank.to_string()),
        ("RLX_WORLD_SIZE".into(), WORLD.to_string()),
        ("RLX_MASTER_ADDR".into(), host.into()),
        ("RLX_MASTER_PORT".into(), port.to_string()),
    ];
    env.extend_from_slice(extra);
    env
}

/// Starts the world (each rank in `netns(rank)` when given), waits until the victim has
/// passed its first barrier (so every link is up) and lets the workers run a moment; returns
/// the survivors, the victim and the victim's output lines.
fn start_world(
    role: &str,
    host: &str,
    port: u16,
    netns: impl Fn(u32) -> Option<String>,
    extra: &[(String, String)],
) -> (Reaper, Reaper, Lines<BufReader<ChildStdout>>) {
    let mut survivors = Reaper::default();
    let mut victim = Reaper::default();
    for rank in 0..WORLD {
        let child = spawn_in(netns(rank).as_deref(), role, &env(rank, host, port, extra));
        if rank == VICTIM {
            victim.0.push(child);
        } else {
            survivors.0.push(child);
        }
    }
    let out = victim.0[0]
        .stdout
        .take()
        .expect("the victim's stdout is piped");
    let mut lines = BufReader::new(out).lines();
    assert!(
        lines.by_ref().map_while(Result::ok).any(|l| l == "ready"),
        "the victim ended before its first barrier"
    );
    thread::sleep(Duration::from_millis(300));
    (survivors, victim, lines)
}

/// Checks that every survivor failed with `PeerLost` naming the victim as silent, within the
/// window (plus slack) of `cut_at`; returns the detection times in ms.
fn assert_survivors_named_victim(done: &[Finished], cut_at: u128, what: &str) -> Vec<u128> {
    let mut times = Vec::new();
    for f in done {
        assert!(f.ok, "{what}: a survivor failed: {done:#?}");
        let line = f
            .stdout
            .lines()
            .find(|l| l.starts_with("lost: "))
            .unwrap_or_else(|| panic!("{what}: a survivor reported nothing: {done:#?}"));
        assert!(
            line.contains(&format!("PeerLost {{ peer: {VICTIM},"))
                && line.contains(&format!("peer rank {VICTIM} lost")),
            "{what}: a survivor blamed the wrong peer or cause: {line}"
        );
        let at: u128 = line
            .rsplit(' ')
            .next()
            .and_then(|s| s.parse().ok())
            .expect("a timestamp");
        let after = at.saturating_sub(cut_at);
        assert!(
            after < WINDOW_MS + SLACK_MS,
            "{what}: a survivor took {after} ms: {line}"
        );
        times.push(after);
    }
    times
}

/// Prints min/median/max of `times` for `what`.
fn summary(what: &str, mut times: Vec<u128>) {
    times.sort_unstable();
    if let (Some(min), Some(max)) = (times.first(), times.last()) {
        println!(
            "{what}: {} detections, min {min} ms, median {} ms, max {max} ms",
            times.len(),
            times[times.len() / 2]
        );
    }
}

fn sigstop_is_caught_under_the_default_timeout() {
    let mut times = Vec::new();
    for _ in 0..rounds() {
        let port = free_port();
        let (mut survivors, mut victim, lines) =
            start_world("transfer", "127.0.0.1", port, |_| None, &[]);
        let pid = victim.0[0].id() as libc::pid_t;
        let stopped_at = now_ms();
        // SAFETY: `pid` is our own child, not yet reaped, so the id names that process.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0, "SIGSTOP");
        let done = wait_all(survivors.take(), Duration::from_secs(60));
        times.extend(assert_survivors_named_victim(&done, stopped_at, "SIGSTOP"));
        // SAFETY: as above.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0, "SIGCONT");
        // Resumed, the victim finds its peers gone and fails cleanly: no hang, no success.
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            let lost = lines
                .map_while(Result::ok)
                .find(|l| l.starts_with("lost: "));
            let _ = tx.send(lost);
        });
        let said = rx.recv_timeout(Duration::from_secs(30));
        assert!(
            matches!(&said, Ok(Some(line)) if line.contains("PeerLost")),
            "the resumed victim said {said:?}"
        );
        let done = wait_all(victim.take(), Duration::from_secs(30));
        assert!(done[0].ok, "the resumed victim failed: {done:#?}");
    }
    summary("SIGSTOP, default timeout", times);
}

/// Two ranks in this process over loopback, both built by `adjust` on a plain builder.
fn two_ranks(
    adjust: fn(TcpTransportBuilder) -> TcpTransportBuilder,
) -> (TcpTransport, TcpTransport) {
    let port = free_port();
    let build = move |rank: u32| {
        thread::spawn(move || {
            adjust(TcpTransport::builder())
                .rank(rank)
                .world_size(2)
                .master("127.0.0.1", port)
                .build()
                .expect("build")
        })
    };
    let (a, b) = (build(0), build(1));
    (a.join().expect("rank 0"), b.join().expect("rank 1"))
}

fn a_computing_rank_is_not_lost() {
    const BEAT: Duration = Duration::from_millis(200);
    // Three detection windows of five beats.
    const COMPUTE: Duration = Duration::from_millis(3 * 5 * 200 + 200);
    const BIG: usize = 4 << 20;
    let (a, b) = two_ranks(|builder| builder.heartbeat(BEAT).max_unexpected_bytes(1 << 20));
    let computing = thread::spawn(move || {
        // Computes without calling the transport, while rank 0 waits for it and pushes four
        // times its unexpected budget at it.
        thread::sleep(COMPUTE);
        for i in 0..4u64 {
            let got = b.recv_bytes(0, 3).expect("a message of rank 0");
            assert!(got == pattern(0, i, BIG), "message {i} differs");
        }
        b.send_bytes(0, 4, b"done").expect("the reply");
        b
    });
    let start = Instant::now();
    for i in 0..4u64 {
        a.send_bytes(1, 3, &pattern(0, i, BIG))
            .expect("a send to the computing rank");
    }
    assert_eq!(a.recv_bytes(1, 4).expect("the reply"), b"done");
    assert!(start.elapsed() >= COMPUTE, "the rank did not compute");
    let b = computing.join().expect("the computing rank");
    // Both links still work both ways.
    b.send_bytes(0, 5, b"still here").expect("send");
    assert_eq!(a.recv_bytes(1, 5).expect("recv"), b"still here");
}

/// Runs one link-cut scenario in namespaces: `role` is `transfer` or `idle`.
fn cut_in_namespaces(role: &str, how: Cut) {
    let what = format!("{how:?} while {role}");
    let mut times = Vec::new();
    for _ in 0..rounds() {
        let switch = Switch::create(WORLD).expect("namespaces");
        let (mut survivors, _victim, _lines) = start_world(
            role,
            &Switch::addr(0),
            29_500,
            |rank| Some(switch.netns(rank).to_owned()),
            &[],
        );
        let cut_at = now_ms();
        switch.cut(VICTIM, how).expect("cut the link");
        let done = wait_all(survivors.take(), Duration::from_secs(60));
        times.extend(assert_survivors_named_victim(&done, cut_at, &what));
    }
    summary(&what, times);
}

fn link_down_during_transfer() {
    cut_in_namespaces("transfer", Cut::LinkDown);
}

fn link_down_while_idle() {
    cut_in_namespaces("idle", Cut::LinkDown);
}

fn drop_all_during_transfer() {
    cut_in_namespaces("transfer", Cut::DropAll);
}

fn drop_all_while_idle() {
    cut_in_namespaces("idle", Cut::DropAll);
}

/// What the kernel alone notices, with heartbeats off: SIGSTOP and cut cables, with and
/// without `TCP_USER_TIMEOUT`, under a 60 s operation timeout; and whether a user timeout
/// shorter than a computation makes a live peer look dead. Prints the survivors' errors and
/// when they came; asserts nothing (`--ignored`, it takes about five minutes).
fn measure_the_kernel_alone() {
    let cases: [(&str, Option<Cut>, Option<u64>); 7] = [
        ("transfer", None, None),
        ("transfer", None, Some(5_000)),
        ("idle", None, Some(5_000)),
        ("transfer", Some(Cut::LinkDown), None),
        ("transfer", Some(Cut::LinkDown), Some(5_000)),
        ("idle", Some(Cut::LinkDown), None),
        ("idle", Some(Cut::LinkDown), Some(5_000)),
    ];
    for (role, cut, user_timeout) in cases {
        let switch = Switch::create(WORLD).expect("namespaces");
        let mut extra = vec![
            ("RLX_HEARTBEAT_MS".to_owned(), "0".to_owned()),
            ("RLX_TIMEOUT_MS".to_owned(), "60000".to_owned()),
        ];
        if let Some(ms) = user_timeout {
            extra.push(("RLX_NET_TEST_USER_TIMEOUT_MS".to_owned(), ms.to_string()));
        }
        let (mut survivors, victim, _lines) = start_world(
            role,
            &Switch::addr(0),
            29_500,
            |rank| Some(switch.netns(rank).to_owned()),
            &extra,
        );
        let at = now_ms();
        match cut {
            Some(how) => switch.cut(VICTIM, how).expect("cut the link"),
            None => {
                let pid = victim.0[0].id() as libc::pid_t;
                // SAFETY: `pid` is our own child, not yet reaped.
                assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0, "SIGSTOP");
            }
        }
        let done = wait_all(survivors.take(), Duration::from_secs(120));
        for f in &done {
            let line = f.stdout.lines().find(|l| l.starts_with("lost: "));
            let seen = line.and_then(|l| {
                let t: u128 = l.rsplit(' ').next()?.parse().ok()?;
                Some((t.saturating_sub(at), l.to_owned()))
            });
            println!(
                "{role}, {}, user timeout {user_timeout:?}: {seen:?}",
                cut.map_or("SIGSTOP".to_owned(), |c| format!("{c:?}"))
            );
        }
    }
    // A live peer that computes for 3 s while a sender pushes more than its budget and the
    // socket buffers at it: with a 1 s user timeout, are its zero-window probes enough?
    let (a, b) = two_ranks(|builder| {
        builder
            .heartbeat(Duration::ZERO)
            .max_unexpected_bytes(1 << 20)
            .socket_setup(|socket, _| user_timeout(socket, Duration::from_secs(1)))
    });
    let computing = thread::spawn(move || {
        thread::sleep(Duration::from_secs(3));
        let got = (0..8)
            .map(|_| b.recv_bytes(0, 3).map(|m| m.len()))
            .collect::<Vec<_>>();
        (b, got)
    });
    let start = Instant::now();
    let sent: Vec<_> = (0..8)
        .map(|i| {
            a.send_bytes(1, 3, &pattern(0, i, 4 << 20))
                .map_err(|e| e.to_string())
        })
        .collect();
    println!(
        "computing peer, user timeout 1 s, heartbeats off: sends {sent:?} after {:?}",
        start.elapsed()
    );
    let (_b, got) = computing.join().expect("the computing rank");
    println!("computing peer received {got:?}");
}

fn main() {
    let netns = netns::unavailable();
    let trials = vec![
        common::trial(
            "sigstop_is_caught_under_the_default_timeout",
            sigstop_is_caught_under_the_default_timeout,
            None,
        ),
        common::trial(
            "a_computing_rank_is_not_lost",
            a_computing_rank_is_not_lost,
            None,
        ),
        common::trial(
            "link_down_during_transfer",
            link_down_during_transfer,
            netns,
        ),
        common::trial("link_down_while_idle", link_down_while_idle, netns),
        common::trial("drop_all_during_transfer", drop_all_during_transfer, netns),
        common::trial("drop_all_while_idle", drop_all_while_idle, netns),
        common::trial("measure_the_kernel_alone", measure_the_kernel_alone, netns)
            .with_ignored_flag(true),
    ];
    common::run_trials(trials, worker);
}
