//! Choosing loopback ports for the ranks of a local job (launchers, tests, benchmarks).
//!
//! The usual trick, binding port 0 and releasing it, hands out a port from the kernel's
//! ephemeral range, and every outgoing connection on the host draws its source port from
//! that same range. Between the release and the rank's own bind, a connection of another job
//! can take the port; and MLX's ring listens with `SO_REUSEPORT`, so two jobs that end up on
//! one port silently share its incoming connections. [`free_loopback_ports`] therefore picks
//! ports *below* the ephemeral range, which outgoing connections never use, starting at a
//! per-process offset and never handing out a port twice within one process.

use std::net::TcpListener;
use std::sync::atomic::{AtomicU32, Ordering};

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
/// scan at different offsets (derived from the process id), which keeps concurrent jobs
/// apart; a clash remains possible only between jobs that choose at the same instant.
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
        if let Ok(listener) = TcpListener::bind(("127.0.0.1", port)) {
            held.push(listener);
            ports.push(port);
        }
    }
    if ports.len() < n {
        return Err(CollectiveError::config(format!(
            "only {} of {n} loopback ports between {LOWEST} and {end} could be bound",
            ports.len()
        )));
    }
    Ok(ports)
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
}
