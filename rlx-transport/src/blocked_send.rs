//! What a thread does while one of its own sends waits on a peer that does not read.
//!
//! A send whose peer's socket is full (the peer is stopped, cut off, or blocked itself) keeps
//! the calling thread inside the transport until the send ends or times out. The layers above
//! still have duties meanwhile: a collective group answers the wait probes of its other
//! members, so that a rank stuck behind a silent peer is never taken for the silent one. Such
//! a layer installs a hook for the span of a call with [`with_hook`]; a transport calls
//! [`waiting`] from every loop in which a send waits for its socket, and the hook then runs on
//! that thread, at most once per [`HOOK_INTERVAL`] and never inside itself (its own sends may
//! wait too).
//!
//! A transport whose sends never wait on the peer need not call [`waiting`] at all.

use std::cell::Cell;
use std::time::{Duration, Instant};

/// How often a hook runs at most while a send waits; a send that waits less than this never
/// runs it. A waiting collective rank answers probes within this, far inside the window a
/// prober gives it.
pub const HOOK_INTERVAL: Duration = Duration::from_millis(10);

/// The installed hook, its lifetime erased (see [`with_hook`] for why that is sound).
type ErasedHook = *const (dyn Fn() + 'static);

thread_local! {
    /// The hook of the call this thread is in, if one was installed.
    static HOOK: Cell<Option<ErasedHook>> = const { Cell::new(None) };
    /// When this thread's hook last ran, or when a send first waited since it was installed.
    static LAST_RUN: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// Puts a hook's predecessor back when the span it was installed for ends, on every path out
/// of it, unwinding included.
struct Restore(Option<ErasedHook>);

impl Drop for Restore {
    fn drop(&mut self) {
        HOOK.with(|hook| hook.set(self.0));
    }
}

/// Runs `body` with `hook` installed on this thread: every send of the transport that waits
/// on its peer during `body` runs `hook` every [`HOOK_INTERVAL`] while it waits. A hook
/// installed inside `body` replaces this one until its own span ends.
pub fn with_hook<R>(hook: &dyn Fn(), body: impl FnOnce() -> R) -> R {
    let borrowed: *const (dyn Fn() + '_) = hook;
    // SAFETY: only the lifetime changes, so the pointer's layout is the same. The erased
    // pointer lives in `HOOK` no longer than `hook` is borrowed: `Restore` takes it out when
    // this function returns or unwinds, and `waiting` dereferences only the pointer installed
    // at the time, which is then still borrowed by a `with_hook` frame of this thread.
    let erased = unsafe { std::mem::transmute::<*const (dyn Fn() + '_), ErasedHook>(borrowed) };
    let previous = HOOK.with(|slot| slot.replace(Some(erased)));
    let _restore = Restore(previous);
    // The first wait starts the interval, so that installing a hook costs no clock read.
    LAST_RUN.with(|last| last.set(None));
    body()
}

/// Whether a hook is installed on this thread: a transport waiting for a socket then wakes at
/// least every [`HOOK_INTERVAL`], so that the hook can run on time.
pub fn hooked() -> bool {
    HOOK.with(Cell::get).is_some()
}

/// Called by a transport while a send of this thread waits for its socket: runs the installed
/// hook once sends have waited [`HOOK_INTERVAL`] since it was installed or last ran. Costs a
/// thread-local read without a hook, and a clock read with one.
pub fn waiting() {
    let Some(hook) = HOOK.with(Cell::get) else {
        return;
    };
    let now = Instant::now();
    let due = LAST_RUN.with(|last| match last.get() {
        Some(at) if now.saturating_duration_since(at) < HOOK_INTERVAL => false,
        Some(_) => {
            last.set(Some(now));
            true
        }
        None => {
            last.set(Some(now));
            false
        }
    });
    if !due {
        return;
    }
    // The hook's own sends may wait: they must not run it again inside itself.
    HOOK.with(|slot| slot.set(None));
    let _restore = Restore(Some(hook));
    // SAFETY: `hook` is the pointer installed by the innermost `with_hook` of this thread,
    // whose frame is below this one on the stack, so the closure it points to is still
    // borrowed there and alive (see `with_hook`).
    let hook = unsafe { &*hook };
    hook();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hook_runs_only_inside_its_span_and_never_inside_itself() {
        let runs = Cell::new(0);
        let nested = Cell::new(0);
        waiting();
        let hook = || {
            runs.set(runs.get() + 1);
            // A send of the hook's own that waits does not run it again.
            waiting();
            nested.set(nested.get() + usize::from(hooked()));
        };
        with_hook(&hook, || {
            assert!(hooked());
            // The first wait starts the interval and nothing runs within it: a send that waits
            // briefly is left alone.
            waiting();
            waiting();
            assert_eq!(runs.get(), 0);
            std::thread::sleep(HOOK_INTERVAL);
            waiting();
            waiting();
            assert_eq!(runs.get(), 1);
            // Another thread has no hook of this one.
            std::thread::scope(|s| {
                s.spawn(|| assert!(!hooked()));
            });
        });
        assert_eq!(nested.get(), 0);
        assert!(!hooked());
        std::thread::sleep(HOOK_INTERVAL);
        waiting();
        assert_eq!(runs.get(), 1);
    }

    #[test]
    fn an_inner_hook_replaces_the_outer_one_for_its_span() {
        let outer = Cell::new(0);
        let inner = Cell::new(0);
        let outer_hook = || outer.set(outer.get() + 1);
        let inner_hook = || inner.set(inner.get() + 1);
        with_hook(&outer_hook, || {
            with_hook(&inner_hook, || {
                waiting();
                std::thread::sleep(HOOK_INTERVAL);
                waiting();
            });
            waiting();
            std::thread::sleep(HOOK_INTERVAL);
            waiting();
        });
        assert_eq!((outer.get(), inner.get()), (1, 1));
    }

    #[test]
    fn a_panicking_body_takes_its_hook_with_it() {
        let hook = || {};
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            with_hook(&hook, || panic!("the body failed"));
        }));
        assert!(result.is_err());
        assert!(!hooked());
    }
}
