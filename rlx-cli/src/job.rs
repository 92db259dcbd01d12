//! Launching the ranks of a local job as child processes, the way a user's launcher would: each
//! rank gets its environment, its stdout and stderr are streamed back line by line, and every
//! child is killed and reaped on every exit path — normal return, error, panic and Ctrl-C.
//!
//! Ctrl-C and SIGTERM go through one process-wide handler ([`install_interrupt_handler`]) that
//! kills every registered child and runs the registered cleanups (network namespaces) before
//! the launcher exits, because a signal does not run destructors.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::sync::{Arc, Mutex, Once};
use std::thread;
use std::time::Duration;

/// Process ids of the children alive right now, killed by the interrupt handler.
static LIVE_CHILDREN: Mutex<Vec<u32>> = Mutex::new(Vec::new());

/// A cleanup, called with the key it was registered under.
type Cleanup = fn(&str);

/// Cleanups the interrupt handler runs after killing the children, keyed by a name so that the
/// normal path can unregister the ones it ran itself.
static CLEANUPS: Mutex<BTreeMap<String, Cleanup>> = Mutex::new(BTreeMap::new());

/// Installs the Ctrl-C / SIGTERM handler once per process. Safe to call many times.
pub fn install_interrupt_handler() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let installed = ctrlc::set_handler(|| {
            eprintln!("\nrlx: interrupted; killing every rank and cleaning up");
            kill_all_registered();
            run_registered_cleanups();
            std::process::exit(130);
        });
        if let Err(e) = installed {
            eprintln!("rlx: could not install the Ctrl-C handler ({e}); an interrupt may leave ranks behind");
        }
    });
}

/// Registers `cleanup(key)` to run if the launcher is interrupted before
/// [`unregister_cleanup`]`(key)` is called.
pub fn register_cleanup(key: &str, cleanup: Cleanup) {
    lock(&CLEANUPS).insert(key.to_owned(), cleanup);
}

/// Removes a cleanup registered with [`register_cleanup`] (the normal path ran it itself).
pub fn unregister_cleanup(key: &str) {
    lock(&CLEANUPS).remove(key);
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding these locks cannot leave the vector or map half-updated, so a
    // poisoned lock is still safe to use; cleanup must go on.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn kill_all_registered() {
    for pid in lock(&LIVE_CHILDREN).drain(..) {
        kill_pid(pid);
    }
}

fn run_registered_cleanups() {
    let cleanups = std::mem::take(&mut *lock(&CLEANUPS));
    for (key, cleanup) in cleanups {
        cleanup(&key);
    }
}

/// Sends SIGKILL to `pid`.
fn kill_pid(pid: u32) {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    // SAFETY: `kill` has no memory-safety preconditions; `pid` is a child this process spawned
    // and has not reaped yet (it is removed from the registry before it is waited for), so the
    // id cannot have been recycled for an unrelated process.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
    }
}

/// `n` distinct free TCP ports on the loopback interface, outside the kernel's ephemeral
/// range (see `rlx_transport::ports`): ranks listen on them a moment later.
pub fn free_ports(n: usize) -> Result<Vec<u16>, String> {
    rlx_transport::ports::free_loopback_ports(n).map_err(|e| e.to_string())
}

/// One free TCP port on the loopback interface, as [`free_ports`] chooses them.
pub fn free_port() -> Result<u16, String> {
    free_ports(1).map(|ports| ports[0])
}

/// How to start one child of a job.
#[derive(Debug, Clone)]
pub struct ChildSpec {
    /// A short name for messages (`"rank 2"`, `"openmpi"`).
    pub label: String,
    /// The program to execute.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// Variables added to the inherited environment.
    pub env: Vec<(String, String)>,
    /// Variables removed from the inherited environment (so that a user's own `RLX_*` settings
    /// cannot leak into a launched rank).
    pub env_remove: Vec<String>,
    /// The network namespace to run it in (`ip netns exec NAME`), if any.
    pub netns: Option<String>,
    /// The CPU to bind it to (Linux), if any.
    pub cpu: Option<usize>,
}

