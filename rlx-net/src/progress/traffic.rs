//! The engine's traffic counters: payload bytes sent and received, and the received bytes
//! that had to land in a buffer of the engine's own (see [`Traffic`]). Relaxed atomics, one
//! add per payload piece: they order nothing and cost nothing a profile shows.

use rlx_transport::Traffic;

use crate::sync::{AtomicU64, Ordering};

/// What one engine has moved.
#[derive(Debug, Default)]
pub(crate) struct TrafficCounters {
    sent: AtomicU64,
    received: AtomicU64,
    copied: AtomicU64,
    single_copy: AtomicU64,
    bounced: AtomicU64,
}

impl TrafficCounters {
    /// Counts a message of `bytes` sent to another rank.
    pub(crate) fn sent(&self, bytes: u64) {
        self.sent.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Counts `bytes` of payload received, `owned` when they landed in the engine's buffer.
    pub(crate) fn received(&self, bytes: u64, owned: bool) {
        self.received.fetch_add(bytes, Ordering::Relaxed);
        if owned {
            self.copied.fetch_add(bytes, Ordering::Relaxed);
        }
    }

    /// Counts a message of `bytes` read from the sender's memory, `owned` when it landed in
    /// the engine's buffer.
    pub(crate) fn received_single_copy(&self, bytes: u64, owned: bool) {
        self.received(bytes, owned);
        self.single_copy.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Counts `bytes` of a single-copy message copied out of the sender's bounce file.
    pub(crate) fn bounced(&self, bytes: u64) {
        self.bounced.fetch_add(bytes, Ordering::Relaxed);
    }

    /// The counters now.
    pub(crate) fn snapshot(&self) -> Traffic {
        Traffic::new(
            self.sent.load(Ordering::Relaxed),
            self.received.load(Ordering::Relaxed),
            self.copied.load(Ordering::Relaxed),
        )
        .with_single_copy(self.single_copy.load(Ordering::Relaxed))
        .with_bounced(self.bounced.load(Ordering::Relaxed))
    }
}
