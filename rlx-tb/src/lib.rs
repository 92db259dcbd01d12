//! The Thunderbolt transport of RLX: [`ThunderboltTransport`], the TCP machinery of `rlx-net`
//! with every socket kept on a Thunderbolt link, and the symmetric heap served over it
//! ([`ThunderboltHeap`]).
//!
//! - [`discover`] lists the links: on Linux interfaces whose driver is `thunderbolt-net` or
//!   whose name starts with `thunderbolt`; on macOS the Thunderbolt Bridge and Thunderbolt
//!   `enN` ports. `RLX_TB_IFNAME` overrides it in NCCL's `NCCL_SOCKET_IFNAME` syntax
//!   ([`rlx_transport::ifname::IfnameFilter`]). No link is a `Config` error listing the
//!   interfaces seen, never a fallback to another network.
//! - [`pin_socket`] binds a socket to a link (`SO_BINDTODEVICE`, `IP_BOUND_IF`,
//!   `IPV6_BOUND_IF`); [`scoped_addr`] and [`parse_scoped`] handle IPv6 link-local addresses
//!   with their scope ids.
//! - [`ThunderboltTransport`] builds a [`rlx_net::TcpTransport`] whose socket setup hook pins
//!   every listening and connecting socket to the link it uses (`bootstrap.rs` decides which,
//!   and refuses addresses routed through another interface), listening on and advertising
//!   the link's own address. A rank with several links (a Mac cabled to several peers) listens
//!   on every address instead, so that each peer reaches it at its end of the cable between
//!   them, and pins each connection it accepts to the link it came over (closing any that came
//!   over another interface). [`ThunderboltTransport::with_heap`] adds the symmetric one-sided
//!   heap ([`rlx_transport::Symmetric`], which works over any transport).
//!
//! OS code lives in `sys/` (one file per OS behind one contract, see `sys/mod.rs`).
//!
//! # Launching
//!
//! [`ThunderboltTransport::from_env`] reads the same variables as the TCP transport (see
//! [`rlx_transport::bootstrap`]), with these meanings on Thunderbolt:
//!
//! | variable | meaning |
//! |---|---|
//! | `RLX_RANK`, `RLX_WORLD_SIZE` (or torchrun's, Open MPI's, PMI's, Slurm's) | as for TCP |
//! | `RLX_MASTER_ADDR`, `RLX_MASTER_PORT` | rank 0's address *on a Thunderbolt link* (`169.254.3.1`, `fe80::1%bridge0`), or its routed identity (an address on its loopback interface that the others reach through routes over the cables); every rank advertises the source address of its route there; one link per peer |
//! | `RLX_HOSTFILE` | every rank's addresses on its links, one per link (`[["10.0.1.1:5000", "10.0.2.1:5000"], ...]` = two links per peer) |
//! | `RLX_TB_IFNAME` | the links, in NCCL syntax, instead of detection (`=lo` pins everything to loopback, for tests on one host; `thunderbolt,eth0` adds the Ethernet that joins Thunderbolt islands) |
//! | `RLX_TIMEOUT_MS`, `RLX_JOB_SECRET`, `RLX_JOB_ID`, `RLX_SOCKETS_PER_PEER`, `RLX_MAX_FRAME_BYTES` | as for TCP |
//!
//! `RLX_SOCKET_IFNAME` is ignored: the Thunderbolt links are chosen by detection and
//! `RLX_TB_IFNAME`. An address that is routed through another interface (Wi-Fi, Ethernet,
//! loopback) is a `Config` error, never used.
//!
//! # Examples
//!
//! ```no_run
//! for link in rlx_tb::discover()? {
//!     println!("{} (index {}): {:?}", link.name, link.index, link.thunderbolt);
//! }
//! # Ok::<(), rlx_transport::CollectiveError>(())
//! ```

mod bootstrap;
pub mod discovery;
pub mod env;
mod pin;
mod sys;
mod transport;

pub use discovery::{Evidence, Interface, discover, select_links};
pub use env::TB_IFNAME_ENV;
pub use pin::{is_link_local_v6, parse_scoped, pin_socket, pinned_interface, scoped_addr};
pub use transport::{ThunderboltHeap, ThunderboltTransport, ThunderboltTransportBuilder};
