//! How an [`MlxTransport`] comes up: checking the launch environment, joining MLX's group of
//! the chosen backend on a helper thread (MLX's ring waits for its neighbours without a
//! deadline, so the caller gives up at the operation timeout), or splitting an existing one,
//! and then starting the transport's threads over the group.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use rlx_transport::{CollectiveError, Inbox, Result};

use crate::backend::{Backend, Topology};
use crate::env::{
    backend_from_env, check_mpi_env, check_ring_env, direct_max_from_env, env_var, timeout_from_env,
};
use crate::ffi::{self, Group};
use crate::pool::ArrayPool;
use crate::progress::{collective_loop, receiver_loop, sender_loop};
use crate::shared::{ExitState, Exits, Link, Role, Shared, State, WorldGuard};
use crate::transport::MlxTransport;

/// How a transport's ranks are linked.
struct LinkKind {
    topology: Topology,
    byte_stream: bool,
}

/// Whether this MLX build offers `backend` (`Any`: whether it offers any).
pub fn is_available(backend: Backend) -> bool {
    ffi::is_available(backend.name())
}

impl MlxTransport {
    /// Joins the MLX world of `backend`, as launched by MLX's own tools: `MLX_HOSTFILE` and
    /// `MLX_RANK` for the ring, `MLX_IBV_DEVICES`, `MLX_JACCL_COORDINATOR` and `MLX_RANK` for
    /// JACCL, `mpirun` (and `MLX_MPI_LIBNAME`) for MPI. [`Backend::Any`] picks the first
    /// backend whose variables are present and gives a world of one when none are.
    ///
    /// Waits until every rank has joined, at most the operation timeout (`RLX_TIMEOUT_MS`,
    /// default 300 s).
    pub fn init(backend: Backend) -> Result<MlxTransport> {
        Self::init_with_timeout(backend, timeout_from_env()?)
    }

    /// [`MlxTransport::init`] on the backend named by `RLX_MLX_BACKEND` (`any` when unset).
    pub fn from_env() -> Result<MlxTransport> {
        Self::init(backend_from_env()?)
    }

    /// [`MlxTransport::init`] with an explicit operation timeout for joining and for every
    /// blocking call without its own deadline.
    pub fn init_with_timeout(backend: Backend, op_timeout: Duration) -> Result<MlxTransport> {
        let resolved = backend.resolve(env_var);
        let (name, strict) = match resolved {
            Some(b) => (b.name(), true),
            None => ("any", false),
        };
        match resolved {
            Some(Backend::Ring) => check_ring_env()?,
            Some(Backend::Mpi) => check_mpi_env()?,
            _ => {}
        }
        if !ffi::is_available(name) {
            return Err(CollectiveError::unsupported(format!(
                "this MLX build has no {name} backend"
            )));
        }
        // MLX hands every caller of init the same cached group, and two transports on one
        // group would read each other's bytes.
        let world_guard = WorldGuard::take()?;
        // MLX's ring waits in accept() for its left neighbour without a deadline, so joining
        // runs on a helper thread and the caller gives up after the timeout.
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("rlx-mlx-init".to_owned())
            .spawn(move || {
                let _ = tx.send(Group::init(strict, name));
            })
            .map_err(|e| CollectiveError::Io {
                peer: None,
                source: e,
            })?;
        let group = match rx.recv_timeout(op_timeout) {
            Ok(Ok(group)) => group,
            Ok(Err(e)) => {
                return Err(CollectiveError::config(format!(
                    "MLX could not initialise the {name} backend: {e}"
                )));
            }
            Err(_) => {
                return Err(CollectiveError::Timeout {
                    peer: None,
                    op: "MLX init",
                    after: op_timeout,
                });
            }
        };
        let backend = resolved.unwrap_or(Backend::Any);
        let links = LinkKind {
            topology: backend.topology(env_var),
            byte_stream: backend.is_byte_stream(env_var),
        };
        let transport = Self::start(
            group,
            backend,
            links,
            op_timeout,
            direct_max_from_env()?,
            world_guard,
        )?;
        Ok(transport)
    }

