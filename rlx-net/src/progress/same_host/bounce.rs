//! BouncedHead copies: the head of a pulled message passes through a shared-memory file of the
//! sender's, copied in by the sender and out by the receiver at the same time, instead of being
//! read across processes by the receiver alone.
//!
//! `process_vm_readv` pins and maps the sender's pages a few at a time; on the reference
//! machine it copies 6–8 GB/s, where a plain `memcpy` on one core copies 18–20. Two ranks that
//! each copy with `memcpy` (the sender into the file, the receiver out of it, chunk by chunk
//! behind it) moved 11–15 GB/s in a trial with each rank bound to its own core. The receiver's
//! core, which does all the work of a pull, then spends far less time per byte; the sender's
//! core, which only waited, does the other half. This is the copy-in, copy-out scheme of MPI's
//! shared-memory transports, without their fixed-size rings: the file holds a message's whole
//! head, so the sender never waits for the receiver while it copies, and the receiver waits only
//! for the sender's `memcpy`.
//!
//! The protocol, on top of the pull of `single_copy.rs`:
//! 1. The sender keeps one file per peer (created at its first bounced message, grown to the
//!    largest head, never shrunk, at most [`EngineConfig::max_bounced`] bytes of data). Before it
//!    writes a pulled frame it stores the message's ticket and 0 bytes in the file's `filled`
//!    word, and names the file (its descriptor number and a random id written in the file) and
//!    the bounced length in the frame's [`Descriptor`]. After the frame it copies the head into
//!    the file, storing in `filled` how much is there after each chunk of [`CHUNK`] bytes.
//! 2. The receiver maps the file once per peer (reopened when the sender grew it), reads the
//!    tail past the head with `process_vm_readv` meanwhile, then copies the head out as
//!    `filled` grows. While it waits it watches the sender's `offered` word and whether the
//!    peer was lost, so a sender that gave up or died ends the wait; a sender that copies
//!    nothing for as long as its silence would make it lost (stopped, or starved of a core)
//!    is lost too, since the thread waiting may be the watcher that would notice.
//! 3. Then, as for every pull, the receiver checks `offered` and writes `taken`; the sender
//!    reuses the file only for its next message, after `taken`.
//!
//! A receiver that cannot map the file (another user, no `/proc`, a file that could shrink)
//! reads the whole message with `process_vm_readv`, and writes 3 into the sender's `accepted`
//! word: the sender bounces nothing for it from then on.
//!
//! [`EngineConfig::max_bounced`]: super::EngineConfig::max_bounced

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::error::Lost;
use crate::frame::FrameHeader;

use super::SameHost;
use super::descriptor::{BouncedHead, Descriptor};
use super::sys::cross_memory;
use super::sys::shared_memory::{self, SharedMap};

/// Bytes before the bounced data: the `filled` word, the file's id, and padding up to a page, so
/// that the data starts page-aligned.
const HEADER: usize = 4096;

/// How many bytes the sender copies between two stores of `filled`: small enough that the
/// receiver starts soon after the sender, large enough that the stores cost nothing.
pub(in crate::progress) const CHUNK: usize = 256 << 10;

/// Default of [`EngineConfig::max_bounced`](super::EngineConfig::max_bounced): the largest head
/// bounced, and so the largest file kept per peer. Larger messages bounce this much and the
/// receiver reads the rest across processes.
pub(crate) const DEFAULT_MAX_BOUNCED: u64 = 64 << 20;

/// The largest head bounced by a send in an exchange. There each rank's core copies its own
/// message in and its peer's out, where reading across processes would cost it one slower copy;
/// the bounce pays only while the file stays in the cache, which measured 2× faster at 1 MiB and
/// no faster at 32 MiB.
const EXCHANGE_BOUNCE: u64 = 4 << 20;

/// The largest bounce file a receiver maps: it takes address space only (the pages are the
/// sender's), but a peer cannot make it reserve more than this.
const LARGEST_VIEW: u64 = 4 << 30;

/// The value `value` the `accepted` word takes when the receiver reads by pull but cannot map
/// the sender's bounce file.
pub(crate) const ACCEPTED_NO_BOUNCE: u64 = 3;

/// How long the receiver waits for `filled` to grow before it also checks that the sender still
/// offers the message.
const LIVENESS_EVERY: Duration = Duration::from_millis(1);

/// How long the receiver yields between looks at `filled` before it sleeps between them.
const YIELD_WITHOUT_PROGRESS: Duration = Duration::from_millis(1);

