//! The accepting side of bootstrap: every connection from a higher rank is handshaken on its
//! own scoped thread, strangers are refused with a reason, and the number of handshakes in
//! flight is bounded.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, mpsc};
use std::time::{Duration, Instant};

use rlx_transport::CollectiveError;

use crate::handshake::{
    self, Expectation, HELLO_LEN, Hello, MAC_LEN, Refusal, RefusalCode, Reply, Side, random_bytes,
};

use super::config::{BootConfig, Link};
use super::socket::read_timeout_until;

/// How long an accepted connection may take to say who it is.
pub(super) const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// Most connections handshaken at once during bootstrap; more are closed at once, so a flood
/// of strangers cannot make a rank start threads without bound.
const MAX_HANDSHAKES: usize = 64;

/// Counts handshakes in flight; dropping the guard ends one.
pub(super) struct InFlight<'a>(&'a AtomicUsize);

impl<'a> InFlight<'a> {
    pub(super) fn enter(counter: &'a AtomicUsize) -> Option<Self> {
        if counter.fetch_add(1, Ordering::SeqCst) >= MAX_HANDSHAKES {
            counter.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        Some(Self(counter))
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

pub(super) fn log_refusal(rank: u32, from: Option<SocketAddr>, refusal: &Refusal) {
    let from = from.map_or_else(|| "an unknown address".to_owned(), |a| a.to_string());
    tracing::warn!(
        rank,
        %from,
        reason = %refusal.reason,
        "refused a connection"
    );
}

/// Accepts `expected` links from higher ranks until `deadline`; strangers are refused.
pub(super) fn accept_all(
    cfg: &BootConfig,
    listeners: &[TcpListener],
    expect: &Expectation<'_>,
    expected: usize,
    deadline: Instant,
    failed: &AtomicBool,
) -> Result<Vec<Link>, CollectiveError> {
    let claimed: Mutex<Vec<(u32, u32)>> = Mutex::new(Vec::new());
    let pending: Mutex<Vec<TcpStream>> = Mutex::new(Vec::new());
    let (tx, rx) = mpsc::channel::<Link>();
    let mut got: Vec<Link> = Vec::new();
    let in_flight = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        let result = loop {
            while let Ok(link) = rx.try_recv() {
                got.push(link);
            }
            if got.len() >= expected {
                break Ok(());
            }
            if failed.load(Ordering::SeqCst) {
                break Err(CollectiveError::config(
                    "bootstrap failed on the connecting side",
                ));
            }
            if Instant::now() >= deadline {
                break Err(CollectiveError::Timeout {
                    peer: None,
                    op: "accept",
                    after: cfg.connect_timeout,
                });
            }
            let mut fds: Vec<libc::pollfd> = listeners
                .iter()
                .map(|l| libc::pollfd {
                    fd: l.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                })
                .collect();
            // SAFETY: `fds` is a valid array of pollfd structures for the duration of the call.
            unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 20) };
            for listener in listeners {
                while let Ok((stream, from)) = listener.accept() {
                    let Some(guard) = InFlight::enter(&in_flight) else {
                        let _ = stream.shutdown(std::net::Shutdown::Both);
                        continue;
                    };
                    if let Ok(clone) = stream.try_clone() {
                        if let Ok(mut p) = pending.lock() {
                            p.push(clone);
                        }
                    }
                    let tx = tx.clone();
                    let claimed = &claimed;
                    scope.spawn(move || {
                        let _guard = guard;
                        match handshake_acceptor(cfg, expect, &stream, claimed, deadline) {
                            Ok((rank, link)) => {
                                let _ = tx.send((rank, link, stream));
                            }
                            Err(refusal) => {
                                // The clone kept for unblocking would hold the connection
                                // open; end it now so the stranger sees the refusal complete.
                                let _ = stream.shutdown(std::net::Shutdown::Both);
                                log_refusal(cfg.rank, Some(from), &refusal);
                            }
                        }
                    });
                }
            }
        };
        // Unblock handshakes still waiting on strangers so the scope can end.
        if let Ok(p) = pending.lock() {
            for s in p.iter() {
                if !got.iter().any(|(_, _, g)| same_socket(g, s)) {
                    let _ = s.shutdown(std::net::Shutdown::Both);
                }
            }
        }
        result
    })?;
    while let Ok(link) = rx.try_recv() {
        got.push(link);
    }
    Ok(got)
}

