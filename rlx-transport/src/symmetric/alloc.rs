//! The region allocator of the symmetric heap: a deterministic first-fit allocator, so that
//! every rank that makes the same sequence of `alloc`/`free` calls gets the same offsets.
//!
//! It only does bookkeeping; the collective agreement (every rank got the same answer) is done
//! by [`Symmetric`](super::Symmetric).

use crate::symmetric::Region;

/// Alignment of every region, in bytes: a cache line, so that regions of different users never
/// share one and every region can hold 64-bit signal words at its start.
pub const REGION_ALIGN: u64 = 64;

/// Free-list bookkeeping of one heap.
#[derive(Debug)]
pub(crate) struct Allocator {
    size: u64,
    /// Free blocks as `(offset, len)`, sorted by offset, never adjacent (they are merged).
    free: Vec<(u64, u64)>,
    /// Live regions, sorted by offset.
    live: Vec<Region>,
}

/// Why an allocation or free was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AllocRefusal {
    /// A zero-length request.
    Empty,
    /// No free block is large enough.
    NoSpace {
        /// The largest free block.
        largest: u64,
    },
    /// The region was not allocated (or was freed already).
    NotAllocated,
}

impl Allocator {
    /// An allocator for a heap of `size` bytes, all free. The usable size is rounded down to
    /// the region alignment.
    pub(crate) fn new(size: u64) -> Self {
        let usable = size - size % REGION_ALIGN;
        let free = if usable > 0 {
            vec![(0, usable)]
        } else {
            vec![]
        };
        Self {
            size,
            free,
            live: Vec::new(),
        }
    }

    /// Size of the heap this allocator manages.
    pub(crate) fn heap_size(&self) -> u64 {
        self.size
    }

    /// Reserves `len` bytes (rounded up to [`REGION_ALIGN`]) at the lowest offset that fits.
    pub(crate) fn alloc(&mut self, len: u64) -> Result<Region, AllocRefusal> {
        if len == 0 {
            return Err(AllocRefusal::Empty);
        }
        let largest = self.free.iter().map(|&(_, l)| l).max().unwrap_or(0);
        let rounded = len
            .checked_next_multiple_of(REGION_ALIGN)
            .ok_or(AllocRefusal::NoSpace { largest })?;
        let index = self
            .free
            .iter()
            .position(|&(_, l)| l >= rounded)
            .ok_or(AllocRefusal::NoSpace { largest })?;
        let (offset, block) = self.free[index];
        if block == rounded {
            self.free.remove(index);
        } else {
            self.free[index] = (offset + rounded, block - rounded);
        }
        let region = Region { offset, len };
        let at = self.live.partition_point(|r| r.offset < offset);
        self.live.insert(at, region);
        Ok(region)
    }

    /// Whether `region` is currently allocated (exactly as `alloc` returned it).
    pub(crate) fn contains(&self, region: Region) -> bool {
        self.live
            .binary_search_by_key(&region.offset, |r| r.offset)
            .is_ok_and(|at| self.live[at] == region)
    }

    /// Returns `region` to the free list, merging it with its free neighbours.
    pub(crate) fn free(&mut self, region: Region) -> Result<(), AllocRefusal> {
        let at = self
            .live
            .binary_search_by_key(&region.offset, |r| r.offset)
            .map_err(|_| AllocRefusal::NotAllocated)?;
        if self.live[at] != region {
            return Err(AllocRefusal::NotAllocated);
        }
        self.live.remove(at);
        let offset = region.offset;
        // Regions are carved in multiples of the alignment, so this cannot overflow the block.
        let len = region.len.next_multiple_of(REGION_ALIGN);
        let at = self.free.partition_point(|&(o, _)| o < offset);
        self.free.insert(at, (offset, len));
        if at + 1 < self.free.len() && self.free[at].0 + self.free[at].1 == self.free[at + 1].0 {
            self.free[at].1 += self.free[at + 1].1;
            self.free.remove(at + 1);
        }
        if at > 0 && self.free[at - 1].0 + self.free[at - 1].1 == self.free[at].0 {
            self.free[at - 1].1 += self.free[at].1;
            self.free.remove(at);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_fit_reuses_and_merges() {
        let mut a = Allocator::new(1000);
        assert_eq!(a.heap_size(), 1000);
        let r1 = a.alloc(10).unwrap();
        let r2 = a.alloc(64).unwrap();
        let r3 = a.alloc(65).unwrap();
        assert_eq!((r1.offset, r2.offset, r3.offset), (0, 64, 128));
        assert_eq!(r3.len, 65);
        a.free(r2).unwrap();
        assert_eq!(a.free(r2), Err(AllocRefusal::NotAllocated));
        assert_eq!(a.alloc(1).unwrap().offset, 64);
        a.free(r1).unwrap();
        a.free(r3).unwrap();
        // 1000 rounds down to 960 usable bytes; 64 are still taken at offset 64, which splits the
        // free space into 0..64 and 128..960.
        assert_eq!(a.alloc(897), Err(AllocRefusal::NoSpace { largest: 832 }));
        assert_eq!(a.alloc(832).unwrap().offset, 128);
        assert_eq!(a.alloc(0), Err(AllocRefusal::Empty));
        assert!(matches!(
            a.alloc(u64::MAX),
            Err(AllocRefusal::NoSpace { .. })
        ));
    }

    #[test]
    fn freeing_everything_restores_one_block() {
        let mut a = Allocator::new(64 * 8);
        let regions: Vec<_> = (0..8).map(|_| a.alloc(64).unwrap()).collect();
        assert!(a.alloc(1).is_err());
        for r in regions
            .iter()
            .step_by(2)
            .chain(regions.iter().skip(1).step_by(2))
        {
            a.free(*r).unwrap();
        }
        assert_eq!(a.alloc(64 * 8).unwrap().offset, 0);
        assert_eq!(
            a.free(Region { offset: 0, len: 64 }),
            Err(AllocRefusal::NotAllocated)
        );
    }
}