/// The receiver's sleep between looks at `filled` once the sender has been slow that long.
const NAP_WITHOUT_PROGRESS: Duration = Duration::from_micros(200);

/// Bits of the `filled` word that count bytes; the ticket's low bits sit above them, so that a
/// word left from an earlier message never counts for this one.
const BYTES_BITS: u32 = 40;

fn filled_word(ticket: u64, bytes: u64) -> u64 {
    (ticket << BYTES_BITS) | (bytes & ((1 << BYTES_BITS) - 1))
}

/// The `filled` word at the start of a bounce mapping.
fn filled(map: &SharedMap) -> &AtomicU64 {
    // SAFETY: every mapping made here is at least `HEADER` bytes and page-aligned, so its first
    // eight bytes are an aligned `u64` that lives as long as the mapping; both processes only
    // ever access it atomically.
    unsafe { &*map.ptr().cast::<AtomicU64>() }
}

/// The id word after `filled`.
fn id_word(map: &SharedMap) -> &AtomicU64 {
    // SAFETY: as for `filled`, at byte 8.
    unsafe { &*map.ptr().add(8).cast::<AtomicU64>() }
}

/// A sender's bounce file for one peer, kept under that peer's send lock.
#[derive(Debug)]
pub(crate) struct BounceFile {
    fd: OwnedFd,
    map: SharedMap,
    id: u64,
}

impl BounceFile {
    /// The bounce file in `slot`, made or grown to hold `len` bytes of data; `None` (and the
    /// message goes unbounced) when the system refuses.
    fn ready(slot: &mut Option<BounceFile>, len: usize) -> Option<&BounceFile> {
        let need = HEADER + len;
        let fits = slot.as_ref().is_some_and(|s| s.map.len() >= need);
        if !fits {
            let made = match slot.take() {
                Some(old) => shared_memory::grow(&old.fd, need)
                    .and_then(|()| shared_memory::map(&old.fd, need))
                    .map(|map| BounceFile { map, ..old }),
                None => Self::create(need),
            };
            match made {
                Ok(bounce) => *slot = Some(bounce),
                Err(e) => {
                    tracing::debug!(error = %e, len, "no bounce file; the message is pulled whole");
                    return None;
                }
            }
        }
        slot.as_ref()
    }

    fn create(len: usize) -> std::io::Result<BounceFile> {
        let fd = shared_memory::create(len)?;
        let map = shared_memory::map(&fd, len)?;
        let mut id = [0u8; 8];
        let _ = getrandom::fill(&mut id);
        // Never zero, so that a zeroed file is never taken for this one.
        let id = u64::from_ne_bytes(id) | 1;
        id_word(&map).store(id, Ordering::SeqCst);
        Ok(BounceFile { fd, map, id })
    }
}

/// A receiver's mapping of one peer's bounce file.
#[derive(Debug)]
pub(crate) struct PeerBounceFile {
    fd: u64,
    id: u64,
    map: SharedMap,
}