fn same_socket(a: &TcpStream, b: &TcpStream) -> bool {
    matches!((a.peer_addr(), b.peer_addr(), a.local_addr(), b.local_addr()), (Ok(pa), Ok(pb), Ok(la), Ok(lb)) if pa == pb && la == lb)
}

fn handshake_acceptor(
    cfg: &BootConfig,
    expect: &Expectation<'_>,
    stream: &TcpStream,
    claimed: &Mutex<Vec<(u32, u32)>>,
    deadline: Instant,
) -> Result<(u32, u32), Refusal> {
    let other = |e: io::Error| Refusal::new(RefusalCode::Other, format!("handshake failed: {e}"));
    stream.set_nonblocking(false).map_err(other)?;
    read_timeout_until(stream, deadline, HELLO_TIMEOUT).map_err(other)?;
    let mut s = stream;
    let mut hello_bytes = [0u8; HELLO_LEN];
    s.read_exact(&mut hello_bytes).map_err(other)?;
    let refuse = |refusal: Refusal| {
        let reply = Reply {
            refusal: Some(refusal.clone()),
            rank: cfg.rank,
            world_size: cfg.world,
            nonce: [0; 16],
            mac: [0; MAC_LEN],
        };
        let mut s = stream;
        let _ = s.write_all(&reply.encode());
        refusal
    };
    let hello = Hello::decode(&hello_bytes).map_err(refuse)?;
    handshake::check_hello(&hello, expect).map_err(refuse)?;
    {
        let mut claimed = claimed
            .lock()
            .map_err(|_| Refusal::new(RefusalCode::Other, "lock"))?;
        if claimed.contains(&(hello.rank, hello.link)) {
            return Err(refuse(Refusal::new(
                RefusalCode::Duplicate,
                format!(
                    "duplicate rank {} (link {} is already connected)",
                    hello.rank, hello.link
                ),
            )));
        }
        claimed.push((hello.rank, hello.link));
    }
    let release = |refusal: Refusal| {
        if let Ok(mut c) = claimed.lock() {
            c.retain(|&x| x != (hello.rank, hello.link));
        }
        refusal
    };
    // Without randomness the connection is refused rather than answered with a guessable nonce.
    let nonce = random_bytes::<16>()
        .map_err(|e| release(refuse(Refusal::new(RefusalCode::Other, e.to_string()))))?;
    let mac = cfg.secret.as_deref().map_or([0; MAC_LEN], |secret| {
        handshake::mac(secret, Side::Acceptor, &hello_bytes, &nonce)
    });
    let reply = Reply {
        refusal: None,
        rank: cfg.rank,
        world_size: cfg.world,
        nonce,
        mac,
    };
    s.write_all(&reply.encode())
        .map_err(other)
        .map_err(release)?;
    if let Some(secret) = &cfg.secret {
        let mut theirs = [0u8; MAC_LEN];
        s.read_exact(&mut theirs).map_err(other).map_err(release)?;
        let ok = handshake::verify_mac(secret, Side::Connector, &hello_bytes, &nonce, &theirs);
        let _ = s.write_all(&[u8::from(!ok)]);
        if !ok {
            return Err(release(Refusal::new(
                RefusalCode::Secret,
                format!(
                    "rank {} failed to prove it holds RLX_JOB_SECRET",
                    hello.rank
                ),
            )));
        }
    }
    stream.set_read_timeout(None).map_err(other)?;
    Ok((hello.rank, hello.link))
}
