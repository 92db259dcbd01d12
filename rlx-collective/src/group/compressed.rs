//! The compressed all-reduce of a group: fewer bytes on slow links, for a bounded error that
//! the caller's [`Compressor`] feeds back into the next call (the ring lives in
//! `all_reduce/compressed.rs`, the codecs in `compression.rs`).

use super::ProcessGroup;
use crate::op::OpKind;
use crate::{Compressor, ReduceKind, Result};

impl ProcessGroup {
    /// [`ProcessGroup::all_reduce`] of f32 values with compressed frames on the wire, for
    /// links where the bytes cost more than the arithmetic (1 GbE, Wi-Fi, a shared
    /// Thunderbolt link): [`Compression::Bf16`](crate::Compression::Bf16) and [`Compression::Fp16`](crate::Compression::Fp16) send half the bytes,
    /// [`Compression::Int8`](crate::Compression::Int8) about a quarter. `op` is [`ReduceKind::Sum`] or
    /// [`ReduceKind::Mean`]; the others are [`CollectiveError::InvalidArgument`](crate::CollectiveError::InvalidArgument).
    ///
    /// Partial sums accumulate in f32 and every rank ends with bit-identical values. The
    /// result differs from the exact one by the compression error, which `compressor` feeds
    /// back: it keeps what this rank's compressions lost and adds it to the next call's
    /// contribution (see [`Compressor`]), so repeated calls (one per training step, with one
    /// compressor per tensor) lose nothing on average. It always runs the bandwidth-optimal
    /// ring (2(n-1)/n of the compressed bytes per rank) and never a backend's native
    /// collectives.
    ///
    /// Every rank must pass the same format, reduction and length; otherwise every rank fails
    /// with [`CollectiveError::InvalidArgument`](crate::CollectiveError::InvalidArgument) or [`CollectiveError::LengthMismatch`](crate::CollectiveError::LengthMismatch) and
    /// the group stays usable. A malformed frame from a peer is
    /// [`CollectiveError::Protocol`](crate::CollectiveError::Protocol) naming it. [`Compression::Int8`](crate::Compression::Int8) refuses NaN and infinite
    /// values ([`CollectiveError::InvalidArgument`](crate::CollectiveError::InvalidArgument) on the rank that holds them). After an
    /// error `data` holds unspecified values and the compressor's residual is cleared.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use rlx_collective::{Compression, Compressor, MemTransport, ProcessGroup, ReduceKind, Transport};
    ///
    /// let world: Vec<ProcessGroup> = MemTransport::fan_out(2)
    ///     .into_iter()
    ///     .map(|t| ProcessGroup::new(t as Arc<dyn Transport>))
    ///     .collect();
    /// std::thread::scope(|s| {
    ///     for group in &world {
    ///         s.spawn(move || {
    ///             // One compressor per tensor, kept from one step to the next.
    ///             let mut compressor = Compressor::new(Compression::Bf16);
    ///             let mut grads = [0.5f32, -2.0, 3.0];
    ///             group
    ///                 .all_reduce_compressed(&mut grads, ReduceKind::Mean, &mut compressor)
    ///                 .unwrap();
    ///             // These values are exact in bf16, so the mean is too.
    ///             assert_eq!(grads, [0.5, -2.0, 3.0]);
    ///             assert!(compressor.last_wire_bytes() > 0);
    ///         });
    ///     }
    /// });
    /// ```
    pub fn all_reduce_compressed(
        &self,
        data: &mut [f32],
        op: ReduceKind,
        compressor: &mut Compressor,
    ) -> Result<()> {
        self.run(OpKind::AllReduceCompressed, |ctx| {
            crate::all_reduce::compressed::run(ctx, data, op, compressor)
        })
    }
}
