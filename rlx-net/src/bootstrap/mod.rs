//! Rendezvous and link establishment: listeners, the rank-0 store, connecting with backoff,
//! accepting with a deadline, and running the [handshake](crate::handshake) on every link.
//!
//! Topology: rank `i` connects to every rank below it and accepts every rank above it, one TCP
//! connection per link. Every accepted connection is handshaken on its own scoped thread, so a
//! silent or hostile client never delays the right ranks; a refusal is answered with a reason,
//! logged on stderr, and the accept loop carries on. All bootstrap threads end before
//! [`establish`] returns.
//!
//! The store (rank 0, `RLX_MASTER_ADDR:RLX_MASTER_PORT`): every rank registers its process
//! instance and listening addresses; when all have, the store sends everyone the table. A rank
//! advertises the local address of its route towards the store, so a host name that resolves
//! to loopback is never advertised to other hosts; a loopback address that a remote rank would
//! see is replaced by the address the store observed.
//!
//! Layout: this file runs [`establish`]; `config.rs` holds what bootstrap is told and hands
//! back; `socket.rs` the socket setup; `address.rs` the choice of addresses; `connect.rs` and
//! `accept.rs` the two sides of every link; `slots.rs` the bounded handshakes of a listener;
//! `store/` the rendezvous store; `networks.rs` the networks each rank registers and the link
//! matrix made of them.
mod accept;
mod address;
mod config;
mod connect;
mod networks;
mod slots;
mod socket;
mod store;

use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use rlx_transport::bootstrap::resolve;
use rlx_transport::interfaces::InterfaceAddress;
use rlx_transport::{CollectiveError, Rendezvous, Topology};

use crate::auth::random_bytes;
use crate::handshake::Expectation;

use accept::accept_all;
use address::{choose_ip, store_scope, with_scope};
pub use config::SocketRole;
pub(crate) use config::{
    BootConfig, DEFAULT_HELLO_TIMEOUT, Established, SocketSetup, SocketSetupFn,
};
use connect::connect_all;
pub(crate) use connect::connector_exchange;
pub(crate) use socket::tune;
use socket::{listen, unspecified};
pub(crate) use store::{
    Registration, encode_registration, read_registration, store_exchange, store_reply,
};
use store::{register, serve_store};

fn io_err(peer: Option<u32>, source: io::Error) -> CollectiveError {
    CollectiveError::Io { peer, source }
}

/// Says at `info` how `peer`'s traffic travels: the sockets, their interface and both ends.
/// Ranks of this host may move to shared memory later; the engine says so when they do.
fn log_peer_path(peer: usize, streams: &[TcpStream], interfaces: &[InterfaceAddress]) {
    let Some(first) = streams.first() else {
        return;
    };
    let (local, remote) = (first.local_addr().ok(), first.peer_addr().ok());
    let interface = local
        .and_then(|l| interfaces.iter().find(|i| i.addr == Some(l.ip())))
        .map_or("?", |i| i.name.as_str());
    tracing::info!(
        peer,
        sockets = streams.len(),
        interface,
        local = ?local,
        remote = ?remote,
        "peer {peer}: TCP over {interface}"
    );
}

/// What rendezvous hands to link establishment: this rank's listeners, every rank's listening
/// addresses, and, through a store, every rank's process instance and the link matrix.
struct Rendezvoused {
    listeners: Vec<TcpListener>,
    table: Vec<Vec<SocketAddr>>,
    instances: Option<Vec<u64>>,
    topology: Option<Topology>,
}

/// Establishes every link of this rank; see the module docs.
pub(crate) fn establish(cfg: &BootConfig) -> Result<Established, CollectiveError> {
    if cfg.world == 1 {
        return Ok(Established {
            links: vec![Vec::new()],
            addrs: vec![None],
            topology: None,
        });
    }
    let started = Instant::now();
    let deadline = started + cfg.connect_timeout;
    let _span = tracing::info_span!("bootstrap", rank = cfg.rank, world = cfg.world).entered();
    tracing::debug!(rendezvous = ?cfg.rendezvous, links = cfg.links, "joining");
    let instance = u64::from_le_bytes(random_bytes::<8>()?);
    let met = match &cfg.rendezvous {
        Rendezvous::Hostfile(entries) => by_hostfile(cfg, entries)?,
        Rendezvous::Store { host, port } => by_store(cfg, host, *port, instance, deadline)?,
    };
    let mut established = link_all(cfg, met, instance, deadline)?;
    if established.topology.is_none() {
        established.topology = Some(networks::exchange(cfg.rank, &established.links, deadline)?);
    }
    tracing::info!(elapsed = ?started.elapsed(), "every link is up");
    Ok(established)
}

