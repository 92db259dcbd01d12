//! What an [`MlxTransport`](crate::MlxTransport) reads from the process environment: its own
//! variables (`RLX_MLX_BACKEND`, `RLX_MLX_DIRECT_MAX`, named here and listed in [`VARIABLES`],
//! which the README's table of variables mirrors) and the shared `RLX_TIMEOUT_MS`, parsed as
//! [`rlx_transport::bootstrap`] parses the socket transports' knobs; and the variables MLX's
//! ring and MPI backends read themselves, checked up front because MLX reports their mistakes
//! late or not at all.

//!
//! The names and [`VARIABLES`] compile without the `mlx` feature too, so that the list is
//! there for the README's tidy test and for programs that document their environment; the
//! reads need MLX.

#[cfg(feature = "mlx")]
use std::time::Duration;

#[cfg(feature = "mlx")]
use rlx_transport::bootstrap::{op_timeout_from, parse_var};
use rlx_transport::env::Variable;
#[cfg(feature = "mlx")]
use rlx_transport::{CollectiveError, Result};

#[cfg(feature = "mlx")]
use crate::backend::Backend;
#[cfg(feature = "mlx")]
use crate::exchange::DIRECT_EXCHANGE_MAX;

/// The MLX backend [`MlxTransport::from_env`](crate::MlxTransport::from_env) joins.
pub const MLX_BACKEND: &str = "RLX_MLX_BACKEND";
/// The largest all-reduce (contribution times other ranks, in bytes) sent as one direct
/// exchange instead of MLX's collective.
pub const MLX_DIRECT_MAX: &str = "RLX_MLX_DIRECT_MAX";

/// Every variable of this crate, in the README's order.
pub const VARIABLES: &[Variable] = &[
    Variable {
        name: MLX_BACKEND,
        backends: &["mlx"],
        default: "any",
        meaning: "MLX's backend: ring, jaccl, mpi or any",
    },
    Variable {
        name: MLX_DIRECT_MAX,
        backends: &["mlx"],
        default: "16777216 (0 = off)",
        meaning: "largest all-reduce sent as one direct exchange instead of MLX's collective",
    },
];

/// The value of variable `key`, if it is set (to valid Unicode).
#[cfg(feature = "mlx")]
pub(crate) fn env_var(key: &str) -> Option<String> {
    std::env::var(key).ok()
}

/// The value of knob `key` as the launch conventions of `rlx_transport::bootstrap` read it: an
/// empty or blank value counts as unset.
#[cfg(feature = "mlx")]
fn knob(key: &str) -> Option<String> {
    env_var(key).filter(|value| !value.trim().is_empty())
}

/// The operation timeout from `RLX_TIMEOUT_MS` (milliseconds, at least 1, as for the socket
/// transports), else [`DEFAULT_OP_TIMEOUT`].
#[cfg(feature = "mlx")]
pub(crate) fn timeout_from_env() -> Result<Duration> {
    op_timeout_from(&knob)
}

/// The direct-exchange limit from `RLX_MLX_DIRECT_MAX` (bytes; 0 turns the direct exchange
/// off), else [`DIRECT_EXCHANGE_MAX`].
#[cfg(feature = "mlx")]
pub(crate) fn direct_max_from_env() -> Result<usize> {
    Ok(parse_var::<usize>(&knob, MLX_DIRECT_MAX)?.unwrap_or(DIRECT_EXCHANGE_MAX))
}

/// The backend `RLX_MLX_BACKEND` names, else [`Backend::Any`]; a name that is no backend is
/// the parse error of [`Backend`].
#[cfg(feature = "mlx")]
pub(crate) fn backend_from_env() -> Result<Backend> {
    match env_var(MLX_BACKEND) {
        Some(name) => name.parse(),
        None => Ok(Backend::Any),
    }
}

/// Checks MLX's ring variables up front, because MLX itself reads them with `atoi` and a
/// missing file only as a JSON parse failure.
#[cfg(feature = "mlx")]
pub(crate) fn check_ring_env() -> Result<()> {
    let rank = env_var("MLX_RANK").ok_or_else(|| {
        CollectiveError::config(
            "MLX_RANK is not set (the ring backend needs MLX_RANK and MLX_HOSTFILE)",
        )
    })?;
    rank.trim()
        .parse::<u32>()
        .map_err(|_| CollectiveError::config(format!("MLX_RANK={rank:?} is not a rank number")))?;
    let hostfile = env_var("MLX_HOSTFILE").ok_or_else(|| {
        CollectiveError::config(
            "MLX_HOSTFILE is not set (the ring backend needs MLX_RANK and MLX_HOSTFILE)",
        )
    })?;
    if !std::path::Path::new(&hostfile).is_file() {
        return Err(CollectiveError::config(format!(
            "MLX_HOSTFILE={hostfile:?} is not a readable file"
        )));
    }
    Ok(())
}

/// Checks that Open MPI will allow calls from several threads at once. MLX initialises MPI
/// with plain `MPI_Init`, which gives `MPI_THREAD_SINGLE`, while this transport receives on
/// one thread per peer and sends and reduces on others; Open MPI raises the level of
/// `MPI_Init` to `MPI_THREAD_MULTIPLE` when `OMPI_MPI_THREAD_LEVEL=3`. Without it, concurrent
/// calls corrupt Open MPI's matching (seen as `MPI_ERR_TRUNCATE`).
#[cfg(feature = "mlx")]
pub(crate) fn check_mpi_env() -> Result<()> {
    let under_open_mpi = env_var("OMPI_COMM_WORLD_SIZE").is_some();
    let level = env_var("OMPI_MPI_THREAD_LEVEL");
    if under_open_mpi && level.as_deref().map(str::trim) != Some("3") {
        return Err(CollectiveError::config(format!(
            "the MLX mpi backend needs OMPI_MPI_THREAD_LEVEL=3 under Open MPI (found {level:?}): \
             MLX calls MPI_Init, and this transport uses MPI from several threads; launch \
             with `mpirun -x OMPI_MPI_THREAD_LEVEL=3 ...` (mlx.launch: --env \
             OMPI_MPI_THREAD_LEVEL=3)"
        )));
    }
    Ok(())
}
