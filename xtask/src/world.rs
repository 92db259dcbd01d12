//! How the ranks of a local job find each other: the transport they use, the environment a
//! launcher sets for each rank (a rank-0 rendezvous store, an RLX hostfile or an MLX
//! hostfile), the optional network namespaces, and the release build of the rank binary.
//!
//! The ranks of `test-cluster` and `bench` are this very binary re-executed with a hidden
//! subcommand, so they run exactly the collectives a user's program would, built once.

use std::fs;
use std::path::{Path, PathBuf};

use clap::{Args, ValueEnum};

use crate::cmd::{cargo, workspace_root};
use crate::job::{self, ChildSpec};
use crate::netns::{self, Topology};

/// The transports a local job can run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum TransportKind {
    /// `TcpTransport` (`RLX_BACKEND=tcp`), one process per rank.
    Tcp,
    /// `ThunderboltTransport` (`RLX_BACKEND=tb`), one process per rank; needs a `thunderbolt*`
    /// interface, which `--netns` provides.
    Tb,
    /// `MlxTransport` over MLX's ring backend (`RLX_BACKEND=mlx`), one process per rank.
    Mlx,
    /// `MemTransport`: every rank a thread of one process.
    Mem,
}

impl TransportKind {
    /// The value of `RLX_BACKEND` for this transport (`mem` is not a backend of `init()`).
    pub(crate) fn name(self) -> &'static str {
        match self {
            TransportKind::Tcp => "tcp",
            TransportKind::Tb => "tb",
            TransportKind::Mlx => "mlx",
            TransportKind::Mem => "mem",
        }
    }
}

/// How socket ranks find each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Rendezvous {
    /// `RLX_MASTER_ADDR`/`RLX_MASTER_PORT`: rank 0 hosts the rendezvous store.
    Store,
    /// `RLX_HOSTFILE`: a JSON list of `["host:port"]` per rank, as MLX's launcher writes.
    Hostfile,
}

/// Variables a user's shell may carry that would tell a launched rank something other than
/// what this launcher means; they are removed from every rank's environment.
const LAUNCH_VARIABLES: &[&str] = &[
    "RLX_BACKEND",
    "RLX_RANK",
    "RLX_WORLD_SIZE",
    "RLX_MASTER_ADDR",
    "RLX_MASTER_PORT",
    "RLX_HOSTFILE",
    "RLX_SOCKET_IFNAME",
    "RLX_TB_IFNAME",
    "RLX_TIMEOUT_MS",
    "RANK",
    "WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "MLX_RANK",
    "MLX_HOSTFILE",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "PMI_RANK",
    "PMI_SIZE",
    "SLURM_PROCID",
    "SLURM_NTASKS",
];

/// The port every rank listens on inside its own namespace (namespaces have no other users).
const NETNS_PORT: u16 = 29500;

/// What the launcher needs to know to start a world.
#[derive(Debug, Clone)]
pub(crate) struct WorldConfig {
    /// The transport.
    pub(crate) transport: TransportKind,
    /// Number of ranks.
    pub(crate) size: u32,
    /// How socket ranks rendezvous.
    pub(crate) rendezvous: Rendezvous,
    /// `RLX_TIMEOUT_MS` for every rank, when set.
    pub(crate) timeout_ms: Option<u64>,
    /// Whether each rank runs in its own network namespace.
    pub(crate) netns: bool,
    /// A `tbf` rate for the namespace links (`"20gbit"`), with `netns`.
    pub(crate) rate: Option<String>,
}

/// The flags that choose a local job's world, shared by `test-cluster` and `bench`.
#[derive(Debug, Clone, Args)]
pub(crate) struct WorldArgs {
    /// Transport the ranks talk over (`mem`: every rank a thread of one process).
    #[arg(long, value_enum, default_value_t = TransportKind::Tcp)]
    pub(crate) transport: TransportKind,
    /// How socket ranks find each other.
    #[arg(long, value_enum, default_value_t = Rendezvous::Store)]
    pub(crate) rendezvous: Rendezvous,
    /// Run each rank in its own network namespace, joined by veth links named thunderbolt0
    /// (needs root).
    #[arg(long)]
    pub(crate) netns: bool,
    /// With --netns: a tbf rate limit on every link (e.g. 20gbit, Thunderbolt 4's TCP rate).
    #[arg(long, requires = "netns")]
    pub(crate) rate: Option<String>,
}

