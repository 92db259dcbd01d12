//! Operating-system code of the Thunderbolt transport, one file per OS (mio's layout).
//!
//! # The contract every OS file provides
//!
//! - `list_interfaces() -> Result<Vec<Interface>>`: every network interface of the host, with
//!   its index, its addresses (IPv6 link-local ones included), whether it is up, and the
//!   evidence that it is a Thunderbolt link (`Interface::thunderbolt`), or `None`.
//! - `pin_socket(&Socket, &Interface) -> Result<()>`: binds a socket to that interface, so that
//!   it can never send through another one (`SO_BINDTODEVICE` on Linux, `IP_BOUND_IF` /
//!   `IPV6_BOUND_IF` on macOS). Called before `bind`/`connect`.
//! - `pinned_interface(&Socket) -> Result<Option<String>>`: reads the binding back, for checks
//!   and diagnostics.
//! - `route_interface(SocketAddr) -> Option<String>`: the interface the kernel's main routing
//!   table sends a destination through, where the OS tells it cheaply; `None` otherwise. Only
//!   needed when the route's source address is a routed identity (on no link), which says
//!   nothing of the way out.
//!
//! Every function returns [`CollectiveError`](rlx_transport::CollectiveError): `Io` for a failed
//! system call (naming it), `Unsupported` where the OS cannot do it.
//!
//! `linux.rs` and `macos.rs` keep their parsing functions free of system calls and fed by
//! arguments (a sysfs root, the text of a system tool), so they are unit-tested with fake data;
//! `macos.rs` is compiled on every OS for that reason, with its system calls behind
//! `cfg(target_os = "macos")`. Both read the interface list (`getifaddrs`) through
//! [`rlx_transport::interfaces`]; `unix.rs` holds the rest they share (`if_nametoindex`, the
//! grouping of that list per interface). `unsupported.rs` compiles everywhere else and answers
//! `Unsupported`, so `cargo check` works on any OS.

#[cfg(target_os = "linux")]
pub(crate) mod linux;
// Compiled everywhere: its parsers are tested on Linux CI; the system calls inside are gated.
#[cfg_attr(
    not(target_os = "macos"),
    allow(
        dead_code,
        reason = "the macOS parsers are only reached on macOS outside tests"
    )
)]
pub(crate) mod macos;
#[cfg(unix)]
pub(crate) mod unix;
#[cfg(not(any(target_os = "linux", target_os = "macos")))]
pub(crate) mod unsupported;

#[cfg(target_os = "linux")]
pub(crate) use linux::{list_interfaces, pin_socket, pinned_interface, route_interface};
#[cfg(target_os = "macos")]
pub(crate) use macos::{list_interfaces, pin_socket, pinned_interface, route_interface};
#[cfg(not(any(target_os = "linux", target_os = "macos")))]
pub(crate) use unsupported::{list_interfaces, pin_socket, pinned_interface, route_interface};
