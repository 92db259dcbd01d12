//! [`SymmetricHeap`]: the memory of one rank that the other ranks read and write one-sidedly.
//!
//! # Why the words are atomics
//!
//! A remote put lands while the owner may be reading the same bytes (a rank polling a flag, a
//! kernel reading a buffer that the next step overwrites). With a plain `Vec<u8>` behind an
//! `UnsafeCell` that overlap would be a data race, which Rust defines as undefined behaviour even
//! when the program "does not care" about the value. A lock would make it sound, but would make a
//! 256 MiB get stall every signal update behind it. So the heap is a slice of [`AtomicU64`]
//! words: every access is an atomic load or store, overlapping accesses are merely racy (the
//! reader sees some mix of old and new words), never undefined. Copies touch whole words with
//! relaxed loads and stores, which compile to ordinary moves; partial words at the edges of an
//! unaligned range are merged with a compare-and-swap loop so that neighbouring bytes written by
//! someone else survive.
//!
//! Ordering: data is written with relaxed stores and a signal or atomic with release semantics;
//! [`SymmetricHeap::wait_until`] reads the signal with acquire semantics, so the data of a
//! put-with-signal is visible once the signal is. Every mutation also takes the wake-up mutex
//! before notifying, which both closes the lost-wake-up window and gives the waiter a
//! happens-before edge to everything written before the notification.
//!
//! Bytes are the little-endian image of the words on every platform, so an aligned
//! [`SymmetricHeap::load_u64`] equals `u64::from_le_bytes` of the same eight bytes.

use std::fmt;
use std::time::{Duration, Instant};

use crate::sync::{AtomicU64, Condvar, Mutex, Ordering, lock};
use crate::{CollectiveError, Result};

/// Why an access to a heap was refused; carried on the wire back to the initiator, which turns
/// it into a [`CollectiveError`] naming the target rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum HeapFault {
    /// `offset + len` exceeds the heap (or overflows).
    OutOfBounds {
        /// Offset of the access in bytes.
        offset: u64,
        /// Length of the access in bytes.
        len: u64,
        /// Size of the heap in bytes.
        heap_size: u64,
    },
    /// A 64-bit atomic or signal word at an offset that is not a multiple of 8.
    Misaligned {
        /// The offending offset.
        offset: u64,
    },
}

impl HeapFault {
    /// The error the initiator returns when the heap of `rank` refused its access.
    pub fn into_error(self, rank: u32) -> CollectiveError {
        match self {
            HeapFault::OutOfBounds {
                offset,
                len,
                heap_size,
            } => CollectiveError::OutOfBounds {
                rank,
                offset,
                len,
                heap_size,
            },
            HeapFault::Misaligned { offset } => CollectiveError::invalid(format!(
                "64-bit word at offset {offset} of the heap of rank {rank} is not 8-byte aligned"
            )),
        }
    }
}

/// How [`SymmetricHeap::wait_until`] compares the signal word with the awaited value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Cmp {
    /// `word == value`.
    Eq,
    /// `word != value`.
    Ne,
    /// `word > value`.
    Gt,
    /// `word >= value`.
    Ge,
    /// `word < value`.
    Lt,
    /// `word <= value`.
    Le,
}

impl Cmp {
    /// Whether `word` satisfies the comparison against `value`.
    pub fn holds(self, word: u64, value: u64) -> bool {
        match self {
            Cmp::Eq => word == value,
            Cmp::Ne => word != value,
            Cmp::Gt => word > value,
            Cmp::Ge => word >= value,
            Cmp::Lt => word < value,
            Cmp::Le => word <= value,
        }
    }
}

/// A run of bytes within words: `len` bytes from byte `skip` of word `index` for a partial
/// word, or `len` whole words from word `index` for the aligned middle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Span {
    index: usize,
    skip: usize,
    len: usize,
}

/// Splits the byte range `offset..offset + len` (inside the heap) into a partial head word, a
/// run of whole words and a partial tail word; empty parts have `len == 0`.
fn split_words(offset: u64, len: usize) -> (Span, Span, Span) {
    // The caller checked the range against the heap, whose word count is a `usize`.
    let first = (offset / 8) as usize;
    let skip = (offset % 8) as usize;
    let head_len = if skip == 0 { 0 } else { (8 - skip).min(len) };
    let head = Span {
        index: first,
        skip,
        len: head_len,
    };
    let rest = len - head_len;
    let middle_index = if head_len > 0 { first + 1 } else { first };
    let middle = Span {
        index: middle_index,
        skip: 0,
        len: rest / 8,
    };
    let tail = Span {
        index: middle_index + rest / 8,
        skip: 0,
        len: rest % 8,
    };
    (head, middle, tail)
}

