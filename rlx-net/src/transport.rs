//! [`TcpTransport`]: the [`Transport`] methods on top of the [progress engine](crate::progress);
//! its configuration is [`TcpTransportBuilder`] (`builder.rs`), its start `start.rs`.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use rlx_transport::{CollectiveError, Failure, LaunchEnv, Result, Tag, Topology, Transport};

use crate::builder::TcpTransportBuilder;
use crate::frame::FrameKind;
use crate::matching::Outcome;
use crate::progress::Engine;
use crate::sync::{Arc, thread};

/// The TCP transport (Unix): one or more TCP connections to every other rank, driven by the
/// threads that call it.
///
/// Build one with [`TcpTransport::from_env`] (launched by torchrun, `mlx.launch`, Open MPI,
/// PMI or Slurm, see [`rlx_transport::bootstrap`]) or [`TcpTransport::builder`]. Every
/// blocking call ends: with data, at its deadline, with [`CollectiveError::PeerLost`] naming a
/// peer that closed, crashed or reset, or with [`CollectiveError::Aborted`] after
/// [`Transport::abort`]. A receive into a buffer whose message is landing when its deadline
/// passes goes on while bytes keep coming, and gives up only after 100 ms without one: the
/// message then needs no second buffer of its size. Dropping the transport says goodbye to every peer (they see
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
    /// The link matrix of the world joined at start (see [`Transport::topology`]).
    topology: Option<Topology>,
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

impl TcpTransport {
    /// The transport of a started `engine` (see [`TcpTransportBuilder::build`]), whose
    /// background thread is `watcher` (none in a world of one), with the link matrix
    /// bootstrap worked out.
    pub(crate) fn running(
        rank: u32,
        world: u32,
        engine: Arc<Engine>,
        watcher: Option<thread::JoinHandle<()>>,
        config: TcpTransportBuilder,
        topology: Option<Topology>,
    ) -> Self {
        Self {
            rank,
            world,
            engine,
            watcher,
            config,
            topology,
        }
    }

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

    /// Whether this rank reads `rank`'s first link through a shared-memory lane (see
    /// [`TcpTransportBuilder::lane_bytes`]): `rank` runs on this host, both ranks have lanes
    /// on, this rank mapped `rank`'s lane, and `rank` switched to it at a send after that.
    pub fn lane_from(&self, rank: u32) -> bool {
        self.engine.reads_lane_from(rank)
    }

    /// Whether a large message of `rank` that arrived before its receive waits in `rank`'s
    /// memory for that receive right now (see `TcpTransportBuilder::longest_hold`). For tests
    /// that must post a receive while a message waits.
    #[doc(hidden)]
    pub fn holds_message_from(&self, rank: u32) -> bool {
        self.engine.holds_message_from(rank)
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
                dtype: None,
                lengths: Vec::new(),
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

    fn unreceived_from(&self, from: u32) -> Vec<(Tag, u64)> {
        self.engine.unreceived_from(from)
    }

    fn traffic(&self) -> Option<rlx_transport::Traffic> {
        Some(self.engine.traffic())
    }

    fn segment_hint(&self, members: &[u32]) -> Option<usize> {
        self.engine.segment_hint(members)
    }

    fn topology(&self) -> Option<Topology> {
        self.topology.clone()
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

    fn try_send_message_during(
        &self,
        to: u32,
        tag: Tag,
        parts: &[&[u8]],
        wait: Duration,
        meanwhile: &mut dyn FnMut() -> Result<()>,
    ) -> Result<bool> {
        self.engine.try_send_during(to, tag, parts, wait, meanwhile)
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
                    dtype: None,
                    lengths: Vec::new(),
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
            dtype: None,
            lengths: Vec::new(),
        }),
    }
}
