//! [`TcpTransport`] and its [`TcpTransportBuilder`]: configuration, then the
//! [`Transport`] methods on top of the [progress engine](crate::progress).

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use rlx_transport::ifname::IfnameFilter;
use rlx_transport::{
    CollectiveError, DEFAULT_OP_TIMEOUT, Failure, LaunchEnv, Rendezvous, Result, Tag, Transport,
};

use crate::bootstrap::{
    self, BootConfig, DEFAULT_HELLO_TIMEOUT, SocketRole, SocketSetup, SocketSetupFn,
};
use crate::frame::FrameKind;
use crate::handshake::job_digest;
use crate::matching::Outcome;
use crate::progress::{
    DEFAULT_HEARTBEAT, DEFAULT_MIN_SINGLE_COPY, DEFAULT_SPIN, Engine, EngineConfig, PeerIo,
};
use crate::sync::{Arc, thread};

/// Default frame cap: the largest message accepted from the wire (`RLX_MAX_FRAME_BYTES`).
pub const DEFAULT_MAX_FRAME_BYTES: u64 = 1 << 30;
/// Default per-peer budget of unexpected bytes (messages nobody waits for yet).
pub const DEFAULT_MAX_UNEXPECTED_BYTES: u64 = 64 << 20;
/// Messages at least this long are striped over the links of a peer when there are several.
pub const DEFAULT_MIN_STRIPED_BYTES: u64 = 256 << 10;

/// The TCP transport (Unix): one or more TCP connections to every other rank, driven by the
/// threads that call it.
///
/// Build one with [`TcpTransport::from_env`] (launched by torchrun, `mlx.launch`, Open MPI,
/// PMI or Slurm, see [`rlx_transport::bootstrap`]) or [`TcpTransport::builder`]. Every
/// blocking call ends: with data, at its deadline, with [`CollectiveError::PeerLost`] naming a
/// peer that closed, crashed or reset, or with [`CollectiveError::Aborted`] after
/// [`Transport::abort`]. Dropping the transport says goodbye to every peer (they see
/// `PeerLost`), ends its background thread and closes every socket.
///
/// # Examples
///
/// Two ranks in one process, through a rendezvous store on loopback:
///
/// ```
/// use rlx_net::TcpTransport;
/// use rlx_transport::Transport;
///
/// let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
/// let peer = std::thread::spawn(move || {
///     let t = TcpTransport::builder().rank(1).world_size(2).master("127.0.0.1", port).build()?;
///     t.send_bytes(0, 7, b"hello")
/// });
/// let t = TcpTransport::builder().rank(0).world_size(2).master("127.0.0.1", port).build()?;
/// assert_eq!(t.recv_bytes(1, 7)?, b"hello");
/// peer.join().unwrap()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct TcpTransport {
    rank: u32,
    world: u32,
    engine: Arc<Engine>,
    watcher: Option<thread::JoinHandle<()>>,
    /// How this transport was built, for the transports of grown worlds (see
    /// [`crate::admission`]).
    pub(crate) config: TcpTransportBuilder,
}

impl fmt::Debug for TcpTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TcpTransport")
            .field("rank", &self.rank)
            .field("world_size", &self.world)
            .field("op_timeout", &self.engine.op_timeout())
            .field("aborted", &self.engine.is_aborted())
            .finish()
    }
}

/// Configures and builds a [`TcpTransport`]; see [`TcpTransport::builder`].
#[derive(Clone)]
pub struct TcpTransportBuilder {
    rank: Option<u32>,
    world: Option<u32>,
    rendezvous: Option<Rendezvous>,
    op_timeout: Duration,
    connect_timeout: Option<Duration>,
    hello_timeout: Duration,
    job_id: Option<String>,
    secret: Option<Vec<u8>>,
    max_frame: u64,
    max_unexpected: u64,
    min_striped: u64,
    sockets_per_peer: Option<u32>,
    bind_ip: Option<IpAddr>,
    ifname: Option<IfnameFilter>,
    spin: Duration,
    heartbeat: Duration,
    min_single_copy: u64,
    socket_setup: Option<SocketSetup>,
}

impl fmt::Debug for TcpTransportBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TcpTransportBuilder")
            .field("rank", &self.rank)
            .field("world", &self.world)
            .field("rendezvous", &self.rendezvous)
            .field("op_timeout", &self.op_timeout)
            .field("job_id", &self.job_id)
            .field("secret", &self.secret.as_ref().map(|_| "<set>"))
            .field("max_frame", &self.max_frame)
            .field("sockets_per_peer", &self.sockets_per_peer)
            .finish_non_exhaustive()
    }
}