impl SameHost<'_> {
    /// Bounces nothing, or prepares `to`'s bounce file for message `seq` of `total` bytes (sent
    /// in an `exchange` or not) and says where its head will be.
    pub(in crate::progress) fn prepare_bounce(
        &self,
        to: u32,
        seq: u64,
        total: u64,
        exchange: bool,
    ) -> BouncedHead {
        let cap = match exchange {
            true => self.core.cfg.max_bounced.min(EXCHANGE_BOUNCE),
            false => self.core.cfg.max_bounced,
        };
        let len = total.min(cap);
        if len == 0 || !shared_memory::SUPPORTED || !self.bounces_to(to) {
            return BouncedHead::default();
        }
        let Some(mut slot) = self.single_copy.bounce_file(to) else {
            return BouncedHead::default();
        };
        let Some(bounce) = usize::try_from(len)
            .ok()
            .and_then(|len| BounceFile::ready(&mut slot, len))
        else {
            return BouncedHead::default();
        };
        filled(&bounce.map).store(filled_word(seq + 1, 0), Ordering::SeqCst);
        BouncedHead {
            fd: bounce.fd.as_raw_fd() as u64,
            id: bounce.id,
            len,
        }
    }

    /// Copies the first `bounced.len` bytes of `parts` (message `seq`) into the bounce file,
    /// publishing each chunk in `filled` as it lands.
    pub(in crate::progress) fn bounce_in(
        &self,
        to: u32,
        seq: u64,
        parts: &[&[u8]],
        bounced: BouncedHead,
    ) {
        let Some(slot) = self.single_copy.bounce_file(to) else {
            return;
        };
        let Some(bounce) = slot.as_ref() else {
            return;
        };
        let len = bounced.len as usize;
        let word = filled(&bounce.map);
        let mut at = 0usize;
        for part in parts {
            for chunk in part.chunks(CHUNK) {
                if at >= len {
                    return;
                }
                let n = chunk.len().min(len - at);
                // SAFETY: `prepare_bounce` made the file hold `HEADER + len` bytes, and
                // `at + n <= len`; the source is the caller's slice. The receiver reads only
                // bytes below the count published in `filled`, and only for this ticket, so
                // nothing reads these bytes while they are written.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        chunk.as_ptr(),
                        bounce.map.ptr().add(HEADER + at),
                        n,
                    );
                }
                at += n;
                word.store(filled_word(seq + 1, at as u64), Ordering::Release);
            }
        }
    }

    /// Whether messages to `to` may be bounced: it reads by pull and did not say it cannot map
    /// bounce files.
    fn bounces_to(&self, to: u32) -> bool {
        self.core.cfg.max_bounced > 0 && self.single_copy.accepted(to) == 1
    }

    /// Reads pulled message `header.seq` of rank `from` (process `pid`) into `dest`: its
    /// bounced head out of the sender's file and the rest across processes, or all of it across
    /// processes when nothing is bounced or the file cannot be mapped.
    pub(in crate::progress) fn read_single_copy(
        &self,
        from: u32,
        pid: u32,
        header: &FrameHeader,
        desc: &Descriptor,
        dest: &mut [u8],
    ) -> Result<(), Lost> {
        let ranges = &desc.parts[..desc.count];
        let bounced = desc.bounced;
        let failed = |what: &str, e: std::io::Error| self.single_copy_failed(from, pid, what, e);
        let whole = |dest: &mut [u8]| {
            cross_memory::read_from(pid, ranges, dest).map_err(|e| {
                failed(
                    &format!("the single-copy read of {} bytes", header.total),
                    e,
                )
            })
        };
        if bounced.len == 0 {
            return whole(dest);
        }
        let Some(mut views) = self.single_copy.view(from) else {
            return whole(dest);
        };
        let view = match views
            .take()
            .filter(|v| v.fd == bounced.fd && v.id == bounced.id)
        {
            Some(v) if v.map.len() as u64 >= HEADER as u64 + bounced.len => v,
            _ => match open_view(pid, bounced) {
                Ok(view) => view,
                Err(e) => {
                    tracing::debug!(peer = from, error = %e, "bounce file not mapped; pulling whole");
                    self.refuse_bounce(from, pid);
                    return whole(dest);
                }
            },
        };
        let head = bounced.len as usize;
        let tail = cross_memory::read_at(pid, ranges, bounced.len, &mut dest[head..]);
        tail.map_err(|e| failed("the single-copy read of a message's tail", e))?;
        let result = self.copy_bounced(from, pid, header, desc, &view, &mut dest[..head]);
        *views = Some(view);
        if result.is_ok() {
            self.core.traffic.bounced(bounced.len);
        }
        result
    }

    /// Copies the bounced head out of `view` as the sender publishes it.
    fn copy_bounced(
        &self,
        from: u32,
        pid: u32,
        header: &FrameHeader,
        desc: &Descriptor,
        view: &PeerBounceFile,
        dest: &mut [u8],
    ) -> Result<(), Lost> {
        let ticket = header.seq + 1;
        let word = filled(&view.map);
        let mut copied = 0usize;
        // The bounce is a plain `memcpy` on the sender's side, which starts right after the
        // frame; a sender that copies nothing for as long as its silence would make it lost
        // is stopped or starved, and the watcher, which may be the thread waiting here, would
        // not notice otherwise.
        let stall = self.core.cfg.silence_window();
        let mut progressed = Instant::now();
        let mut checked = progressed;
        while copied < dest.len() {
            let now_filled = word.load(Ordering::Acquire);
            let ready = if now_filled >> BYTES_BITS == ticket & ((1 << (64 - BYTES_BITS)) - 1) {
                ((now_filled & ((1 << BYTES_BITS) - 1)) as usize).min(dest.len())
            } else {
                0
            };
            if ready > copied {
                // SAFETY: `read_single_copy` checked that the mapping holds `HEADER + dest.len()`
                // bytes, and `ready <= dest.len()`; `dest` is this thread's. A sender that
                // follows the protocol writes no byte below `filled` of this ticket; one that
                // does not can only change which bytes are copied, never where they go.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        view.map.ptr().add(HEADER + copied),
                        dest.as_mut_ptr().add(copied),
                        ready - copied,
                    );
                }
                copied = ready;
                progressed = Instant::now();
                continue;
            }
            let now = Instant::now();
            if now.duration_since(checked) >= LIVENESS_EVERY {
                checked = now;
                self.check_still_offered(from, pid, header, desc)?;
                // A sender that is alive but stopped copies nothing; its silence makes it lost
                // (the heartbeat), and that ends the wait as it ends every other.
                let lost = crate::sync::lock(&self.core.hub.state).peers[from as usize]
                    .lost
                    .clone();
                if let Some(lost) = lost {
                    return Err(lost);
                }
                if self.core.is_aborted() {
                    return Err(Lost::Gone(format!(
                        "the transport was aborted while message {} of rank {from} was copied",
                        header.seq
                    )));
                }
                if now.duration_since(progressed) > stall {
                    return Err(Lost::Gone(format!(
                        "rank {from} copied nothing of message {} into its bounce file for \
                         {stall:?} (stopped or starved)",
                        header.seq
                    )));
                }
            }
            // The sender's next chunk is microseconds away while it copies; when nothing came
            // for a while it is descheduled or stopped, and this thread sleeps in short naps
            // rather than take a core from it.
            if Instant::now().duration_since(progressed) < YIELD_WITHOUT_PROGRESS {
                std::thread::yield_now();
            } else {
                std::thread::sleep(NAP_WITHOUT_PROGRESS);
            }
        }
        Ok(())
    }

    /// Tells `from` (process `pid`) to bounce nothing more for this rank.
    fn refuse_bounce(&self, from: u32, pid: u32) {
        if let Some(at) = self.single_copy.accepted_at(from) {
            let _ = cross_memory::write_word(pid, at, ACCEPTED_NO_BOUNCE);
        }
    }
}

