//! The store's server: rank 0 hosts it until every rank registered (and, when the job has a
//! secret, proved that it holds it), then answers everyone with the table.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Mutex;
use std::time::Instant;

use rlx_transport::CollectiveError;

use crate::auth::{MAC_LEN, NONCE_LEN, random_bytes};
use crate::handshake::{Refusal, RefusalCode};

use super::wire::{
    Registration, encode_challenge, read_registration, store_mac, store_reply, verify_rank_mac,
};
use crate::bootstrap::accept::{log_refusal, missing_ranks_timeout};
use crate::bootstrap::address::public_address;
use crate::bootstrap::config::BootConfig;
use crate::bootstrap::slots::{Slot, Slots};
use crate::bootstrap::socket::{Deadline, listen, unspecified, vet_accepted};

/// Rank 0: hosts the store until every rank registered, answers everyone with the table, and
/// returns it.
pub(in crate::bootstrap) fn serve_store(
    cfg: &BootConfig,
    master: &[SocketAddr],
    me: Registration,
    deadline: Instant,
) -> Result<Vec<Registration>, CollectiveError> {
    let port = master[0].port();
    let listener = listen(
        (unspecified(master[0].ip()), port).into(),
        cfg.socket_setup.as_ref(),
    )
    .map_err(|e| {
        CollectiveError::config(format!(
            "rank 0 cannot host the rendezvous store on port {port}: {e}"
        ))
    })?;
    let mut entries = gather(cfg, &listener, deadline)?;
    let table = table_of(&entries, me)?;
    let reply = store_reply(Ok(&table));
    for (stream, ..) in entries.iter_mut().flatten() {
        let mut s = &*stream;
        let _ = s.write_all(&reply);
    }
    Ok(table)
}

/// Per rank: the connection, what it registered, how the store saw it (the peer's address)
/// and where it arrived (the store's address on that connection).
type Entry = (TcpStream, Registration, Option<IpAddr>, Option<IpAddr>);

/// Accepts registrations on `listener` until every other rank has one or `deadline` passes,
/// each connection vetted by the socket hook, admitted to a handshake slot and read on a
/// thread of its own.
fn gather(
    cfg: &BootConfig,
    listener: &TcpListener,
    deadline: Instant,
) -> Result<Vec<Option<Entry>>, CollectiveError> {
    let world = cfg.world as usize;
    let entries: Mutex<Vec<Option<Entry>>> = Mutex::new((0..world).map(|_| None).collect());
    let count = |e: &Mutex<Vec<Option<Entry>>>| e.lock().map_or(0, |v| v.iter().flatten().count());
    let slots = Slots::new(
        0,
        "rendezvous store",
        Box::new(|reason| store_reply(Err(&Refusal::new(RefusalCode::Busy, reason)))),
    );
    let result = std::thread::scope(|scope| {
        let result = loop {
            if count(&entries) + 1 >= world {
                break Ok(());
            }
            if Instant::now() >= deadline {
                let missing: Vec<u32> = entries.lock().map_or_else(
                    |_| Vec::new(),
                    |e| {
                        (1..cfg.world)
                            .filter(|&r| e[r as usize].is_none())
                            .collect()
                    },
                );
                break Err(missing_ranks_timeout(
                    0,
                    "rendezvous",
                    cfg.connect_timeout,
                    &missing,
                ));
            }
            let mut fd = [libc::pollfd {
                fd: listener.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            }];
            // SAFETY: one valid pollfd for the duration of the call.
            unsafe { libc::poll(fd.as_mut_ptr(), 1, 20) };
            while let Ok((stream, from)) = listener.accept() {
                if !vet_accepted(cfg.socket_setup.as_ref(), 0, &stream, from) {
                    continue;
                }
                let Some(slot) = slots.admit(&stream, from) else {
                    continue;
                };
                let entries = &entries;
                scope.spawn(move || register_one(cfg, stream, from, slot, entries, deadline));
            }
        };
        // Unblock registrations still waiting on strangers so the scope can end.
        slots.close_all();
        result
    });
    let entries = entries
        .into_inner()
        .map_err(|_| CollectiveError::config("store lock poisoned"))?;
    result.map(|()| entries)
}

