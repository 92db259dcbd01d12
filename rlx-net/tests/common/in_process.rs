//! Worlds of ranks that are threads of the test process, over loopback: building them,
//! checking a collective over them exactly, and the memory the process holds meanwhile.

use std::net::SocketAddr;
use std::thread::{self, JoinHandle};

use rlx_net::TcpTransport;
use rlx_transport::{CollectiveError, Transport};

/// Builds the ranks `ranks` on threads.
pub(crate) fn build(
    ranks: std::ops::Range<u32>,
    make: &impl Fn(u32) -> rlx_net::TcpTransportBuilder,
) -> Vec<JoinHandle<Result<TcpTransport, CollectiveError>>> {
    ranks
        .map(|rank| {
            let b = make(rank);
            thread::spawn(move || b.build())
        })
        .collect()
}

/// Joins the builders of every rank, in rank order.
pub(crate) fn joined(
    builders: Vec<JoinHandle<Result<TcpTransport, CollectiveError>>>,
) -> Vec<TcpTransport> {
    builders
        .into_iter()
        .enumerate()
        .map(|(rank, b)| {
            b.join()
                .expect("a builder thread")
                .unwrap_or_else(|e| panic!("rank {rank} failed to bootstrap: {e}"))
        })
        .collect()
}

/// A world of `n` ranks in this process (one thread builds each, `tune` sets its options),
/// through a rendezvous store on loopback.
pub(crate) fn local_world(
    n: u32,
    tune: fn(rlx_net::TcpTransportBuilder) -> rlx_net::TcpTransportBuilder,
) -> Vec<TcpTransport> {
    local_world_by_rank(n, move |_, b| tune(b))
}

/// [`local_world`] where `tune` sets each rank's options (given its rank).
pub(crate) fn local_world_by_rank(
    n: u32,
    tune: impl Fn(u32, rlx_net::TcpTransportBuilder) -> rlx_net::TcpTransportBuilder,
) -> Vec<TcpTransport> {
    let port = super::free_port();
    joined(build(0..n, &|rank| {
        tune(
            rank,
            TcpTransport::builder()
                .rank(rank)
                .world_size(n)
                .master("127.0.0.1", port)
                .connect_timeout(std::time::Duration::from_secs(20)),
        )
    }))
}

/// [`local_world`], each transport shared so that several threads can drive it.
pub(crate) fn shared_world(
    n: u32,
    tune: fn(rlx_net::TcpTransportBuilder) -> rlx_net::TcpTransportBuilder,
) -> Vec<std::sync::Arc<TcpTransport>> {
    local_world(n, tune)
        .into_iter()
        .map(std::sync::Arc::new)
        .collect()
}

/// [`local_world_by_rank`], each transport shared so that several threads can drive it.
pub(crate) fn shared_world_by_rank(
    n: u32,
    tune: impl Fn(u32, rlx_net::TcpTransportBuilder) -> rlx_net::TcpTransportBuilder,
) -> Vec<std::sync::Arc<TcpTransport>> {
    local_world_by_rank(n, tune)
        .into_iter()
        .map(std::sync::Arc::new)
        .collect()
}

/// A naive all-reduce (every rank sends its vector to every other and sums in rank order)
/// over the world, checked exactly on every rank.
pub(crate) fn all_reduce_is_exact(world: Vec<TcpTransport>) {
    let n = world.len() as u32;
    const LEN: usize = 10_000;
    let value = |rank: u32, i: usize| (i % 1000) as f32 * (rank + 1) as f32;
    let threads: Vec<_> = world
        .into_iter()
        .map(|t| {
            thread::spawn(move || {
                let me = t.rank();
                let mine: Vec<u8> = (0..LEN).flat_map(|i| value(me, i).to_le_bytes()).collect();
                for peer in (0..n).filter(|&p| p != me) {
                    t.send_bytes(peer, 9, &mine).expect("a send");
                }
                let mut sum = vec![0f32; LEN];
                for peer in 0..n {
                    let bytes = if peer == me {
                        mine.clone()
                    } else {
                        t.recv_bytes(peer, 9).expect("a receive")
                    };
                    for (s, c) in sum.iter_mut().zip(bytes.chunks_exact(4)) {
                        *s += f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                    }
                }
                t.barrier().expect("a barrier");
                (me, sum)
            })
        })
        .collect();
    for t in threads {
        let (rank, sum) = t.join().expect("a rank thread");
        for (i, s) in sum.iter().enumerate() {
            let expected: f32 = (0..n).map(|r| value(r, i)).sum();
            assert_eq!(*s, expected, "rank {rank}, element {i}");
        }
    }
}

/// `count` loopback ports, free a moment ago (see [`super::free_port`]).
pub(crate) fn free_ports(count: usize) -> Vec<u16> {
    rlx_transport::ports::free_loopback_ports(count).expect("free loopback ports")
}

/// The loopback address with `port`.
pub(crate) fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// The resident set size of this process in KiB (`VmRSS` of `/proc/self/status`).
pub(crate) fn vm_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .expect("VmRSS in /proc/self/status")
}
