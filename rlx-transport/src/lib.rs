//! The contracts of RLX transport.
//!
//! - [`Transport`]: two-sided, tagged, matched message passing (FIFO per source and tag), with
//!   deadlines, abort and lost-peer detection; every backend implements it and the collectives
//!   in `rlx-collective` see nothing else.
//! - [`CollectiveError`]: the one error type; [`DType`] and [`ReduceKind`]: what travels and how
//!   it is combined, and [`Element`] the Rust types that travel as each dtype; [`Tag`] and
//!   [`TAG_RESERVED_BASE`]: the tag space.
//! - [`MemTransport`]: ranks as threads of one process, built on the shared [`Inbox`].
//! - [`sim::SimTransport`]: thread ranks whose network is simulated on a virtual clock (a
//!   switch, a cable mesh, a ring or a chain at a given rate and latency), so that the
//!   collectives can be timed at world sizes and on networks this machine does not have.
//! - [`SymmetricTransport`] (module [`symmetric`]): one-sided put/get/atomics on a symmetric
//!   heap, provided for any transport by [`Symmetric`].
//! - [`Delegate`]: how a transport that wraps another forwards every [`Transport`] method to
//!   it, overriding only what it changes.
//! - [`env`](mod@env): the `RLX_*` environment variables this crate reads, and [`env::Variable`], the
//!   shape of every crate's documented list of variables.
//! - [`blocked_send`]: the hook through which the layers above keep their duties (answering
//!   wait probes) while a send of theirs waits inside a transport on a peer that does not read.
//!
//! This crate depends on no other crate of the workspace.
//!
//! # Examples
//!
//! ```
//! use rlx_transport::{MemTransport, Transport};
//!
//! let world = MemTransport::fan_out(4);
//! let threads: Vec<_> = world
//!     .into_iter()
//!     .map(|t| std::thread::spawn(move || t.barrier()))
//!     .collect();
//! for t in threads {
//!     t.join().unwrap()?;
//! }
//! # Ok::<(), rlx_transport::CollectiveError>(())
//! ```

pub mod admission;
pub mod blocked_send;
pub mod bootstrap;
pub mod cabling;
mod delegate;
mod dtype;
mod element;
pub mod env;
mod error;
mod failure;
#[doc(hidden)]
pub mod fuzzing;
pub mod hostfile;
pub mod ifname;
pub mod inbox;
pub mod interfaces;
mod mem;
pub mod ports;
pub mod sim;
pub mod symmetric;
mod sync;
mod tag;
pub mod topology;
mod transport;

pub use admission::{Admission, PendingJoiner};
pub use bootstrap::{LaunchEnv, Rendezvous};
pub use delegate::Delegate;
pub use dtype::{DType, ReduceKind, negotiate_reduce_dtype};
pub use element::Element;
pub use error::{CollectiveError, FatalCause, Result, Waiter};
pub use failure::{FAILURE_WIRE_LEN, Failure};
pub use inbox::Inbox;
pub use mem::{MemJoiner, MemTransport};
pub use symmetric::{Region, Symmetric, SymmetricTransport};
pub use tag::{EXCLUSION_TAG, TAG_RESERVED_BASE, TRANSPORT_GROUP, Tag};
pub use topology::{Reach, Topology};
pub use transport::{
    DEFAULT_OP_TIMEOUT, MAX_SEGMENT_HINT, NativeCollectives, NativeOp, Traffic, Transport,
};
