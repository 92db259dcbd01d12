//! The admission desk's wire protocol: how a process that wants to join a running job proves
//! it belongs to it, and how the job's leader tells it its place.
//!
//! The joiner connects to the job's rendezvous address, where the leader listens while it
//! grows its group. Messages, all integers little-endian:
//! 1. joiner → desk: `RLXJOIN1`, the 16-byte job digest, a 16-byte nonce;
//! 2. desk → joiner: `1`, a 16-byte nonce and the desk's 32-byte MAC over the joiner's nonce
//!    (proof that the desk knows the job secret), or a refusal;
//! 3. joiner → desk: its 32-byte MAC over the desk's nonce;
//! 4. desk → joiner, once the members agreed: `2`, rank `u32`, world size `u32`, plan length
//!    `u32` and the plan; or a refusal.
//!
//! A refusal is `0`, a `u16` length and that many bytes of UTF-8 reason. Without a job secret
//! the MACs are zeros and prove nothing, as for the links' handshake. Every length read off
//! the wire is checked against a cap before anything is allocated.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use rlx_transport::{CollectiveError, PendingJoiner, Result};

use crate::auth::{self, MAC_LEN, random_bytes};

/// First bytes of a join request.
pub(crate) const MAGIC: &[u8; 8] = b"RLXJOIN1";
/// The kind byte of a refusal.
pub(crate) const REFUSED: u8 = 0;
/// The kind byte of the desk's challenge.
pub(crate) const CHALLENGE: u8 = 1;
/// The kind byte of an admission.
pub(crate) const ADMITTED: u8 = 2;
/// Longest refusal reason read.
const MAX_REASON: usize = 512;
/// Largest plan accepted from a desk.
pub(crate) const MAX_PLAN: usize = 4096;
/// How long the desk gives one connection to prove itself, so that a silent stranger never
/// holds the desk up for long.
const PROOF_DEADLINE: Duration = Duration::from_secs(2);

/// The job a desk or joiner speaks for.
#[derive(Clone)]
pub(crate) struct Credentials {
    pub(crate) job: [u8; 16],
    pub(crate) secret: Option<Vec<u8>>,
}

impl Credentials {
    fn mac(&self, label: &[u8], nonce: &[u8; 16]) -> [u8; MAC_LEN] {
        match &self.secret {
            Some(secret) => auth::mac(secret, &[label, &self.job, nonce]),
            None => [0; MAC_LEN],
        }
    }

    fn verify(&self, label: &[u8], nonce: &[u8; 16], tag: &[u8; MAC_LEN]) -> bool {
        match &self.secret {
            Some(secret) => auth::verify(secret, &[label, &self.job, nonce], tag),
            None => true,
        }
    }
}

const DESK_LABEL: &[u8] = b"rlx-desk";
const JOINER_LABEL: &[u8] = b"rlx-joiner";

fn refuse(stream: &mut impl Write, reason: &str) {
    let reason = &reason.as_bytes()[..reason.len().min(MAX_REASON)];
    let mut out = vec![REFUSED];
    out.extend_from_slice(&(reason.len() as u16).to_le_bytes());
    out.extend_from_slice(reason);
    // The stranger is being sent away; whether it hears why is its business.
    let _ = stream.write_all(&out);
}

fn read_refusal(stream: &mut impl Read) -> String {
    let mut len = [0u8; 2];
    if stream.read_exact(&mut len).is_err() {
        return "no reason given".to_owned();
    }
    let len = usize::from(u16::from_le_bytes(len)).min(MAX_REASON);
    let mut reason = vec![0u8; len];
    match stream.read_exact(&mut reason) {
        Ok(()) => String::from_utf8_lossy(&reason).into_owned(),
        Err(_) => "a truncated reason".to_owned(),
    }
}

/// A joiner that proved it belongs to the job and waits for its place.
pub(super) struct Pending {
    stream: TcpStream,
    from: SocketAddr,
}

impl PendingJoiner for Pending {
    fn admit(mut self: Box<Self>, rank: u32, size: u32, plan: &[u8]) -> Result<()> {
        let mut out = vec![ADMITTED];
        out.extend_from_slice(&rank.to_le_bytes());
        out.extend_from_slice(&size.to_le_bytes());
        out.extend_from_slice(&(plan.len() as u32).to_le_bytes());
        out.extend_from_slice(plan);
        self.stream
            .write_all(&out)
            .map_err(|source| CollectiveError::Io {
                peer: None,
                source: io::Error::new(
                    source.kind(),
                    format!("telling joiner {} its place: {source}", self.from),
                ),
            })
    }

