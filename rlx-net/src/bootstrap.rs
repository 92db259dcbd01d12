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

use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use rlx_transport::bootstrap::resolve;
use rlx_transport::{CollectiveError, Rendezvous, ifname::IfnameFilter};
use socket2::{Domain, Protocol, SockRef, Socket, TcpKeepalive, Type};

use crate::handshake::{
    self, Expectation, HELLO_LEN, Hello, MAC_LEN, PROTOCOL_VERSION, REPLY_LEN, Refusal,
    RefusalCode, Reply, Side,
};

/// How long an accepted connection may take to say who it is.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// First and largest pause between connection attempts.
const BACKOFF_MIN: Duration = Duration::from_millis(10);
const BACKOFF_MAX: Duration = Duration::from_millis(500);
/// Most addresses one rank may publish in the store.
const MAX_ADDRS: usize = 16;
const STORE_MAGIC: [u8; 8] = *b"RLXSTOR\n";
/// Most connections handshaken at once during bootstrap; more are closed at once, so a flood
/// of strangers cannot make a rank start threads without bound.
const MAX_HANDSHAKES: usize = 64;

/// Counts handshakes in flight; dropping the guard ends one.
struct InFlight<'a>(&'a AtomicUsize);

impl<'a> InFlight<'a> {
    fn enter(counter: &'a AtomicUsize) -> Option<Self> {
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

/// What a socket is about to do when the socket setup hook
/// ([`TcpTransportBuilder::socket_setup`](crate::TcpTransportBuilder::socket_setup)) sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SocketRole {
    /// A listening socket (a link listener, or rank 0's rendezvous store) about to be bound to
    /// this local address, which may be unspecified (`0.0.0.0`, `::`).
    Listen(SocketAddr),
    /// A socket about to connect to this address (a peer's listener, or the rendezvous store).
    Connect(SocketAddr),
}

/// The signature of a socket setup hook: it sees every socket bootstrap creates, before
/// `bind` or `connect`, and may refuse it with an error.
pub(crate) type SocketSetupFn = dyn Fn(&Socket, SocketRole) -> io::Result<()> + Send + Sync;

/// A socket setup hook as the bootstrap configuration carries it.
#[derive(Clone)]
pub(crate) struct SocketSetup(pub(crate) Arc<SocketSetupFn>);

impl std::fmt::Debug for SocketSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SocketSetup(..)")
    }
}

/// Runs the hook, when there is one, on `socket`.
fn set_up(setup: Option<&SocketSetup>, socket: &Socket, role: SocketRole) -> io::Result<()> {
    match setup {
        Some(SocketSetup(hook)) => hook(socket, role),
        None => Ok(()),
    }
}

/// What bootstrap needs to know (assembled by the builder).
#[derive(Clone, Debug)]
pub(crate) struct BootConfig {
    pub(crate) rank: u32,
    pub(crate) world: u32,
    pub(crate) rendezvous: Rendezvous,
    pub(crate) connect_timeout: Duration,
    pub(crate) job: [u8; 16],
    pub(crate) secret: Option<Vec<u8>>,
    pub(crate) links: u32,
    pub(crate) bind_ip: Option<IpAddr>,
    pub(crate) ifname: Option<IfnameFilter>,
    pub(crate) socket_setup: Option<SocketSetup>,
}

/// The established links: `links[r]` holds rank `r`'s connections in link order (empty for
/// this rank).
#[derive(Debug)]
pub(crate) struct Established {
    pub(crate) links: Vec<Vec<TcpStream>>,
    pub(crate) addrs: Vec<Option<SocketAddr>>,
}

fn io_err(peer: Option<u32>, source: io::Error) -> CollectiveError {
    CollectiveError::Io { peer, source }
}

fn log_refusal(rank: u32, from: Option<SocketAddr>, refusal: &Refusal) {
    let from = from.map_or_else(|| "an unknown address".to_owned(), |a| a.to_string());
    eprintln!(
        "rlx-net: rank {rank} refused a connection from {from}: {}",
        refusal.reason
    );
}

