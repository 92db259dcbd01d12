//! Tidy checks over the whole workspace source, in the spirit of rust-analyzer's: every Rust file
//! opens with a `//!` doc saying what it is for, no file carries an unexplained marker of
//! unfinished work, and every file ARCHITECTURE.md names exists.

use std::fs;
use std::path::{Path, PathBuf};

fn workspace_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map(PathBuf::from).unwrap_or(manifest)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if path.is_dir() {
            if name != "target" && !name.starts_with('.') {
                rust_files(&path, out);
            }
        } else if name.ends_with(".rs") {
            out.push(path);
        }
    }
}

fn workspace_rust_files() -> Vec<PathBuf> {
    let root = workspace_root();
    let mut files = Vec::new();
    for dir in [
        "rlx-transport",
        "rlx-net",
        "rlx-tb",
        "rlx-mlx-ffi",
        "rlx-collective",
        "xtask",
    ] {
        rust_files(&root.join(dir), &mut files);
    }
    assert!(files.len() > 20, "found only {} Rust files", files.len());
    files
}

#[test]
fn every_rust_file_starts_with_a_module_doc() {
    let missing: Vec<_> = workspace_rust_files()
        .into_iter()
        .filter(|path| {
            let text = fs::read_to_string(path).unwrap_or_default();
            !text.trim_start().starts_with("//!")
        })
        .collect();
    assert!(
        missing.is_empty(),
        "files without a leading //! doc: {missing:#?}"
    );
}

#[test]
fn no_unfinished_work_markers() {
    let markers = [
        concat!("to", "do!("),
        concat!("unimpl", "emented!("),
        concat!("#[ig", "nore"),
        concat!("FIX", "ME"),
    ];
    let mut found = Vec::new();
    for path in workspace_rust_files() {
        let text = fs::read_to_string(&path).unwrap_or_default();
        for (line_no, line) in text.lines().enumerate() {
            if markers.iter().any(|m| line.contains(m)) {
                found.push(format!(
                    "{}:{}: {}",
                    path.display(),
                    line_no + 1,
                    line.trim()
                ));
            }
        }
    }
    assert!(found.is_empty(), "unfinished work: {found:#?}");
}

/// Every repository path that ARCHITECTURE.md names in backticks (a path with a `/` and a file
/// extension, or ending in `/`) exists, so that the map a newcomer follows never leads to a file
/// that was moved or removed.
#[test]
fn every_file_architecture_names_exists() {
    let root = workspace_root();
    let text = fs::read_to_string(root.join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let named: Vec<&str> = text
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|span| {
            let path_like = !span.contains(' ') && !span.contains("::") && span.contains('/');
            let last = span.rsplit('/').next().unwrap_or_default();
            path_like && (span.ends_with('/') || last.contains('.'))
        })
        .collect();
    assert!(named.len() > 10, "ARCHITECTURE.md names only {named:?}");
    let missing: Vec<_> = named
        .into_iter()
        .filter(|path| !root.join(path.trim_end_matches('/')).exists())
        .collect();
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md names files that do not exist: {missing:#?}"
    );
}
