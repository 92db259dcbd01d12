//! The OS calls of shared-memory files (`bounce.rs` and `lane.rs` hold the protocols around
//! them): an anonymous shared-memory file a sender stages bytes in, and the peer's mapping of
//! that same file.
//!
//! - Linux: `memfd_create(2)` with a seal against shrinking (`F_SEAL_SHRINK`), so that the
//!   reader's mapping can never lose pages under it (a read past the end of a shrunk file would
//!   raise `SIGBUS`); the peer opens the file as `/proc/<pid>/fd/<fd>`, which the kernel allows
//!   where it allows `process_vm_readv` or less (same user); both sides map it `MAP_SHARED`.
//! - Every other system: [`SUPPORTED`] is false and every call fails with `Unsupported`, so no
//!   message is ever staged.

use std::io;
use std::os::fd::OwnedFd;

/// Whether this system has the calls at all.
pub(in crate::progress::same_host) const SUPPORTED: bool = cfg!(target_os = "linux");

/// A shared mapping of a whole file, unmapped on drop.
#[derive(Debug)]
pub(in crate::progress::same_host) struct SharedMap {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; which thread unmaps it or copies
// through it does not matter, and every access goes through raw pointers whose use the
// protocol of `bounce.rs` orders.
unsafe impl Send for SharedMap {}

impl SharedMap {
    /// The first byte of the mapping.
    pub(in crate::progress::same_host) fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// The mapping's length in bytes.
    pub(in crate::progress::same_host) fn len(&self) -> usize {
        self.len
    }
}

#[cfg(target_os = "linux")]
impl Drop for SharedMap {
    fn drop(&mut self) {
        // SAFETY: `ptr` and `len` describe a mapping this value made and nothing else unmaps;
        // no reference into it outlives the value (all accesses are raw copies).
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

#[cfg(not(target_os = "linux"))]
impl Drop for SharedMap {
    fn drop(&mut self) {}
}

/// Creates a shared-memory file of `len` bytes that can grow and never shrink.
#[cfg(target_os = "linux")]
pub(in crate::progress::same_host) fn create(len: usize) -> io::Result<OwnedFd> {
    use std::os::fd::FromRawFd;
    let flags = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING;
    // SAFETY: the name is a NUL-terminated literal; the call only reads it.
    let fd = unsafe { libc::memfd_create(c"rlx-net".as_ptr(), flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by `memfd_create` and is owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    grow(&fd, len)?;
    // SAFETY: `fcntl` on a descriptor this function owns, with an integer argument.
    if unsafe { libc::fcntl(raw(&fd), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// Grows the file `fd` to `len` bytes.
#[cfg(target_os = "linux")]
pub(in crate::progress::same_host) fn grow(fd: &OwnedFd, len: usize) -> io::Result<()> {
    let len =
        libc::off_t::try_from(len).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `ftruncate` on a descriptor the caller owns.
    if unsafe { libc::ftruncate(raw(fd), len) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Opens file descriptor `fd` of process `pid`, checks that it cannot shrink, and returns it
/// with its length.
#[cfg(target_os = "linux")]
pub(in crate::progress::same_host) fn open_peer_file(
    pid: u32,
    fd: u64,
) -> io::Result<(OwnedFd, usize)> {
    use std::os::fd::AsRawFd;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/{pid}/fd/{fd}"))?;
    // SAFETY: `fcntl` on a descriptor `file` owns, without pointer arguments.
    let seals = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GET_SEALS) };
    if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "the shared-memory file is not sealed against shrinking",
        ));
    }
    let len = usize::try_from(file.metadata()?.len())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidData))?;
    Ok((OwnedFd::from(file), len))
}

/// Maps the first `len` bytes of `fd` shared, for reading and writing.
#[cfg(target_os = "linux")]
pub(in crate::progress::same_host) fn map(fd: &OwnedFd, len: usize) -> io::Result<SharedMap> {
    // SAFETY: a fresh mapping chosen by the kernel; it aliases no Rust object, and the file
    // cannot shrink below `len` (sealed), so every page of it stays backed.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            raw(fd),
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(SharedMap {
        ptr: ptr.cast(),
        len,
    })
}

#[cfg(target_os = "linux")]
fn raw(fd: &OwnedFd) -> libc::c_int {
    use std::os::fd::AsRawFd;
    fd.as_raw_fd()
}

#[cfg(not(target_os = "linux"))]
pub(in crate::progress::same_host) fn create(_len: usize) -> io::Result<OwnedFd> {
    Err(io::Error::from(io::ErrorKind::Unsupported))
}

#[cfg(not(target_os = "linux"))]
pub(in crate::progress::same_host) fn grow(_fd: &OwnedFd, _len: usize) -> io::Result<()> {
    Err(io::Error::from(io::ErrorKind::Unsupported))
}

#[cfg(not(target_os = "linux"))]
pub(in crate::progress::same_host) fn open_peer_file(
    _pid: u32,
    _fd: u64,
) -> io::Result<(OwnedFd, usize)> {
    Err(io::Error::from(io::ErrorKind::Unsupported))
}

#[cfg(not(target_os = "linux"))]
pub(in crate::progress::same_host) fn map(_fd: &OwnedFd, _len: usize) -> io::Result<SharedMap> {
    Err(io::Error::from(io::ErrorKind::Unsupported))
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn a_file_opened_through_proc_shares_its_pages_and_cannot_shrink() {
        let fd = create(8192).unwrap();
        let mine = map(&fd, 8192).unwrap();
        let (theirs_fd, len) = open_peer_file(std::process::id(), fd.as_raw_fd() as u64).unwrap();
        assert_eq!(len, 8192);
        let theirs = map(&theirs_fd, len).unwrap();
        // SAFETY: both mappings are 8192 bytes long and this test alone uses them.
        unsafe {
            mine.ptr().add(5000).write(42);
            assert_eq!(theirs.ptr().add(5000).read(), 42);
        }
        grow(&fd, 16384).unwrap();
        assert!(grow(&fd, 4096).is_err(), "a sealed file must not shrink");
        // A regular file has no seals: it could shrink under a reader, so it is refused.
        let path = std::env::temp_dir().join(format!("rlx-net-unsealed-{}", std::process::id()));
        let plain = std::fs::File::create(&path).unwrap();
        let refused = open_peer_file(std::process::id(), plain.as_raw_fd() as u64);
        let _ = std::fs::remove_file(&path);
        assert!(refused.is_err());
    }
}
