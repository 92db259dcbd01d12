//! The flight recorder's clock: microseconds since the Unix epoch, read cheaply.
//!
//! A point-to-point call reads it twice and may take under a microsecond, while the precise
//! monotonic clock costs about 20 ns a read on a virtual machine. On Linux the recorder reads
//! the coarse monotonic clock instead (a few nanoseconds, resolution one scheduler tick of 1 to
//! 4 ms), which is ample for a record meant to explain hangs and failures and which could not
//! be compared across hosts more finely anyway. Elsewhere it reads `Instant`.

use std::time::{SystemTime, UNIX_EPOCH};

/// A clock anchored to the Unix time at its creation.
#[derive(Debug)]
pub(crate) struct Clock {
    /// The Unix time, in microseconds, at the clock's zero.
    epoch_us: u64,
    #[cfg(not(target_os = "linux"))]
    started: std::time::Instant,
}

fn unix_now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

#[cfg(target_os = "linux")]
impl Clock {
    pub(crate) fn new() -> Self {
        let unix_us = unix_now_us();
        Clock {
            epoch_us: unix_us.saturating_sub(coarse_monotonic_us()),
        }
    }

    /// Now, in microseconds since the Unix epoch.
    pub(crate) fn now_us(&self) -> u64 {
        self.epoch_us + coarse_monotonic_us()
    }
}

#[cfg(target_os = "linux")]
fn coarse_monotonic_us() -> u64 {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::MonotonicCoarse);
    now.tv_sec as u64 * 1_000_000 + now.tv_nsec as u64 / 1000
}

#[cfg(not(target_os = "linux"))]
impl Clock {
    pub(crate) fn new() -> Self {
        Clock {
            epoch_us: unix_now_us(),
            started: std::time::Instant::now(),
        }
    }

    /// Now, in microseconds since the Unix epoch.
    pub(crate) fn now_us(&self) -> u64 {
        self.epoch_us + self.started.elapsed().as_micros() as u64
    }
}
