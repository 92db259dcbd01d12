//! Point-to-point transfers over loopback: sizes from 0 to several MiB, FIFO per tag, tag
//! isolation, receives into caller buffers, deadlines, IPv6, several sockets per peer, many
//! threads on one transport, and two ranks sending large messages to each other at once.

mod common;

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::in_process::{shared_world, shared_world_by_rank};
use common::{assert_all_ok, free_port, pattern, rlx_env, spawn, wait_all};
use rlx_transport::{CollectiveError, Failure, Tag, Transport};

const SIZES: &[usize] = &[
    0,
    1,
    2,
    3,
    7,
    13,
    31,
    4093,
    65_521,
    65_536,
    262_147,
    1_048_573,
    (4 << 20) + 3,
];

/// Every rank sends every size to every peer, all before receiving anything; receives then
/// take the tags in reverse order, check FIFO on one tag and land some messages in buffers.
fn transfer_worker() -> Result<(), String> {
    let t = common::from_env()?;
    let (rank, n) = (t.rank(), t.world_size());
    let e = |e: CollectiveError| format!("rank {rank}: {e}");
    for peer in (0..n).filter(|&p| p != rank) {
        for (i, &len) in SIZES.iter().enumerate() {
            t.send_bytes(peer, i as u32, &pattern(rank, i as u64, len))
                .map_err(e)?;
        }
        for k in 0..50u64 {
            t.send_bytes(peer, 100, &k.to_le_bytes()).map_err(e)?;
        }
    }
    for peer in (0..n).filter(|&p| p != rank) {
        for (i, &len) in SIZES.iter().enumerate().rev() {
            let want = pattern(peer, i as u64, len);
            if i % 2 == 0 {
                let mut buf = vec![0xEE; len + 17];
                let got = t
                    .recv_message_into(
                        peer,
                        Tag::user(i as u32).map_err(e)?,
                        &mut buf,
                        t.op_timeout(),
                    )
                    .map_err(e)?
                    .ok_or("recv_into timed out")?;
                if got != len || buf[..len] != want[..] || buf[len..].iter().any(|&b| b != 0xEE) {
                    return Err(format!(
                        "rank {rank}: recv_into from {peer} size {len} wrong"
                    ));
                }
            } else {
                let got = t.recv_bytes(peer, i as u32).map_err(e)?;
                if got != want {
                    return Err(format!("rank {rank}: bytes from {peer} size {len} wrong"));
                }
            }
        }
        for k in 0..50u64 {
            let got = t.recv_bytes(peer, 100).map_err(e)?;
            if got != k.to_le_bytes() {
                return Err(format!("rank {rank}: FIFO broken from {peer} at {k}"));
            }
        }
    }
    let start = Instant::now();
    let none = t
        .recv_bytes_timeout((rank + 1) % n, 999, Duration::from_millis(50))
        .map_err(e)?;
    if none.is_some() || start.elapsed() < Duration::from_millis(50) {
        return Err(format!("rank {rank}: the deadline was not honoured"));
    }
    t.barrier().map_err(e)?;
    println!("ok rank {rank}");
    Ok(())
}

fn worker(role: &str) -> Result<(), String> {
    match role {
        "transfer" => transfer_worker(),
        other => Err(format!("unknown role {other}")),
    }
}

fn run_job(world: u32, host: &str, extra: &[(&str, &str)]) {
    let port = free_port();
    let children = (0..world)
        .map(|rank| {
            let mut env = rlx_env(rank, world, host, port);
            env.extend(
                extra
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
            );
            spawn("transfer", &env)
        })
        .collect();
    let done = wait_all(children, Duration::from_secs(120));
    assert_all_ok(&done);
    for (rank, f) in done.iter().enumerate() {
        assert!(f.stdout.contains(&format!("ok rank {rank}")), "{done:#?}");
    }
}

fn two_processes_ipv4() {
    run_job(2, "127.0.0.1", &[]);
}

fn two_processes_ipv6() {
    run_job(2, "::1", &[]);
}

fn three_processes_three_sockets_per_peer() {
    run_job(3, "127.0.0.1", &[("RLX_SOCKETS_PER_PEER", "3")]);
}