impl Default for TcpTransportBuilder {
    fn default() -> Self {
        Self {
            rank: None,
            world: None,
            rendezvous: None,
            op_timeout: DEFAULT_OP_TIMEOUT,
            connect_timeout: None,
            hello_timeout: DEFAULT_HELLO_TIMEOUT,
            job_id: None,
            secret: None,
            max_frame: DEFAULT_MAX_FRAME_BYTES,
            max_unexpected: DEFAULT_MAX_UNEXPECTED_BYTES,
            min_striped: DEFAULT_MIN_STRIPED_BYTES,
            sockets_per_peer: None,
            bind_ip: None,
            ifname: None,
            spin: DEFAULT_SPIN,
            heartbeat: DEFAULT_HEARTBEAT,
            min_single_copy: DEFAULT_MIN_SINGLE_COPY,
            socket_setup: None,
        }
    }
}

impl TcpTransportBuilder {
    /// This process's rank (required).
    pub fn rank(mut self, rank: u32) -> Self {
        self.rank = Some(rank);
        self
    }

    /// The number of ranks (required unless a hostfile gives it).
    pub fn world_size(mut self, world: u32) -> Self {
        self.world = Some(world);
        self
    }

    /// Every rank's listening addresses (`"host:port"`, one per link), as in an MLX hostfile.
    pub fn hostfile(mut self, entries: Vec<Vec<String>>) -> Self {
        self.rendezvous = Some(Rendezvous::Hostfile(entries));
        self
    }

    /// A rendezvous store hosted by rank 0 at `host:port`.
    pub fn master(mut self, host: impl Into<String>, port: u16) -> Self {
        self.rendezvous = Some(Rendezvous::Store {
            host: host.into(),
            port,
        });
        self
    }

    /// How long blocking calls wait by default (and sends at most); default 300 s.
    pub fn op_timeout(mut self, timeout: Duration) -> Self {
        self.op_timeout = timeout;
        self
    }

