//! The collectives that move data without reducing it: all-gather, gather, scatter and
//! all-to-all, each in the form generic over the [`Element`] types, the `*_typed` form on raw
//! elements of a run-time [`DType`], the `*_into` forms that land in a caller's buffer (a loop
//! that moves the same sizes again and again allocates nothing, as with MPI's buffers) and the
//! non-blocking `spawn_*` forms.

use super::ProcessGroup;
use crate::gather::gathered_len;
use crate::handle::CollectiveHandle;
use crate::select::CollectiveOp;
use crate::{CollectiveError, DType, Element, Result, all_to_all, gather};

impl ProcessGroup {
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
        if self.rank() != root {
            self.gather_into(root, local, &mut [])?;
            return Ok(None);
        }
        let mut out = vec![T::zeroed(); gathered_len(local.len(), self.world_size())?];
        self.gather_into(root, local, &mut out)?;
        Ok(Some(out))
    }

    /// [`ProcessGroup::gather`] into `out`, which on the root holds `world_size ×
    /// local.len()` elements and elsewhere is not touched (pass `&mut []`): a loop that
    /// gathers the same sizes again and again allocates nothing.
    pub fn gather_into<T: Element>(&self, root: u32, local: &[T], out: &mut [T]) -> Result<()> {
        self.gather_typed_into(
            root,
            bytemuck::cast_slice(local),
            bytemuck::cast_slice_mut(out),
            T::DTYPE,
        )
    }

    /// [`ProcessGroup::gather`] on raw little-endian `dtype` elements.
    pub fn gather_typed(&self, root: u32, local: &[u8], dtype: DType) -> Result<Option<Vec<u8>>> {
        if self.rank() != root {
            self.gather_typed_into(root, local, &mut [], dtype)?;
            return Ok(None);
        }
        let mut out = vec![0u8; gathered_len(local.len(), self.world_size())?];
        self.gather_typed_into(root, local, &mut out, dtype)?;
        Ok(Some(out))
    }

    /// [`ProcessGroup::gather_into`] on raw little-endian `dtype` elements.
    pub fn gather_typed_into(
        &self,
        root: u32,
        local: &[u8],
        out: &mut [u8],
        dtype: DType,
    ) -> Result<()> {
        self.run(CollectiveOp::Gather, |ctx| {
            gather::run(ctx, root, local, out, dtype)
        })
    }

    /// Non-blocking [`ProcessGroup::gather`].
    pub fn spawn_gather<T: Element>(
        &self,
        root: u32,
        local: Vec<T>,
    ) -> CollectiveHandle<Option<Vec<T>>> {
        self.spawn(CollectiveOp::Gather, move |ctx| {
            let len = if ctx.rank == root {
                gathered_len(local.len(), ctx.size())?
            } else {
                0
            };
            let mut out = vec![T::zeroed(); len];
            let into = bytemuck::cast_slice_mut(&mut out);
            gather::run(ctx, root, bytemuck::cast_slice(&local), into, T::DTYPE)?;
            Ok((ctx.rank == root).then_some(out))
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
            let len = if ctx.rank == root {
                gathered_len(local.len(), ctx.size())?
            } else {
                0
            };
            let mut out = vec![0u8; len];
            gather::run(ctx, root, &local, &mut out, dtype)?;
            Ok((ctx.rank == root).then_some(out))
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
        let mut out = vec![T::zeroed(); send.len()];
        self.all_to_all_into(send, &mut out)?;
        Ok(out)
    }

    /// [`ProcessGroup::all_to_all`] into `out`, as long as `send`: nothing is allocated.
    pub fn all_to_all_into<T: Element>(&self, send: &[T], out: &mut [T]) -> Result<()> {
        self.all_to_all_typed_into(
            bytemuck::cast_slice(send),
            bytemuck::cast_slice_mut(out),
            T::DTYPE,
        )
    }

    /// [`ProcessGroup::all_to_all`] on raw little-endian `dtype` elements.
    pub fn all_to_all_typed(&self, send: &[u8], dtype: DType) -> Result<Vec<u8>> {
        let mut out = vec![0u8; send.len()];
        self.all_to_all_typed_into(send, &mut out, dtype)?;
        Ok(out)
    }

    /// [`ProcessGroup::all_to_all_into`] on raw little-endian `dtype` elements.
    pub fn all_to_all_typed_into(&self, send: &[u8], out: &mut [u8], dtype: DType) -> Result<()> {
        self.run(CollectiveOp::AllToAll, |ctx| {
            all_to_all::run(ctx, send, out, dtype)
        })
    }

    /// Non-blocking [`ProcessGroup::all_to_all`].
    pub fn spawn_all_to_all<T: Element>(&self, send: Vec<T>) -> CollectiveHandle<Vec<T>> {
        self.spawn(CollectiveOp::AllToAll, move |ctx| {
            let mut out = vec![T::zeroed(); send.len()];
            let into = bytemuck::cast_slice_mut(&mut out);
            all_to_all::run(ctx, bytemuck::cast_slice(&send), into, T::DTYPE)?;
            Ok(out)
        })
    }

    /// Non-blocking [`ProcessGroup::all_to_all_typed`].
    pub fn spawn_all_to_all_typed(&self, send: Vec<u8>, dtype: DType) -> CollectiveHandle<Vec<u8>> {
        self.spawn(CollectiveOp::AllToAll, move |ctx| {
            let mut out = vec![0u8; send.len()];
            all_to_all::run(ctx, &send, &mut out, dtype)?;
            Ok(out)
        })
    }
}
