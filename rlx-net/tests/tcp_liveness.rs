//! Liveness independent of the operation timeout: a peer that stops sending anything (a
//! process stopped with SIGSTOP, a pulled cable, a link that drops every packet) is lost within
//! five heartbeat intervals, and every survivor's error names it; a peer that merely computes
//! for a long time without calling its transport is not.
//!
//! - `sigstop_is_caught_under_the_default_timeout`: three ranks exchange messages pairwise
//!   under the default operation timeout (300 s) and heartbeat (1 s); one is stopped; both
//!   survivors must fail naming it within a few seconds, and the stopped rank, once resumed,
//!   must fail too instead of hanging.
//! - `a_resumed_rank_sees_what_arrived_while_it_was_stopped`: a rank stops itself right after
//!   a receive; its peer sends two messages meanwhile; once resumed, the rank receives the
//!   first and must find the second in a receive that does not wait.
//! - `a_computing_rank_is_not_lost`: in one process, a rank sleeps for three detection windows
//!   while its peer waits on it and pushes more than its unexpected budget at it; everything
//!   arrives and nobody is lost.
//! - `an_exchange_stuck_sending_still_hears_its_other_peer`: in one process, a rank whose
//!   exchange (a ring step) has its receive done but its send stuck behind a peer that reads
//!   nothing must go on hearing the peer it received from, and must keep that peer's message
//!   for a later receive when the send fails.
//! - In network namespaces (root only; ignored with the reason otherwise, failing under
//!   `CI=true`): three ranks, one rank's cable cut by taking its switch port down or by a `tc`
//!   rule that drops every packet, during a transfer and while the links are idle; both
//!   survivors must fail naming it within twice the window (see `WINDOW_MS`).
//! - `the_kernel_alone_misses_what_heartbeats_catch` (namespaces too): with heartbeats off,
//!   what the kernel notices by itself, with and without `TCP_USER_TIMEOUT` (see its doc).
//!
//! In the three-rank scenarios each worker keeps its links open after its first failure
//! until every survivor has reported its own (an empty file in a directory the test gives the
//! workers), so that no survivor sees another one go and blames it instead of the victim.
//!
//! `RLX_NET_TEST_LIVENESS_ROUNDS=N` repeats each multi-process scenario N times and prints the
//! detection times (min/median/max).

mod common;
mod netns;

use std::io::{BufRead, BufReader, Lines};
use std::path::{Path, PathBuf};
use std::process::ChildStdout;
use std::sync::atomic::{AtomicU32, Ordering};
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
/// The default detection window: five beats of 1 s. A survivor must notice within twice
/// this: the window itself, then as much again for a loaded machine that schedules the
/// watcher late (silence is measured to a quarter beat).
const WINDOW_MS: u128 = 5_000;
/// The environment variable naming the directory where each worker reports its first failure
/// (an empty file `lost-RANK`).
const REPORTS: &str = "RLX_NET_TEST_REPORTS";
/// The longest a worker waits, after its first failure, for the survivors' reports: a bound
/// for a survivor that never fails, far above the time between two survivors' detections.
const LINGER_CAP: Duration = Duration::from_secs(30);
/// The tag under which the idle workers wait for a message that never comes.
const NEVER: u32 = 2;

/// Rounds of each multi-process scenario.
fn rounds() -> u32 {
    env_number("RLX_NET_TEST_LIVENESS_ROUNDS", 1) as u32
}

