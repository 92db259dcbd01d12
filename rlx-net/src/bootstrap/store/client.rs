//! The store's client: a rank other than 0 registers, proves the job secret when there is one
//! (and checks the store's proof), and waits for the table.

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rlx_transport::CollectiveError;

use crate::auth::{MAC_LEN, NONCE_LEN, random_bytes};
use crate::handshake::{self, RefusalCode};

use super::wire::{
    Registration, STATUS_CHALLENGE, STATUS_TABLE, STORE_MAGIC, encode_registration, rank_mac,
    read_reachability, read_u32, read_u64, verify_store_mac,
};
use crate::bootstrap::config::BootConfig;
use crate::bootstrap::connect::{backoff, connect_retrying, io_text};

/// A rank other than 0: registers with the store and waits for the table, connecting again
/// when the store had no room for the connection.
pub(in crate::bootstrap) fn register(
    cfg: &BootConfig,
    master: &[SocketAddr],
    me: &Registration,
    deadline: Instant,
) -> Result<Vec<Registration>, CollectiveError> {
    let mut pause = Duration::from_millis(10);
    loop {
        if let Some(table) = register_once(cfg, master[0], me, deadline)? {
            return Ok(table);
        }
        backoff(&mut pause, deadline);
    }
}

/// One registration with the store at `addr`: the table, or `None` when the store had no
/// room for this connection.
fn register_once(
    cfg: &BootConfig,
    addr: SocketAddr,
    me: &Registration,
    deadline: Instant,
) -> Result<Option<Vec<Registration>>, CollectiveError> {
    let stream = connect_retrying(cfg, 0, addr, deadline, cfg.connect_timeout)?;
    let whom = format!(
        "the rendezvous store at {addr} (rank 0), registering rank {}",
        cfg.rank
    );
    let io0 = |e: io::Error| CollectiveError::Io {
        peer: Some(0),
        source: io::Error::new(e.kind(), io_text(&whom, &e)),
    };
    stream
        .set_read_timeout(Some(
            deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1)),
        ))
        .map_err(&io0)?;
    let nonce = random_bytes::<NONCE_LEN>()?;
    exchange(&mut &stream, cfg, me, &nonce, addr, io0)
}

/// The registration of `cfg`'s rank with the store at `addr` over `s`, with this rank's
/// `nonce`: proves the job secret when there is one and checks the store's proof, then reads
/// the table (`None` when the store had no room). `io0` names the store in I/O errors. Runs
/// on any stream, so that it can be driven without a socket.
pub(crate) fn exchange<S: Read + Write>(
    s: &mut S,
    cfg: &BootConfig,
    me: &Registration,
    nonce: &[u8; NONCE_LEN],
    addr: SocketAddr,
    io0: impl Fn(io::Error) -> CollectiveError,
) -> Result<Option<Vec<Registration>>, CollectiveError> {
    let registration = encode_registration(cfg, me, nonce);
    s.write_all(&registration).map_err(&io0)?;
    let status = read_status(s, addr, &io0)?;
    let status = match (&cfg.secret, status) {
        (Some(secret), STATUS_CHALLENGE) => {
            prove_secret(s, cfg, secret, &registration, addr, &io0)?;
            read_status(s, addr, &io0)?
        }
        (None, STATUS_CHALLENGE) => {
            return Err(CollectiveError::config(format!(
                "the rendezvous store at {addr} asks rank {} to prove RLX_JOB_SECRET, which \
                 is not set on this rank",
                cfg.rank
            )));
        }
        (Some(_), STATUS_TABLE) => {
            return Err(CollectiveError::protocol(
                Some(0),
                format!(
                    "the rendezvous store at {addr} sent its table without proving it holds \
                     RLX_JOB_SECRET"
                ),
            ));
        }
        (_, status) => status,
    };
    read_answer(s, cfg, status, addr, &io0)
}

/// The magic and status of a store's answer.
fn read_status(
    s: &mut impl Read,
    addr: SocketAddr,
    io0: &impl Fn(io::Error) -> CollectiveError,
) -> Result<u32, CollectiveError> {
    let mut magic = [0u8; 8];
    s.read_exact(&mut magic).map_err(io0)?;
    if magic != STORE_MAGIC {
        return Err(CollectiveError::protocol(
            Some(0),
            format!("{addr} is not an RLX rendezvous store (wrong magic)"),
        ));
    }
    read_u32(s).map_err(io0)
}

/// Answers the store's challenge: checks its proof of `secret` over this rank's
/// `registration`, and sends this rank's own proof whatever the check said, so that the
/// store can report a mismatch too.
fn prove_secret<S: Read + Write>(
    s: &mut S,
    cfg: &BootConfig,
    secret: &[u8],
    registration: &[u8],
    addr: SocketAddr,
    io0: &impl Fn(io::Error) -> CollectiveError,
) -> Result<(), CollectiveError> {
    let mut their_nonce = [0u8; NONCE_LEN];
    s.read_exact(&mut their_nonce).map_err(io0)?;
    let mut their_mac = [0u8; MAC_LEN];
    s.read_exact(&mut their_mac).map_err(io0)?;
    let proven = verify_store_mac(secret, registration, &their_nonce, &their_mac);
    s.write_all(&rank_mac(secret, registration, &their_nonce))
        .map_err(io0)?;
    if !proven {
        return Err(CollectiveError::config(format!(
            "the rendezvous store at {addr} failed to prove it holds RLX_JOB_SECRET (the \
             secrets differ); rank {} did not register with it",
            cfg.rank
        )));
    }
    Ok(())
}

/// The rest of the store's answer of `status`: the table, or the reason of a refusal
/// (`None` when the store had no room).
fn read_answer(
    s: &mut impl Read,
    cfg: &BootConfig,
    status: u32,
    addr: SocketAddr,
    io0: &impl Fn(io::Error) -> CollectiveError,
) -> Result<Option<Vec<Registration>>, CollectiveError> {
    let count = read_u32(s).map_err(io0)?;
    if status != STATUS_TABLE {
        let len = (count as usize).min(handshake::MAX_REASON);
        let mut reason = vec![0u8; len];
        s.read_exact(&mut reason).map_err(io0)?;
        let reason = String::from_utf8_lossy(&reason);
        if status == RefusalCode::Busy as u32 {
            tracing::info!(%addr, %reason, "the rendezvous store had no room; retrying");
            return Ok(None);
        }
        return Err(CollectiveError::config(format!(
            "the rendezvous store at {addr} refused rank {}: {reason}",
            cfg.rank
        )));
    }
    if count != cfg.world {
        return Err(CollectiveError::protocol(
            Some(0),
            format!(
                "store table lists {count} ranks for a world of {}",
                cfg.world
            ),
        ));
    }
    let mut table = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let instance = read_u64(s).map_err(io0)?;
        let reach = read_reachability(s).map_err(io0)?;
        table.push(Registration {
            instance,
            addrs: reach.addrs,
            networks: reach.networks,
            listens_everywhere: reach.listens_everywhere,
        });
    }
    Ok(Some(table))
}
