//! [`init`]: a [`ProcessGroup`] from the environment, on the backend the Cargo features
//! compiled in and `RLX_BACKEND` selects; [`join`]: the same for a process that joins a
//! running job.

pub use crate::env::BACKEND_VAR;
use rlx_transport::cabling::Cabling;

use crate::env::CABLING_VAR;
use crate::{CollectiveError, ProcessGroup, Result};

/// The backends compiled into this build, by their `RLX_BACKEND` names.
pub fn compiled_backends() -> Vec<&'static str> {
    let mut names = Vec::new();
    if cfg!(feature = "tcp") {
        names.push("tcp");
    }
    if cfg!(feature = "thunderbolt") {
        names.push("tb");
    }
    if cfg!(feature = "mlx") {
        names.push("mlx");
    }
    names
}

/// Builds the world group from the environment (rank, world size, addresses: see the
/// backend's documentation, e.g. `RLX_RANK`, `RLX_WORLD_SIZE`, `RLX_MASTER_ADDR`).
///
/// `RLX_BACKEND` chooses among the compiled-in backends (`tcp`, `tb`, `mlx`); without it the
/// only compiled backend is used, or `tcp` when there are several. Naming a backend that was
/// not compiled in is a [`CollectiveError::Config`] error that says which Cargo feature to
/// enable.
///
/// With `RLX_DEBUG` set (`RLX_DEBUG=info`, `RLX_DEBUG=rlx_net=debug,info`), it first installs
/// a rank-prefixed stderr subscriber for RLX's diagnostics, unless the program installed a
/// subscriber of its own (see [`install_debug_subscriber`](crate::install_debug_subscriber)).
///
/// # Examples
///
/// ```no_run
/// // Launched as one of several processes, e.g. with RLX_RANK, RLX_WORLD_SIZE and
/// // RLX_MASTER_ADDR/RLX_MASTER_PORT set by the launcher.
/// let group = rlx_collective::init()?;
/// let mut grads = vec![1.0f32; 1024];
/// group.all_reduce(&mut grads, rlx_collective::ReduceKind::Mean)?;
/// # Ok::<(), rlx_collective::CollectiveError>(())
/// ```
pub fn init() -> Result<ProcessGroup> {
    crate::install_debug_subscriber();
    let backend = chosen_backend();
    let group = init_backend(&backend)?;
    check_declared_cabling(&group)?;
    tracing::info!(
        rank = group.rank(),
        world = group.world_size(),
        %backend,
        native = group.transport().native_collectives().is_some(),
        "the world group is up; {}",
        crate::select::Settings::plan()
    );
    Ok(group)
}

/// Compares the link matrix with the cabling `RLX_CABLING` declares. A declared cable the
/// matrix lacks is not an error: the plans follow the cables there are (a ring around the gap,
/// the flat plans where a mesh or an island is incomplete), and rank 0 warns once per missing
/// cable, naming its two ranks, so that the user knows which cable to check. An unreadable
/// declaration is a configuration error.
fn check_declared_cabling(group: &ProcessGroup) -> Result<()> {
    let Some(text) = std::env::var(CABLING_VAR)
        .ok()
        .filter(|t| !t.trim().is_empty())
    else {
        return Ok(());
    };
    let declared: Cabling = text
        .trim()
        .parse()
        .map_err(|e| CollectiveError::config(format!("{CABLING_VAR}={text}: {e}")))?;
    let Some(topology) = group.topology() else {
        if group.rank() == 0 {
            tracing::warn!(
                "{CABLING_VAR}={declared}, but this transport reports no link matrix (a \
                 backend that does not learn the links): the cabling is not checked"
            );
        }
        return Ok(());
    };
    // Every rank has the same matrix: rank 0 alone compares and says.
    if group.rank() != 0 {
        return Ok(());
    }
    let differences = declared.differences(&topology);
    for difference in &differences {
        tracing::warn!("{difference}");
    }
    if differences.is_empty() {
        tracing::info!("the link matrix shows every cable of the declared cabling {declared}");
    } else {
        tracing::warn!(
            "{} cable(s) of the declared cabling {declared} missing: the collectives plan \
             over the cables there are (ring order {:?})",
            differences.len(),
            group.ring_order()
        );
    }
    Ok(())
}

/// The backend `RLX_BACKEND` names, or the default one.
fn chosen_backend() -> String {
    let requested = std::env::var(BACKEND_VAR).ok();
    match requested.as_deref().map(str::trim) {
        Some(name) if !name.is_empty() => name.to_ascii_lowercase(),
        _ => default_backend().to_owned(),
    }
}