/// Maps the bounce file `bounced` names in process `pid`, checking its size and id.
fn open_view(pid: u32, bounced: BouncedHead) -> std::io::Result<PeerBounceFile> {
    let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_owned());
    let (fd, len) = shared_memory::open_peer_file(pid, bounced.fd)?;
    if (len as u64) < HEADER as u64 + bounced.len || len as u64 > LARGEST_VIEW {
        return Err(bad("the bounce file's size does not fit the message"));
    }
    let map = shared_memory::map(&fd, len)?;
    if id_word(&map).load(Ordering::SeqCst) != bounced.id {
        return Err(bad("the bounce file's id is not the one named"));
    }
    Ok(PeerBounceFile {
        fd: bounced.fd,
        id: bounced.id,
        map,
    })
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn a_receiver_maps_only_the_file_named_and_large_enough() {
        let mut slot = None;
        let (fd, id) = {
            let bounce = BounceFile::ready(&mut slot, 1 << 20).expect("a bounce file");
            (bounce.fd.as_raw_fd() as u64, bounce.id)
        };
        let pid = std::process::id();
        let named = BouncedHead {
            fd,
            id,
            len: 1 << 20,
        };
        let view = open_view(pid, named).expect("the named file maps");
        assert!(view.map.len() >= HEADER + (1 << 20));
        assert!(
            open_view(
                pid,
                BouncedHead {
                    id: id ^ 2,
                    ..named
                }
            )
            .is_err()
        );
        assert!(
            open_view(
                pid,
                BouncedHead {
                    len: 2 << 20,
                    ..named
                }
            )
            .is_err()
        );
        // Grown for a larger head, the file keeps its id, and a fresh view sees it all.
        let grown = BounceFile::ready(&mut slot, 3 << 20).expect("grown");
        assert_eq!((grown.fd.as_raw_fd() as u64, grown.id), (fd, id));
        let larger = open_view(
            pid,
            BouncedHead {
                len: 3 << 20,
                ..named
            },
        )
        .expect("remapped");
        assert!(larger.map.len() >= HEADER + (3 << 20));
    }

    #[test]
    fn a_filled_word_counts_only_for_its_own_ticket() {
        let word = filled_word(7, 1234);
        assert_eq!(word >> BYTES_BITS, 7);
        assert_eq!(word & ((1 << BYTES_BITS) - 1), 1234);
        // Tickets wrap at 24 bits; the receiver compares the same low bits.
        let wrapped = filled_word((1 << 24) + 7, 5);
        assert_eq!(wrapped >> BYTES_BITS, 7);
    }
}
