//! The TCP transport of RLX for Unix systems (Linux, macOS, the BSDs): [`TcpTransport`].
//!
//! It relies on Unix-only pieces, `poll(2)` and Unix-domain sockets for its wake-ups, so it
//! does not build on Windows.
//!
//! Layout (the same file names serve every socket transport of the workspace):
//! - `frame.rs`: the frame header (64-bit lengths, frame cap, kinds), pure functions;
//! - `handshake.rs`: magic, version, job id, rank, world size, optional HMAC, pure functions;
//! - `auth.rs`: the proof of `RLX_JOB_SECRET` (HMAC-SHA256 challenge-response, nonces) that
//!   the handshake, the rendezvous store and the admission desk share;
//! - `bootstrap/`: listeners, the rank-0 rendezvous store, connecting with backoff and
//!   accepting with a deadline;
//! - `matching.rs`: the matching state machine (posted receives, arriving and unexpected
//!   messages, backpressure budget, lost peers), no I/O;
//! - `progress/`: the engine that reads and writes the sockets on the calling threads, and
//!   the single-copy path that moves large messages between ranks of one host from memory to
//!   memory (`progress/same_host/`, Linux);
//! - `error.rs`: how failures map onto `CollectiveError`;
//! - `builder.rs`: [`TcpTransportBuilder`], the configuration; `start.rs`: its `build`;
//! - `env.rs`: the tuning variables of the environment, their names and documented list;
//! - `transport.rs`: [`TcpTransport`] and the [`Transport`] methods.
//!
//! The launch environment (`RLX_RANK`, torchrun's, Open MPI's, PMI's and Slurm's variables,
//! hostfiles, ...) is parsed by [`rlx_transport::bootstrap`], shared with the Thunderbolt
//! transport; [`TcpTransport::from_env`] also reads the engine's tuning variables (module
//! [`env`](mod@env), applied by [`TcpTransportBuilder::tuning_env`]). The README's table of variables
//! ("Launching across processes or machines") lists every one, with its default and backends.
//!
//! Errors: a peer that closes, crashes or resets, or that sends nothing (not even a heartbeat)
//! for five heartbeat intervals, fails every operation that needs it with
//! [`CollectiveError::PeerLost`] naming its rank and address; bytes that break the protocol give
//! [`CollectiveError::Protocol`]; a deadline gives [`CollectiveError::Timeout`] (a send that
//! times out mid-message also makes the peer lost, since its link is then unusable); a bad
//! environment gives [`CollectiveError::Config`]; a refused handshake is a `Config` error on
//! the side that was refused and a line on stderr on the side that refused.
//!
//! [`CollectiveError::PeerLost`]: rlx_transport::CollectiveError::PeerLost
//! [`CollectiveError::Protocol`]: rlx_transport::CollectiveError::Protocol
//! [`CollectiveError::Timeout`]: rlx_transport::CollectiveError::Timeout
//! [`CollectiveError::Config`]: rlx_transport::CollectiveError::Config
//!
//! [`Transport`]: rlx_transport::Transport

mod admission;
mod auth;
mod bootstrap;
mod builder;
pub mod env;
mod error;
mod frame;
#[doc(hidden)]
pub mod fuzzing;
mod handshake;
mod matching;
mod progress;
mod start;
mod sync;
mod transport;

#[cfg(rlx_loom)]
#[doc(hidden)]
pub mod loom_rank;

pub use bootstrap::SocketRole;
pub use builder::{
    DEFAULT_MAX_FRAME_BYTES, DEFAULT_MAX_UNEXPECTED_BYTES, DEFAULT_MIN_STRIPED_BYTES,
    TcpTransportBuilder,
};
pub use transport::TcpTransport;
