//! Shared harness of the multi-process tests: each test binary re-executes itself with
//! `RLX_NET_TEST_ROLE` set to run one rank as a real process, and the parent starts, waits for
//! (with a hard bound) and reaps those processes. The binaries use `harness = false`, so
//! [`run`] lists and runs the tests through libtest-mimic, with libtest's flags and summary.

#![allow(
    dead_code,
    reason = "each test binary uses a different part of the harness"
)]

pub(crate) mod in_process;
pub(crate) mod observed;

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use libtest_mimic::Trial;
use rlx_net::TcpTransport;
use rlx_transport::{CollectiveError, Transport};

/// Environment variable that selects a worker role in a re-executed test binary.
pub(crate) const ROLE: &str = "RLX_NET_TEST_ROLE";

/// A test: its name and body (which panics on failure).
pub(crate) type Test = (&'static str, fn());

/// Runs the worker role if one is selected, else the tests under libtest's command line
/// (filters, `--exact`, `--list`, `--ignored`, ...) and exits with libtest's conventions.
pub(crate) fn run(tests: &[Test], worker: fn(&str) -> Result<(), String>) -> ! {
    let trials = tests
        .iter()
        .map(|&(name, body)| trial(name, body, None))
        .collect();
    run_trials(trials, worker)
}

/// The trial of `body`; when `unavailable` names a reason this machine cannot run it, an
/// ignored trial that shows the reason instead (a failing one under `CI=true`, where every
/// test must run).
pub(crate) fn trial(name: &str, body: fn(), unavailable: Option<&'static str>) -> Trial {
    let in_ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
    match unavailable {
        None => Trial::test(name, move || {
            body();
            Ok(())
        }),
        Some(reason) if in_ci => Trial::test(name, move || {
            Err(format!("CI=true, yet this test cannot run here: {reason}").into())
        }),
        Some(reason) => Trial::test(name, || Ok(()))
            .with_ignored_flag(true)
            .with_kind(format!("skipped: {reason}")),
    }
}

/// [`run`] over trials made with [`trial`].
pub(crate) fn run_trials(trials: Vec<Trial>, worker: fn(&str) -> Result<(), String>) -> ! {
    if let Ok(role) = std::env::var(ROLE) {
        // The transport's warnings (refusals, lost peers) go to stderr, where tests read them.
        let filter = tracing_subscriber::EnvFilter::try_from_env("RLX_DEBUG")
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .init();
        match worker(&role) {
            Ok(()) => std::process::exit(0),
            Err(e) => {
                println!("worker error: {e}");
                std::process::exit(1);
            }
        }
    }
    let mut args = libtest_mimic::Arguments::from_args();
    // One test at a time unless asked otherwise: the tests count this process's threads and
    // sockets, and their worker processes share two cores.
    args.test_threads.get_or_insert(1);
    libtest_mimic::run(&args, trials).exit()
}

/// A loopback TCP port that was free a moment ago, below the ephemeral range (so that no
/// outgoing connection of a rank, or of anything else on the host, takes it before the rank
/// listens on it), and never the same twice in one process.
pub(crate) fn free_port() -> u16 {
    rlx_transport::ports::free_loopback_ports(1).expect("a free loopback port")[0]
}

/// Starts this test binary as a worker with `role` and the given environment.
pub(crate) fn spawn(role: &str, env: &[(String, String)]) -> Child {
    spawn_in(None, role, env)
}

/// Starts this test binary as a worker with `role` and the given environment, inside the
/// network namespace `netns` when one is given (`ip netns exec` runs it in the same process,
/// so the child's id is the worker's).
pub(crate) fn spawn_in(netns: Option<&str>, role: &str, env: &[(String, String)]) -> Child {
    let exe = std::env::current_exe().expect("current exe");
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns]).arg(exe);
            c
        }
        None => Command::new(exe),
    };
    cmd.env(ROLE, role)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for var in [
        "RLX_RANK",
        "RANK",
        "MLX_RANK",
        "OMPI_COMM_WORLD_RANK",
        "PMI_RANK",
        "SLURM_PROCID",
        "RLX_WORLD_SIZE",
        "WORLD_SIZE",
        "OMPI_COMM_WORLD_SIZE",
        "PMI_SIZE",
        "SLURM_NTASKS",
        "RLX_HOSTFILE",
        "MLX_HOSTFILE",
        "RLX_MASTER_ADDR",
        "RLX_MASTER_PORT",
        "MASTER_ADDR",
        "MASTER_PORT",
        "RLX_JOB_SECRET",
        "RLX_JOB_ID",
    ] {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().expect("spawn a worker")
}

