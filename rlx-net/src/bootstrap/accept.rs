//! The accepting side of bootstrap: every connection from a higher rank is handshaken on its
//! own scoped thread under a deadline of its own, strangers are refused with a reason, and the
//! handshakes in flight hold bounded, recycled slots (see `slots.rs`).

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, mpsc};
use std::time::Instant;

use rlx_transport::CollectiveError;

use crate::auth::{MAC_LEN, random_bytes};
use crate::handshake::{
    self, Expectation, HELLO_LEN, Hello, Refusal, RefusalCode, Reply, Side, VERDICT_BAD_PROOF,
    VERDICT_DUPLICATE, VERDICT_OK,
};

use super::config::{BootConfig, Link};
use super::slots::{Slot, Slots};
use super::socket::{Deadline, vet_accepted};

pub(super) fn log_refusal(rank: u32, from: Option<SocketAddr>, refusal: &Refusal) {
    let from = from.map_or_else(|| "an unknown address".to_owned(), |a| a.to_string());
    tracing::warn!(
        rank,
        %from,
        reason = %refusal.reason,
        "refused a connection"
    );
}

/// The timeout of bootstrap operation `op` on `rank` that waited `after` for the ranks in
/// `missing`: it names the missing rank when there is exactly one, and logs them all.
pub(super) fn missing_ranks_timeout(
    rank: u32,
    op: &'static str,
    after: std::time::Duration,
    missing: &[u32],
) -> CollectiveError {
    tracing::warn!(rank, op, ?after, ?missing, "gave up waiting for ranks");
    CollectiveError::Timeout {
        peer: match missing {
            [only] => Some(*only),
            _ => None,
        },
        op,
        after,
    }
}

/// The reply that refuses a connection to the link listener of `cfg`'s rank with `refusal`.
fn refusal_reply(cfg: &BootConfig, refusal: Refusal) -> Vec<u8> {
    Reply {
        refusal: Some(refusal),
        rank: cfg.rank,
        world_size: cfg.world,
        nonce: [0; 16],
        mac: [0; MAC_LEN],
    }
    .encode()
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
    let (tx, rx) = mpsc::channel::<Link>();
    let mut got: Vec<Link> = Vec::new();
    let busy_cfg = cfg.clone();
    let slots = Slots::new(
        cfg.rank,
        "link listener",
        Box::new(move |reason| refusal_reply(&busy_cfg, Refusal::new(RefusalCode::Busy, reason))),
    );
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
                let missing: Vec<u32> = (cfg.rank + 1..cfg.world)
                    .filter(|&r| {
                        got.iter().filter(|(peer, ..)| *peer == r).count() < cfg.links as usize
                    })
                    .collect();
                break Err(missing_ranks_timeout(
                    cfg.rank,
                    "accept",
                    cfg.connect_timeout,
                    &missing,
                ));
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
                    if !vet_accepted(cfg.socket_setup.as_ref(), cfg.rank, &stream, from) {
                        continue;
                    }
                    let Some(slot) = slots.admit(&stream, from) else {
                        continue;
                    };
                    let tx = tx.clone();
                    let claimed = &claimed;
                    scope.spawn(move || {
                        let accepted = Accepted { stream, from, slot };
                        accept_one(cfg, expect, accepted, claimed, deadline, &tx);
                    });
                }
            }
        };
        // Unblock handshakes still waiting on strangers so the scope can end.
        slots.close_all();
        result
    })?;
    while let Ok(link) = rx.try_recv() {
        got.push(link);
    }
    Ok(got)
}

/// A connection a link listener accepted, with its handshake slot.
struct Accepted<'a> {
    stream: TcpStream,
    from: SocketAddr,
    slot: Slot<'a>,
}

/// Runs the handshake on one accepted connection (bounded by the hello timeout and
/// `deadline`) and hands the link to `tx`, or closes the connection and logs its refusal.
fn accept_one(
    cfg: &BootConfig,
    expect: &Expectation<'_>,
    accepted: Accepted<'_>,
    claimed: &Mutex<Vec<(u32, u32)>>,
    deadline: Instant,
    tx: &mpsc::Sender<Link>,
) {
    let Accepted { stream, from, slot } = accepted;
    let until = deadline.min(Instant::now() + cfg.hello_timeout);
    match handshake_acceptor(cfg, expect, &stream, claimed, until, &slot) {
        Ok((rank, link)) => {
            // The slot goes first, so that closing the connections still in the handshake
            // never closes a link already handed over.
            drop(slot);
            let _ = tx.send((rank, link, stream));
        }
        Err(refusal) => {
            let _ = stream.shutdown(std::net::Shutdown::Both);
            log_refusal(cfg.rank, Some(from), &refusal);
        }
    }
}

/// The claims of the links accepted so far, as (rank, link): one connection per pair.
struct Claim<'a> {
    claimed: &'a Mutex<Vec<(u32, u32)>>,
    me: (u32, u32),
}

