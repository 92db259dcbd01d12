//! [`TcpTransportBuilder`]: the configuration of a [`TcpTransport`](crate::TcpTransport) (rendezvous, timeouts,
//! limits, the engine's tuning and the environment that sets them). Its `build`, which acts on
//! the configuration, is `start.rs`'s.

use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use rlx_transport::ifname::IfnameFilter;
use rlx_transport::{DEFAULT_OP_TIMEOUT, LaunchEnv, Rendezvous, Result};

use crate::bootstrap::{DEFAULT_HELLO_TIMEOUT, SocketRole, SocketSetup, SocketSetupFn};
use crate::progress::{
    DEFAULT_HEARTBEAT, DEFAULT_LANE_BYTES, DEFAULT_MAX_BOUNCED, DEFAULT_MIN_SINGLE_COPY,
    DEFAULT_SPIN,
};

/// Default frame cap: the largest message accepted from the wire (`RLX_MAX_FRAME_BYTES`).
pub const DEFAULT_MAX_FRAME_BYTES: u64 = 1 << 30;
/// Default per-peer budget of unexpected bytes (messages nobody waits for yet).
pub const DEFAULT_MAX_UNEXPECTED_BYTES: u64 = 64 << 20;
/// Messages at least this long are striped over the links of a peer when there are several.
pub const DEFAULT_MIN_STRIPED_BYTES: u64 = 256 << 10;

/// Configures and builds a [`TcpTransport`](crate::TcpTransport); see [`TcpTransport::builder`](crate::TcpTransport::builder).
#[derive(Clone)]
pub struct TcpTransportBuilder {
    pub(crate) rank: Option<u32>,
    pub(crate) world: Option<u32>,
    pub(crate) rendezvous: Option<Rendezvous>,
    pub(crate) op_timeout: Duration,
    pub(crate) connect_timeout: Option<Duration>,
    pub(crate) hello_timeout: Duration,
    pub(crate) job_id: Option<String>,
    pub(crate) secret: Option<Vec<u8>>,
    pub(crate) max_frame: u64,
    pub(crate) max_unexpected: u64,
    pub(crate) min_striped: u64,
    pub(crate) sockets_per_peer: Option<u32>,
    pub(crate) bind_ip: Option<IpAddr>,
    pub(crate) ifname: Option<IfnameFilter>,
    pub(crate) spin: Duration,
    pub(crate) heartbeat: Duration,
    pub(crate) min_single_copy: u64,
    pub(crate) max_bounced: u64,
    pub(crate) longest_hold: Duration,
    pub(crate) landing_grace: Duration,
    pub(crate) lane_bytes: u64,
    pub(crate) socket_setup: Option<SocketSetup>,
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
            max_bounced: DEFAULT_MAX_BOUNCED,
            longest_hold: crate::matching::LONGEST_HOLD,
            landing_grace: crate::progress::LANDING_GRACE,
            lane_bytes: DEFAULT_LANE_BYTES,
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
    /// `poll(2)` (default 50 µs; `RLX_SPIN_US` with [`TcpTransport::from_env`](crate::TcpTransport::from_env)). Spinning saves
    /// the wake-up latency of a blocking read at the price of CPU time; zero never spins.
    pub fn spin(mut self, spin: Duration) -> Self {
        self.spin = spin;
        self
    }

    /// How often the transport's background thread sends a heartbeat on a link that carried
    /// nothing else (default 1 s; `RLX_HEARTBEAT_MS` with [`TcpTransport::from_env`](crate::TcpTransport::from_env)); zero
    /// turns heartbeats off.
    ///
    /// A peer that sent nothing at all (no message, no heartbeat) for five intervals is lost:
    /// every operation that needs it fails with [`CollectiveError::PeerLost`](rlx_transport::CollectiveError::PeerLost) saying for how long
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
    /// [`TcpTransport::from_env`](crate::TcpTransport::from_env) turns it off).
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

    /// How much of a single-copy message passes through a shared-memory bounce file (default
    /// 64 MiB; `RLX_BOUNCE_BYTES` with [`TcpTransport::from_env`](crate::TcpTransport::from_env); 0 bounces nothing).
    ///
    /// A receiver reads another process's memory at about a third of the speed of a plain
    /// memory copy. So the sender copies the message's first `bytes` into a shared-memory file
    /// of its own while the receiver copies them out right behind it, and the receiver reads
    /// only the rest from the sender's memory. Each rank keeps one such file per peer it sends
    /// large messages to, as large as the largest head it bounced (at most `bytes`, plus a
    /// page). Where the receiver cannot map the file, the message is read whole as before.
    pub fn bounce_bytes(mut self, bytes: u64) -> Self {
        self.max_bounced = bytes;
        self
    }

    /// The ring size of the shared-memory lane to each rank of this host (default 256 KiB;
    /// `RLX_LANE_BYTES` with [`TcpTransport::from_env`](crate::TcpTransport::from_env); 0 keeps every link on TCP).
    ///
    /// The first link to a rank of this host carries its frames through a ring in a shared-memory file once both ranks mapped it, instead of
    /// the loopback TCP connection: a small message then costs two memory copies instead of
    /// two system calls and the kernel's TCP work. The connection stays open, for wake-ups,
    /// heartbeats and noticing the peer's end. Each rank keeps one ring per such peer. Lanes
    /// and the single-copy path are switched independently of each other.
    pub fn lane_bytes(mut self, bytes: u64) -> Self {
        self.lane_bytes = bytes;
        self
    }

