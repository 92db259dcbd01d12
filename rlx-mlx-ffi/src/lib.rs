//! MLX backend for RLX: [`MlxTransport`] runs RLX's [`Transport`](rlx_transport::Transport)
//! contract and native collectives on MLX's distributed module (`ring`, `jaccl`, `mpi`)
//! through a small C++ shim (`shim/rlx_mlx_shim.cpp`).
//!
//! The shim and libmlx are built and linked only with the `mlx` feature (off by default);
//! `build.rs` finds MLX through `MLX_DIR` or the `mlx` Python package
//! (`pip install "mlx[cpu]"`). Without the feature the crate builds anywhere and
//! [`MlxTransport::init`] reports [`CollectiveError::Unsupported`](rlx_transport::CollectiveError).
//!
//! Layout:
//! - `ffi`: the raw `extern "C"` block and the owned handles;
//! - `transport`: the safe [`MlxTransport`], its design, and the `Transport` and native
//!   collective methods;
//! - `bootstrap`: joining or splitting MLX's group and starting the transport's threads;
//! - `env`: what the transport reads from the environment;
//! - `shared`: the link state the transport's callers and threads share;
//! - `route`: which link a frame takes and how it goes out;
//! - `pause`: how a native collective takes the links (pause frames, announcements);
//! - `progress`: the threads behind the transport;
//! - `exchange`: the direct exchange that replaces MLX's all-reduce for small buffers;
//! - `pool`: the arrays reused between native collectives;
//! - `frame` (message headers), `backend` (backend choice and routing) and `native`
//!   (precision rules of the native collectives): plain code that is tested without MLX.
//!
//! # Examples
//!
//! ```no_run
//! use rlx_mlx_ffi::{Backend, MlxTransport};
//! use rlx_transport::{DType, ReduceKind, Transport};
//!
//! let t = MlxTransport::init(Backend::Ring)?;
//! let mut data: Vec<u8> = 1.0f32.to_le_bytes().repeat(4);
//! if let Some(native) = t.native_collectives() {
//!     native.all_reduce(&mut data, DType::F32, ReduceKind::Sum)?;
//! }
//! # Ok::<(), rlx_transport::CollectiveError>(())
//! ```

mod backend;
#[cfg(feature = "mlx")]
mod bootstrap;
pub mod env;
#[cfg(feature = "mlx")]
mod exchange;
#[cfg(feature = "mlx")]
mod ffi;
#[cfg(any(feature = "mlx", test))]
mod frame;
#[cfg(any(feature = "mlx", test))]
mod native;
#[cfg(feature = "mlx")]
mod pause;
#[cfg(feature = "mlx")]
mod pool;
#[cfg(feature = "mlx")]
mod progress;
#[cfg(feature = "mlx")]
mod route;
#[cfg(feature = "mlx")]
mod shared;
#[cfg(feature = "mlx")]
mod sync;
#[cfg(feature = "mlx")]
mod transport;
#[cfg(not(feature = "mlx"))]
mod unavailable;

pub use backend::Backend;
#[cfg(feature = "mlx")]
pub use bootstrap::is_available;
#[cfg(feature = "mlx")]
pub use shared::MAX_MESSAGE_LEN;
#[cfg(feature = "mlx")]
pub use transport::MlxTransport;
#[cfg(not(feature = "mlx"))]
pub use unavailable::{MlxTransport, is_available};
