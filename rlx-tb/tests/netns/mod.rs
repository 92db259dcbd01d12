//! Network namespaces for the multi-process tests of the Thunderbolt transport (and its
//! measuring example): a hub namespace with a bridge per network, one namespace per rank
//! whose veth links (`thunderbolt0`, `thunderbolt1`, `other0`) end on those bridges, ranks
//! started in them as copies of the running executable, and the inspection of their sockets
//! with `ss`. Everything created is removed on drop, on every path.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long the parent waits for a job before killing it.
pub(crate) const JOB_DEADLINE: Duration = Duration::from_secs(120);
/// The ranks' operation and connect timeout, so that a broken job ends on its own.
const RANK_TIMEOUT_MS: &str = "60000";

/// Why this process cannot create namespaces and links, if it cannot: that needs root and
/// iproute2's `ip`.
pub(crate) fn unavailable() -> Option<&'static str> {
    // SAFETY: `geteuid` has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root for network namespaces");
    }
    let has_ip = Command::new("ip")
        .arg("-V")
        .output()
        .is_ok_and(|out| out.status.success());
    if !has_ip {
        return Some("needs iproute2's `ip` for network namespaces");
    }
    None
}

/// Runs `program` to completion; its stdout, or an error with its stderr.
pub(crate) fn run(program: &str, args: &[&str]) -> std::result::Result<String, String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("{program}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `ip` with `args`.
pub(crate) fn ip(args: &[&str]) -> std::result::Result<(), String> {
    run("ip", args).map(drop)
}

/// The IPv4 address of `rank` on link `link` (`thunderbolt{link}`), a /24 per link.
pub(crate) fn v4(link: usize, rank: u32) -> String {
    format!("10.{}.0.{}", 77 + link, rank + 1)
}

/// The IPv4 address of `rank` on `other0`.
pub(crate) fn other_v4(rank: u32) -> String {
    format!("10.99.0.{}", rank + 1)
}

/// The fixed IPv6 link-local address of `rank` on link `link`.
pub(crate) fn v6(link: usize, rank: u32) -> String {
    format!("fe80::{}:{}", link + 1, rank + 1)
}

/// What a test network looks like.
pub(crate) struct Shape {
    /// How many ranks (one namespace each).
    pub(crate) ranks: u32,
    /// How many Thunderbolt links (`thunderbolt0`, `thunderbolt1`, ...) each rank has.
    pub(crate) links: usize,
    /// Whether the ranks also share an `other0` network.
    pub(crate) other: bool,
    /// A rank whose namespace gets `other0` but no Thunderbolt link.
    pub(crate) without_thunderbolt: Option<u32>,
}

/// Where the ranks run: a hub namespace with one bridge per network and one namespace per rank
/// whose links end on those bridges (removed on drop), or this host's own network; any rank
/// still running on drop is killed.
pub(crate) struct Net {
    hub: Option<String>,
    pub(crate) ranks: Vec<Option<String>>,
    pub(crate) children: Vec<Child>,
}

static NETS: AtomicU32 = AtomicU32::new(0);

impl Net {
    /// `world` ranks in this host's network namespace.
    pub(crate) fn host(world: u32) -> Net {
        Net {
            hub: None,
            ranks: vec![None; world as usize],
            children: Vec::new(),
        }
    }

    pub(crate) fn create(shape: &Shape) -> std::result::Result<Net, String> {
        let tag = format!(
            "rlxF{}n{}",
            std::process::id(),
            NETS.fetch_add(1, Ordering::Relaxed)
        );
        let hub = format!("{tag}hub");
        let mut net = Net {
            hub: Some(hub.clone()),
            ranks: Vec::new(),
            children: Vec::new(),
        };
        // From here on, `net` removes whatever was created if a step fails.
        ip(&["netns", "add", &hub])?;
        let mut bridges: Vec<(String, bool)> = (0..shape.links)
            .map(|l| (format!("thunderbolt{l}"), true))
            .collect();
        if shape.other {
            bridges.push(("other0".to_owned(), false));
        }
        for (b, _) in bridges.iter().enumerate() {
            let bridge = format!("br{b}");
            ip(&["-n", &hub, "link", "add", &bridge, "type", "bridge"])?;
            ip(&["-n", &hub, "link", "set", &bridge, "up"])?;
        }
        let mut waits = Vec::new();
        for rank in 0..shape.ranks {
            let ns = format!("{tag}r{rank}");
            ip(&["netns", "add", &ns])?;
            net.ranks.push(Some(ns.clone()));
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
            for (b, (name, thunderbolt)) in bridges.iter().enumerate() {
                if *thunderbolt && shape.without_thunderbolt == Some(rank) {
                    continue;
                }
                let port = format!("p{b}r{rank}");
                ip(&[
                    "link", "add", name, "netns", &ns, "type", "veth", "peer", "name", &port,
                    "netns", &hub,
                ])?;
                ip(&[
                    "-n",
                    &hub,
                    "link",
                    "set",
                    &port,
                    "master",
                    &format!("br{b}"),
                ])?;
                ip(&["-n", &hub, "link", "set", &port, "up"])?;
                // Only the fixed addresses below: no autoconfigured link-local address that
                // would sit in duplicate detection while the job starts.
                ip(&["-n", &ns, "link", "set", name, "addrgenmode", "none"])?;
                let (ipv4, ipv6) = if *thunderbolt {
                    (v4(b, rank), Some(v6(b, rank)))
                } else {
                    (other_v4(rank), None)
                };
                ip(&["-n", &ns, "addr", "add", &format!("{ipv4}/24"), "dev", name])?;
                if let Some(ipv6) = ipv6 {
                    ip(&[
                        "-n",
                        &ns,
                        "addr",
                        "add",
                        &format!("{ipv6}/64"),
                        "dev",
                        name,
                        "nodad",
                    ])?;
                }
                ip(&["-n", &ns, "link", "set", name, "up"])?;
                waits.push((ns.clone(), name.clone()));
            }
        }
        // A veth reports its carrier (and so IFF_RUNNING, which discovery needs) shortly after
        // both ends are up.
        for (ns, link) in waits {
            let deadline = Instant::now() + Duration::from_secs(10);
            while !run("ip", &["-n", &ns, "link", "show", &link])?.contains("state UP") {
                if Instant::now() > deadline {
                    return Err(format!("{link} in {ns} never came up"));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(net)
    }

    /// Starts every rank (a copy of this executable) in its namespace with `mode_var=mode`, the
    /// rank, world size and timeout variables, and the environment `env(rank)`.
    pub(crate) fn launch(
        &mut self,
        mode_var: &str,
        mode: &str,
        env: impl Fn(u32) -> Vec<(String, String)>,
    ) -> std::result::Result<Job, String> {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let exe = exe.to_string_lossy().into_owned();
        let (lines, events) = mpsc::channel();
        let mut stdins = Vec::new();
        let mut stderrs = Vec::new();
        for (rank, ns) in self.ranks.iter().enumerate() {
            let rank = rank as u32;
            let mut command = match ns {
                Some(ns) => {
                    let mut c = Command::new("ip");
                    c.args(["netns", "exec", ns, &exe]);
                    c
                }
                None => Command::new(&exe),
            };
            let mut child = command
                .env_clear()
                .env("PATH", std::env::var("PATH").unwrap_or_default())
                .env(mode_var, mode)
                .env("RLX_RANK", rank.to_string())
                .env("RLX_WORLD_SIZE", self.ranks.len().to_string())
                .env("RLX_TIMEOUT_MS", RANK_TIMEOUT_MS)
                .envs(env(rank))
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .map_err(|e| format!("start rank {rank}: {e}"))?;
            stdins.push(child.stdin.take());
            let stdout = child.stdout.take().ok_or("no stdout")?;
            let lines = lines.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines().map_while(|l| l.ok()) {
                    let _ = lines.send((rank, line));
                }
            });
            let mut stderr = child.stderr.take().ok_or("no stderr")?;
            stderrs.push(Some(std::thread::spawn(move || {
                let mut text = String::new();
                let _ = stderr.read_to_string(&mut text);
                text
            })));
            self.children.push(child);
        }
        Ok(Job {
            events,
            stdins,
            stderrs,
            said: BTreeMap::new(),
            start: Instant::now(),
        })
    }

    /// The first line every rank printed, waiting for all of them.
    pub(crate) fn first_lines(
        &mut self,
        job: &mut Job,
    ) -> std::result::Result<Vec<String>, String> {
        let world = self.ranks.len() as u32;
        while (job.said.len() as u32) < world {
            let left = JOB_DEADLINE.saturating_sub(job.start.elapsed());
            match job.events.recv_timeout(left.max(Duration::from_millis(1))) {
                Ok((rank, line)) => {
                    job.said.entry(rank).or_insert(line);
                }
                Err(_) => {
                    let silent: Vec<u32> =
                        (0..world).filter(|r| !job.said.contains_key(r)).collect();
                    let why = self.finish(job).err().unwrap_or_default();
                    return Err(format!("ranks {silent:?} said nothing; {why}"));
                }
            }
        }
        Ok(job.said.values().cloned().collect())
    }

    /// Lets the ranks go on and waits for them all to exit successfully (killing them at the
    /// deadline); the error carries every failed rank's stderr.
    pub(crate) fn finish(&mut self, job: &mut Job) -> std::result::Result<(), String> {
        for stdin in &mut job.stdins {
            if let Some(mut s) = stdin.take() {
                let _ = s.write_all(b"go\n");
            }
        }
        let mut failures = Vec::new();
        for (rank, mut child) in self.children.drain(..).enumerate() {
            let status = loop {
                match child.try_wait() {
                    Ok(Some(status)) => break Some(status),
                    Ok(None) if job.start.elapsed() > JOB_DEADLINE => {
                        let _ = child.kill();
                        let _ = child.wait();
                        break None;
                    }
                    Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                    Err(_) => break None,
                }
            };
            let stderr = job
                .stderrs
                .get_mut(rank)
                .and_then(Option::take)
                .and_then(|collector| collector.join().ok())
                .unwrap_or_default();
            match status {
                Some(s) if s.success() => {}
                Some(s) => failures.push(format!("rank {rank} exited with {s}: {stderr}")),
                None => failures.push(format!("rank {rank} did not finish: {stderr}")),
            }
        }
        if failures.is_empty() {
            Ok(())
        } else {
            Err(failures.join("\n"))
        }
    }

    /// Checks that every TCP socket of every rank is bound to one of `links` and that each link
    /// carries one established connection per peer: all the sockets of the rank's namespace
    /// (closed ones included), or in the host's namespace those the rank's process holds.
    pub(crate) fn check_pinned(&self, links: &[&str]) -> std::result::Result<(), String> {
        let peers = self.ranks.len() - 1;
        for (rank, ns) in self.ranks.iter().enumerate() {
            let table = match ns {
                Some(ns) => run("ip", &["netns", "exec", ns, "ss", "-tanH"])?,
                None => {
                    let pid = self.children.get(rank).ok_or("rank not running")?.id();
                    let owner = format!("pid={pid},");
                    run("ss", &["-tanpH"])?
                        .lines()
                        .filter(|l| l.contains(&owner))
                        .map(|l| format!("{l}\n"))
                        .collect()
                }
            };
            let mut established: BTreeMap<&str, usize> = BTreeMap::new();
            for line in table.lines().filter(|l| !l.trim().is_empty()) {
                let fields: Vec<&str> = line.split_whitespace().collect();
                let (state, local) = match fields.as_slice() {
                    [state, _, _, local, ..] => (*state, *local),
                    _ => return Err(format!("rank {rank}: unreadable ss line {line:?}")),
                };
                let device = local
                    .rsplit_once(':')
                    .and_then(|(addr, _)| addr.split_once('%'))
                    .map(|(_, dev)| dev.trim_end_matches(']'));
                let Some(link) = device.and_then(|d| links.iter().find(|l| **l == d)) else {
                    return Err(format!(
                        "rank {rank}: a socket is not pinned to {links:?}: {line:?}\n{table}"
                    ));
                };
                if state == "ESTAB" {
                    *established.entry(link).or_default() += 1;
                }
            }
            for link in links {
                let count = established.get(link).copied().unwrap_or(0);
                if count != peers {
                    return Err(format!(
                        "rank {rank}: {count} connections on {link}, expected {peers}\n{table}"
                    ));
                }
            }
        }
        Ok(())
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        for ns in self.ranks.iter().chain([&self.hub]).flatten() {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
    }
}

/// A running job: the ranks' stdout lines, stdins and stderr collectors.
pub(crate) struct Job {
    events: mpsc::Receiver<(u32, String)>,
    stdins: Vec<Option<ChildStdin>>,
    stderrs: Vec<Option<std::thread::JoinHandle<String>>>,
    said: BTreeMap<u32, String>,
    start: Instant,
}