    fn describe(&self) -> String {
        format!("joiner at {}", self.from)
    }
}

/// On the leader: accepts joiners on `listener` until `count` proved themselves or
/// `deadline` passes (`Timeout`). Strangers are refused with a reason and logged.
pub(super) fn accept_joiners(
    listener: &TcpListener,
    credentials: &Credentials,
    count: u32,
    deadline: Instant,
    waited: Duration,
) -> Result<Vec<Box<dyn PendingJoiner>>> {
    listener
        .set_nonblocking(true)
        .map_err(|source| CollectiveError::Io { peer: None, source })?;
    let mut admitted: Vec<Box<dyn PendingJoiner>> = Vec::new();
    while admitted.len() < count as usize {
        if Instant::now() >= deadline {
            return Err(CollectiveError::Timeout {
                peer: None,
                op: "grow (waiting for joiners at the rendezvous address)",
                after: waited,
            });
        }
        match listener.accept() {
            Ok((stream, from)) => match prove(stream, from, credentials) {
                Ok(pending) => {
                    tracing::info!(%from, "admission: a joiner proved itself");
                    admitted.push(Box::new(pending));
                }
                Err(why) => tracing::warn!(%from, %why, "admission: refused a connection"),
            },
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(source) => return Err(CollectiveError::Io { peer: None, source }),
        }
    }
    Ok(admitted)
}

/// The desk's side of steps 1-3 with one connection.
fn prove(
    mut stream: TcpStream,
    from: SocketAddr,
    credentials: &Credentials,
) -> std::result::Result<Pending, String> {
    stream
        .set_nonblocking(false)
        .and_then(|()| stream.set_read_timeout(Some(PROOF_DEADLINE)))
        .and_then(|()| stream.set_nodelay(true))
        .map_err(|e| format!("socket setup: {e}"))?;
    prove_on(&mut stream, credentials)?;
    stream
        .set_read_timeout(None)
        .map_err(|e| format!("socket setup: {e}"))?;
    Ok(Pending { stream, from })
}

/// Steps 1-3 of the desk's side on `stream`, whatever carries it: `Ok` once the joiner proved
/// it belongs to the job, else why not (the joiner has been told).
pub(crate) fn prove_on(
    stream: &mut (impl Read + Write),
    credentials: &Credentials,
) -> std::result::Result<(), String> {
    let mut hello = [0u8; 40];
    stream
        .read_exact(&mut hello)
        .map_err(|e| format!("no join request within {PROOF_DEADLINE:?}: {e}"))?;
    if &hello[..8] != MAGIC {
        refuse(stream, "not an RLX join request");
        return Err("not an RLX join request".to_owned());
    }
    if hello[8..24] != credentials.job {
        refuse(stream, "a joiner of another job (its job id differs)");
        return Err("a joiner of another job".to_owned());
    }
    let mut their_nonce = [0u8; 16];
    their_nonce.copy_from_slice(&hello[24..40]);
    let nonce: [u8; 16] = random_bytes().map_err(|e| e.to_string())?;
    let mut challenge = vec![CHALLENGE];
    challenge.extend_from_slice(&nonce);
    challenge.extend_from_slice(&credentials.mac(DESK_LABEL, &their_nonce));
    stream
        .write_all(&challenge)
        .map_err(|e| format!("sending the challenge: {e}"))?;
    let mut proof = [0u8; MAC_LEN];
    stream
        .read_exact(&mut proof)
        .map_err(|e| format!("no proof within {PROOF_DEADLINE:?}: {e}"))?;
    if !credentials.verify(JOINER_LABEL, &nonce, &proof) {
        refuse(stream, "authentication failed (RLX_JOB_SECRET differs)");
        return Err("authentication failed (wrong or missing RLX_JOB_SECRET)".to_owned());
    }
    Ok(())
}

/// What a joiner is told by the desk that admits it.
#[derive(Debug)]
pub(crate) struct Place {
    pub(crate) rank: u32,
    pub(crate) size: u32,
    pub(crate) plan: Vec<u8>,
}

/// A joiner's failed read or write `what` with the desk at `addr`.
fn join_io_error(addr: SocketAddr, what: &str, e: io::Error) -> CollectiveError {
    CollectiveError::Io {
        peer: None,
        source: io::Error::new(e.kind(), format!("joining at {addr}: {what}: {e}")),
    }
}

