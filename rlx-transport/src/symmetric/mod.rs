//! The one-sided contract: [`SymmetricTransport`], a symmetric heap on every rank that the
//! other ranks read and write without the owner taking part.
//!
//! - [`SymmetricHeap`] (`heap`): one rank's memory, sound under concurrent remote and local
//!   access.
//! - `wire` and `service`: the heap service as protocol logic without sockets — message types,
//!   strict encoding, the request → response state machine and the initiator's table of
//!   requests in flight; `queue`: the hand-over from a peer's reader to its server.
//! - [`Symmetric`]: `SymmetricTransport` for any two-sided [`Transport`], so
//!   [`MemTransport`](crate::MemTransport) and every socket transport get the heap without
//!   writing it again (`over_transport`); `as_transport`: `Symmetric` as a `Transport` itself,
//!   delegating to the carrying one.
//!
//! # Semantics every implementation keeps
//!
//! - [`SymmetricTransport::alloc`] is collective: every rank calls it with the same length in
//!   the same order and gets the same [`Region`]; the region is zeroed on every rank before any
//!   rank's `alloc` returns.
//! - Operations from one initiator to one target are applied at the target in issue order,
//!   whatever their kind (a get sees the puts issued before it).
//! - A blocking put returns once the target applied it; a non-blocking put returns a handle.
//!   [`SymmetricTransport::quiet`] waits until every put issued so far has been applied.
//! - A put-with-signal applies its data before its signal: when [`SymmetricTransport::wait_until`]
//!   on the target sees the signal, the data is visible.
//! - [`Transport::barrier`] of a `SymmetricTransport` implies `quiet`: after the barrier
//!   returns on any rank, every put issued before the barrier on every rank is visible.
//! - Bounds, alignment and rank errors return to the initiator
//!   ([`CollectiveError::OutOfBounds`] naming the target, [`CollectiveError::UnknownRank`],
//!   [`CollectiveError::InvalidArgument`]); the target's heap is left untouched.
//!
//! # Examples
//!
//! ```
//! use rlx_transport::symmetric::{Cmp, Signal, SymmetricTransport};
//! use rlx_transport::{MemTransport, Transport};
//! use std::time::Duration;
//!
//! let world = MemTransport::fan_out_symmetric(2, 1 << 16)?;
//! let threads: Vec<_> = world
//!     .into_iter()
//!     .map(|t| {
//!         std::thread::spawn(move || -> rlx_transport::Result<Vec<u8>> {
//!             let region = t.alloc(64)?;
//!             let flag = t.alloc(8)?;
//!             let peer = 1 - t.rank();
//!             let greeting = [t.rank() as u8; 4];
//!             t.put_signal(peer, region.offset(), &greeting, Signal::set(flag.offset(), 1))?;
//!             t.wait_until(flag.offset(), Cmp::Eq, 1, Duration::from_secs(10))?;
//!             let mut got = vec![0u8; 4];
//!             t.heap().read(region.offset(), &mut got)?;
//!             t.barrier()?;
//!             Ok(got)
//!         })
//!     })
//!     .collect();
//! let got: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect::<Result<_, _>>()?;
//! assert_eq!(got, vec![vec![1u8; 4], vec![0u8; 4]]);
//! # Ok::<(), rlx_transport::CollectiveError>(())
//! ```

mod agreement;
mod alloc;
mod as_transport;
mod handle;
pub mod heap;
mod over_transport;
pub mod queue;
pub mod service;
pub mod wire;

use std::time::Duration;

use crate::{CollectiveError, Result, Transport};

pub use alloc::REGION_ALIGN;
pub use handle::{GetHandle, PutHandle};
pub use heap::{Cmp, HeapFault, SymmetricHeap};
pub use over_transport::{DEFAULT_MAX_CHUNK, HEAP_AGREEMENT_TAG, HEAP_SERVICE_TAG, Symmetric};
pub use wire::{Signal, SignalOp};

/// The dyn-compatible view of [`SymmetricTransport`] that [`Transport::symmetric`] returns.
pub use crate::transport::SymmetricOps;

/// A block of the symmetric heap returned by [`SymmetricTransport::alloc`]: the same offset and
/// length on every rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Region {
    pub(crate) offset: u64,
    pub(crate) len: u64,
}

impl Region {
    /// Heap offset of the first byte (a multiple of [`REGION_ALIGN`]).
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Length in bytes, as asked for.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the region has no bytes (never true for a region from `alloc`).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Heap offset of byte `at` of the region; `InvalidArgument` when `at..at + len` does not
    /// lie inside the region.
    pub fn at(&self, at: u64, len: u64) -> Result<u64> {
        match at.checked_add(len) {
            Some(end) if end <= self.len => Ok(self.offset + at),
            _ => Err(CollectiveError::invalid(format!(
                "bytes {at}..{at}+{len} are outside a region of {} bytes at heap offset {}",
                self.len, self.offset
            ))),
        }
    }
}

