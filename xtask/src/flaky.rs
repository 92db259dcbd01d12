//! `cargo xtask flaky`: hunts tests whose verdict depends on scheduling. It builds the
//! workspace's test binaries as `cargo test` does, runs each chosen test alone, N times, beside
//! K threads that keep the CPUs busy (the other work a shared CI machine has), and prints each
//! test's failure count with the output of its first failure.
//!
//! Runs are interleaved (every test once, then every test again), so a disturbance of the
//! machine spreads over many tests instead of sinking one. A run that outlives its time limit
//! counts as a failure (a hang) and is stopped with every process it started (`supervise`).
//! Every run's output is kept under `target/flaky/`, named by test and run. The binaries are
//! copied there first, so that building the workspace again while a hunt goes on does not
//! change what it runs.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clap::Args;

use crate::cmd::{cargo, workspace_root};
use crate::supervise::{Supervised, supervise};

/// Flags of `cargo xtask flaky`.
#[derive(Debug, Args)]
pub(crate) struct FlakyArgs {
    /// How many times each chosen test runs.
    #[arg(long, default_value_t = 10)]
    pub(crate) runs: u32,
    /// Threads that spin beside the tests, each keeping one CPU busy.
    #[arg(long, default_value_t = 2)]
    pub(crate) load: u32,
    /// Seconds one run of one test may take before it counts as a hang and is killed.
    #[arg(long, default_value_t = 600)]
    pub(crate) timeout: u64,
    /// Lists the chosen tests and stops.
    #[arg(long)]
    pub(crate) list: bool,
    /// Chooses the tests whose `target::name` contains any of these strings (`tcp_exchange`,
    /// `wire_bytes::ring`, `doctor_links`). Without one, every test of the targets that start
    /// processes, create network namespaces or inject faults runs ([`DEFAULT_TARGETS`]).
    pub(crate) filters: Vec<String>,
}

/// The test targets a hunt without a filter covers: every one that starts processes, opens
/// sockets between ranks, creates network namespaces or injects faults. The in-process suites
/// left out (the collective matrix over threads, property tests, loom models, fuzz replays)
/// run on one thread's schedule or under a model checker and take most of the test time.
pub(crate) const DEFAULT_TARGETS: &[&str] = &[
    // rlx-net: every suite is real sockets between ranks, most of them processes.
    "tcp_bootstrap",
    "tcp_bootstrap_errors",
    "tcp_exchange",
    "tcp_failures",
    "tcp_handshake",
    "tcp_hostile_peers",
    "tcp_lane",
    "tcp_liveness",
    "tcp_single_copy",
    "tcp_slow_connections",
    "tcp_transfer",
    // rlx-tb: network namespaces joined by `thunderbolt0` links.
    "tb_pinning",
    "tb_transport",
    "heap_over_tcp",
    // rlx-collective: processes, faults and the counts of what went on the wire.
    "abort",
    "clean_exit",
    "collective_errors",
    "compressed_tcp",
    "deadlock",
    "departure",
    "departure_processes",
    "examples",
    "failure_propagation",
    "frozen_rank",
    "grow",
    "idle_wait",
    "memory",
    "nonblocking",
    "shrink",
    "shrink_processes",
    "stall_blame",
    "standalone",
    "wire_bytes",
    "worker_threads",
    "wrong_tag",
    // rlx-cli: the launcher and the doctor, in network namespaces and against lossy links.
    "rlx_cli",
    "doctor_links",
    // xtask: the cluster's checks.
    "xtask",
];

/// One test binary `cargo test` built: the target's name and where it runs from.
#[derive(Debug, Clone)]
struct TestBinary {
    /// The target's name (`tcp_exchange`, or the crate's name for its unit tests).
    target: String,
    /// The executable.
    executable: PathBuf,
    /// The package's directory, which `cargo test` runs each binary from.
    package_dir: PathBuf,
}

/// One test of one binary, or one of CI's test-cluster runs.
#[derive(Debug, Clone)]
struct TestCase {
    /// `target::name`, or `test-cluster::INDEX::what it checks`: what filters match and the
    /// summary prints.
    label: String,
    program: PathBuf,
    args: Vec<String>,
    /// Where it runs from.
    dir: PathBuf,
    /// Whether a hunt without a filter runs it.
    default: bool,
    /// The release xtask binary its ranks run (see `ranks::RANK_BINARY_VAR`), once chosen.
    rank_binary: Option<PathBuf>,
}

impl TestCase {
    /// The test `name` of `binary`, run alone.
    fn of_binary(binary: &TestBinary, name: String) -> TestCase {
        TestCase {
            label: format!("{}::{name}", binary.target),
            program: binary.executable.clone(),
            args: vec!["--exact".to_owned(), name, "--nocapture".to_owned()],
            dir: binary.package_dir.clone(),
            default: DEFAULT_TARGETS.contains(&binary.target.as_str()),
            rank_binary: None,
        }
    }

