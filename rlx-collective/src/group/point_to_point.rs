//! Point-to-point messages between two members of a group, under user tags: they run outside
//! the group's sequence, but watch for the group's failure like every collective does.

use super::{ProcessGroup, f32_bytes, f32s_from_le};
use crate::health::{FailureScope, NOTICE_SLICE, Watch};
use crate::{CollectiveError, DType, Result, Tag};

impl ProcessGroup {
    /// The failure watch of this group's point-to-point calls.
    fn watch(&self) -> Watch<'_> {
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
    pub fn send_f32(&self, to: u32, tag: u32, data: &[f32]) -> Result<()> {
        self.send_typed(to, tag, f32_bytes(data), DType::F32)
    }

    /// Receives the next `f32` message from group rank `from` under the user tag `tag`,
    /// waiting at most the transport's operation timeout.
    pub fn recv_f32(&self, from: u32, tag: u32) -> Result<Vec<f32>> {
        Ok(f32s_from_le(&self.recv_typed(from, tag, DType::F32)?))
    }

    /// Sends the `dtype` elements in `data` to group rank `to` under the user tag `tag`.
    pub fn send_typed(&self, to: u32, tag: u32, data: &[u8], dtype: DType) -> Result<()> {
        crate::check_dtype_len(data.len(), dtype)?;
        let tag = Tag::user(tag)?;
        let peer = self.world_peer(to)?;
        let watch = self.watch();
        watch.check()?;
        self.shared
            .transport
            .send_message(peer, tag, &[data])
            .inspect_err(|error| watch.on_failure(error))
    }

    /// Receives the next message from group rank `from` under the user tag `tag` as `dtype`
    /// elements; a length that is not a whole number of elements is a protocol error.
    pub fn recv_typed(&self, from: u32, tag: u32, dtype: DType) -> Result<Vec<u8>> {
        let tag = Tag::user(tag)?;
        let peer = self.world_peer(from)?;
        let after = self.shared.transport.op_timeout();
        let watch = self.watch();
        let bytes = watch
            .wait(after, NOTICE_SLICE, |deadline| {
                self.shared.transport.recv_message(peer, tag, deadline)
            })
            .and_then(|got| {
                got.ok_or(CollectiveError::Timeout {
                    peer: Some(peer),
                    op: "recv",
                    after,
                })
            })
            .inspect_err(|error| watch.on_failure(error))?;
        if bytes.len() % dtype.size() != 0 {
            return Err(CollectiveError::protocol(
                Some(peer),
                format!(
                    "message of {} bytes is not a whole number of {dtype} elements",
                    bytes.len()
                ),
            ));
        }
        Ok(bytes)
    }
}
