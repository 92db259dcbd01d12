//! Point-to-point messages between two members of a group, under user tags: they run outside
//! the group's sequence, but watch for the group's failure like every collective does.

use std::time::Duration;

use super::ProcessGroup;
use crate::flight::{Call, PointToPoint};
use crate::health::{FailureScope, NOTICE_SLICE, Watch, slice_for, unreceived_beside};
use crate::wait_chain::Doing;
use crate::{CollectiveError, DType, Element, Result, Tag, Transport};

impl ProcessGroup {
    /// The failure watch of this group's point-to-point calls.
    pub(super) fn watch(&self) -> Watch<'_> {
        let shared = &self.shared;
        Watch::new(
            shared.transport.as_ref(),
            &shared.members,
            shared.rank,
            shared.group_id,
            &shared.health,
            FailureScope::Group,
        )
    }

    /// Sends `data` to group rank `to` under the user tag `tag` (below
    /// [`TAG_RESERVED_BASE`](crate::TAG_RESERVED_BASE)). User tags are per pair of world
    /// ranks, shared by every group of the family.
    ///
    /// See the example of [`ProcessGroup::send`].
    pub fn send_f32(&self, to: u32, tag: u32, data: &[f32]) -> Result<()> {
        self.send(to, tag, data)
    }

    /// Receives the next `f32` message from group rank `from` under the user tag `tag`,
    /// waiting at most the transport's operation timeout.
    ///
    /// See the example of [`ProcessGroup::send`].
    pub fn recv_f32(&self, from: u32, tag: u32) -> Result<Vec<f32>> {
        self.recv(from, tag)
    }

    /// Sends the elements of `data` to group rank `to` under the user tag `tag` (below
    /// [`TAG_RESERVED_BASE`](crate::TAG_RESERVED_BASE)); they travel as `T::DTYPE`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use rlx_collective::{MemTransport, ProcessGroup, Transport};
    ///
    /// let world: Vec<ProcessGroup> = MemTransport::fan_out(2)
    ///     .into_iter()
    ///     .map(|t| ProcessGroup::new(t as Arc<dyn Transport>))
    ///     .collect();
    /// // A pipeline stage hands its hidden states to the next one.
    /// world[0].send(1, 7, &[half::bf16::from_f32(0.5); 4])?;
    /// let hidden: Vec<half::bf16> = world[1].recv(0, 7)?;
    /// assert_eq!(hidden, [half::bf16::from_f32(0.5); 4]);
    /// # Ok::<(), rlx_collective::CollectiveError>(())
    /// ```
    pub fn send<T: Element>(&self, to: u32, tag: u32, data: &[T]) -> Result<()> {
        self.send_typed(to, tag, bytemuck::cast_slice(data), T::DTYPE)
    }

    /// Receives the next message from group rank `from` under the user tag `tag` as `T`s,
    /// waiting at most the transport's operation timeout; a length that is not a whole number
    /// of `T`s is a protocol error.
    ///
    /// See the example of [`ProcessGroup::send`].
    pub fn recv<T: Element>(&self, from: u32, tag: u32) -> Result<Vec<T>> {
        let bytes = self.recv_typed(from, tag, T::DTYPE)?;
        Ok(bytemuck::pod_collect_to_vec(&bytes))
    }

    /// Receives the next message from group rank `from` under the user tag `tag` into `buf`
    /// (no allocation where the transport lands messages in place) and returns how many
    /// elements arrived. A message longer than `buf` is [`CollectiveError::LengthMismatch`];
    /// one that is not a whole number of `T`s is a protocol error.
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
    ///             if group.rank() == 0 {
    ///                 group.send(1, 5, &[1i32, 2, 3]).unwrap();
    ///             } else {
    ///                 let mut buf = [0i32; 8];
    ///                 let n = group.recv_into(0, 5, &mut buf).unwrap();
    ///                 assert_eq!(&buf[..n], [1, 2, 3]);
    ///             }
    ///         });
    ///     }
    /// });
    /// ```
    pub fn recv_into<T: Element>(&self, from: u32, tag: u32, buf: &mut [T]) -> Result<usize> {
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(buf);
        let slice = slice_for(bytes.len());
        let record = (PointToPoint::Recv, T::DTYPE, None);
        let (peer, len) =
            self.receive((from, tag), slice, record, |transport, peer, tag, end| {
                transport.recv_message_into(peer, tag, bytes, end)
            })?;
        whole_elements(peer, len, T::DTYPE)
    }

    /// Sends the `dtype` elements in `data` to group rank `to` under the user tag `tag`.
    ///
    /// See the example of [`ProcessGroup::send`].
    pub fn send_typed(&self, to: u32, tag: u32, data: &[u8], dtype: DType) -> Result<()> {
        crate::check_dtype_len(data.len(), dtype)?;
        let user_tag = tag;
        let tag = Tag::user(tag)?;
        let peer = self.world_peer(to)?;
        let elements = (data.len() / dtype.size()) as u64;
        let call = Call {
            kind: PointToPoint::Send,
            peer,
            tag: user_tag,
            dtype,
            elements: Some(elements),
        };
        self.recorded(call, || {
            let watch = self.watch().doing(Doing::Send { to, tag: user_tag });
            watch.check()?;
            watch
                .answering_while_blocked(peer, || {
                    self.shared.transport.send_message(peer, tag, &[data])
                })
                .map_err(|error| watch.blame(error))
                .inspect_err(|error| watch.on_failure(error))
        })
    }

    /// Runs `run`, the point-to-point call `call`, as an entry of the flight recorder.
    fn recorded<R>(&self, call: Call, run: impl FnOnce() -> Result<R>) -> Result<R> {
        let flight = &self.shared.flight;
        let started = flight.point_to_point_started(call);
        let result = run();
        flight.point_to_point_ended(started, result.as_ref().err());
        result
    }

    /// Receives the next message from group rank `from` under the user tag `tag` as `dtype`
    /// elements; a length that is not a whole number of elements is a protocol error.
    ///
    /// See the example of [`ProcessGroup::send`].
    pub fn recv_typed(&self, from: u32, tag: u32, dtype: DType) -> Result<Vec<u8>> {
        let record = (PointToPoint::Recv, dtype, None);
        let (peer, bytes) = self.receive(
            (from, tag),
            NOTICE_SLICE,
            record,
            |transport, peer, tag, end| transport.recv_message(peer, tag, end),
        )?;
        whole_elements(peer, bytes.len(), dtype)?;
        Ok(bytes)
    }

    /// [`ProcessGroup::recv_into`] on raw little-endian `dtype` elements: lands the next
    /// message from group rank `from` under `tag` in `buf` and returns how many elements
    /// arrived.
    pub fn recv_typed_into(
        &self,
        from: u32,
        tag: u32,
        buf: &mut [u8],
        dtype: DType,
    ) -> Result<usize> {
        let slice = slice_for(buf.len());
        let record = (PointToPoint::Recv, dtype, None);
        let (peer, len) =
            self.receive((from, tag), slice, record, |transport, peer, tag, end| {
                transport.recv_message_into(peer, tag, buf, end)
            })?;
        whole_elements(peer, len, dtype)
    }

    /// Sends `data` to group rank `to` and receives the next message from group rank `from`
    /// into `buf`, both under the user tag `tag`, as one exchange (MPI's `MPI_Sendrecv`):
    /// returns how many elements arrived. The incoming message lands in `buf` while the
    /// outgoing one is written, so a ring of ranks handing each other large buffers (a
    /// pipeline's activations forward and gradients back) moves both directions at full speed
    /// without an intermediate copy, and two ranks sending each other more than the socket
    /// buffers hold cannot block each other. A message longer than `buf` is
    /// [`CollectiveError::LengthMismatch`].
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use rlx_collective::{MemTransport, ProcessGroup, Transport};
    /// # let world: Vec<ProcessGroup> = MemTransport::fan_out(3).into_iter()
    /// #     .map(|t| ProcessGroup::new(t as Arc<dyn Transport>)).collect();
    /// std::thread::scope(|s| {
    ///     for group in &world {
    ///         s.spawn(move || {
    ///             let (rank, n) = (group.rank(), group.world_size());
    ///             let mine = [rank as f32; 4];
    ///             let mut theirs = [0.0f32; 4];
    ///             let got = group
    ///                 .send_recv((rank + 1) % n, &mine, (rank + n - 1) % n, &mut theirs, 3)
    ///                 .unwrap();
    ///             assert_eq!(got, 4);
    ///             assert_eq!(theirs, [((rank + n - 1) % n) as f32; 4]);
    ///         });
    ///     }
    /// });
    /// ```
    pub fn send_recv<T: Element>(
        &self,
        to: u32,
        data: &[T],
        from: u32,
        buf: &mut [T],
        tag: u32,
    ) -> Result<usize> {
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(buf);
        self.send_recv_typed(to, bytemuck::cast_slice(data), from, bytes, tag, T::DTYPE)
    }

    /// [`ProcessGroup::send_recv`] on raw little-endian `dtype` elements.
    pub fn send_recv_typed(
        &self,
        to: u32,
        data: &[u8],
        from: u32,
        buf: &mut [u8],
        tag: u32,
        dtype: DType,
    ) -> Result<usize> {
        crate::check_dtype_len(data.len(), dtype)?;
        let to_rank = to;
        let to = self.world_peer(to)?;
        let mut sent = false;
        let slice = slice_for(buf.len());
        let watch = self.watch().doing(Doing::Send { to: to_rank, tag });
        let record = (
            PointToPoint::SendRecv,
            dtype,
            Some((data.len() / dtype.size()) as u64),
        );
        let (peer, len) = self.receive(
            (from, tag),
            slice,
            record,
            |transport, peer, tag, deadline| {
                if std::mem::replace(&mut sent, true) {
                    transport.recv_message_into(peer, tag, buf, deadline)
                } else {
                    watch.answering_while_blocked(to, || {
                        transport.send_recv_into(to, peer, tag, &[data], buf, deadline)
                    })
                }
            },
        )?;
        whole_elements(peer, len, dtype)
    }

    /// Waits for the next message from group rank `from` under the user tag `tag` through
    /// `receive` (one of the transport's receives, called with the world rank, the tag and a
    /// `slice` of the operation timeout at a time, so that a failure of the group ends the
    /// wait); returns the world rank and what `receive` returned. A receive into a buffer
    /// takes a slice long enough for its whole message (see [`slice_for`]): a slice that ends
    /// while a large message lands in the buffer moves it into a copy of the transport's.
    fn receive<R>(
        &self,
        (from, tag): (u32, u32),
        slice: Duration,
        record: Recorded,
        mut receive: impl FnMut(&dyn Transport, u32, Tag, Duration) -> Result<Option<R>>,
    ) -> Result<(u32, R)> {
        let user_tag = tag;
        let tag = Tag::user(tag)?;
        let peer = self.world_peer(from)?;
        let after = self.shared.transport.op_timeout();
        let transport = self.shared.transport.as_ref();
        let (kind, dtype, elements) = record;
        let call = Call {
            kind,
            peer,
            tag: user_tag,
            dtype,
            elements,
        };
        self.recorded(call, || {
            let watch = self.watch().doing(Doing::Recv {
                from,
                tag: user_tag,
                dtype,
            });
            watch
                .wait(after, slice, peer, |deadline| {
                    receive(transport, peer, tag, deadline)
                })
                .and_then(|got| {
                    got.ok_or(CollectiveError::Timeout {
                        peer: Some(peer),
                        op: "recv",
                        after,
                    })
                })
                .map(|got| (peer, got))
                .map_err(|error| {
                    let error = in_elements(watch.blame(error), dtype);
                    unreceived(transport, error, user_tag, dtype)
                })
                .inspect_err(|error| watch.on_failure(error))
        })
    }
}