#[derive(Debug, Default)]
struct Wake {
    /// Set by [`SymmetricHeap::abort`]: waiters return `Aborted`.
    aborted: bool,
}

/// The symmetric heap of one rank: `size` bytes, zeroed at creation.
///
/// All methods take `&self` and may run concurrently with each other and with remote
/// operations (see the module docs for why that is sound). Offsets are heap offsets in bytes;
/// the 64-bit word operations need 8-byte aligned offsets.
///
/// # Examples
///
/// ```
/// use rlx_transport::symmetric::{Cmp, SymmetricHeap};
/// use std::time::Duration;
///
/// let heap = SymmetricHeap::new(0, 64)?;
/// heap.write(3, b"abc")?;
/// let mut out = [0u8; 3];
/// heap.read(3, &mut out)?;
/// assert_eq!(&out, b"abc");
/// assert_eq!(heap.fetch_add(8, 5)?, 0);
/// assert_eq!(heap.wait_until(8, Cmp::Ge, 5, Duration::ZERO)?, 5);
/// # Ok::<(), rlx_transport::CollectiveError>(())
/// ```
pub struct SymmetricHeap {
    rank: u32,
    size: u64,
    words: Box<[AtomicU64]>,
    wake: Mutex<Wake>,
    changed: Condvar,
}

impl fmt::Debug for SymmetricHeap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SymmetricHeap")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .finish()
    }
}

impl SymmetricHeap {
    /// A zeroed heap of `size` bytes owned by `rank`. Fails with `InvalidArgument` when `size`
    /// does not fit this machine's address space.
    pub fn new(rank: u32, size: u64) -> Result<Self> {
        let words = size.div_ceil(8);
        let words = usize::try_from(words)
            .ok()
            .filter(|w| w.checked_mul(8).is_some_and(|b| b <= isize::MAX as usize))
            .ok_or_else(|| {
                CollectiveError::invalid(format!(
                    "symmetric heap of {size} bytes does not fit this machine's address space"
                ))
            })?;
        Ok(Self {
            rank,
            size,
            words: (0..words).map(|_| AtomicU64::new(0)).collect(),
            wake: Mutex::new(Wake::default()),
            changed: Condvar::new(),
        })
    }

