//! Launch conventions shared by the socket transports (TCP and Thunderbolt): which
//! environment variables name the rank, the world size, the rendezvous and the knobs, and how an
//! MLX-style hostfile reads.
//!
//! The variables' names and their documented list live in [`env`](mod@crate::env); this module
//! parses them. Nothing here opens a socket. [`LaunchEnv::from_env`] reads the process environment;
//! [`LaunchEnv::from_lookup`] takes any lookup function so every convention is testable.
//!
//! | what | variables, first set wins |
//! |---|---|
//! | rank | `RLX_RANK`, `RANK` (torchrun), `MLX_RANK`, `OMPI_COMM_WORLD_RANK`, `PMI_RANK`, `SLURM_PROCID` |
//! | world size | `RLX_WORLD_SIZE`, `WORLD_SIZE`, `OMPI_COMM_WORLD_SIZE`, `PMI_SIZE`, `SLURM_NTASKS`, else the hostfile's length |
//! | addresses | `RLX_HOSTFILE` (else `MLX_HOSTFILE`): a JSON file; or `RLX_MASTER_ADDR`/`RLX_MASTER_PORT`, else `MASTER_ADDR`/`MASTER_PORT` |
//! | interface | `RLX_SOCKET_IFNAME` ([`IfnameFilter`] syntax) |
//! | timeout | `RLX_TIMEOUT_MS` (default [`DEFAULT_OP_TIMEOUT`]) |
//! | security | `RLX_JOB_SECRET` (HMAC key), `RLX_JOB_ID` (else derived from the rendezvous) |
//! | links | `RLX_SOCKETS_PER_PEER`, `RLX_MAX_FRAME_BYTES` |
//!
//! A process with none of the rank, world size and address variables set was started without
//! a launcher: it runs as a world of one rank ([`LaunchEnv::standalone`]).

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use crate::env;
use crate::ifname::IfnameFilter;
use crate::{CollectiveError, DEFAULT_OP_TIMEOUT, Result};

/// Variables that may carry the rank, in the order they are consulted.
pub const RANK_VARS: &[&str] = &[
    env::RANK,
    "RANK",
    "MLX_RANK",
    "OMPI_COMM_WORLD_RANK",
    "PMI_RANK",
    "SLURM_PROCID",
];

/// Variables that may carry the world size, in the order they are consulted.
pub const WORLD_SIZE_VARS: &[&str] = &[
    env::WORLD_SIZE,
    "WORLD_SIZE",
    "OMPI_COMM_WORLD_SIZE",
    "PMI_SIZE",
    "SLURM_NTASKS",
];

/// Largest hostfile this parser reads; a real hostfile is a few kilobytes.
const MAX_HOSTFILE_BYTES: u64 = 16 << 20;

/// How the ranks find each other.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rendezvous {
    /// Every rank's listening addresses are known up front: entry `r` lists rank `r`'s
    /// `"host:port"` strings, one per link (MLX's hostfile format).
    Hostfile(Vec<Vec<String>>),
    /// Rank 0 hosts a small store at `host:port` where every rank publishes its listening
    /// address and from which all read the table (torchrun's `MASTER_ADDR`/`MASTER_PORT`).
    Store {
        /// Host name or address of rank 0.
        host: String,
        /// Port of the store.
        port: u16,
    },
}

impl Rendezvous {
    /// A job id derived from the rendezvous, so that two jobs started with different
    /// rendezvous never accept each other's connections.
    pub fn derived_job_id(&self) -> String {
        match self {
            Rendezvous::Hostfile(entries) => {
                let flat: Vec<String> = entries.iter().map(|e| e.join(",")).collect();
                format!("hostfile:{}", flat.join(";"))
            }
            Rendezvous::Store { host, port } => format!("store:{host}:{port}"),
        }
    }
}

/// Everything a socket transport reads from the environment; see the module docs.
#[derive(Clone, PartialEq, Eq)]
pub struct LaunchEnv {
    /// This process's rank.
    pub rank: u32,
    /// Number of ranks.
    pub world_size: u32,
    /// How the ranks find each other.
    pub rendezvous: Rendezvous,
    /// `RLX_SOCKET_IFNAME`, when set.
    pub ifname: Option<IfnameFilter>,
    /// `RLX_TIMEOUT_MS`, or [`DEFAULT_OP_TIMEOUT`].
    pub op_timeout: Duration,
    /// `RLX_JOB_SECRET`, when set (never printed by `Debug`).
    pub job_secret: Option<Vec<u8>>,
    /// `RLX_JOB_ID`, or [`Rendezvous::derived_job_id`].
    pub job_id: String,
    /// `RLX_SOCKETS_PER_PEER`, when set.
    pub sockets_per_peer: Option<u32>,
    /// `RLX_MAX_FRAME_BYTES`, when set.
    pub max_frame_bytes: Option<u64>,
    /// Whether no launcher set anything: no rank, world size, hostfile or master address.
    /// Such a process runs as a world of one rank, as MPI and MLX run a program started
    /// without their launchers.
    pub standalone: bool,
}

