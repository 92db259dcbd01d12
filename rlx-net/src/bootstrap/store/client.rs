//! The store's client: a rank other than 0 registers and waits for the table.

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rlx_transport::CollectiveError;

use crate::handshake::{self, RefusalCode};

use super::wire::{Registration, STORE_MAGIC, encode_registration, read_addrs, read_u32, read_u64};
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
        .map_err(io0)?;
    let mut s = &stream;
    s.write_all(&encode_registration(cfg, me)).map_err(io0)?;
    let mut magic = [0u8; 8];
    s.read_exact(&mut magic).map_err(io0)?;
    if magic != STORE_MAGIC {
        return Err(CollectiveError::protocol(
            Some(0),
            format!("{addr} is not an RLX rendezvous store (wrong magic)"),
        ));
    }
    let status = read_u32(&mut s).map_err(io0)?;
    let count = read_u32(&mut s).map_err(io0)?;
    if status != 0 {
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
        let instance = read_u64(&mut s).map_err(io0)?;
        let addrs = read_addrs(&mut s).map_err(io0)?;
        table.push(Registration { instance, addrs });
    }
    Ok(Some(table))
}
