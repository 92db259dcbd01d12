//! The connecting side of bootstrap: reaching every lower rank with backoff until the
//! deadline, and the connector's half of the handshake on each link.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use rlx_transport::CollectiveError;
use socket2::{Domain, Protocol, Socket, Type};

use crate::auth::random_bytes;
use crate::handshake::{
    self, Hello, PROTOCOL_VERSION, REPLY_LEN, RefusalCode, Reply, Side, VERDICT_DUPLICATE,
    VERDICT_OK,
};

use super::config::{BootConfig, Link, SocketRole};
use super::socket::{Deadline, set_up};

/// First and largest pause between connection attempts.
const BACKOFF_MIN: Duration = Duration::from_millis(10);
const BACKOFF_MAX: Duration = Duration::from_millis(500);

/// Connects to every lower rank, each link with retries until `deadline`.
pub(super) fn connect_all(
    cfg: &BootConfig,
    table: &[Vec<SocketAddr>],
    instance: u64,
    deadline: Instant,
) -> Result<Vec<Link>, CollectiveError> {
    let mut out = Vec::new();
    for peer in 0..cfg.rank {
        let addrs = &table[peer as usize];
        for link in 0..cfg.links {
            let addr = addrs[link as usize % addrs.len()];
            let mut pause = BACKOFF_MIN;
            let stream = loop {
                let stream = connect_retrying(cfg, peer, addr, deadline, cfg.connect_timeout)?;
                if handshake_connector(cfg, peer, link, instance, &stream, deadline)? {
                    break stream;
                }
                // The listener had no room (strangers hold its handshake slots): try again.
                backoff(&mut pause, deadline);
            };
            out.push((peer, link, stream));
        }
    }
    Ok(out)
}

/// Sleeps `pause` (never past `deadline`) and doubles it, up to [`BACKOFF_MAX`].
pub(super) fn backoff(pause: &mut Duration, deadline: Instant) {
    std::thread::sleep((*pause).min(deadline.saturating_duration_since(Instant::now())));
    *pause = (*pause * 2).min(BACKOFF_MAX);
}

/// The text of an I/O error `e` met while talking to `whom`: an early end of the connection
/// says so, instead of the standard library's "failed to fill whole buffer".
pub(super) fn io_text(whom: &str, e: &io::Error) -> String {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        format!(
            "{whom} closed the connection without an answer (it ended, or refused the \
             connection without saying why)"
        )
    } else {
        format!("{whom}: {e}")
    }
}

/// An attempt to reach `peer` at `addr` that failed for good.
fn connect_error(peer: u32, addr: SocketAddr, what: &str, e: io::Error) -> CollectiveError {
    CollectiveError::Io {
        peer: Some(peer),
        source: io::Error::new(e.kind(), format!("{what} rank {peer} at {addr}: {e}")),
    }
}

/// Connects to `addr` with a fresh socket per attempt (set up by the hook first) until
/// `deadline`; a refusal by the hook ends the attempts at once.
pub(super) fn connect_retrying(
    cfg: &BootConfig,
    peer: u32,
    addr: SocketAddr,
    deadline: Instant,
    after: Duration,
) -> Result<TcpStream, CollectiveError> {
    let mut pause = BACKOFF_MIN;
    loop {
        let now = Instant::now();
        let left = deadline.saturating_duration_since(now);
        if left.is_zero() {
            tracing::warn!(peer, %addr, ?after, "gave up connecting");
            return Err(CollectiveError::Timeout {
                peer: Some(peer),
                op: "connect",
                after,
            });
        }
        let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))
            .map_err(|e| connect_error(peer, addr, "creating a socket for", e))?;
        set_up(
            cfg.socket_setup.as_ref(),
            &socket,
            SocketRole::Connect(addr),
        )
        .map_err(|e| connect_error(peer, addr, "setting up the socket to", e))?;
        match socket.connect_timeout(&addr.into(), left.min(Duration::from_secs(5))) {
            Ok(()) => return Ok(socket.into()),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionRefused
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::ConnectionReset
                        | io::ErrorKind::ConnectionAborted
                        | io::ErrorKind::AddrNotAvailable
                        | io::ErrorKind::Interrupted
                ) =>
            {
                tracing::trace!(peer, %addr, error = %e, ?pause, "connect failed; retrying");
                backoff(&mut pause, deadline);
            }
            Err(e) => {
                return Err(CollectiveError::Io {
                    peer: Some(peer),
                    source: io::Error::new(
                        e.kind(),
                        format!("connecting to rank {peer} at {addr}: {e}"),
                    ),
                });
            }
        }
    }
}

/// A failed read or write of the handshake with `peer` at `addr`.
fn handshake_io_error(peer: u32, addr: &str, e: io::Error) -> CollectiveError {
    CollectiveError::Io {
        peer: Some(peer),
        source: io::Error::new(
            e.kind(),
            io_text(&format!("handshake with rank {peer} at {addr}"), &e),
        ),
    }
}

