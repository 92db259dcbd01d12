//! Tidy checks over the whole workspace source, in the spirit of rust-analyzer's: every Rust file
//! opens with a `//!` doc saying what it is for, no file carries an unexplained marker of
//! unfinished work, every file ARCHITECTURE.md names exists, and the README's table of
//! environment variables is the list of the variables the libraries read; and the engine's
//! rooms name only their views, never the `Engine`.

use std::collections::BTreeSet;
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

/// The library crates, whose `src/` may read `RLX_*` variables, and only in `src/env.rs`.
const LIBRARIES: &[&str] = &[
    "rlx-transport",
    "rlx-net",
    "rlx-tb",
    "rlx-mlx-ffi",
    "rlx-collective",
];

/// Every `"RLX_..."` string literal (the name alone between quotes, so neither a message that
/// mentions a variable nor `b"RLX_RANK=0"` counts) in `text` before its unit tests.
fn rlx_literals(text: &str) -> Vec<String> {
    let code = text.split("\n#[cfg(test)]").next().unwrap_or_default();
    let mut found = Vec::new();
    for (start, _) in code.match_indices("\"RLX_") {
        let rest = &code[start + 1..];
        let end = rest
            .find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(rest.len());
        if end > "RLX_".len() && rest[end..].starts_with('"') {
            found.push(rest[..end].to_owned());
        }
    }
    found
}

/// The rows of the README's tables of variables: `(main, tools)`, each row as its cells with
/// the backticks around the name removed.
fn readme_variable_tables() -> (Vec<Vec<String>>, Vec<Vec<String>>) {
    let text = fs::read_to_string(workspace_root().join("README.md")).expect("README.md");
    let start = text
        .find("Launching across processes or machines")
        .expect("the README's section on launching");
    let (mut main, mut tools) = (Vec::new(), Vec::new());
    let mut table: Option<&mut Vec<Vec<String>>> = None;
    for line in text[start..].lines() {
        if line.starts_with("| variable | tcp | tb | mlx |") {
            table = Some(&mut main);
        } else if line.starts_with("| variable | read or set by |") {
            table = Some(&mut tools);
        } else if !line.starts_with('|') {
            if table.is_some() && !tools.is_empty() {
                break;
            }
            table = None;
        } else if let Some(rows) = table.as_mut().filter(|_| !line.starts_with("|---")) {
            let mut cells: Vec<String> = line
                .trim_matches('|')
                .split(" | ")
                .map(|cell| cell.trim().to_owned())
                .collect();
            cells[0] = cells[0].trim_matches('`').to_owned();
            rows.push(cells);
        }
    }
    assert!(main.len() > 20, "README's table of variables: {main:?}");
    assert!(!tools.is_empty(), "README's table of the tools' variables");
    (main, tools)
}

/// The names `"RLX_..."` literals of the library sources hold, each with the file it is in.
fn library_literals() -> Vec<(String, PathBuf)> {
    let root = workspace_root();
    let mut out = Vec::new();
    for crate_dir in LIBRARIES {
        let mut files = Vec::new();
        rust_files(&root.join(crate_dir).join("src"), &mut files);
        for file in files {
            let text = fs::read_to_string(&file).unwrap_or_default();
            for name in rlx_literals(&text) {
                out.push((name, file.strip_prefix(&root).unwrap_or(&file).to_owned()));
            }
        }
    }
    out
}

