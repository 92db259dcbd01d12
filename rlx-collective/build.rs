//! Gives this crate's binaries (tests, examples) an rpath to libmlx when the `mlx` feature links
//! `rlx-mlx-ffi`, whose build script reports MLX's library directory as `DEP_MLX_LIB_DIR`.

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_MLX_LIB_DIR");
    if let Ok(dir) = std::env::var("DEP_MLX_LIB_DIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
}
