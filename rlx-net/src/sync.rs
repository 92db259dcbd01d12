//! Synchronisation primitives for the modelled state of this crate (the matching state of
//! [`crate::progress`]): `std`'s in normal builds, loom's under `cfg(rlx_loom)`, so that
//! `cargo xtask loom` explores every interleaving of receives, arriving frames, timeouts and
//! lost peers.

#[cfg(not(rlx_loom))]
pub(crate) use std::sync::{Condvar, Mutex, MutexGuard};

#[cfg(rlx_loom)]
pub(crate) use loom::sync::{Condvar, Mutex, MutexGuard};

/// Locks `mutex`, recovering the guard if another thread panicked while holding it: the state
/// guarded here is consistent at every unlock, so a poisoned lock carries no torn data.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    match mutex.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}