/// `error`, or, when it is a timeout waiting for a peer from which messages under other user
/// tags wait unreceived, [`CollectiveError::Unreceived`] naming them: the usual cause of a
/// point-to-point hang is a tag that differs between sender and receiver.
fn unreceived(
    transport: &dyn Transport,
    error: CollectiveError,
    tag: u32,
    dtype: DType,
) -> CollectiveError {
    let CollectiveError::Timeout {
        peer: Some(peer),
        op,
        after,
    } = error
    else {
        return error;
    };
    let others = unreceived_beside(transport, peer, tag);
    if others.is_empty() {
        return CollectiveError::Timeout {
            peer: Some(peer),
            op,
            after,
        };
    }
    tracing::warn!(
        peer,
        tag,
        ?others,
        "a receive timed out beside messages under other tags"
    );
    CollectiveError::Unreceived {
        op,
        peer,
        tag,
        after,
        unreceived: others,
        dtype: Some(dtype),
    }
}

/// `error`, a length mismatch said in elements of `dtype` (the transport knows only bytes).
fn in_elements(error: CollectiveError, dtype: DType) -> CollectiveError {
    match error {
        CollectiveError::LengthMismatch {
            op,
            peer,
            expected,
            got,
            dtype: None,
            lengths,
        } => CollectiveError::LengthMismatch {
            op,
            peer,
            expected,
            got,
            dtype: Some(dtype),
            lengths,
        },
        other => other,
    }
}

/// How a receive appears in the flight recorder: the call, the element type and, when known
/// before the message arrives, the element count (what an exchange sends).
type Recorded = (PointToPoint, DType, Option<u64>);

/// The number of `dtype` elements in a message of `len` bytes from world rank `peer`, or the
/// protocol error when it is not a whole number.
fn whole_elements(peer: u32, len: usize, dtype: DType) -> Result<usize> {
    if len % dtype.size() != 0 {
        return Err(CollectiveError::protocol(
            Some(peer),
            format!("message of {len} bytes is not a whole number of {dtype} elements"),
        ));
    }
    Ok(len / dtype.size())
}
