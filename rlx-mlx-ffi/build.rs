//! Build script of `rlx-mlx-ffi`: with the `mlx` feature, finds MLX's headers and `libmlx`,
//! compiles the C++ shim against them and links `libmlx` with an rpath. Without the feature it
//! does nothing, so the default build never needs MLX.
//!
//! MLX is looked for, in order, in `MLX_DIR` (a prefix holding `include/mlx` and `lib`), in the
//! `mlx` Python package of `$PYTHON`, of `python3`, and of the workspace's
//! `target/mlx-venv`. When every place fails, the build fails with each reason and the install
//! hint.

fn main() {
    #[cfg(feature = "mlx")]
    mlx::build();
}

#[cfg(feature = "mlx")]
mod mlx {
    use std::env;
    use std::path::{Path, PathBuf};
    use std::process::Command;

    /// An MLX installation: the directory holding `mlx/` headers and the one holding `libmlx`.
    struct Install {
        include: PathBuf,
        lib: PathBuf,
        found_by: String,
    }

    pub(super) fn build() {
        println!("cargo:rerun-if-env-changed=MLX_DIR");
        println!("cargo:rerun-if-env-changed=PYTHON");
        println!("cargo:rerun-if-changed=shim/rlx_mlx_shim.cpp");
        println!("cargo:rerun-if-changed=shim/rlx_mlx_shim.h");

        let mut reasons = Vec::new();
        let Some(install) = find(&mut reasons) else {
            let mut message = String::from("rlx-mlx-ffi: MLX was not found. Places tried:\n");
            for reason in &reasons {
                message.push_str("  - ");
                message.push_str(reason);
                message.push('\n');
            }
            message.push_str(
                "Install it with `pip install \"mlx[cpu]\"` (Linux) or `pip install mlx` (macOS), \
                 or set MLX_DIR to a prefix holding include/mlx and lib/libmlx.",
            );
            eprintln!("{message}");
            std::process::exit(1);
        };
        println!("cargo:found_by={}", install.found_by);

        cc::Build::new()
            .cpp(true)
            .std("c++20")
            .file("shim/rlx_mlx_shim.cpp")
            .include("shim")
            .include(&install.include)
            .flag_if_supported("-Wno-unused-parameter")
            .flag_if_supported("-Wno-deprecated-declarations")
            .compile("rlx_mlx_shim");

        let lib = install.lib.display();
        println!("cargo:rustc-link-search=native={lib}");
        println!("cargo:rustc-link-lib=dylib=mlx");
        // Binaries of this package (tests, examples) find libmlx at run time through the rpath;
        // dependents read `DEP_MLX_LIB_DIR` and emit the same argument for theirs.
        println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
        println!("cargo:lib_dir={lib}");
        println!("cargo:include_dir={}", install.include.display());
    }

    fn find(reasons: &mut Vec<String>) -> Option<Install> {
        match env::var_os("MLX_DIR") {
            Some(dir) => {
                let dir = PathBuf::from(dir);
                match check_prefix(&dir, &dir.join("include"), &dir.join("lib")) {
                    Ok(()) => {
                        return Some(Install {
                            include: dir.join("include"),
                            lib: dir.join("lib"),
                            found_by: format!("MLX_DIR={}", dir.display()),
                        });
                    }
                    Err(why) => reasons.push(format!("MLX_DIR={}: {why}", dir.display())),
                }
            }
            None => reasons.push("MLX_DIR: not set".to_owned()),
        }

        let mut pythons: Vec<(String, PathBuf)> = Vec::new();
        match env::var_os("PYTHON") {
            Some(p) => pythons.push(("PYTHON".to_owned(), PathBuf::from(p))),
            None => reasons.push("PYTHON: not set".to_owned()),
        }
        pythons.push(("python3 on PATH".to_owned(), PathBuf::from("python3")));
        if let Some(venv) = workspace_venv() {
            pythons.push((
                "the workspace venv".to_owned(),
                venv.join("bin").join("python"),
            ));
        }
        for (label, python) in pythons {
            match from_python(&python) {
                Ok(package) => {
                    let include = package.join("include");
                    let lib = package.join("lib");
                    match check_prefix(&package, &include, &lib) {
                        Ok(()) => {
                            return Some(Install {
                                include,
                                lib,
                                found_by: format!("{label}: {}", python.display()),
                            });
                        }
                        Err(why) => reasons.push(format!(
                            "{label} ({}): mlx package at {}: {why}",
                            python.display(),
                            package.display()
                        )),
                    }
                }
                Err(why) => reasons.push(format!("{label} ({}): {why}", python.display())),
            }
        }
        None
    }

    /// `<workspace>/target/mlx-venv`, the venv `cargo xtask ci` creates.
    fn workspace_venv() -> Option<PathBuf> {
        let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR")?);
        let workspace = manifest.parent()?;
        Some(workspace.join("target").join("mlx-venv"))
    }

    /// The directory of the `mlx` package that `python` imports.
    fn from_python(python: &Path) -> Result<PathBuf, String> {
        let output = Command::new(python)
            .args([
                "-c",
                "import mlx, os; print(os.path.abspath(list(mlx.__path__)[0]))",
            ])
            .output()
            .map_err(|e| format!("cannot run it: {e}"))?;
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            let last = stderr
                .lines()
                .last()
                .unwrap_or("no output")
                .trim()
                .to_owned();
            return Err(format!("`import mlx` failed: {last}"));
        }
        let path = String::from_utf8_lossy(&output.stdout).trim().to_owned();
        if path.is_empty() {
            return Err("`import mlx` printed no package path".to_owned());
        }
        Ok(PathBuf::from(path))
    }

    /// Checks that `include` has MLX's distributed headers and `lib` has `libmlx`.
    fn check_prefix(root: &Path, include: &Path, lib: &Path) -> Result<(), String> {
        if !root.is_dir() {
            return Err("not a directory".to_owned());
        }
        let header = include
            .join("mlx")
            .join("distributed")
            .join("distributed.h");
        if !header.is_file() {
            return Err(format!("no {}", header.display()));
        }
        let names = ["libmlx.so", "libmlx.dylib"];
        if !names.iter().any(|n| lib.join(n).is_file()) {
            return Err(format!("no libmlx.so or libmlx.dylib in {}", lib.display()));
        }
        Ok(())
    }
}