    /// The rank that owns this heap.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// Size of the heap in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Checks that `offset..offset + len` lies inside the heap.
    pub fn check_range(&self, offset: u64, len: u64) -> Result<(), HeapFault> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(HeapFault::OutOfBounds {
                offset,
                len,
                heap_size: self.size,
            }),
        }
    }

    fn word(&self, offset: u64) -> Result<&AtomicU64, HeapFault> {
        self.check_range(offset, 8)?;
        if offset % 8 != 0 {
            return Err(HeapFault::Misaligned { offset });
        }
        // The range check bounds `offset / 8` by the word count, which is a `usize`.
        self.words
            .get((offset / 8) as usize)
            .ok_or(HeapFault::OutOfBounds {
                offset,
                len: 8,
                heap_size: self.size,
            })
    }

    /// Copies `buf.len()` bytes at `offset` into `buf`.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.try_read(offset, buf)
            .map_err(|fault| fault.into_error(self.rank))
    }

    /// Like [`SymmetricHeap::read`], with the refusal as a [`HeapFault`] (the service's form).
    pub fn try_read(&self, offset: u64, buf: &mut [u8]) -> Result<(), HeapFault> {
        self.check_range(offset, buf.len() as u64)?;
        let (head, middle, tail) = split_words(offset, buf.len());
        let (head_buf, rest) = buf.split_at_mut(head.len);
        let (middle_buf, tail_buf) = rest.split_at_mut(middle.len * 8);
        for part in [(head, head_buf), (tail, tail_buf)] {
            let (span, dst) = part;
            if span.len > 0 {
                let word = self.words[span.index].load(Ordering::Relaxed).to_le_bytes();
                dst.copy_from_slice(&word[span.skip..span.skip + span.len]);
            }
        }
        let words = &self.words[middle.index..middle.index + middle.len];
        for (word, dst) in words.iter().zip(middle_buf.chunks_exact_mut(8)) {
            dst.copy_from_slice(&word.load(Ordering::Relaxed).to_le_bytes());
        }
        Ok(())
    }

    /// Copies `data` into the heap at `offset` and wakes [`SymmetricHeap::wait_until`] callers.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.try_write(offset, data)
            .map_err(|fault| fault.into_error(self.rank))
    }

    /// Like [`SymmetricHeap::write`], with the refusal as a [`HeapFault`].
    pub fn try_write(&self, offset: u64, data: &[u8]) -> Result<(), HeapFault> {
        self.check_range(offset, data.len() as u64)?;
        self.store_bytes(offset, data);
        self.notify();
        Ok(())
    }

    /// Stores `data` at `offset` (already range-checked) without waking anyone.
    fn store_bytes(&self, offset: u64, data: &[u8]) {
        let (head, middle, tail) = split_words(offset, data.len());
        let (head_data, rest) = data.split_at(head.len);
        let (middle_data, tail_data) = rest.split_at(middle.len * 8);
        for (span, src) in [(head, head_data), (tail, tail_data)] {
            if span.len > 0 {
                self.merge_partial(span, src);
            }
        }
        let words = &self.words[middle.index..middle.index + middle.len];
        for (word, src) in words.iter().zip(middle_data.chunks_exact(8)) {
            let mut bytes = [0u8; 8];
            bytes.copy_from_slice(src);
            word.store(u64::from_le_bytes(bytes), Ordering::Relaxed);
        }
    }

    /// Writes `src` into bytes `span.skip..span.skip + span.len` of one word, keeping the other
    /// bytes, which another writer may own, as they are.
    fn merge_partial(&self, span: Span, src: &[u8]) {
        let word = &self.words[span.index];
        let mut current = word.load(Ordering::Relaxed);
        loop {
            let mut bytes = current.to_le_bytes();
            bytes[span.skip..span.skip + span.len].copy_from_slice(src);
            let merged = u64::from_le_bytes(bytes);
            match word.compare_exchange_weak(current, merged, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => break,
                Err(seen) => current = seen,
            }
        }
    }

    /// Sets every byte of `offset..offset + len` to zero (used when a region is allocated).
    pub fn zero(&self, offset: u64, len: u64) -> Result<()> {
        self.check_range(offset, len)
            .map_err(|fault| fault.into_error(self.rank))?;
        const CHUNK: [u8; 4096] = [0u8; 4096];
        let mut at = offset;
        let end = offset + len;
        while at < end {
            let take = (end - at).min(CHUNK.len() as u64);
            self.store_bytes(at, &CHUNK[..take as usize]);
            at += take;
        }
        self.notify();
        Ok(())
    }

    /// Reads the aligned 64-bit word at `offset` (acquire: what was written before a release
    /// store of this word is visible afterwards).
    pub fn load_u64(&self, offset: u64) -> Result<u64> {
        let word = self
            .word(offset)
            .map_err(|fault| fault.into_error(self.rank))?;
        Ok(word.load(Ordering::Acquire))
    }

    /// Writes the aligned 64-bit word at `offset` (release) and wakes waiters.
    pub fn store_u64(&self, offset: u64, value: u64) -> Result<()> {
        self.try_store_u64(offset, value)
            .map_err(|fault| fault.into_error(self.rank))
    }

    /// Like [`SymmetricHeap::store_u64`], with the refusal as a [`HeapFault`].
    pub fn try_store_u64(&self, offset: u64, value: u64) -> Result<(), HeapFault> {
        self.word(offset)?.store(value, Ordering::Release);
        self.notify();
        Ok(())
    }

    /// Adds `value` (wrapping) to the aligned word at `offset` and returns its previous value.
    pub fn fetch_add(&self, offset: u64, value: u64) -> Result<u64> {
        self.try_fetch_add(offset, value)
            .map_err(|fault| fault.into_error(self.rank))
    }

    /// Like [`SymmetricHeap::fetch_add`], with the refusal as a [`HeapFault`].
    pub fn try_fetch_add(&self, offset: u64, value: u64) -> Result<u64, HeapFault> {
        let old = self.word(offset)?.fetch_add(value, Ordering::AcqRel);
        self.notify();
        Ok(old)
    }

    /// Replaces the aligned word at `offset` with `new` if it equals `expected`; returns the
    /// value it held before (equal to `expected` exactly when the swap happened).
    pub fn compare_swap(&self, offset: u64, expected: u64, new: u64) -> Result<u64> {
        self.try_compare_swap(offset, expected, new)
            .map_err(|fault| fault.into_error(self.rank))
    }

    /// Like [`SymmetricHeap::compare_swap`], with the refusal as a [`HeapFault`].
    pub fn try_compare_swap(&self, offset: u64, expected: u64, new: u64) -> Result<u64, HeapFault> {
        let word = self.word(offset)?;
        let old = match word.compare_exchange(expected, new, Ordering::AcqRel, Ordering::Acquire) {
            Ok(old) | Err(old) => old,
        };
        self.notify();
        Ok(old)
    }

    /// Validates a word offset without touching the word.
    pub fn check_word(&self, offset: u64) -> Result<(), HeapFault> {
        self.word(offset).map(|_| ())
    }

    /// Blocks until the aligned word at `offset` satisfies `cmp` against `value` and returns the
    /// word; `Timeout` after `timeout`, `Aborted` after [`SymmetricHeap::abort`].
    ///
    /// Everything written into this heap before the write that satisfied the comparison (by a
    /// put-with-signal, an atomic or a local store) is visible to the caller when this returns.
    pub fn wait_until(&self, offset: u64, cmp: Cmp, value: u64, timeout: Duration) -> Result<u64> {
        let word = self
            .word(offset)
            .map_err(|fault| fault.into_error(self.rank))?;
        let deadline = Instant::now().checked_add(timeout);
        let mut wake = lock(&self.wake);
        loop {
            if wake.aborted {
                return Err(CollectiveError::Aborted);
            }
            let current = word.load(Ordering::Acquire);
            if cmp.holds(current, value) {
                return Ok(current);
            }
            let remaining = match deadline {
                Some(deadline) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return Err(CollectiveError::Timeout {
                            peer: None,
                            op: "wait_until",
                            after: timeout,
                        });
                    }
                    Some(deadline - now)
                }
                None => None,
            };
            wake = match remaining {
                Some(remaining) => match self.changed.wait_timeout(wake, remaining) {
                    Ok((guard, _)) => guard,
                    Err(poisoned) => poisoned.into_inner().0,
                },
                None => match self.changed.wait(wake) {
                    Ok(guard) => guard,
                    Err(poisoned) => poisoned.into_inner(),
                },
            };
        }
    }

    /// Wakes every [`SymmetricHeap::wait_until`] caller with `Aborted`, now and later.
    pub fn abort(&self) {
        lock(&self.wake).aborted = true;
        self.changed.notify_all();
    }

    /// Wakes the waiters after a mutation. Taking the mutex first orders this notification after
    /// any waiter's check of the word, so a waiter that saw the old value is already waiting.
    fn notify(&self) {
        drop(lock(&self.wake));
        self.changed.notify_all();
    }
}

