//! Socket setup for bootstrap: the setup hook, listeners, tuning of established links and
//! read deadlines.

use std::io::{self, Read};
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

/// Runs the hook, when there is one, on a connection accepted from `from`, and says whether
/// to keep it; a refused connection is shut down, and `rank` names who refused it in the log.
pub(super) fn vet_accepted(
    setup: Option<&SocketSetup>,
    rank: u32,
    stream: &TcpStream,
    from: SocketAddr,
) -> bool {
    match set_up(setup, &SockRef::from(stream), SocketRole::Accepted(from)) {
        Ok(()) => true,
        Err(why) => {
            tracing::warn!(rank, %from, %why, "closed an accepted connection the socket setup refused");
            let _ = stream.shutdown(std::net::Shutdown::Both);
            false
        }
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
///
/// Keepalive is only a backstop: the engine's heartbeats notice a silent peer within five
/// beats, idle link or not. `TCP_USER_TIMEOUT` is deliberately not set. Measured in network
/// namespaces with heartbeats off, it does shorten a cut during a transfer (5.3 s with 5 s,
/// against the operation timeout without it) and an idle cut (36 s against 52 s), but never
/// catches a stopped process (its kernel still acknowledges), and Linux also applies it to
/// zero-window probes: with 1 s, a live peer that computed for 3 s while a sender filled its
/// buffers was declared dead after 1.6 s. Any user timeout shorter than the longest
/// computation would break healthy jobs.
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

/// Reads from a stream under one deadline for the whole exchange, however the bytes trickle
/// in: a socket read timeout alone restarts with every byte, so a peer sending one byte a
/// second would never time out.
///
/// An end of the stream in the middle of a read says how far the exchange came ("the
/// connection closed after 30 bytes of its hello"), so that a truncated message is logged as
/// one, not as the standard library's "failed to fill whole buffer".
pub(super) struct Deadline<'a> {
    stream: &'a TcpStream,
    at: Instant,
    /// What the deadline bounds, for the error (`"hello"`, `"registration"`...).
    what: &'static str,
    /// Bytes read so far.
    got: usize,
}

impl<'a> Deadline<'a> {
    /// Reads of `stream` that fail once `at` has passed; `what` names the exchange.
    pub(super) fn new(stream: &'a TcpStream, at: Instant, what: &'static str) -> Self {
        Deadline {
            stream,
            at,
            what,
            got: 0,
        }
    }
}

impl Read for Deadline<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let timed_out = || {
            io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no complete {} before its deadline", self.what),
            )
        };
        let left = self.at.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(timed_out());
        }
        self.stream.set_read_timeout(Some(left))?;
        let mut stream = self.stream;
        match stream.read(buf) {
            Ok(0) if !buf.is_empty() => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "the connection closed after {} bytes of its {}",
                    self.got, self.what
                ),
            )),
            Ok(n) => {
                self.got += n;
                Ok(n)
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                Err(timed_out())
            }
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// A hook that refuses accepted connections from port `refused` and lets every other
    /// socket through.
    fn refusing(refused: u16) -> SocketSetup {
        SocketSetup(Arc::new(
            move |_socket: &Socket, role: SocketRole| match role {
                SocketRole::Accepted(from) if from.port() == refused => Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "came over the wrong interface",
                )),
                _ => Ok(()),
            },
        ))
    }

    #[test]
    fn an_accepted_connection_the_hook_refuses_is_closed_and_others_kept() {
        let listener = listen("127.0.0.1:0".parse().unwrap(), None).unwrap();
        listener.set_nonblocking(false).unwrap();
        let at = listener.local_addr().unwrap();
        let mut refused = TcpStream::connect(at).unwrap();
        let (stream, from) = listener.accept().unwrap();
        let setup = refusing(from.port());
        assert!(!vet_accepted(Some(&setup), 0, &stream, from));
        // The refused side reads the end of the stream, not silence.
        let mut byte = [0u8; 1];
        assert_eq!(refused.read(&mut byte).unwrap(), 0);

        let _kept = TcpStream::connect(at).unwrap();
        let (stream, from) = listener.accept().unwrap();
        assert!(vet_accepted(Some(&setup), 0, &stream, from));
        assert!(vet_accepted(None, 0, &stream, from));
    }
}