/// The number in the environment variable `name`, or `default` when it is unset or no number.
fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One thread per peer, each running the role's traffic with its peer until one fails; prints
/// the first failure and when it came, lingers so the other survivors see the loss themselves
/// (see [`linger`]), then aborts and joins. The roles:
/// - `transfer`: checked messages both ways with every peer;
/// - `idle`: a wait for a message that never comes;
/// - `push`: one way, every survivor only sends to the victim, which only receives, while the
///   survivors wait on each other for a message nobody sends. A survivor thus always has data
///   in flight towards the victim when its cable is cut (in an exchange it may be cut while it
///   waits to receive, with nothing unacknowledged).
fn traffic_worker(role: &str) -> Result<(), String> {
    let reports = PathBuf::from(std::env::var(REPORTS).map_err(|e| format!("{REPORTS}: {e}"))?);
    let t = Arc::new(transport_from_env()?);
    t.barrier().map_err(|e| format!("first barrier: {e}"))?;
    // Every wait of the traffic below begins after this moment.
    println!("ready at {}", now_ms());
    let rank = t.rank();
    let peers = Arc::clone(&t);
    let role = role.to_owned();
    common::until_first_failure_then(
        &t,
        || linger(&reports, rank),
        move |peer| {
            let t = &*peers;
            match (role.as_str(), rank == VICTIM, peer == VICTIM) {
                ("idle", _, _) | ("push", false, false) => wait_forever(t, peer),
                ("push", true, _) => traffic(t, rank, peer, Flow::Receive),
                ("push", false, true) => traffic(t, rank, peer, Flow::Send),
                _ => traffic(t, rank, peer, Flow::Both),
            }
        },
    )
}

/// Reports the first failure of `rank` in `reports`, then waits until every survivor has
/// reported its own (at most [`LINGER_CAP`]) before the worker ends its links: a survivor
/// that ended them at once, or after a fixed time, could be seen going by another survivor
/// that has not noticed the victim yet, and be blamed instead of it.
fn linger(reports: &Path, rank: u32) {
    let report = |r: u32| reports.join(format!("lost-{r}"));
    if let Err(e) = std::fs::write(report(rank), b"") {
        println!("cannot report the first failure: {e}");
    }
    let start = Instant::now();
    while (0..WORLD).any(|r| r != VICTIM && !report(r).exists()) && start.elapsed() < LINGER_CAP {
        thread::sleep(Duration::from_millis(10));
    }
}

/// A fresh directory for the workers' reports (see [`linger`]), removed on drop.
struct Reports(PathBuf);

impl Reports {
    fn new() -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "rlx-liveness-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&dir).expect("a directory for the reports");
        Reports(dir)
    }
}

impl Drop for Reports {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
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

/// Which way [`traffic`]'s messages go.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Flow {
    /// To the peer only.
    Send,
    /// From the peer only.
    Receive,
    /// Both ways, a send then a receive.
    Both,
}

