//! The reducing collectives of a group (all-reduce, reduce, reduce-scatter), broadcast and
//! barrier: for each, the form generic over the [`Element`] types (which
//! keeps the original `f32` calls as they were), the `*_typed` form on raw little-endian
//! elements of a [`DType`] known only at run time, and the non-blocking `spawn_*` forms, each a
//! thin wrapper over one implementation that issues the operation and hands its context to the
//! algorithm module.

use super::ProcessGroup;
use crate::handle::{AllReduceHandle, CollectiveHandle};
use crate::reduce_scatter;
use crate::select::CollectiveOp;
use crate::{CollectiveError, DType, Element, ReduceKind, Result};

impl ProcessGroup {
    /// Returns once every member has entered the barrier (dissemination algorithm).
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use rlx_collective::{MemTransport, ProcessGroup, ReduceKind, Transport};
    /// # let world: Vec<ProcessGroup> = MemTransport::fan_out(3).into_iter()
    /// #     .map(|t| ProcessGroup::new(t as Arc<dyn Transport>)).collect();
    /// std::thread::scope(|s| {
    ///     for group in &world {
    ///         s.spawn(move || {
    ///             group.barrier().unwrap();
    ///         });
    ///     }
    /// });
    /// ```
    pub fn barrier(&self) -> Result<()> {
        self.run(CollectiveOp::Barrier, crate::barrier::dissemination::run)
    }

    /// Reduces `data` over the group in place; every rank ends with bit-identical values.
    ///
    /// Accumulates in f32 (f64 for `F64` data, i64 for integers) across all hops and rounds
    /// once at the end. All ranks must pass the same length; otherwise every rank fails with
    /// [`CollectiveError::LengthMismatch`].
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use rlx_collective::{MemTransport, ProcessGroup, ReduceKind, Transport};
    ///
    /// let world: Vec<ProcessGroup> = MemTransport::fan_out(2)
    ///     .into_iter()
    ///     .map(|t| ProcessGroup::new(t as Arc<dyn Transport>))
    ///     .collect();
    /// let peer = world[1].clone();
    /// let t = std::thread::spawn(move || {
    ///     let mut x = [3.0f32, 4.0];
    ///     peer.all_reduce(&mut x, ReduceKind::Mean).map(|_| x)
    /// });
    /// let mut x = [1.0f32, 2.0];
    /// world[0].all_reduce(&mut x, ReduceKind::Mean)?;
    /// assert_eq!(x, [2.0, 3.0]);
    /// assert_eq!(t.join().unwrap()?, [2.0, 3.0]);
    /// # Ok::<(), rlx_collective::CollectiveError>(())
    /// ```
    pub fn all_reduce<T: Element>(&self, data: &mut [T], op: ReduceKind) -> Result<()> {
        self.all_reduce_typed(bytemuck::cast_slice_mut(data), T::DTYPE, op)
    }

    /// [`ProcessGroup::all_reduce`] on raw little-endian `dtype` elements.
    pub fn all_reduce_typed(&self, data: &mut [u8], dtype: DType, op: ReduceKind) -> Result<()> {
        self.run(CollectiveOp::AllReduce, |ctx| {
            crate::all_reduce::run(ctx, data, dtype, op)
        })
    }

    /// Non-blocking [`ProcessGroup::all_reduce`]: issued now, run on its own thread;
    /// `join()` returns the reduced buffer.
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use rlx_collective::{MemTransport, ProcessGroup, ReduceKind, Transport};
    /// # let world: Vec<ProcessGroup> = MemTransport::fan_out(2).into_iter()
    /// #     .map(|t| ProcessGroup::new(t as Arc<dyn Transport>)).collect();
    /// std::thread::scope(|s| {
    ///     for group in &world {
    ///         s.spawn(move || {
    ///             let pending = group.spawn_all_reduce(vec![1.0f32; 4], ReduceKind::Sum);
    ///             // ... compute something else while the sum travels ...
    ///             assert_eq!(pending.join().unwrap(), vec![2.0; 4]);
    ///         });
    ///     }
    /// });
    /// ```
    pub fn spawn_all_reduce<T: Element>(
        &self,
        mut data: Vec<T>,
        op: ReduceKind,
    ) -> AllReduceHandle<T> {
        self.spawn(CollectiveOp::AllReduce, move |ctx| {
            crate::all_reduce::run(ctx, bytemuck::cast_slice_mut(&mut data), T::DTYPE, op)?;
            Ok(data)
        })
    }

