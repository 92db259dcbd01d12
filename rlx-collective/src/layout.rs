//! Chunk arithmetic shared by the algorithms: how a buffer splits into per-rank blocks and how
//! a block splits into pipeline segments. Plain functions, so the schedules can be tested
//! without a transport.
//!
//! Every rank computes the same split from the same element count; a rank with a different
//! count computes different message lengths, which its peers see as a length mismatch.

use std::ops::Range;

use crate::{CollectiveError, Result};

/// The `index`-th of `parts` near-equal pieces of `0..count` (the first pieces are the shorter
/// ones when `count` does not divide evenly).
pub(crate) fn balanced(count: usize, parts: usize, index: usize) -> Range<usize> {
    let parts = parts.max(1) as u128;
    let at = |i: usize| ((i as u128 * count as u128) / parts) as usize;
    at(index)..at(index + 1)
}

/// How the logarithmic all-reduces fold a world of n ranks onto p, the largest power of two
/// not above n: with rem = n - p, the first 2·rem ranks pair up, each even one handing its
/// buffer to its odd neighbour and sitting out; the p ranks left are numbered 0..p (their
/// virtual ranks).
#[derive(Clone, Copy, Debug)]
pub(crate) struct PowerOfTwoFold {
    /// p.
    pub(crate) pof2: u32,
    rem: u32,
}

impl PowerOfTwoFold {
    /// The fold of a world of `n` ranks (at least one).
    pub(crate) fn of(n: u32) -> PowerOfTwoFold {
        let pof2 = 1u32 << (31 - n.max(1).leading_zeros());
        PowerOfTwoFold {
            pof2,
            rem: n.max(1) - pof2,
        }
    }

    /// Whether rank `r` is one of a pair of the fold.
    pub(crate) fn pairs(&self, r: u32) -> bool {
        r < 2 * self.rem
    }

    /// Rank `r`'s virtual rank, or `None` for an even rank of a pair, which sits out.
    pub(crate) fn virtual_rank(&self, r: u32) -> Option<u32> {
        match self.pairs(r) {
            true if r % 2 == 0 => None,
            true => Some(r / 2),
            false => Some(r - self.rem),
        }
    }

    /// The rank whose virtual rank is `v`.
    pub(crate) fn real_rank(&self, v: u32) -> u32 {
        if v < self.rem {
            2 * v + 1
        } else {
            v + self.rem
        }
    }
}

/// `data[send]` to read and `data[recv]` to write at the same time, for an exchange step whose
/// outgoing and incoming pieces share one buffer. Overlapping non-empty ranges are refused
/// (no schedule produces them).
pub(crate) fn send_and_recv(
    data: &mut [u8],
    send: Range<usize>,
    recv: Range<usize>,
) -> Result<(&[u8], &mut [u8])> {
    let out_of_place = || {
        CollectiveError::invalid(format!(
            "exchange pieces {send:?} and {recv:?} overlap or leave a buffer of {} bytes",
            data.len()
        ))
    };
    if send.end > data.len() || recv.end > data.len() {
        return Err(out_of_place());
    }
    if send.is_empty() {
        return Ok((&[], &mut data[recv]));
    }
    if recv.is_empty() {
        return Ok((&data[send], &mut []));
    }
    if send.start >= recv.end {
        let (low, high) = data.split_at_mut(send.start);
        Ok((&high[..send.len()], &mut low[recv]))
    } else if recv.start >= send.end {
        let (low, high) = data.split_at_mut(recv.start);
        Ok((&low[send], &mut high[..recv.len()]))
    } else {
        Err(out_of_place())
    }
}

/// How a buffer is cut into one block per rank, in elements.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Blocks {
    /// `count` elements split into `parts` near-equal blocks (all-reduce, reduce-scatter).
    Balanced {
        /// Total elements.
        count: usize,
        /// Number of blocks (the group size).
        parts: usize,
    },
    /// `parts` blocks of exactly `len` elements each (all-gather, all-to-all).
    Equal {
        /// Elements per block.
        len: usize,
    },
}

impl Blocks {
    /// Element range of block `index`.
    pub(crate) fn block(&self, index: usize) -> Range<usize> {
        match *self {
            Blocks::Balanced { count, parts } => balanced(count, parts, index),
            Blocks::Equal { len } => index * len..(index + 1) * len,
        }
    }

    /// The longest block, in elements.
    pub(crate) fn max_len(&self) -> usize {
        match *self {
            Blocks::Balanced { count, parts } => count.div_ceil(parts.max(1)),
            Blocks::Equal { len } => len,
        }
    }

    /// Element range of segment `segment` of `segments` inside block `index`.
    pub(crate) fn segment(&self, index: usize, segments: usize, segment: usize) -> Range<usize> {
        let block = self.block(index);
        let within = balanced(block.len(), segments, segment);
        block.start + within.start..block.start + within.end
    }
}

