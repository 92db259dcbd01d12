//! Which algorithm runs a collective: by message size and world size, unless the group was
//! told otherwise with [`ProcessGroup::set_algorithm`](crate::ProcessGroup::set_algorithm).
//!
//! Crossover numbers (measured with two ranks over loopback TCP on the 2-core reference
//! machine):
//! - Up to [`SMALL_MESSAGE_BYTES`] (32 KiB) a latency-bound exchange wins: recursive doubling
//!   for all-reduce (log2 n steps of one whole-buffer exchange), Bruck for all-gather, a
//!   binomial tree for broadcast. The ring's 2(n-1) steps cost more than its bandwidth saves.
//! - Above that, the bandwidth-optimal segmented ring (reduce-scatter then all-gather) and the
//!   pipelined chain broadcast. Segments of [`SEGMENT_BYTES`] (256 KiB) were best at 32 MiB,
//!   [`LARGE_SEGMENT_BYTES`] (1 MiB) at 256 MiB, so buffers above [`LARGE_MESSAGE_BYTES`]
//!   (64 MiB) use the larger segments; 64 KiB segments were worst everywhere (too many
//!   system calls per byte).
//! - On a group of [`HALVING_DOUBLING_MIN_RANKS`] (8) or more without cables (a switch, one
//!   host), all-reduces above the small sizes up to [`HALVING_DOUBLING_MAX_BYTES`] (1 MiB)
//!   take [`Algorithm::HalvingDoubling`]: the ring's 2(n-1) latencies are what bound them there,
//!   and halving and doubling pay 2·log2 n. Measured on 8 ranks in network namespaces on a
//!   1 Gbit/s switch (two runs, interleaved): 64 KiB in 0.77-0.87 ms against the ring's
//!   1.51-1.53 ms; 256 KiB to 4 MiB within 2 % of the ring, both at the link's bound. The
//!   simulator (`cargo xtask simulate`, 10 Gbit/s switch, 5 µs latency) predicts 64 KiB on 64
//!   ranks in 187 µs against 985 and on 256 ranks in 217 against 3675, and 1 MiB on 256
//!   ranks in 1.78 ms against 5.24. Above 1 MiB the latencies are a small share, and on 8
//!   ranks sharing two cores of one host the ring's pipeline was up to twice as fast at 4-16
//!   MiB, so the ring keeps them.
//! - A broadcast to two ranks is one message whatever the algorithm, so it stays binomial.
//! - [`Algorithm::OneSidedRing`] (all-reduce through the symmetric heap) is never chosen by
//!   `Auto`, because it was slower than the two-sided ring in every measurement.
//!   Medians over `MemTransport` with a heap (`Symmetric`), f32 sum, release build, the
//!   2-core machine under a load average of 10-16 (other jobs), both algorithms interleaved
//!   in each run; the ranges span two runs:
//!
//!   | ranks | bytes  | ring           | one-sided       | one-sided / ring |
//!   |-------|--------|----------------|-----------------|------------------|
//!   | 2     | 64 KiB | 25 µs          | 52-127 µs       | 2.1-5.1× slower  |
//!   | 2     | 1 MiB  | 366-453 µs     | 684-991 µs      | 1.9-2.2× slower  |
//!   | 2     | 16 MiB | 8.7-9.3 ms     | 13.6-18.6 ms    | 1.5-2.1× slower  |
//!   | 4     | 64 KiB | 129-227 µs     | 331-983 µs      | 2.6-4.3× slower  |
//!   | 4     | 1 MiB  | 1.40-1.56 ms   | 2.77-2.83 ms    | 1.8-2.0× slower  |
//!   | 4     | 16 MiB | 30-37 ms       | 59-63 ms        | 1.7-2.0× slower  |
//!
//!   `Symmetric` serves a put on the target's reader and server threads and acknowledges it,
//!   so each hop costs three thread wake-ups and one more copy (into and out of the heap)
//!   where the two-sided ring costs one; on two cores shared by 2(n-1) service threads per
//!   rank that dominates. Re-measure before letting `Auto` pick it on a transport whose heap
//!   is served by hardware or by the receiving thread.

use std::fmt;

use crate::all_reduce::one_sided::region;
use crate::{CollectiveError, Result};
use rlx_transport::MAX_SEGMENT_HINT;

