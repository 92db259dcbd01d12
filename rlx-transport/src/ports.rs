//! Choosing loopback ports for the ranks of a local job (launchers, tests, benchmarks).
//!
//! The usual trick, binding port 0 and releasing it, hands out a port from the kernel's
//! ephemeral range, and every outgoing connection on the host draws its source port from
//! that same range. Between the release and the rank's own bind, a connection of another job
//! can take the port; and MLX's ring listens with `SO_REUSEPORT`, so two jobs that end up on
//! one port silently share its incoming connections. [`free_loopback_ports`] therefore picks
//! ports *below* the ephemeral range, which outgoing connections never use, starting at a
//! per-process offset and never handing out a port twice within one process.
//!
//! Two processes that pick at the same time can still probe the same free port, and the
//! second rank to bind it then fails with "address in use". Each port handed out is therefore
//! also *leased* for a minute or two through a file in the temporary directory, so
//! concurrent jobs, test binaries and launchers on one host skip each other's fresh picks.

use std::fs::OpenOptions;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::{CollectiveError, Result};

/// The lowest port handed out: above the registered services most hosts run.
const LOWEST: u16 = 20_000;

/// Where the ephemeral range starts when the kernel does not say (Linux's default; macOS and
/// the IANA range start at 49152, higher still).
const DEFAULT_EPHEMERAL_START: u16 = 32_768;

/// How far the previous calls of this process have scanned (an offset into the pool).
static CURSOR: AtomicU32 = AtomicU32::new(0);

/// The first port of the kernel's ephemeral range.
fn ephemeral_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(DEFAULT_EPHEMERAL_START)
}

/// `n` distinct ports on 127.0.0.1 that were free a moment ago and lie outside the kernel's
/// ephemeral range, for ranks that will listen on them.
///
/// Each port is probed by binding it; all probes are held until `n` ports are found, so the
/// ports differ, and later calls in this process continue after them. Processes start their
/// scan at different offsets (derived from the process id) and skip the ports other
/// processes leased in the last minute or two, so concurrent jobs on one host do not collide.
/// When the temporary directory cannot hold leases, or every free port is leased, the ports
/// are chosen without them.
///
/// # Errors
///
/// [`CollectiveError::Config`] when fewer than `n` ports below the ephemeral range can be
/// bound.
///
/// # Examples
///
/// ```
/// let ports = rlx_transport::ports::free_loopback_ports(3)?;
/// assert_eq!(ports.len(), 3);
/// assert!(ports[0] != ports[1] && ports[1] != ports[2] && ports[0] != ports[2]);
/// # Ok::<(), rlx_transport::CollectiveError>(())
/// ```
pub fn free_loopback_ports(n: usize) -> Result<Vec<u16>> {
    let leases = Leases::open(&std::env::temp_dir().join(LEASE_DIR), SystemTime::now());
    if let Some(ports) = probe(n, leases.as_ref()) {
        return Ok(ports);
    }
    probe(n, None).ok_or_else(|| {
        CollectiveError::config(format!(
            "fewer than {n} loopback ports between {LOWEST} and {} could be bound",
            ephemeral_start().max(LOWEST + 1)
        ))
    })
}

/// Scans the pool once from this process's offset for `n` ports that bind and, with
/// `leases`, that no other process leased lately; `None` when fewer are found.
fn probe(n: usize, leases: Option<&Leases>) -> Option<Vec<u16>> {
    let end = ephemeral_start().max(LOWEST + 1);
    let pool = u32::from(end - LOWEST);
    // Spread processes over the pool; 7919 is prime, so successive process ids land far
    // apart.
    let start = std::process::id().wrapping_mul(7919) % pool;
    let mut held = Vec::with_capacity(n);
    let mut ports = Vec::with_capacity(n);
    let mut tried = 0;
    while ports.len() < n && tried < pool {
        let step = CURSOR.fetch_add(1, Ordering::Relaxed);
        tried += 1;
        let port = LOWEST + ((start + step) % pool) as u16;
        let Ok(listener) = TcpListener::bind(("127.0.0.1", port)) else {
            continue;
        };
        if leases.is_none_or(|leases| leases.take(port)) {
            held.push(listener);
            ports.push(port);
        }
    }
    (ports.len() == n).then_some(ports)
}

