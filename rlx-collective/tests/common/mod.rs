//! Thread-per-rank harness for the collective tests: a world of [`ProcessGroup`]s over
//! [`MemTransport`], and a helper that runs one closure per rank and collects the results.

#![allow(
    dead_code,
    reason = "each test file uses a different part of the harness"
)]

pub(crate) mod checked;

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
