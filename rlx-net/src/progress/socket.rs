//! OS socket calls of the engine: `poll(2)`, vectored sends, frame writes, reads that retry on
//! interrupts, the wake-up sockets and per-socket options.

use std::cell::RefCell;
use std::io::{self, IoSlice, Read};
use std::net::TcpStream;
use std::os::fd::RawFd;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use crate::frame::HEADER_LEN;

/// Most slices one vectored write takes.
const MAX_IOV: usize = 16;

thread_local! {
    /// Each thread's `poll(2)` array, reused across calls.
    pub(super) static POLL_FDS: RefCell<Vec<libc::pollfd>> = const { RefCell::new(Vec::new()) };
}

/// Switches a link whose peer runs on this host to Reno, the congestion control every kernel
/// has and lets any user choose; links to other hosts keep the host's choice.
///
/// Traffic between two processes of one host crosses the loopback device, where nothing is
/// congested, yet the host's default algorithm still runs on it. The reference machine's
/// default, BBR, paces every send at its estimate of the link's bandwidth, and that estimate
/// can collapse after a burst of large messages and stay low, so that every later message of
/// the connection arrives late. Two processes, each pinned to its own core, f32 sum, a 4 MiB
/// sweep and then 128 KiB, 512 KiB and 2 MiB, eight interleaved runs each: under BBR four runs
/// stayed slow (128 KiB in 92-100 µs against 41-45 µs in the other four; 512 KiB in
/// 321-377 µs, 2 MiB in 1.43-1.61 ms); under Reno none did (41-46 µs, 180-193 µs,
/// 0.87-0.96 ms). Reno does not pace.
///
/// Best effort: where the option does not exist (other systems, kernels without Reno as a
/// choice) the link keeps the default, which works, only slower.
#[cfg(any(target_os = "linux", target_os = "android", target_os = "freebsd"))]
pub(super) fn same_host_congestion_control(stream: &TcpStream) {
    if peer_on_this_host(stream) {
        // Ignored on failure, as documented above.
        let _ = socket2::SockRef::from(stream).set_tcp_congestion(b"reno");
    }
}

/// Whether the other end of `stream` runs on this host (in this network namespace): it is
/// reached over loopback, or its address is this end's own. A peer in another network
/// namespace of the same machine counts as another host, as the machines it stands in for in
/// tests would.
pub(super) fn peer_on_this_host(stream: &TcpStream) -> bool {
    match (stream.peer_addr(), stream.local_addr()) {
        (Ok(peer), Ok(local)) => peer.ip().is_loopback() || peer.ip() == local.ip(),
        _ => false,
    }
}

/// Other systems have no per-socket congestion control to choose.
#[cfg(not(any(target_os = "linux", target_os = "android", target_os = "freebsd")))]
pub(super) fn same_host_congestion_control(_stream: &TcpStream) {}

pub(super) fn read_some(mut stream: &TcpStream, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match stream.read(buf) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

pub(super) fn pollfd(fd: RawFd, events: libc::c_short) -> libc::pollfd {
    libc::pollfd {
        fd,
        events,
        revents: 0,
    }
}

/// `poll(2)` over `fds` for at most `wait`; errors and interrupts count as a wake-up (every
/// caller re-checks its state).
pub(super) fn poll(fds: &mut [libc::pollfd], wait: Duration) {
    let ms = wait.as_millis().min(i32::MAX as u128) as libc::c_int;
    // Round a sub-millisecond wait up so the call sleeps instead of spinning.
    let ms = if ms == 0 && !wait.is_zero() { 1 } else { ms };
    // SAFETY: `fds` is a valid, exclusively borrowed array of `fds.len()` pollfd structures.
    unsafe {
        libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms);
    }
}

#[cfg(any(target_os = "linux", target_os = "android"))]
const SEND_FLAGS: libc::c_int = libc::MSG_NOSIGNAL;
#[cfg(not(any(target_os = "linux", target_os = "android")))]
const SEND_FLAGS: libc::c_int = 0;

pub(super) fn send_vectored(stream: &TcpStream, slices: &[IoSlice<'_>]) -> io::Result<usize> {
    loop {
        match socket2::SockRef::from(stream).send_vectored_with_flags(slices, SEND_FLAGS) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

/// Hands `write` what is left of one frame (header, then bytes `offset..offset+len` of the
/// concatenated `parts`) after its first `sent` bytes, as at most [`MAX_IOV`] slices, and
/// returns what it wrote; 0 without calling it when nothing is left.
pub(super) fn with_frame_slices(
    header: &[u8; HEADER_LEN],
    parts: &[&[u8]],
    offset: u64,
    len: u64,
    sent: u64,
    write: impl FnOnce(&[IoSlice<'_>]) -> io::Result<usize>,
) -> io::Result<usize> {
    let mut slices: [IoSlice<'_>; MAX_IOV] = [IoSlice::new(&[]); MAX_IOV];
    let mut n = 0;
    if sent < HEADER_LEN as u64 {
        slices[0] = IoSlice::new(&header[sent as usize..]);
        n = 1;
    }
    // Position inside the message of the next payload byte to write.
    let body_sent = sent.saturating_sub(HEADER_LEN as u64);
    let mut from = offset + body_sent;
    let end = offset + len;
    let mut part_start = 0u64;
    for part in parts {
        if n == MAX_IOV || from >= end {
            break;
        }
        let part_end = part_start + part.len() as u64;
        if part_end > from {
            let lo = (from - part_start) as usize;
            let hi = (end.min(part_end) - part_start) as usize;
            if hi > lo {
                slices[n] = IoSlice::new(&part[lo..hi]);
                n += 1;
                from = part_start + hi as u64;
            }
        }
        part_start = part_end;
    }
    if n == 0 {
        return Ok(0);
    }
    write(&slices[..n])
}

/// Writing one byte to a non-blocking wake-up socket: a full buffer already means "awake".
pub(super) trait WakeWrite {
    fn write_all_nonblocking(self, bytes: &[u8]) -> io::Result<()>;
}

impl WakeWrite for &UnixStream {
    fn write_all_nonblocking(self, bytes: &[u8]) -> io::Result<()> {
        let mut s = self;
        match io::Write::write(&mut s, bytes) {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(()),
            Err(e) => Err(e),
        }
    }
}

// The only test here checks a Linux-family socket option; elsewhere the module is empty.
#[cfg(all(
    test,
    any(target_os = "linux", target_os = "android", target_os = "freebsd")
))]
mod tests {
    use super::*;

    #[test]
    fn links_to_this_host_use_reno() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        for stream in [&client, &server] {
            same_host_congestion_control(stream);
            let name = socket2::SockRef::from(stream).tcp_congestion().unwrap();
            // The kernel reports the name in a fixed-size, NUL-padded field.
            let name: Vec<u8> = name.into_iter().take_while(|&b| b != 0).collect();
            assert_eq!(name, b"reno");
        }
    }
}
