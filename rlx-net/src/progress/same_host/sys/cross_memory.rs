//! The OS calls of the single-copy path: reading and writing another process's memory
//! directly (`single_copy.rs` holds the protocol around them).
//!
//! - Linux: `process_vm_readv(2)` and `process_vm_writev(2)` (cross-memory attach), which copy
//!   between two address spaces in one kernel copy. The kernel allows them only where it would
//!   allow `ptrace` of the other process (same user, and Yama's `ptrace_scope` permitting), and
//!   a container's seccomp profile may forbid them; a rank reads its peer's nonce with them
//!   before it relies on them (the offer of `single_copy.rs`).
//! - Every other system: no such calls; [`SUPPORTED`] is false and both functions fail with
//!   `Unsupported`; no offer is made and the path stays off.

use std::io;

/// Whether this system has the calls at all.
pub(in crate::progress::same_host) const SUPPORTED: bool = cfg!(target_os = "linux");

/// This process's id, as the peers name it in their calls.
pub(in crate::progress::same_host) fn own_pid() -> u32 {
    std::process::id()
}

/// Copies `remote` (address and length ranges in process `pid`, read in order) into `local`,
/// whose length must equal their total; fails on the first call that moves nothing.
pub(in crate::progress::same_host) fn read_from(
    pid: u32,
    remote: &[(u64, u64)],
    local: &mut [u8],
) -> io::Result<()> {
    read_at(pid, remote, 0, local)
}

/// Copies `local.len()` bytes of `remote` (address and length ranges in process `pid`, read
/// in order), starting `offset` bytes into their concatenation, into `local`; fails on the
/// first call that moves nothing.
#[cfg(target_os = "linux")]
pub(in crate::progress::same_host) fn read_at(
    pid: u32,
    remote: &[(u64, u64)],
    offset: u64,
    local: &mut [u8],
) -> io::Result<()> {
    let mut done = 0usize;
    while done < local.len() {
        let mut iovs: [libc::iovec; 8] = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; 8];
        let count = remaining_ranges(remote, offset + done as u64, &mut iovs);
        let target = libc::iovec {
            iov_base: local[done..].as_mut_ptr().cast(),
            iov_len: local.len() - done,
        };
        // SAFETY: `target` describes the unwritten rest of `local`, which this call borrows
        // mutably; the remote ranges are only read, in the other process, by the kernel, which
        // checks them and fails with EFAULT when they are not mapped there.
        let n = unsafe {
            libc::process_vm_readv(
                pid as libc::pid_t,
                &target,
                1,
                iovs.as_ptr(),
                count as libc::c_ulong,
                0,
            )
        };
        match n {
            n if n > 0 => done += n as usize,
            0 => return Err(io::Error::from(io::ErrorKind::UnexpectedEof)),
            _ => {
                let err = io::Error::last_os_error();
                if err.kind() != io::ErrorKind::Interrupted {
                    return Err(err);
                }
            }
        }
    }
    Ok(())
}

/// Writes `value` into the 8 bytes at `addr` in process `pid`.
#[cfg(target_os = "linux")]
pub(in crate::progress::same_host) fn write_word(
    pid: u32,
    addr: u64,
    value: u64,
) -> io::Result<()> {
    let bytes = value.to_ne_bytes();
    let local = libc::iovec {
        iov_base: bytes.as_ptr().cast_mut().cast(),
        iov_len: bytes.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as usize as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    loop {
        // SAFETY: `local` describes `bytes`, which the kernel only reads; the remote range is
        // written in the other process by the kernel, which checks it.
        let n = unsafe { libc::process_vm_writev(pid as libc::pid_t, &local, 1, &remote, 1, 0) };
        if n == bytes.len() as isize {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if n >= 0 || err.kind() != io::ErrorKind::Interrupted {
            return Err(if n >= 0 {
                io::Error::from(io::ErrorKind::WriteZero)
            } else {
                err
            });
        }
    }
}

/// Fills `out` with the parts of `ranges` that lie at or after byte `skip` of their
/// concatenation; returns how many entries it filled.
#[cfg(target_os = "linux")]
fn remaining_ranges(ranges: &[(u64, u64)], mut skip: u64, out: &mut [libc::iovec]) -> usize {
    let mut count = 0;
    for &(addr, len) in ranges {
        if skip >= len {
            skip -= len;
            continue;
        }
        if count == out.len() {
            break;
        }
        out[count] = libc::iovec {
            iov_base: (addr + skip) as usize as *mut libc::c_void,
            iov_len: (len - skip) as usize,
        };
        skip = 0;
        count += 1;
    }
    count
}

#[cfg(not(target_os = "linux"))]
pub(in crate::progress::same_host) fn read_at(
    _pid: u32,
    _remote: &[(u64, u64)],
    _offset: u64,
    _local: &mut [u8],
) -> io::Result<()> {
    Err(io::Error::from(io::ErrorKind::Unsupported))
}

#[cfg(not(target_os = "linux"))]
pub(in crate::progress::same_host) fn write_word(
    _pid: u32,
    _addr: u64,
    _value: u64,
) -> io::Result<()> {
    Err(io::Error::from(io::ErrorKind::Unsupported))
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn reads_scattered_ranges_of_this_process_in_order() {
        let a: Vec<u8> = (0..100u8).collect();
        let b: Vec<u8> = (100..=255u8).collect();
        let ranges = [
            (a.as_ptr() as u64, a.len() as u64),
            (b.as_ptr() as u64, b.len() as u64),
        ];
        let mut out = vec![0u8; 256];
        read_from(own_pid(), &ranges, &mut out).unwrap();
        assert!(out.iter().enumerate().all(|(i, &v)| v as usize == i));
        let mut middle = [0u8; 20];
        read_at(own_pid(), &ranges, 90, &mut middle).unwrap();
        assert!(
            middle
                .iter()
                .enumerate()
                .all(|(i, &v)| v as usize == 90 + i)
        );
    }

    #[test]
    fn writes_a_word_and_refuses_unmapped_addresses() {
        let word = Box::new(std::sync::atomic::AtomicU64::new(0));
        write_word(own_pid(), word.as_ptr() as u64, 42).unwrap();
        assert_eq!(word.load(std::sync::atomic::Ordering::SeqCst), 42);
        let mut out = [0u8; 8];
        assert!(read_from(own_pid(), &[(8, 8)], &mut out).is_err());
        assert!(write_word(own_pid(), 8, 1).is_err());
    }
}