impl WorldArgs {
    /// The defaults: TCP ranks on this host that meet at a rank-0 store.
    pub(crate) fn tcp() -> WorldArgs {
        WorldArgs {
            transport: TransportKind::Tcp,
            rendezvous: Rendezvous::Store,
            netns: false,
            rate: None,
        }
    }

    /// `transport` instead of TCP, the rest as [`WorldArgs::tcp`].
    pub(crate) fn over(transport: TransportKind) -> WorldArgs {
        WorldArgs {
            transport,
            ..WorldArgs::tcp()
        }
    }

    /// The world of `size` ranks these flags describe.
    pub(crate) fn config(&self, size: u32, timeout_ms: Option<u64>) -> WorldConfig {
        WorldConfig {
            transport: self.transport,
            size,
            rendezvous: self.rendezvous,
            timeout_ms,
            netns: self.netns,
            rate: self.rate.clone(),
        }
    }
}

/// A prepared world: ports chosen, hostfile written, namespaces created. Dropping it removes
/// the hostfile and the namespaces.
#[derive(Debug)]
pub(crate) struct World {
    config: WorldConfig,
    topology: Option<Topology>,
    hostfile: Option<PathBuf>,
    master: (String, u16),
}

impl WorldConfig {
    /// Refuses combinations that cannot work, before anything is built or created.
    pub(crate) fn validate(&self) -> Result<(), String> {
        if self.size == 0 {
            return Err("a world needs at least one rank".to_owned());
        }
        if self.netns && self.transport == TransportKind::Mem {
            return Err(
                "--netns needs one process per rank; it does not apply to --transport mem"
                    .to_owned(),
            );
        }
        if self.netns {
            netns::check_available()?;
        }
        if let Some(rate) = &self.rate {
            netns::burst_bytes(rate)?;
        }
        Ok(())
    }
}

impl World {
    /// Prepares the world described by `config`.
    pub(crate) fn prepare(config: &WorldConfig) -> Result<World, String> {
        config.validate()?;
        if config.transport == TransportKind::Tb && !config.netns {
            eprintln!(
                "xtask: note: --transport tb without --netns needs a real thunderbolt interface on this host"
            );
        }
        let topology = if config.netns {
            Some(Topology::create(config.size, config.rate.as_deref())?)
        } else {
            None
        };
        let addresses: Vec<(String, u16)> = match &topology {
            Some(_) => (0..config.size)
                .map(|rank| (Topology::address_of(rank).to_string(), NETNS_PORT))
                .collect(),
            None => job::free_ports(config.size as usize)?
                .into_iter()
                .map(|port| ("127.0.0.1".to_owned(), port))
                .collect(),
        };
        let needs_hostfile =
            config.transport == TransportKind::Mlx || config.rendezvous == Rendezvous::Hostfile;
        let hostfile = if needs_hostfile && config.transport != TransportKind::Mem {
            Some(write_hostfile(&addresses)?)
        } else {
            None
        };
        let master = addresses
            .first()
            .cloned()
            .unwrap_or_else(|| ("127.0.0.1".to_owned(), NETNS_PORT));
        Ok(World {
            config: config.clone(),
            topology,
            hostfile,
            master,
        })
    }

    /// Takes `rank`'s link away (see [`Topology::cut`]); only `--netns` worlds have links to
    /// cut.
    pub(crate) fn cut_link(&self, rank: u32, drop_all: bool) -> Result<(), String> {
        match &self.topology {
            Some(topology) => topology.cut(rank, drop_all),
            None => Err("only a --netns world has links to cut".to_owned()),
        }
    }

    /// The network namespace of `rank`, in `--netns` worlds.
    pub(crate) fn namespace_of(&self, rank: u32) -> Option<&str> {
        self.topology.as_ref()?.namespace_of(rank)
    }