/// Sends checked messages to `peer` and receives and checks `peer`'s, in turns or one way as
/// `flow` says, until something fails.
fn traffic(t: &dyn Transport, rank: u32, peer: u32, flow: Flow) -> CollectiveError {
    let send = flow != Flow::Receive;
    let receive = flow != Flow::Send;
    let out = pattern(rank, 0, LEN);
    let want = pattern(peer, 0, LEN);
    let mut buf = vec![0u8; LEN];
    let tag = match Tag::user(1) {
        Ok(tag) => tag,
        Err(e) => return e,
    };
    loop {
        if send {
            if let Err(e) = t.send_bytes(peer, 1, &out) {
                return e;
            }
        }
        if receive {
            match t.recv_message_into(peer, tag, &mut buf, t.op_timeout()) {
                Ok(Some(len)) if len == LEN && buf == want => {}
                Ok(None) => return timed_out(t, peer),
                Ok(other) => {
                    return CollectiveError::protocol(
                        Some(peer),
                        format!("wrong message: {other:?}"),
                    );
                }
                Err(e) => return e,
            }
        }
        if send {
            thread::sleep(Duration::from_millis(2));
        }
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

/// Rank 1 of two: receives a first message, stops itself (SIGSTOP) right after, and once
/// resumed receives the message sent while it was stopped, then looks without waiting for the
/// one sent after it. Prints `second: N` (its length) or `second: none`.
fn stopping_worker() -> Result<(), String> {
    let t = common::from_env()?;
    t.recv_bytes(0, 1)
        .map_err(|e| format!("first message: {e}"))?;
    println!("stopping");
    // SAFETY: `raise` has no memory-safety preconditions; the process stops until SIGCONT.
    unsafe {
        libc::raise(libc::SIGSTOP);
    }
    let tag = |n| Tag::user(n).map_err(|e| e.to_string());
    let want = pattern(0, 2, 1024);
    let got = t
        .recv_message(0, tag(2)?, Duration::from_secs(10))
        .map_err(|e| format!("message sent during the stop: {e}"))?;
    if got.as_deref() != Some(&want[..]) {
        return Err(format!("wrong message sent during the stop: {got:?}"));
    }
    match t.recv_message(0, tag(3)?, Duration::ZERO) {
        Ok(Some(message)) => println!("second: {}", message.len()),
        Ok(None) => println!("second: none"),
        Err(e) => return Err(format!("looking for the second message: {e}")),
    }
    t.barrier().map_err(|e| format!("last barrier: {e}"))
}

/// A rank resumed from a stop sees, in a receive that does not wait, what its peer sent while
/// it was stopped: here the second of two messages, which arrived behind the first in the same
/// socket and so was still unparsed when the receive of the first returned. This is how a
/// resumed rank finds the failure notices its group sent while it was stopped.
fn a_resumed_rank_sees_what_arrived_while_it_was_stopped() {
    for _ in 0..rounds() {
        let port = free_port();
        let child = spawn_in(
            None,
            "stops_itself",
            &[
                ("RLX_RANK".into(), "1".into()),
                ("RLX_WORLD_SIZE".into(), "2".into()),
                ("RLX_MASTER_ADDR".into(), "127.0.0.1".into()),
                ("RLX_MASTER_PORT".into(), port.to_string()),
            ],
        );
        let mut reaper = Reaper(vec![child]);
        let pid = reaper.0[0].id() as libc::pid_t;
        let t = TcpTransport::builder()
            .rank(0)
            .world_size(2)
            .master("127.0.0.1", port)
            .build()
            .expect("rank 0");
        t.send_bytes(1, 1, &pattern(0, 1, 64))
            .expect("first message");
        let stopped = Instant::now();
        while !common::is_stopped(pid) {
            assert!(
                stopped.elapsed() < Duration::from_secs(10),
                "rank 1 did not stop"
            );
            thread::sleep(Duration::from_millis(5));
        }
        t.send_bytes(1, 2, &pattern(0, 2, 1024)).expect("message 2");
        t.send_bytes(1, 3, &pattern(0, 3, 512)).expect("message 3");
        // Longer than any round of the stopped rank's watcher, shorter than its heartbeat
        // window: it must find out it was stopped from the clock alone.
        thread::sleep(Duration::from_millis(600));
        // SAFETY: `pid` is our own child, not yet reaped, so the id names that process.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0, "SIGCONT");
        t.barrier().expect("last barrier");
        let done = wait_all(reaper.take(), Duration::from_secs(30));
        assert!(done[0].ok, "rank 1 failed: {done:#?}");
        assert!(
            done[0].stdout.contains("second: 512"),
            "the resumed rank did not see the second message: {done:#?}"
        );
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
        "transfer" | "idle" | "push" => traffic_worker(role),
        "stops_itself" => stopping_worker(),
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
/// the survivors, the victim, the victim's output lines and the workers' reports (kept until
/// the workers are done).
fn start_world(
    role: &str,
    host: &str,
    port: u16,
    netns: impl Fn(u32) -> Option<String>,
    extra: &[(String, String)],
) -> (Reaper, Reaper, Lines<BufReader<ChildStdout>>, Reports) {
    let reports = Reports::new();
    let mut extra = extra.to_vec();
    extra.push((REPORTS.to_owned(), reports.0.display().to_string()));
    let mut survivors = Reaper::default();
    let mut victim = Reaper::default();
    for rank in 0..WORLD {
        let child = spawn_in(netns(rank).as_deref(), role, &env(rank, host, port, &extra));
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
        lines
            .by_ref()
            .map_while(Result::ok)
            .any(|l| l.starts_with("ready at ")),
        "the victim ended before its first barrier"
    );
    thread::sleep(Duration::from_millis(300));
    (survivors, victim, lines, reports)
}

/// Checks that every survivor failed with `PeerLost` naming the victim as silent, within twice
/// the window of `cut_at` (see [`WINDOW_MS`]); returns the detection times in ms.
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
            after < 2 * WINDOW_MS,
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
        let (mut survivors, mut victim, lines, _reports) =
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

/// `world` ranks in this process over loopback, each built by `adjust` on a plain builder.
fn ranks_in_process(
    world: u32,
    adjust: fn(TcpTransportBuilder) -> TcpTransportBuilder,
) -> Vec<TcpTransport> {
    let port = free_port();
    let builders: Vec<_> = (0..world)
        .map(|rank| {
            thread::spawn(move || {
                adjust(TcpTransport::builder())
                    .rank(rank)
                    .world_size(world)
                    .master("127.0.0.1", port)
                    .build()
                    .expect("build")
            })
        })
        .collect();
    builders
        .into_iter()
        .map(|b| b.join().expect("a rank's build"))
        .collect()
}

/// Two ranks in this process over loopback, both built by `adjust` on a plain builder.
fn two_ranks(
    adjust: fn(TcpTransportBuilder) -> TcpTransportBuilder,
) -> (TcpTransport, TcpTransport) {
    let mut ranks = ranks_in_process(2, adjust);
    let b = ranks.pop().expect("rank 1");
    (ranks.pop().expect("rank 0"), b)
}

fn a_computing_rank_is_not_lost() {
    // Beats of half a second: a window of 2.5 s, which a loaded machine does not delay a beat
    // past, and short enough for the computation to span three of them in a few seconds.
    const BEAT: Duration = Duration::from_millis(500);
    // Three detection windows of five beats, and one beat more.
    const COMPUTE: Duration = Duration::from_millis(3 * 5 * 500 + 500);
    const BIG: usize = 4 << 20;
    let (a, b) = two_ranks(|builder| builder.heartbeat(BEAT).max_unexpected_bytes(1 << 20));
    // Before the computing rank starts, so that its computation lies within what is measured.
    let start = Instant::now();
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

/// Rank 1 exchanges with two peers at once (a ring step: receives a small message from rank
/// 0, sends a large one to rank 2); its receive completes at once, while its send stays stuck
/// behind rank 2, which is alive but reads nothing (its unexpected budget is full), until the
/// operation timeout. Rank 0 waits meanwhile, sending nothing but beats. Rank 1 must go on
/// hearing rank 0: once an exchange's receive is complete, the exchange must stop holding the
/// reader role of rank 0's links, or nobody reads its beats and a live rank is declared
/// silent (seen when a rank of a ring was stopped: its neighbour blamed a live rank too).
fn an_exchange_stuck_sending_still_hears_its_other_peer() {
    // Twice the detection window and more: rank 0's beats go unread for that long if the
    // exchange keeps its links.
    const STUCK: Duration = Duration::from_secs(12);
    const BIG: usize = 32 << 20;
    let mut ranks = ranks_in_process(3, |builder| {
        // TCP only, so that the stuck send blocks on a socket; and a small budget, so that
        // rank 2 stops reading rank 1 after one MiB.
        builder
            .op_timeout(STUCK)
            .single_copy(false)
            .lane_bytes(0)
            .max_unexpected_bytes(1 << 20)
    });
    let idle = ranks.pop().expect("rank 2");
    let exchanging = ranks.pop().expect("rank 1");
    let waiting = ranks.pop().expect("rank 0");
    let (starting, started) = mpsc::channel();
    let rank1 = thread::spawn(move || {
        // One message fills rank 2's budget (a first message is always admitted), so that it
        // leaves the exchange's frames unread.
        exchanging
            .send_bytes(2, 5, &vec![5u8; 1 << 20])
            .expect("a message that fills rank 2's budget");
        let mut small = [0u8; 1024];
        starting.send(()).expect("rank 0 waits for the exchange");
        let error = exchanging
            .send_recv_into(
                2,
                0,
                Tag::user(3).expect("a user tag"),
                &[&vec![7u8; BIG]],
                &mut small,
                STUCK,
            )
            .expect_err("rank 2 receives nothing: the send must time out");
        let text = error.to_string();
        assert!(
            text.contains("rank 2"),
            "the stuck send names rank 2: {text}"
        );
        // The failed exchange left rank 0's message for a later receive.
        let mine = exchanging.recv_bytes_timeout(0, 3, Duration::ZERO);
        assert!(
            matches!(&mine, Ok(Some(m)) if m[..] == [1u8; 1024]),
            "rank 0's message, kept: {:?}",
            mine.map(|m| m.map(|m| m.len()))
        );
        // Rank 0 is as alive as ever.
        exchanging
            .send_bytes(0, 4, b"still here")
            .expect("rank 1 sends to rank 0 after its exchange");
        exchanging
    });
    // Sent once the exchange has most likely posted its receive, so that the receive holds
    // rank 0's links (a message that arrived earlier is taken from the queue instead, and the
    // test still checks that it is kept).
    started.recv().expect("rank 1 starts its exchange");
    thread::sleep(Duration::from_secs(1));
    waiting
        .send_bytes(1, 3, &[1u8; 1024])
        .expect("rank 0's message to rank 1");
    let reply = waiting
        .recv_bytes_timeout(1, 4, STUCK * 5)
        .expect("rank 1 must not have lost rank 0");
    assert_eq!(reply.as_deref(), Some(&b"still here"[..]));
    let exchanging = rank1.join().expect("rank 1");
    drop((exchanging, idle));
}

/// Runs one link-cut scenario in namespaces: `role` is `transfer` or `idle`.
fn cut_in_namespaces(role: &str, how: Cut) {
    let what = format!("{how:?} while {role}");
    let mut times = Vec::new();
    for _ in 0..rounds() {
        let switch = Switch::create(WORLD).expect("namespaces");
        let (mut survivors, _victim, _lines, _reports) = start_world(
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

/// What a survivor sees when the kernel alone has to notice a silent peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum KernelSees {
    /// Nothing: the operation timeout ends the wait.
    Nothing,
    /// Its `TCP_USER_TIMEOUT` on unacknowledged data: the link fails with "timed out".
    UserTimeout,
}

/// The operation timeout of [`the_kernel_alone_misses_what_heartbeats_catch`]: shorter than
/// keepalive's first probe (30 s), longer than the 5 s user timeout with room to spare.
const KERNEL_OP_TIMEOUT_MS: u128 = 15_000;

/// What the kernel alone notices, with heartbeats off, under a 15 s operation timeout: a
/// stopped process keeps acknowledging from its kernel, so nothing but the operation timeout
/// ends the wait, with or without `TCP_USER_TIMEOUT`; a pulled cable is noticed by a 5 s user
/// timeout only where data is unacknowledged (by a survivor pushing data at the victim, not
/// while idle, nor by one that waited to receive when the cable went), and without
/// one not before TCP's retransmissions give up (about 15 minutes). And a user timeout shorter
/// than a computation makes a live peer look dead: Linux applies it to zero-window probes.
/// This is why the links beat instead (the scenarios above).
fn the_kernel_alone_misses_what_heartbeats_catch() {
    let cases: [(&str, Option<Cut>, Option<u64>, KernelSees); 7] = [
        ("transfer", None, None, KernelSees::Nothing),
        ("transfer", None, Some(5_000), KernelSees::Nothing),
        ("idle", None, Some(5_000), KernelSees::Nothing),
        ("transfer", Some(Cut::LinkDown), None, KernelSees::Nothing),
        (
            "push",
            Some(Cut::LinkDown),
            Some(5_000),
            KernelSees::UserTimeout,
        ),
        ("idle", Some(Cut::LinkDown), None, KernelSees::Nothing),
        (
            "idle",
            Some(Cut::LinkDown),
            Some(5_000),
            KernelSees::Nothing,
        ),
    ];
    for (role, cut, user_timeout, expected) in cases {
        let what = format!(
            "{role}, {}, user timeout {user_timeout:?}",
            cut.map_or("SIGSTOP".to_owned(), |c| format!("{c:?}"))
        );
        let switch = Switch::create(WORLD).expect("namespaces");
        let mut extra = vec![
            ("RLX_HEARTBEAT_MS".to_owned(), "0".to_owned()),
            (
                "RLX_TIMEOUT_MS".to_owned(),
                KERNEL_OP_TIMEOUT_MS.to_string(),
            ),
        ];
        if let Some(ms) = user_timeout {
            extra.push(("RLX_NET_TEST_USER_TIMEOUT_MS".to_owned(), ms.to_string()));
        }
        let (mut survivors, victim, _lines, _reports) = start_world(
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
            let timestamp = |prefix: &str| {
                f.stdout
                    .lines()
                    .find(|l| l.starts_with(prefix))
                    .and_then(|l| Some((l, l.rsplit(' ').next()?.parse::<u128>().ok()?)))
                    .unwrap_or_else(|| panic!("{what}: a survivor said no {prefix:?}: {done:#?}"))
            };
            let (line, lost_at) = timestamp("lost: ");
            let (_, ready_at) = timestamp("ready at ");
            let after = lost_at.saturating_sub(at);
            println!("{what}: after {after} ms: {line}");
            match expected {
                // Every wait of the survivor began after it was ready, which on a loaded
                // machine may be well before the cut. The clock behind the timestamps is not
                // the one behind the timeout: a few milliseconds of tolerance.
                KernelSees::Nothing => assert!(
                    line.contains("Timeout {")
                        && lost_at.saturating_sub(ready_at) + 100 >= KERNEL_OP_TIMEOUT_MS,
                    "{what}: the kernel noticed before the operation timeout: {line}"
                ),
                // The user timeout ends the link: the read that hit it says "timed out", a
                // write that came after it finds the socket gone ("Broken pipe").
                KernelSees::UserTimeout => assert!(
                    line.contains(&format!("PeerLost {{ peer: {VICTIM},"))
                        && !line.contains("Timeout {")
                        && after + 3_000 < KERNEL_OP_TIMEOUT_MS,
                    "{what}: the user timeout did not end the wait: {line}"
                ),
            }
        }
    }
    // A live peer that computes for 3 s while a sender pushes more than its budget and the
    // socket buffers at it: a 1 s user timeout ends the sender's link although the peer lives.
    // The bytes must sit in the sockets, so the two ranks of this host keep their large
    // messages on TCP instead of reading them from each other's memory, and their first link
    // on its socket instead of a shared-memory lane.
    let (a, b) = two_ranks(|builder| {
        builder
            .single_copy(false)
            .lane_bytes(0)
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
        .map(|i| a.send_bytes(1, 3, &pattern(0, i, 4 << 20)))
        .collect();
    println!(
        "computing peer, user timeout 1 s, heartbeats off: sends {sent:?} after {:?}",
        start.elapsed()
    );
    let (_b, got) = computing.join().expect("the computing rank");
    println!("computing peer received {got:?}");
    assert!(
        sent.iter().any(Result::is_err) && got.iter().any(Result::is_err),
        "a 1 s user timeout did not break the link to a peer computing for 3 s"
    );
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
            "a_resumed_rank_sees_what_arrived_while_it_was_stopped",
            a_resumed_rank_sees_what_arrived_while_it_was_stopped,
            None,
        ),
        common::trial(
            "a_computing_rank_is_not_lost",
            a_computing_rank_is_not_lost,
            None,
        ),
        common::trial(
            "an_exchange_stuck_sending_still_hears_its_other_peer",
            an_exchange_stuck_sending_still_hears_its_other_peer,
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
        common::trial(
            "the_kernel_alone_misses_what_heartbeats_catch",
            the_kernel_alone_misses_what_heartbeats_catch,
            netns,
        ),
    ];
    common::run_trials(trials, worker);
}
