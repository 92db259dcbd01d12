//! The `RLX_*` environment variables of the TCP engine's tuning, in one place: their names,
//! [`VARIABLES`] (the documented list the README's table of variables mirrors), and
//! `Tuning::from_env`, which reads them all for
//! [`TcpTransportBuilder::tuning_env`](crate::TcpTransportBuilder::tuning_env).
//!
//! The launch variables (rank, rendezvous, timeout, secret, ...) are `rlx-transport`'s, listed
//! in [`rlx_transport::env`]. Every "off" here is spelled `0`.

use rlx_transport::env::Variable;
use rlx_transport::{CollectiveError, Result};

/// How long a waiting thread spins before it blocks, in microseconds.
pub const SPIN_US: &str = "RLX_SPIN_US";
/// The heartbeat interval in milliseconds.
pub const HEARTBEAT_MS: &str = "RLX_HEARTBEAT_MS";
/// Whether the single-copy path between ranks of one host is on (`0` or `1`).
pub const SINGLE_COPY: &str = "RLX_SINGLE_COPY";
/// The smallest message the single-copy path carries.
pub const SINGLE_COPY_MIN_BYTES: &str = "RLX_SINGLE_COPY_MIN_BYTES";
/// How much of a single-copy message passes through the bounce file.
pub const BOUNCE_BYTES: &str = "RLX_BOUNCE_BYTES";
/// The ring size of the shared-memory lane to each rank of this host.
pub const LANE_BYTES: &str = "RLX_LANE_BYTES";

/// The backends built on this crate's engine.
const ENGINE: &[&str] = &["tcp", "tb"];

/// Every tuning variable of the engine, in the README's order.
pub const VARIABLES: &[Variable] = &[
    Variable {
        name: SPIN_US,
        backends: ENGINE,
        default: "50 (0 = off)",
        meaning: "how long a waiting thread spins before it blocks, in microseconds",
    },
    Variable {
        name: HEARTBEAT_MS,
        backends: ENGINE,
        default: "1000 (0 = off)",
        meaning: "heartbeat interval in milliseconds; a peer silent for five is lost",
    },
    Variable {
        name: SINGLE_COPY,
        backends: ENGINE,
        default: "1 (0 = off)",
        meaning: "large messages between ranks of one host read from the sender's memory",
    },
    Variable {
        name: SINGLE_COPY_MIN_BYTES,
        backends: ENGINE,
        default: "262144 (0 = off)",
        meaning: "the smallest message the single-copy path carries",
    },
    Variable {
        name: BOUNCE_BYTES,
        backends: ENGINE,
        default: "67108864 (0 = off)",
        meaning: "how much of a single-copy message passes through the bounce file",
    },
    Variable {
        name: LANE_BYTES,
        backends: ENGINE,
        default: "262144 (0 = off)",
        meaning: "ring size of the shared-memory lane to each rank of this host",
    },
];

/// The tuning the environment asks for; `None` where a variable is unset.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Tuning {
    /// `RLX_SPIN_US`.
    pub(crate) spin_us: Option<u64>,
    /// `RLX_HEARTBEAT_MS`.
    pub(crate) heartbeat_ms: Option<u64>,
    /// `RLX_SINGLE_COPY_MIN_BYTES`.
    pub(crate) single_copy_min_bytes: Option<u64>,
    /// `RLX_BOUNCE_BYTES`.
    pub(crate) bounce_bytes: Option<u64>,
    /// `RLX_LANE_BYTES`.
    pub(crate) lane_bytes: Option<u64>,
    /// `RLX_SINGLE_COPY`: `Some(false)` for `0`, `Some(true)` for `1`.
    pub(crate) single_copy: Option<bool>,
}

impl Tuning {
    /// Reads every tuning variable of the process environment. Fails with `Config`, naming the
    /// variable and its value, when one is set but is not a number, or when `RLX_SINGLE_COPY`
    /// is neither `0` nor `1`.
    pub(crate) fn from_env() -> Result<Self> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// [`from_env`](Self::from_env) through `lookup` (a variable name to its value).
    pub(crate) fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self> {
        // Unlike the launch variables, a blank value here is a mistake, not "unset".
        let number = |name: &str| -> Result<Option<u64>> {
            match lookup(name) {
                Some(value) => value.trim().parse().map(Some).map_err(|_| {
                    CollectiveError::config(format!("{name}={value:?} is not a number"))
                }),
                None => Ok(None),
            }
        };
        // Read in the order `tuning_env` always did, so that the first bad one is reported.
        let spin_us = number(SPIN_US)?;
        let heartbeat_ms = number(HEARTBEAT_MS)?;
        let single_copy_min_bytes = number(SINGLE_COPY_MIN_BYTES)?;
        let bounce_bytes = number(BOUNCE_BYTES)?;
        let lane_bytes = number(LANE_BYTES)?;
        let single_copy = match number(SINGLE_COPY)? {
            None => None,
            Some(0) => Some(false),
            Some(1) => Some(true),
            Some(other) => {
                return Err(CollectiveError::config(format!(
                    "{SINGLE_COPY}={other} (0 turns the single-copy path off, 1 leaves it on)"
                )));
            }
        };
        Ok(Self {
            spin_us,
            heartbeat_ms,
            single_copy_min_bytes,
            bounce_bytes,
            lane_bytes,
            single_copy,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tuning(pairs: &[(&str, &str)]) -> Result<Tuning> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Tuning::from_lookup(move |name| {
            pairs
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        })
    }

    #[test]
    fn every_variable_is_read() {
        let t = tuning(&[
            ("RLX_SPIN_US", "0"),
            ("RLX_HEARTBEAT_MS", " 250 "),
            ("RLX_SINGLE_COPY", "0"),
            ("RLX_SINGLE_COPY_MIN_BYTES", "4096"),
            ("RLX_BOUNCE_BYTES", "0"),
            ("RLX_LANE_BYTES", "65536"),
        ])
        .unwrap();
        assert_eq!(
            t,
            Tuning {
                spin_us: Some(0),
                heartbeat_ms: Some(250),
                single_copy_min_bytes: Some(4096),
                bounce_bytes: Some(0),
                lane_bytes: Some(65536),
                single_copy: Some(false),
            }
        );
        assert_eq!(tuning(&[]).unwrap(), Tuning::default());
    }

    #[test]
    fn bad_values_name_the_variable() {
        for (name, value) in [
            ("RLX_SPIN_US", "fast"),
            ("RLX_LANE_BYTES", ""),
            ("RLX_SINGLE_COPY", "2"),
        ] {
            let err = tuning(&[(name, value)]).unwrap_err();
            assert!(
                matches!(err, CollectiveError::Config { .. }) && err.to_string().contains(name),
                "{name}={value:?}: {err}"
            );
        }
    }
}