    /// The former name of [`ProcessGroup::spawn_all_reduce`] for `f32`s.
    #[deprecated(
        since = "0.1.0",
        note = "use `spawn_all_reduce`, which takes any element type"
    )]
    pub fn spawn_all_reduce_f32(&self, data: Vec<f32>, op: ReduceKind) -> AllReduceHandle {
        self.spawn_all_reduce(data, op)
    }

    /// The former name of [`ProcessGroup::spawn_all_reduce`] on a plain group handle.
    #[deprecated(
        since = "0.1.0",
        note = "use `spawn_all_reduce`, which takes `&self` now"
    )]
    pub fn spawn_all_reduce_of<T: Element>(
        &self,
        data: Vec<T>,
        op: ReduceKind,
    ) -> AllReduceHandle<T> {
        self.spawn_all_reduce(data, op)
    }

    /// Non-blocking [`ProcessGroup::all_reduce_typed`].
    pub fn spawn_all_reduce_typed(
        &self,
        mut data: Vec<u8>,
        dtype: DType,
        op: ReduceKind,
    ) -> CollectiveHandle<Vec<u8>> {
        self.spawn(CollectiveOp::AllReduce, move |ctx| {
            crate::all_reduce::run(ctx, &mut data, dtype, op)?;
            Ok(data)
        })
    }

    /// Reduces every rank's `data` into `root`'s `data`; the other ranks' buffers are left
    /// unchanged.
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use rlx_collective::{MemTransport, ProcessGroup, ReduceKind, Transport};
    /// # let world: Vec<ProcessGroup> = MemTransport::fan_out(3).into_iter()
    /// #     .map(|t| ProcessGroup::new(t as Arc<dyn Transport>)).collect();
    /// std::thread::scope(|s| {
    ///     for group in &world {
    ///         s.spawn(move || {
    ///             let mut x = [group.rank() as i64 + 1; 2];
    ///             group.reduce(0, &mut x, ReduceKind::Product).unwrap();
    ///             if group.rank() == 0 {
    ///                 assert_eq!(x, [6, 6]);
    ///             }
    ///         });
    ///     }
    /// });
    /// ```
    pub fn reduce<T: Element>(&self, root: u32, data: &mut [T], op: ReduceKind) -> Result<()> {
        self.reduce_typed(root, bytemuck::cast_slice_mut(data), T::DTYPE, op)
    }

    /// [`ProcessGroup::reduce`] on raw little-endian `dtype` elements.
    pub fn reduce_typed(
        &self,
        root: u32,
        data: &mut [u8],
        dtype: DType,
        op: ReduceKind,
    ) -> Result<()> {
        self.run(CollectiveOp::Reduce, |ctx| {
            crate::reduce::run(ctx, root, data, dtype, op)
        })
    }

    /// Non-blocking [`ProcessGroup::reduce`]; `join()` returns the buffer (the result on the
    /// root, the untouched input elsewhere).
    pub fn spawn_reduce<T: Element>(
        &self,
        root: u32,
        mut data: Vec<T>,
        op: ReduceKind,
    ) -> CollectiveHandle<Vec<T>> {
        self.spawn(CollectiveOp::Reduce, move |ctx| {
            crate::reduce::run(ctx, root, bytemuck::cast_slice_mut(&mut data), T::DTYPE, op)?;
            Ok(data)
        })
    }

    /// Non-blocking [`ProcessGroup::reduce_typed`]; `join()` returns the buffer (the result on
    /// the root, the untouched input elsewhere).
    pub fn spawn_reduce_typed(
        &self,
        root: u32,
        mut data: Vec<u8>,
        dtype: DType,
        op: ReduceKind,
    ) -> CollectiveHandle<Vec<u8>> {
        self.spawn(CollectiveOp::Reduce, move |ctx| {
            crate::reduce::run(ctx, root, &mut data, dtype, op)?;
            Ok(data)
        })
    }

    /// Reduces every rank's `data` and returns this rank's block of the result: with `c`
    /// elements on `n` ranks, rank `i` gets elements `i*c/n .. (i+1)*c/n` (blocks differ by
    /// at most one element when `n` does not divide `c`).
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use rlx_collective::{MemTransport, ProcessGroup, ReduceKind, Transport};
    /// # let world: Vec<ProcessGroup> = MemTransport::fan_out(2).into_iter()
    /// #     .map(|t| ProcessGroup::new(t as Arc<dyn Transport>)).collect();
    /// std::thread::scope(|s| {
    ///     for group in &world {
    ///         s.spawn(move || {
    ///             let block = group.reduce_scatter(&[1.0f32, 2.0, 3.0, 4.0], ReduceKind::Sum).unwrap();
    ///             let expected = [[2.0, 4.0], [6.0, 8.0]][group.rank() as usize];
    ///             assert_eq!(block, expected);
    ///         });
    ///     }
    /// });
    /// ```
    pub fn reduce_scatter<T: Element>(&self, data: &[T], op: ReduceKind) -> Result<Vec<T>> {
        let len = reduce_scatter::block_len(
            std::mem::size_of_val(data),
            T::DTYPE,
            self.world_size(),
            self.rank(),
        );
        let mut out = vec![T::zeroed(); len / size_of::<T>()];
        self.reduce_scatter_into(data, op, &mut out)?;
        Ok(out)
    }

    /// [`ProcessGroup::reduce_scatter`] into `out`, which holds exactly this rank's block
    /// (`(i+1)*c/n - i*c/n` elements on rank `i`): nothing is allocated and nothing of `data`
    /// is copied. An `out` of another length is [`CollectiveError::InvalidArgument`] on this
    /// rank and fails the operation on the others.
    pub fn reduce_scatter_into<T: Element>(
        &self,
        data: &[T],
        op: ReduceKind,
        out: &mut [T],
    ) -> Result<()> {
        self.reduce_scatter_typed_into(
            bytemuck::cast_slice(data),
            bytemuck::cast_slice_mut(out),
            T::DTYPE,
            op,
        )
    }

    /// [`ProcessGroup::reduce_scatter`] on raw little-endian `dtype` elements.
    pub fn reduce_scatter_typed(
        &self,
        data: &[u8],
        dtype: DType,
        op: ReduceKind,
    ) -> Result<Vec<u8>> {
        let mut out =
            vec![0u8; reduce_scatter::block_len(data.len(), dtype, self.world_size(), self.rank())];
        self.reduce_scatter_typed_into(data, &mut out, dtype, op)?;
        Ok(out)
    }

    /// [`ProcessGroup::reduce_scatter_into`] on raw little-endian `dtype` elements.
    pub fn reduce_scatter_typed_into(
        &self,
        data: &[u8],
        out: &mut [u8],
        dtype: DType,
        op: ReduceKind,
    ) -> Result<()> {
        self.run(CollectiveOp::ReduceScatter, |ctx| {
            reduce_scatter::run(ctx, data, out, dtype, op)
        })
    }

    /// Non-blocking [`ProcessGroup::reduce_scatter`].
    pub fn spawn_reduce_scatter<T: Element>(
        &self,
        data: Vec<T>,
        op: ReduceKind,
    ) -> CollectiveHandle<Vec<T>> {
        self.spawn(CollectiveOp::ReduceScatter, move |ctx| {
            let input = bytemuck::cast_slice(&data);
            let len = reduce_scatter::block_len(input.len(), T::DTYPE, ctx.size(), ctx.rank);
            let mut out = vec![T::zeroed(); len / size_of::<T>()];
            reduce_scatter::run(ctx, input, bytemuck::cast_slice_mut(&mut out), T::DTYPE, op)?;
            Ok(out)
        })
    }

    /// Non-blocking [`ProcessGroup::reduce_scatter_typed`].
    pub fn spawn_reduce_scatter_typed(
        &self,
        data: Vec<u8>,
        dtype: DType,
        op: ReduceKind,
    ) -> CollectiveHandle<Vec<u8>> {
        self.spawn(CollectiveOp::ReduceScatter, move |ctx| {
            let mut out =
                vec![0u8; reduce_scatter::block_len(data.len(), dtype, ctx.size(), ctx.rank)];
            reduce_scatter::run(ctx, &data, &mut out, dtype, op)?;
            Ok(out)
        })
    }

    /// Copies `root`'s `data` into every rank's `data`. All ranks pass the same length.
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use rlx_collective::{MemTransport, ProcessGroup, ReduceKind, Transport};
    /// # let world: Vec<ProcessGroup> = MemTransport::fan_out(3).into_iter()
    /// #     .map(|t| ProcessGroup::new(t as Arc<dyn Transport>)).collect();
    /// std::thread::scope(|s| {
    ///     for group in &world {
    ///         s.spawn(move || {
    ///             let mut weights = if group.rank() == 2 { [0.5f32, -1.0] } else { [0.0; 2] };
    ///             group.broadcast(2, &mut weights).unwrap();
    ///             assert_eq!(weights, [0.5, -1.0]);
    ///         });
    ///     }
    /// });
    /// ```
    pub fn broadcast<T: Element>(&self, root: u32, data: &mut [T]) -> Result<()> {
        self.broadcast_typed(root, bytemuck::cast_slice_mut(data), T::DTYPE)
    }

    /// [`ProcessGroup::broadcast`] on raw little-endian `dtype` elements.
    pub fn broadcast_typed(&self, root: u32, data: &mut [u8], dtype: DType) -> Result<()> {
        self.run(CollectiveOp::Broadcast, |ctx| {
            crate::broadcast::run(ctx, root, data, dtype)
        })
    }

    /// Non-blocking [`ProcessGroup::broadcast`]; `join()` returns the buffer.
    pub fn spawn_broadcast<T: Element>(
        &self,
        root: u32,
        mut data: Vec<T>,
    ) -> CollectiveHandle<Vec<T>> {
        self.spawn(CollectiveOp::Broadcast, move |ctx| {
            crate::broadcast::run(ctx, root, bytemuck::cast_slice_mut(&mut data), T::DTYPE)?;
            Ok(data)
        })
    }

    /// Non-blocking [`ProcessGroup::broadcast_typed`]; `join()` returns the buffer.
    pub fn spawn_broadcast_typed(
        &self,
        root: u32,
        mut data: Vec<u8>,
        dtype: DType,
    ) -> CollectiveHandle<Vec<u8>> {
        self.spawn(CollectiveOp::Broadcast, move |ctx| {
            crate::broadcast::run(ctx, root, &mut data, dtype)?;
            Ok(data)
        })
    }

    /// Non-blocking [`ProcessGroup::barrier`].
    ///
    /// See the example of [`ProcessGroup::spawn_all_reduce`].
    pub fn spawn_barrier(&self) -> CollectiveHandle<()> {
        self.spawn(CollectiveOp::Barrier, crate::barrier::dissemination::run)
    }

    /// The reduce dtype for ranks holding `dtypes` (see [`negotiate_reduce_dtype`]).
    ///
    /// [`negotiate_reduce_dtype`]: crate::negotiate_reduce_dtype
    ///
    /// See the example of [`ProcessGroup::agree_reduce_dtype`].
    pub fn negotiate_reduce_dtype(dtypes: &[DType]) -> DType {
        crate::negotiate_reduce_dtype(dtypes)
    }

    /// Collectively agrees on the reduce dtype: gathers every rank's `local` dtype and applies
    /// [`crate::negotiate_reduce_dtype`]. Every rank gets the same answer.
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use rlx_collective::{MemTransport, ProcessGroup, ReduceKind, Transport};
    /// # let world: Vec<ProcessGroup> = MemTransport::fan_out(2).into_iter()
    /// #     .map(|t| ProcessGroup::new(t as Arc<dyn Transport>)).collect();
    /// std::thread::scope(|s| {
    ///     for group in &world {
    ///         s.spawn(move || {
    ///             let local = if group.rank() == 0 { rlx_collective::DType::F64 } else { rlx_collective::DType::F16 };
    ///             assert_eq!(group.agree_reduce_dtype(local).unwrap(), rlx_collective::DType::F64);
    ///         });
    ///     }
    /// });
    /// ```
    pub fn agree_reduce_dtype(&self, local: DType) -> Result<DType> {
        let codes = self.all_gather_typed(&[local.code()], DType::U8)?;
        let dtypes = codes
            .iter()
            .map(|&code| {
                DType::from_code(code).ok_or_else(|| {
                    CollectiveError::protocol(None, format!("unknown dtype code {code}"))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(crate::negotiate_reduce_dtype(&dtypes))
    }
}