    /// How long bootstrap waits for every rank (default: the operation timeout).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = Some(timeout);
        self
    }

    /// How long a connection to this rank's bootstrap listeners (its link listener, and the
    /// rendezvous store on rank 0) may take to identify itself, and this rank to hear a
    /// listener's answer; default 10 s. Each connection has its own deadline, however slowly
    /// its bytes trickle in, so a silent or slow stranger holds a handshake slot no longer.
    pub fn hello_timeout(mut self, timeout: Duration) -> Self {
        self.hello_timeout = timeout;
        self
    }

    /// The job id; processes of different jobs refuse each other (default: derived from the
    /// rendezvous).
    pub fn job_id(mut self, id: impl Into<String>) -> Self {
        self.job_id = Some(id.into());
        self
    }

    /// A shared secret: every link's handshake, every registration with the rank-0 rendezvous
    /// store and every joiner's admission proves both sides hold it (HMAC-SHA256
    /// challenge–response both ways), so that a process without it can neither take a rank's
    /// link, publish an address for a rank, nor read the store's address table. Use a long
    /// random secret: anyone who can connect sees an HMAC over bytes it knows.
    pub fn job_secret(mut self, secret: impl Into<Vec<u8>>) -> Self {
        self.secret = Some(secret.into());
        self
    }

    /// The frame cap: the largest message sent or accepted (default 1 GiB).
    pub fn max_frame_bytes(mut self, cap: u64) -> Self {
        self.max_frame = cap;
        self
    }

    /// The per-peer budget of buffered messages nobody waits for yet (default 64 MiB); past it
    /// the transport stops reading that peer, and TCP flow control pushes back.
    pub fn max_unexpected_bytes(mut self, budget: u64) -> Self {
        self.max_unexpected = budget;
        self
    }

    /// Messages at least this long are striped over several links (default 256 KiB).
    pub fn min_striped_bytes(mut self, bytes: u64) -> Self {
        self.min_striped = bytes;
        self
    }

    /// TCP connections per peer (default 1, or the number of addresses per hostfile entry).
    pub fn sockets_per_peer(mut self, sockets: u32) -> Self {
        self.sockets_per_peer = Some(sockets);
        self
    }

    /// Listen on (and, with a store, advertise) this address instead of choosing one.
    pub fn bind_addr(mut self, ip: IpAddr) -> Self {
        self.bind_ip = Some(ip);
        self
    }

    /// Choose the listening interface with an NCCL-style filter (`RLX_SOCKET_IFNAME`).
    pub fn ifname(mut self, filter: IfnameFilter) -> Self {
        self.ifname = Some(filter);
        self
    }

    /// How long a receiving thread polls its sockets without blocking before it sleeps in
    /// `poll(2)` (default 50 µs; `RLX_SPIN_US` with [`TcpTransport::from_env`]). Spinning saves
    /// the wake-up latency of a blocking read at the price of CPU time; zero never spins.
    pub fn spin(mut self, spin: Duration) -> Self {
        self.spin = spin;
        self
    }

    /// How often the transport's background thread sends a heartbeat on a link that carried
    /// nothing else (default 1 s; `RLX_HEARTBEAT_MS` with [`TcpTransport::from_env`]); zero
    /// turns heartbeats off.
    ///
    /// A peer that sent nothing at all (no message, no heartbeat) for five intervals is lost:
    /// every operation that needs it fails with [`CollectiveError::PeerLost`] saying for how long
    /// it was silent, without waiting for the operation timeout. This is what notices a
    /// stopped process (SIGSTOP, a debugger), a cut link or a machine gone to sleep, which send
    /// no reset. The beats come from the transport's own thread, so a caller that computes for
    /// a long time without calling the transport stays alive to its peers. Every rank should
    /// use the same interval: a rank beating less often than its peers' window is lost to them.
    pub fn heartbeat(mut self, interval: Duration) -> Self {
        self.heartbeat = interval;
        self
    }

    /// Whether large messages to ranks of this host may be read straight from this process's
    /// memory, and read from theirs (default on, Linux only; `RLX_SINGLE_COPY=0` with
    /// [`TcpTransport::from_env`] turns it off).
    ///
    /// Between two processes of one host a TCP message is copied twice by the kernel, once
    /// into the socket and once out of it, and one message runs at what one loopback stream
    /// carries. With this on, a message of at least
    /// [`single_copy_min_bytes`](Self::single_copy_min_bytes) bytes to a rank of this host is
    /// copied once, by the receiver, from the sender's buffer into its own (Linux's
    /// cross-memory attach, as Open MPI's shared-memory transport does it); the send returns
    /// when the receiver has it. When the transport is built, each rank offers its peers on
    /// this host to read it, and a peer that can (same user, no `ptrace_scope` or seccomp
    /// profile forbidding it) says so by writing into its memory; until then, and for good
    /// where it cannot, their messages go over TCP. Nothing waits for the offers. Ranks in
    /// other network namespaces count as other hosts. Both ranks of a pair must have it on.
    pub fn single_copy(mut self, on: bool) -> Self {
        self.min_single_copy = match on {
            true if self.min_single_copy == u64::MAX => DEFAULT_MIN_SINGLE_COPY,
            true => self.min_single_copy,
            false => u64::MAX,
        };
        self
    }

    /// The smallest message the single-copy path carries (default 256 KiB;
    /// `RLX_SINGLE_COPY_MIN_BYTES` with [`TcpTransport::from_env`]); smaller ones go over TCP,
    /// which is as fast for them. Turns the path on.
    pub fn single_copy_min_bytes(mut self, bytes: u64) -> Self {
        self.min_single_copy = bytes.clamp(1, u64::MAX - 1);
        self
    }

    /// Applies the engine's tuning variables of the environment: `RLX_SPIN_US` (see
    /// [`spin`](Self::spin)), `RLX_HEARTBEAT_MS` (see [`heartbeat`](Self::heartbeat)),
    /// `RLX_SINGLE_COPY` (`0` or `1`, see [`single_copy`](Self::single_copy)) and
    /// `RLX_SINGLE_COPY_MIN_BYTES` (see [`single_copy_min_bytes`](Self::single_copy_min_bytes)).
    /// Fails with `Config` when one is set but is not a number.
    pub fn tuning_env(mut self) -> Result<Self> {
        let number = |name: &str| -> Result<Option<u64>> {
            match std::env::var(name) {
                Ok(value) => value.trim().parse().map(Some).map_err(|_| {
                    CollectiveError::config(format!("{name}={value:?} is not a number"))
                }),
                Err(_) => Ok(None),
            }
        };
        if let Some(us) = number("RLX_SPIN_US")? {
            self.spin = Duration::from_micros(us);
        }
        if let Some(ms) = number("RLX_HEARTBEAT_MS")? {
            self.heartbeat = Duration::from_millis(ms);
        }
        if let Some(bytes) = number("RLX_SINGLE_COPY_MIN_BYTES")? {
            self = self.single_copy_min_bytes(bytes);
        }
        match number("RLX_SINGLE_COPY")? {
            None | Some(1) => {}
            Some(0) => self = self.single_copy(false),
            Some(other) => {
                return Err(CollectiveError::config(format!(
                    "RLX_SINGLE_COPY={other} (0 turns the single-copy path off, 1 leaves it on)"
                )));
            }
        }
        Ok(self)
    }

    /// A hook that sees every socket bootstrap creates before it is used: each listening
    /// socket (the links' listeners and rank 0's rendezvous store) before `bind`, with
    /// [`SocketRole::Listen`] and the address it will be bound to, and each connecting socket
    /// (to peers and to the store) before `connect`, with [`SocketRole::Connect`] and the
    /// destination. Accepted connections inherit their listener's options. An error from the
    /// hook fails the build: for a connecting socket as [`CollectiveError::Io`] naming the
    /// peer and address, without further attempts.
    ///
    /// The Thunderbolt transport pins sockets to its link with it (`SO_BINDTODEVICE`).
    ///
    /// # Examples
    ///
    /// ```
    /// use rlx_net::{SocketRole, TcpTransport};
    ///
    /// let builder = TcpTransport::builder().socket_setup(|socket, role| {
    ///     if let SocketRole::Connect(_) = role {
    ///         socket.set_nodelay(true)?;
    ///     }
    ///     Ok(())
    /// });
    /// # drop(builder);
    /// ```
    pub fn socket_setup(
        mut self,
        hook: impl Fn(&socket2::Socket, SocketRole) -> std::io::Result<()> + Send + Sync + 'static,
    ) -> Self {
        // The hook is configuration, not modelled state, and `std`'s `Arc` can hold a closure
        // as a trait object.
        let hook: std::sync::Arc<SocketSetupFn> = std::sync::Arc::new(hook);
        self.socket_setup = Some(SocketSetup(hook));
        self
    }

    /// Applies everything [`LaunchEnv`] read from the environment.
    pub fn launch_env(mut self, env: LaunchEnv) -> Self {
        self.rank = Some(env.rank);
        self.world = Some(env.world_size);
        self.rendezvous = Some(env.rendezvous);
        self.op_timeout = env.op_timeout;
        self.job_id = Some(env.job_id);
        self.secret = env.job_secret;
        self.ifname = env.ifname;
        if let Some(n) = env.sockets_per_peer {
            self.sockets_per_peer = Some(n);
        }
        if let Some(cap) = env.max_frame_bytes {
            self.max_frame = cap;
        }
        self
    }

    /// Rendezvous with every rank, connect and handshake every link, and start the transport.
    /// Waits up to the connect timeout for all ranks.
    pub fn build(self) -> Result<TcpTransport> {
        let config = self.clone();
        let rendezvous = self.rendezvous.ok_or_else(|| {
            CollectiveError::config("no rendezvous: give a hostfile or a master address")
        })?;
        let world = match (&rendezvous, self.world) {
            (_, Some(w)) => w,
            (Rendezvous::Hostfile(h), None) => u32::try_from(h.len())
                .map_err(|_| CollectiveError::config("the hostfile lists too many ranks"))?,
            (Rendezvous::Store { .. }, None) => {
                return Err(CollectiveError::config("no world size"));
            }
        };
        if world == 0 {
            return Err(CollectiveError::config("world size 0"));
        }
        let rank = self
            .rank
            .ok_or_else(|| CollectiveError::config("no rank given"))?;
        if rank >= world {
            return Err(CollectiveError::UnknownRank {
                rank,
                world_size: world,
            });
        }
        if self.op_timeout.is_zero() || self.max_frame == 0 {
            return Err(CollectiveError::config(
                "the operation timeout and the frame cap must be positive",
            ));
        }
        let links = match (self.sockets_per_peer, &rendezvous) {
            (Some(n), _) => n,
            (None, Rendezvous::Hostfile(h)) => h.iter().map(Vec::len).max().unwrap_or(1) as u32,
            (None, Rendezvous::Store { .. }) => 1,
        };
        if !(1..=64).contains(&links) {
            return Err(CollectiveError::config(format!(
                "{links} sockets per peer (1 to 64 are supported)"
            )));
        }
        let job_id = self
            .job_id
            .clone()
            .unwrap_or_else(|| rendezvous.derived_job_id());
        let cfg = BootConfig {
            rank,
            world,
            rendezvous,
            connect_timeout: self.connect_timeout.unwrap_or(self.op_timeout),
            hello_timeout: self.hello_timeout,
            job: job_digest(&job_id),
            secret: self.secret,
            links,
            bind_ip: self.bind_ip,
            ifname: self.ifname,
            socket_setup: self.socket_setup,
        };
        let established = bootstrap::establish(&cfg)?;
        let peers = established
            .links
            .into_iter()
            .zip(established.addrs)
            .enumerate()
            .map(|(r, (streams, addr))| (r as u32 != rank).then(|| PeerIo::new(streams, addr)))
            .collect();
        let engine = Engine::new(
            rank,
            world,
            EngineConfig {
                max_frame: self.max_frame,
                max_unexpected: self.max_unexpected,
                min_striped: self.min_striped.max(1),
                op_timeout: self.op_timeout,
                spin: self.spin,
                heartbeat: self.heartbeat,
                min_single_copy: self.min_single_copy,
            },
            peers,
        )
        .map_err(|source| CollectiveError::Io { peer: None, source })?;
        engine.offer_single_copy();
        let engine = Arc::new(engine);
        let watcher = if world > 1 {
            let e = Arc::clone(&engine);
            Some(
                thread::Builder::new()
                    .name(format!("rlx-net-watch-{rank}"))
                    .spawn(move || e.watch())
                    .map_err(|source| CollectiveError::Io { peer: None, source })?,
            )
        } else {
            None
        };
        Ok(TcpTransport {
            rank,
            world,
            engine,
            watcher,
            config,
        })
    }
}