    /// The configuration this world was prepared from.
    pub(crate) fn config(&self) -> &WorldConfig {
        &self.config
    }

    /// How many processes the world runs as (one, for the in-process transport).
    pub(crate) fn process_count(&self) -> u32 {
        match self.config.transport {
            TransportKind::Mem => 1,
            _ => self.config.size,
        }
    }

    /// The spec of process `index` running `program args`, with the environment a launcher
    /// sets for that rank.
    pub(crate) fn child(&self, index: u32, program: &Path, args: Vec<String>) -> ChildSpec {
        let label = match self.config.transport {
            TransportKind::Mem => "ranks".to_owned(),
            _ => format!("rank {index}"),
        };
        let mut spec = ChildSpec::new(label, program)
            .args(args)
            .env(rlx_collective::PREFIXED_VAR, "1");
        spec.env_remove = LAUNCH_VARIABLES.iter().map(|v| (*v).to_owned()).collect();
        let size = self.config.size.to_string();
        if let Some(ms) = self.config.timeout_ms {
            spec = spec.env("RLX_TIMEOUT_MS", ms.to_string());
        }
        match self.config.transport {
            TransportKind::Mem => return spec.env("RLX_WORLD_SIZE", size),
            TransportKind::Mlx => {
                spec = spec
                    .env("RLX_BACKEND", "mlx")
                    .env("MLX_RANK", index.to_string());
                if let Some(file) = &self.hostfile {
                    spec = spec.env("MLX_HOSTFILE", file.display().to_string());
                }
            }
            TransportKind::Tcp | TransportKind::Tb => {
                spec = spec
                    .env("RLX_BACKEND", self.config.transport.name())
                    .env("RLX_RANK", index.to_string())
                    .env("RLX_WORLD_SIZE", size);
                match (&self.hostfile, self.config.rendezvous) {
                    (Some(file), Rendezvous::Hostfile) => {
                        spec = spec.env("RLX_HOSTFILE", file.display().to_string());
                    }
                    _ => {
                        spec = spec
                            .env("RLX_MASTER_ADDR", self.master.0.clone())
                            .env("RLX_MASTER_PORT", self.master.1.to_string());
                    }
                }
            }
        }
        if let Some(topology) = &self.topology {
            spec.netns = topology.namespace_of(index).map(str::to_owned);
            // Inside a namespace the only links are `lo` and `thunderbolt0`; naming the
            // interface makes the advertised address the one the other ranks can reach.
            spec = spec.env("RLX_SOCKET_IFNAME", format!("={}", netns::IFNAME));
        }
        spec
    }
}

impl Drop for World {
    fn drop(&mut self) {
        if let Some(file) = self.hostfile.take() {
            // The file lives under target/; a leftover is harmless, so a failure is ignored.
            let _ = fs::remove_file(file);
        }
    }
}

/// Writes an MLX-style hostfile (one `["host:port"]` list per rank) under `target/xtask/`.
fn write_hostfile(addresses: &[(String, u16)]) -> Result<PathBuf, String> {
    let entries: Vec<Vec<String>> = addresses
        .iter()
        .map(|(host, port)| vec![format!("{host}:{port}")])
        .collect();
    let text = serde_json::to_string(&entries)
        .map_err(|e| format!("could not encode the hostfile: {e}"))?;
    let dir = scratch_dir()?;
    let path = dir.join(format!("hostfile-{}.json", std::process::id()));
    fs::write(&path, text).map_err(|e| format!("could not write {}: {e}", path.display()))?;
    Ok(path)
}

/// `target/xtask/`, created on demand, for files the launcher writes (hostfiles, peer builds).
pub(crate) fn scratch_dir() -> Result<PathBuf, String> {
    let dir = workspace_root().join("target").join("xtask");
    fs::create_dir_all(&dir).map_err(|e| format!("could not create {}: {e}", dir.display()))?;
    Ok(dir)
}