    /// The smallest message the single-copy path carries (default 256 KiB;
    /// `RLX_SINGLE_COPY_MIN_BYTES` with [`TcpTransport::from_env`](crate::TcpTransport::from_env)); smaller ones go over TCP,
    /// which is as fast for them. Turns the path on.
    pub fn single_copy_min_bytes(mut self, bytes: u64) -> Self {
        self.min_single_copy = bytes.clamp(1, u64::MAX - 1);
        self
    }

    /// The longest a large unexpected message (4 MiB or more) waits unread for its receive
    /// (default 100 ms, shorter for messages under about 100 MB). Not a tuning
    /// knob: tests that must arrange for a receive to be posted while a message waits set it
    /// long, so that how the machine schedules them cannot end the wait first.
    #[doc(hidden)]
    pub fn longest_hold(mut self, hold: Duration) -> Self {
        self.longest_hold = hold;
        self
    }

    /// How long a receive whose message is landing in its buffer when its deadline passes goes
    /// on without a byte landing before it gives up (default 100 ms). Not a tuning knob: tests
    /// that measure what a receive keeps in memory set it long, so that a busy machine's pauses
    /// cannot end a receive mid-message.
    #[doc(hidden)]
    pub fn landing_grace(mut self, grace: Duration) -> Self {
        self.landing_grace = grace;
        self
    }

    /// Applies the engine's tuning variables of the environment (names and defaults in
    /// [`env`](mod@crate::env) and the README's table): `RLX_SPIN_US` (see [`spin`](Self::spin)),
    /// `RLX_HEARTBEAT_MS` (see [`heartbeat`](Self::heartbeat)), `RLX_SINGLE_COPY` (`0` or `1`,
    /// see [`single_copy`](Self::single_copy)), `RLX_SINGLE_COPY_MIN_BYTES` (see
    /// [`single_copy_min_bytes`](Self::single_copy_min_bytes)), `RLX_BOUNCE_BYTES` (see
    /// [`bounce_bytes`](Self::bounce_bytes)) and `RLX_LANE_BYTES` (see
    /// [`lane_bytes`](Self::lane_bytes)). As everywhere in the environment, `0` turns each
    /// off: `RLX_SINGLE_COPY_MIN_BYTES=0` as `RLX_SINGLE_COPY=0` does (`1` carries every
    /// message).
    /// Fails with `Config` when one is set but is not a number.
    pub fn tuning_env(mut self) -> Result<Self> {
        let tuning = crate::env::Tuning::from_env()?;
        if let Some(us) = tuning.spin_us {
            self.spin = Duration::from_micros(us);
        }
        if let Some(ms) = tuning.heartbeat_ms {
            self.heartbeat = Duration::from_millis(ms);
        }
        match tuning.single_copy_min_bytes {
            Some(0) => self = self.single_copy(false),
            Some(bytes) => self = self.single_copy_min_bytes(bytes),
            None => {}
        }
        if let Some(bytes) = tuning.bounce_bytes {
            self = self.bounce_bytes(bytes);
        }
        if let Some(bytes) = tuning.lane_bytes {
            self = self.lane_bytes(bytes);
        }
        if tuning.single_copy == Some(false) {
            self = self.single_copy(false);
        }
        Ok(self)
    }

    /// A hook that sees every socket bootstrap creates before it is used: each listening
    /// socket (the links' listeners and rank 0's rendezvous store) before `bind`, with
    /// [`SocketRole::Listen`] and the address it will be bound to, and each connecting socket
    /// (to peers and to the store) before `connect`, with [`SocketRole::Connect`] and the
    /// destination. Accepted connections inherit their listener's options, and the hook sees
    /// each of them too, with [`SocketRole::Accepted`] and the peer's address, before anything
    /// is read from it. An error from the hook fails the build: for a connecting socket as
    /// [`CollectiveError::Io`](rlx_transport::CollectiveError::Io) naming the peer and
    /// address, without further attempts; for an accepted connection, it closes that
    /// connection alone.
    ///
    /// The Thunderbolt transport pins sockets to its links with it (`SO_BINDTODEVICE`), and
    /// closes accepted connections that did not come over one.
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
        if env.standalone {
            tracing::info!(
                "no launch variables (rank, world size, hostfile or master address) are set: \
                 running as a world of one rank"
            );
        }
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

    /// The rendezvous, when one is set: what a wrapping builder (the Thunderbolt transport's)
    /// plans its links from, so that it takes the option from this builder instead of
    /// repeating it.
    pub fn rendezvous_spec(&self) -> Option<&Rendezvous> {
        self.rendezvous.as_ref()
    }

    /// The rank, when one is set (see [`rendezvous_spec`](Self::rendezvous_spec) for why).
    pub fn rank_spec(&self) -> Option<u32> {
        self.rank
    }

    /// How long bootstrap (and joining) waits for the other ranks.
    pub(crate) fn effective_connect_timeout(&self) -> Duration {
        self.connect_timeout.unwrap_or(self.op_timeout)
    }
}