/// On the joiner: connects to the desk at `addr` (trying again until `deadline`, since the
/// members may not be growing yet), proves itself and waits until `deadline` for its place.
pub(super) fn join(
    addr: SocketAddr,
    credentials: &Credentials,
    deadline: Instant,
) -> Result<Place> {
    let timeout = |what: &'static str| CollectiveError::Timeout {
        peer: None,
        op: what,
        after: deadline.saturating_duration_since(Instant::now()),
    };
    let mut stream = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(timeout("join (connecting to the job's rendezvous address)"));
        }
        match TcpStream::connect_timeout(&addr, left.min(Duration::from_secs(1))) {
            Ok(stream) => break stream,
            Err(_) => std::thread::sleep(Duration::from_millis(50).min(left)),
        }
    };
    let io_err = |what: &str, e: io::Error| join_io_error(addr, what, e);
    stream
        .set_nodelay(true)
        .map_err(|e| io_err("socket setup", e))?;
    // The deadline bounds every read of the exchange from here on.
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    stream
        .set_read_timeout(Some(left))
        .map_err(|e| io_err("socket setup", e))?;
    join_on(&mut stream, addr, credentials)
}

/// Steps 1-4 of the joiner's side with the desk at `addr` on `stream`, whatever carries it:
/// the place the desk gave, or why it gave none.
pub(crate) fn join_on(
    stream: &mut (impl Read + Write),
    addr: SocketAddr,
    credentials: &Credentials,
) -> Result<Place> {
    let io_err = |what: &str, e: io::Error| join_io_error(addr, what, e);
    let nonce: [u8; 16] = random_bytes()?;
    let mut hello = Vec::with_capacity(40);
    hello.extend_from_slice(MAGIC);
    hello.extend_from_slice(&credentials.job);
    hello.extend_from_slice(&nonce);
    stream
        .write_all(&hello)
        .map_err(|e| io_err("sending the request", e))?;
    let refused = |reason: String| {
        CollectiveError::config(format!(
            "the job at {addr} refused to admit this process: {reason}"
        ))
    };
    let mut kind = [0u8; 1];
    stream
        .read_exact(&mut kind)
        .map_err(|e| io_err("reading the challenge", e))?;
    match kind[0] {
        CHALLENGE => {}
        REFUSED => return Err(refused(read_refusal(stream))),
        other => {
            return Err(CollectiveError::protocol(
                None,
                format!("the desk at {addr} answered with kind {other}"),
            ));
        }
    }
    let mut challenge = [0u8; 16 + MAC_LEN];
    stream
        .read_exact(&mut challenge)
        .map_err(|e| io_err("reading the challenge", e))?;
    let mut their_nonce = [0u8; 16];
    their_nonce.copy_from_slice(&challenge[..16]);
    let mut their_mac = [0u8; MAC_LEN];
    their_mac.copy_from_slice(&challenge[16..]);
    if !credentials.verify(DESK_LABEL, &nonce, &their_mac) {
        return Err(CollectiveError::config(format!(
            "the process at {addr} did not prove the job secret (RLX_JOB_SECRET differs)"
        )));
    }
    stream
        .write_all(&credentials.mac(JOINER_LABEL, &their_nonce))
        .map_err(|e| io_err("sending the proof", e))?;
    stream
        .read_exact(&mut kind)
        .map_err(|e| io_err("waiting for admission", e))?;
    match kind[0] {
        ADMITTED => {}
        REFUSED => return Err(refused(read_refusal(stream))),
        other => {
            return Err(CollectiveError::protocol(
                None,
                format!("the desk at {addr} answered with kind {other}"),
            ));
        }
    }
    let mut head = [0u8; 12];
    stream
        .read_exact(&mut head)
        .map_err(|e| io_err("reading the admission", e))?;
    let word = |i: usize| u32::from_le_bytes([head[i], head[i + 1], head[i + 2], head[i + 3]]);
    let (rank, size, len) = (word(0), word(4), word(8) as usize);
    if len > MAX_PLAN || rank >= size {
        return Err(CollectiveError::protocol(
            None,
            format!("the desk at {addr} gave rank {rank} of {size} and a plan of {len} bytes"),
        ));
    }
    let mut plan = vec![0u8; len];
    stream
        .read_exact(&mut plan)
        .map_err(|e| io_err("reading the plan", e))?;
    Ok(Place { rank, size, plan })
}