/// Random bytes for nonces and process instances.
fn random_bytes<const N: usize>() -> [u8; N] {
    let mut out = [0u8; N];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        if f.read_exact(&mut out).is_ok() {
            return out;
        }
    }
    // Without /dev/urandom the nonce still differs per process and call; it is then only
    // unpredictable to the extent the clock is.
    let seed = format!("{:?}{}{:p}", Instant::now(), std::process::id(), &out);
    let digest = <sha2::Sha256 as sha2::Digest>::digest(seed.as_bytes());
    for (o, d) in out.iter_mut().zip(digest.iter().cycle()) {
        *o = *d;
    }
    out
}

/// A listener with `SO_REUSEADDR` on `addr`, set up by the hook before it is bound.
fn listen(addr: SocketAddr, setup: Option<&SocketSetup>) -> io::Result<TcpListener> {
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

fn unspecified(ip: IpAddr) -> IpAddr {
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

/// Interface addresses of this host, by name (IPv4 and IPv6, link-local v6 excluded: without a
/// scope id other hosts could not use them).
fn interface_addresses() -> Result<Vec<(String, IpAddr)>, CollectiveError> {
    let entries = rlx_transport::interfaces::addresses()?;
    Ok(entries
        .into_iter()
        .filter_map(|entry| match entry.addr? {
            IpAddr::V6(v6) if is_link_local_v6(&v6) => None,
            ip => Some((entry.name, ip)),
        })
        .collect())
}

/// The scope id of the store's address when it is IPv6 link-local, as this host resolved it.
///
/// A link-local address means nothing without its link, and a scope id is an interface index
/// of the host that chose it, so none travels through the store (addresses are advertised
/// without one). When the store is reached over a link-local address, every link-local address
/// of the job is taken to be on that same link: this host's scope of the store applies to its
/// own listener and to every link-local address in the table.
fn store_scope(master: &[SocketAddr]) -> Option<u32> {
    master.iter().find_map(|a| match a {
        SocketAddr::V6(v6) if is_link_local_v6(v6.ip()) && v6.scope_id() != 0 => {
            Some(v6.scope_id())
        }
        _ => None,
    })
}

/// `addr` with the scope id `scope` when it is IPv6 link-local and a scope is known.
fn with_scope(mut addr: SocketAddr, scope: Option<u32>) -> SocketAddr {
    if let (SocketAddr::V6(v6), Some(scope)) = (&mut addr, scope) {
        if is_link_local_v6(v6.ip()) {
            v6.set_scope_id(scope);
        }
    }
    addr
}

fn is_link_local_v6(ip: &Ipv6Addr) -> bool {
    ip.segments()[0] & 0xffc0 == 0xfe80
}

/// The address this rank listens on and advertises in store mode.
fn choose_ip(cfg: &BootConfig, master: &[SocketAddr]) -> Result<(IpAddr, IpAddr), CollectiveError> {
    if let Some(ip) = cfg.bind_ip {
        return Ok((ip, ip));
    }
    let want_v6 = master.iter().all(SocketAddr::is_ipv6);
    if let Some(filter) = &cfg.ifname {
        let all = interface_addresses()?;
        let pick = all
            .iter()
            .filter(|(name, _)| filter.matches(name))
            .find(|(_, ip)| ip.is_ipv6() == want_v6)
            .or_else(|| all.iter().find(|(name, _)| filter.matches(name)));
        return match pick {
            Some((_, ip)) => Ok((*ip, *ip)),
            None => {
                let seen: Vec<String> = all.iter().map(|(n, ip)| format!("{n} ({ip})")).collect();
                Err(CollectiveError::config(format!(
                    "RLX_SOCKET_IFNAME={filter} matches no interface; this host has {}",
                    seen.join(", ")
                )))
            }
        };
    }
    // The local end of a route towards the store: the interface other hosts reach this one
    // on. No packet is sent by connecting a UDP socket.
    for target in master {
        let bind: SocketAddr = (unspecified(target.ip()), 0).into();
        if let Ok(udp) = UdpSocket::bind(bind) {
            if udp.connect(target).is_ok() {
                if let Ok(local) = udp.local_addr() {
                    return Ok((unspecified(local.ip()), local.ip()));
                }
            }
        }
    }
    let ip = master
        .first()
        .map_or(IpAddr::V4(Ipv4Addr::LOCALHOST), SocketAddr::ip);
    Ok((unspecified(ip), ip))
}

/// Establishes every link of this rank; see the module docs.
pub(crate) fn establish(cfg: &BootConfig) -> Result<Established, CollectiveError> {
    let world = cfg.world as usize;
    let mut links: Vec<Vec<TcpStream>> = (0..world).map(|_| Vec::new()).collect();
    if cfg.world == 1 {
        return Ok(Established {
            links,
            addrs: vec![None],
        });
    }
    let deadline = Instant::now() + cfg.connect_timeout;
    let instance = u64::from_le_bytes(random_bytes::<8>());
    let (listeners, table, instances) = match &cfg.rendezvous {
        Rendezvous::Hostfile(entries) => {
            if entries.len() != world {
                return Err(CollectiveError::config(format!(
                    "the hostfile lists {} ranks for a world of {}",
                    entries.len(),
                    cfg.world
                )));
            }
            let mut table = Vec::with_capacity(world);
            for entry in entries {
                let mut addrs = Vec::new();
                for a in entry {
                    addrs.push(resolve(a)?[0]);
                }
                table.push(addrs);
            }
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
            (listeners, table, None)
        }
        Rendezvous::Store { host, port } => {
            let master = resolve(&format!("{host}:{port}"))?;
            let scope = store_scope(&master);
            let (bind_ip, advertise_ip) = choose_ip(cfg, &master)?;
            let bind = with_scope((bind_ip, 0).into(), scope);
            let listener = listen(bind, cfg.socket_setup.as_ref()).map_err(|e| io_err(None, e))?;
            let port = listener.local_addr().map_err(|e| io_err(None, e))?.port();
            let me = Registration {
                instance,
                addrs: vec![(advertise_ip, port).into()],
            };
            let regs = if cfg.rank == 0 {
                serve_store(cfg, &master, me, deadline)?
            } else {
                register(cfg, &master, &me, deadline)?
            };
            let instances: Vec<u64> = regs.iter().map(|r| r.instance).collect();
            let table = regs
                .into_iter()
                .map(|r| r.addrs.into_iter().map(|a| with_scope(a, scope)).collect())
                .collect();
            (vec![listener], table, Some(instances))
        }
    };
    let expect = Expectation {
        job: cfg.job,
        world_size: cfg.world,
        my_rank: cfg.rank,
        links: cfg.links,
        has_secret: cfg.secret.is_some(),
        instances: instances.as_deref(),
    };
    let inbound = (cfg.world - cfg.rank - 1) as usize * cfg.links as usize;
    let failed = AtomicBool::new(false);
    let (accepted, outbound) = std::thread::scope(|scope| {
        let acceptor =
            scope.spawn(|| accept_all(cfg, &listeners, &expect, inbound, deadline, &failed));
        let outbound = connect_all(cfg, &table, instance, deadline);
        if outbound.is_err() {
            failed.store(true, Ordering::SeqCst);
        }
        let accepted = acceptor
            .join()
            .unwrap_or_else(|_| Err(CollectiveError::config("the accept thread panicked")));
        (accepted, outbound)
    });
    let outbound = outbound?;
    let accepted = accepted?;
    let mut slots: Vec<Vec<Option<TcpStream>>> = (0..world)
        .map(|_| (0..cfg.links).map(|_| None).collect())
        .collect();
    for (rank, link, stream) in outbound.into_iter().chain(accepted) {
        slots[rank as usize][link as usize] = Some(stream);
    }
    let mut addrs = vec![None; world];
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
    }
    Ok(Established { links, addrs })
}

type Link = (u32, u32, TcpStream);

/// Connects to every lower rank, each link with retries until `deadline`.
fn connect_all(
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
            let stream = connect_retrying(cfg, peer, addr, deadline, cfg.connect_timeout)?;
            handshake_connector(cfg, peer, link, instance, &stream, deadline)?;
            out.push((peer, link, stream));
        }
    }
    Ok(out)
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
fn connect_retrying(
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
                std::thread::sleep(pause.min(deadline.saturating_duration_since(Instant::now())));
                pause = (pause * 2).min(BACKOFF_MAX);
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

fn read_timeout_until(stream: &TcpStream, deadline: Instant, cap: Duration) -> io::Result<()> {
    let left = deadline.saturating_duration_since(Instant::now()).min(cap);
    stream.set_read_timeout(Some(left.max(Duration::from_millis(1))))
}

fn handshake_connector(
    cfg: &BootConfig,
    peer: u32,
    link: u32,
    instance: u64,
    stream: &TcpStream,
    deadline: Instant,
) -> Result<(), CollectiveError> {
    let io_peer = |e: io::Error| {
        let addr = stream
            .peer_addr()
            .map_or_else(|_| "?".to_owned(), |a| a.to_string());
        CollectiveError::Io {
            peer: Some(peer),
            source: io::Error::new(
                e.kind(),
                format!("handshake with rank {peer} at {addr}: {e}"),
            ),
        }
    };
    read_timeout_until(stream, deadline, HELLO_TIMEOUT).map_err(io_peer)?;
    let hello = Hello {
        version: PROTOCOL_VERSION,
        has_secret: cfg.secret.is_some(),
        job: cfg.job,
        world_size: cfg.world,
        rank: cfg.rank,
        link,
        links: cfg.links,
        instance,
        nonce: random_bytes::<16>(),
    };
    let hello_bytes = hello.encode();
    let mut s = stream;
    s.write_all(&hello_bytes).map_err(io_peer)?;
    let mut fixed = [0u8; REPLY_LEN];
    s.read_exact(&mut fixed).map_err(io_peer)?;
    let (reply, reason_len) = Reply::decode(peer, &fixed)?;
    let mut reason = vec![0u8; reason_len];
    s.read_exact(&mut reason).map_err(io_peer)?;
    if let Some(refusal) = reply.refusal {
        let reason = String::from_utf8_lossy(&reason);
        return Err(CollectiveError::config(format!(
            "rank {peer} refused rank {}'s connection (code {:?}): {reason}",
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
            &hello_bytes,
            &reply.nonce,
            &reply.mac,
        );
        // Answer even when the acceptor's proof failed, so that its side can report the
        // mismatch too.
        let mine = handshake::mac(secret, Side::Connector, &hello_bytes, &reply.nonce);
        s.write_all(&mine).map_err(io_peer)?;
        let mut verdict = [0u8; 1];
        let answered = s.read_exact(&mut verdict);
        if !proven {
            return Err(CollectiveError::protocol(
                Some(peer),
                format!("rank {peer} failed to prove it holds RLX_JOB_SECRET (the secrets differ)"),
            ));
        }
        answered.map_err(io_peer)?;
        if verdict[0] != 0 {
            return Err(CollectiveError::config(format!(
                "rank {peer} refused rank {}'s proof of RLX_JOB_SECRET (the secrets differ)",
                cfg.rank
            )));
        }
    }
    stream.set_read_timeout(None).map_err(io_peer)?;
    Ok(())
}

/// Accepts `expected` links from higher ranks until `deadline`; strangers are refused.
fn accept_all(
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
    let nonce = random_bytes::<16>();
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

// ----- the rank-0 store ------------------------------------------------------------------

/// What a rank publishes in the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Registration {
    pub(crate) instance: u64,
    pub(crate) addrs: Vec<SocketAddr>,
}

fn put_addr(out: &mut Vec<u8>, addr: &SocketAddr) {
    match addr {
        SocketAddr::V4(a) => {
            out.push(4);
            out.extend_from_slice(&a.ip().octets());
        }
        SocketAddr::V6(a) => {
            out.push(6);
            out.extend_from_slice(&a.ip().octets());
            out.extend_from_slice(&a.scope_id().to_le_bytes());
        }
    }
    out.extend_from_slice(&addr.port().to_le_bytes());
}

fn get_addr(r: &mut impl Read) -> io::Result<SocketAddr> {
    let mut family = [0u8; 1];
    r.read_exact(&mut family)?;
    let ip = match family[0] {
        4 => {
            let mut b = [0u8; 4];
            r.read_exact(&mut b)?;
            (IpAddr::V4(Ipv4Addr::from(b)), 0)
        }
        6 => {
            let mut b = [0u8; 16];
            r.read_exact(&mut b)?;
            let mut scope = [0u8; 4];
            r.read_exact(&mut scope)?;
            (IpAddr::V6(Ipv6Addr::from(b)), u32::from_le_bytes(scope))
        }
        other => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("unknown address family {other}"),
            ));
        }
    };
    let mut port = [0u8; 2];
    r.read_exact(&mut port)?;
    let port = u16::from_le_bytes(port);
    Ok(match ip {
        (IpAddr::V6(v6), scope) => SocketAddr::V6(std::net::SocketAddrV6::new(v6, port, 0, scope)),
        (ip, _) => SocketAddr::new(ip, port),
    })
}

