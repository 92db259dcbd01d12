//! The systems `bench` measures side by side: RLX's own ranks and, with `--peers`, Open MPI (over
//! its TCP BTL, and over its shared-memory BTL when the ranks share a host), Gloo
//! (torch.distributed) and MLX's ring backend, each a set of long-lived processes driven step by
//! step through the line protocol of [`super::measure`]; plus `iperf3` on loopback as the ceiling
//! of one TCP stream.
//!
//! A peer that is not installed is skipped with a one-line note saying what to install; a
//! peer that fails mid-sweep is dropped with a note. Neither is an error of the benchmark.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use super::measure::{Reply, Step};
use crate::cmd::workspace_root;
use crate::job::{self, ChildSpec, Job, Output, Stream};
use crate::ranks::scratch_dir;

/// How long a system may take to start (torch's import alone takes seconds on this machine).
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// A running system: its processes and which of them speak the protocol.
#[derive(Debug)]
pub(crate) struct System {
    /// The name in tables and plots (`"rlx"`, `"openmpi"`, ...).
    pub(crate) name: String,
    job: Job,
    /// Children whose stdin receives every command.
    feed: Vec<usize>,
    /// The child whose stdout carries the replies.
    reply_from: usize,
    log: VecDeque<String>,
    scratch: Vec<PathBuf>,
}

/// The outcome of starting a peer.
#[derive(Debug)]
pub(crate) enum Started {
    /// Running and ready.
    Running(Box<System>),
    /// Not available here, with a one-line note.
    Skipped(String),
}

impl System {
    /// Starts `specs`, feeding commands to the children in `feed`, and waits for `ready`.
    fn start(
        name: &str,
        specs: &[ChildSpec],
        feed: Vec<usize>,
        reply_from: usize,
    ) -> Result<System, String> {
        let job = Job::spawn(specs)?;
        let mut system = System {
            name: name.to_owned(),
            job,
            feed,
            reply_from,
            log: VecDeque::new(),
            scratch: Vec::new(),
        };
        system.await_line(START_TIMEOUT, |line| (line.trim() == "ready").then_some(()))?;
        Ok(system)
    }

    /// Sends `step` and waits up to `timeout` for the reply.
    pub(crate) fn step(&mut self, step: &Step, timeout: Duration) -> Result<Reply, String> {
        let line = step.to_line();
        for index in self.feed.clone() {
            self.job.send_line(index, &line)?;
        }
        self.await_line(timeout, Reply::parse)
    }

    /// The last lines the system's processes printed, for error messages.
    pub(crate) fn log_tail(&self) -> String {
        let lines: Vec<&str> = self.log.iter().map(String::as_str).collect();
        lines.join(" | ")
    }

    fn await_line<T>(
        &mut self,
        timeout: Duration,
        accept: impl Fn(&str) -> Option<T>,
    ) -> Result<T, String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!(
                    "{}: no answer within {:.0} s",
                    self.name,
                    timeout.as_secs_f64()
                ));
            }
            match self.job.next(left.min(Duration::from_millis(200))) {
                Some(Output::Line {
                    child,
                    stream,
                    text,
                }) => {
                    if child == self.reply_from && stream == Stream::Stdout {
                        if let Some(value) = accept(&text) {
                            return Ok(value);
                        }
                    }
                    if self.log.len() == 12 {
                        self.log.pop_front();
                    }
                    self.log
                        .push_back(format!("[{}] {text}", self.job.label(child)));
                }
                Some(Output::Closed { child }) if child == self.reply_from => {
                    std::thread::sleep(Duration::from_millis(50));
                    let status = self
                        .job
                        .poll_exit(child)
                        .map_or_else(|| "still running".to_owned(), |s| s.to_string());
                    return Err(format!(
                        "{}: {} exited ({status})",
                        self.name,
                        self.job.label(child)
                    ));
                }
                Some(Output::Closed { .. }) | None => {}
            }
        }
    }

    /// Asks the processes to quit and reaps them (killing what does not exit in time).
    pub(crate) fn stop(mut self) {
        for index in self.feed.clone() {
            // A process that already exited cannot be asked; finish() reaps it.
            let _ = self.job.send_line(index, "quit");
        }
        self.job.finish(Duration::from_secs(3));
    }
}

