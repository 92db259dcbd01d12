//! `rlx launch`: runs any program as the ranks of one job, the way torchrun's standalone
//! mode, `mlx.launch` or `mpirun` do.
//!
//! Every rank gets the launch environment its transport reads (`RLX_RANK`, `RLX_WORLD_SIZE`,
//! `RLX_MASTER_ADDR`/`RLX_MASTER_PORT` or `RLX_HOSTFILE`, `RLX_BACKEND`), the names a program
//! written for torchrun reads (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`,
//! `MASTER_ADDR`, `MASTER_PORT`), and `RLX_LOCAL_RANK`/`RLX_LOCAL_WORLD_SIZE`. Its output comes
//! back line by line with a `[rank] ` prefix. The first rank to fail (a non-zero exit or a
//! signal) is named; the others get a grace period to end by themselves and are then killed,
//! and the launcher exits with the failed rank's code (128 + the signal for a signal, as a
//! shell reports it). Ctrl-C kills every rank. The local ranks run through the same [`Job`] and
//! [`World`] as `test-cluster` and `bench`, network namespaces included.
//!
//! With `--hostfile`, the job is the one the file describes (MLX's format: one list of
//! `"host:port"` per rank): ranks on this host run here, ranks on other hosts are started with
//! `ssh HOST`, in the same working directory, with the environment set on the remote command
//! line (the hostfile travels inline in `RLX_HOSTFILE`, so no file needs copying).

use std::ffi::OsString;
use std::net::IpAddr;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use clap::Args;

use crate::job::{ChildSpec, Job, Output, Stream};
use crate::world::{ProcessWorldArgs, TransportKind, World};

/// Flags of `rlx launch`.
#[derive(Debug, Args)]
pub struct LaunchArgs {
    /// Number of ranks (with --hostfile, the file's length unless given).
    #[arg(short = 'n', long = "ranks")]
    pub ranks: Option<u32>,
    /// The transport, rendezvous and network namespaces of a local job.
    #[command(flatten)]
    pub world: ProcessWorldArgs,
    /// An MLX-style JSON hostfile (one list of "host:port" per rank); ranks on other hosts are
    /// started over ssh.
    #[arg(long, conflicts_with = "netns")]
    pub hostfile: Option<PathBuf>,
    /// An environment variable for every rank (repeatable).
    #[arg(long = "env", value_name = "KEY=VALUE", value_parser = parse_env)]
    pub env: Vec<(String, String)>,
    /// Seconds the other ranks get to end by themselves after the first one failed.
    #[arg(long, default_value_t = 5.0)]
    pub grace: f64,
    /// The ranks' operation timeout (RLX_TIMEOUT_MS), in milliseconds.
    #[arg(long)]
    pub timeout_ms: Option<u64>,
    /// The program and its arguments.
    #[arg(last = true, required = true, value_name = "PROGRAM")]
    pub command: Vec<OsString>,
}

fn parse_env(item: &str) -> Result<(String, String), String> {
    match item.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
        _ => Err(format!("{item:?} is not KEY=VALUE")),
    }
}

/// Runs the job and returns the launcher's exit code: 0 when every rank exited 0, else the
/// code of the rank that failed first.
pub fn run(args: &LaunchArgs) -> Result<u8, String> {
    let (program, program_args) = args
        .command
        .split_first()
        .ok_or("launch needs a program to run (after --)")?;
    if !args.grace.is_finite() || args.grace < 0.0 {
        return Err(format!("--grace {} is not a number of seconds", args.grace));
    }
    let program = PathBuf::from(program);
    let program_args: Vec<String> = program_args
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    // The world (ports, namespaces) lives until every rank has ended.
    let (_world, mut specs) = match &args.hostfile {
        None => {
            let size = args.ranks.unwrap_or(1);
            let world = World::prepare(&args.world.world().config(size, args.timeout_ms))?;
            let specs = (0..size)
                .map(|rank| {
                    local_names(
                        world.child(rank, &program, program_args.clone()),
                        rank,
                        size,
                    )
                })
                .collect();
            (Some(world), specs)
        }
        Some(file) => (None, from_hostfile(args, file, &program, &program_args)?),
    };
    for spec in &mut specs {
        spec.env.extend(args.env.iter().cloned());
    }
    let grace = Duration::from_secs_f64(args.grace);
    let mut blamed = Blame::default();
    let outcome = supervise(&specs, grace, &mut |rank, stream, text| {
        blamed.read(rank, text);
        match stream {
            Stream::Stdout => println!("[{rank}] {text}"),
            Stream::Stderr => eprintln!("[{rank}] {text}"),
        }
    })?;
    if let Some(failure) = &outcome.first_failure {
        eprintln!(
            "launch: rank {} failed first: {}",
            failure.rank, failure.how
        );
        if let Some(line) = blamed.verdict() {
            eprintln!("launch: {line}");
        }
        if !failure.ended.is_empty() {
            let ranks: Vec<String> = failure.ended.iter().map(ToString::to_string).collect();
            eprintln!(
                "launch: killed rank(s) {} still running {:.1} s after that",
                ranks.join(", "),
                grace.as_secs_f64()
            );
        }
    }
    Ok(outcome.code)
}