/// The registration message: magic, version, job, world, rank, instance, addresses.
pub(crate) fn encode_registration(cfg: &BootConfig, reg: &Registration) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(&STORE_MAGIC);
    out.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    out.extend_from_slice(&cfg.job);
    out.extend_from_slice(&cfg.world.to_le_bytes());
    out.extend_from_slice(&cfg.rank.to_le_bytes());
    out.extend_from_slice(&reg.instance.to_le_bytes());
    out.push(reg.addrs.len().min(MAX_ADDRS) as u8);
    for a in reg.addrs.iter().take(MAX_ADDRS) {
        put_addr(&mut out, a);
    }
    out
}

fn read_u32(r: &mut impl Read) -> io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

fn read_u64(r: &mut impl Read) -> io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_le_bytes(b))
}

fn read_addrs(r: &mut impl Read) -> io::Result<Vec<SocketAddr>> {
    let mut n = [0u8; 1];
    r.read_exact(&mut n)?;
    if n[0] == 0 || usize::from(n[0]) > MAX_ADDRS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} addresses", n[0]),
        ));
    }
    (0..n[0]).map(|_| get_addr(r)).collect()
}

/// Reads and checks a registration; returns the rank and what it published.
fn read_registration(cfg: &BootConfig, r: &mut impl Read) -> Result<(u32, Registration), Refusal> {
    let other = |e: io::Error| Refusal::new(RefusalCode::Other, format!("bad registration: {e}"));
    let mut magic = [0u8; 8];
    r.read_exact(&mut magic).map_err(other)?;
    if magic != STORE_MAGIC {
        return Err(Refusal::new(
            RefusalCode::NotRlx,
            "not an RLX store registration (wrong magic)",
        ));
    }
    let version = read_u32(r).map_err(other)?;
    if version != PROTOCOL_VERSION {
        return Err(Refusal::new(
            RefusalCode::Version,
            format!("protocol version {version}"),
        ));
    }
    let mut job = [0u8; 16];
    r.read_exact(&mut job).map_err(other)?;
    if job != cfg.job {
        return Err(Refusal::new(RefusalCode::WrongJob, "the job id differs"));
    }
    let world = read_u32(r).map_err(other)?;
    if world != cfg.world {
        return Err(Refusal::new(
            RefusalCode::WrongWorld,
            format!("world size {world} differs from the store's {}", cfg.world),
        ));
    }
    let rank = read_u32(r).map_err(other)?;
    if rank == 0 || rank >= world {
        return Err(Refusal::new(
            RefusalCode::BadRank,
            format!("rank {rank} cannot register"),
        ));
    }
    let instance = read_u64(r).map_err(other)?;
    let addrs = read_addrs(r).map_err(other)?;
    Ok((rank, Registration { instance, addrs }))
}