/// Children that are killed and reaped if the test panics before waiting for them.
#[derive(Debug, Default)]
pub(crate) struct Reaper(pub(crate) Vec<Child>);

impl Reaper {
    /// Hands the children over to [`wait_all`].
    pub(crate) fn take(&mut self) -> Vec<Child> {
        std::mem::take(&mut self.0)
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// What a finished worker left behind.
#[derive(Debug)]
pub(crate) struct Finished {
    pub(crate) ok: bool,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

/// Waits for every child at most `limit` in total; kills and reaps the ones still running
/// and fails the test if any had to be killed.
pub(crate) fn wait_all(children: Vec<Child>, limit: Duration) -> Vec<Finished> {
    let deadline = Instant::now() + limit;
    let mut out = Vec::new();
    let mut hung = Vec::new();
    for (i, mut child) in children.into_iter().enumerate() {
        let status = loop {
            match child.try_wait().expect("try_wait") {
                Some(status) => break Some(status),
                None if Instant::now() >= deadline => break None,
                None => std::thread::sleep(Duration::from_millis(10)),
            }
        };
        if status.is_none() {
            let _ = child.kill();
            let _ = child.wait();
            hung.push(i);
        }
        let mut stdout = String::new();
        let mut stderr = String::new();
        if let Some(mut s) = child.stdout.take() {
            let _ = s.read_to_string(&mut stdout);
        }
        if let Some(mut s) = child.stderr.take() {
            let _ = s.read_to_string(&mut stderr);
        }
        out.push(Finished {
            ok: status.is_some_and(|s| s.success()),
            stdout,
            stderr,
        });
    }
    assert!(hung.is_empty(), "workers {hung:?} hung: {out:#?}");
    out
}

/// Asserts that every worker succeeded, printing all their output otherwise.
pub(crate) fn assert_all_ok(done: &[Finished]) {
    for (i, f) in done.iter().enumerate() {
        assert!(f.ok, "worker {i} failed: {done:#?}");
    }
}

/// Environment for rank `rank` of a store-rendezvous job under the `RLX_*` names.
pub(crate) fn rlx_env(rank: u32, world: u32, host: &str, port: u16) -> Vec<(String, String)> {
    vec![
        ("RLX_RANK".into(), rank.to_string()),
        ("RLX_WORLD_SIZE".into(), world.to_string()),
        ("RLX_MASTER_ADDR".into(), host.into()),
        ("RLX_MASTER_PORT".into(), port.to_string()),
        ("RLX_TIMEOUT_MS".into(), "30000".into()),
    ]
}

/// A hostfile of `world` loopback ranks with one free port each, as JSON.
pub(crate) fn loopback_hostfile(world: u32) -> (String, Vec<u16>) {
    let ports: Vec<u16> = (0..world).map(|_| free_port()).collect();
    let entries: Vec<String> = ports
        .iter()
        .map(|p| format!("[\"127.0.0.1:{p}\"]"))
        .collect();
    (format!("[{}]", entries.join(",")), ports)
}

/// Milliseconds since the Unix epoch (for comparing times across processes).
pub(crate) fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

/// Number of threads of this process.
pub(crate) fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(0, |d| d.count())
}

/// Number of threads of this process beyond `before`, once threads that were joined have left
/// the process's task list. A join returns as soon as the kernel has cleared the thread's id,
/// which comes before the thread is removed from `/proc/self/task`; on a loaded machine a
/// joined thread can therefore still be listed for a moment. A thread that is really left
/// running stays listed, so waiting up to `within` for the count to settle cannot hide one.
pub(crate) fn threads_beyond(before: usize, within: Duration) -> usize {
    let deadline = Instant::now() + within;
    loop {
        let extra = thread_count().saturating_sub(before);
        if extra == 0 || Instant::now() >= deadline {
            return extra;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether process `pid` is stopped (state `T` in `/proc/PID/stat`, after the command name,
/// which may itself hold spaces and parentheses).
pub(crate) fn is_stopped(pid: libc::pid_t) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let state = stat.rsplit_once(')')?.1.trim_start().chars().next()?;
            Some(state == 'T')
        })
        .unwrap_or(false)
}

/// A deterministic byte pattern for message `index` of `len` bytes from `from`.
pub(crate) fn pattern(from: u32, index: u64, len: usize) -> Vec<u8> {
    let mut x = (u64::from(from) + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ index.wrapping_mul(0xD1B5_4A32_D192_ED03);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Builds the transport of the current worker from its environment.
pub(crate) fn from_env() -> Result<TcpTransport, String> {
    TcpTransport::from_env().map_err(|e| format!("from_env: {e}"))
}

/// A ring exchange and a barrier: every rank sends a checked message to the next and receives
/// one from the previous.
pub(crate) fn ring_check(t: &dyn Transport) -> Result<(), String> {
    let (rank, n) = (t.rank(), t.world_size());
    let next = (rank + 1) % n;
    let prev = (rank + n - 1) % n;
    for (i, len) in [0usize, 1, 13, 4096, 100_003].into_iter().enumerate() {
        t.send_bytes(next, 5, &pattern(rank, i as u64, len))
            .map_err(|e| e.to_string())?;
        let got = t.recv_bytes(prev, 5).map_err(|e| e.to_string())?;
        if got != pattern(prev, i as u64, len) {
            return Err(format!(
                "rank {rank}: wrong bytes from {prev} at size {len}"
            ));
        }
    }
    t.barrier().map_err(|e| e.to_string())?;
    println!("ok rank {rank} of {n}");
    Ok(())
}

/// Runs `body(peer)` on one thread per peer of `t` until one returns; prints that first
/// error and when it came (`lost: ... at MS`), lingers for `linger` so that the other ranks
/// see the loss themselves before this one goes, then aborts `t` (which ends every other
/// thread's call) and joins them all.
pub(crate) fn until_first_failure(
    t: &Arc<TcpTransport>,
    linger: Duration,
    body: impl Fn(u32) -> CollectiveError + Send + Sync + 'static,
) -> Result<(), String> {
    until_first_failure_then(t, || std::thread::sleep(linger), body)
}

/// [`until_first_failure`] that, after the first error, lingers for as long as `linger` runs
/// instead of for a fixed time.
pub(crate) fn until_first_failure_then(
    t: &Arc<TcpTransport>,
    linger: impl FnOnce(),
    body: impl Fn(u32) -> CollectiveError + Send + Sync + 'static,
) -> Result<(), String> {
    let (rank, n) = (t.rank(), t.world_size());
    let body = Arc::new(body);
    let (tx, rx) = mpsc::channel::<(CollectiveError, u128)>();
    let threads: Vec<_> = (0..n)
        .filter(|&p| p != rank)
        .map(|peer| {
            let tx = tx.clone();
            let body = Arc::clone(&body);
            std::thread::spawn(move || {
                let err = body(peer);
                let _ = tx.send((err, now_ms()));
            })
        })
        .collect();
    drop(tx);
    let (first, at) = rx.recv().map_err(|e| format!("no thread reported: {e}"))?;
    println!("lost: {} at {at}", describe(&first));
    linger();
    t.abort();
    for h in threads {
        h.join().map_err(|_| "a peer thread panicked".to_owned())?;
    }
    Ok(())
}

/// Formats an error with its variant, for assertions in the parent.
pub(crate) fn describe(e: &CollectiveError) -> String {
    format!("{e:?} / {e}")
}

/// The wire protocol version the tests' hand-made hellos and registrations speak.
pub(crate) const PROTOCOL_VERSION: u32 = 10;

/// The 16-byte digest of the job id `job`, as the handshake sends it.
pub(crate) fn job_digest(job: &str) -> [u8; 16] {
    use sha2::Digest;
    let mut out = [0u8; 16];
    out.copy_from_slice(&sha2::Sha256::digest(job.as_bytes())[..16]);
    out
}

/// The hello of `rank`'s link 0 (of one) in a world of `world` of the job `job`, without a
/// secret, as a connector sends it (see `src/handshake.rs`).
pub(crate) fn hello(job: &str, world: u32, rank: u32) -> [u8; 72] {
    let mut h = [0u8; 72];
    h[0..8].copy_from_slice(b"RLXTCP\r\n");
    h[8..12].copy_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    h[16..32].copy_from_slice(&job_digest(job));
    h[32..36].copy_from_slice(&world.to_le_bytes());
    h[36..40].copy_from_slice(&rank.to_le_bytes());
    h[44..48].copy_from_slice(&1u32.to_le_bytes());
    h
}

/// What a hand-made rank of a hostfile rendezvous does once its link is accepted and before
/// any frame: it sends its networks (none) and reads the real rank's (a count, then each
/// network as its family, its octets and its prefix length), as `src/handshake.rs` says.
pub(crate) fn exchange_networks(link: &mut std::net::TcpStream) {
    use std::io::Write;
    link.write_all(&[0]).expect("this rank's networks");
    let mut count = [0u8; 1];
    link.read_exact(&mut count).expect("the rank's networks");
    for _ in 0..count[0] {
        let mut family = [0u8; 1];
        link.read_exact(&mut family).expect("a network's family");
        let mut rest = vec![0u8; if family[0] == 4 { 4 } else { 16 } + 1];
        link.read_exact(&mut rest).expect("a network");
    }
}

/// Waits until at least `n` connections to the local `port` are established (read from
/// `/proc/net/tcp{,6}`), so the test knows which ranks are already connected.
pub(crate) fn wait_established(port: u16, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let suffix = format!(":{port:04X}");
    loop {
        let count: usize = ["/proc/net/tcp", "/proc/net/tcp6"]
            .iter()
            .filter_map(|f| std::fs::read_to_string(f).ok())
            .map(|table| {
                table
                    .lines()
                    .filter(|l| {
                        let cols: Vec<&str> = l.split_whitespace().collect();
                        cols.len() > 3 && cols[1].ends_with(&suffix) && cols[3] == "01"
                    })
                    .count()
            })
            .sum();
        if count >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "only {count} connections to port {port}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `rounds` rounds of one-byte messages between every pair (tags 50, 51, ...): after the first
/// every peer has read this rank's first link, and so has taken its offer, and after the
/// second this rank's next send to it goes through its lane.
pub(crate) fn settle(t: &dyn rlx_transport::Transport, rounds: u32) -> Result<(), String> {
    let (rank, n) = (t.rank(), t.world_size());
    for round in 0..rounds {
        for peer in (0..n).filter(|&p| p != rank) {
            t.send_bytes(peer, 50 + round, &[rank as u8])
                .map_err(|e| e.to_string())?;
        }
        for peer in (0..n).filter(|&p| p != rank) {
            t.recv_bytes(peer, 50 + round).map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

/// Every size of `sizes` by exchange around the ring (to the next rank, from the previous)
/// into a posted buffer 5 bytes longer than the message, checked byte for byte and for the
/// untouched tail.
pub(crate) fn exchange_ring_exact(
    t: &dyn rlx_transport::Transport,
    sizes: &[usize],
) -> Result<(), String> {
    let (rank, n) = (t.rank(), t.world_size());
    let e = |what: &str, err: rlx_transport::CollectiveError| format!("rank {rank}, {what}: {err}");
    let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
    for (i, &len) in sizes.iter().enumerate() {
        let index = 100 + i as u64;
        let outgoing = pattern(rank, index, len);
        let mut buf = vec![0xEE; len + 5];
        let tag = rlx_transport::Tag::user(20).map_err(|err| e("tag", err))?;
        let got = t
            .send_recv_into(next, prev, tag, &[&outgoing], &mut buf, t.op_timeout())
            .map_err(|err| e("exchange", err))?;
        if got != Some(len)
            || buf[..len] != pattern(prev, index, len)[..]
            || buf[len..].iter().any(|&b| b != 0xEE)
        {
            return Err(format!(
                "rank {rank}: exchange of {len} bytes from rank {prev} differs ({got:?})"
            ));
        }
    }
    Ok(())
}
