//! The single-copy path between ranks of one host: large messages read straight from the
//! sender's memory land exactly, in every way a message can land (a posted buffer, an
//! exchange, the unexpected queue, several parts), the traffic counters show that they took
//! the path, switching it off on one rank keeps both directions on TCP, a sender that gives
//! up on a message leaves the receiver with an error, never with bytes it cannot trust, the
//! heads that pass through the sender's bounce file and the tails read past it land exactly,
//! work run during a send overlaps the peer's copy, and a message that arrives shortly before
//! its receive waits for it instead of being copied twice.

mod common;

use std::time::{Duration, Instant};

use common::in_process::{shared_world, shared_world_by_rank};
use common::{assert_all_ok, free_port, pattern, rlx_env, spawn, wait_all};
use rlx_transport::{CollectiveError, Tag, Transport};

/// Around the default threshold (256 KiB), and past the socket buffers and several segments.
const SIZES: &[usize] = &[1, (256 << 10) - 1, 256 << 10, (1 << 20) + 3, (16 << 20) + 5];

const THRESHOLD: usize = 256 << 10;

/// `bytes` cut into one to three parts, as a vectored send gives them.
fn parts(bytes: &[u8], index: usize) -> Vec<&[u8]> {
    let cuts = index % 3 + 1;
    let step = bytes.len().div_ceil(cuts).max(1);
    bytes.chunks(step).collect()
}

