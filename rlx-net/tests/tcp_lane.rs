//! Shared-memory lanes between ranks of one host: once both ranks mapped each other's lane,
//! every message of every size lands exactly through it (bursts nobody receives yet, rings
//! far smaller than the messages, exchanges into posted buffers, many small messages taken
//! out of order), and a rank with lanes off keeps both directions of its pairs on TCP. Lanes
//! have their own switch: with the single-copy path off they still carry link 0.

mod common;

use std::time::Duration;

use common::{assert_all_ok, free_port, pattern, rlx_env, spawn, wait_all};
use rlx_transport::{CollectiveError, Transport};

/// Empty, tiny, primes, past a 4 KiB ring, past the staging buffer, and around the
/// single-copy threshold (256 KiB), whose descriptors travel the lane too.
const SIZES: &[usize] = &[
    0,
    1,
    7,
    4093,
    65_537,
    200_003,
    (256 << 10) - 1,
    256 << 10,
    (1 << 20) + 3,
];

/// Small messages in one burst to each peer, received in reverse order.
const BURST: u32 = 300;

fn worker(role: &str) -> Result<(), String> {
    match role {
        "lanes" => lanes_worker(),
        other => Err(format!("unknown role {other}")),
    }
}

fn lanes_worker() -> Result<(), String> {
    let t = common::from_env()?;
    let (rank, n) = (t.rank(), t.world_size());
    let e = |what: &str, err: CollectiveError| format!("rank {rank}, {what}: {err}");
    // Each peer has taken this rank's offer before it sends its second-round message (it
    // received this rank's first one, which follows the offer), so this rank switches to its
    // lanes at its third-round sends at the latest, and each peer reads the switch with them.
    common::settle(&t, 3)?;
    let expect = std::env::var("EXPECT_LANE").as_deref() == Ok("1");
    let single_copy = std::env::var("RLX_SINGLE_COPY").as_deref() != Ok("0");
    for peer in (0..n).filter(|&p| p != rank) {
        if !single_copy && t.single_copy_from(peer) {
            return Err(format!(
                "rank {rank}: reads rank {peer} by single copy with the path off"
            ));
        }
        if t.lane_from(peer) != expect {
            return Err(format!(
                "rank {rank}: lane from rank {peer} is {}, expected {expect}",
                t.lane_from(peer)
            ));
        }
    }
    // Every size to every peer before any receive: the lane fills, and the peers' watchers
    // and blocked senders drain it into their unexpected queues.
    for peer in (0..n).filter(|&p| p != rank) {
        for (i, &len) in SIZES.iter().enumerate() {
            let bytes = pattern(rank, i as u64, len);
            t.send_bytes(peer, i as u32, &bytes)
                .map_err(|err| e("send", err))?;
        }
    }
    for peer in (0..n).filter(|&p| p != rank) {
        for (i, &len) in SIZES.iter().enumerate() {
            let got = t.recv_bytes(peer, i as u32).map_err(|err| e("recv", err))?;
            if got != pattern(peer, i as u64, len) {
                return Err(format!("rank {rank}: {len} bytes from rank {peer} differ"));
            }
        }
    }
    // Exchanges around the ring into posted buffers, both directions streaming at once.
    common::exchange_ring_exact(&t, SIZES)?;
    // Many small messages, each under its own tag, taken in reverse order.
    for peer in (0..n).filter(|&p| p != rank) {
        for k in 0..BURST {
            let bytes = pattern(rank, 1000 + u64::from(k), (k % 97) as usize);
            t.send_bytes(peer, 1000 + k, &bytes)
                .map_err(|err| e("burst send", err))?;
        }
    }
    for peer in (0..n).filter(|&p| p != rank) {
        for k in (0..BURST).rev() {
            let got = t
                .recv_bytes(peer, 1000 + k)
                .map_err(|err| e("burst recv", err))?;
            if got != pattern(peer, 1000 + u64::from(k), (k % 97) as usize) {
                return Err(format!(
                    "rank {rank}: burst message {k} from {peer} differs"
                ));
            }
        }
    }
    for peer in (0..n).filter(|&p| p != rank) {
        if t.lane_from(peer) != expect {
            return Err(format!("rank {rank}: lane from rank {peer} changed"));
        }
    }
    t.barrier().map_err(|err| e("barrier", err))
}

/// Runs `n` lane workers on this host with rings of `ring` bytes (the default when `None`);
/// `off` ranks turn lanes off.
fn processes(n: u32, ring: Option<u64>, off: &[u32], expect: bool) {
    processes_with(n, ring, off, expect, &[]);
}

/// [`processes`] with `extra` added to every rank's environment.
fn processes_with(n: u32, ring: Option<u64>, off: &[u32], expect: bool, extra: &[(&str, &str)]) {
    let port = free_port();
    let children = (0..n)
        .map(|rank| {
            let mut env = rlx_env(rank, n, "127.0.0.1", port);
            if let Some(bytes) = ring {
                env.push(("RLX_LANE_BYTES".into(), bytes.to_string()));
            }
            if off.contains(&rank) {
                env.push(("RLX_LANE_BYTES".into(), "0".into()));
            }
            env.extend(extra.iter().map(|&(k, v)| (k.into(), v.into())));
            let expected = if expect { "1" } else { "0" };
            env.push(("EXPECT_LANE".into(), expected.into()));
            spawn("lanes", &env)
        })
        .collect();
    let done = wait_all(children, Duration::from_secs(120));
    assert_all_ok(&done);
}

fn two_processes_talk_through_lanes() {
    processes(2, None, &[], true);
}

/// A 4 KiB ring wraps inside almost every message and is full most of the time.
fn rings_smaller_than_the_messages() {
    processes(3, Some(4096), &[], true);
}

fn one_rank_without_lanes_keeps_tcp() {
    processes(2, None, &[0], false);
}

/// `RLX_SINGLE_COPY=0` turns only the single-copy path off: the offer still goes out for the
/// lanes, nobody reads by single copy, and link 0 still moves to the lane.
fn lanes_stay_on_with_single_copy_off() {
    processes_with(3, None, &[], true, &[("RLX_SINGLE_COPY", "0")]);
}

fn main() {
    common::run(
        &[
            (
                "two_processes_talk_through_lanes",
                two_processes_talk_through_lanes,
            ),
            (
                "rings_smaller_than_the_messages",
                rings_smaller_than_the_messages,
            ),
            (
                "one_rank_without_lanes_keeps_tcp",
                one_rank_without_lanes_keeps_tcp,
            ),
            (
                "lanes_stay_on_with_single_copy_off",
                lanes_stay_on_with_single_copy_off,
            ),
        ],
        worker,
    );
}
