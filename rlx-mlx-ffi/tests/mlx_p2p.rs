//! Point-to-point through `MlxTransport` over MLX's ring on loopback, with real processes:
//! correctness for every ordered pair, tag isolation and FIFO order, deadlines, routing to
//! non-neighbours, and a rank killed mid-operation.

#![cfg(feature = "mlx")]

mod cluster;

use std::time::{Duration, Instant};

use cluster::Expect;
use rlx_mlx_ffi::{Backend, MlxTransport};
use rlx_transport::{CollectiveError, DType, ReduceKind, Transport};

/// Lengths around the inline limit of the first MLX message (224 bytes) and a large one.
const LENGTHS: [usize; 6] = [0, 1, 224, 225, 4096, 300_001];

fn payload(src: u32, dst: u32, which: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(31) as u8 ^ (src as u8 * 17) ^ (dst as u8 * 5) ^ which)
        .collect()
}

/// Every rank sends to every other rank, per length, messages A and C under tag 11 and B
/// under tag 12; every receiver takes tag 12 first, then tag 11 twice in send order.
fn all_pairs(t: &MlxTransport) {
    let me = t.rank();
    let n = t.world_size();
    for &len in &LENGTHS {
        for dst in (0..n).filter(|&d| d != me) {
            t.send_bytes(dst, 11, &payload(me, dst, 1, len)).unwrap();
            t.send_bytes(dst, 12, &payload(me, dst, 2, len)).unwrap();
            t.send_bytes(dst, 11, &payload(me, dst, 3, len)).unwrap();
        }
        for src in (0..n).filter(|&s| s != me) {
            assert_eq!(
                t.recv_bytes(src, 12).unwrap(),
                payload(src, me, 2, len),
                "B {src}->{me} len {len}"
            );
            assert_eq!(
                t.recv_bytes(src, 11).unwrap(),
                payload(src, me, 1, len),
                "A {src}->{me} len {len}"
            );
            assert_eq!(
                t.recv_bytes(src, 11).unwrap(),
                payload(src, me, 3, len),
                "C {src}->{me} len {len}"
            );
        }
    }
    // A message to oneself is delivered locally.
    t.send_bytes(me, 3, b"self").unwrap();
    assert_eq!(t.recv_bytes(me, 3).unwrap(), b"self");
    assert!(matches!(
        t.send_bytes(n, 1, b"x"),
        Err(CollectiveError::UnknownRank { .. })
    ));
    assert!(matches!(
        t.send_bytes(0, rlx_transport::TAG_RESERVED_BASE, b"x"),
        Err(CollectiveError::InvalidArgument { .. })
    ));
    t.barrier().unwrap();
}

#[test]
fn p2p_two_ranks() {
    cluster::ring("p2p_two_ranks", 2, all_pairs);
}

/// With three ranks every rank is a neighbour, but each pair uses a different socket of MLX's
/// ring (left and right), which two ranks never exercise.
#[test]
fn p2p_three_ranks() {
    cluster::ring("p2p_three_ranks", 3, all_pairs);
}

/// With four ranks 0↔2 and 1↔3 are not linked by MLX's ring: their messages are forwarded.
#[test]
fn p2p_four_ranks_routes_to_non_neighbours() {
    cluster::ring("p2p_four_ranks_routes_to_non_neighbours", 4, all_pairs);
}