impl ChildSpec {
    /// A spec for `program` with no arguments, environment changes or namespace.
    pub fn new(label: impl Into<String>, program: impl Into<PathBuf>) -> ChildSpec {
        ChildSpec {
            label: label.into(),
            program: program.into(),
            args: Vec::new(),
            env: Vec::new(),
            env_remove: Vec::new(),
            netns: None,
            cpu: None,
        }
    }

    /// Binds the child to one CPU (on Linux; elsewhere it runs unbound), as `mpirun` binds its
    /// ranks.
    pub fn on_cpu(mut self, cpu: usize) -> ChildSpec {
        self.cpu = Some(cpu);
        self
    }

    /// Appends arguments.
    pub fn args<I, S>(mut self, args: I) -> ChildSpec
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Sets one environment variable.
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> ChildSpec {
        self.env.push((key.into(), value.into()));
        self
    }

    fn command(&self) -> Command {
        let mut command = match &self.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(&self.program);
                c
            }
            None => Command::new(&self.program),
        };
        command.args(&self.args);
        #[cfg(target_os = "linux")]
        if let Some(cpu) = self.cpu {
            use std::os::unix::process::CommandExt;
            // SAFETY: the closure runs in the forked child before exec, where only
            // async-signal-safe work is allowed: it fills a CPU set on its own stack and makes
            // one system call, allocating nothing and taking no lock.
            unsafe {
                command.pre_exec(move || {
                    let mut set: libc::cpu_set_t = std::mem::zeroed();
                    libc::CPU_SET(cpu, &mut set);
                    if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0
                    {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        for key in &self.env_remove {
            command.env_remove(key);
        }
        for (key, value) in &self.env {
            command.env(key, value);
        }
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        command
    }
}

/// Which stream of a child a line came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// Standard output (the machine-readable protocol).
    Stdout,
    /// Standard error (logs, shown to the user).
    Stderr,
}

/// Something a child did, in the order the launcher observed it.
#[derive(Debug)]
pub enum Output {
    /// One line (without its newline) on one of its streams.
    Line {
        /// Index of the child in the job.
        child: usize,
        /// The stream.
        stream: Stream,
        /// The text.
        text: String,
    },
    /// The child's stdout and stderr both reached end of file (it exited or closed them).
    Closed {
        /// Index of the child in the job.
        child: usize,
    },
}

/// The children of one job. Dropping it kills and reaps every child still running.
#[derive(Debug)]
pub struct Job {
    labels: Vec<String>,
    children: Vec<Option<Child>>,
    stdins: Vec<Option<ChildStdin>>,
    statuses: Vec<Option<ExitStatus>>,
    rx: Receiver<Output>,
    tx: Sender<Output>,
}

impl Job {
    /// Starts every child. If one cannot be started, the ones already started are killed.
    pub fn spawn(specs: &[ChildSpec]) -> Result<Job, String> {
        install_interrupt_handler();
        let (tx, rx) = channel();
        let mut job = Job {
            labels: Vec::new(),
            children: Vec::new(),
            stdins: Vec::new(),
            statuses: Vec::new(),
            rx,
            tx,
        };
        for spec in specs {
            job.add(spec)?;
        }
        Ok(job)
    }

    /// Starts one more child (a replacement for one that ended, say); returns its index.
    pub fn add(&mut self, spec: &ChildSpec) -> Result<usize, String> {
        let index = self.children.len();
        // The registry lock is held across the spawn so that an interrupt arriving in
        // between cannot miss the new child.
        let mut registry = lock(&LIVE_CHILDREN);
        let mut child = spec.command().spawn().map_err(|e| {
            format!(
                "could not start {} ({}): {e}",
                spec.label,
                spec.program.display()
            )
        })?;
        registry.push(child.id());
        drop(registry);
        // Both streams are piped, so both readers exist; the last one to finish reports
        // the child closed, so that no line of either stream comes after `Closed`.
        let open_streams = Arc::new(AtomicUsize::new(2));
        if let Some(stdout) = child.stdout.take() {
            forward_lines(
                index,
                Stream::Stdout,
                stdout,
                self.tx.clone(),
                Arc::clone(&open_streams),
            );
        }
        if let Some(stderr) = child.stderr.take() {
            forward_lines(index, Stream::Stderr, stderr, self.tx.clone(), open_streams);
        }
        self.labels.push(spec.label.clone());
        self.stdins.push(child.stdin.take());
        self.children.push(Some(child));
        self.statuses.push(None);
        Ok(index)
    }

    /// The label of child `index`.
    pub fn label(&self, index: usize) -> &str {
        self.labels.get(index).map_or("?", String::as_str)
    }

    /// The next output of any child, waiting at most `timeout`. `None` on deadline, or when
    /// every stream is closed.
    pub fn next(&self, timeout: Duration) -> Option<Output> {
        match self.rx.recv_timeout(timeout) {
            Ok(output) => Some(output),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => {
                // Every reader has finished; sleep so that callers polling in a loop do not spin.
                thread::sleep(timeout);
                None
            }
        }
    }

    /// Writes `line` and a newline to child `index`'s stdin.
    pub fn send_line(&mut self, index: usize, line: &str) -> Result<(), String> {
        let label = self.label(index).to_owned();
        let stdin = self
            .stdins
            .get_mut(index)
            .and_then(Option::as_mut)
            .ok_or_else(|| format!("{label}: its stdin is closed"))?;
        writeln!(stdin, "{line}")
            .and_then(|()| stdin.flush())
            .map_err(|e| format!("{label}: could not write to its stdin: {e}"))
    }

    /// Closes child `index`'s stdin (workers exit when it reaches end of file).
    pub fn close_stdin(&mut self, index: usize) {
        if let Some(slot) = self.stdins.get_mut(index) {
            slot.take();
        }
    }

    /// Kills child `index` with SIGKILL (no-op when it already ended) and reaps it.
    pub fn kill(&mut self, index: usize) {
        if let Some(child) = self.children.get_mut(index).and_then(Option::take) {
            reap(child, true, &mut self.statuses[index]);
        }
    }

    /// Sends SIGCONT to child `index`, resuming a rank that stopped itself with SIGSTOP
    /// (no-op when it already ended).
    pub fn resume(&mut self, index: usize) {
        let Some(child) = self.children.get(index).and_then(Option::as_ref) else {
            return;
        };
        let Ok(pid) = libc::pid_t::try_from(child.id()) else {
            return;
        };
        // SAFETY: `kill` has no memory-safety preconditions; the child is held here and not
        // reaped yet, so its id cannot have been recycled for an unrelated process.
        unsafe {
            libc::kill(pid, libc::SIGCONT);
        }
    }

    /// Whether child `index` has exited, reaping it if so; its exit status when known.
    pub fn poll_exit(&mut self, index: usize) -> Option<ExitStatus> {
        if let Some(status) = self.statuses.get(index).copied().flatten() {
            return Some(status);
        }
        let slot = self.children.get_mut(index)?;
        let child = slot.as_mut()?;
        match child.try_wait() {
            Ok(Some(status)) => {
                lock(&LIVE_CHILDREN).retain(|&pid| pid != child.id());
                slot.take();
                self.statuses[index] = Some(status);
                Some(status)
            }
            _ => None,
        }
    }

    /// Waits up to `grace` for every child to exit by itself (after its stdin was closed),
    /// then kills the rest. Returns each child's exit status (`None` when it had to be killed).
    pub fn finish(&mut self, grace: Duration) -> Vec<Option<ExitStatus>> {
        for index in 0..self.stdins.len() {
            self.close_stdin(index);
        }
        let deadline = std::time::Instant::now() + grace;
        let mut killed = vec![false; self.children.len()];
        loop {
            let running: Vec<usize> = (0..self.children.len())
                .filter(|&i| self.poll_exit(i).is_none() && self.children[i].is_some())
                .collect();
            if running.is_empty() {
                break;
            }
            if std::time::Instant::now() >= deadline {
                for i in running {
                    killed[i] = true;
                    self.kill(i);
                }
                break;
            }
            thread::sleep(Duration::from_millis(10));
        }
        self.statuses
            .iter()
            .zip(killed)
            .map(|(status, killed)| if killed { None } else { *status })
            .collect()
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        for (index, slot) in self.children.iter_mut().enumerate() {
            if let Some(child) = slot.take() {
                reap(child, true, &mut self.statuses[index]);
            }
        }
    }
}

/// Kills (when asked) and waits for `child`, unregistering it first so that the interrupt
/// handler never signals a reaped (and possibly recycled) process id.
fn reap(mut child: Child, kill: bool, status: &mut Option<ExitStatus>) {
    if kill {
        // An error means the child already exited; waiting below reaps it either way.
        let _ = child.kill();
    }
    lock(&LIVE_CHILDREN).retain(|&pid| pid != child.id());
    if let Ok(s) = child.wait() {
        *status = Some(s);
    }
}

/// Reads `stream` line by line on a thread of its own and forwards each line; the last of a
/// child's readers to reach end of file sends [`Output::Closed`].
fn forward_lines(
    child: usize,
    stream: Stream,
    source: impl Read + Send + 'static,
    tx: Sender<Output>,
    open_streams: Arc<AtomicUsize>,
) {
    thread::spawn(move || {
        let reader = BufReader::new(source);
        for line in reader.split(b'\n') {
            let Ok(bytes) = line else { break };
            let text = String::from_utf8_lossy(&bytes)
                .trim_end_matches('\r')
                .to_owned();
            if tx
                .send(Output::Line {
                    child,
                    stream,
                    text,
                })
                .is_err()
            {
                return;
            }
        }
        if open_streams.fetch_sub(1, Ordering::SeqCst) == 1 {
            // The launcher may be gone already; nobody is left to tell then.
            let _ = tx.send(Output::Closed { child });
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Collects every output of `job` until `index` closes (or 10 s pass).
    fn drain(job: &Job, index: usize) -> (Vec<(Stream, String)>, bool) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut lines = Vec::new();
        while std::time::Instant::now() < deadline {
            match job.next(Duration::from_millis(50)) {
                Some(Output::Line {
                    child,
                    stream,
                    text,
                }) if child == index => lines.push((stream, text)),
                Some(Output::Closed { child }) if child == index => return (lines, true),
                _ => {}
            }
        }
        (lines, false)
    }

    #[test]
    fn lines_flow_both_ways_and_closed_comes_last() {
        let spec = ChildSpec::new("shell", "sh")
            .args([
                "-c",
                "echo out; echo err 1>&2; read x; echo \"got $x\"; echo \"$RLX_TEST_VAR\"",
            ])
            .env("RLX_TEST_VAR", "from-env");
        let mut job = Job::spawn(&[spec]).unwrap();
        job.send_line(0, "ping").unwrap();
        let (lines, closed) = drain(&job, 0);
        assert!(closed, "{lines:?}");
        let stdout: Vec<&str> = lines
            .iter()
            .filter(|(s, _)| *s == Stream::Stdout)
            .map(|(_, t)| t.as_str())
            .collect();
        assert_eq!(stdout, ["out", "got ping", "from-env"]);
        assert!(lines.contains(&(Stream::Stderr, "err".to_owned())));
        let statuses = job.finish(Duration::from_secs(5));
        assert!(statuses[0].is_some_and(|s| s.success()), "{statuses:?}");
    }

    #[test]
    fn kill_reaps_and_unregisters() {
        let mut job = Job::spawn(&[ChildSpec::new("sleeper", "sleep").args(["1000"])]).unwrap();
        let pid = job.children[0].as_ref().map(Child::id).unwrap();
        assert!(lock(&LIVE_CHILDREN).contains(&pid));
        job.kill(0);
        assert!(!lock(&LIVE_CHILDREN).contains(&pid));
        let status = job.poll_exit(0).unwrap();
        assert!(!status.success());
        // A child that ends by itself after its stdin closes is reaped by finish().
        let mut job = Job::spawn(&[ChildSpec::new("cat", "cat")]).unwrap();
        let statuses = job.finish(Duration::from_secs(5));
        assert!(statuses[0].is_some_and(|s| s.success()));
    }

    #[test]
    fn a_missing_program_is_an_error_not_a_panic() {
        let err =
            Job::spawn(&[ChildSpec::new("ghost", "/nonexistent/rlx-no-such-program")]).unwrap_err();
        assert!(err.contains("ghost"), "{err}");
    }
}
