//! Thread-per-rank harness for the collective tests: a world of [`ProcessGroup`]s over
//! [`MemTransport`], and a helper that runs one closure per rank and collects the results.

#![allow(
    dead_code,
    reason = "each test file uses a different part of the harness"
)]

pub(crate) mod checked;
pub(crate) mod departure;
pub(crate) mod hooked;

use std::sync::Arc;
use std::time::Duration;

use rlx_collective::{MemTransport, ProcessGroup, Transport};

/// Operation timeout of test worlds: long enough for a loaded 2-core machine, short enough
/// that a hang fails the test instead of stalling it.
pub(crate) const TEST_TIMEOUT: Duration = Duration::from_secs(60);

/// The world groups of an `n`-rank in-process world whose blocking calls give up after
/// `timeout`.
pub(crate) fn world_with_timeout(n: u32, timeout: Duration) -> Vec<ProcessGroup> {
    MemTransport::fan_out_with_timeout(n, timeout)
        .into_iter()
        .map(|t| ProcessGroup::new(t as Arc<dyn Transport>))
        .collect()
}

/// The world groups of an `n`-rank in-process world with [`TEST_TIMEOUT`].
pub(crate) fn world(n: u32) -> Vec<ProcessGroup> {
    world_with_timeout(n, TEST_TIMEOUT)
}

/// Runs `f` on every group on its own thread and returns the results in rank order. A panic
/// on any rank is re-raised here.
pub(crate) fn on_each<T, F>(groups: Vec<ProcessGroup>, f: F) -> Vec<T>
where
    T: Send + 'static,
    F: Fn(ProcessGroup) -> T + Send + Sync + 'static,
{
    let f = Arc::new(f);
    let threads: Vec<_> = groups
        .into_iter()
        .map(|g| {
            let f = Arc::clone(&f);
            std::thread::spawn(move || f(g))
        })
        .collect();
    threads
        .into_iter()
        .map(|t| match t.join() {
            Ok(v) => v,
            Err(panic) => std::panic::resume_unwind(panic),
        })
        .collect()
}

/// Children killed and reaped when a test ends, however it ends (a frozen one is resumed
/// first, so that the kill is not left pending).
pub(crate) struct Reaper(pub(crate) Vec<std::process::Child>);

impl Drop for Reaper {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = end(child);
        }
    }
}

/// Ends `child`, resuming it first if it was stopped (so that the kill is not left pending),
/// and returns how it ended; a child reaped already is only asked for its status again.
pub(crate) fn end(child: &mut std::process::Child) -> std::io::Result<std::process::ExitStatus> {
    if matches!(child.try_wait(), Ok(None)) {
        #[cfg(unix)]
        // SAFETY: the child has not been reaped (`try_wait` just found it running or
        // stopped), so its process id is still its own.
        unsafe {
            libc::kill(child.id() as libc::pid_t, libc::SIGCONT);
        }
        let _ = child.kill();
    }
    child.wait()
}

/// Stops `child` with SIGSTOP and returns once it has stopped, or `Err` when it ended
/// instead.
///
/// `kill(2)` returns when the signal is queued, not when the process has stopped: one of its
/// threads must run to begin the stop, and on a loaded machine the rank's other threads can run
/// first, so a test that lets the others go on at once could see the rank still take part.
/// `waitid(2)` reports the stop only once every thread has stopped; `WNOWAIT` leaves the report
/// (and an exit) for later waits.
#[cfg(unix)]
pub(crate) fn freeze(child: &std::process::Child) -> Result<(), ()> {
    let pid = libc::id_t::from(child.id());
    // SAFETY: `pid` is a child of this process that nobody has reaped (only `waitid` below
    // looks at it, with WNOWAIT), so the signal cannot reach another process.
    let sent = unsafe { libc::kill(pid as libc::pid_t, libc::SIGSTOP) };
    assert_eq!(sent, 0, "SIGSTOP: {}", std::io::Error::last_os_error());
    // SAFETY: `siginfo_t` is plain data, for which all zero bytes are a valid value.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: `info` is a valid, writable `siginfo_t`, and `pid` is our own child, not
        // reaped yet (WNOWAIT never reaps it).
        let waited = unsafe {
            libc::waitid(
                libc::P_PID,
                pid,
                &mut info,
                libc::WSTOPPED | libc::WEXITED | libc::WNOWAIT,
            )
        };
        if waited == 0 {
            break;
        }
        let error = std::io::Error::last_os_error();
        assert_eq!(
            error.kind(),
            std::io::ErrorKind::Interrupted,
            "waitid for process {pid}: {error}"
        );
    }
    if info.si_code == libc::CLD_STOPPED {
        Ok(())
    } else {
        Err(())
    }
}