fn keep(b: rlx_net::TcpTransportBuilder) -> rlx_net::TcpTransportBuilder {
    b
}

fn recv_into_checks_the_length() {
    let w = shared_world(2, keep);
    let tag = Tag::user(3).unwrap();
    w[0].send_message(1, tag, &[b"ab", b"cd"]).unwrap();
    let mut buf = [0u8; 8];
    let n = w[1]
        .recv_message_into(0, tag, &mut buf, Duration::from_secs(10))
        .unwrap();
    assert_eq!(n, Some(4));
    assert_eq!(&buf[..4], b"abcd");
    w[0].send_message(1, tag, &[&[7u8; 9]]).unwrap();
    let err = w[1]
        .recv_message_into(0, tag, &mut buf, Duration::from_secs(10))
        .unwrap_err();
    assert!(
        matches!(
            err,
            CollectiveError::LengthMismatch {
                op: "recv",
                peer: Some(0),
                expected: 8,
                got: 9,
                dtype: None,
                ..
            }
        ),
        "{err}"
    );
    // The long message was consumed; the next one is intact.
    w[0].send_message(1, tag, &[b"next"]).unwrap();
    assert_eq!(w[1].recv_bytes(0, 3).unwrap(), b"next");
}

fn deadlines_are_honoured() {
    let w = shared_world(2, |b| b.op_timeout(Duration::from_millis(200)));
    let start = Instant::now();
    assert!(
        w[0].recv_bytes_timeout(1, 1, Duration::from_millis(80))
            .unwrap()
            .is_none()
    );
    assert!(start.elapsed() >= Duration::from_millis(80));
    let err = w[0].recv_bytes(1, 1).unwrap_err();
    assert!(
        matches!(
            err,
            CollectiveError::Timeout {
                peer: Some(1),
                op: "recv",
                ..
            }
        ),
        "{err}"
    );
    // A zero timeout polls.
    assert!(
        w[0].recv_bytes_timeout(1, 1, Duration::ZERO)
            .unwrap()
            .is_none()
    );
    w[1].send_bytes(0, 1, b"late").unwrap();
    assert_eq!(w[0].recv_bytes(1, 1).unwrap(), b"late");
}

fn many_threads_on_one_transport() {
    let w = shared_world(2, keep);
    let receivers: Vec<_> = (0..6u32)
        .map(|tag| {
            let t = Arc::clone(&w[1]);
            thread::spawn(move || {
                for k in 0..40u64 {
                    let got = t.recv_bytes(0, tag).unwrap();
                    assert_eq!(got, pattern(tag, k, (k as usize * 977) % 70_000));
                }
            })
        })
        .collect();
    let senders: Vec<_> = (0..6u32)
        .map(|tag| {
            let t = Arc::clone(&w[0]);
            thread::spawn(move || {
                for k in 0..40u64 {
                    t.send_bytes(1, tag, &pattern(tag, k, (k as usize * 977) % 70_000))
                        .unwrap();
                }
            })
        })
        .collect();
    for h in senders.into_iter().chain(receivers) {
        h.join().unwrap();
    }
}