/// The rank the ranks' own errors name as the cause: RLX's errors say `peer rank N` (or
/// `with rank N`), and the last such mention of each rank is its verdict.
#[derive(Debug, Default)]
struct Blame {
    /// Rank -> the rank its latest error line named.
    named: std::collections::BTreeMap<usize, usize>,
}

impl Blame {
    /// Notes the rank a line of `rank`'s output names, if it names another.
    fn read(&mut self, rank: usize, text: &str) {
        let named = ["peer rank ", "with rank "].iter().find_map(|marker| {
            let (_, after) = text.rsplit_once(marker)?;
            let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
            digits.parse::<usize>().ok()
        });
        if let Some(named) = named.filter(|&n| n != rank) {
            self.named.insert(rank, named);
        }
    }

    /// `the errors name rank N as the cause (ranks a, b, c)`, for the rank most of the errors
    /// name, or nothing when none does.
    fn verdict(&self) -> Option<String> {
        let mut votes: std::collections::BTreeMap<usize, Vec<usize>> = Default::default();
        for (&rank, &named) in &self.named {
            votes.entry(named).or_default().push(rank);
        }
        let (cause, by) = votes.into_iter().max_by_key(|(_, by)| by.len())?;
        let by: Vec<String> = by.iter().map(ToString::to_string).collect();
        Some(format!(
            "the errors name rank {cause} as the cause (rank(s) {})",
            by.join(", ")
        ))
    }
}

/// Adds the torchrun names (`RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`) and the local
/// rank to the spec of `rank`, run on this host with every other rank of the job.
fn local_names(mut spec: ChildSpec, rank: u32, size: u32) -> ChildSpec {
    let master: Vec<(String, String)> = spec
        .env
        .iter()
        .filter_map(|(key, value)| {
            let torchrun = key.strip_prefix("RLX_")?;
            matches!(torchrun, "MASTER_ADDR" | "MASTER_PORT")
                .then(|| (torchrun.to_owned(), value.clone()))
        })
        .collect();
    spec.env.extend(master);
    spec.env.extend(rank_names(
        rank as usize,
        size as usize,
        rank as usize,
        size as usize,
    ));
    spec
}

/// The rank variables a launched program may read besides the transport's own:
/// torchrun's `RANK`, `WORLD_SIZE`, `LOCAL_RANK` and `LOCAL_WORLD_SIZE`, and RLX's local ones.
fn rank_names(
    rank: usize,
    size: usize,
    local_rank: usize,
    local_size: usize,
) -> [(String, String); 6] {
    [
        ("RANK", rank),
        ("WORLD_SIZE", size),
        ("LOCAL_RANK", local_rank),
        ("RLX_LOCAL_RANK", local_rank),
        ("LOCAL_WORLD_SIZE", local_size),
        ("RLX_LOCAL_WORLD_SIZE", local_size),
    ]
    .map(|(key, value)| (key.to_owned(), value.to_string()))
}

