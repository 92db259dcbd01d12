//! The engine's tuning ([`EngineConfig`]), shared by every room: the builder fills it from its
//! options and the environment, and each room reads the fields it needs.

use std::time::Duration;

/// A peer not heard from for this many heartbeat intervals is lost. Five leaves room for a
/// beat delayed by a loaded machine (the watcher thread waiting for a core) several times over.
pub(super) const SILENT_BEATS: u32 = 5;

/// Tuning shared by every link of a transport.
#[derive(Clone, Copy, Debug)]
pub(crate) struct EngineConfig {
    pub(crate) max_frame: u64,
    pub(crate) max_unexpected: u64,
    pub(crate) min_striped: u64,
    pub(crate) op_timeout: Duration,
    pub(crate) spin: Duration,
    /// Heartbeat interval of every link (zero: no heartbeats, no silence detection); see
    /// `heartbeat.rs`.
    pub(crate) heartbeat: Duration,
    /// The smallest message sent to a rank of this host by the single-copy path
    /// (`single_copy.rs`); `u64::MAX` turns the path off.
    pub(crate) min_single_copy: u64,
    /// The largest head of a pulled message bounced through shared memory (`bounce.rs`); 0
    /// bounces nothing.
    pub(crate) max_bounced: u64,
    /// The ring size of each shared-memory lane to a rank of this host (`lane.rs`); 0 keeps
    /// every link on TCP.
    pub(crate) lane_bytes: u64,
    /// The longest a large unexpected message waits for its receive (`matching/peer.rs`).
    pub(crate) longest_hold: Duration,
    /// How long a receive whose message lands in the caller's buffer goes on past its deadline
    /// without a byte landing before it gives up (`recv.rs`).
    pub(crate) landing_grace: Duration,
}

impl EngineConfig {
    /// How long a peer may send nothing, not even a heartbeat, before it is lost (see
    /// `liveness/heartbeat.rs`); the operation timeout when heartbeats are off, and never
    /// longer than it.
    pub(super) fn silence_window(&self) -> Duration {
        match self.heartbeat {
            beat if beat.is_zero() => self.op_timeout,
            beat => beat.saturating_mul(SILENT_BEATS).min(self.op_timeout),
        }
    }
}
