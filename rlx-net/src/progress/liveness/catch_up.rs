//! Catching up after this process was stopped: before a receive that will not wait looks at
//! the matching state, every link is read once if bytes may have been waiting unparsed.
//!
//! A receive that will not wait (a look for failure notices between the slices of a wait, or
//! after an operation succeeded) sees only what the matching state holds. While the process
//! runs, that is everything that arrived a moment ago: the background watcher drains idle
//! links every round, and a receiving thread reads the links it waits on. A process that was
//! stopped (SIGSTOP, a debugger, a machine gone to sleep) wakes with bytes that arrived long
//! ago still in its sockets, or staged behind the frame a receive just took. Its peers may have
//! declared it failed meanwhile; a look that misses their notices would let an operation whose
//! data had all arrived report success for a group its members gave up on.
//!
//! So the watcher records when each of its rounds began, and a round that ends long after the
//! one before began (this process, or at least its watcher, did not run meanwhile) leaves a
//! catch-up due. A receive that will not wait first checks, for the price of a clock read,
//! whether a catch-up is due or the watcher's last round is old; if so it reads every link
//! that no receiver holds (waiting briefly for those the watcher holds) before it looks.

use std::time::{Duration, Instant};

use crate::sync::{AtomicBool, AtomicU64, Ordering};

use crate::progress::core::Core;
use crate::progress::reader::Reader;

/// The watcher's rounds take its polling period (20 ms) plus what they read; a round that
/// ends this long after the previous one began means this process, or its watcher, did not
/// run for a while. Short enough that no peer's operation timeout passes first.
const STALE_AFTER: Duration = Duration::from_millis(250);

/// How long a catch-up waits for the links the watcher holds to be handed over.
const HANDOVER_WAIT: Duration = Duration::from_millis(100);

/// When the links were last all looked at, and whether a catch-up is due.
#[derive(Debug)]
pub(in crate::progress) struct CatchUp {
    /// The clock's origin for `swept_at`.
    epoch: Instant,
    /// When the last completed watcher round or catch-up began, in nanoseconds since `epoch`.
    swept_at: AtomicU64,
    /// A watcher round ended long after its predecessor began: read everything before the next
    /// look.
    due: AtomicBool,
}

impl CatchUp {
    pub(in crate::progress) fn new() -> Self {
        Self {
            epoch: Instant::now(),
            swept_at: AtomicU64::new(0),
            due: AtomicBool::new(false),
        }
    }

    fn nanos(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX)
    }

    /// Whether a look now could miss bytes that have been waiting a long time.
    fn needed(&self, now: Instant) -> bool {
        let since = self
            .nanos(now)
            .saturating_sub(self.swept_at.load(Ordering::Acquire));
        self.due.load(Ordering::Acquire) || since > STALE_AFTER.as_nanos() as u64
    }

    /// A sweep that began at `began` has read what it could.
    fn swept(&self, began: Instant) {
        self.swept_at.fetch_max(self.nanos(began), Ordering::AcqRel);
    }

    /// The watcher finished a round that began at `began`; the round before it began at
    /// `previous`. A gap longer than [`STALE_AFTER`] leaves a catch-up due: links the watcher
    /// did not hold (a receiver had just released them) may hold old bytes too.
    pub(in crate::progress) fn watcher_round(&self, previous: Instant, began: Instant) {
        if Instant::now().saturating_duration_since(previous) > STALE_AFTER {
            tracing::debug!("the watcher ran late (this process was stopped or starved)");
            self.due.store(true, Ordering::Release);
        }
        self.swept(began);
    }
}

impl CatchUp {
    /// Reads every link once, through `reader`, when bytes may have been waiting unparsed
    /// since this process was stopped (see the module docs); otherwise costs a clock read.
    pub(in crate::progress) fn catch_up_if_needed(&self, core: &Core, reader: Reader<'_>) {
        if core.world < 2 {
            return;
        }
        let now = Instant::now();
        if !self.needed(now) {
            return;
        }
        self.due.store(false, Ordering::Release);
        let held = core.hub.take_for_sweep(core, now + HANDOVER_WAIT);
        tracing::debug!(links = held.len(), "catching up on links after a stop");
        reader.drain_held(&held);
        self.swept(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_late_round_or_an_old_sweep_calls_for_a_catch_up() {
        let clock = CatchUp::new();
        let start = clock.epoch;
        clock.swept(start);
        assert!(!clock.needed(start + Duration::from_millis(10)));
        assert!(clock.needed(start + STALE_AFTER + Duration::from_millis(1)));
        // A round that began long after the one before leaves a catch-up due, however recent.
        let long_ago = Instant::now() - Duration::from_secs(3);
        clock.watcher_round(long_ago, Instant::now());
        assert!(clock.needed(Instant::now()));
        // Sweeps never move the record back.
        clock.swept(start);
        assert!(clock.swept_at.load(Ordering::Acquire) > 0);
    }
}
