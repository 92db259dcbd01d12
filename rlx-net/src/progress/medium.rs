//! The medium contract: what carries a link's bytes between this rank and a peer.
//!
//! A link reads from one [`Inbound`] medium and writes to one [`Outbound`] medium. Both start
//! as the link's TCP socket (implemented here), and a medium may replace the socket once in
//! each direction for the rest of the link's life: the same-host room moves link 0 to a rank of
//! this host onto a shared-memory ring (`same_host/lane.rs`). The link itself knows nothing of
//! what replaced its socket; it calls the contract:
//!
//! - Readiness always comes through the link's socket, which every medium keeps open for the
//!   peer's heartbeats, its wake-ups and the end of the stream: a medium without a descriptor
//!   of its own wakes a sleeping reader with a byte on the socket. [`Inbound::before_poll`]
//!   and [`Inbound::after_poll`] bracket every `poll(2)` on that socket.
//! - Bytes come in stream order, and a medium reports the end of the stream (`Ok(0)`) only once
//!   it has nothing left to hand out.
//! - `heard` is set for anything that came from the peer, including the signs of life a medium
//!   swallows, so that the silence rule (`liveness/heartbeat.rs`) sees them.
//! - An outbound medium whose room no descriptor reports ([`Outbound::room_by_poll`] false)
//!   makes a writer that waits for room nap instead of polling (`writer/wait.rs`).

use std::fmt::Debug;
use std::io::{self, IoSlice};
use std::net::TcpStream;

use crate::sync::{AtomicBool, Ordering};

use super::socket::{read_some, send_vectored};

/// Where a link's incoming bytes come from. Only the holder of the link's reader role reads.
pub(super) trait Inbound: Debug + Send + Sync {
    /// Copies what has arrived into `buf`: `Ok(0)` at the end of the stream, `WouldBlock`
    /// when nothing is there now. Sets `heard` when anything at all came from the peer.
    fn read(&self, buf: &mut [u8], heard: &AtomicBool) -> io::Result<usize>;

    /// Called before blocking in `poll(2)` on the link's socket; returns whether bytes wait
    /// already (then the caller must not block).
    fn before_poll(&self) -> bool;

    /// Undoes [`Inbound::before_poll`] once the poll is over.
    fn after_poll(&self);
}

/// Where a link's outgoing bytes go. Writers hold the peer's send lock.
pub(super) trait Outbound: Debug + Send {
    /// Writes as much of `slices` as fits now; `WouldBlock` when nothing does.
    fn write(&mut self, slices: &[IoSlice<'_>]) -> io::Result<usize>;

    /// Whether `poll(2)` on the link's socket reports room in this medium.
    fn room_by_poll(&self) -> bool;
}

impl Inbound for TcpStream {
    fn read(&self, buf: &mut [u8], heard: &AtomicBool) -> io::Result<usize> {
        let n = read_some(self, buf)?;
        if n > 0 {
            heard.store(true, Ordering::Relaxed);
        }
        Ok(n)
    }

    fn before_poll(&self) -> bool {
        false
    }

    fn after_poll(&self) {}
}

impl Outbound for &TcpStream {
    fn write(&mut self, slices: &[IoSlice<'_>]) -> io::Result<usize> {
        send_vectored(self, slices)
    }

    fn room_by_poll(&self) -> bool {
        true
    }
}