/// The `rank,world,port` a re-executed worker was started with (see [`spawn_worker`]).
pub(crate) fn worker_spec(spec: &str) -> (u32, u32, u16) {
    let fields: Vec<u32> = spec
        .split(',')
        .map(|f| f.parse().expect("a numeric worker field"))
        .collect();
    let [rank, n, port] = fields[..] else {
        panic!("worker spec {spec:?} is not rank,world,port")
    };
    (rank, n, u16::try_from(port).expect("a port number"))
}

/// Starts this test binary again to run only `test`, with `var=spec` telling the copy which
/// rank it is; its standard streams are piped.
pub(crate) fn spawn_worker(test: &str, var: &str, spec: String) -> std::process::Child {
    use std::process::{Command, Stdio};
    let exe = std::env::current_exe().expect("this test binary");
    Command::new(exe)
        .args([test, "--exact", "--nocapture", "--test-threads", "1"])
        .env(var, spec)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("a worker process")
}

/// A free loopback port for a rendezvous.
pub(crate) fn free_port() -> u16 {
    rlx_transport::ports::free_loopback_ports(1).expect("a free loopback port")[0]
}

/// The builder of `rank` of an `n`-rank loopback world whose rendezvous is on `port`, with
/// operation timeout `op_timeout` (and 30 s to connect).
#[cfg(feature = "tcp")]
pub(crate) fn loopback_builder(
    rank: u32,
    n: u32,
    port: u16,
    op_timeout: Duration,
) -> rlx_net::TcpTransportBuilder {
    rlx_net::TcpTransport::builder()
        .rank(rank)
        .world_size(n)
        .master("127.0.0.1", port)
        .op_timeout(op_timeout)
        .connect_timeout(Duration::from_secs(30))
}

/// An `n`-rank TCP world on loopback with its rendezvous on `port`, one transport per thread
/// of this process, each built by `builder(rank, n, port)`.
///
/// Twice in hundreds of CI runs, rank 0 could not bind a port the picker had just found free
/// and leased ("Address already in use"); what held it is not known. Such a world is built
/// again on a fresh port (its other ranks give up after their connect timeout), so that an
/// occupied port fails no test; any other failure panics.
#[cfg(feature = "tcp")]
pub(crate) fn tcp_world(
    n: u32,
    port: u16,
    builder: fn(u32, u32, u16) -> rlx_net::TcpTransportBuilder,
) -> Vec<ProcessGroup> {
    let mut port = port;
    for _ in 0..3 {
        let builders: Vec<_> = (0..n)
            .map(|rank| std::thread::spawn(move || builder(rank, n, port).build()))
            .collect();
        let built: Vec<_> = builders
            .into_iter()
            .map(|b| b.join().expect("the builder thread"))
            .collect();
        let occupied = built.iter().any(|b| {
            b.as_ref()
                .is_err_and(|e| e.to_string().contains("Address already in use"))
        });
        if occupied {
            eprintln!("the rendezvous port {port} was occupied; building the world again");
            port = free_port();
            continue;
        }
        return built
            .into_iter()
            .map(|b| {
                let transport = b.expect("a loopback world");
                ProcessGroup::new(Arc::new(transport) as Arc<dyn Transport>)
            })
            .collect();
    }
    panic!("three rendezvous ports in a row were occupied");
}

/// Runs the conformance cases of `options` on every rank of a thread world of `world` ranks
/// and fails unless every rank ran some and passed them all.
pub(crate) fn exact_everywhere(
    world: u32,
    options: rlx_collective::conformance::ConformanceOptions,
) {
    let reports = on_each(self::world(world), move |group| {
        rlx_collective::conformance::run(&group, &options)
    });
    let mut cases = 0;
    for report in reports {
        let report = report.unwrap_or_else(|e| panic!("world {world}: the run failed: {e}"));
        assert!(report.passed(), "world {world}: {}", report.summary());
        cases = report.cases().len();
    }
    assert!(cases > 0, "world {world}: no case ran");
}