fn deadlines(t: &MlxTransport) {
    let me = t.rank();
    let peer = 1 - me;
    if me == 1 {
        // Tag 7 arrives at once; tag 8 only after the receiver's deadline has passed.
        t.send_bytes(peer, 7, b"seven").unwrap();
        t.recv_bytes(peer, 1).unwrap();
        t.send_bytes(peer, 8, b"eight").unwrap();
        t.send_bytes(peer, 10, b"polled").unwrap();
    } else {
        let start = Instant::now();
        let got = t
            .recv_bytes_timeout(peer, 8, Duration::from_millis(300))
            .unwrap();
        let waited = start.elapsed();
        assert!(
            got.is_none(),
            "a tag 7 message must not satisfy a tag 8 receive"
        );
        assert!(
            waited >= Duration::from_millis(300),
            "returned early after {waited:?}"
        );
        assert!(
            waited < Duration::from_secs(10),
            "deadline overshot: {waited:?}"
        );
        assert_eq!(t.recv_bytes(peer, 7).unwrap(), b"seven");
        assert_eq!(t.recv_bytes_timeout(peer, 8, Duration::ZERO).unwrap(), None);
        t.send_bytes(peer, 1, b"go").unwrap();
        assert_eq!(t.recv_bytes(peer, 8).unwrap(), b"eight");
        // A loop that only polls (zero timeouts) must still see a message that arrived when
        // nobody was waiting for it.
        let start = Instant::now();
        let polled = loop {
            if let Some(message) = t.recv_bytes_timeout(peer, 10, Duration::ZERO).unwrap() {
                break message;
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "polling never found the message"
            );
            std::thread::sleep(Duration::from_millis(1));
        };
        assert_eq!(polled, b"polled");
    }
    // MLX shares one world group per process, so a second transport over it is refused.
    assert!(matches!(
        MlxTransport::init(Backend::Ring),
        Err(CollectiveError::Config { .. })
    ));
    t.barrier().unwrap();
    // Abort wakes a receive on rank 0 that would otherwise wait for the whole timeout, and
    // rank 1, waiting on rank 0, learns promptly that rank 0 is gone.
    let start = Instant::now();
    if me == 0 {
        std::thread::scope(|scope| {
            let waiting = scope.spawn(|| t.recv_bytes(peer, 9));
            std::thread::sleep(Duration::from_millis(200));
            t.abort();
            let woken = waiting.join().unwrap();
            assert!(matches!(woken, Err(CollectiveError::Aborted)), "{woken:?}");
        });
        assert!(matches!(
            t.send_bytes(peer, 1, b"x"),
            Err(CollectiveError::Aborted)
        ));
    } else {
        let lost = t.recv_bytes(peer, 9);
        assert!(
            matches!(lost, Err(CollectiveError::PeerLost { peer: 0, .. })),
            "{lost:?}"
        );
    }
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "took {:?}",
        start.elapsed()
    );
}

#[test]
fn deadlines_and_tag_isolation() {
    cluster::ring("deadlines_and_tag_isolation", 2, deadlines);
}

/// Rank 2 dies (SIGABRT) while all three ranks run native all-reduces; the survivors must
/// see an error within the operation timeout, and a later receive from rank 2 must fail
/// rather than wait.
fn killed_mid_operation(t: &MlxTransport) {
    let native = t.native_collectives().unwrap();
    let mut data = vec![0u8; 8 << 20];
    t.barrier().unwrap();
    if t.rank() == 2 {
        std::thread::spawn(|| {
            std::thread::sleep(Duration::from_millis(300));
            std::process::abort();
        });
        loop {
            let _ = native.all_reduce(&mut data, DType::F32, ReduceKind::Sum);
        }
    }
    let start = Instant::now();
    let limit = Duration::from_millis(cluster::CHILD_TIMEOUT_MS);
    let error = loop {
        match native.all_reduce(&mut data, DType::F32, ReduceKind::Sum) {
            Ok(()) => assert!(
                start.elapsed() < limit,
                "no error after {:?}",
                start.elapsed()
            ),
            Err(e) => break e,
        }
    };
    assert!(
        start.elapsed() < limit + Duration::from_secs(2),
        "error came after {:?}",
        start.elapsed()
    );
    assert!(error.is_fatal(), "{error}");
    eprintln!(
        "rank {}: survivor saw after {:?}: {error}",
        t.rank(),
        start.elapsed()
    );
    let start = Instant::now();
    let later = t.recv_bytes(2, 5).unwrap_err();
    assert!(
        start.elapsed() < limit,
        "receive from the dead rank waited {:?}",
        start.elapsed()
    );
    eprintln!(
        "rank {}: receive from the dead rank failed after {:?}: {later}",
        t.rank(),
        start.elapsed()
    );
}

#[test]
fn killed_rank_fails_the_survivors() {
    cluster::ring_expecting(
        "killed_rank_fails_the_survivors",
        3,
        killed_mid_operation,
        |rank| {
            if rank == 2 {
                Expect::Killed
            } else {
                Expect::Success
            }
        },
    );
}