/// The ranks a hostfile describes: here for this host's addresses, over `ssh` for the others.
fn from_hostfile(
    args: &LaunchArgs,
    file: &Path,
    program: &Path,
    program_args: &[String],
) -> Result<Vec<ChildSpec>, String> {
    let origin = file.display().to_string();
    let text = std::fs::read_to_string(file).map_err(|e| format!("{origin}: {e}"))?;
    let hosts = rlx_transport::bootstrap::parse_hostfile(&origin, &text)
        .map_err(|e| format!("{origin}: {e}"))?;
    let size = u32::try_from(hosts.len()).map_err(|_| format!("{origin}: too many ranks"))?;
    if args.ranks.is_some_and(|n| n != size) {
        return Err(format!(
            "-n {} but {origin} lists {size} ranks",
            args.ranks.unwrap_or_default()
        ));
    }
    // The inline form travels on a remote command line and needs no copy of the file.
    let inline = serde_json::to_string(&hosts).map_err(|e| format!("{origin}: {e}"))?;
    let names: Vec<String> = hosts
        .iter()
        .map(|links| {
            let first = links.first().map_or("", String::as_str);
            rlx_transport::bootstrap::split_host_port(first)
                .map(|(host, _)| host)
                .map_err(|e| format!("{origin}: {e}"))
        })
        .collect::<Result<_, _>>()?;
    let transport = TransportKind::from(args.world.transport);
    let mut specs = Vec::new();
    for (rank, host) in names.iter().enumerate() {
        let local_rank = names[..rank].iter().filter(|h| *h == host).count();
        let local_size = names.iter().filter(|h| *h == host).count();
        let mut env: Vec<(String, String)> = vec![
            ("RLX_BACKEND".into(), transport.name().into()),
            (rlx_collective::PREFIXED_VAR.into(), "1".into()),
        ];
        if transport == TransportKind::Mlx {
            // MLX's own ring backend reads a hostfile path.
            let path = std::fs::canonicalize(file).map_err(|e| format!("{origin}: {e}"))?;
            env.push(("MLX_RANK".into(), rank.to_string()));
            env.push(("MLX_HOSTFILE".into(), path.display().to_string()));
        } else {
            env.push(("RLX_RANK".into(), rank.to_string()));
            env.push(("RLX_WORLD_SIZE".into(), size.to_string()));
            env.push(("RLX_HOSTFILE".into(), inline.clone()));
        }
        env.extend(rank_names(rank, size as usize, local_rank, local_size));
        if let Some(ms) = args.timeout_ms {
            env.push(("RLX_TIMEOUT_MS".into(), ms.to_string()));
        }
        let label = format!("rank {rank}");
        let spec = if is_this_host(host) {
            let mut spec = ChildSpec::new(label, program).args(program_args.iter().cloned());
            spec.env = env;
            spec
        } else {
            let cwd = std::env::current_dir().map_err(|e| format!("working directory: {e}"))?;
            ChildSpec::new(label, "ssh").args([
                "-o".to_owned(),
                "BatchMode=yes".to_owned(),
                host.clone(),
                remote_command(&cwd, &env, program, program_args),
            ])
        };
        specs.push(spec);
    }
    Ok(specs)
}

/// Whether `host` names this machine: `localhost`, a loopback address or an address of one of
/// its interfaces.
fn is_this_host(host: &str) -> bool {
    if host == "localhost" {
        return true;
    }
    let Ok(ip) = host.parse::<IpAddr>() else {
        return false;
    };
    ip.is_loopback()
        || rlx_transport::interfaces::addresses().is_ok_and(|interfaces| {
            interfaces
                .iter()
                .any(|interface| interface.addr == Some(ip))
        })
}

/// The shell command `ssh` runs on a remote host: the working directory, the environment and
/// the program, each word quoted for a POSIX shell.
fn remote_command(cwd: &Path, env: &[(String, String)], program: &Path, args: &[String]) -> String {
    let mut words = vec![
        "cd".to_owned(),
        quote(&cwd.display().to_string()),
        "&&".to_owned(),
    ];
    words.push("exec".to_owned());
    words.push("env".to_owned());
    words.extend(env.iter().map(|(k, v)| quote(&format!("{k}={v}"))));
    words.push(quote(&program.display().to_string()));
    words.extend(args.iter().map(|a| quote(a)));
    words.join(" ")
}

/// `word` in single quotes, with embedded single quotes closed, escaped and reopened.
fn quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// The first rank that failed, and what became of the others.
#[derive(Debug)]
pub struct Failure {
    /// The rank.
    pub rank: usize,
    /// How it ended (`exited with code 3`, `killed by signal 9`).
    pub how: String,
    /// The ranks still running at the end of the grace period, which were killed.
    pub ended: Vec<usize>,
}

/// How a job ended.
#[derive(Debug)]
pub struct Outcome {
    /// The launcher's exit code.
    pub code: u8,
    /// The first failure, if any rank failed.
    pub first_failure: Option<Failure>,
}

