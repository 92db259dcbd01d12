//! How the ranks of a local job find each other: the transport they use, the environment a
//! launcher sets for each rank (a rank-0 rendezvous store, an RLX hostfile or an MLX
//! hostfile) and the optional network namespaces. `rlx launch`, `rlx doctor` and the
//! workspace's `test-cluster` and `bench` all start their ranks through it.

use std::fs;
use std::path::{Path, PathBuf};

use clap::{Args, ValueEnum};

use crate::job::{self, ChildSpec};
use crate::netns::{self, Cabling, Rates, Topology};

/// The transports a local job can run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum TransportKind {
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
    pub fn name(self) -> &'static str {
        match self {
            TransportKind::Tcp => "tcp",
            TransportKind::Tb => "tb",
            TransportKind::Mlx => "mlx",
            TransportKind::Mem => "mem",
        }
    }
}

/// How socket ranks find each other.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Rendezvous {
    /// `RLX_MASTER_ADDR`/`RLX_MASTER_PORT`: rank 0 hosts the rendezvous store.
    #[default]
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
pub struct WorldConfig {
    /// The transport.
    pub transport: TransportKind,
    /// Number of ranks.
    pub size: u32,
    /// How socket ranks rendezvous.
    pub rendezvous: Rendezvous,
    /// `RLX_TIMEOUT_MS` for every rank, when set.
    pub timeout_ms: Option<u64>,
    /// Whether each rank runs in its own network namespace.
    pub netns: bool,
    /// How the namespaces are cabled, with `netns`.
    pub topology: Cabling,
    /// `tbf` rates for the namespace links (`"20gbit"`, or per class `"tb=2gbit,eth=200mbit"`),
    /// with `netns`.
    pub rate: Option<String>,
}

/// The flags that choose a local job's world, shared by `test-cluster` and `bench`.
#[derive(Debug, Clone, Args)]
pub struct WorldArgs {
    /// Transport the ranks talk over (`mem`: every rank a thread of one process).
    #[arg(long, value_enum, default_value_t = TransportKind::Tcp)]
    pub transport: TransportKind,
    /// How the ranks meet and what links join them.
    #[command(flatten)]
    pub links: LinkArgs,
}

/// The transports of a world with one process per rank (`rlx launch`, `rlx doctor`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum ProcessTransport {
    /// `TcpTransport` (`RLX_BACKEND=tcp`).
    #[default]
    Tcp,
    /// `ThunderboltTransport` (`RLX_BACKEND=tb`); needs a `thunderbolt*` interface, which
    /// `--netns` provides.
    Tb,
    /// `MlxTransport` over MLX's ring backend (`RLX_BACKEND=mlx`).
    Mlx,
}

impl From<ProcessTransport> for TransportKind {
    fn from(transport: ProcessTransport) -> TransportKind {
        match transport {
            ProcessTransport::Tcp => TransportKind::Tcp,
            ProcessTransport::Tb => TransportKind::Tb,
            ProcessTransport::Mlx => TransportKind::Mlx,
        }
    }
}

/// The flags of a world with one process per rank: those of [`WorldArgs`] without the
/// in-process transport, so `--help` lists only what the command accepts. The default is TCP
/// ranks on this host that meet at a rank-0 store.
#[derive(Debug, Clone, Default, Args)]
pub struct ProcessWorldArgs {
    /// Transport the ranks talk over.
    #[arg(long, value_enum, default_value_t = ProcessTransport::Tcp)]
    pub transport: ProcessTransport,
    /// How the ranks meet and what links join them.
    #[command(flatten)]
    pub links: LinkArgs,
}

impl ProcessWorldArgs {
    /// The same world as [`WorldArgs`].
    pub fn world(&self) -> WorldArgs {
        WorldArgs {
            transport: self.transport.into(),
            links: self.links.clone(),
        }
    }
}

/// How socket ranks meet and whether each runs in a network namespace of its own.
#[derive(Debug, Clone, Default, Args)]
pub struct LinkArgs {
    /// How socket ranks find each other.
    #[arg(long, value_enum, default_value_t = Rendezvous::Store)]
    pub rendezvous: Rendezvous,
    /// Run each rank in its own network namespace, joined by veth links (needs root).
    #[arg(long)]
    pub netns: bool,
    /// With --netns: how the ranks are cabled. star (one switch, links named thunderbolt0),
    /// mesh, ring or chain (a veth pair per cable, named thunderbolt0, thunderbolt1, ... on a
    /// /30 each; chain:0-2-1-3 names the ranks in cable order), any of these three with +star
    /// for a switch alongside (eth0), or islands:AxB (A meshes of B ranks joined by a switch).
    #[arg(long, requires = "netns", default_value_t = Cabling::default())]
    pub topology: Cabling,
    /// With --netns: a tbf rate limit on every link (e.g. 20gbit, Thunderbolt 4's TCP rate),
    /// or one per class of link: tb=2gbit,eth=200mbit (cables, switch).
    #[arg(long, requires = "netns")]
    pub rate: Option<String>,
}

impl WorldArgs {
    /// The defaults: TCP ranks on this host that meet at a rank-0 store.
    pub fn tcp() -> WorldArgs {
        WorldArgs::over(TransportKind::Tcp)
    }

    /// `transport`, ranks on this host that meet at a rank-0 store.
    pub fn over(transport: TransportKind) -> WorldArgs {
        WorldArgs {
            transport,
            links: LinkArgs::default(),
        }
    }

    /// The world of `size` ranks these flags describe.
    pub fn config(&self, size: u32, timeout_ms: Option<u64>) -> WorldConfig {
        WorldConfig {
            transport: self.transport,
            size,
            rendezvous: self.links.rendezvous,
            timeout_ms,
            netns: self.links.netns,
            topology: self.links.topology.clone(),
            rate: self.links.rate.clone(),
        }
    }
}