impl TcpTransportBuilder {
    /// The job id the transport runs under: the one given, or the rendezvous's.
    pub(crate) fn effective_job_id(&self) -> String {
        match (&self.job_id, &self.rendezvous) {
            (Some(id), _) => id.clone(),
            (None, Some(rendezvous)) => rendezvous.derived_job_id(),
            (None, None) => String::new(),
        }
    }

    /// The job secret, when one is set.
    pub(crate) fn secret_bytes(&self) -> Option<Vec<u8>> {
        self.secret.clone()
    }

    /// The rendezvous, when one is set.
    pub(crate) fn rendezvous_spec(&self) -> Option<&Rendezvous> {
        self.rendezvous.as_ref()
    }

    /// How long bootstrap (and joining) waits for the other ranks.
    pub(crate) fn effective_connect_timeout(&self) -> Duration {
        self.connect_timeout.unwrap_or(self.op_timeout)
    }
}

impl TcpTransport {
    /// A builder with defaults: 300 s operation timeout, 1 GiB frame cap, one socket per peer.
    pub fn builder() -> TcpTransportBuilder {
        TcpTransportBuilder::default()
    }

    /// Builds the transport from the launch environment (every variable of
    /// [`rlx_transport::bootstrap`]).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// // RANK=0 WORLD_SIZE=2 MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 (torchrun's variables)
    /// let transport = rlx_net::TcpTransport::from_env()?;
    /// # Ok::<(), rlx_transport::CollectiveError>(())
    /// ```
    pub fn from_env() -> Result<TcpTransport> {
        Self::builder()
            .launch_env(LaunchEnv::from_env()?)
            .tuning_env()?
            .build()
    }

