//! Lock and condition-variable helpers of the MLX transport: `std`'s primitives with poison
//! recovery, because every critical section of the transport leaves its state consistent at
//! each unlock, so a panicked thread leaves no torn data behind.

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// Locks `mutex`, recovering the guard if a thread panicked while holding it: every critical
/// section of the transport leaves the state consistent at each unlock.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    match mutex.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}

pub(crate) fn wait<'a, T>(cv: &Condvar, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    match cv.wait(guard) {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}

pub(crate) fn wait_timeout<'a, T>(
    cv: &Condvar,
    guard: MutexGuard<'a, T>,
    d: Duration,
) -> MutexGuard<'a, T> {
    match cv.wait_timeout(guard, d) {
        Ok((guard, _)) => guard,
        Err(poisoned) => poisoned.into_inner().0,
    }
}