impl Claim<'_> {
    /// Claims the connector's rank and link, or refuses a duplicate.
    fn take(&self) -> Result<(), Refusal> {
        let mut claimed = self
            .claimed
            .lock()
            .map_err(|_| Refusal::new(RefusalCode::Other, "lock"))?;
        if claimed.contains(&self.me) {
            return Err(Refusal::new(
                RefusalCode::Duplicate,
                format!(
                    "duplicate rank {} (link {} is already connected)",
                    self.me.0, self.me.1
                ),
            ));
        }
        claimed.push(self.me);
        Ok(())
    }

    /// Gives the claim up for `refusal`, which it passes on.
    fn release(&self, refusal: Refusal) -> Refusal {
        if let Ok(mut c) = self.claimed.lock() {
            c.retain(|&x| x != self.me);
        }
        refusal
    }
}

/// The acceptor's half of the handshake on `stream`, which must end by `until`; returns the
/// connector's rank and link, or the refusal it was answered with.
fn handshake_acceptor(
    cfg: &BootConfig,
    expect: &Expectation<'_>,
    stream: &TcpStream,
    claimed: &Mutex<Vec<(u32, u32)>>,
    until: Instant,
    slot: &Slot<'_>,
) -> Result<(u32, u32), Refusal> {
    let other = |e: io::Error| Refusal::new(RefusalCode::Other, format!("handshake failed: {e}"));
    stream.set_nonblocking(false).map_err(other)?;
    stream
        .set_write_timeout(Some(cfg.hello_timeout))
        .map_err(other)?;
    let mut from = Deadline::new(stream, until, "hello");
    let mut hello_bytes = [0u8; HELLO_LEN];
    from.read_exact(&mut hello_bytes).map_err(other)?;
    let refuse = |refusal: Refusal| {
        let mut s = stream;
        let _ = s.write_all(&refusal_reply(cfg, refusal.clone()));
        refusal
    };
    let hello = Hello::decode(&hello_bytes).map_err(refuse)?;
    handshake::check_hello(&hello, expect).map_err(refuse)?;
    // A rank sends its hello at once: from here on the connection is no stranger's to evict
    // (its deadline still bounds it). One evicted meanwhile was told so and retries.
    if !slot.identified() {
        return Err(Refusal::new(
            RefusalCode::Busy,
            "evicted before its hello was checked",
        ));
    }
    let claim = Claim {
        claimed,
        me: (hello.rank, hello.link),
    };
    let release = |refusal: Refusal| claim.release(refusal);
    // Without a secret the hello is all there is to go by. With one, the rank and link are
    // claimed only once the connector proved it holds the secret, so that a stranger who
    // knows the job id cannot take a rank's place and have the real rank refused.
    if cfg.secret.is_none() {
        claim.take().map_err(refuse)?;
    }
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
    let mut s = stream;
    s.write_all(&reply.encode())
        .map_err(other)
        .map_err(release)?;
    if let Some(secret) = &cfg.secret {
        let proof = Proof {
            secret,
            hello: &hello_bytes,
            nonce: &nonce,
        };
        proof.check(&mut from, stream, &claim, hello.rank)?;
    }
    stream
        .set_read_timeout(None)
        .map_err(other)
        .map_err(release)?;
    stream
        .set_write_timeout(None)
        .map_err(other)
        .map_err(release)?;
    Ok(claim.me)
}

/// What the connector must prove it holds the job secret for: its hello and this side's
/// nonce.
struct Proof<'a> {
    secret: &'a [u8],
    hello: &'a [u8; HELLO_LEN],
    nonce: &'a [u8; 16],
}

impl Proof<'_> {
    /// Reads the connector's MAC from `from`, checks it, claims the link only then (so that a
    /// stranger who knows the job id cannot take a rank's place) and answers the verdict.
    fn check(
        &self,
        from: &mut impl Read,
        stream: &TcpStream,
        claim: &Claim<'_>,
        rank: u32,
    ) -> Result<(), Refusal> {
        let other =
            |e: io::Error| Refusal::new(RefusalCode::Other, format!("handshake failed: {e}"));
        let mut s = stream;
        let mut theirs = [0u8; MAC_LEN];
        from.read_exact(&mut theirs).map_err(other)?;
        if !handshake::verify_mac(
            self.secret,
            Side::Connector,
            self.hello,
            self.nonce,
            &theirs,
        ) {
            let _ = s.write_all(&[VERDICT_BAD_PROOF]);
            return Err(Refusal::new(
                RefusalCode::Secret,
                format!("rank {rank} failed to prove it holds RLX_JOB_SECRET"),
            ));
        }
        if let Err(refusal) = claim.take() {
            let _ = s.write_all(&[VERDICT_DUPLICATE]);
            return Err(refusal);
        }
        s.write_all(&[VERDICT_OK])
            .map_err(other)
            .map_err(|r| claim.release(r))
    }
}