    /// Whether this rank reads large messages from `rank` straight from its memory (see
    /// [`TcpTransportBuilder::single_copy`]): `rank` runs on this host and offered it, and this
    /// process could read it. The offer is the first frame on the link and is taken when that
    /// link is first read, so right after the build it may not have been taken yet.
    pub fn single_copy_from(&self, rank: u32) -> bool {
        self.engine.pulls_from(rank)
    }

    /// The address of `rank`'s first link, when connected.
    pub fn peer_addr(&self, rank: u32) -> Option<SocketAddr> {
        self.engine.peer_addr(rank)
    }

    /// This end's address of the first link to `rank`, when connected.
    pub(crate) fn local_addr_towards(&self, rank: u32) -> Option<SocketAddr> {
        self.engine.local_addr_towards(rank)
    }

    /// Joins a running job from the launch environment (see [`TcpTransportBuilder::join`]):
    /// the same variables as [`TcpTransport::from_env`], whose rank and world size are
    /// ignored.
    pub fn join_from_env() -> Result<TcpTransport> {
        Self::builder()
            .launch_env(LaunchEnv::from_env()?)
            .tuning_env()?
            .join()
    }

    fn finish(&self, from: u32, outcome: Outcome) -> Result<Vec<u8>> {
        match outcome {
            Outcome::Owned(bytes) => Ok(bytes),
            Outcome::Landed(_) => Err(CollectiveError::protocol(
                Some(from),
                "message landed in a buffer that was not given",
            )),
            Outcome::Failure(f) => Err(f.into_error(from)),
            Outcome::TooLong { capacity, got } => Err(CollectiveError::LengthMismatch {
                op: "recv",
                peer: Some(from),
                expected: capacity as u64,
                got,
            }),
        }
    }
}