impl std::fmt::Debug for LaunchEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LaunchEnv")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .field("rendezvous", &self.rendezvous)
            .field("ifname", &self.ifname)
            .field("op_timeout", &self.op_timeout)
            .field("job_secret", &self.job_secret.as_ref().map(|_| "<set>"))
            .field("job_id", &self.job_id)
            .field("sockets_per_peer", &self.sockets_per_peer)
            .field("max_frame_bytes", &self.max_frame_bytes)
            .field("standalone", &self.standalone)
            .finish()
    }
}

impl LaunchEnv {
    /// Reads the process environment (see the module docs for every variable).
    pub fn from_env() -> Result<Self> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads the launch configuration through `lookup` (a variable name to its value), reading
    /// the hostfile it names from disk.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let get = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        let standalone = !launched(&get);
        let Placement {
            rank,
            world_size,
            rendezvous,
        } = Placement::read(&get, standalone)?;
        let ifname = get(env::SOCKET_IFNAME)
            .map(|spec| IfnameFilter::parse(&spec))
            .transpose()?;
        let op_timeout = op_timeout_from(&get)?;
        let sockets_per_peer = positive_var::<u32>(&get, env::SOCKETS_PER_PEER, "at least 1")?;
        let max_frame_bytes = positive_var::<u64>(&get, env::MAX_FRAME_BYTES, "positive")?;
        let job_secret = lookup(env::JOB_SECRET)
            .filter(|s| !s.is_empty())
            .map(String::into_bytes);
        let job_id = get(env::JOB_ID).unwrap_or_else(|| rendezvous.derived_job_id());
        Ok(Self {
            rank,
            world_size,
            rendezvous,
            ifname,
            op_timeout,
            job_secret,
            job_id,
            sockets_per_peer,
            max_frame_bytes,
            standalone,
        })
    }
}

/// Where this process stands in its job: its rank, the world size and how the ranks meet.
struct Placement {
    rank: u32,
    world_size: u32,
    rendezvous: Rendezvous,
}

impl Placement {
    /// Reads the rank, world size and rendezvous variables through `get`; a `standalone`
    /// process (nothing set) is rank 0 of a world of one.
    fn read(get: &impl Fn(&str) -> Option<String>, standalone: bool) -> Result<Self> {
        let rank = first_number(get, RANK_VARS, "rank")?;
        let declared_world = first_number(get, WORLD_SIZE_VARS, "world size")?;
        let hostfile = [env::HOSTFILE, "MLX_HOSTFILE"]
            .iter()
            .find_map(|name| get(name).map(|value| (*name, value)));
        let rendezvous = match hostfile {
            Some((name, value)) => Rendezvous::Hostfile(read_hostfile(name, &value)?),
            // A world of one connects to nobody; its one address is never listened on.
            None if standalone => Rendezvous::Hostfile(vec![vec![STANDALONE_ADDRESS.to_owned()]]),
            None => store_from(get)?,
        };
        let world_size = world_size_of(declared_world, &rendezvous)?;
        let rank = match rank {
            Some(r) if r < world_size => r,
            Some(r) => {
                return Err(CollectiveError::config(format!(
                    "rank {r} is outside a world of size {world_size}"
                )));
            }
            None if world_size == 1 => 0,
            None => {
                return Err(CollectiveError::config(format!(
                    "no rank: set one of {}",
                    RANK_VARS.join(", ")
                )));
            }
        };
        Ok(Self {
            rank,
            world_size,
            rendezvous,
        })
    }
}

/// The world size: the one `declared`, which a hostfile must agree with, or else the
/// hostfile's number of ranks.
fn world_size_of(declared: Option<u32>, rendezvous: &Rendezvous) -> Result<u32> {
    let world_size = match (declared, rendezvous) {
        (Some(n), Rendezvous::Hostfile(entries)) if n as usize != entries.len() => {
            return Err(CollectiveError::config(format!(
                "world size {n} disagrees with the hostfile, which lists {} ranks",
                entries.len()
            )));
        }
        (Some(n), _) => n,
        (None, Rendezvous::Hostfile(entries)) => u32::try_from(entries.len())
            .map_err(|_| CollectiveError::config("the hostfile lists too many ranks"))?,
        (None, Rendezvous::Store { .. }) => {
            return Err(CollectiveError::config(format!(
                "no world size: set one of {} (or use {})",
                WORLD_SIZE_VARS.join(", "),
                env::HOSTFILE
            )));
        }
    };
    if world_size == 0 {
        return Err(CollectiveError::config("world size 0"));
    }
    Ok(world_size)
}