    /// CI's test-cluster runs, through this binary's hidden `__ci-cluster INDEX`. They take
    /// minutes each, so only a filter chooses them (`test-cluster`).
    fn cluster_runs() -> Result<Vec<TestCase>, String> {
        let program =
            std::env::current_exe().map_err(|e| format!("flaky: where is this binary: {e}"))?;
        Ok(crate::ci::cluster_runs()?
            .into_iter()
            .enumerate()
            .map(|(index, (what, _))| TestCase {
                label: format!("test-cluster::{index}::{what}"),
                program: program.clone(),
                args: vec!["__ci-cluster".to_owned(), index.to_string()],
                dir: workspace_root(),
                default: false,
                rank_binary: None,
            })
            .collect())
    }
}

/// What the runs of one test came to.
#[derive(Debug, Default)]
struct Tally {
    failures: u32,
    slowest: Duration,
    first_failure: Option<PathBuf>,
}

/// Builds the tests, chooses, runs and reports; an error when any run failed.
pub(crate) fn run(args: &FlakyArgs) -> Result<(), String> {
    let dir = workspace_root().join("target").join("flaky");
    std::fs::create_dir_all(&dir).map_err(|e| format!("flaky: {}: {e}", dir.display()))?;
    let mut cases = Vec::new();
    for binary in build()? {
        if !args.filters.is_empty() || DEFAULT_TARGETS.contains(&binary.target.as_str()) {
            let names = list_tests(&binary)?;
            cases.extend(
                names
                    .into_iter()
                    .map(|name| TestCase::of_binary(&binary, name)),
            );
        }
    }
    cases.extend(TestCase::cluster_runs()?);
    cases.retain(|case| chosen(case, &args.filters));
    if cases.is_empty() {
        return Err(format!("flaky: no test matches {:?}", args.filters));
    }
    if args.list {
        for case in &cases {
            println!("{}", case.label);
        }
        return Ok(());
    }
    snapshot_all(&mut cases, &dir)?;
    // Tests that start ranks of xtask itself use this release binary, a copy like the rest.
    let exe = std::env::current_exe().map_err(|e| format!("flaky: where is this binary: {e}"))?;
    let rank_binary = snapshot(&exe, &dir)?;
    for case in &mut cases {
        case.rank_binary = Some(rank_binary.clone());
    }
    let tallies = hunt(args, &cases, &dir)?;
    report(args, &cases, &tallies)
}

/// Whether `case` is chosen by `filters` (or by default, when there are none).
fn chosen(case: &TestCase, filters: &[String]) -> bool {
    if filters.is_empty() {
        return case.default;
    }
    filters.iter().any(|f| case.label.contains(f.as_str()))
}

/// Points every case at a copy of its program under `dir`, one copy per program.
fn snapshot_all(cases: &mut [TestCase], dir: &Path) -> Result<(), String> {
    let mut copies: Vec<(PathBuf, PathBuf)> = Vec::new();
    for case in cases {
        let original = case.program.clone();
        match copies.iter().find(|(path, _)| *path == original) {
            Some((_, copy)) => case.program = copy.clone(),
            None => {
                case.program = snapshot(&original, dir)?;
                copies.push((original, case.program.clone()));
            }
        }
    }
    Ok(())
}

/// A copy of `program` under `dir`, which the hunt runs instead of the original.
fn snapshot(program: &Path, dir: &Path) -> Result<PathBuf, String> {
    let name = program
        .file_name()
        .ok_or_else(|| format!("flaky: {} has no file name", program.display()))?;
    let copy = dir.join(name);
    std::fs::copy(program, &copy)
        .map_err(|e| format!("flaky: copying {}: {e}", program.display()))?;
    Ok(copy)
}

/// `cargo test --no-run` over the workspace with CI's features; the test binaries it built.
fn build() -> Result<Vec<TestBinary>, String> {
    eprintln!("==> flaky: building the tests (cargo test --workspace --no-run)");
    let output = cargo()
        .args([
            "test",
            "--workspace",
            "--features",
            "rlx-collective/thunderbolt",
        ])
        .args(["--no-run", "--message-format=json-render-diagnostics"])
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("flaky: could not start cargo: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "flaky: the tests did not build ({})",
            output.status
        ));
    }
    let mut binaries = Vec::new();
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        if let Some(binary) = test_binary(line) {
            binaries.push(binary);
        }
    }
    Ok(binaries)
}

/// The test binary a line of cargo's JSON messages announces, if it announces one.
fn test_binary(line: &str) -> Option<TestBinary> {
    let message: serde_json::Value = serde_json::from_str(line).ok()?;
    if message["reason"] != "compiler-artifact" || message["profile"]["test"] != true {
        return None;
    }
    let executable = PathBuf::from(message["executable"].as_str()?);
    let manifest = PathBuf::from(message["manifest_path"].as_str()?);
    Some(TestBinary {
        target: message["target"]["name"].as_str()?.to_owned(),
        executable,
        package_dir: manifest.parent()?.to_path_buf(),
    })
}