/// A non-blocking operation in flight; [`Completion::wait`] collects its result.
pub trait Completion: Send {
    /// What the operation produces.
    type Output;

    /// Whether the result has arrived (so that `wait` returns without blocking).
    fn is_done(&self) -> bool;

    /// Blocks until the operation completes (at most the transport's operation timeout) and
    /// returns its result.
    fn wait(self) -> Result<Self::Output>;
}

/// One-sided communication on a symmetric heap; see the module docs for the guarantees.
///
/// Implementors must make [`Transport::barrier`] imply [`SymmetricTransport::quiet`].
pub trait SymmetricTransport: Transport {
    /// The handle of a non-blocking put.
    type PutHandle: Completion<Output = ()>;
    /// The handle of a non-blocking get.
    type GetHandle: Completion<Output = Vec<u8>>;

    /// This rank's heap, for local reads, writes, atomics and waits. Remote puts land in it
    /// concurrently; read data after the `wait_until` or `barrier` that orders it.
    fn heap(&self) -> &SymmetricHeap;

    /// Collective: reserves `len` bytes at the same offset on every rank and zeroes them there.
    /// Every rank must call it with the same `len` in the same order; a mismatch fails on every
    /// rank and allocates nothing.
    fn alloc(&self, len: u64) -> Result<Region>;

    /// Collective: returns `region` to the heap on every rank, after this rank's puts are
    /// quiet.
    fn free(&self, region: Region) -> Result<()>;

    /// Starts writing `data` into `rank`'s heap at `offset`; `data` may be reused at once.
    fn put_nbi(&self, rank: u32, offset: u64, data: &[u8]) -> Result<Self::PutHandle>;

    /// Starts writing `data` into `rank`'s heap at `offset` and then updating `signal` there.
    fn put_signal_nbi(
        &self,
        rank: u32,
        offset: u64,
        data: &[u8],
        signal: Signal,
    ) -> Result<Self::PutHandle>;

    /// Starts reading `len` bytes of `rank`'s heap at `offset`.
    fn get_nbi(&self, rank: u32, offset: u64, len: u64) -> Result<Self::GetHandle>;

    /// Atomically adds `value` to the 64-bit word at `offset` of `rank`'s heap and returns its
    /// previous value.
    fn fetch_add(&self, rank: u32, offset: u64, value: u64) -> Result<u64>;

    /// Atomically replaces the word at `offset` of `rank`'s heap with `new` if it equals
    /// `expected`; returns the previous value.
    fn compare_swap(&self, rank: u32, offset: u64, expected: u64, new: u64) -> Result<u64>;

    /// Orders the puts issued before it to each target before the puts issued after it.
    fn fence(&self) -> Result<()>;

    /// Waits until every put issued by this rank so far has been applied at its target, and
    /// reports the first failure since the previous `quiet`: a lost link under any put, or the
    /// target's refusal of a put whose handle was dropped (a put that was waited, or whose
    /// handle is still held, reports its refusal through the handle).
    fn quiet(&self) -> Result<()>;

    /// Writes `data` into `rank`'s heap at `offset` and returns once the target applied it.
    fn put(&self, rank: u32, offset: u64, data: &[u8]) -> Result<()> {
        self.put_nbi(rank, offset, data)?.wait()
    }

    /// Put-with-signal, returning once the target applied both.
    fn put_signal(&self, rank: u32, offset: u64, data: &[u8], signal: Signal) -> Result<()> {
        self.put_signal_nbi(rank, offset, data, signal)?.wait()
    }

    /// Reads `buf.len()` bytes of `rank`'s heap at `offset` into `buf`.
    fn get(&self, rank: u32, offset: u64, buf: &mut [u8]) -> Result<()> {
        let data = self.get_nbi(rank, offset, buf.len() as u64)?.wait()?;
        if data.len() != buf.len() {
            return Err(CollectiveError::LengthMismatch {
                op: "get",
                peer: Some(rank),
                expected: buf.len() as u64,
                got: data.len() as u64,
                dtype: None,
                lengths: Vec::new(),
            });
        }
        buf.copy_from_slice(&data);
        Ok(())
    }

    /// Blocks until the 64-bit word at `offset` of this rank's heap satisfies `cmp` against
    /// `value` (or `timeout` passes) and returns the word. Data put before the signal that
    /// satisfied it is visible when this returns.
    fn wait_until(&self, offset: u64, cmp: Cmp, value: u64, timeout: Duration) -> Result<u64> {
        self.heap().wait_until(offset, cmp, value, timeout)
    }

    /// Whether nothing `rank` sent can change this rank's heap any more: its link is gone and
    /// every request it sent before leaving has been applied. A wait on a signal that only
    /// `rank` sets is hopeless once this holds and the signal has not arrived; before, the
    /// signal may still be on its way even though `rank` itself has left.
    fn source_finished(&self, rank: u32) -> bool;
}