/// The directory, under the temporary directory, that holds the leases of every process.
const LEASE_DIR: &str = "rlx-port-leases";

/// How long one lease window lasts; a lease holds for the rest of its window and the whole
/// next one, so between one and two windows — far longer than a rank takes to bind.
const LEASE_WINDOW: Duration = Duration::from_secs(60);

/// Leases on ports, shared by the processes of one host through empty files named
/// `<port>.<window>` in one directory.
///
/// Creating a file with `create_new` is atomic, so of two processes that want one port in one
/// window exactly one wins; a process also skips a port leased in the window before, so a
/// lease taken just before a window ends still holds. Files older than that are removed on
/// the way. No file is ever held open, so a process that dies leaves nothing that lasts.
#[derive(Debug)]
struct Leases {
    dir: PathBuf,
    window: u64,
}

impl Leases {
    /// Opens (and tidies) the lease directory `dir` as of `now`; `None` when it cannot be
    /// created or written.
    fn open(dir: &Path, now: SystemTime) -> Option<Self> {
        std::fs::create_dir_all(dir).ok()?;
        share_with_every_user(dir);
        let window = now.duration_since(UNIX_EPOCH).ok()?.as_secs() / LEASE_WINDOW.as_secs();
        let leases = Leases {
            dir: dir.to_path_buf(),
            window,
        };
        leases.remove_expired();
        Some(leases)
    }

    /// Takes the lease on `port`: false when another process holds it.
    fn take(&self, port: u16) -> bool {
        let previous = self.window.wrapping_sub(1);
        if self.dir.join(format!("{port}.{previous}")).exists() {
            return false;
        }
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(self.dir.join(format!("{port}.{}", self.window)))
            .is_ok()
    }

    /// Removes the leases of windows before the previous one (other users' files stay, as
    /// the directory's sticky bit wants; they no longer count either).
    fn remove_expired(&self) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let window = name
                .to_str()
                .and_then(|name| name.split_once('.'))
                .and_then(|(_, window)| window.parse::<u64>().ok());
            if window.is_some_and(|window| window.saturating_add(1) < self.window) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
}

/// Lets every user's jobs lease ports in `dir` (mode 1777, like the temporary directory
/// itself); a directory that belongs to another user keeps its mode.
fn share_with_every_user(dir: &Path) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o1777));
    }
    #[cfg(not(unix))]
    let _ = dir;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_distinct_below_the_ephemeral_range_and_not_reused() {
        let first = free_loopback_ports(8).unwrap();
        let second = free_loopback_ports(8).unwrap();
        let all: std::collections::HashSet<u16> = first.iter().chain(&second).copied().collect();
        assert_eq!(all.len(), 16);
        let end = ephemeral_start();
        assert!(all.iter().all(|&p| (LOWEST..end).contains(&p)), "{all:?}");
        assert!(free_loopback_ports(0).unwrap().is_empty());
    }

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("rlx-lease-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn a_port_leased_by_another_process_is_skipped_until_its_lease_expires() {
        let dir = scratch("skip");
        let now = SystemTime::now();
        let mine = Leases::open(&dir, now).unwrap();
        let theirs = Leases::open(&dir, now).unwrap();
        assert!(mine.take(20_001));
        assert!(!theirs.take(20_001), "one window, one holder");
        // One window later the lease still holds; two windows later it has expired and
        // opening the directory removes its file.
        let next = Leases::open(&dir, now + LEASE_WINDOW).unwrap();
        assert!(!next.take(20_001), "a lease lasts into the next window");
        let later = Leases::open(&dir, now + 3 * LEASE_WINDOW).unwrap();
        assert!(!dir.join(format!("20001.{}", mine.window)).exists());
        assert!(later.take(20_001));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
