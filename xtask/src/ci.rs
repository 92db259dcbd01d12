//! `cargo xtask ci`: exactly what CI runs, in order, stopping at the first failure.

use clap::Args;

use std::path::Path;
use std::time::{Duration, Instant};

use crate::cluster::{ClusterArgs, Scenario};
use crate::cmd::{cargo, mlx_python, run_step, workspace_root};
use crate::launch::{self, LaunchArgs};
use crate::world::{LinkArgs, ProcessWorldArgs, Rendezvous, TransportKind, WorldArgs};
use crate::{bench, cluster, downstream, loom, macos, sanitize};

/// Flags of `cargo xtask ci`.
#[derive(Debug, Args)]
pub(crate) struct CiArgs {
    /// Skip the loom model checks (they are part of CI; this is for quick local runs).
    #[arg(long)]
    pub(crate) no_loom: bool,
    /// Skip the macOS type-check (part of CI; this is for quick local runs).
    #[arg(long)]
    pub(crate) no_macos: bool,
    /// Skip the sanitizer runs (part of CI; this is for quick local runs).
    #[arg(long)]
    pub(crate) no_sanitize: bool,
}

/// Whether this is CI's run (`CI=true`, which `.ci/run` sets): there nothing may be skipped,
/// because CI installs everything every step needs.
pub(crate) fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// A step that cannot run on this machine: a note locally, a failure under CI.
fn skip(step: &str, reason: &str) -> Result<(), String> {
    if in_ci() {
        return Err(format!("{step} cannot run under CI=true: {reason}"));
    }
    eprintln!("\n==> {step} skipped: {reason}");
    Ok(())
}

/// Runs every CI step, then prints how long each took (also when one fails), so that a run
/// that creeps towards CI's time limit shows where the time went.
pub(crate) fn run(args: &CiArgs) -> Result<(), String> {
    let mut steps = Steps::default();
    let result = run_steps(args, &mut steps);
    steps.print();
    result
}

/// The steps of [`run`], in order, stopping at the first failure.
fn run_steps(args: &CiArgs, steps: &mut Steps) -> Result<(), String> {
    steps.time("fmt", || {
        run_step("fmt", cargo().args(["fmt", "--all", "--check"]))
    })?;
    steps.time("clippy", || {
        run_step(
            "clippy",
            cargo().args([
                "clippy",
                "--workspace",
                "--all-targets",
                "--features",
                "rlx-collective/thunderbolt",
                "--",
                "-D",
                "warnings",
            ]),
        )
    })?;
    // Rustdoc warnings (broken or private intra-doc links, bare URLs) fail CI like clippy's.
    steps.time("docs", || {
        run_step(
            "docs",
            cargo().env("RUSTDOCFLAGS", "-D warnings").args([
                "doc",
                "--workspace",
                "--no-deps",
                "--features",
                "rlx-collective/thunderbolt",
            ]),
        )
    })?;
    steps.time("tests", || {
        run_step(
            "tests",
            cargo().args([
                "test",
                "--workspace",
                "--features",
                "rlx-collective/thunderbolt",
            ]),
        )
    })?;
    steps.time("test-cluster runs", clusters)?;
    steps.time("examples", examples)?;
    steps.time("downstream crate", downstream::check)?;
    steps.time("bench smoke", || {
        eprintln!(
            "\n==> bench smoke: every operation, dtype and reduction, small sizes, #wrong only"
        );
        bench::run(&bench::BenchArgs::smoke()).map_err(|e| format!("bench smoke: {e}"))
    })?;
    steps.time("mlx", || mlx(&workspace_root()))?;
    if !args.no_macos {
        steps.time("macOS type-check", || match macos::Toolchain::find() {
            Ok(toolchain) => macos::check(&toolchain),
            Err(missing) => skip("macOS type-check", &missing),
        })?;
    }
    if !args.no_loom {
        // Bound 3 checks every model in about a second on two cores (bound 4: about five).
        steps.time("loom", || loom::run(&loom::LoomArgs { preemptions: 3 }))?;
    }
    if !args.no_sanitize {
        steps.time("sanitizers (quick)", || {
            sanitize::run(&sanitize::SanitizeArgs {
                quick: true,
                sanitizer: vec![sanitize::Sanitizer::Thread, sanitize::Sanitizer::Address],
            })
        })?;
    }
    Ok(())
}

/// How long each step of a CI run took.
#[derive(Debug, Default)]
struct Steps {
    taken: Vec<(&'static str, Duration, bool)>,
}

impl Steps {
    /// Runs `step`, recording its time and whether it passed.
    fn time(
        &mut self,
        name: &'static str,
        step: impl FnOnce() -> Result<(), String>,
    ) -> Result<(), String> {
        let started = Instant::now();
        let result = step();
        self.taken.push((name, started.elapsed(), result.is_ok()));
        result
    }