/// Rendezvous through a hostfile: every peer's addresses as listed, the ones this host reaches
/// best ([`rlx_transport::hostfile`]), and this rank's listeners on every one of its own.
fn by_hostfile(cfg: &BootConfig, entries: &[Vec<String>]) -> Result<Rendezvoused, CollectiveError> {
    if entries.len() != cfg.world as usize {
        return Err(CollectiveError::config(format!(
            "the hostfile lists {} ranks for a world of {}",
            entries.len(),
            cfg.world
        )));
    }
    let mut table = Vec::with_capacity(entries.len());
    for entry in entries {
        let mut addrs = Vec::new();
        for a in entry {
            addrs.push(resolve(a)?[0]);
        }
        table.push(addrs);
    }
    // A peer's links go to the addresses of its entry this host reaches best; this rank's own
    // are all listened on.
    let table = rlx_transport::hostfile::usable_from_here(&table, cfg.rank as usize);
    let mut listeners = Vec::new();
    for addr in &table[cfg.rank as usize] {
        let setup = cfg.socket_setup.as_ref();
        let listener = listen(*addr, setup)
            .or_else(|_| listen((unspecified(addr.ip()), addr.port()).into(), setup))
            .map_err(|e| {
                CollectiveError::config(format!(
                    "rank {} cannot listen on {addr} from the hostfile: {e}",
                    cfg.rank
                ))
            })?;
        listeners.push(listener);
    }
    Ok(Rendezvoused {
        listeners,
        table,
        instances: None,
        topology: None,
    })
}

/// Rendezvous through rank 0's store at `host:port`: this rank listens, registers its address
/// and networks, and gets every rank's back.
fn by_store(
    cfg: &BootConfig,
    host: &str,
    port: u16,
    instance: u64,
    deadline: Instant,
) -> Result<Rendezvoused, CollectiveError> {
    let master = resolve(&format!("{host}:{port}"))?;
    let scope = store_scope(&master);
    let (bind_ip, advertise_ip) = choose_ip(cfg, &master)?;
    let bind = with_scope((bind_ip, 0).into(), scope);
    let listener = listen(bind, cfg.socket_setup.as_ref()).map_err(|e| io_err(None, e))?;
    let port = listener.local_addr().map_err(|e| io_err(None, e))?.port();
    let me = Registration {
        instance,
        addrs: vec![(advertise_ip, port).into()],
        networks: networks::of_this_host(),
        listens_everywhere: bind_ip.is_unspecified(),
    };
    let regs = if cfg.rank == 0 {
        serve_store(cfg, &master, me, deadline)?
    } else {
        register(cfg, &master, &me, deadline)?
    };
    let instances = regs.iter().map(|r| r.instance).collect();
    let topology = networks::topology(&regs);
    let table = networks::connect_addresses(cfg.rank, &regs, &topology)
        .into_iter()
        .map(|addrs| addrs.into_iter().map(|a| with_scope(a, scope)).collect())
        .collect();
    Ok(Rendezvoused {
        listeners: vec![listener],
        table,
        instances: Some(instances),
        topology: Some(topology),
    })
}

/// Connects to every lower rank and accepts every higher one at once, handshaking each link.
fn link_all(
    cfg: &BootConfig,
    met: Rendezvoused,
    instance: u64,
    deadline: Instant,
) -> Result<Established, CollectiveError> {
    let expect = Expectation {
        job: cfg.job,
        world_size: cfg.world,
        my_rank: cfg.rank,
        links: cfg.links,
        has_secret: cfg.secret.is_some(),
        instances: met.instances.as_deref(),
    };
    let inbound = (cfg.world - cfg.rank - 1) as usize * cfg.links as usize;
    let failed = AtomicBool::new(false);
    let (accepted, outbound) = std::thread::scope(|scope| {
        let acceptor =
            scope.spawn(|| accept_all(cfg, &met.listeners, &expect, inbound, deadline, &failed));
        let outbound = connect_all(cfg, &met.table, instance, deadline);
        if outbound.is_err() {
            failed.store(true, Ordering::SeqCst);
        }
        let accepted = acceptor
            .join()
            .unwrap_or_else(|_| Err(CollectiveError::config("the accept thread panicked")));
        (accepted, outbound)
    });
    let streams = outbound?.into_iter().chain(accepted?);
    assemble(cfg, streams, met.topology)
}

/// Puts the connected and accepted `streams` (peer rank, link index, stream) in their places,
/// tunes each and notes each peer's address: every link of every peer must be there. The
/// link matrix from rendezvous goes along.
fn assemble(
    cfg: &BootConfig,
    streams: impl Iterator<Item = (u32, u32, TcpStream)>,
    topology: Option<Topology>,
) -> Result<Established, CollectiveError> {
    let world = cfg.world as usize;
    let mut links: Vec<Vec<TcpStream>> = (0..world).map(|_| Vec::new()).collect();
    let mut slots: Vec<Vec<Option<TcpStream>>> = (0..world)
        .map(|_| (0..cfg.links).map(|_| None).collect())
        .collect();
    for (rank, link, stream) in streams {
        slots[rank as usize][link as usize] = Some(stream);
    }
    let mut addrs = vec![None; world];
    // Which interface carries each peer's traffic, for the start-up lines (`RLX_DEBUG=info`).
    let interfaces = rlx_transport::interfaces::addresses().unwrap_or_default();
    for (rank, row) in slots.into_iter().enumerate() {
        if rank == cfg.rank as usize {
            continue;
        }
        for (link, stream) in row.into_iter().enumerate() {
            let stream = stream.ok_or_else(|| {
                CollectiveError::config(format!("link {link} to rank {rank} was not established"))
            })?;
            tune(&stream).map_err(|e| io_err(Some(rank as u32), e))?;
            if link == 0 {
                addrs[rank] = stream.peer_addr().ok();
            }
            links[rank].push(stream);
        }
        log_peer_path(rank, &links[rank], &interfaces);
    }
    Ok(Established {
        links,
        addrs,
        topology,
    })
}