/// Runs `specs` as one job: hands every output line to `line(rank, stream, text)`, and when a
/// rank fails gives the others `grace` before killing them.
pub fn supervise(
    specs: &[ChildSpec],
    grace: Duration,
    line: &mut dyn FnMut(usize, Stream, &str),
) -> Result<Outcome, String> {
    let mut job = Job::spawn(specs)?;
    for rank in 0..specs.len() {
        // Ranks read no input from the launcher: end of file at once.
        job.close_stdin(rank);
    }
    let mut exited: Vec<Option<ExitStatus>> = vec![None; specs.len()];
    let mut closed = vec![false; specs.len()];
    let mut failure: Option<(Failure, Instant)> = None;
    loop {
        relay(&job, &mut closed, line);
        for (rank, slot) in exited.iter_mut().enumerate() {
            if slot.is_some() {
                continue;
            }
            let Some(status) = job.poll_exit(rank) else {
                continue;
            };
            *slot = Some(status);
            if !status.success() && failure.is_none() {
                let failed = Failure {
                    rank,
                    how: describe(status),
                    ended: Vec::new(),
                };
                failure = Some((failed, Instant::now() + grace));
            }
        }
        let running: Vec<usize> = (0..specs.len()).filter(|&r| exited[r].is_none()).collect();
        if running.is_empty() {
            break;
        }
        if let Some((failed, deadline)) = &mut failure {
            if Instant::now() >= *deadline {
                for &rank in &running {
                    job.kill(rank);
                    exited[rank] = job.poll_exit(rank);
                }
                failed.ended = running;
                break;
            }
        }
    }
    // What the ranks wrote just before they ended is still on its way.
    let drain_until = Instant::now() + Duration::from_secs(1);
    while closed.iter().any(|c| !c) && Instant::now() < drain_until {
        relay(&job, &mut closed, line);
    }
    let code = failure
        .as_ref()
        .map_or(0, |(failed, _)| exited[failed.rank].map_or(1, exit_code));
    Ok(Outcome {
        code,
        first_failure: failure.map(|(failed, _)| failed),
    })
}

/// Hands the next output line of `job` (waiting at most 20 ms) to `line`, and notes a child
/// whose streams closed.
fn relay(job: &Job, closed: &mut [bool], line: &mut dyn FnMut(usize, Stream, &str)) {
    match job.next(Duration::from_millis(20)) {
        Some(Output::Line {
            child,
            stream,
            text,
        }) => line(child, stream, &text),
        Some(Output::Closed { child }) => closed[child] = true,
        None => {}
    }
}

/// The code a shell reports for `status`: its exit code, or 128 + the signal that ended it.
fn exit_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(1),
        (None, Some(signal)) => u8::try_from((128 + signal) & 0xff).unwrap_or(1),
        (None, None) => 1,
    }
}