/// Both ranks send a message far larger than the socket buffers and the unexpected budget to
/// each other at the same moment, then receive: each send must read meanwhile.
fn large_messages_both_ways_at_once() {
    let w = shared_world(2, |b| b.max_unexpected_bytes(1 << 20));
    let len = 24 << 20;
    let handles: Vec<_> = (0..2u32)
        .map(|rank| {
            let t = Arc::clone(&w[rank as usize]);
            thread::spawn(move || {
                let peer = 1 - rank;
                for k in 0..3u64 {
                    t.send_bytes(peer, 9, &pattern(rank, k, len)).unwrap();
                    assert_eq!(t.recv_bytes(peer, 9).unwrap(), pattern(peer, k, len));
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

/// A sender that nobody receives from is held back: it blocks (and its send times out) once
/// the receiver's budget and the socket buffers are full, instead of growing the receiver.
///
/// Only the sender's operation timeout is short: the receiver drops a peer whose messages
/// hold its budget, nothing received, for twice its own, and that must not come first
/// however late a loaded machine runs the sender.
fn a_fast_sender_is_held_back() {
    let w = shared_world_by_rank(2, |rank, b| {
        let timeout = match rank {
            0 => Duration::from_millis(1500),
            _ => Duration::from_secs(30),
        };
        b.max_unexpected_bytes(4 << 20).op_timeout(timeout)
    });
    let chunk = 1 << 20;
    let mut sent = 0u64;
    let err = loop {
        match w[0].send_bytes(1, 2, &pattern(0, sent, chunk)) {
            Ok(()) => sent += 1,
            Err(e) => break e,
        }
        assert!(sent < 64, "64 MiB went out although nobody receives");
    };
    assert!(
        matches!(
            err,
            CollectiveError::Timeout {
                peer: Some(1),
                op: "send",
                ..
            }
        ),
        "{err}"
    );
    // What was admitted is intact and in order.
    assert_eq!(w[1].recv_bytes(0, 2).unwrap(), pattern(0, 0, chunk));
    assert_eq!(w[1].recv_bytes(0, 2).unwrap(), pattern(0, 1, chunk));
}

fn tags_stay_apart_and_notices_fail_fast() {
    let w = shared_world(3, keep);
    let a = Tag::op(4, 1, 0);
    let b = Tag::op(4, 2, 0);
    w[0].send_message(2, a, &[b"a1"]).unwrap();
    w[1].send_message(2, a, &[b"from1"]).unwrap();
    w[0].send_message(2, b, &[b"b1"]).unwrap();
    w[0].send_message(2, a, &[b"a2"]).unwrap();
    let t = Duration::from_secs(10);
    assert_eq!(w[2].recv_message(0, b, t).unwrap().unwrap(), b"b1");
    assert_eq!(w[2].recv_message(1, a, t).unwrap().unwrap(), b"from1");
    assert_eq!(w[2].recv_message(0, a, t).unwrap().unwrap(), b"a1");
    assert_eq!(w[2].recv_message(0, a, t).unwrap().unwrap(), b"a2");
    w[0].send_failure(
        2,
        b,
        Failure::LengthMismatch {
            expected: 4,
            got: 8,
            own: None,
        },
    )
    .unwrap();
    let err = w[2].recv_message(0, b, t).unwrap_err();
    assert!(
        matches!(
            err,
            CollectiveError::LengthMismatch {
                op: "recv",
                peer: Some(0),
                expected: 4,
                got: 8,
                dtype: None,
                ..
            }
        ),
        "{err}"
    );
    w[1].send_failure(2, a, Failure::Failed).unwrap();
    let err = w[2].recv_message(1, a, t).unwrap_err();
    assert!(
        matches!(err, CollectiveError::PeerFailed { peer: 1, .. }),
        "{err}"
    );
    // Messages to oneself work like any other.
    w[2].send_bytes(2, 1, b"me").unwrap();
    assert_eq!(w[2].recv_bytes(2, 1).unwrap(), b"me");
    assert!(matches!(
        w[0].send_bytes(3, 0, b""),
        Err(CollectiveError::UnknownRank {
            rank: 3,
            world_size: 3
        })
    ));
}

fn main() {
    common::run(
        &[
            ("two_processes_ipv4", two_processes_ipv4),
            ("two_processes_ipv6", two_processes_ipv6),
            (
                "three_processes_three_sockets_per_peer",
                three_processes_three_sockets_per_peer,
            ),
            ("recv_into_checks_the_length", recv_into_checks_the_length),
            ("deadlines_are_honoured", deadlines_are_honoured),
            (
                "many_threads_on_one_transport",
                many_threads_on_one_transport,
            ),
            (
                "large_messages_both_ways_at_once",
                large_messages_both_ways_at_once,
            ),
            ("a_fast_sender_is_held_back", a_fast_sender_is_held_back),
            (
                "tags_stay_apart_and_notices_fail_fast",
                tags_stay_apart_and_notices_fail_fast,
            ),
        ],
        worker,
    );
}
