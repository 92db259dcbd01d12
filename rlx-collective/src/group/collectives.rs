//! The collectives of a group: for each, the form generic over the [`Element`] types (which
//! keeps the original `f32` calls as they were), the `*_typed` form on raw little-endian
//! elements of a [`DType`] known only at run time, and the non-blocking `spawn_*` forms, each a
//! thin wrapper over one implementation that issues the operation and hands its context to the
//! algorithm module.

use std::sync::Arc;

use super::{ProcessGroup, gathered_len};
use crate::handle::{AllReduceHandle, CollectiveHandle};
use crate::select::CollectiveOp;
use crate::{CollectiveError, DType, Element, ReduceKind, Result};

/// The elements of `bytes`, whose length the operation already checked is a whole number of
/// `T`s (a copy: `bytes` need not be aligned for `T`).
fn elements<T: Element>(bytes: &[u8]) -> Vec<T> {
    bytemuck::pod_collect_to_vec(bytes)
}

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
    ///             let group = Arc::new(group.clone());
    ///             let pending = group.spawn_all_reduce(vec![1.0f32; 4], ReduceKind::Sum);
    ///             // ... compute something else while the sum travels ...
    ///             assert_eq!(pending.join().unwrap(), vec![2.0; 4]);
    ///         });
    ///     }
    /// });
    /// ```
    pub fn spawn_all_reduce<T: Element>(
        self: &Arc<Self>,
        data: Vec<T>,
        op: ReduceKind,
    ) -> AllReduceHandle<T> {
        self.as_ref().spawn_all_reduce_of(data, op)
    }

    /// [`ProcessGroup::spawn_all_reduce`] of `f32`s on a plain (non-`Arc`) group handle.
    pub fn spawn_all_reduce_f32(&self, data: Vec<f32>, op: ReduceKind) -> AllReduceHandle {
        self.spawn_all_reduce_of(data, op)
    }

    /// [`ProcessGroup::spawn_all_reduce`] on a plain (non-`Arc`) group handle, for any
    /// [`Element`] type.
    pub fn spawn_all_reduce_of<T: Element>(
        &self,
        mut data: Vec<T>,
        op: ReduceKind,
    ) -> AllReduceHandle<T> {
        self.spawn(CollectiveOp::AllReduce, move |ctx| {
            crate::all_reduce::run(ctx, bytemuck::cast_slice_mut(&mut data), T::DTYPE, op)?;
            Ok(data)
        })
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
        let bytes = self.reduce_scatter_typed(bytemuck::cast_slice(data), T::DTYPE, op)?;
        Ok(elements(&bytes))
    }

    /// [`ProcessGroup::reduce_scatter`] on raw little-endian `dtype` elements.
    pub fn reduce_scatter_typed(
        &self,
        data: &[u8],
        dtype: DType,
        op: ReduceKind,
    ) -> Result<Vec<u8>> {
        self.run(CollectiveOp::ReduceScatter, |ctx| {
            crate::reduce_scatter::run(ctx, data, dtype, op)
        })
    }

    /// Non-blocking [`ProcessGroup::reduce_scatter`].
    pub fn spawn_reduce_scatter<T: Element>(
        &self,
        data: Vec<T>,
        op: ReduceKind,
    ) -> CollectiveHandle<Vec<T>> {
        self.spawn(CollectiveOp::ReduceScatter, move |ctx| {
            crate::reduce_scatter::run(ctx, bytemuck::cast_slice(&data), T::DTYPE, op)
                .map(|bytes| elements(&bytes))
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
            crate::reduce_scatter::run(ctx, &data, dtype, op)
        })
    }

    /// Gathers every rank's `local` on every rank, in rank order. All ranks pass the same
    /// length.
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
    ///             let all = group.all_gather(&[group.rank() as i32; 2]).unwrap();
    ///             assert_eq!(all, [0, 0, 1, 1, 2, 2]);
    ///         });
    ///     }
    /// });
    /// ```
    pub fn all_gather<T: Element>(&self, local: &[T]) -> Result<Vec<T>> {
        let mut out = vec![T::zeroed(); gathered_len(local.len(), self.world_size())?];
        self.all_gather_into(local, &mut out)?;
        Ok(out)
    }

    /// [`ProcessGroup::all_gather`] into `out`, which holds `world_size × local.len()`
    /// elements: a loop that gathers the same sizes again and again allocates nothing. An
    /// `out` of another length is [`CollectiveError::InvalidArgument`] on this rank and fails
    /// the operation on the others.
    pub fn all_gather_into<T: Element>(&self, local: &[T], out: &mut [T]) -> Result<()> {
        self.all_gather_typed_into(
            bytemuck::cast_slice(local),
            bytemuck::cast_slice_mut(out),
            T::DTYPE,
        )
    }

    /// [`ProcessGroup::all_gather`] on raw little-endian `dtype` elements.
    pub fn all_gather_typed(&self, local: &[u8], dtype: DType) -> Result<Vec<u8>> {
        let mut out = vec![0u8; gathered_len(local.len(), self.world_size())?];
        self.all_gather_typed_into(local, &mut out, dtype)?;
        Ok(out)
    }

    /// [`ProcessGroup::all_gather_into`] on raw little-endian `dtype` elements.
    pub fn all_gather_typed_into(&self, local: &[u8], out: &mut [u8], dtype: DType) -> Result<()> {
        self.run(CollectiveOp::AllGather, |ctx| {
            let expected = gathered_len(local.len(), ctx.size())?;
            if out.len() != expected {
                return Err(CollectiveError::invalid(format!(
                    "all_gather output holds {} bytes; {} ranks × {} bytes need {expected}",
                    out.len(),
                    ctx.size(),
                    local.len()
                )));
            }
            crate::all_gather::run(ctx, local, out, dtype)
        })
    }

    /// Non-blocking [`ProcessGroup::all_gather`].
    pub fn spawn_all_gather<T: Element>(&self, local: Vec<T>) -> CollectiveHandle<Vec<T>> {
        self.spawn(CollectiveOp::AllGather, move |ctx| {
            let mut out = vec![T::zeroed(); gathered_len(local.len(), ctx.size())?];
            let bytes = bytemuck::cast_slice_mut(&mut out);
            crate::all_gather::run(ctx, bytemuck::cast_slice(&local), bytes, T::DTYPE)?;
            Ok(out)
        })
    }

    /// Non-blocking [`ProcessGroup::all_gather_typed`].
    pub fn spawn_all_gather_typed(
        &self,
        local: Vec<u8>,
        dtype: DType,
    ) -> CollectiveHandle<Vec<u8>> {
        self.spawn(CollectiveOp::AllGather, move |ctx| {
            let mut out = vec![0u8; gathered_len(local.len(), ctx.size())?];
            crate::all_gather::run(ctx, &local, &mut out, dtype)?;
            Ok(out)
        })
    }

    /// Gathers every rank's `local` on `root` in rank order: `Some` on the root, `None`
    /// elsewhere. All ranks pass the same length.
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
    ///             let gathered = group.gather(1, &[group.rank() as u8]).unwrap();
    ///             assert_eq!(gathered, (group.rank() == 1).then(|| vec![0, 1, 2]));
    ///         });
    ///     }
    /// });
    /// ```
    pub fn gather<T: Element>(&self, root: u32, local: &[T]) -> Result<Option<Vec<T>>> {
        let bytes = self.gather_typed(root, bytemuck::cast_slice(local), T::DTYPE)?;
        Ok(bytes.map(|b| elements(&b)))
    }

    /// [`ProcessGroup::gather`] on raw little-endian `dtype` elements.
    pub fn gather_typed(&self, root: u32, local: &[u8], dtype: DType) -> Result<Option<Vec<u8>>> {
        self.run(CollectiveOp::Gather, |ctx| {
            crate::gather::run(ctx, root, local, dtype)
        })
    }

    /// Non-blocking [`ProcessGroup::gather`].
    pub fn spawn_gather<T: Element>(
        &self,
        root: u32,
        local: Vec<T>,
    ) -> CollectiveHandle<Option<Vec<T>>> {
        self.spawn(CollectiveOp::Gather, move |ctx| {
            crate::gather::run(ctx, root, bytemuck::cast_slice(&local), T::DTYPE)
                .map(|gathered| gathered.map(|bytes| elements(&bytes)))
        })
    }

    /// Non-blocking [`ProcessGroup::gather_typed`].
    pub fn spawn_gather_typed(
        &self,
        root: u32,
        local: Vec<u8>,
        dtype: DType,
    ) -> CollectiveHandle<Option<Vec<u8>>> {
        self.spawn(CollectiveOp::Gather, move |ctx| {
            crate::gather::run(ctx, root, &local, dtype)
        })
    }

    /// Sends block `i` of `root`'s `send` (world_size blocks of `recv.len()` elements) to rank
    /// `i`'s `recv`; `send` is only read on the root (pass `&[]` elsewhere).
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
    ///             let send: &[f64] = if group.rank() == 0 { &[10.0, 11.0, 12.0] } else { &[] };
    ///             let mut mine = [0.0f64];
    ///             group.scatter(0, send, &mut mine).unwrap();
    ///             assert_eq!(mine, [10.0 + group.rank() as f64]);
    ///         });
    ///     }
    /// });
    /// ```
    pub fn scatter<T: Element>(&self, root: u32, send: &[T], recv: &mut [T]) -> Result<()> {
        self.scatter_typed(
            root,
            bytemuck::cast_slice(send),
            bytemuck::cast_slice_mut(recv),
            T::DTYPE,
        )
    }

    /// [`ProcessGroup::scatter`] on raw little-endian `dtype` elements.
    pub fn scatter_typed(
        &self,
        root: u32,
        send: &[u8],
        recv: &mut [u8],
        dtype: DType,
    ) -> Result<()> {
        self.run(CollectiveOp::Scatter, |ctx| {
            crate::scatter::run(ctx, root, send, recv, dtype)
        })
    }

    /// Non-blocking [`ProcessGroup::scatter`]: `send` is read on the root only; `join()`
    /// returns this rank's block of `recv_len` elements.
    pub fn spawn_scatter<T: Element>(
        &self,
        root: u32,
        send: Vec<T>,
        recv_len: usize,
    ) -> CollectiveHandle<Vec<T>> {
        self.spawn(CollectiveOp::Scatter, move |ctx| {
            let mut recv = vec![T::zeroed(); recv_len];
            let into = bytemuck::cast_slice_mut(&mut recv);
            crate::scatter::run(ctx, root, bytemuck::cast_slice(&send), into, T::DTYPE)?;
            Ok(recv)
        })
    }

    /// Non-blocking [`ProcessGroup::scatter_typed`]: `send` is read on the root only;
    /// `join()` returns this rank's block of `recv_len` bytes.
    pub fn spawn_scatter_typed(
        &self,
        root: u32,
        send: Vec<u8>,
        recv_len: usize,
        dtype: DType,
    ) -> CollectiveHandle<Vec<u8>> {
        self.spawn(CollectiveOp::Scatter, move |ctx| {
            let mut recv = vec![0u8; recv_len];
            crate::scatter::run(ctx, root, &send, &mut recv, dtype)?;
            Ok(recv)
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

    /// Splits `send` into world_size equal blocks and sends block `j` to rank `j`; returns the
    /// blocks received, block `i` from rank `i`.
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
    ///             let me = group.rank() as i32;
    ///             let got = group.all_to_all(&[me * 10, me * 10 + 1]).unwrap();
    ///             let expected = [[0, 10], [1, 11]][group.rank() as usize];
    ///             assert_eq!(got, expected);
    ///         });
    ///     }
    /// });
    /// ```
    pub fn all_to_all<T: Element>(&self, send: &[T]) -> Result<Vec<T>> {
        let bytes = self.all_to_all_typed(bytemuck::cast_slice(send), T::DTYPE)?;
        Ok(elements(&bytes))
    }

    /// [`ProcessGroup::all_to_all`] on raw little-endian `dtype` elements.
    pub fn all_to_all_typed(&self, send: &[u8], dtype: DType) -> Result<Vec<u8>> {
        self.run(CollectiveOp::AllToAll, |ctx| {
            crate::all_to_all::run(ctx, send, dtype)
        })
    }

    /// Non-blocking [`ProcessGroup::all_to_all`].
    pub fn spawn_all_to_all<T: Element>(&self, send: Vec<T>) -> CollectiveHandle<Vec<T>> {
        self.spawn(CollectiveOp::AllToAll, move |ctx| {
            crate::all_to_all::run(ctx, bytemuck::cast_slice(&send), T::DTYPE)
                .map(|bytes| elements(&bytes))
        })
    }

    /// Non-blocking [`ProcessGroup::all_to_all_typed`].
    pub fn spawn_all_to_all_typed(&self, send: Vec<u8>, dtype: DType) -> CollectiveHandle<Vec<u8>> {
        self.spawn(CollectiveOp::AllToAll, move |ctx| {
            crate::all_to_all::run(ctx, &send, dtype)
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