impl Transport for TcpTransport {
    fn rank(&self) -> u32 {
        self.rank
    }

    fn world_size(&self) -> u32 {
        self.world
    }

    fn send_message(&self, to: u32, tag: Tag, parts: &[&[u8]]) -> Result<()> {
        self.engine.send(to, FrameKind::Data, tag, parts)
    }

    fn recv_message(&self, from: u32, tag: Tag, timeout: Duration) -> Result<Option<Vec<u8>>> {
        match self.engine.recv(from, tag, None, timeout)? {
            Some(outcome) => self.finish(from, outcome).map(Some),
            None => Ok(None),
        }
    }

    fn recv_message_into(
        &self,
        from: u32,
        tag: Tag,
        buf: &mut [u8],
        timeout: Duration,
    ) -> Result<Option<usize>> {
        let capacity = buf.len();
        let outcome = self.engine.recv(from, tag, Some(&mut *buf), timeout)?;
        into_buffer(outcome, buf, from, capacity)
    }

    fn traffic(&self) -> Option<rlx_transport::Traffic> {
        Some(self.engine.traffic())
    }

    fn segment_hint(&self, members: &[u32]) -> Option<usize> {
        self.engine.segment_hint(members)
    }

    fn send_recv_into(
        &self,
        to: u32,
        from: u32,
        tag: Tag,
        parts: &[&[u8]],
        buf: &mut [u8],
        timeout: Duration,
    ) -> Result<Option<usize>> {
        let capacity = buf.len();
        let outcome = self
            .engine
            .send_recv(to, from, tag, parts, &mut *buf, timeout)?;
        into_buffer(outcome, buf, from, capacity)
    }

    fn send_failure(&self, to: u32, tag: Tag, failure: Failure) -> Result<()> {
        self.engine
            .send(to, FrameKind::Failure, tag, &[&failure.encode()])
    }

    fn try_send_message(&self, to: u32, tag: Tag, parts: &[&[u8]], wait: Duration) -> Result<bool> {
        self.engine.try_send(to, FrameKind::Data, tag, parts, wait)
    }

    fn try_send_failure(
        &self,
        to: u32,
        tag: Tag,
        failure: Failure,
        wait: Duration,
    ) -> Result<bool> {
        self.engine
            .try_send(to, FrameKind::Failure, tag, &[&failure.encode()], wait)
    }

    fn op_timeout(&self) -> Duration {
        self.engine.op_timeout()
    }

    fn exclude_peer(&self, peer: u32) -> Result<()> {
        self.engine.exclude(peer)
    }

    fn admission(&self) -> Option<&dyn rlx_transport::Admission> {
        Some(self)
    }

    fn abort(&self) {
        self.engine.abort();
    }
}

impl Drop for TcpTransport {
    fn drop(&mut self) {
        self.engine.close();
        if let Some(watcher) = self.watcher.take() {
            let _ = watcher.join();
        }
    }
}

/// What a receive into the caller's `buf` (of `capacity` bytes) from `from` ended with, as the
/// [`Transport`] contract states it: the length landed, or `None` at the deadline.
fn into_buffer(
    outcome: Option<Outcome>,
    buf: &mut [u8],
    from: u32,
    capacity: usize,
) -> Result<Option<usize>> {
    match outcome {
        None => Ok(None),
        Some(Outcome::Landed(n)) => Ok(Some(n)),
        Some(Outcome::Owned(bytes)) => {
            let dst = buf
                .get_mut(..bytes.len())
                .ok_or(CollectiveError::LengthMismatch {
                    op: "recv",
                    peer: Some(from),
                    expected: capacity as u64,
                    got: bytes.len() as u64,
                })?;
            dst.copy_from_slice(&bytes);
            Ok(Some(bytes.len()))
        }
        Some(Outcome::Failure(f)) => Err(f.into_error(from)),
        Some(Outcome::TooLong { capacity, got }) => Err(CollectiveError::LengthMismatch {
            op: "recv",
            peer: Some(from),
            expected: capacity as u64,
            got,
        }),
    }
}
