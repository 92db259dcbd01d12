//! `ProcessGroup` and the collective algorithms of RLX, written only against the
//! [`Transport`] contract.
//!
//! - [`ProcessGroup`]: all-reduce, reduce, reduce-scatter, all-gather, gather, scatter,
//!   broadcast, all-to-all, barrier, point-to-point, non-blocking `spawn_*` variants,
//!   federated averaging and `split`, generic over the [`Element`] types (`f32`, `f64`,
//!   [`f16`](struct@f16), [`bf16`], `i8`, `u8`, `i32`, `i64`: the slice's type decides what travels), and
//!   on raw little-endian buffers whose [`DType`] is known only at run time (the `*_typed`
//!   methods).
//! - One file per algorithm (`all_reduce/ring.rs`, `all_reduce/recursive_doubling.rs`,
//!   `all_reduce/one_sided/`, `all_gather/{ring,bruck}.rs`, `broadcast/{binomial,chain}.rs`,
//!   ...), chosen by [`select`] unless [`ProcessGroup::set_algorithm`] forces one. The
//!   one-sided ring all-reduce ([`select::Algorithm::OneSidedRing`]) runs on transports with a
//!   symmetric heap (`rlx_transport::Symmetric`) and is only used when forced.
//! - [`ProcessGroup::all_reduce_compressed`]: f32 sum and mean with [`Compression::Bf16`],
//!   [`Compression::Fp16`] or [`Compression::Int8`] frames on the wire and error feedback
//!   through a [`Compressor`] per tensor (`all_reduce/compressed.rs`, codecs in
//!   `compression.rs`), for links where bytes cost more than arithmetic.
//! - On a backend with native collectives (MLX) the world group runs its operations in issue
//!   order, whatever thread runs them, because native calls match by call order alone.
//! - [`conformance`]: the check suite (every collective × dtype × reduction × awkward size
//!   against a serial reference) that tests and `cargo xtask test-cluster` run on a group.
//! - [`ProcessGroup::shrink`] and [`ProcessGroup::grow`]: a job that survives a lost rank.
//!   After a fatal failure every survivor calls `shrink` and gets the same new group of the
//!   survivors over the same links (the ranks declared dead are excluded at the transport and
//!   fail if they wake up); `grow` admits replacements that call [`join()`] (TCP) or
//!   [`ProcessGroup::joined`] (in-process, with a [`MemJoiner`]).
//! - [`init()`]: the world group from the environment on the compiled-in backend (a world of
//!   one rank when no launcher set anything); the README's "Use it in your crate" shows a
//!   whole program and how to launch it.
//!
//! The contracts of `rlx-transport` are re-exported, so `use rlx_collective::*` suffices.
//!
//! # Errors
//!
//! Every operation returns [`CollectiveError`]. When one rank's part of a collective fails, it
//! sends a failure notice to every other member under the operation's tag, so their next
//! receive of that operation fails at once: a rank passing another length makes the ranks
//! that depend on it fail with [`CollectiveError::LengthMismatch`] (all of them for
//! all-reduce and all-gather, whose every result depends on every rank), not hang.
//! Length, argument and rank errors leave the group usable for the next operation; lost
//! peers, timeouts and aborts do not (see [`CollectiveError::is_fatal`]): such a fatal failure
//! on one rank makes the whole group fail on every rank, in whatever operation each is, with
//! [`CollectiveError::GroupFailed`] naming the rank at fault, within milliseconds rather than at
//! the timeout (except [`ProcessGroup::federated_average`], whose rounds go on without lost
//! members).
//!
//! # Transport assumption
//!
//! The pipelined algorithms send one segment (at most 1 MiB, 256 KiB below 64 MiB buffers)
//! to a neighbour and then receive one from the other side, so a transport must accept a
//! send of one segment per peer without waiting for the peer to post its receive (as
//! `MemTransport` does and socket transports do with their kernel buffers and inbox).
//!
//! # Examples
//!
//! ```
//! use std::sync::Arc;
//! use rlx_collective::*;
//!
//! let handles: Vec<_> = MemTransport::fan_out(4)
//!     .into_iter()
//!     .map(|t| {
//!         std::thread::spawn(move || -> Result<Vec<f32>, CollectiveError> {
//!             let group = ProcessGroup::new(t as Arc<dyn Transport>);
//!             let mut grads = vec![group.rank() as f32; 3];
//!             group.all_reduce(&mut grads, ReduceKind::Mean)?;
//!             Ok(grads)
//!         })
//!     })
//!     .collect();
//! for h in handles {
//!     assert_eq!(h.join().unwrap()?, vec![1.5; 3]);
//! }
//! # Ok::<(), CollectiveError>(())
//! ```

// The f32 wrappers view `&[f32]` as little-endian bytes in place; on a big-endian target
// that view would put the wrong bytes on the wire.
#[cfg(target_endian = "big")]
compile_error!("rlx-collective supports little-endian targets only");

mod all_gather;
mod all_reduce;
mod all_to_all;
mod barrier;
mod broadcast;
mod bucketer;
mod cable_path;
mod compression;
pub mod conformance;
mod debug_log;
pub mod env;
mod federated;
pub mod flight;
#[doc(hidden)]
pub mod fuzzing;
mod gather;
mod group;
mod handle;
mod health;
mod init;
mod islands;
mod issue_order;
mod kernels;
mod layout;
mod length_census;
mod op;
mod per_cable;
mod reduce;
mod reduce_scatter;
mod ring_order;
mod scatter;
mod scratch;
pub mod select;
mod shrink;
mod split;
mod sync;
mod wait_chain;

pub use bucketer::Bucketer;
pub use compression::{Compression, Compressor, FRAME_CHUNK, INT8_BLOCK};
pub use debug_log::install_debug_subscriber;
pub use env::{CABLING_VAR, DEBUG_VAR, PREFIXED_VAR};
pub use group::{DEFAULT_BUCKET_BYTES, ProcessGroup, WORLD_GROUP_ID};
/// The half-precision element types, re-exported so that a program uses the very `half`
/// version this crate was built with.
pub use half::{bf16, f16};
pub use handle::{AllReduceHandle, CollectiveHandle};
pub use init::{BACKEND_VAR, compiled_backends, init, join};
pub use rlx_transport::{
    Admission, CollectiveError, DEFAULT_OP_TIMEOUT, DType, Delegate, Element, FAILURE_WIRE_LEN,
    Failure, FatalCause, Inbox, MemJoiner, MemTransport, NativeCollectives, NativeOp, Reach,
    ReduceKind, Result, TAG_RESERVED_BASE, TRANSPORT_GROUP, Tag, Topology, Transport, Waiter,
    cabling, negotiate_reduce_dtype, topology,
};
pub use select::{Algorithm, CollectiveOp};

/// Checks that a buffer of `len` bytes is a whole number of `dtype` elements.
pub(crate) fn check_dtype_len(len: usize, dtype: DType) -> Result<()> {
    if len % dtype.size() != 0 {
        return Err(CollectiveError::invalid(format!(
            "buffer of {len} bytes is not a whole number of {dtype} elements ({} bytes each)",
            dtype.size()
        )));
    }
    Ok(())
}
