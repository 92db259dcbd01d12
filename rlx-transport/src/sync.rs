//! Synchronisation primitives for the concurrent state of this crate: `std`'s in normal
//! builds, loom's under `cfg(rlx_loom)` so that `cargo xtask loom` can explore every
//! interleaving of the code that ships.
//!
//! Library code takes its `Arc`, `Mutex`, `Condvar`, atomics and threads from here, never from
//! `std::sync` or `std::thread` directly.

#[cfg(not(rlx_loom))]
pub(crate) use std::sync::{Arc, Condvar, Mutex, MutexGuard};

#[cfg(rlx_loom)]
pub(crate) use loom::sync::{Arc, Condvar, Mutex, MutexGuard};

// The symmetric heap stores its words as atomics so that remote puts and local reads may overlap
// without undefined behaviour; loom must see those accesses too.
#[cfg(not(rlx_loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

#[cfg(rlx_loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU64, Ordering};

#[cfg(not(rlx_loom))]
pub(crate) use std::thread;

#[cfg(rlx_loom)]
pub(crate) use loom::thread;

/// Locks `mutex`, recovering the guard if another thread panicked while holding it: the state
/// guarded here stays consistent at every unlock, so a poisoned lock carries no torn data.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    match mutex.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}
