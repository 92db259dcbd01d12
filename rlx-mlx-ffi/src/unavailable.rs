//! [`MlxTransport`] in a build without the `mlx` feature: the same entry points, each
//! reporting that MLX support was not compiled in, so that callers compile either way.

use std::time::Duration;

use rlx_transport::{CollectiveError, Result, Tag, Transport};

use crate::Backend;

const NOT_BUILT: &str = "rlx-mlx-ffi was built without the `mlx` feature (enable it, with MLX \
                         installed: pip install \"mlx[cpu]\", or set MLX_DIR)";

/// The MLX transport; this build has no MLX, so it cannot be constructed.
#[derive(Debug)]
pub struct MlxTransport {
    _never: std::convert::Infallible,
}

impl MlxTransport {
    /// Fails with [`CollectiveError::Unsupported`]: this build has no MLX.
    pub fn init(backend: Backend) -> Result<MlxTransport> {
        Err(CollectiveError::unsupported(format!(
            "MLX backend {backend}: {NOT_BUILT}"
        )))
    }

    /// Fails with [`CollectiveError::Unsupported`]: this build has no MLX.
    pub fn from_env() -> Result<MlxTransport> {
        Self::init(Backend::Any)
    }

    /// Fails with [`CollectiveError::Unsupported`]: this build has no MLX.
    pub fn init_with_timeout(backend: Backend, op_timeout: Duration) -> Result<MlxTransport> {
        let _ = op_timeout;
        Self::init(backend)
    }

    /// Has no effect: no value of this type exists in this build.
    pub fn set_direct_exchange_max(&self, bytes: usize) {
        let _ = bytes;
        match self._never {}
    }
}

/// Always false: this build has no MLX.
pub fn is_available(backend: Backend) -> bool {
    let _ = backend;
    false
}

/// The contract is implemented so that code holding an `Arc<dyn Transport>` compiles in this
/// build too; no value of the type exists, so none of these bodies can run.
impl Transport for MlxTransport {
    fn rank(&self) -> u32 {
        match self._never {}
    }

    fn world_size(&self) -> u32 {
        match self._never {}
    }

    fn send_message(&self, _to: u32, _tag: Tag, _parts: &[&[u8]]) -> Result<()> {
        match self._never {}
    }

    fn recv_message(&self, _from: u32, _tag: Tag, _timeout: Duration) -> Result<Option<Vec<u8>>> {
        match self._never {}
    }
}