/// Largest buffer (bytes) that takes the latency-optimal algorithms.
pub const SMALL_MESSAGE_BYTES: usize = 32 * 1024;
/// The fewest members of a flat group whose mid-size all-reduces take
/// [`Algorithm::HalvingDoubling`].
pub const HALVING_DOUBLING_MIN_RANKS: u32 = 8;
/// Largest all-reduce buffer (bytes) that takes [`Algorithm::HalvingDoubling`] on a large
/// flat group.
pub const HALVING_DOUBLING_MAX_BYTES: usize = 1024 * 1024;
/// Ring segment size for buffers up to [`LARGE_MESSAGE_BYTES`].
pub const SEGMENT_BYTES: usize = 256 * 1024;
/// Buffers above this size (bytes) use [`LARGE_SEGMENT_BYTES`] segments.
pub const LARGE_MESSAGE_BYTES: usize = 64 * 1024 * 1024;
/// Ring segment size for buffers above [`LARGE_MESSAGE_BYTES`].
pub const LARGE_SEGMENT_BYTES: usize = 1024 * 1024;

/// The scratch region the first one-sided all-reduce ([`Algorithm::OneSidedRing`]) allocates
/// in the symmetric heap unless
/// [`ProcessGroup::enable_one_sided`](crate::ProcessGroup::enable_one_sided) chose one (capped
/// at half the heap): two banks of four slots of 512 KiB of payload, each of which holds a
/// [`SEGMENT_BYTES`] segment of floats widened to their accumulation type.
pub const DEFAULT_ONE_SIDED_REGION_BYTES: u64 = region::DEFAULT_REGION_BYTES;

/// The smallest scratch region the one-sided all-reduce works with.
pub const MIN_ONE_SIDED_REGION_BYTES: u64 = region::MIN_REGION_BYTES;

/// The collective operations, as named in reports, overrides and benchmarks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CollectiveOp {
    /// In-place all-reduce.
    AllReduce,
    /// Reduce to a root.
    Reduce,
    /// Reduce, leaving block `i` on rank `i`.
    ReduceScatter,
    /// Gather every rank's buffer on every rank, in rank order.
    AllGather,
    /// Gather every rank's buffer on a root.
    Gather,
    /// Send block `i` of the root's buffer to rank `i`.
    Scatter,
    /// Copy the root's buffer to every rank.
    Broadcast,
    /// Send block `j` of rank `i`'s buffer to block `i` of rank `j`.
    AllToAll,
    /// Wait until every rank arrived.
    Barrier,
}

impl CollectiveOp {
    /// Every operation, in a fixed order.
    pub const ALL: [CollectiveOp; 9] = [
        CollectiveOp::AllReduce,
        CollectiveOp::Reduce,
        CollectiveOp::ReduceScatter,
        CollectiveOp::AllGather,
        CollectiveOp::Gather,
        CollectiveOp::Scatter,
        CollectiveOp::Broadcast,
        CollectiveOp::AllToAll,
        CollectiveOp::Barrier,
    ];

    /// The snake-case name used in tables and flags (`"all_reduce"`...).
    pub const fn name(self) -> &'static str {
        match self {
            CollectiveOp::AllReduce => "all_reduce",
            CollectiveOp::Reduce => "reduce",
            CollectiveOp::ReduceScatter => "reduce_scatter",
            CollectiveOp::AllGather => "all_gather",
            CollectiveOp::Gather => "gather",
            CollectiveOp::Scatter => "scatter",
            CollectiveOp::Broadcast => "broadcast",
            CollectiveOp::AllToAll => "all_to_all",
            CollectiveOp::Barrier => "barrier",
        }
    }

    /// The algorithms that can be forced for this operation ([`Algorithm::Auto`] first).
    /// Operations with a single algorithm list only `Auto`.
    pub const fn algorithms(self) -> &'static [Algorithm] {
        match self {
            CollectiveOp::AllReduce => &[
                Algorithm::Auto,
                Algorithm::Ring,
                Algorithm::RankOrderRing,
                Algorithm::Direct,
                Algorithm::TwoLevel,
                Algorithm::BidirectionalChain,
                Algorithm::RecursiveDoubling,
                Algorithm::HalvingDoubling,
                Algorithm::OneSidedRing,
            ],
            CollectiveOp::AllGather => &[
                Algorithm::Auto,
                Algorithm::Ring,
                Algorithm::RankOrderRing,
                Algorithm::Direct,
                Algorithm::Bruck,
            ],
            CollectiveOp::Broadcast => &[
                Algorithm::Auto,
                Algorithm::BinomialTree,
                Algorithm::PipelinedChain,
                Algorithm::Direct,
            ],
            CollectiveOp::AllToAll => &[Algorithm::Auto, Algorithm::Pairwise, Algorithm::Direct],
            CollectiveOp::ReduceScatter => &[
                Algorithm::Auto,
                Algorithm::Ring,
                Algorithm::RankOrderRing,
                Algorithm::Direct,
            ],
            _ => &[Algorithm::Auto],
        }
    }
}

