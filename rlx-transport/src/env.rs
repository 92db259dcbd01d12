//! The `RLX_*` environment variables this crate reads, in one place: their names as constants
//! that every read goes through, and [`VARIABLES`], the documented list (meaning, default,
//! backends) that the README's table of variables mirrors and a tidy test compares with it.
//!
//! Each library crate of the workspace has an `env.rs` like this one for its own variables;
//! [`Variable`] is the shape they share. Where a variable has an "off" setting, the environment
//! spells it `0`, whatever a builder uses internally.

/// One environment variable a library reads: a row of the README's table of variables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Variable {
    /// The variable's name.
    pub name: &'static str,
    /// The backends whose processes read it, by their `RLX_BACKEND` names (`tcp`, `tb`,
    /// `mlx`).
    pub backends: &'static [&'static str],
    /// What applies when it is unset, and `(0 = off)` where `0` turns something off.
    pub default: &'static str,
    /// What it sets, in one line.
    pub meaning: &'static str,
}

/// This process's rank.
pub const RANK: &str = "RLX_RANK";
/// The number of ranks.
pub const WORLD_SIZE: &str = "RLX_WORLD_SIZE";
/// The MLX-style JSON hostfile (a path, or the list itself).
pub const HOSTFILE: &str = "RLX_HOSTFILE";
/// The host of rank 0's rendezvous store.
pub const MASTER_ADDR: &str = "RLX_MASTER_ADDR";
/// The port of rank 0's rendezvous store.
pub const MASTER_PORT: &str = "RLX_MASTER_PORT";
/// The listening interface of the TCP transport, as an [`IfnameFilter`](crate::ifname::IfnameFilter).
pub const SOCKET_IFNAME: &str = "RLX_SOCKET_IFNAME";
/// The operation timeout in milliseconds.
pub const TIMEOUT_MS: &str = "RLX_TIMEOUT_MS";
/// The TCP connections per peer.
pub const SOCKETS_PER_PEER: &str = "RLX_SOCKETS_PER_PEER";
/// The frame cap in bytes.
pub const MAX_FRAME_BYTES: &str = "RLX_MAX_FRAME_BYTES";
/// The shared secret of the job.
pub const JOB_SECRET: &str = "RLX_JOB_SECRET";
/// The job id.
pub const JOB_ID: &str = "RLX_JOB_ID";
/// Not configuration: `1` makes the hidden [`fuzzing`](crate::fuzzing) helpers rewrite the
/// checked-in seeds instead of comparing them (a tool's variable, listed in the README's
/// table for the tools).
pub const WRITE_FUZZ_SEEDS: &str = "RLX_WRITE_FUZZ_SEEDS";

/// The backends that bootstrap over sockets through [`LaunchEnv`](crate::LaunchEnv).
const SOCKETS: &[&str] = &["tcp", "tb"];

/// Every variable of this crate that a user sets, in the README's order.
pub const VARIABLES: &[Variable] = &[
    Variable {
        name: RANK,
        backends: SOCKETS,
        default: "`RANK`, `MLX_RANK`, `OMPI_COMM_WORLD_RANK`, `PMI_RANK`, `SLURM_PROCID`; 0 in a world of one",
        meaning: "this process's rank",
    },
    Variable {
        name: WORLD_SIZE,
        backends: SOCKETS,
        default: "`WORLD_SIZE`, `OMPI_COMM_WORLD_SIZE`, `PMI_SIZE`, `SLURM_NTASKS`; the hostfile's length",
        meaning: "the number of ranks",
    },
    Variable {
        name: MASTER_ADDR,
        backends: SOCKETS,
        default: "`MASTER_ADDR`",
        meaning: "host of rank 0's rendezvous store",
    },
    Variable {
        name: MASTER_PORT,
        backends: SOCKETS,
        default: "`MASTER_PORT`",
        meaning: "port of rank 0's rendezvous store",
    },
    Variable {
        name: HOSTFILE,
        backends: SOCKETS,
        default: "`MLX_HOSTFILE`",
        meaning: "MLX-style JSON hostfile (a path, or the list inline): one list of \"host:port\" per rank",
    },
    Variable {
        name: SOCKET_IFNAME,
        backends: &["tcp"],
        default: "chosen by route",
        meaning: "the listening interface, in NCCL syntax",
    },
    Variable {
        name: TIMEOUT_MS,
        backends: &["tcp", "tb", "mlx"],
        default: "300000",
        meaning: "the operation timeout in milliseconds (0 is refused)",
    },
    Variable {
        name: SOCKETS_PER_PEER,
        backends: SOCKETS,
        default: "1, or the addresses of a hostfile entry",
        meaning: "TCP connections per peer (0 is refused)",
    },
    Variable {
        name: MAX_FRAME_BYTES,
        backends: SOCKETS,
        default: "1073741824",
        meaning: "the largest message sent or accepted (0 is refused)",
    },
    Variable {
        name: JOB_SECRET,
        backends: SOCKETS,
        default: "none",
        meaning: "shared secret every link, the store and admissions authenticate with",
    },
    Variable {
        name: JOB_ID,
        backends: SOCKETS,
        default: "derived from the rendezvous",
        meaning: "the job id: processes of different jobs refuse each other",
    },
];