/// Every size to every peer before any receive (the unexpected queue), then every size by
/// exchange around the ring into posted buffers; each message checked byte for byte, then the
/// counters against the sizes at or above the threshold.
fn exact_worker() -> Result<(), String> {
    let t = common::from_env()?;
    let (rank, n) = (t.rank(), t.world_size());
    let e = |what: &str, err: CollectiveError| format!("rank {rank}, {what}: {err}");
    common::settle(&t, 2)?;
    for peer in (0..n).filter(|&p| p != rank) {
        for (i, &len) in SIZES.iter().enumerate() {
            let bytes = pattern(rank, i as u64, len);
            let tag = Tag::user(i as u32).map_err(|err| e("tag", err))?;
            t.send_message(peer, tag, &parts(&bytes, i))
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
    common::exchange_ring_exact(&t, SIZES)?;
    let large: u64 = SIZES
        .iter()
        .filter(|&&l| l >= THRESHOLD)
        .map(|&l| l as u64)
        .sum();
    // Every peer sent each size once directly, and the ring's previous rank once more.
    let expected = match std::env::var("EXPECT_SINGLE_COPY").as_deref() {
        Ok("1") => large * u64::from(n - 1) + large,
        _ => 0,
    };
    // Plain sends bounce their head up to the cap, sends in an exchange up to 4 MiB while
    // the exchange's receive is still open (one whose receive is done is a plain send).
    let cap: u64 = match std::env::var("RLX_BOUNCE_BYTES") {
        Ok(v) => v.parse().map_err(|_| format!("RLX_BOUNCE_BYTES={v}"))?,
        Err(_) => 64 << 20,
    };
    let bounced = |exchange_cap: u64| -> u64 {
        match expected {
            0 => 0,
            _ => SIZES
                .iter()
                .filter(|&&l| l >= THRESHOLD)
                .map(|&l| (l as u64).min(cap) * u64::from(n - 1) + (l as u64).min(exchange_cap))
                .sum(),
        }
    };
    let expected_bounced = bounced(cap.min(4 << 20))..=bounced(cap);
    let traffic = t.traffic().ok_or("the TCP transport counts its traffic")?;
    let peers: Vec<bool> = (0..n)
        .filter(|&p| p != rank)
        .map(|p| t.single_copy_from(p))
        .collect();
    println!(
        "rank {rank}: single-copy {} of {} bytes received, from peers {peers:?}",
        traffic.single_copy_bytes, traffic.received_bytes
    );
    if traffic.single_copy_bytes != expected || !expected_bounced.contains(&traffic.bounced_bytes) {
        return Err(format!(
            "rank {rank}: {} bytes came by single copy, {} of them bounced; expected \
             {expected} and {expected_bounced:?}",
            traffic.single_copy_bytes, traffic.bounced_bytes
        ));
    }
    t.barrier().map_err(|err| e("barrier", err))
}

fn worker(role: &str) -> Result<(), String> {
    match role {
        "exact" => exact_worker(),
        other => Err(format!("unknown role {other}")),
    }
}

/// Runs `n` exact workers on this host; `off` ranks set `RLX_SINGLE_COPY=0`, and every rank
/// bounces at most `bounce` bytes of a message when it is given.
fn processes(n: u32, off: &[u32], expect: bool, bounce: Option<u64>) {
    let port = free_port();
    let children = (0..n)
        .map(|rank| {
            let mut env = rlx_env(rank, n, "127.0.0.1", port);
            if off.contains(&rank) {
                env.push(("RLX_SINGLE_COPY".into(), "0".into()));
            }
            if let Some(bytes) = bounce {
                env.push(("RLX_BOUNCE_BYTES".into(), bytes.to_string()));
            }
            let expected = if expect { "1" } else { "0" };
            env.push(("EXPECT_SINGLE_COPY".into(), expected.into()));
            spawn("exact", &env)
        })
        .collect();
    let done = wait_all(children, Duration::from_secs(120));
    assert_all_ok(&done);
}

fn two_processes_read_each_other() {
    processes(2, &[], true, None);
}

fn three_processes_read_each_other() {
    processes(3, &[], true, None);
}

/// One rank saying no keeps both directions of its pairs on TCP, and results stay exact.
fn one_rank_switched_off_keeps_tcp() {
    processes(2, &[1], false, None);
}

/// A bounce file smaller than the messages carries their heads, and the receiver reads the
/// tails from the sender's memory; with bouncing off, everything is read that way. Either way
/// every byte lands exactly where it belongs.
fn heads_bounce_and_tails_are_read() {
    processes(2, &[], true, Some(1 << 20));
    processes(3, &[], true, Some((256 << 10) + 1));
    processes(2, &[], true, Some(0));
}

/// A sender whose receiver never takes the message (it is over the receiver's budget, and
/// nobody receives) times out naming it; the receiver, posting its receive afterwards, gets
/// an error, not bytes from a buffer the sender may have reused.
///
/// Only the sender's operation timeout is short: the receiver drops a peer whose messages
/// hold its budget, nothing received, for twice its own, and that must not come first
/// however late a loaded machine runs the sender.
fn a_sender_that_gives_up_is_not_trusted() {
    let w = shared_world_by_rank(2, |rank, b| {
        let timeout = match rank {
            0 => Duration::from_millis(1500),
            _ => Duration::from_secs(30),
        };
        b.max_unexpected_bytes(1 << 20).op_timeout(timeout)
    });
    std::thread::scope(|s| {
        let (a, b) = (&w[0], &w[1]);
        let one = s.spawn(|| common::settle(b.as_ref(), 2));
        common::settle(a.as_ref(), 2).expect("settle rank 0");
        one.join().expect("rank 1").expect("settle rank 1");
    });
    // A message already queued counts against the budget, so the large one parks.
    w[0].send_bytes(1, 3, &pattern(0, 0, 900 << 10)).unwrap();
    let mut big = pattern(0, 1, 8 << 20);
    let err = w[0].send_bytes(1, 4, &big).unwrap_err();
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
    // The sender reuses its buffer at once.
    big.iter_mut().for_each(|b| *b = 0x5A);
    assert_eq!(w[1].recv_bytes(0, 3).unwrap(), pattern(0, 0, 900 << 10));
    let got = w[1].recv_bytes(0, 4);
    assert!(
        matches!(got, Err(CollectiveError::PeerLost { peer: 0, .. })),
        "{:?}",
        got.map(|v| v.len())
    );
}

/// Work run during a send: it can wait for the peer's answer to the message in flight (the
/// peer takes it meanwhile), nest a send to another peer, and not send to the same peer (a
/// clear error, no hang); an error of the work comes back once the message is delivered, and
/// the links stay usable.
fn work_runs_while_the_message_is_in_flight() {
    let w = shared_world(3, |b| b.op_timeout(Duration::from_secs(20)));
    std::thread::scope(|s| {
        let others: Vec<_> = [&w[1], &w[2]]
            .into_iter()
            .map(|t| s.spawn(|| common::settle(t.as_ref(), 2)))
            .collect();
        common::settle(w[0].as_ref(), 2).expect("settle rank 0");
        for one in others {
            one.join().expect("a rank").expect("settle");
        }
    });
    let first = pattern(0, 1, (4 << 20) + 1);
    let second = pattern(0, 2, 3 << 20);
    let wait = Duration::from_secs(20);
    std::thread::scope(|s| {
        let one = s.spawn(|| {
            let got = w[1].recv_bytes(0, 5).expect("rank 1 receives");
            w[1].send_bytes(0, 6, &[u8::from(got == first)]).unwrap();
        });
        let two = s.spawn(|| w[2].recv_bytes(0, 7).expect("rank 2 receives") == second);
        let mut runs = 0;
        let mut work = || {
            runs += 1;
            // The peer takes the message while this work runs, and answers.
            assert_eq!(w[0].recv_bytes(1, 6)?, [1]);
            let again = w[0].send_bytes(1, 8, b"x").unwrap_err();
            assert!(
                matches!(&again, CollectiveError::InvalidArgument { .. })
                    && again.to_string().contains("rank 1"),
                "{again}"
            );
            let mut failing = || Err(CollectiveError::invalid("the work failed"));
            let tag = Tag::user(7)?;
            w[0].try_send_message_during(2, tag, &[&second], wait, &mut failing)?;
            unreachable!("the nested work failed, and so does its send")
        };
        let tag = Tag::user(5).unwrap();
        let err = w[0]
            .try_send_message_during(1, tag, &[&first], wait, &mut work)
            .unwrap_err();
        assert!(err.to_string().contains("the work failed"), "{err}");
        assert_eq!(runs, 1);
        one.join().expect("rank 1");
        assert!(two.join().expect("rank 2"), "rank 2's message differs");
    });
    for peer in [1, 2] {
        let traffic = w[peer].traffic().expect("counted");
        assert!(traffic.single_copy_bytes >= 3 << 20, "{traffic:?}");
        w[0].send_bytes(peer as u32, 9, b"after").unwrap();
        assert_eq!(w[peer].recv_bytes(0, 9).unwrap(), b"after");
    }
}

/// A large message that arrives before its receive is posted stays in the sender's memory for
/// a while instead of landing in a buffer of the transport's own: a receive posted a little
/// later reads it straight into its buffer, and nothing is copied twice. The order is observed,
/// not slept for: the receive is posted once rank 1 holds the message, and the hold is made
/// long (60 s instead of at most 100 ms) so that no descheduling can end it first.
fn a_message_waits_for_a_receive_posted_late() {
    let w = shared_world(2, |b| {
        b.op_timeout(Duration::from_secs(20))
            .longest_hold(Duration::from_secs(60))
    });
    std::thread::scope(|s| {
        let one = s.spawn(|| common::settle(w[1].as_ref(), 2));
        common::settle(w[0].as_ref(), 2).expect("settle rank 0");
        one.join().expect("rank 1").expect("settle rank 1");
    });
    let before = w[1].traffic().expect("counted");
    let len = 256 << 20;
    let message = pattern(0, 3, len);
    let mut buf = vec![1u8; len];
    std::thread::scope(|s| {
        let sender = s.spawn(|| w[0].send_bytes(1, 11, &message));
        let deadline = Instant::now() + Duration::from_secs(30);
        while !w[1].holds_message_from(0) {
            assert!(
                Instant::now() < deadline,
                "rank 1 never held the message for its receive"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        let got = w[1]
            .recv_message_into(0, Tag::user(11).unwrap(), &mut buf, Duration::from_secs(20))
            .unwrap();
        assert_eq!(got, Some(len));
        assert!(buf == message, "the message differs");
        sender.join().expect("rank 0").expect("the send");
    });
    let after = w[1].traffic().expect("counted");
    assert_eq!(
        after.single_copy_bytes - before.single_copy_bytes,
        len as u64,
        "{after:?}"
    );
    assert_eq!(after.copied_bytes, before.copied_bytes, "{after:?}");
}

fn main() {
    common::run(
        &[
            (
                "two_processes_read_each_other",
                two_processes_read_each_other,
            ),
            (
                "three_processes_read_each_other",
                three_processes_read_each_other,
            ),
            (
                "one_rank_switched_off_keeps_tcp",
                one_rank_switched_off_keeps_tcp,
            ),
            (
                "heads_bounce_and_tails_are_read",
                heads_bounce_and_tails_are_read,
            ),
            (
                "a_sender_that_gives_up_is_not_trusted",
                a_sender_that_gives_up_is_not_trusted,
            ),
            (
                "work_runs_while_the_message_is_in_flight",
                work_runs_while_the_message_is_in_flight,
            ),
            (
                "a_message_waits_for_a_receive_posted_late",
                a_message_waits_for_a_receive_posted_late,
            ),
        ],
        worker,
    );
}