#[cfg(all(test, not(rlx_loom)))]
mod tests {
    use super::*;

    #[test]
    fn unaligned_writes_keep_their_neighbours() {
        let heap = SymmetricHeap::new(2, 37).unwrap();
        let reference: Vec<u8> = (0..37u8).map(|b| b.wrapping_mul(7)).collect();
        heap.write(0, &reference).unwrap();
        let mut model = reference.clone();
        for (offset, len) in [
            (1usize, 3usize),
            (5, 9),
            (7, 1),
            (8, 8),
            (30, 7),
            (0, 37),
            (13, 0),
        ] {
            let patch: Vec<u8> = (0..len).map(|i| (offset + i) as u8 ^ 0xA5).collect();
            heap.write(offset as u64, &patch).unwrap();
            model[offset..offset + len].copy_from_slice(&patch);
            let mut all = vec![0u8; 37];
            heap.read(0, &mut all).unwrap();
            assert_eq!(all, model, "after writing {len} bytes at {offset}");
        }
        let mut part = [0u8; 11];
        heap.read(19, &mut part).unwrap();
        assert_eq!(&part[..], &model[19..30]);
    }

    #[test]
    fn bounds_and_alignment_are_checked() {
        let heap = SymmetricHeap::new(3, 20).unwrap();
        assert!(matches!(
            heap.write(16, &[0; 5]),
            Err(CollectiveError::OutOfBounds {
                rank: 3,
                offset: 16,
                len: 5,
                heap_size: 20
            })
        ));
        assert!(matches!(
            heap.read(u64::MAX, &mut [0; 2]),
            Err(CollectiveError::OutOfBounds { .. })
        ));
        // The last word is only partly inside the heap, so word access there is out of bounds.
        assert!(matches!(
            heap.load_u64(16),
            Err(CollectiveError::OutOfBounds { .. })
        ));
        assert!(matches!(
            heap.fetch_add(4, 1),
            Err(CollectiveError::InvalidArgument { .. })
        ));
        heap.write(20, &[]).unwrap();
    }