    /// The table of steps and the total, on stderr with the steps' own output.
    fn print(&self) {
        eprintln!("\n==> ci: time per step");
        for (name, took, passed) in &self.taken {
            let verdict = if *passed { "" } else { "  (failed)" };
            eprintln!("  {:>7.1} min  {name}{verdict}", took.as_secs_f64() / 60.0);
        }
        let total: Duration = self.taken.iter().map(|(_, took, _)| *took).sum();
        eprintln!("  {:>7.1} min  in all", total.as_secs_f64() / 60.0);
    }
}

/// The collective matrix across real processes: TCP with 2, 3, 4 and 8 ranks and the threads
/// of one process, the quick case list; then, as root, 4 Thunderbolt ranks in network
/// namespaces joined by `thunderbolt0` links, and a rank killed mid-run whose survivors must
/// all report it; three fault trials of each scenario of `--repeat`, two of each link cut in
/// namespaces, and a 60 s soak.
fn clusters() -> Result<(), String> {
    for (what, args) in cluster_runs()? {
        eprintln!("\n==> test-cluster: {what}, the quick case list");
        cluster::run(&args).map_err(|e| format!("test-cluster ({what}): {e}"))?;
    }
    Ok(())
}

/// The test-cluster runs of [`clusters`], each with what it checks; `cargo xtask flaky` runs
/// them one by one through the hidden `__ci-cluster INDEX`.
pub(crate) fn cluster_runs() -> Result<Vec<(String, ClusterArgs)>, String> {
    let mut runs: Vec<(String, ClusterArgs)> = [2, 3, 4, 8]
        .into_iter()
        .map(|ranks| {
            let args = ClusterArgs {
                ranks,
                ..ClusterArgs::ci()
            };
            (format!("{ranks} ranks over TCP"), args)
        })
        .collect();
    runs.push((
        "4 threads over MemTransport".to_owned(),
        ClusterArgs {
            ranks: 4,
            world: WorldArgs::over(TransportKind::Mem),
            ..ClusterArgs::ci()
        },
    ));
    let victim = "2@all_reduce"
        .parse()
        .map_err(|e| format!("fault target: {e}"))?;
    runs.push((
        "4 ranks over TCP, rank 2 killed in all_reduce".to_owned(),
        ClusterArgs {
            ranks: 4,
            kill: Some(victim),
            ..ClusterArgs::ci()
        },
    ));
    let shrink_victim = "1@broadcast"
        .parse()
        .map_err(|e| format!("fault target: {e}"))?;
    runs.push((
        "4 ranks over TCP, rank 1 killed in broadcast, the survivors shrink, go on and take its \
         replacement back"
            .to_owned(),
        ClusterArgs {
            ranks: 4,
            kill: Some(shrink_victim),
            shrink: true,
            rejoin: true,
            ..ClusterArgs::ci()
        },
    ));
    runs.push((
        "fault trials, 3 of each scenario (random kill, SIGSTOP stall with a 3 s timeout, kill \
         of rank 0 in the rendezvous or the run)"
            .to_owned(),
        ClusterArgs {
            ranks: 4,
            repeat: Some(3),
            ..ClusterArgs::ci()
        },
    ));
    runs.push((
        "a 60 s soak of 4 ranks, every result checked, resources flat".to_owned(),
        ClusterArgs {
            ranks: 4,
            duration: Some(std::time::Duration::from_secs(60)),
            ..ClusterArgs::ci()
        },
    ));
    let netns = crate::netns::check_available();
    if netns.is_ok() {
        runs.extend(cabled_runs()?);
        runs.push((
            "fault trials in network namespaces, 2 of each way to cut a link (the cable \
             pulled, every packet dropped)"
                .to_owned(),
            ClusterArgs {
                ranks: 4,
                world: WorldArgs {
                    links: LinkArgs {
                        netns: true,
                        ..LinkArgs::default()
                    },
                    ..WorldArgs::tcp()
                },
                repeat: Some(2),
                scenario: vec![Scenario::Cut, Scenario::Drop],
                ..ClusterArgs::ci()
            },
        ));
    } else {
        let reason = netns.err().unwrap_or_default();
        skip("test-cluster --netns --transport tb", &reason)?;
    }
    Ok(runs)
}

/// The test-cluster runs over emulated cablings: the Thunderbolt bridge (a star), then every
/// cabling over both TCP and Thunderbolt (the launcher names the Ethernet beside cables in
/// `RLX_TB_IFNAME` for the latter, so islands are joined).
fn cabled_runs() -> Result<Vec<(String, ClusterArgs)>, String> {
    let over = |transport: TransportKind, topology: &str| -> Result<ClusterArgs, String> {
        Ok(ClusterArgs {
            ranks: 4,
            world: WorldArgs {
                links: LinkArgs {
                    netns: true,
                    topology: topology.parse().map_err(|e| format!("{e}"))?,
                    ..LinkArgs::default()
                },
                ..WorldArgs::over(transport)
            },
            ..ClusterArgs::ci()
        })
    };
    let mut runs = vec![(
        "4 Thunderbolt ranks in network namespaces".to_owned(),
        over(TransportKind::Tb, "star")?,
    )];
    let cablings = [
        ("mesh", "a full mesh of cables"),
        (
            "ring",
            "a ring of cables (the far ranks through the ranks between)",
        ),
        (
            "chain:0-2-1-3",
            "a chain numbered against its cables (the rings must follow the cables)",
        ),
        ("chain+star", "a chain with a switch alongside"),
        ("islands:2x2", "two islands of two joined by a switch"),
        ("mesh+star", "a full mesh of cables with a switch alongside"),
    ];
    for (topology, what) in cablings {
        for (transport, name) in [
            (TransportKind::Tcp, "TCP"),
            (TransportKind::Tb, "Thunderbolt"),
        ] {
            runs.push((
                format!("4 {name} ranks in network namespaces cabled as {what}"),
                over(transport, topology)?,
            ));
        }
    }
    // A hostfile listing every address of each rank: each pair must meet on its own cable,
    // and the ranks must learn the matrix without a store.
    for (transport, topology, what) in [
        (TransportKind::Tcp, "ring", "TCP ranks on a ring"),
        (
            TransportKind::Tb,
            "chain:0-2-1-3",
            "Thunderbolt ranks on a misnumbered chain",
        ),
    ] {
        let mut args = over(transport, topology)?;
        args.world.links.rendezvous = Rendezvous::Hostfile;
        runs.push((
            format!("4 {what}, meeting through a hostfile of every rank's addresses"),
            args,
        ));
    }
    Ok(runs)
}

/// Runs the test-cluster run of CI at `index` of [`cluster_runs`] alone.
pub(crate) fn cluster_run(index: usize) -> Result<(), String> {
    let runs = cluster_runs()?;
    let (what, args) = runs
        .get(index)
        .ok_or_else(|| format!("CI has {} test-cluster runs, not {}", runs.len(), index + 1))?;
    eprintln!("==> test-cluster: {what}, the quick case list");
    cluster::run(args).map_err(|e| format!("test-cluster ({what}): {e}"))
}

/// The workload examples as a user runs them: built in release and launched as 4 TCP ranks
/// by `cargo xtask launch`, each judging its own result (exit 0 only when it is right).
fn examples() -> Result<(), String> {
    run_step(
        "examples (build)",
        cargo().args(["build", "--release", "-p", "rlx-collective", "--examples"]),
    )?;
    let dir = workspace_root()
        .join("target")
        .join("release")
        .join("examples");
    let runs: [(&str, &[&str]); 4] = [
        ("data_parallel", &["--steps", "100"]),
        ("pipeline_parallel", &[]),
        ("tensor_parallel", &["--steps", "5"]),
        ("federated", &["--rounds", "6"]),
    ];
    for (name, args) in runs {
        eprintln!(
            "\n==> example {name}: cargo xtask launch -n 4 -- {name} {}",
            args.join(" ")
        );
        let mut command = vec![dir.join(name).into_os_string()];
        command.extend(args.iter().map(|a| a.into()));
        let launch = LaunchArgs {
            ranks: Some(4),
            world: ProcessWorldArgs::default(),
            hostfile: None,
            env: Vec::new(),
            grace: 5.0,
            timeout_ms: Some(60_000),
            command,
        };
        match launch::run(&launch)? {
            0 => {}
            code => return Err(format!("example {name} exited with code {code}")),
        }
    }
    Ok(())
}

/// MLX: installs `mlx[cpu]` into `target/mlx-venv` unless MLX is found, then lints and runs the
/// MLX tests (2, 3 and 4 ranks over MLX's ring on loopback; 2 under mpirun when Open MPI is
/// installed).
fn mlx(root: &Path) -> Result<(), String> {
    let python = mlx_python(root)?;
    run_step(
        "clippy (mlx)",
        cargo().env("PYTHON", &python).args([
            "clippy",
            "-p",
            "rlx-mlx-ffi",
            "-p",
            "rlx-collective",
            "--all-targets",
            "--features",
            "rlx-collective/mlx",
            "--",
            "-D",
            "warnings",
        ]),
    )?;
    run_step(
        "tests (mlx)",
        cargo()
            .env("PYTHON", &python)
            .args(["test", "-p", "rlx-mlx-ffi", "--features", "mlx"]),
    )?;
    eprintln!("\n==> test-cluster: 2 ranks over MLX's ring, the quick case list");
    cluster::run(&ClusterArgs {
        ranks: 2,
        world: WorldArgs::over(TransportKind::Mlx),
        ..ClusterArgs::ci()
    })
    .map_err(|e| format!("test-cluster (mlx): {e}"))
}