/// A prepared world: ports chosen, hostfile written, namespaces created. Dropping it removes
/// the hostfile and the namespaces.
#[derive(Debug)]
pub struct World {
    config: WorldConfig,
    topology: Option<Topology>,
    hostfile: Option<PathBuf>,
    master: (String, u16),
}

impl WorldConfig {
    /// Refuses combinations that cannot work, before anything is built or created.
    pub fn validate(&self) -> Result<(), String> {
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
            netns::plan(&self.topology, self.size)?;
            netns::check_available()?;
        }
        if let Some(rate) = &self.rate {
            Rates::parse(rate)?;
        }
        Ok(())
    }
}

impl World {
    /// Prepares the world described by `config`.
    pub fn prepare(config: &WorldConfig) -> Result<World, String> {
        config.validate()?;
        if config.transport == TransportKind::Tb && !config.netns {
            eprintln!(
                "rlx: note: --transport tb without --netns needs a real thunderbolt interface on this host"
            );
        }
        let topology = if config.netns {
            Some(Topology::create(
                config.size,
                &config.topology,
                config.rate.as_deref(),
            )?)
        } else {
            None
        };
        let addresses: Vec<(String, u16)> = match &topology {
            Some(topology) => (0..config.size)
                .map(|rank| (topology.address_of(rank).to_string(), NETNS_PORT))
                .collect(),
            None => job::free_ports(config.size as usize)?
                .into_iter()
                .map(|port| ("127.0.0.1".to_owned(), port))
                .collect(),
        };
        let needs_hostfile =
            config.transport == TransportKind::Mlx || config.rendezvous == Rendezvous::Hostfile;
        let hostfile = if needs_hostfile && config.transport != TransportKind::Mem {
            let entries: Vec<Vec<String>> = match (&topology, config.transport) {
                // On cables, each rank lists every address a user's hostfile would: its cable
                // ends, its switch address, its routed identity; each peer picks its way.
                (Some(topology), TransportKind::Tcp | TransportKind::Tb) => (0..config.size)
                    .map(|rank| {
                        let addresses = topology.addresses_of(rank);
                        addresses
                            .iter()
                            .map(|a| format!("{a}:{NETNS_PORT}"))
                            .collect()
                    })
                    .collect(),
                _ => addresses
                    .iter()
                    .map(|(host, port)| vec![format!("{host}:{port}")])
                    .collect(),
            };
            Some(write_hostfile(&entries)?)
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
    pub fn cut_link(&self, rank: u32, drop_all: bool) -> Result<(), String> {
        match &self.topology {
            Some(topology) => topology.cut(rank, drop_all),
            None => Err("only a --netns world has links to cut".to_owned()),
        }
    }

    /// Where the other ranks reach `rank`, in `--netns` worlds.
    pub fn address_of(&self, rank: u32) -> Option<std::net::Ipv4Addr> {
        Some(self.topology.as_ref()?.address_of(rank))
    }

    /// The network namespace of `rank`, in `--netns` worlds.
    pub fn namespace_of(&self, rank: u32) -> Option<&str> {
        self.topology.as_ref()?.namespace_of(rank)
    }

    /// The configuration this world was prepared from.
    pub fn config(&self) -> &WorldConfig {
        &self.config
    }

    /// How many processes the world runs as (one, for the in-process transport).
    pub fn process_count(&self) -> u32 {
        match self.config.transport {
            TransportKind::Mem => 1,
            _ => self.config.size,
        }
    }

    /// The spec of process `index` running `program args`, with the environment a launcher
    /// sets for that rank.
    pub fn child(&self, index: u32, program: &Path, args: Vec<String>) -> ChildSpec {
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
            // Naming the switch's interface makes the advertised address the one every other
            // rank can reach.
            if let Some(ifname) = topology.advertised_ifname() {
                spec = spec.env("RLX_SOCKET_IFNAME", format!("={ifname}"));
            }
            // Over Thunderbolt, the Ethernet beside the cables carries what no cable can (from
            // island to island), as a user's cluster needs it named, unless the user chose the
            // links.
            let tb_ifname = rlx_tb::TB_IFNAME_ENV;
            if let (TransportKind::Tb, Some(ethernet), None) = (
                self.config.transport,
                topology.ethernet_ifname(),
                std::env::var_os(tb_ifname),
            ) {
                spec = spec.env(tb_ifname, format!("thunderbolt,{ethernet}"));
            }
            // The emulated cabling is the one the job declares, unless the user declared
            // another (to see what a cable left out of it looks like).
            if std::env::var_os(rlx_collective::CABLING_VAR).is_none() {
                let cabling = self.config.topology.to_string();
                spec = spec.env(rlx_collective::CABLING_VAR, cabling);
            }
        }
        spec
    }
}

impl Drop for World {
    fn drop(&mut self) {
        if let Some(file) = self.hostfile.take() {
            // The file lives in the temporary directory; a leftover is harmless, so a failure
            // is ignored.
            let _ = fs::remove_file(file);
        }
    }
}

/// Writes an MLX-style hostfile (one list of `"host:port"` per rank) into the temporary
/// directory.
fn write_hostfile(entries: &[Vec<String>]) -> Result<PathBuf, String> {
    let text = serde_json::to_string(entries)
        .map_err(|e| format!("could not encode the hostfile: {e}"))?;
    // The counter keeps apart the worlds one process prepares side by side.
    static PREPARED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let number = PREPARED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path =
        std::env::temp_dir().join(format!("rlx-hostfile-{}-{number}.json", std::process::id()));
    fs::write(&path, text).map_err(|e| format!("could not write {}: {e}", path.display()))?;
    Ok(path)
}