    /// A transport over the sub-group of the ranks that pass the same `color`, ordered by
    /// `key` (a negative key keeps this world's order), like `MPI_Comm_split`. Collective:
    /// every rank of this world must call it. MLX's ring and JACCL backends cannot split
    /// and report [`CollectiveError::Unsupported`].
    pub fn split(&self, color: i32, key: i32) -> Result<MlxTransport> {
        let group = self.shared.group.split(color, key).map_err(|e| {
            CollectiveError::unsupported(format!(
                "MLX {} backend cannot split: {e}",
                self.shared.backend
            ))
        })?;
        Self::start(
            group,
            self.shared.backend,
            LinkKind {
                topology: Topology::Mesh,
                byte_stream: false,
            },
            self.shared.op_timeout,
            self.shared.direct_max.load(Ordering::Relaxed),
            None,
        )
    }

    /// Starts a transport over `group`, which MLX has joined: builds the state the callers
    /// and threads share and spawns the collective thread and every link's sender and
    /// receiver.
    fn start(
        group: Group,
        backend: Backend,
        links: LinkKind,
        op_timeout: Duration,
        direct_max: usize,
        world_guard: Option<WorldGuard>,
    ) -> Result<MlxTransport> {
        let LinkKind {
            topology,
            byte_stream,
        } = links;
        let (rank, world) = match (group.rank(), group.size()) {
            (Some(rank), Some(world)) if world > 0 && rank < world => (rank, world),
            (rank, world) => {
                return Err(CollectiveError::config(format!(
                    "MLX reported rank {rank:?} in a world of {world:?}"
                )));
            }
        };
        let peers = topology.links(rank, world);
        let n = peers.len();
        let shared = Arc::new(Shared {
            _world_guard: world_guard,
            group,
            rank,
            world,
            backend,
            topology,
            byte_stream,
            op_timeout,
            inbox: Inbox::new(rank),
            links: peers
                .into_iter()
                .map(|peer| Link {
                    peer,
                    queue: Mutex::new(VecDeque::new()),
                    queued: Condvar::new(),
                    sending: Mutex::new(()),
                })
                .collect(),
            arrays: ArrayPool::default(),
            state: Mutex::new(State {
                aborted: false,
                closing: false,
                broken: None,
                dead: vec![None; n],
                peer_left: vec![false; n],
                epoch: 0,
                sender_paused: vec![false; n],
                peer_paused: vec![None; n],
                demand: vec![Vec::new(); n],
                polled: vec![Vec::new(); n],
                pausing: 0,
                receiving: vec![false; n],
                owned: false,
                collective_stuck: false,
                always_receive: topology == Topology::Ring && world >= 4,
            }),
            changed: Condvar::new(),
            collective: Mutex::new(()),
            direct_max: AtomicUsize::new(direct_max),
            native_seq: AtomicU32::new(0),
            next_waiter: AtomicU64::new(0),
            exits: Arc::new(Exits {
                done: Mutex::new(ExitState {
                    senders: vec![false; n],
                    receivers: vec![false; n],
                    collective: false,
                }),
                changed: Condvar::new(),
            }),
            jobs: Mutex::new(VecDeque::new()),
            job_queued: Condvar::new(),
        });
        let spawn = |name: String, role: Role| {
            let s = Arc::clone(&shared);
            let exits = Arc::clone(&shared.exits);
            std::thread::Builder::new()
                .name(name)
                .spawn(move || {
                    match role {
                        Role::Collective => collective_loop(&s),
                        Role::Sender(index) => sender_loop(&s, index),
                        Role::Receiver(index) => receiver_loop(&s, index),
                    }
                    drop(s);
                    exits.mark(role);
                })
                .map(drop)
                .map_err(|e| CollectiveError::Io {
                    peer: None,
                    source: e,
                })
        };
        spawn("rlx-mlx-collective".to_owned(), Role::Collective)?;
        for (index, link) in shared.links.iter().enumerate() {
            spawn(format!("rlx-mlx-send-{}", link.peer), Role::Sender(index))?;
            spawn(format!("rlx-mlx-recv-{}", link.peer), Role::Receiver(index))?;
        }
        Ok(MlxTransport { shared })
    }
}
