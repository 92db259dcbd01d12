//! Synchronisation primitives for the state of this crate that loom model-checks (the flight
//! recorder's lock-free ring of point-to-point calls): the usual ones in normal builds, loom's
//! under `cfg(rlx_loom)` so that `cargo xtask loom` explores every interleaving of the code
//! that ships. Code under a loom model takes its atomics and locks from here.

#[cfg(not(rlx_loom))]
pub(crate) use parking_lot::Mutex;
#[cfg(not(rlx_loom))]
pub(crate) use std::sync::atomic::{AtomicU64, Ordering, fence};

#[cfg(rlx_loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, Ordering, fence};

/// loom's mutex with `parking_lot`'s signature: a panic while it is held poisons nothing the
/// models check, so a poisoned lock is simply taken.
#[cfg(rlx_loom)]
#[derive(Debug)]
pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

#[cfg(rlx_loom)]
impl<T> Mutex<T> {
    pub(crate) fn new(value: T) -> Self {
        Mutex(loom::sync::Mutex::new(value))
    }

    pub(crate) fn lock(&self) -> loom::sync::MutexGuard<'_, T> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