/// Variable `name` read through `get` as a number, which must not be zero (`what` says what
/// it must be instead, in the error).
fn positive_var<T: std::str::FromStr + PartialEq + Default>(
    get: &impl Fn(&str) -> Option<String>,
    name: &str,
    what: &str,
) -> Result<Option<T>> {
    match parse_var::<T>(get, name)? {
        Some(value) if value == T::default() => {
            Err(CollectiveError::config(format!("{name} must be {what}")))
        }
        other => Ok(other),
    }
}

/// The address in the one-rank hostfile of a process started without a launcher.
const STANDALONE_ADDRESS: &str = "127.0.0.1:0";

/// Whether a launcher (or the user) set any variable that places this process in a job: a
/// rank, a world size, a hostfile or a master address.
fn launched(get: &impl Fn(&str) -> Option<String>) -> bool {
    let placing = [
        env::HOSTFILE,
        "MLX_HOSTFILE",
        env::MASTER_ADDR,
        "MASTER_ADDR",
    ];
    RANK_VARS
        .iter()
        .chain(WORLD_SIZE_VARS)
        .chain(&placing)
        .any(|name| get(name).is_some())
}

/// Parses an MLX hostfile: a JSON list with one entry per rank, each a list of `"host:port"`
/// strings. A bare string entry is accepted as a list of one. `origin` names the source in
/// errors.
pub fn parse_hostfile(origin: &str, text: &str) -> Result<Vec<Vec<String>>> {
    let bad = |why: String| CollectiveError::config(format!("hostfile {origin}: {why}"));
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| bad(format!("not JSON: {e}")))?;
    let serde_json::Value::Array(ranks) = value else {
        return Err(bad("expected a list with one entry per rank".to_owned()));
    };
    if ranks.is_empty() {
        return Err(bad("lists no rank".to_owned()));
    }
    let mut out = Vec::with_capacity(ranks.len());
    for (rank, entry) in ranks.into_iter().enumerate() {
        let addresses = match entry {
            serde_json::Value::String(s) => vec![s],
            serde_json::Value::Array(items) => items
                .into_iter()
                .map(|item| match item {
                    serde_json::Value::String(s) => Ok(s),
                    other => Err(bad(format!(
                        "rank {rank}: expected \"host:port\" strings, found {other}"
                    ))),
                })
                .collect::<Result<Vec<_>>>()?,
            other => {
                return Err(bad(format!(
                    "rank {rank}: expected a list of \"host:port\" strings, found {other}"
                )));
            }
        };
        if addresses.is_empty() {
            return Err(bad(format!("rank {rank} has no address")));
        }
        for address in &addresses {
            split_host_port(address).map_err(|e| bad(format!("rank {rank}: {e}")))?;
        }
        out.push(addresses);
    }
    Ok(out)
}

/// Splits `"host:port"` (or `"[v6]:port"`) into its host and port.
pub fn split_host_port(address: &str) -> Result<(String, u16)> {
    let bad = || CollectiveError::config(format!("{address:?} is not \"host:port\""));
    let (host, port) = address.rsplit_once(':').ok_or_else(bad)?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if host.is_empty() {
        return Err(bad());
    }
    let port: u16 = port.parse().map_err(|_| bad())?;
    Ok((host.to_owned(), port))
}

/// Resolves `"host:port"` (or `"[v6%scope]:port"`) to its socket addresses, never an empty
/// list: a name that resolves to nothing is a `Config` error naming it.
pub fn resolve(address: &str) -> Result<Vec<SocketAddr>> {
    let (host, port) = split_host_port(address)?;
    let found: Vec<SocketAddr> = (host.as_str(), port)
        .to_socket_addrs()
        .map_err(|e| CollectiveError::config(format!("cannot resolve {address:?}: {e}")))?
        .collect();
    if found.is_empty() {
        return Err(CollectiveError::config(format!(
            "{address:?} resolves to no address"
        )));
    }
    Ok(found)
}

