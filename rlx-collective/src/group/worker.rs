//! The progress worker of a group: the thread that runs its non-blocking operations, one
//! after another in issue order, so that a `spawn_*` call costs a queue hand-off instead of
//! starting an operating-system thread.
//!
//! Running them in issue order cannot deadlock: every member issues the same operations in the
//! same order, so every member's worker runs them in that order too, while blocking operations
//! run beside them on the callers' threads. The thread starts with the first non-blocking
//! operation and ends once the group is dropped and the last queued operation has run.

use std::panic::AssertUnwindSafe;
use std::sync::mpsc::{Sender, channel};

use parking_lot::Mutex;

/// One queued operation, which reports its own result.
pub(super) type Job = Box<dyn FnOnce() + Send + 'static>;

/// The queue of a group's progress worker (empty until the first non-blocking operation).
#[derive(Debug, Default)]
pub(super) struct Worker {
    queue: Mutex<Option<Sender<Job>>>,
}

impl Worker {
    /// Queues `job` behind the operations issued before it, starting the thread (named after
    /// group `group`) if it is not running; `Err` when no thread can be started, and `job` is
    /// dropped unrun. Queueing on a running worker allocates nothing but the job itself.
    pub(super) fn submit(&self, group: u16, job: Job) -> std::io::Result<()> {
        let mut queue = self.queue.lock();
        let job = match queue.as_ref() {
            Some(sender) => match sender.send(job) {
                Ok(()) => return Ok(()),
                // The thread ended (it cannot while its queue is open; this is a guard).
                Err(unsent) => unsent.0,
            },
            None => job,
        };
        let (sender, jobs) = channel::<Job>();
        std::thread::Builder::new()
            .name(format!("rlx-group-{group}"))
            .spawn(move || {
                while let Ok(job) = jobs.recv() {
                    // A job catches its operation's panic itself; one that escapes anyway must
                    // not take the later operations down with it.
                    let _ = std::panic::catch_unwind(AssertUnwindSafe(job));
                }
            })?;
        // The receiver lives in the thread just started, so the send cannot fail.
        let _ = sender.send(job);
        *queue = Some(sender);
        Ok(())
    }
}