/// The README's table of variables lists exactly the variables the libraries read: every
/// `"RLX_..."` name in a library's sources is a row of it (or of the small table of the tools'
/// variables), every row is read by some library, and the names live only in each crate's
/// `env.rs`. The tools' variables (xtask's and the `rlx` command's) must be in one of the two
/// tables too.
#[test]
fn readme_variable_table_matches_the_code() {
    let (main, tools) = readme_variable_tables();
    let rows: BTreeSet<&str> = main.iter().map(|row| row[0].as_str()).collect();
    let tool_rows: BTreeSet<&str> = tools.iter().map(|row| row[0].as_str()).collect();
    let literals = library_literals();
    let read: BTreeSet<&str> = literals.iter().map(|(name, _)| name.as_str()).collect();

    let unlisted: Vec<_> = read
        .iter()
        .filter(|name| !rows.contains(*name) && !tool_rows.contains(*name))
        .collect();
    assert!(
        unlisted.is_empty(),
        "variables the libraries read that the README's table lacks: {unlisted:?}"
    );
    let unread: Vec<_> = rows.iter().filter(|name| !read.contains(*name)).collect();
    assert!(
        unread.is_empty(),
        "README rows no library reads (or reads outside env.rs): {unread:?}"
    );
    let scattered: Vec<_> = literals
        .iter()
        .filter(|(_, file)| !file.ends_with("src/env.rs"))
        .collect();
    assert!(
        scattered.is_empty(),
        "RLX_ names outside the crates' env.rs: {scattered:?}"
    );

    let root = workspace_root();
    let mut tool_files = Vec::new();
    for tool in ["xtask", "rlx-cli"] {
        rust_files(&root.join(tool).join("src"), &mut tool_files);
    }
    let mut tool_text = String::new();
    for file in &tool_files {
        let text = fs::read_to_string(file).unwrap_or_default();
        for name in rlx_literals(&text) {
            assert!(
                rows.contains(name.as_str()) || tool_rows.contains(name.as_str()),
                "{} uses {name}, in neither of the README's tables",
                file.display()
            );
        }
        tool_text.push_str(&text);
    }
    for file in fs::read_dir(root.join("xtask").join("peers"))
        .into_iter()
        .flatten()
    {
        tool_text.push_str(&fs::read_to_string(file.expect("peers").path()).unwrap_or_default());
    }
    let unused: Vec<_> = tool_rows
        .iter()
        .filter(|name| !read.contains(*name) && !tool_text.contains(&format!("\"{name}\"")))
        .collect();
    assert!(unused.is_empty(), "tools' rows nothing uses: {unused:?}");
}

/// Each row of the README's table says what the crates' lists say: the backends that read it
/// and its default (the meaning may say more). `rlx-mlx-ffi` is not a dependency of xtask, so
/// its two variables are checked by name only, by the test above.
#[test]
fn readme_variable_rows_match_the_crates_lists() {
    let (main, _) = readme_variable_tables();
    let lists = [
        rlx_transport::env::VARIABLES,
        rlx_net::env::VARIABLES,
        rlx_tb::env::VARIABLES,
        rlx_collective::env::VARIABLES,
    ];
    for variable in lists.into_iter().flatten() {
        let row = main
            .iter()
            .find(|row| row[0] == variable.name)
            .unwrap_or_else(|| panic!("{} has no row in the README's table", variable.name));
        let marked: Vec<&str> = ["tcp", "tb", "mlx"]
            .into_iter()
            .zip(&row[1..4])
            .filter(|(_, cell)| !cell.is_empty())
            .map(|(backend, _)| backend)
            .collect();
        assert_eq!(marked, variable.backends, "{}: backends", variable.name);
        assert_eq!(row[4], variable.default, "{}: default", variable.name);
    }
}

/// The engine's rooms are views (see `rlx-net/src/progress/mod.rs`): only the façade names the
/// `Engine`, so a room cannot grow back into one more `impl Engine` block that sees every
/// other room's state.
#[test]
fn only_the_engine_facade_names_the_engine() {
    let progress = workspace_root().join("rlx-net/src/progress");
    let mut files = Vec::new();
    rust_files(&progress, &mut files);
    assert!(files.len() > 10, "found only {} engine files", files.len());
    let offenders: Vec<_> = files
        .into_iter()
        .filter(|path| !path.ends_with("progress/mod.rs"))
        .filter(|path| {
            let text = fs::read_to_string(path).unwrap_or_default();
            text.lines()
                .filter(|line| !line.trim_start().starts_with("//"))
                .any(|line| {
                    line.split(|c: char| !c.is_alphanumeric() && c != '_')
                        .any(|word| word == "Engine")
                })
        })
        .collect();
    assert!(
        offenders.is_empty(),
        "engine rooms that name the Engine instead of taking a view: {offenders:#?}"
    );
}
