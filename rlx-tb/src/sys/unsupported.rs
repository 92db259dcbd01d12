//! Every OS without Thunderbolt support in RLX: each function of the contract answers
//! `Unsupported`, so the crate builds (and `cargo check` passes) everywhere.

use rlx_transport::{CollectiveError, Result};
use socket2::Socket;

use crate::discovery::Interface;

fn unsupported(what: &str) -> CollectiveError {
    CollectiveError::unsupported(format!(
        "{what} on {}: the Thunderbolt transport supports Linux and macOS",
        std::env::consts::OS
    ))
}

/// The contract's `list_interfaces`.
pub(crate) fn list_interfaces() -> Result<Vec<Interface>> {
    Err(unsupported("listing Thunderbolt interfaces"))
}

/// The contract's `pin_socket`.
pub(crate) fn pin_socket(_socket: &Socket, interface: &Interface) -> Result<()> {
    Err(unsupported(&format!(
        "pinning a socket to {}",
        interface.name
    )))
}

/// The contract's `pinned_interface`.
pub(crate) fn pinned_interface(_socket: &Socket) -> Result<Option<String>> {
    Err(unsupported("reading a socket's interface binding"))
}

/// The contract's `route_interface`: nothing is known.
pub(crate) fn route_interface(_dest: std::net::SocketAddr) -> Option<String> {
    None
}