fn store_reply(status: Result<&[Registration], &Refusal>) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&STORE_MAGIC);
    match status {
        Ok(table) => {
            out.extend_from_slice(&0u32.to_le_bytes());
            out.extend_from_slice(&(table.len() as u32).to_le_bytes());
            for reg in table {
                out.extend_from_slice(&reg.instance.to_le_bytes());
                out.push(reg.addrs.len().min(MAX_ADDRS) as u8);
                for a in reg.addrs.iter().take(MAX_ADDRS) {
                    put_addr(&mut out, a);
                }
            }
        }
        Err(refusal) => {
            out.extend_from_slice(&(refusal.code as u32).to_le_bytes());
            let reason = refusal.reason.as_bytes();
            out.extend_from_slice(&(reason.len() as u32).to_le_bytes());
            out.extend_from_slice(reason);
        }
    }
    out
}

/// A rank other than 0: registers with the store and waits for the table.
fn register(
    cfg: &BootConfig,
    master: &[SocketAddr],
    me: &Registration,
    deadline: Instant,
) -> Result<Vec<Registration>, CollectiveError> {
    let addr = master[0];
    let stream = connect_retrying(cfg, 0, addr, deadline, cfg.connect_timeout)?;
    let io0 = |e: io::Error| CollectiveError::Io {
        peer: Some(0),
        source: io::Error::new(e.kind(), format!("rendezvous store at {addr}: {e}")),
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
        return Err(CollectiveError::config(format!(
            "the rendezvous store at {addr} refused rank {}: {}",
            cfg.rank,
            String::from_utf8_lossy(&reason)
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
    Ok(table)
}

/// Rank 0: hosts the store until every rank registered, answers everyone with the table, and
/// returns it.
fn serve_store(
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
    let world = cfg.world as usize;
    // Per rank: the connection, what it registered, how the store saw it.
    type Entry = (TcpStream, Registration, Option<IpAddr>, Option<IpAddr>);
    let entries: Mutex<Vec<Option<Entry>>> = Mutex::new((0..world).map(|_| None).collect());
    let count = |e: &Mutex<Vec<Option<Entry>>>| e.lock().map_or(0, |v| v.iter().flatten().count());
    let pending: Mutex<Vec<TcpStream>> = Mutex::new(Vec::new());
    let in_flight = AtomicUsize::new(0);
    let result = std::thread::scope(|scope| {
        let result = loop {
            if count(&entries) + 1 >= world {
                break Ok(());
            }
            if Instant::now() >= deadline {
                break Err(CollectiveError::Timeout {
                    peer: None,
                    op: "rendezvous",
                    after: cfg.connect_timeout,
                });
            }
            let mut fd = [libc::pollfd {
                fd: listener.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            }];
            // SAFETY: one valid pollfd for the duration of the call.
            unsafe { libc::poll(fd.as_mut_ptr(), 1, 20) };
            while let Ok((stream, from)) = listener.accept() {
                let Some(guard) = InFlight::enter(&in_flight) else {
                    let _ = stream.shutdown(std::net::Shutdown::Both);
                    continue;
                };
                if let Ok(c) = stream.try_clone() {
                    if let Ok(mut p) = pending.lock() {
                        p.push(c);
                    }
                }
                let entries = &entries;
                scope.spawn(move || {
                    let _guard = guard;
                    let _ = stream.set_nonblocking(false);
                    let _ = stream.set_read_timeout(Some(HELLO_TIMEOUT));
                    let mut s = &stream;
                    match read_registration(cfg, &mut s) {
                        Ok((rank, reg)) => {
                            let Ok(mut e) = entries.lock() else { return };
                            if e[rank as usize].is_some() {
                                let refusal = Refusal::new(
                                    RefusalCode::Duplicate,
                                    format!(
                                        "duplicate rank {rank}: another process registered it first"
                                    ),
                                );
                                drop(e);
                                let _ = s.write_all(&store_reply(Err(&refusal)));
                                let _ = stream.shutdown(std::net::Shutdown::Both);
                                log_refusal(0, Some(from), &refusal);
                                return;
                            }
                            let observed = stream.peer_addr().ok().map(|a| a.ip());
                            let via = stream.local_addr().ok().map(|a| a.ip());
                            e[rank as usize] = Some((stream, reg, observed, via));
                        }
                        Err(refusal) => {
                            let _ = s.write_all(&store_reply(Err(&refusal)));
                            let _ = stream.shutdown(std::net::Shutdown::Both);
                            log_refusal(0, Some(from), &refusal);
                        }
                    }
                });
            }
        };
        if let Ok(p) = pending.lock() {
            let keep = entries.lock().map(|e| {
                e.iter()
                    .flatten()
                    .filter_map(|(s, ..)| s.peer_addr().ok())
                    .collect::<Vec<_>>()
            });
            let keep = keep.unwrap_or_default();
            for s in p.iter() {
                if s.peer_addr().map_or(true, |a| !keep.contains(&a)) {
                    let _ = s.shutdown(std::net::Shutdown::Both);
                }
            }
        }
        result
    });
    let mut entries = entries
        .into_inner()
        .map_err(|_| CollectiveError::config("store lock poisoned"))?;
    result?;
    let remote_via = entries
        .iter()
        .flatten()
        .find(|(_, _, observed, _)| observed.is_some_and(|ip| !ip.is_loopback()))
        .and_then(|(_, _, _, via)| *via);
    let mut table = Vec::with_capacity(world);
    for (rank, slot) in entries.iter().enumerate() {
        let reg = match slot {
            _ if rank == 0 => {
                let mut me = me.clone();
                for a in &mut me.addrs {
                    *a = public_address(*a, remote_via);
                }
                me
            }
            Some((_, reg, observed, _)) => {
                let mut reg = reg.clone();
                for a in &mut reg.addrs {
                    *a = public_address(*a, *observed);
                }
                reg
            }
            None => {
                return Err(CollectiveError::config(format!(
                    "rank {rank} never registered"
                )));
            }
        };
        table.push(reg);
    }
    let reply = store_reply(Ok(&table));
    for (stream, ..) in entries.iter_mut().flatten() {
        let mut s = &*stream;
        let _ = s.write_all(&reply);
    }
    Ok(table)
}

/// The address other ranks should use for `advertised`, which the store saw arrive from
/// `observed` (for rank 0: the store's own address as a remote rank reached it). A loopback or
/// unspecified advertisement is replaced by a non-loopback observed address, so a host name
/// that resolved to loopback is never handed to other hosts; with no such observation the job
/// is local and loopback is right.
fn public_address(advertised: SocketAddr, observed: Option<IpAddr>) -> SocketAddr {
    let ip = advertised.ip();
    if !(ip.is_loopback() || ip.is_unspecified()) {
        return advertised;
    }
    let mut out = advertised;
    match observed.filter(|o| !o.is_loopback() && !o.is_unspecified()) {
        Some(seen) => out.set_ip(seen),
        None if ip.is_unspecified() => out.set_ip(loopback_of(ip)),
        None => {}
    }
    out
}

fn loopback_of(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn loopback_is_never_advertised_to_remote_ranks() {
        let remote: IpAddr = "10.1.2.3".parse().unwrap();
        assert_eq!(
            public_address(sa("127.0.1.1:5"), Some(remote)),
            sa("10.1.2.3:5")
        );
        assert_eq!(
            public_address(sa("0.0.0.0:5"), Some(remote)),
            sa("10.1.2.3:5")
        );
        assert_eq!(
            public_address(sa("192.168.0.9:5"), Some(remote)),
            sa("192.168.0.9:5")
        );
        // A local job keeps loopback.
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        assert_eq!(
            public_address(sa("127.0.0.1:5"), Some(lo)),
            sa("127.0.0.1:5")
        );
        assert_eq!(public_address(sa("0.0.0.0:5"), None), sa("127.0.0.1:5"));
        assert_eq!(public_address(sa("[::]:5"), None), sa("[::1]:5"));
    }

    #[test]
    fn registrations_round_trip_and_strangers_are_refused() {
        let cfg = BootConfig {
            rank: 2,
            world: 3,
            rendezvous: Rendezvous::Store {
                host: "127.0.0.1".into(),
                port: 1,
            },
            connect_timeout: Duration::from_secs(1),
            job: handshake::job_digest("j"),
            secret: None,
            links: 1,
            bind_ip: None,
            ifname: None,
            socket_setup: None,
        };
        let reg = Registration {
            instance: 42,
            addrs: vec![sa("10.0.0.1:7"), sa("[fe80::1%3]:8")],
        };
        let bytes = encode_registration(&cfg, &reg);
        let (rank, back) = read_registration(&cfg, &mut &bytes[..]).unwrap();
        assert_eq!((rank, back), (2, reg));
        let other_job = BootConfig {
            job: handshake::job_digest("k"),
            ..cfg.clone()
        };
        let refusal = read_registration(&other_job, &mut &bytes[..]).unwrap_err();
        assert_eq!(refusal.code, RefusalCode::WrongJob);
        let refusal = read_registration(&cfg, &mut &[0u8; 80][..]).unwrap_err();
        assert_eq!(refusal.code, RefusalCode::NotRlx);
        let mut truncated = bytes.clone();
        truncated.truncate(bytes.len() - 3);
        assert!(read_registration(&cfg, &mut &truncated[..]).is_err());
    }
}
