//! The liveness room: what notices a peer that stopped, vanished or flooded without a caller
//! waiting on it, and what catches up after this process itself was stopped.
//!
//! - `watch.rs`: the background watcher, which drains links no caller reads and runs the
//!   heartbeat monitor each round.
//! - `heartbeat.rs`: beats on links that were silent in the sending direction, and the silence
//!   rule that declares a peer lost.
//! - `catch_up.rs`: reading every link once after this process was stopped, before a receive
//!   that will not wait looks at the matching state.

mod catch_up;
mod heartbeat;
mod watch;

pub(in crate::progress) use catch_up::CatchUp;
pub(crate) use heartbeat::DEFAULT_HEARTBEAT;
pub(in crate::progress) use watch::Watcher;
