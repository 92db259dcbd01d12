//! The contract between a send and the work it moves on while it waits ([`ProgressHook`]):
//! the writer and the same-host room call it, the exchange implements it, and none of them
//! needs to know the others.

use super::link::PeerIo;

/// Work a send moves on between its writes and while it waits for room or for the peer to take
/// a single-copy message: an exchange's receive (`exchange.rs`), which carries the view of the
/// engine it reads through, so that the writer passes it nothing of its own. No call blocks
/// for longer than a short wait.
pub(super) trait ProgressHook {
    /// Moves the work on without blocking; returns whether any byte moved.
    fn serve(&mut self) -> bool;

    /// Whether the work reads links of its own now, so that [`ProgressHook::wait`] can stand
    /// in for the send's own wait.
    fn reading(&self) -> bool;

    /// Waits a short while until one of the `pending` links of `io` (a mask) is writable or the
    /// work's links have bytes, then serves the work; returns whether anything happened.
    fn wait(&mut self, io: &PeerIo, pending: u64) -> bool;
}