fn read_hostfile(variable: &str, value: &str) -> Result<Vec<Vec<String>>> {
    // An inline list is convenient in tests and scripts; a path is MLX's convention.
    if value.trim_start().starts_with('[') {
        return parse_hostfile(variable, value);
    }
    let file = std::fs::File::open(value)
        .map_err(|e| CollectiveError::config(format!("{variable}={value}: cannot open: {e}")))?;
    let mut text = String::new();
    std::io::Read::read_to_string(
        &mut std::io::Read::take(file, MAX_HOSTFILE_BYTES),
        &mut text,
    )
    .map_err(|e| CollectiveError::config(format!("{variable}={value}: cannot read: {e}")))?;
    parse_hostfile(value, &text)
}

fn store_from(get: &impl Fn(&str) -> Option<String>) -> Result<Rendezvous> {
    for (addr_var, port_var) in [
        (env::MASTER_ADDR, env::MASTER_PORT),
        ("MASTER_ADDR", "MASTER_PORT"),
    ] {
        let Some(host) = get(addr_var) else {
            continue;
        };
        let port = parse_var::<u16>(get, port_var)?.ok_or_else(|| {
            CollectiveError::config(format!("{addr_var} is set but {port_var} is not"))
        })?;
        let host = host.trim();
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        return Ok(Rendezvous::Store {
            host: host.to_owned(),
            port,
        });
    }
    Err(CollectiveError::config(format!(
        "no rendezvous: set {}, or {} and {} (or torchrun's MASTER_ADDR and MASTER_PORT)",
        env::HOSTFILE,
        env::MASTER_ADDR,
        env::MASTER_PORT
    )))
}

fn first_number(
    get: &impl Fn(&str) -> Option<String>,
    names: &[&str],
    what: &str,
) -> Result<Option<u32>> {
    for name in names {
        if let Some(value) = get(name) {
            return value.trim().parse().map(Some).map_err(|_| {
                CollectiveError::config(format!("{name}={value:?} is not a valid {what}"))
            });
        }
    }
    Ok(None)
}

/// Reads variable `name` through `get` and parses it as a `T`, ignoring surrounding
/// whitespace: `None` when `get` has no value for it, a configuration error naming the
/// variable and its value when the value does not parse. [`LaunchEnv::from_lookup`] reads its
/// numeric knobs this way, with a `get` that treats empty values as unset; other transports
/// read their own knobs through it so that they parse alike.
pub fn parse_var<T: std::str::FromStr>(
    get: &impl Fn(&str) -> Option<String>,
    name: &str,
) -> Result<Option<T>> {
    get(name)
        .map(|value| {
            value.trim().parse().map_err(|_| {
                CollectiveError::config(format!("{name}={value:?} is not a valid number"))
            })
        })
        .transpose()
}

