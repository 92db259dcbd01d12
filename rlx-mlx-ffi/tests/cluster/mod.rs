//! Multi-process harness of the MLX tests: the test binary re-executes itself once per rank
//! with MLX's ring launch variables (`MLX_HOSTFILE`, `MLX_RANK`) on loopback, runs the
//! test's rank body in each child, and reaps the children within a deadline.
//!
//! Multi-process tests of one binary run one at a time: MLX's ring busy-polls a core for every
//! posted receive, so two clusters side by side on a small machine mostly measure each other.

#![allow(
    dead_code,
    reason = "each test file uses a different part of the harness"
)]

use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rlx_mlx_ffi::{Backend, MlxTransport};
use rlx_transport::Transport;

/// Set in a child to the name of the test it runs.
pub(crate) const CHILD_ENV: &str = "RLX_MLX_TEST_CHILD";

/// Operation timeout the children use, in milliseconds.
pub(crate) const CHILD_TIMEOUT_MS: u64 = 20_000;

/// How long a whole multi-process test may take before its children are killed.
const CLUSTER_DEADLINE: Duration = Duration::from_secs(180);

/// Held by the parent of a multi-process test while its ranks run.
static ONE_CLUSTER_AT_A_TIME: Mutex<()> = Mutex::new(());

fn one_cluster_at_a_time() -> MutexGuard<'static, ()> {
    // A test that failed while holding the lock leaves nothing behind that the next one needs.
    ONE_CLUSTER_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// What the parent expects of a rank's process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Expect {
    /// Exit status 0.
    Success,
    /// Killed by a signal (the test makes it die on purpose).
    Killed,
}

/// Whether this process is the child of test `name`; a child of another test returns early.
pub(crate) fn child_of(name: &str) -> Option<bool> {
    match std::env::var(CHILD_ENV) {
        Ok(v) if v == name => Some(true),
        Ok(_) => Some(false),
        Err(_) => None,
    }
}

/// A rank's part of a test: given the transport, or given it to share (for wrappers such as
/// the symmetric heap, which hold an `Arc`).
#[derive(Clone, Copy)]
pub(crate) enum Body {
    Borrowed(fn(&MlxTransport)),
    Shared(fn(&Arc<MlxTransport>)),
}

/// Runs `body` on every rank of a `world`-rank MLX ring on loopback.
pub(crate) fn ring(name: &str, world: u32, body: fn(&MlxTransport)) {
    ring_expecting(name, world, body, |_| Expect::Success);
}

/// [`ring`] for a body that shares the transport.
pub(crate) fn ring_shared(name: &str, world: u32, body: fn(&Arc<MlxTransport>)) {
    launch_ring(name, world, Body::Shared(body), |_| Expect::Success);
}

/// Like [`ring`], with a per-rank expectation of how the process ends.
pub(crate) fn ring_expecting(
    name: &str,
    world: u32,
    body: fn(&MlxTransport),
    expect: fn(u32) -> Expect,
) {
    launch_ring(name, world, Body::Borrowed(body), expect);
}

fn launch_ring(name: &str, world: u32, body: Body, expect: fn(u32) -> Expect) {
    match child_of(name) {
        Some(true) => return run_child(Backend::Ring, body),
        Some(false) => return,
        None => {}
    }
    let _alone = one_cluster_at_a_time();
    let dir = scratch_dir(name);
    let ports = rlx_transport::ports::free_loopback_ports(world as usize).expect("loopback ports");
    let hosts: Vec<String> = ports
        .iter()
        .map(|p| format!("[\"127.0.0.1:{p}\"]"))
        .collect();
    let hostfile = dir.join("hosts.json");
    std::fs::write(&hostfile, format!("[{}]", hosts.join(","))).expect("write the hostfile");
    let children: Vec<Child> = (0..world)
        .map(|rank| {
            let mut cmd = self_command(name, &dir, &format!("rank{rank}"));
            // MLX_RING_VERBOSE makes MLX log how its ring connects, for the failure report.
            cmd.env("MLX_RANK", rank.to_string())
                .env("MLX_HOSTFILE", &hostfile)
                .env("MLX_RING_VERBOSE", "1")
                .env("RLX_MLX_BACKEND", "ring");
            cmd.spawn().expect("spawn a rank")
        })
        .collect();
    reap(name, &dir, children, 1, |i| expect(i as u32));
}

/// Open MPI's `mpirun`, if it is on the `PATH`.
pub(crate) fn mpirun() -> Option<PathBuf> {
    which("mpirun")
}

