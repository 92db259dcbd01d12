//! How failures of this transport map onto [`CollectiveError`]:
//!
//! | what happened | error |
//! |---|---|
//! | EOF, reset or a failed write on a link; the peer sent a close frame | `PeerLost{peer, reason}`, the reason naming the address |
//! | nothing heard from the peer, not even a heartbeat, for five heartbeat intervals | `PeerLost{peer, reason}`, the reason saying for how many ms |
//! | bytes that break the frame or handshake protocol | `Protocol{peer, detail}` (the peer is then lost too) |
//! | a receive's or send's deadline | `Timeout{peer, op, after}` |
//! | a socket call failed during bootstrap | `Io{peer, source}` |
//! | a bad environment, hostfile or refused handshake | `Config{what}` |
//!
//! A lost peer stays lost: every later operation that needs it fails with the first cause.

use rlx_transport::CollectiveError;

/// Why a peer is gone.
#[derive(Clone, Debug)]
pub(crate) enum Lost {
    /// Closed, reset or crashed; the reason names the address.
    Gone(String),
    /// Closed its transport on purpose (its close frame arrived): the end of its part of the
    /// job, an error only for a receive that still waits for it. The reason names the address.
    Departed(String),
    /// Sent bytes that break the protocol.
    Protocol(String),
}

impl Lost {
    pub(crate) fn error(&self, peer: u32) -> CollectiveError {
        match self {
            Lost::Gone(reason) | Lost::Departed(reason) => CollectiveError::PeerLost {
                peer,
                reason: reason.clone(),
            },
            Lost::Protocol(detail) => CollectiveError::Protocol {
                peer: Some(peer),
                detail: detail.clone(),
            },
        }
    }
}

/// The cause to record when reading a peer's bytes produced `err` (a protocol violation).
pub(crate) fn protocol_lost(err: CollectiveError) -> Lost {
    match err {
        CollectiveError::Protocol { detail, .. } => Lost::Protocol(detail),
        other => Lost::Protocol(other.to_string()),
    }
}
