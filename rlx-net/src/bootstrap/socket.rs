//! Socket setup for bootstrap: the setup hook, listeners, tuning of established links and
//! read deadlines.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, SockRef, Socket, TcpKeepalive, Type};

use super::config::{SocketRole, SocketSetup};

/// Runs the hook, when there is one, on `socket`.
pub(super) fn set_up(
    setup: Option<&SocketSetup>,
    socket: &Socket,
    role: SocketRole,
) -> io::Result<()> {
    match setup {
        Some(SocketSetup(hook)) => hook(socket, role),
        None => Ok(()),
    }
}

/// A listener with `SO_REUSEADDR` on `addr`, set up by the hook before it is bound.
pub(super) fn listen(addr: SocketAddr, setup: Option<&SocketSetup>) -> io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    set_up(setup, &socket, SocketRole::Listen(addr))?;
    socket.set_reuse_address(true)?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.bind(&addr.into())?;
    socket.listen(128)?;
    let listener: TcpListener = socket.into();
    listener.set_nonblocking(true)?;
    Ok(listener)
}

pub(super) fn unspecified(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    }
}

/// Tunes an established link: no Nagle, keepalive to catch a silent peer.
pub(crate) fn tune(stream: &TcpStream) -> io::Result<()> {
    stream.set_nodelay(true)?;
    let sock = SockRef::from(stream);
    let keepalive = TcpKeepalive::new()
        .with_time(Duration::from_secs(30))
        .with_interval(Duration::from_secs(5));
    #[cfg(any(target_os = "linux", target_os = "android", target_os = "macos"))]
    let keepalive = keepalive.with_retries(4);
    sock.set_tcp_keepalive(&keepalive)?;
    #[cfg(target_vendor = "apple")]
    sock.set_nosigpipe(true)?;
    Ok(())
}

/// Sets the read timeout of `stream` to what is left until `deadline`, at most `cap`.
pub(super) fn read_timeout_until(
    stream: &TcpStream,
    deadline: Instant,
    cap: Duration,
) -> io::Result<()> {
    let left = deadline.saturating_duration_since(Instant::now()).min(cap);
    stream.set_read_timeout(Some(left.max(Duration::from_millis(1))))
}
