//! Gives the xtask binary (whose re-executions are the ranks of test-cluster and bench) an rpath
//! to libmlx when the `mlx` feature links `rlx-mlx-ffi`, which reports it as `DEP_MLX_LIB_DIR`.

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_MLX_LIB_DIR");
    if let Ok(dir) = std::env::var("DEP_MLX_LIB_DIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
}