impl fmt::Display for CollectiveOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An algorithm a collective can be forced to use (see [`CollectiveOp::algorithms`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Algorithm {
    /// Choose by size and world size (the default).
    #[default]
    Auto,
    /// Segmented ring: reduce-scatter then all-gather (all-reduce), or ring all-gather, in
    /// the group's ring order, which follows the cables when the link matrix shows them (see
    /// [`ProcessGroup::ring_order`](crate::ProcessGroup::ring_order)).
    Ring,
    /// The segmented ring in rank order whatever the cabling: what [`Algorithm::Ring`] was
    /// before rings followed the cables, kept to compare with it.
    RankOrderRing,
    /// Every rank exchanges a block with every peer at once, one exchange per cable: direct
    /// reduce-scatter and all-gather (all-reduce), direct reduce-scatter or all-gather, the
    /// pairwise all-to-all's steps all at once, or a direct scatter from the root followed by
    /// the direct all-gather (broadcast). What `Auto` picks above the small sizes on a full mesh
    /// of cables, where it keeps every cable busy.
    Direct,
    /// Two levels, for islands of cables joined by a slower network (see
    /// [`ProcessGroup::supports_algorithm`](crate::ProcessGroup::supports_algorithm)): a ring
    /// reduce-scatter inside each island, an all-reduce of each rank's block with the ranks of
    /// the same index in the other islands, a ring all-gather inside each island. The slow
    /// network carries 1/k of what a flat ring puts on it, for islands of k ranks. What `Auto`
    /// picks above the small sizes on a group with islands.
    TwoLevel,
    /// Along a line of cables (members each cabled to the one before and the one after),
    /// both ways at once: one half of the buffer reduced towards the line's end and sent back,
    /// the other towards its start and back, so each direction of every cable carries the
    /// buffer once, where a ring around the line (whose closing hop crosses every cable) puts
    /// 2(n-1)/n of it there. What `Auto` picks for all-reduces above the small sizes on a
    /// line of three or more.
    BidirectionalChain,
    /// Recursive doubling with the non-power-of-two fold (all-reduce).
    RecursiveDoubling,
    /// Rabenseifner's all-reduce: a reduce-scatter by recursive halving and an all-gather by
    /// recursive doubling, with the same fold. It moves what the ring moves in 2·log2 n steps
    /// instead of 2(n-1), which pays on large worlds at mid sizes.
    HalvingDoubling,
    /// Bruck's ⌈log2 n⌉-step all-gather.
    Bruck,
    /// Pairwise-exchange all-to-all: n-1 steps, each a permutation of the ranks.
    Pairwise,
    /// Binomial-tree broadcast.
    BinomialTree,
    /// Segmented chain broadcast, from the root along the group's ring order (rank order
    /// unless the cables make another order cheaper).
    PipelinedChain,
    /// The segmented ring all-reduce over the symmetric heap: put-with-signal into the next
    /// rank's slots instead of send/receive. Needs the world group of a transport with a heap
    /// ([`Transport::symmetric`](crate::Transport::symmetric)); takes a scratch region of the
    /// heap at first use (see
    /// [`ProcessGroup::enable_one_sided`](crate::ProcessGroup::enable_one_sided)), so nothing
    /// else may allocate or free heap memory on that transport while one-sided all-reduces
    /// run.
    OneSidedRing,
}

impl Algorithm {
    /// The snake-case name used in tables and flags.
    pub const fn name(self) -> &'static str {
        match self {
            Algorithm::Auto => "auto",
            Algorithm::Ring => "ring",
            Algorithm::RankOrderRing => "rank_order_ring",
            Algorithm::Direct => "direct",
            Algorithm::TwoLevel => "two_level",
            Algorithm::BidirectionalChain => "bidirectional_chain",
            Algorithm::RecursiveDoubling => "recursive_doubling",
            Algorithm::HalvingDoubling => "halving_doubling",
            Algorithm::Bruck => "bruck",
            Algorithm::Pairwise => "pairwise",
            Algorithm::BinomialTree => "binomial_tree",
            Algorithm::PipelinedChain => "pipelined_chain",
            Algorithm::OneSidedRing => "one_sided_ring",
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The per-group choices, snapshotted when an operation is issued so that a spawned operation
/// runs with the settings of its issue point.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Settings {
    pub(crate) all_reduce: Algorithm,
    pub(crate) all_gather: Algorithm,
    pub(crate) broadcast: Algorithm,
    pub(crate) all_to_all: Algorithm,
    pub(crate) reduce_scatter: Algorithm,
    /// The test and benchmark knob: an upper bound on segment bytes.
    pub(crate) max_segment_bytes: Option<usize>,
    /// How the members are cabled, when the plans for it differ from the flat ones.
    pub(crate) cables: CableShape,
}

/// How a group's members are cabled, as far as `Auto` chooses by it (the link matrix's; see
/// `group::cabling`). The shapes exclude each other.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum CableShape {
    /// No cable: a switch, one host, or no matrix. The flat plans, halving and doubling among
    /// them.
    #[default]
    Flat,
    /// A cable joins every pair of three or more members: [`Algorithm::Direct`] above the
    /// small sizes.
    Mesh,
    /// Islands of cables (see [`crate::islands`]): [`Algorithm::TwoLevel`] for all-reduces
    /// above the small sizes.
    Islands,
    /// A line of cables (see [`crate::cable_path`]): [`Algorithm::BidirectionalChain`] for
    /// all-reduces above the small sizes.
    Line,
    /// Cables in no shape above (a ring of cables, cables beside a switch): the rings, in the
    /// order of the cables, never a plan whose partners may be far from each other's cables.
    OtherCables,
}

impl Settings {
    /// Forces `algorithm` for `op`, refusing combinations that do not exist.
    pub(crate) fn set(&mut self, op: CollectiveOp, algorithm: Algorithm) -> Result<()> {
        if !op.algorithms().contains(&algorithm) {
            return Err(CollectiveError::invalid(format!(
                "algorithm {algorithm} does not apply to {op} (choose one of {:?})",
                op.algorithms()
            )));
        }
        match op {
            CollectiveOp::AllReduce => self.all_reduce = algorithm,
            CollectiveOp::AllGather => self.all_gather = algorithm,
            CollectiveOp::Broadcast => self.broadcast = algorithm,
            CollectiveOp::AllToAll => self.all_to_all = algorithm,
            CollectiveOp::ReduceScatter => self.reduce_scatter = algorithm,
            _ => {}
        }
        Ok(())
    }

    /// The forced algorithm for `op` (`Auto` when none is).
    pub(crate) fn get(&self, op: CollectiveOp) -> Algorithm {
        match op {
            CollectiveOp::AllReduce => self.all_reduce,
            CollectiveOp::AllGather => self.all_gather,
            CollectiveOp::Broadcast => self.broadcast,
            CollectiveOp::AllToAll => self.all_to_all,
            CollectiveOp::ReduceScatter => self.reduce_scatter,
            _ => Algorithm::Auto,
        }
    }

    /// Segment size in bytes for a pipelined algorithm moving `bytes` in total, never below
    /// one element of `elem_size`, nor below the transport's `hint` (see
    /// `Transport::segment_hint`) when it gives one.
    pub(crate) fn segment_bytes(
        &self,
        bytes: usize,
        elem_size: usize,
        hint: Option<usize>,
    ) -> usize {
        let measured = if bytes > LARGE_MESSAGE_BYTES {
            LARGE_SEGMENT_BYTES
        } else {
            SEGMENT_BYTES
        };
        let measured = hint.map_or(measured, |h| h.min(MAX_SEGMENT_HINT).max(measured));
        let capped = self
            .max_segment_bytes
            .map_or(measured, |cap| cap.min(measured));
        capped.max(elem_size.max(1))
    }

    /// How [`Algorithm::Auto`] chooses, in words, for the start-up line of `init()`; a choice
    /// forced later with `set_algorithm` is logged there.
    pub(crate) fn plan() -> String {
        let small = SMALL_MESSAGE_BYTES >> 10;
        format!(
            "all_reduce: recursive doubling up to {small} KiB per rank, ring above (halving \
             and doubling up to 1 MiB on 8 ranks or more, direct on a full mesh of cables, two \
             levels on islands of cables, both ways along a line of cables); all_gather: Bruck up to {small} KiB gathered, ring \
             above (direct on a mesh); rings in the order of the cables; broadcast: binomial \
             tree up to {small} KiB or on 2 ranks, pipelined chain above"
        )
    }

    /// The all-reduce algorithm for `bytes` per rank on `world` ranks.
    pub(crate) fn all_reduce(&self, bytes: usize, world: u32) -> Algorithm {
        let chosen = match self.all_reduce {
            Algorithm::Auto if bytes <= SMALL_MESSAGE_BYTES || world < 2 => {
                Algorithm::RecursiveDoubling
            }
            Algorithm::Auto => match self.cables {
                CableShape::Mesh => Algorithm::Direct,
                CableShape::Islands => Algorithm::TwoLevel,
                CableShape::Line => Algorithm::BidirectionalChain,
                CableShape::Flat
                    if world >= HALVING_DOUBLING_MIN_RANKS
                        && bytes <= HALVING_DOUBLING_MAX_BYTES =>
                {
                    Algorithm::HalvingDoubling
                }
                CableShape::Flat | CableShape::OtherCables => Algorithm::Ring,
            },
            forced => forced,
        };
        tracing::debug!(
            bytes,
            world,
            algorithm = chosen.name(),
            "chose the algorithm"
        );
        chosen
    }

    /// The all-gather algorithm for a gathered result of `total_bytes`.
    pub(crate) fn all_gather(&self, total_bytes: usize) -> Algorithm {
        let chosen = match self.all_gather {
            Algorithm::Auto if total_bytes <= SMALL_MESSAGE_BYTES => Algorithm::Bruck,
            Algorithm::Auto if self.cables == CableShape::Mesh => Algorithm::Direct,
            Algorithm::Auto => Algorithm::Ring,
            forced => forced,
        };
        tracing::debug!(
            total_bytes,
            algorithm = chosen.name(),
            "chose the algorithm"
        );
        chosen
    }

    /// The reduce-scatter algorithm for `bytes` of input per rank.
    pub(crate) fn reduce_scatter(&self, bytes: usize) -> Algorithm {
        match self.reduce_scatter {
            Algorithm::Auto if self.cables == CableShape::Mesh && bytes > SMALL_MESSAGE_BYTES => {
                Algorithm::Direct
            }
            Algorithm::Auto => Algorithm::Ring,
            forced => forced,
        }
    }

    /// The all-to-all algorithm for `bytes` sent per rank.
    pub(crate) fn all_to_all(&self, bytes: usize) -> Algorithm {
        match self.all_to_all {
            Algorithm::Auto if self.cables == CableShape::Mesh && bytes > SMALL_MESSAGE_BYTES => {
                Algorithm::Direct
            }
            Algorithm::Auto => Algorithm::Pairwise,
            forced => forced,
        }
    }

    /// The broadcast algorithm for `bytes` on `world` ranks.
    pub(crate) fn broadcast(&self, bytes: usize, world: u32) -> Algorithm {
        let chosen = match self.broadcast {
            Algorithm::Auto if bytes <= SMALL_MESSAGE_BYTES || world <= 2 => {
                Algorithm::BinomialTree
            }
            Algorithm::Auto if self.cables == CableShape::Mesh => Algorithm::Direct,
            Algorithm::Auto => Algorithm::PipelinedChain,
            forced => forced,
        };
        tracing::debug!(
            bytes,
            world,
            algorithm = chosen.name(),
            "chose the algorithm"
        );
        chosen
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crossovers() {
        let s = Settings::default();
        assert_eq!(s.all_reduce(8, 4), Algorithm::RecursiveDoubling);
        assert_eq!(s.all_reduce(32 * 1024, 4), Algorithm::RecursiveDoubling);
        assert_eq!(s.all_reduce(32 * 1024 + 1, 4), Algorithm::Ring);
        // Large flat worlds take halving and doubling at mid sizes, the ring above.
        assert_eq!(s.all_reduce(32 * 1024 + 1, 7), Algorithm::Ring);
        assert_eq!(s.all_reduce(32 * 1024 + 1, 8), Algorithm::HalvingDoubling);
        assert_eq!(s.all_reduce(1 << 20, 64), Algorithm::HalvingDoubling);
        assert_eq!(s.all_reduce((1 << 20) + 1, 64), Algorithm::Ring);
        assert_eq!(s.segment_bytes(32 << 20, 4, None), SEGMENT_BYTES);
        assert_eq!(s.segment_bytes(256 << 20, 4, None), LARGE_SEGMENT_BYTES);
        // A transport's hint raises the segment, never lowers it.
        assert_eq!(s.segment_bytes(32 << 20, 4, Some(4 << 20)), 4 << 20);
        assert_eq!(s.segment_bytes(32 << 20, 4, Some(1)), SEGMENT_BYTES);
        assert_eq!(
            s.segment_bytes(32 << 20, 4, Some(64 << 20)),
            MAX_SEGMENT_HINT
        );
        assert_eq!(s.broadcast(1 << 20, 2), Algorithm::BinomialTree);
        assert_eq!(s.broadcast(1 << 20, 3), Algorithm::PipelinedChain);
        assert_eq!(s.all_gather(1 << 20), Algorithm::Ring);
        // On a full mesh of cables, every cable at once above the small sizes.
        let mesh = Settings {
            cables: CableShape::Mesh,
            ..Settings::default()
        };
        assert_eq!(mesh.all_reduce(8, 4), Algorithm::RecursiveDoubling);
        assert_eq!(mesh.all_reduce(1 << 20, 4), Algorithm::Direct);
        assert_eq!(mesh.all_gather(1 << 20), Algorithm::Direct);
        assert_eq!(mesh.all_gather(1024), Algorithm::Bruck);
        assert_eq!(mesh.all_to_all(1 << 20), Algorithm::Direct);
        assert_eq!(mesh.reduce_scatter(1 << 20), Algorithm::Direct);
        assert_eq!(mesh.broadcast(1 << 20, 4), Algorithm::Direct);
        assert_eq!(mesh.broadcast(1 << 20, 2), Algorithm::BinomialTree);
        assert_eq!(s.reduce_scatter(1 << 20), Algorithm::Ring);
        assert_eq!(mesh.all_to_all(1024), Algorithm::Pairwise);
        // On islands, two levels for the all-reduces above the small sizes.
        let islands = Settings {
            cables: CableShape::Islands,
            ..Settings::default()
        };
        assert_eq!(islands.all_reduce(8, 4), Algorithm::RecursiveDoubling);
        assert_eq!(islands.all_reduce(1 << 20, 4), Algorithm::TwoLevel);
        assert_eq!(islands.all_gather(1 << 20), Algorithm::Ring);
        let line = Settings {
            cables: CableShape::Line,
            ..Settings::default()
        };
        assert_eq!(line.all_reduce(1 << 20, 4), Algorithm::BidirectionalChain);
        assert_eq!(line.all_reduce(8, 4), Algorithm::RecursiveDoubling);
        assert_eq!(s.all_to_all(1 << 20), Algorithm::Pairwise);
    }

    #[test]
    fn overrides_are_checked() {
        let mut s = Settings::default();
        assert!(s.set(CollectiveOp::AllReduce, Algorithm::Bruck).is_err());
        s.set(CollectiveOp::AllReduce, Algorithm::Ring).unwrap();
        assert_eq!(s.all_reduce(8, 4), Algorithm::Ring);
        s.set(CollectiveOp::AllReduce, Algorithm::OneSidedRing)
            .unwrap();
        assert_eq!(s.all_reduce(1 << 30, 4), Algorithm::OneSidedRing);
        assert!(
            s.set(CollectiveOp::AllGather, Algorithm::OneSidedRing)
                .is_err()
        );
        s.max_segment_bytes = Some(3);
        assert_eq!(s.segment_bytes(1 << 20, 8, None), 8);
        // The test knob caps the hint too.
        assert_eq!(s.segment_bytes(1 << 20, 8, Some(4 << 20)), 8);
    }
}