    #[test]
    fn words_are_little_endian_bytes() {
        let heap = SymmetricHeap::new(0, 16).unwrap();
        heap.store_u64(8, 0x0102_0304_0506_0708).unwrap();
        let mut bytes = [0u8; 8];
        heap.read(8, &mut bytes).unwrap();
        assert_eq!(u64::from_le_bytes(bytes), 0x0102_0304_0506_0708);
        assert_eq!(heap.compare_swap(8, 1, 2).unwrap(), 0x0102_0304_0506_0708);
        assert_eq!(
            heap.compare_swap(8, 0x0102_0304_0506_0708, 2).unwrap(),
            0x0102_0304_0506_0708
        );
        assert_eq!(heap.load_u64(8).unwrap(), 2);
        heap.zero(0, 16).unwrap();
        assert_eq!(heap.load_u64(8).unwrap(), 0);
    }

    #[test]
    fn wait_until_wakes_on_a_store_and_honours_deadlines() {
        let heap = std::sync::Arc::new(SymmetricHeap::new(0, 8).unwrap());
        let err = heap
            .wait_until(0, Cmp::Eq, 1, Duration::from_millis(10))
            .unwrap_err();
        assert!(matches!(
            err,
            CollectiveError::Timeout {
                op: "wait_until",
                ..
            }
        ));
        let writer = {
            let heap = heap.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                heap.store_u64(0, 9).unwrap();
            })
        };
        assert_eq!(
            heap.wait_until(0, Cmp::Gt, 5, Duration::from_secs(30))
                .unwrap(),
            9
        );
        writer.join().unwrap();
        heap.abort();
        assert!(matches!(
            heap.wait_until(0, Cmp::Eq, 0, Duration::from_secs(30)),
            Err(CollectiveError::Aborted)
        ));
    }

    #[test]
    fn ranges_split_into_head_words_and_tail() {
        let span = |index, skip, len| Span { index, skip, len };
        assert_eq!(
            split_words(0, 16),
            (span(0, 0, 0), span(0, 0, 2), span(2, 0, 0))
        );
        assert_eq!(
            split_words(3, 2),
            (span(0, 3, 2), span(1, 0, 0), span(1, 0, 0))
        );
        assert_eq!(
            split_words(5, 20),
            (span(0, 5, 3), span(1, 0, 2), span(3, 0, 1))
        );
        assert_eq!(
            split_words(8, 7),
            (span(1, 0, 0), span(1, 0, 0), span(1, 0, 7))
        );
        assert_eq!(
            split_words(9, 0),
            (span(1, 1, 0), span(1, 0, 0), span(1, 0, 0))
        );
    }

    #[test]
    fn comparisons() {
        assert!(Cmp::Eq.holds(3, 3) && !Cmp::Eq.holds(3, 4));
        assert!(Cmp::Ne.holds(3, 4) && !Cmp::Ne.holds(4, 4));
        assert!(Cmp::Gt.holds(5, 4) && !Cmp::Gt.holds(4, 4));
        assert!(Cmp::Ge.holds(4, 4) && !Cmp::Ge.holds(3, 4));
        assert!(Cmp::Lt.holds(3, 4) && !Cmp::Lt.holds(4, 4));
        assert!(Cmp::Le.holds(4, 4) && !Cmp::Le.holds(5, 4));
    }
}