/// `exited with code 3` or `killed by signal 9 (SIGKILL)`.
fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with code {code}"),
        (None, Some(signal)) => {
            let name = match signal {
                libc::SIGKILL => " (SIGKILL)",
                libc::SIGTERM => " (SIGTERM)",
                libc::SIGINT => " (SIGINT)",
                libc::SIGSEGV => " (SIGSEGV)",
                libc::SIGABRT => " (SIGABRT)",
                libc::SIGBUS => " (SIGBUS)",
                _ => "",
            };
            format!("killed by signal {signal}{name}")
        }
        (None, None) => format!("ended with {status}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rank_most_errors_name_is_the_cause() {
        let mut blame = Blame::default();
        blame.read(
            0,
            "error: all_reduce timed out after 2s waiting for peer rank 2",
        );
        blame.read(1, "WARN peer lost peer=0 reason=...");
        blame.read(
            1,
            "error: group unusable after a fatal failure involving peer rank 2 (timed out)",
        );
        blame.read(
            3,
            "all_reduce: length mismatch with rank 2: expected 4 f32 elements",
        );
        blame.read(2, "error: excluded by peer rank 0");
        assert_eq!(
            blame.verdict().as_deref(),
            Some("the errors name rank 2 as the cause (rank(s) 0, 1, 3)")
        );
        assert_eq!(Blame::default().verdict(), None);
    }

    fn shell(rank: usize, script: &str) -> ChildSpec {
        ChildSpec::new(format!("rank {rank}"), "sh")
            .args(["-c", script])
            .env("RLX_RANK", rank.to_string())
    }

    fn collect(specs: &[ChildSpec], grace: Duration) -> (Outcome, Vec<(usize, String)>) {
        let mut lines = Vec::new();
        let outcome = supervise(specs, grace, &mut |rank, _, text| {
            lines.push((rank, text.to_owned()));
        })
        .unwrap();
        (outcome, lines)
    }

    #[test]
    fn every_rank_succeeding_is_exit_zero_with_every_line() {
        let specs: Vec<_> = (0..3).map(|r| shell(r, "echo hello $RLX_RANK")).collect();
        let (outcome, lines) = collect(&specs, Duration::from_secs(5));
        assert_eq!(outcome.code, 0);
        assert!(outcome.first_failure.is_none());
        for rank in 0..3 {
            assert!(
                lines.contains(&(rank, format!("hello {rank}"))),
                "{lines:?}"
            );
        }
    }

    #[test]
    fn the_first_failed_rank_gives_its_code_and_the_rest_are_ended() {
        let specs = vec![
            shell(0, "sleep 60"),
            shell(1, "echo about to fail; exit 3"),
            shell(2, "sleep 60"),
        ];
        let started = Instant::now();
        let (outcome, lines) = collect(&specs, Duration::from_millis(300));
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the sleepers were not ended"
        );
        assert_eq!(outcome.code, 3);
        let failure = outcome.first_failure.unwrap();
        assert_eq!(failure.rank, 1);
        assert_eq!(failure.how, "exited with code 3");
        assert_eq!(failure.ended, vec![0, 2]);
        assert!(
            lines.contains(&(1, "about to fail".to_owned())),
            "{lines:?}"
        );
    }

    #[test]
    fn a_killed_rank_is_named_with_its_signal() {
        let specs = vec![shell(0, "kill -9 $$"), shell(1, "exit 0")];
        let (outcome, _) = collect(&specs, Duration::from_secs(5));
        assert_eq!(outcome.code, 128 + 9);
        let failure = outcome.first_failure.unwrap();
        assert_eq!(
            (failure.rank, failure.how.as_str()),
            (0, "killed by signal 9 (SIGKILL)")
        );
        assert!(failure.ended.is_empty());
    }

    #[test]
    fn ranks_that_end_within_the_grace_are_not_killed() {
        let specs = vec![shell(0, "exit 2"), shell(1, "sleep 0.2; exit 0")];
        let (outcome, _) = collect(&specs, Duration::from_secs(20));
        assert_eq!(outcome.code, 2);
        assert!(outcome.first_failure.unwrap().ended.is_empty());
    }

    /// `launch --netns`: each rank runs in its own namespace with a `thunderbolt0` link and
    /// the rendezvous on the others' side of it; a rank's failure there is reported as on the
    /// host. Needs root; without it the test says so, and under `CI=true` (where CI runs as
    /// root) it fails instead.
    #[test]
    fn ranks_run_in_network_namespaces() {
        if !crate::netns::available_for_test("ranks_run_in_network_namespaces") {
            return;
        }
        let args = |script: &str| LaunchArgs {
            ranks: Some(2),
            world: ProcessWorldArgs {
                links: crate::world::LinkArgs {
                    netns: true,
                    ..crate::world::LinkArgs::default()
                },
                ..ProcessWorldArgs::default()
            },
            hostfile: None,
            env: Vec::new(),
            grace: 1.0,
            timeout_ms: None,
            command: vec!["sh".into(), "-c".into(), script.into()],
        };
        // Inside its namespace a rank sees its own thunderbolt0 link and a master address
        // that is not loopback.
        let fine = args(
            "ip -o link show thunderbolt0 >/dev/null && case $RLX_MASTER_ADDR in 127.*) exit 9;; esac",
        );
        assert_eq!(run(&fine).unwrap(), 0);
        let failing = args("[ \"$RLX_RANK\" = 1 ] && exit 4; sleep 30");
        assert_eq!(run(&failing).unwrap(), 4);
    }

    #[test]
    fn remote_commands_quote_every_word() {
        let command = remote_command(
            Path::new("/home/me/my job"),
            &[("RLX_HOSTFILE".into(), r#"[["h:1"]]"#.into())],
            Path::new("./train"),
            &["it's".into()],
        );
        assert_eq!(
            command,
            r#"cd '/home/me/my job' && exec env 'RLX_HOSTFILE=[["h:1"]]' './train' 'it'\''s'"#
        );
    }

    #[test]
    fn local_ranks_get_the_torchrun_names() {
        let spec = local_names(
            ChildSpec::new("rank 1", "prog")
                .env("RLX_RANK", "1")
                .env("RLX_MASTER_ADDR", "127.0.0.1")
                .env("RLX_MASTER_PORT", "29400"),
            1,
            4,
        );
        for (key, value) in [
            ("RANK", "1"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_RANK", "1"),
            ("RLX_LOCAL_RANK", "1"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "29400"),
        ] {
            assert!(
                spec.env.contains(&(key.to_owned(), value.to_owned())),
                "{key}: {:?}",
                spec.env
            );
        }
    }
}