/// Reads one connection's registration and, when it is admitted and its rank still free,
/// files it in `entries`; a refusal is answered, logged and the connection closed.
fn register_one(
    cfg: &BootConfig,
    stream: TcpStream,
    from: SocketAddr,
    slot: Slot<'_>,
    entries: &Mutex<Vec<Option<Entry>>>,
    deadline: Instant,
) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_write_timeout(Some(cfg.hello_timeout));
    let until = deadline.min(Instant::now() + cfg.hello_timeout);
    let refuse = |refusal: Refusal| {
        let mut s = &stream;
        let _ = s.write_all(&store_reply(Err(&refusal)));
        let _ = stream.shutdown(std::net::Shutdown::Both);
        log_refusal(0, Some(from), &refusal);
    };
    let (rank, reg) = match admit_registration(cfg, &stream, until) {
        Ok(admitted) => admitted,
        Err(refusal) => return refuse(refusal),
    };
    // A connection evicted while its registration was read was told so, and registers again.
    if !slot.identified() {
        return;
    }
    // The slot goes before the connection joins the entries, so that closing the connections
    // still in the handshake spares it.
    drop(slot);
    let Ok(mut e) = entries.lock() else { return };
    if e[rank as usize].is_some() {
        drop(e);
        return refuse(Refusal::new(
            RefusalCode::Duplicate,
            format!("duplicate rank {rank}: another process registered it first"),
        ));
    }
    let _ = stream.set_read_timeout(None);
    let observed = stream.peer_addr().ok().map(|a| a.ip());
    let via = stream.local_addr().ok().map(|a| a.ip());
    e[rank as usize] = Some((stream, reg, observed, via));
}

/// The table every rank gets: rank 0's registration `me` and every other rank's, each address
/// made one the others can use (see `public_address`).
fn table_of(
    entries: &[Option<Entry>],
    me: Registration,
) -> Result<Vec<Registration>, CollectiveError> {
    let remote_via = entries
        .iter()
        .flatten()
        .find(|(_, _, observed, _)| observed.is_some_and(|ip| !ip.is_loopback()))
        .and_then(|(_, _, _, via)| *via);
    let mut table = Vec::with_capacity(entries.len());
    for (rank, slot) in entries.iter().enumerate() {
        let (mut reg, seen) = match slot {
            _ if rank == 0 => (me.clone(), remote_via),
            Some((_, reg, observed, _)) => (reg.clone(), *observed),
            None => {
                return Err(CollectiveError::config(format!(
                    "rank {rank} never registered"
                )));
            }
        };
        for a in &mut reg.addrs {
            *a = public_address(*a, seen);
        }
        table.push(reg);
    }
    Ok(table)
}

/// Reads the registration on `stream` (which must be complete by `until`) and, when the job
/// has a secret, runs the challenge-response that proves both sides hold it; returns the
/// rank and what it published, or why the connection is refused.
fn admit_registration(
    cfg: &BootConfig,
    stream: &TcpStream,
    until: Instant,
) -> Result<(u32, Registration), Refusal> {
    let mut from = Deadline::new(stream, until, "registration");
    let received = read_registration(cfg, &mut from)?;
    let Some(secret) = &cfg.secret else {
        return Ok((received.rank, received.reg));
    };
    let other = |e: std::io::Error| {
        Refusal::new(
            RefusalCode::Secret,
            format!(
                "rank {} did not complete its proof of RLX_JOB_SECRET: {e}",
                received.rank
            ),
        )
    };
    // Without randomness the connection is refused rather than challenged with a guessable
    // nonce.
    let nonce =
        random_bytes::<NONCE_LEN>().map_err(|e| Refusal::new(RefusalCode::Other, e.to_string()))?;
    let challenge = encode_challenge(&nonce, &store_mac(secret, &received.bytes, &nonce));
    let mut s = stream;
    s.write_all(&challenge).map_err(other)?;
    let mut proof = [0u8; MAC_LEN];
    Deadline::new(stream, until, "proof of the job secret")
        .read_exact(&mut proof)
        .map_err(other)?;
    if !verify_rank_mac(secret, &received.bytes, &nonce, &proof) {
        return Err(Refusal::new(
            RefusalCode::Secret,
            format!(
                "rank {} failed to prove it holds RLX_JOB_SECRET (the secrets differ); it may \
                 neither register nor read the table",
                received.rank
            ),
        ));
    }
    Ok((received.rank, received.reg))
}
