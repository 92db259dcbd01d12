//! Running one child command to its end or a deadline, with its output in a log file: the
//! fault trials of test-cluster and the runs of `cargo xtask flaky` are each such a command.
//! The child leads a process group of its own, so that at the deadline everything it started
//! goes with it: SIGTERM first, so that a launcher can reap its ranks and remove its network
//! namespaces, then SIGKILL.

use std::path::Path;
use std::process::{Command, ExitStatus};
use std::time::{Duration, Instant};

/// How a supervised command ended.
#[derive(Debug)]
pub(crate) enum Supervised {
    /// It exited by itself.
    Exited(ExitStatus),
    /// It was stopped at the deadline.
    Deadline,
    /// It could not be started (or its log not created).
    NotStarted(String),
}

/// Runs `command` with stdout and stderr in `log`, in a process group of its own, until it
/// ends or `limit` has passed.
pub(crate) fn supervise(command: &mut Command, log: &Path, limit: Duration) -> Supervised {
    use std::os::unix::process::CommandExt;

    let file = match std::fs::File::create(log) {
        Ok(file) => file,
        Err(e) => return Supervised::NotStarted(format!("{}: {e}", log.display())),
    };
    let (out, err) = match (file.try_clone(), file.try_clone()) {
        (Ok(out), Ok(err)) => (out, err),
        (Err(e), _) | (_, Err(e)) => return Supervised::NotStarted(format!("log: {e}")),
    };
    let mut child = match command.stdout(out).stderr(err).process_group(0).spawn() {
        Ok(child) => child,
        Err(e) => return Supervised::NotStarted(format!("could not start {command:?}: {e}")),
    };
    let deadline = Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Supervised::Exited(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => break,
        }
    }
    let group = libc::pid_t::try_from(child.id()).unwrap_or(0);
    for (signal, wait) in [(libc::SIGTERM, 5), (libc::SIGKILL, 0)] {
        if group > 0 {
            // SAFETY: `kill` has no memory-safety preconditions; the group is the one the child
            // leads, and the child is not reaped yet, so the id cannot have been recycled.
            unsafe {
                libc::kill(-group, signal);
            }
        }
        let until = Instant::now() + Duration::from_secs(wait);
        while Instant::now() < until {
            if let Ok(Some(_)) = child.try_wait() {
                return Supervised::Deadline;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    // Reaped after SIGKILL; its status says nothing the deadline does not.
    let _ = child.wait();
    Supervised::Deadline
}