/// The operation timeout that `RLX_TIMEOUT_MS` (read through `get`) asks for: at least one
/// millisecond, [`DEFAULT_OP_TIMEOUT`] when it is not set. Every transport and launcher reads
/// the variable through this, so that they agree on what they accept.
pub fn op_timeout_from(get: &impl Fn(&str) -> Option<String>) -> Result<Duration> {
    match parse_var::<u64>(get, env::TIMEOUT_MS)? {
        Some(0) => Err(CollectiveError::config(format!(
            "{} must be positive",
            env::TIMEOUT_MS
        ))),
        Some(ms) => Ok(Duration::from_millis(ms)),
        None => Ok(DEFAULT_OP_TIMEOUT),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn every_rank_convention() {
        for var in RANK_VARS {
            let e = LaunchEnv::from_lookup(env(&[
                (var, "2"),
                ("WORLD_SIZE", "4"),
                ("MASTER_ADDR", "10.0.0.1"),
                ("MASTER_PORT", "29500"),
            ]))
            .unwrap();
            assert_eq!((e.rank, e.world_size), (2, 4), "{var}");
        }
        for var in WORLD_SIZE_VARS {
            let e = LaunchEnv::from_lookup(env(&[
                ("PMI_RANK", "1"),
                (var, "3"),
                ("RLX_MASTER_ADDR", "[::1]"),
                ("RLX_MASTER_PORT", "1"),
            ]))
            .unwrap();
            assert_eq!(e.world_size, 3, "{var}");
            assert_eq!(
                e.rendezvous,
                Rendezvous::Store {
                    host: "::1".into(),
                    port: 1
                }
            );
        }
    }

    #[test]
    fn rlx_variables_win_over_launcher_ones() {
        let e = LaunchEnv::from_lookup(env(&[
            ("RLX_RANK", "0"),
            ("RANK", "5"),
            ("RLX_WORLD_SIZE", "2"),
            ("WORLD_SIZE", "9"),
            ("RLX_MASTER_ADDR", "a"),
            ("RLX_MASTER_PORT", "7"),
            ("MASTER_ADDR", "b"),
            ("MASTER_PORT", "8"),
            ("RLX_TIMEOUT_MS", "1500"),
            ("RLX_SOCKETS_PER_PEER", "3"),
            ("RLX_MAX_FRAME_BYTES", "4096"),
            ("RLX_JOB_SECRET", "s3cret"),
            ("RLX_SOCKET_IFNAME", "^lo"),
        ]))
        .unwrap();
        assert_eq!((e.rank, e.world_size), (0, 2));
        assert_eq!(e.job_id, "store:a:7");
        assert_eq!(e.op_timeout, Duration::from_millis(1500));
        assert_eq!(e.sockets_per_peer, Some(3));
        assert_eq!(e.max_frame_bytes, Some(4096));
        assert_eq!(e.job_secret.as_deref(), Some(&b"s3cret"[..]));
        assert!(!format!("{e:?}").contains("s3cret"));
        assert!(e.ifname.unwrap().is_exclusion());
    }

    #[test]
    fn hostfile_gives_the_world_size() {
        let e = LaunchEnv::from_lookup(env(&[
            ("MLX_RANK", "1"),
            (
                "RLX_HOSTFILE",
                r#"[["127.0.0.1:5000"], ["127.0.0.1:5001", "[::1]:5002"]]"#,
            ),
        ]))
        .unwrap();
        assert_eq!(e.world_size, 2);
        let Rendezvous::Hostfile(h) = &e.rendezvous else {
            panic!("expected a hostfile");
        };
        assert_eq!(h[1], vec!["127.0.0.1:5001", "[::1]:5002"]);
        assert!(e.job_id.starts_with("hostfile:"));
    }

    #[test]
    fn bad_configurations_are_named() {
        let cases: &[&[(&str, &str)]] = &[
            &[("RANK", "x"), ("WORLD_SIZE", "2")],
            &[("RANK", "0"), ("WORLD_SIZE", "2")],
            &[
                ("RANK", "3"),
                ("WORLD_SIZE", "2"),
                ("MASTER_ADDR", "h"),
                ("MASTER_PORT", "1"),
            ],
            &[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h")],
            &[("RANK", "0"), ("RLX_HOSTFILE", "[]")],
            &[("RANK", "0"), ("RLX_HOSTFILE", "[[\"nohost\"]]")],
            &[
                ("RANK", "0"),
                ("WORLD_SIZE", "3"),
                ("RLX_HOSTFILE", "[\"h:1\"]"),
            ],
            &[
                ("RANK", "0"),
                ("RLX_HOSTFILE", "/nonexistent/hostfile.json"),
            ],
            &[("RLX_HOSTFILE", "[\"h:1\"]"), ("RLX_TIMEOUT_MS", "0")],
            &[
                ("WORLD_SIZE", "2"),
                ("MASTER_ADDR", "h"),
                ("MASTER_PORT", "1"),
            ],
        ];
        for case in cases {
            let err = LaunchEnv::from_lookup(env(case)).unwrap_err();
            assert!(
                matches!(err, CollectiveError::Config { .. }),
                "{case:?}: {err}"
            );
        }
    }

    #[test]
    fn no_launch_variable_means_a_world_of_one() {
        let alone = LaunchEnv::from_lookup(env(&[("RLX_TIMEOUT_MS", "2000")])).unwrap();
        assert!(alone.standalone);
        assert_eq!((alone.rank, alone.world_size), (0, 1));
        assert_eq!(alone.op_timeout, Duration::from_millis(2000));
        let launched = LaunchEnv::from_lookup(env(&[("RLX_HOSTFILE", "[\"h:1\"]")])).unwrap();
        assert!(!launched.standalone);
        // A launcher that set only part of what it must is still an error, not a world of one.
        for partial in [
            &[("RANK", "0")][..],
            &[("WORLD_SIZE", "2")],
            &[("MASTER_ADDR", "h")],
        ] {
            assert!(LaunchEnv::from_lookup(env(partial)).is_err(), "{partial:?}");
        }
    }

    #[test]
    fn host_port_forms() {
        assert_eq!(split_host_port("a:1").unwrap(), ("a".into(), 1));
        assert_eq!(split_host_port("[::1]:80").unwrap(), ("::1".into(), 80));
        assert!(split_host_port(":80").is_err());
        assert!(split_host_port("a:99999").is_err());
    }
}