/// Runs `body` on 2 ranks under `mpirun` with MLX's `mpi` backend; the caller has checked
/// that [`mpirun`] finds it.
pub(crate) fn mpi(name: &str, body: fn(&MlxTransport)) {
    match child_of(name) {
        Some(true) => return run_child(Backend::Mpi, Body::Borrowed(body)),
        Some(false) => return,
        None => {}
    }
    let mpirun = mpirun().expect("mpirun on the PATH");
    let _alone = one_cluster_at_a_time();
    let dir = scratch_dir(name);
    let exe = std::env::current_exe().expect("current test binary");
    let log = File::create(dir.join("mpirun.log")).expect("create the log");
    let child = Command::new(mpirun)
        .args(["--allow-run-as-root", "--oversubscribe", "-np", "2"])
        .args([
            "-x",
            CHILD_ENV,
            "-x",
            "RLX_MLX_BACKEND",
            "-x",
            "RLX_TIMEOUT_MS",
            "-x",
            "OMPI_MPI_THREAD_LEVEL",
        ])
        .arg(exe)
        .args([
            name,
            "--exact",
            "--nocapture",
            "--test-threads=1",
            "--color=never",
        ])
        .env(CHILD_ENV, name)
        .env("RLX_MLX_BACKEND", "mpi")
        // MlxTransport calls MPI from several threads (see `MlxTransport::init`).
        .env("OMPI_MPI_THREAD_LEVEL", "3")
        .env("RLX_TIMEOUT_MS", CHILD_TIMEOUT_MS.to_string())
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("clone the log"))
        .stderr(log)
        .spawn()
        .expect("spawn mpirun");
    // One log holds both ranks' output.
    reap(name, &dir, vec![child], 2, |_| Expect::Success);
}

fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

fn run_child(backend: Backend, body: Body) {
    let t = Arc::new(MlxTransport::init(backend).expect("join the MLX world"));
    match body {
        Body::Borrowed(body) => body(&t),
        Body::Shared(body) => body(&t),
    }
    let rank = t.rank();
    let start = Instant::now();
    // The body has dropped whatever shared the transport, so this closes it.
    drop(t);
    eprintln!("rank {rank}: closed the transport in {:?}", start.elapsed());
}

/// The test-binary arguments that make a child run test `name` alone, with plain output (its
/// summary line is what the parent counts).
fn child_args(name: &str) -> [&str; 5] {
    [
        name,
        "--exact",
        "--nocapture",
        "--test-threads=1",
        "--color=never",
    ]
}

fn self_command(name: &str, dir: &std::path::Path, log: &str) -> Command {
    let exe = std::env::current_exe().expect("current test binary");
    let out = File::create(dir.join(format!("{log}.log"))).expect("create the log");
    let mut cmd = Command::new(exe);
    cmd.args([
        name,
        "--exact",
        "--nocapture",
        "--test-threads=1",
        "--color=never",
    ])
    .env(CHILD_ENV, name)
    .env("RLX_TIMEOUT_MS", CHILD_TIMEOUT_MS.to_string())
    .stdin(Stdio::null())
    .stdout(out.try_clone().expect("clone the log"))
    .stderr(out);
    cmd
}

fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rlx-mlx-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create the scratch directory");
    dir
}

fn logs(dir: &std::path::Path) -> String {
    let mut out = String::new();
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .map(|r| r.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    entries.sort();
    for path in entries
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
    {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        out.push_str(&format!("==== {} ====\n{text}\n", path.display()));
    }
    out
}

/// Waits for `children` (each running `ranks_per_child` ranks) within the deadline and checks
/// how each ended. A child that should succeed must also have run its test: a rank whose test
/// name matched nothing would exit 0 having tested nothing, so every successful rank's log must
/// hold libtest's "1 passed" summary.
fn reap(
    name: &str,
    dir: &std::path::Path,
    mut children: Vec<Child>,
    ranks_per_child: usize,
    expect: impl Fn(usize) -> Expect,
) {
    let start = Instant::now();
    let mut statuses: Vec<Option<ExitStatus>> = vec![None; children.len()];
    while statuses.iter().any(Option::is_none) {
        if start.elapsed() > CLUSTER_DEADLINE {
            for child in &mut children {
                let _ = child.kill();
                let _ = child.wait();
            }
            panic!(
                "{name}: ranks still running after {CLUSTER_DEADLINE:?}\n{}",
                logs(dir)
            );
        }
        for (i, child) in children.iter_mut().enumerate() {
            if statuses[i].is_none() {
                statuses[i] = child.try_wait().expect("poll a rank");
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut wrong = Vec::new();
    for (i, status) in statuses.iter().enumerate() {
        let status = status.expect("every rank was reaped");
        let ok = match expect(i) {
            Expect::Success => status.success(),
            Expect::Killed => status.code().is_none(),
        };
        if !ok {
            wrong.push(format!("process {i}: {status} (expected {:?})", expect(i)));
        }
    }
    assert!(
        wrong.is_empty(),
        "{name}: {}\n{}",
        wrong.join("; "),
        logs(dir)
    );
    let succeeding = (0..children.len())
        .filter(|&i| expect(i) == Expect::Success)
        .count();
    let output = logs(dir);
    let ran = output.matches("test result: ok. 1 passed;").count();
    assert_eq!(
        ran,
        succeeding * ranks_per_child,
        "{name}: ranks that ran their test (is the test still named {name:?}?)\n{output}"
    );
    // RLX_MLX_TEST_LOGS=1 shows the ranks' output of passing tests too.
    if std::env::var_os("RLX_MLX_TEST_LOGS").is_some() {
        eprintln!("{}", logs(dir));
    }
    let _ = std::fs::remove_dir_all(dir);
}