/// Joins a running job from the environment, as a replacement or an extra process: reaches
/// the job at its rendezvous address (the same variables as for [`init`]; the rank and world
/// size are ignored), waits until the members admit it with [`ProcessGroup::grow`], and
/// returns the grown group, in which it has a rank after every member's. Only the TCP
/// backend admits joiners; the others fail with [`CollectiveError::Unsupported`].
///
/// # Examples
///
/// ```no_run
/// // A replacement for a lost worker, started with the job's RLX_MASTER_ADDR/RLX_MASTER_PORT
/// // (and RLX_JOB_SECRET), while the survivors call `group.grow(1, timeout)`.
/// let group = rlx_collective::join()?;
/// let mut weights = vec![0.0f32; 1024];
/// group.broadcast(0, &mut weights)?; // catch up from the members
/// # Ok::<(), rlx_collective::CollectiveError>(())
/// ```
pub fn join() -> Result<ProcessGroup> {
    crate::install_debug_subscriber();
    match chosen_backend().as_str() {
        "tcp" => join_tcp(),
        other => Err(CollectiveError::unsupported(format!(
            "joining a running job over {BACKEND_VAR}={other}: only the tcp backend admits \
             new processes"
        ))),
    }
}

#[cfg(feature = "tcp")]
fn join_tcp() -> Result<ProcessGroup> {
    let transport = rlx_net::TcpTransport::join_from_env()?;
    ProcessGroup::joined(std::sync::Arc::new(transport))
}

#[cfg(not(feature = "tcp"))]
fn join_tcp() -> Result<ProcessGroup> {
    Err(not_compiled("tcp", "tcp"))
}

fn default_backend() -> &'static str {
    match compiled_backends().as_slice() {
        [only] => only,
        _ => "tcp",
    }
}

#[cfg(not(all(feature = "tcp", feature = "thunderbolt", feature = "mlx")))]
fn not_compiled(name: &str, feature: &str) -> CollectiveError {
    CollectiveError::config(format!(
        "{BACKEND_VAR}={name} but rlx-collective was built without that backend; enable the \
         `{feature}` feature of rlx-collective (compiled in: {:?})",
        compiled_backends()
    ))
}

fn init_backend(name: &str) -> Result<ProcessGroup> {
    match name {
        "tcp" => init_tcp(),
        "tb" | "thunderbolt" => init_tb(),
        "mlx" => init_mlx(),
        other => Err(CollectiveError::config(format!(
            "{BACKEND_VAR}={other:?} is not a backend (expected tcp, tb or mlx)"
        ))),
    }
}

#[cfg(feature = "tcp")]
fn init_tcp() -> Result<ProcessGroup> {
    let transport = rlx_net::TcpTransport::from_env()?;
    Ok(ProcessGroup::new(std::sync::Arc::new(transport)))
}

#[cfg(not(feature = "tcp"))]
fn init_tcp() -> Result<ProcessGroup> {
    Err(not_compiled("tcp", "tcp"))
}

#[cfg(feature = "thunderbolt")]
fn init_tb() -> Result<ProcessGroup> {
    let transport = rlx_tb::ThunderboltTransport::from_env()?;
    Ok(ProcessGroup::new(std::sync::Arc::new(transport)))
}

#[cfg(not(feature = "thunderbolt"))]
fn init_tb() -> Result<ProcessGroup> {
    Err(not_compiled("tb", "thunderbolt"))
}

#[cfg(feature = "mlx")]
fn init_mlx() -> Result<ProcessGroup> {
    let transport = rlx_mlx_ffi::MlxTransport::from_env()?;
    Ok(ProcessGroup::new(std::sync::Arc::new(transport)))
}

#[cfg(not(feature = "mlx"))]
fn init_mlx() -> Result<ProcessGroup> {
    Err(not_compiled("mlx", "mlx"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_and_missing_backends_are_config_errors() {
        assert!(matches!(
            init_backend("carrier-pigeon"),
            Err(CollectiveError::Config { .. })
        ));
        if !cfg!(feature = "mlx") {
            let err = init_backend("mlx").unwrap_err();
            assert!(err.to_string().contains("`mlx` feature"), "{err}");
        }
        if !cfg!(feature = "tcp") {
            let err = init_backend("tcp").unwrap_err();
            assert!(err.to_string().contains("`tcp` feature"), "{err}");
        }
    }
}
