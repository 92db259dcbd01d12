//! Running a group's operations in issue order when the backend has native collectives.
//!
//! A native collective (MLX's `all_sum`, ...) carries no operation identity on the wire: the
//! backend matches calls by the order in which each rank makes them. Operations of one group
//! may run on several threads (`spawn_*`), so without care two ranks could enter two native
//! calls in different orders and exchange each other's data. [`IssueOrder`] prevents that: every
//! operation registers its sequence number on the issuing thread, and runs only once every
//! operation issued before it has finished. Groups whose transport has no native collectives
//! never create one and pay nothing.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::{CollectiveError, Result};

/// The queue of a group's issued, unfinished operations; the front one may run.
#[derive(Debug, Default)]
pub(crate) struct IssueOrder {
    queue: Mutex<VecDeque<u32>>,
    finished: Condvar,
}

impl IssueOrder {
    /// Registers operation `seq`; called on the issuing thread, in issue order.
    pub(crate) fn register(&self, seq: u32) {
        self.queue.lock().push_back(seq);
    }

    /// Removes `seq` (if registered) and wakes the operations waiting for their turn. Called
    /// when an operation ends, however it ends, and when an issued operation will never run.
    pub(crate) fn release(&self, seq: u32) {
        let mut queue = self.queue.lock();
        if let Some(at) = queue.iter().position(|&s| s == seq) {
            queue.remove(at);
            self.finished.notify_all();
        }
    }

    /// Waits until `seq` is the oldest unfinished operation and returns a guard that releases
    /// it when dropped. Fails with `Timeout` after `timeout` (an earlier operation is stuck).
    pub(crate) fn wait_turn(
        &self,
        seq: u32,
        op: &'static str,
        timeout: Duration,
    ) -> Result<Turn<'_>> {
        let turn = Turn { order: self, seq };
        let deadline = Instant::now().checked_add(timeout);
        let mut queue = self.queue.lock();
        loop {
            match queue.front() {
                Some(&front) if front == seq => return Ok(turn),
                None => return Ok(turn),
                Some(_) if !queue.contains(&seq) => return Ok(turn),
                Some(_) => {}
            }
            match deadline {
                Some(deadline) => {
                    if Instant::now() >= deadline {
                        return Err(CollectiveError::Timeout {
                            peer: None,
                            op,
                            after: timeout,
                        });
                    }
                    let _ = self.finished.wait_until(&mut queue, deadline);
                }
                None => self.finished.wait(&mut queue),
            }
        }
    }
}

/// An operation's turn; dropping it lets the next operation run.
#[derive(Debug)]
pub(crate) struct Turn<'a> {
    order: &'a IssueOrder,
    seq: u32,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.order.release(self.seq);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    #[test]
    fn operations_run_in_issue_order_whatever_thread_runs_them() {
        let order = Arc::new(IssueOrder::default());
        let log = Arc::new(Mutex::new(Vec::new()));
        for seq in 0..8 {
            order.register(seq);
        }
        let started = Arc::new(AtomicU32::new(0));
        let threads: Vec<_> = (0..8u32)
            .rev()
            .map(|seq| {
                let (order, log, started) = (order.clone(), log.clone(), started.clone());
                std::thread::spawn(move || {
                    started.fetch_add(1, Ordering::SeqCst);
                    let _turn = order
                        .wait_turn(seq, "test", Duration::from_secs(30))
                        .unwrap();
                    log.lock().push(seq);
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*log.lock(), (0..8).collect::<Vec<_>>());
    }

    #[test]
    fn a_stuck_earlier_operation_is_a_timeout() {
        let order = IssueOrder::default();
        order.register(0);
        order.register(1);
        let err = order
            .wait_turn(1, "all_reduce", Duration::from_millis(20))
            .unwrap_err();
        assert!(matches!(
            err,
            CollectiveError::Timeout {
                op: "all_reduce",
                ..
            }
        ));
        order.release(0);
        assert!(order.wait_turn(1, "all_reduce", Duration::ZERO).is_ok());
    }
}