/// Number of pipeline segments for blocks of at most `max_block_elems` elements when one
/// segment may hold `segment_elems` elements (always at least 1, so empty buffers still take
/// part in the schedule and length checks).
pub(crate) fn segment_count(max_block_elems: usize, segment_elems: usize) -> usize {
    max_block_elems.div_ceil(segment_elems.max(1)).max(1)
}

/// The blocks rank `rank` of `n` sends and receives at step `step` (of n-1) of a ring
/// reduce-scatter: it forwards its partial of block `rank-step-1` to `rank+1` and receives the
/// partial of block `rank-step-2` from `rank-1`, so the last step's received block is its own.
pub(crate) fn reduce_scatter_step(rank: usize, n: usize, step: usize) -> (usize, usize) {
    ((rank + 2 * n - step - 1) % n, (rank + 2 * n - step - 2) % n)
}

/// The blocks rank `rank` of `n` sends and receives at step `step` (of n-1) of a ring
/// all-gather that starts from the block each rank owns: it forwards block `rank-step` to
/// `rank+1` and receives block `rank-step-1` from `rank-1`.
pub(crate) fn all_gather_step(rank: usize, n: usize, step: usize) -> (usize, usize) {
    ((rank + n - step) % n, (rank + 2 * n - step - 1) % n)
}

/// Byte range of an element range.
pub(crate) fn bytes(range: Range<usize>, elem_size: usize) -> Range<usize> {
    range.start * elem_size..range.end * elem_size
}

/// The `parts` blocks of `data` (cut by `blocks`, elements of `elem_size` bytes) as separate
/// slices, so that threads can fill them at once; `data` must hold them all.
pub(crate) fn blocks_mut(
    data: &mut [u8],
    blocks: Blocks,
    parts: usize,
    elem_size: usize,
) -> Vec<&mut [u8]> {
    let mut out = Vec::with_capacity(parts);
    let mut rest = data;
    let mut at = 0;
    for index in 0..parts {
        let range = bytes(blocks.block(index), elem_size);
        let (head, tail) = std::mem::take(&mut rest).split_at_mut(range.end - at);
        out.push(&mut head[range.start - at..]);
        at = range.end;
        rest = tail;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fold_pairs_the_first_ranks_and_numbers_the_rest() {
        let fold = PowerOfTwoFold::of(6);
        assert_eq!(fold.pof2, 4);
        let virtual_ranks: Vec<Option<u32>> = (0..6).map(|r| fold.virtual_rank(r)).collect();
        assert_eq!(
            virtual_ranks,
            [None, Some(0), None, Some(1), Some(2), Some(3)]
        );
        for r in [1, 3, 4, 5] {
            assert_eq!(fold.real_rank(fold.virtual_rank(r).unwrap()), r);
        }
        let whole = PowerOfTwoFold::of(8);
        assert!((0..8).all(|r| !whole.pairs(r) && whole.virtual_rank(r) == Some(r)));
    }

    #[test]
    fn balanced_blocks_cover_everything_once() {
        for count in [0usize, 1, 2, 7, 13, 1000] {
            for parts in 1..=9usize {
                let mut next = 0;
                for i in 0..parts {
                    let r = balanced(count, parts, i);
                    assert_eq!(r.start, next);
                    assert!(r.len() <= count.div_ceil(parts));
                    next = r.end;
                }
                assert_eq!(next, count);
            }
        }
    }

    #[test]
    fn segments_tile_a_block() {
        let blocks = Blocks::Balanced {
            count: 1001,
            parts: 4,
        };
        let s = segment_count(blocks.max_len(), 60);
        assert_eq!(s, 5);
        for b in 0..4 {
            let mut next = blocks.block(b).start;
            for j in 0..s {
                let r = blocks.segment(b, s, j);
                assert_eq!(r.start, next);
                assert!(r.len() <= 60);
                next = r.end;
            }
            assert_eq!(next, blocks.block(b).end);
        }
        assert_eq!(segment_count(0, 10), 1);
    }

    #[test]
    fn ring_steps_end_on_the_owned_block_and_chain_neighbours() {
        for n in 2..=8usize {
            for rank in 0..n {
                let prev = (rank + n - 1) % n;
                for step in 0..n - 1 {
                    // What this rank receives is what its predecessor sends at the same step.
                    assert_eq!(
                        reduce_scatter_step(rank, n, step).1,
                        reduce_scatter_step(prev, n, step).0
                    );
                    assert_eq!(
                        all_gather_step(rank, n, step).1,
                        all_gather_step(prev, n, step).0
                    );
                }
                assert_eq!(reduce_scatter_step(rank, n, n - 2).1, rank);
                assert_eq!(all_gather_step(rank, n, 0).0, rank);
            }
        }
    }
}
