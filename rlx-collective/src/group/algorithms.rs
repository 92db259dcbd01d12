//! Which algorithm each collective of a group runs: forcing one (`set_algorithm`), whether
//! the group can run one (`supports_algorithm`), and what it would run for a size
//! (`planned_algorithm`), on the choices of [`crate::select`] and the group's cabling.

use super::{ProcessGroup, WORLD_GROUP_ID, cabling};
use crate::select::{Algorithm, CollectiveOp};
use crate::{CollectiveError, Result};

impl ProcessGroup {
    /// Forces `algorithm` for `op` on this group (and its clones) from the next issued
    /// operation on; [`Algorithm::Auto`] restores the size-based choice. Every member must
    /// make the same choice. Fails with `InvalidArgument` if `op` has no such algorithm (see
    /// [`CollectiveOp::algorithms`]), and with `Unsupported` if this group cannot run it (see
    /// [`ProcessGroup::supports_algorithm`]).
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use rlx_collective::{MemTransport, ProcessGroup, ReduceKind, Transport};
    /// # let world: Vec<ProcessGroup> = MemTransport::fan_out(1).into_iter()
    /// #     .map(|t| ProcessGroup::new(t as Arc<dyn Transport>)).collect();
    /// use rlx_collective::{Algorithm, CollectiveOp};
    /// let group = &world[0];
    /// group.set_algorithm(CollectiveOp::AllReduce, Algorithm::Ring)?;
    /// assert_eq!(group.algorithm(CollectiveOp::AllReduce), Algorithm::Ring);
    /// # Ok::<(), rlx_collective::CollectiveError>(())
    /// ```
    pub fn set_algorithm(&self, op: CollectiveOp, algorithm: Algorithm) -> Result<()> {
        let known = op.algorithms().contains(&algorithm);
        if known && algorithm == Algorithm::OneSidedRing && !self.supports_algorithm(op, algorithm)
        {
            if self.shared.transport.symmetric().is_none() {
                return Err(CollectiveError::unsupported(format!(
                    "{op} with {algorithm} needs a transport with a symmetric heap, and this \
                     transport has none (wrap it in rlx_transport::Symmetric)"
                )));
            }
            if self.shared.group_id != WORLD_GROUP_ID {
                return Err(CollectiveError::unsupported(format!(
                    "{op} with {algorithm} runs on the world group only: a sub-group cannot \
                     allocate symmetric heap memory, which is collective over the whole world"
                )));
            }
        }
        if known && !self.supports_algorithm(op, algorithm) {
            if let Some(needs) = cabling::needed_by(algorithm) {
                let matrix = if self.topology().is_some() {
                    "its link matrix (ProcessGroup::topology) shows none"
                } else {
                    "its transport reports no link matrix"
                };
                return Err(CollectiveError::unsupported(format!(
                    "{op} with {algorithm} needs {needs}; this group has none: {matrix}"
                )));
            }
        }
        self.shared.settings.lock().set(op, algorithm)?;
        tracing::info!(group = self.shared.group_id, %op, %algorithm, "algorithm forced");
        Ok(())
    }

    /// Whether `algorithm` can run `op` on this group: it is one of `op`'s algorithms and,
    /// for [`Algorithm::OneSidedRing`], this is the world group of a transport with a
    /// symmetric heap ([`Transport::symmetric`](crate::Transport::symmetric)); for [`Algorithm::TwoLevel`], the group's
    /// link matrix shows islands; for [`Algorithm::BidirectionalChain`], a line of cables.
    ///
    /// See the example of [`ProcessGroup::set_algorithm`].
    pub fn supports_algorithm(&self, op: CollectiveOp, algorithm: Algorithm) -> bool {
        op.algorithms().contains(&algorithm)
            && match algorithm {
                Algorithm::OneSidedRing => {
                    self.shared.group_id == WORLD_GROUP_ID
                        && self.shared.transport.symmetric().is_some()
                }
                other => self.shared.cables.allows(other),
            }
    }

    /// The algorithm forced for `op` ([`Algorithm::Auto`] when none is).
    ///
    /// See the example of [`ProcessGroup::set_algorithm`].
    pub fn algorithm(&self, op: CollectiveOp) -> Algorithm {
        self.shared.settings.lock().get(op)
    }

    /// The algorithm this group would run `op` with for `bytes` per rank (for an all-gather,
    /// gathered in all): the forced one, or what [`Algorithm::Auto`] picks for that size on
    /// this group's cabling; `Auto` itself for the operations that have a single algorithm.
    /// A backend's native collective, where one runs instead, is not known here.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use rlx_collective::{MemTransport, ProcessGroup, Transport};
    /// # let world: Vec<ProcessGroup> = MemTransport::fan_out(4).into_iter()
    /// #     .map(|t| ProcessGroup::new(t as Arc<dyn Transport>)).collect();
    /// use rlx_collective::{Algorithm, CollectiveOp};
    /// let group = &world[0];
    /// assert_eq!(group.planned_algorithm(CollectiveOp::AllReduce, 8), Algorithm::RecursiveDoubling);
    /// assert_eq!(group.planned_algorithm(CollectiveOp::AllReduce, 64 << 20), Algorithm::Ring);
    /// ```
    pub fn planned_algorithm(&self, op: CollectiveOp, bytes: usize) -> Algorithm {
        let settings = *self.shared.settings.lock();
        let n = self.world_size();
        match op {
            CollectiveOp::AllReduce => settings.all_reduce(bytes, n),
            CollectiveOp::AllGather => settings.all_gather(bytes),
            CollectiveOp::ReduceScatter => settings.reduce_scatter(bytes),
            CollectiveOp::Broadcast => settings.broadcast(bytes, n),
            CollectiveOp::AllToAll => settings.all_to_all(bytes),
            _ => Algorithm::Auto,
        }
    }

    /// Caps the pipeline segment size of the segmented algorithms at `bytes` (at least one
    /// element), so that small inputs take multi-segment paths in tests and benchmarks;
    /// `None` restores the measured sizes. Every member must set the same value.
    #[doc(hidden)]
    pub fn set_max_segment_bytes(&self, bytes: Option<usize>) {
        self.shared.settings.lock().max_segment_bytes = bytes;
    }

    /// The current segment cap (see [`ProcessGroup::set_max_segment_bytes`]).
    #[doc(hidden)]
    pub fn max_segment_bytes(&self) -> Option<usize> {
        self.shared.settings.lock().max_segment_bytes
    }
}