/// Names a release xtask binary that tests use as their rank binary instead of building one
/// (see [`rank_binary`]); `cargo xtask flaky` sets it to its own snapshot, so that a test it
/// runs never builds from a tree that someone edits during the hunt.
pub(crate) const RANK_BINARY_VAR: &str = "RLX_XTASK_RANK_BINARY";

/// The rank binary: this binary built in release mode (with the `mlx` feature when the world
/// needs it), so that the collectives run at full speed even under a debug `cargo xtask`.
pub(crate) fn rank_binary(transport: TransportKind) -> Result<PathBuf, String> {
    let needs_mlx = transport == TransportKind::Mlx;
    if let Some(binary) = std::env::var_os(RANK_BINARY_VAR).filter(|_| !needs_mlx) {
        return Ok(PathBuf::from(binary));
    }
    if !cfg!(debug_assertions) && (cfg!(feature = "mlx") || !needs_mlx) {
        return std::env::current_exe()
            .map_err(|e| format!("could not find the running xtask binary: {e}"));
    }
    let mut command = cargo();
    command.args([
        "build",
        "--release",
        "--package",
        "xtask",
        "--bin",
        "xtask",
        "--message-format=json-render-diagnostics",
    ]);
    if needs_mlx {
        command.args(["--features", "mlx"]);
    }
    eprintln!(
        "xtask: building the rank binary (release{})",
        if needs_mlx { ", mlx" } else { "" }
    );
    let output = command
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("could not run cargo build: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "building the rank binary failed ({})",
            output.status
        ));
    }
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|message| message["reason"] == "compiler-artifact")
        .filter(|message| message["target"]["name"] == "xtask")
        .find_map(|message| message["executable"].as_str().map(PathBuf::from))
        .ok_or_else(|| "cargo build did not report the xtask executable".to_owned())
}

/// The rank side: the groups this process runs. A socket or MLX rank joins the world from the
/// environment its launcher set (`rlx_collective::init`); the in-process transport makes all
/// `ranks` ranks here, honouring `RLX_TIMEOUT_MS` as the socket transports do.
pub(crate) fn join(
    transport: TransportKind,
    ranks: u32,
) -> Result<Vec<rlx_collective::ProcessGroup>, String> {
    use std::sync::Arc;

    use rlx_collective::{MemTransport, ProcessGroup, Transport};

    match transport {
        TransportKind::Mem => {
            let env = |key: &str| std::env::var(key).ok().filter(|v| !v.trim().is_empty());
            let timeout =
                rlx_transport::bootstrap::op_timeout_from(&env).map_err(|e| e.to_string())?;
            Ok(MemTransport::fan_out_with_timeout(ranks, timeout)
                .into_iter()
                .map(|t| ProcessGroup::new(t as Arc<dyn Transport>))
                .collect())
        }
        _ => rlx_collective::init()
            .map(|group| vec![group])
            .map_err(|e| format!("could not join the group over {}: {e}", transport.name())),
    }
}

/// Forces the algorithms named in `overrides` (`all_reduce=ring,broadcast=binomial_tree`) on
/// `group`.
pub(crate) fn force_algorithms(
    group: &rlx_collective::ProcessGroup,
    overrides: &str,
) -> Result<(), String> {
    use rlx_collective::CollectiveOp;

    for item in overrides
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        let (op_name, algorithm_name) = item
            .split_once('=')
            .ok_or_else(|| format!("{item:?} is not OP=ALGORITHM"))?;
        let op = CollectiveOp::ALL
            .into_iter()
            .find(|op| op.name() == op_name)
            .ok_or_else(|| format!("{op_name:?} is not a collective"))?;
        let algorithm = op
            .algorithms()
            .iter()
            .copied()
            .find(|a| a.name() == algorithm_name)
            .ok_or_else(|| {
                let names: Vec<&str> = op.algorithms().iter().map(|a| a.name()).collect();
                format!(
                    "{op_name} has no algorithm {algorithm_name:?} (choose {})",
                    names.join(", ")
                )
            })?;
        group
            .set_algorithm(op, algorithm)
            .map_err(|e| format!("could not force {item}: {e}"))?;
    }
    Ok(())
}
