//! MLX backend for RLX (`MlxTransport`), delegating to MLX's distributed module through a C++ shim, will live here.
