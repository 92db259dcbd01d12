//! Synchronisation primitives of this crate: `std`'s in normal builds, loom's under
//! `cfg(rlx_loom)`, so that `cargo xtask loom` explores every interleaving of the progress
//! engine's receives, arriving frames, deadlines, lost peers and aborts.
//!
//! Library code takes its `Mutex`, `Condvar`, atomics, `Arc` and threads from here, never from
//! `std` directly. (Bootstrap's scoped threads and the atomics that only live inside them stay
//! on `std`: loom has no scoped threads, and bootstrap is not modelled.)

#[cfg(not(rlx_loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
#[cfg(not(rlx_loom))]
pub(crate) use std::sync::{Arc, Condvar, Mutex, MutexGuard, TryLockError};
#[cfg(not(rlx_loom))]
pub(crate) use std::thread;

#[cfg(rlx_loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
#[cfg(rlx_loom)]
pub(crate) use loom::sync::{Arc, Condvar, Mutex, MutexGuard};
#[cfg(rlx_loom)]
pub(crate) use loom::thread;
#[cfg(rlx_loom)]
pub(crate) use std::sync::TryLockError;

/// Locks `mutex`, recovering the guard if another thread panicked while holding it: the state
/// guarded here is consistent at every unlock, so a poisoned lock carries no torn data.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    match mutex.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}