/// The tests `binary` runs by default (its ignored tests left out), from `--list`.
fn list_tests(binary: &TestBinary) -> Result<Vec<String>, String> {
    let listed = |ignored: bool| -> Result<BTreeSet<String>, String> {
        let mut command = Command::new(&binary.executable);
        command.current_dir(&binary.package_dir).arg("--list");
        if ignored {
            command.arg("--ignored");
        }
        let output = command
            .output()
            .map_err(|e| format!("flaky: could not list {}: {e}", binary.target))?;
        if !output.status.success() {
            return Err(format!(
                "flaky: {} --list failed: {}",
                binary.target,
                String::from_utf8_lossy(&output.stderr).trim()
            ));
        }
        Ok(String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter_map(|line| line.strip_suffix(": test"))
            .map(str::to_owned)
            .collect())
    };
    let ignored = listed(true)?;
    Ok(listed(false)?
        .into_iter()
        .filter(|name| !ignored.contains(name))
        .collect())
}

/// Runs every case `args.runs` times, interleaved, beside the load.
fn hunt(args: &FlakyArgs, cases: &[TestCase], dir: &Path) -> Result<Vec<Tally>, String> {
    let load = Load::start(args.load);
    let limit = Duration::from_secs(args.timeout);
    let mut tallies: Vec<Tally> = cases.iter().map(|_| Tally::default()).collect();
    let started = Instant::now();
    for round in 1..=args.runs {
        for (case, tally) in cases.iter().zip(&mut tallies) {
            let log = dir.join(format!("{}.{round}.log", file_name(&case.label)));
            let began = Instant::now();
            let verdict = run_once(case, &log, limit)?;
            tally.slowest = tally.slowest.max(began.elapsed());
            if let Err(why) = verdict {
                tally.failures += 1;
                eprintln!("    run {round}: {} FAILED ({why})", case.label);
                tally.first_failure.get_or_insert(log);
            }
        }
        let failed: u32 = tallies.iter().map(|t| t.failures).sum();
        eprintln!(
            "==> flaky: round {round}/{} done after {:.0} s, {failed} failed runs so far",
            args.runs,
            started.elapsed().as_secs_f64()
        );
    }
    drop(load);
    Ok(tallies)
}

/// One run of one test, its output into `log`: `Ok(Err(why))` when the test failed or hung.
fn run_once(case: &TestCase, log: &Path, limit: Duration) -> Result<Result<(), String>, String> {
    let mut command = Command::new(&case.program);
    command
        .current_dir(&case.dir)
        .args(&case.args)
        .stdin(Stdio::null());
    if let Some(binary) = &case.rank_binary {
        command.env(crate::ranks::RANK_BINARY_VAR, binary);
    }
    match supervise(&mut command, log, limit) {
        Supervised::Exited(status) if status.success() => Ok(Ok(())),
        Supervised::Exited(status) => Ok(Err(status.to_string())),
        Supervised::Deadline => Ok(Err(format!("hung: stopped after {} s", limit.as_secs()))),
        Supervised::NotStarted(why) => Err(format!("flaky: {}: {why}", case.label)),
    }
}

/// `label` as a file name: letters, digits and dots.
fn file_name(label: &str) -> String {
    let name: String = label
        .replace("::", ".")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .collect();
    name.chars().take(150).collect()
}

/// Prints each test's failures and the first failure's output; an error if any run failed.
fn report(args: &FlakyArgs, cases: &[TestCase], tallies: &[Tally]) -> Result<(), String> {
    println!(
        "\n{} tests x {} runs beside {} busy threads:",
        cases.len(),
        args.runs,
        args.load
    );
    println!("{:>8}  {:>9}  test", "failures", "slowest");
    for (case, tally) in cases.iter().zip(tallies) {
        println!(
            "{:>8}  {:>7.1} s  {}",
            format!("{}/{}", tally.failures, args.runs),
            tally.slowest.as_secs_f64(),
            case.label
        );
    }
    let mut flaky = 0;
    for (case, tally) in cases.iter().zip(tallies) {
        let Some(log) = &tally.first_failure else {
            continue;
        };
        flaky += 1;
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = &lines[lines.len().saturating_sub(60)..];
        println!(
            "\n--- {}: first failure ({}), last {} lines:",
            case.label,
            log.display(),
            tail.len()
        );
        for line in tail {
            println!("{line}");
        }
    }
    if flaky == 0 {
        println!("\nno failures");
        Ok(())
    } else {
        Err(format!(
            "{flaky} of {} tests failed at least once",
            cases.len()
        ))
    }
}

/// Threads that keep CPUs busy until dropped.
struct Load {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for Load {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Load")
            .field("threads", &self.threads.len())
            .finish()
    }
}

impl Load {
    /// Starts `threads` spinning threads.
    fn start(threads: u32) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..threads)
            .map(|_| {
                let stop = Arc::clone(&stop);
                std::thread::spawn(move || {
                    let mut x = 1u64;
                    while !stop.load(Ordering::Relaxed) {
                        for _ in 0..10_000 {
                            x = std::hint::black_box(x.wrapping_mul(6_364_136_223_846_793_005) + 1);
                        }
                    }
                })
            })
            .collect();
        Load { stop, threads }
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            // A spinning thread cannot panic; nothing to report if it did.
            let _ = thread.join();
        }
    }
}