impl Drop for System {
    fn drop(&mut self) {
        for path in &self.scratch {
            // Scratch files live under target/; a leftover is harmless.
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Binds process `i` of a system with one process per rank to CPU `i`, as `mpirun` binds its
/// ranks by default, so that every system in the sweep is placed alike; with more ranks than
/// CPUs nobody is bound (`mpirun` does not bind oversubscribed ranks either). Left to the
/// scheduler, two ranks of a 2-core machine often share one core for a whole run, which cost
/// RLX 2.4x at 1 MiB all-reduces against Open MPI's bound ranks.
fn bound_like_mpirun(specs: Vec<ChildSpec>) -> Vec<ChildSpec> {
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    if specs.len() > cpus {
        return specs;
    }
    specs
        .into_iter()
        .enumerate()
        .map(|(i, spec)| spec.on_cpu(i))
        .collect()
}

/// Starts RLX's ranks from ready-made specs (one per process; every one gets the commands).
pub(crate) fn start_rlx(specs: &[ChildSpec]) -> Result<System, String> {
    let specs = bound_like_mpirun(specs.to_vec());
    System::start("rlx", &specs, (0..specs.len()).collect(), 0)
}

/// The full path of `program` on `PATH`, if it is there.
fn find_program(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}

fn peer_source(file: &str) -> PathBuf {
    workspace_root().join("xtask").join("peers").join(file)
}

/// Which of Open MPI's byte transfer layers carries the messages between its ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MpiPath {
    /// The TCP BTL over loopback (`openmpi`): the same wire as RLX's sockets.
    Tcp,
    /// The shared-memory BTL, `vader`, whose large messages are one cross-memory-attach copy
    /// (`openmpi-sm`): the same mechanism as RLX's single-copy path between ranks of one host.
    SharedMemory,
}

impl MpiPath {
    /// The system's name in tables and plots.
    pub(crate) fn system_name(self) -> &'static str {
        match self {
            MpiPath::Tcp => "openmpi",
            MpiPath::SharedMemory => "openmpi-sm",
        }
    }
}

/// Open MPI on this host, running `xtask/peers/mpi_bench.c` over the byte transfer layer
/// `path` chooses. The `ob1` messaging layer is forced, so that the chosen BTL carries the
/// bytes (Debian's build would otherwise prefer UCX, with transports of its own).
pub(crate) fn start_openmpi(ranks: u32, path: MpiPath) -> Started {
    let name = path.system_name();
    let (Some(mpirun), Some(mpicc)) = (find_program("mpirun"), find_program("mpicc")) else {
        return Started::Skipped(format!(
            "{name}: skipped, mpirun/mpicc not found (apt-get install openmpi-bin libopenmpi-dev)"
        ));
    };
    let binary = match build_mpi_bench(&mpicc) {
        Ok(binary) => binary,
        Err(e) => return Started::Skipped(format!("{name}: skipped, {e}")),
    };
    let layers: &[&str] = match path {
        MpiPath::Tcp => &[
            "--mca",
            "btl",
            "tcp,self",
            "--mca",
            "btl_tcp_if_include",
            "lo",
        ],
        MpiPath::SharedMemory => &["--mca", "btl", "vader,self"],
    };
    // Rank i on core i, as `bound_like_mpirun` places the other systems (this is mpirun's own
    // default for two ranks); unbound when oversubscribed.
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let binding: &[&str] = if ranks as usize <= cpus {
        &["--map-by", "core", "--bind-to", "core"]
    } else {
        &["--bind-to", "none"]
    };
    let spec = ChildSpec::new(name, mpirun)
        .args(binding.iter().map(|s| (*s).to_owned()))
        .args([
            "--allow-run-as-root".to_owned(),
            "--oversubscribe".to_owned(),
            "-np".to_owned(),
            ranks.to_string(),
            "--mca".to_owned(),
            "pml".to_owned(),
            "ob1".to_owned(),
        ])
        .args(layers.iter().map(|s| (*s).to_owned()))
        .args([binary.display().to_string()]);
    match System::start(name, &[spec], vec![0], 0) {
        Ok(system) => Started::Running(Box::new(system)),
        Err(e) => Started::Skipped(format!("{name}: skipped, it did not start: {e}")),
    }
}

/// Builds the MPI benchmark into `target/xtask/peers/` when the source is newer.
fn build_mpi_bench(mpicc: &Path) -> Result<PathBuf, String> {
    let source = peer_source("mpi_bench.c");
    let dir = scratch_dir()?.join("peers");
    std::fs::create_dir_all(&dir)
        .map_err(|e| format!("could not create {}: {e}", dir.display()))?;
    let binary = dir.join("mpi_bench");
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    if modified(&binary).is_some() && modified(&binary) >= modified(&source) {
        return Ok(binary);
    }
    let output = Command::new(mpicc)
        .args(["-O2", "-o"])
        .arg(&binary)
        .arg(&source)
        .arg("-lm")
        .output()
        .map_err(|e| format!("could not run mpicc: {e}"))?;
    if output.status.success() {
        Ok(binary)
    } else {
        Err(format!(
            "mpicc failed on {}: {}",
            source.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// The first interpreter among `candidates` that has the Python module `module`.
fn python_with(module: &str, candidates: &[PathBuf]) -> Option<PathBuf> {
    let probe = format!(
        "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec({module:?}) else 3)"
    );
    candidates.iter().find_map(|python| {
        let found = Command::new(python)
            .args(["-c", &probe])
            .output()
            .is_ok_and(|o| o.status.success());
        found.then(|| python.clone())
    })
}

/// Gloo through torch.distributed (Debian's python3-torch), running `xtask/peers/gloo_bench.py`.
pub(crate) fn start_gloo(ranks: u32) -> Started {
    let mut candidates: Vec<PathBuf> = std::env::var_os("RLX_GLOO_PYTHON")
        .map(PathBuf::from)
        .into_iter()
        .collect();
    candidates.extend([PathBuf::from("/usr/bin/python3"), PathBuf::from("python3")]);
    let Some(python) = python_with("torch", &candidates) else {
        return Started::Skipped(
            "gloo: skipped, no python3 with torch found (apt-get install python3-torch, or set RLX_GLOO_PYTHON)".to_owned(),
        );
    };
    let port = match job::free_port() {
        Ok(port) => port,
        Err(e) => return Started::Skipped(format!("gloo: skipped, {e}")),
    };
    let script = peer_source("gloo_bench.py");
    let specs: Vec<ChildSpec> = (0..ranks)
        .map(|rank| {
            ChildSpec::new(format!("gloo rank {rank}"), python.clone())
                .args([script.display().to_string()])
                .env("RANK", rank.to_string())
                .env("WORLD_SIZE", ranks.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string())
                .env("GLOO_SOCKET_IFNAME", "lo")
        })
        .collect();
    let specs = bound_like_mpirun(specs);
    match System::start("gloo", &specs, (0..specs.len()).collect(), 0) {
        Ok(system) => Started::Running(Box::new(system)),
        Err(e) => Started::Skipped(format!("gloo: skipped, it did not start: {e}")),
    }
}

/// MLX's ring backend through `mlx[cpu]`, running `xtask/peers/mlx_bench.py`.
pub(crate) fn start_mlx(ranks: u32) -> Started {
    let mut candidates: Vec<PathBuf> = std::env::var_os("RLX_MLX_PYTHON")
        .map(PathBuf::from)
        .into_iter()
        .collect();
    candidates.extend([
        workspace_root()
            .join("target")
            .join("mlx-venv")
            .join("bin")
            .join("python"),
        PathBuf::from("python3"),
    ]);
    let Some(python) = python_with("mlx", &candidates) else {
        return Started::Skipped(
            "mlx: skipped, no python with mlx found (python3 -m venv target/mlx-venv && target/mlx-venv/bin/pip install \"mlx[cpu]\", or set RLX_MLX_PYTHON)".to_owned(),
        );
    };
    let hostfile = match mlx_hostfile(ranks) {
        Ok(path) => path,
        Err(e) => return Started::Skipped(format!("mlx: skipped, {e}")),
    };
    let script = peer_source("mlx_bench.py");
    let specs: Vec<ChildSpec> = (0..ranks)
        .map(|rank| {
            ChildSpec::new(format!("mlx rank {rank}"), python.clone())
                .args([script.display().to_string()])
                .env("MLX_HOSTFILE", hostfile.display().to_string())
                .env("MLX_RANK", rank.to_string())
        })
        .collect();
    let specs = bound_like_mpirun(specs);
    match System::start("mlx", &specs, (0..specs.len()).collect(), 0) {
        Ok(mut system) => {
            system.scratch.push(hostfile);
            Started::Running(Box::new(system))
        }
        Err(e) => {
            // Scratch files live under target/; a leftover is harmless.
            let _ = std::fs::remove_file(&hostfile);
            Started::Skipped(format!("mlx: skipped, it did not start: {e}"))
        }
    }
}

fn mlx_hostfile(ranks: u32) -> Result<PathBuf, String> {
    let entries: Vec<Vec<String>> = job::free_ports(ranks as usize)?
        .into_iter()
        .map(|port| vec![format!("127.0.0.1:{port}")])
        .collect();
    let text = serde_json::to_string(&entries)
        .map_err(|e| format!("could not encode the hostfile: {e}"))?;
    let path = scratch_dir()?.join(format!("mlx-hostfile-{}.json", std::process::id()));
    std::fs::write(&path, text).map_err(|e| format!("could not write {}: {e}", path.display()))?;
    Ok(path)
}

/// Where `iperf3` measures the ceiling: over loopback, or between the network namespaces of
/// ranks 0 and 1 over the same link the ranks use.
#[derive(Debug, Clone)]
pub(crate) struct IperfPath {
    /// The namespaces of the client (rank 0) and the server (rank 1), or none for loopback.
    pub(crate) namespaces: Option<(String, String)>,
    /// The server's address.
    pub(crate) server: String,
}

impl IperfPath {
    /// Loopback on this host.
    pub(crate) fn loopback() -> IperfPath {
        IperfPath {
            namespaces: None,
            server: "127.0.0.1".to_owned(),
        }
    }

    /// What the table calls this path.
    pub(crate) fn describe(&self) -> &'static str {
        if self.namespaces.is_some() {
            "between the namespaces of ranks 0 and 1"
        } else {
            "over loopback"
        }
    }

    /// `program` run in the namespace `ns` when there is one.
    fn command(&self, ns: Option<&str>, program: &Path) -> (PathBuf, Vec<String>) {
        match ns {
            Some(ns) => (
                PathBuf::from("ip"),
                vec![
                    "netns".to_owned(),
                    "exec".to_owned(),
                    ns.to_owned(),
                    program.display().to_string(),
                ],
            ),
            None => (program.to_path_buf(), Vec::new()),
        }
    }
}

/// `iperf3` over `path` for `seconds` with `streams` parallel TCP streams: their received
/// bandwidth together in GB/s, or a note when iperf3 is missing or fails. With `both_ways`,
/// `streams` streams run in each direction at once (`--bidir`, as an exchange, a ring step or
/// a pairwise swap moves bytes) and the figure is the mean of the two directions: what each
/// way carries while the other is busy too.
pub(crate) fn iperf3(
    seconds: u32,
    path: &IperfPath,
    streams: u32,
    both_ways: bool,
) -> Result<f64, String> {
    let Some(iperf3) = find_program("iperf3") else {
        return Err("iperf3: skipped, not found (apt-get install iperf3)".to_owned());
    };
    let port = job::free_port()?.to_string();
    let (client_ns, server_ns) = match &path.namespaces {
        Some((client, server)) => (Some(client.as_str()), Some(server.as_str())),
        None => (None, None),
    };
    let (program, mut args) = path.command(server_ns, &iperf3);
    args.extend(
        [
            "-s",
            "-1",
            "--forceflush",
            "-B",
            path.server.as_str(),
            "-p",
            &port,
        ]
        .map(str::to_owned),
    );
    let server = ChildSpec::new("iperf3 server", &program).args(args);
    let mut job = Job::spawn(&[server])?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if Instant::now() > deadline {
            return Err("iperf3: the server did not start listening".to_owned());
        }
        match job.next(Duration::from_millis(100)) {
            Some(Output::Line { text, .. }) if text.contains("listening") => break,
            Some(Output::Closed { .. }) => return Err("iperf3: the server exited".to_owned()),
            _ => {}
        }
    }
    let (program, mut args) = path.command(client_ns, &iperf3);
    args.extend(
        [
            "-c",
            path.server.as_str(),
            "-p",
            &port,
            "-J",
            "-t",
            &seconds.to_string(),
            "-P",
            &streams.max(1).to_string(),
        ]
        .map(str::to_owned),
    );
    if both_ways {
        args.push("--bidir".to_owned());
    }
    let output = Command::new(&program)
        .args(&args)
        .output()
        .map_err(|e| format!("iperf3: could not run the client: {e}"))?;
    job.finish(Duration::from_secs(2));
    let report: serde_json::Value = serde_json::from_slice(&output.stdout)
        .map_err(|e| format!("iperf3: unreadable report: {e}"))?;
    let received = |direction: &str| {
        report["end"][direction]["bits_per_second"]
            .as_f64()
            .map(|bits| bits / 8e9)
            .ok_or_else(|| format!("iperf3: no bandwidth in its report: {}", report["error"]))
    };
    let forward = received("sum_received")?;
    if !both_ways {
        return Ok(forward);
    }
    Ok((forward + received("sum_received_bidir_reverse")?) / 2.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::measure::BenchOp;
    use rlx_collective::{DType, ReduceKind};

    fn step() -> Step {
        Step {
            op: BenchOp::AllReduce,
            dtype: DType::F32,
            redop: Some(ReduceKind::Sum),
            count: 2,
            iters: 2,
            warmup: 0,
            compression: None,
        }
    }

    #[test]
    fn replies_are_found_among_log_lines_and_a_dead_system_is_an_error() {
        // Echoes each command's op back as noise on both streams, answers, and dies on the
        // second command.
        let script = "echo ready; read cmd; echo \"log: $cmd\"; echo \"log: $cmd\" 1>&2; \
                      echo 'ok 0 1.5 2.5'; read cmd; exit 4";
        let spec = ChildSpec::new("scripted", "sh").args(["-c", script]);
        let mut system = System::start("scripted", &[spec], vec![0], 0).unwrap();
        let reply = system.step(&step(), Duration::from_secs(10)).unwrap();
        assert_eq!(
            reply,
            Reply::Ran {
                wrong: 0,
                micros: vec![1.5, 2.5],
                wire_bytes: None,
            }
        );
        assert!(system.log_tail().contains("log: all_reduce f32 sum 2 2 0"));
        let err = system.step(&step(), Duration::from_secs(10)).unwrap_err();
        assert!(err.contains("exited"), "{err}");
        system.stop();
    }

    #[test]
    fn a_silent_system_times_out() {
        let spec = ChildSpec::new("mute", "sh").args(["-c", "echo ready; sleep 30"]);
        let mut system = System::start("mute", &[spec], vec![0], 0).unwrap();
        let err = system
            .step(&step(), Duration::from_millis(300))
            .unwrap_err();
        assert!(err.contains("no answer"), "{err}");
        system.stop();
    }
}