/// The connector's half of the handshake on `stream` to `peer`: `Ok(true)` once the link is
/// established, `Ok(false)` when the listener had no room and the caller should retry.
fn handshake_connector(
    cfg: &BootConfig,
    peer: u32,
    link: u32,
    instance: u64,
    stream: &TcpStream,
    deadline: Instant,
) -> Result<bool, CollectiveError> {
    let addr = stream
        .peer_addr()
        .map_or_else(|_| "?".to_owned(), |a| a.to_string());
    let io_peer = |e: io::Error| handshake_io_error(peer, &addr, e);
    let hello = Hello {
        version: PROTOCOL_VERSION,
        has_secret: cfg.secret.is_some(),
        job: cfg.job,
        world_size: cfg.world,
        rank: cfg.rank,
        link,
        links: cfg.links,
        instance,
        nonce: random_bytes::<16>()?,
    };
    let hello_bytes = hello.encode();
    let mut s = stream;
    stream
        .set_write_timeout(Some(cfg.hello_timeout))
        .map_err(io_peer)?;
    s.write_all(&hello_bytes).map_err(io_peer)?;
    let mut answer = Deadline::new(
        stream,
        deadline.min(Instant::now() + cfg.hello_timeout),
        "handshake reply",
    );
    if !connector_exchange(cfg, peer, link, &addr, &hello_bytes, &mut answer, &mut s)? {
        return Ok(false);
    }
    stream.set_read_timeout(None).map_err(io_peer)?;
    stream.set_write_timeout(None).map_err(io_peer)?;
    Ok(true)
}

/// The connector's half of the handshake after its hello (`hello_bytes`) went to `peer` at
/// `addr`: reads the reply `from` the acceptor, answers the challenge `to` it when there is a
/// secret, and reads the verdict. `Ok(true)` once the link is established, `Ok(false)` when
/// the listener had no room; every length read is checked before it is allocated.
pub(crate) fn connector_exchange(
    cfg: &BootConfig,
    peer: u32,
    link: u32,
    addr: &str,
    hello_bytes: &[u8; handshake::HELLO_LEN],
    from: &mut impl Read,
    to: &mut impl Write,
) -> Result<bool, CollectiveError> {
    let io_peer = |e: io::Error| handshake_io_error(peer, addr, e);
    let mut fixed = [0u8; REPLY_LEN];
    from.read_exact(&mut fixed).map_err(io_peer)?;
    let (reply, reason_len) = Reply::decode(peer, &fixed)?;
    let mut reason = vec![0u8; reason_len];
    from.read_exact(&mut reason).map_err(io_peer)?;
    if let Some(refusal) = reply.refusal {
        let reason = String::from_utf8_lossy(&reason);
        if refusal.code == RefusalCode::Busy {
            tracing::info!(peer, %addr, %reason, "the listener had no room; retrying");
            return Ok(false);
        }
        return Err(CollectiveError::config(format!(
            "rank {peer} at {addr} refused rank {}'s connection (code {:?}): {reason}",
            cfg.rank, refusal.code
        )));
    }
    if reply.rank != peer || reply.world_size != cfg.world {
        return Err(CollectiveError::protocol(
            Some(peer),
            format!(
                "expected rank {peer} of {} at this address, found rank {} of {}",
                cfg.world, reply.rank, reply.world_size
            ),
        ));
    }
    if let Some(secret) = &cfg.secret {
        let proven = handshake::verify_mac(
            secret,
            Side::Acceptor,
            hello_bytes,
            &reply.nonce,
            &reply.mac,
        );
        // Answer even when the acceptor's proof failed, so that its side can report the
        // mismatch too.
        let mine = handshake::mac(secret, Side::Connector, hello_bytes, &reply.nonce);
        to.write_all(&mine).map_err(io_peer)?;
        let mut verdict = [0u8; 1];
        let answered = from.read_exact(&mut verdict);
        if !proven {
            return Err(CollectiveError::protocol(
                Some(peer),
                format!("rank {peer} failed to prove it holds RLX_JOB_SECRET (the secrets differ)"),
            ));
        }
        answered.map_err(io_peer)?;
        match verdict[0] {
            VERDICT_OK => {}
            VERDICT_DUPLICATE => {
                return Err(CollectiveError::config(format!(
                    "rank {peer} at {addr} refused rank {}'s link {link}: another connection \
                     holds it already (a duplicate rank)",
                    cfg.rank
                )));
            }
            _ => {
                return Err(CollectiveError::config(format!(
                    "rank {peer} at {addr} refused rank {}'s proof of RLX_JOB_SECRET (the \
                     secrets differ)",
                    cfg.rank
                )));
            }
        }
    }
    Ok(true)
}
