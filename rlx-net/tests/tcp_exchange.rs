//! Exchanges (`Transport::send_recv_into`) over loopback: both directions at once with
//! messages far larger than the socket buffers and the unexpected budget, rings of three and
//! four ranks over several sockets per peer, every size from empty to many MiB, an exchange
//! with this rank itself, and the ends that are not data: a deadline, a message longer than
//! the buffer, a peer that is gone.

mod common;

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::in_process::shared_world;
use common::pattern;
use rlx_net::TcpTransport;
use rlx_transport::{CollectiveError, Tag, Transport};

const SIZES: &[usize] = &[0, 1, 13, 4093, 65_521, 262_147, (1 << 20) + 7, 24 << 20];

/// Every rank of `world` exchanges every size with its ring neighbours (sending to `r+1`,
/// receiving from `r-1`), `rounds` times, and checks every byte, then that the transport
/// counted exactly those bytes; returns the bytes of large messages (of at least the
/// hand-over threshold) that went through a copy, summed over the ranks.
fn ring_of_exchanges(world: &[Arc<TcpTransport>], rounds: u64) -> u64 {
    let n = world.len() as u32;
    let handles: Vec<_> = world
        .iter()
        .map(|t| {
            let t = Arc::clone(t);
            thread::spawn(move || {
                let r = t.rank();
                let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
                let tag = Tag::user(5).unwrap();
                for round in 0..rounds {
                    for (i, &len) in SIZES.iter().enumerate() {
                        let index = round * 100 + i as u64;
                        let outgoing = pattern(r, index, len);
                        let mut buf = vec![0xEE; len + 3];
                        // Every rank posts its receive at about the same moment, as the
                        // ranks of a collective do.
                        t.barrier().unwrap();
                        let got = t
                            .send_recv_into(next, prev, tag, &[&outgoing], &mut buf, t.op_timeout())
                            .unwrap_or_else(|e| panic!("rank {r}, {len} bytes: {e}"));
                        assert_eq!(got, Some(len), "rank {r}, {len} bytes");
                        assert!(
                            buf[..len] == pattern(prev, index, len)[..],
                            "rank {r}: {len} bytes from rank {prev} differ"
                        );
                        assert!(buf[len..].iter().all(|&b| b == 0xEE), "rank {r}: overrun");
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let moved = SIZES.iter().map(|&l| l as u64).sum::<u64>() * rounds;
    let small = SIZES
        .iter()
        .map(|&l| l as u64)
        .filter(|&l| l < 64 << 10)
        .sum::<u64>()
        * rounds;
    let mut copied_large = 0;
    for t in world {
        let traffic = t.traffic().expect("the TCP transport counts its traffic");
        assert_eq!(
            (traffic.sent_bytes, traffic.received_bytes),
            (moved, moved),
            "rank {}",
            t.rank()
        );
        copied_large += traffic.copied_bytes.saturating_sub(small);
    }
    copied_large
}

/// Two ranks exchange messages of up to 24 MiB while the unexpected budget is 1 MiB: the
/// incoming message lands in the posted buffer while the outgoing one is written. A send
/// followed by a receive copies three or four of the four 24 MiB messages here; an exchange
/// copies none, or one when a rank is descheduled between the barrier and its post for long
/// enough that the background watcher takes the message as unexpected. A loaded machine
/// (other jobs on both cores) deschedules ranks that long more often, so the best of three
/// fresh worlds is judged: a send followed by a receive would copy in every one.
fn both_directions_at_once() {
    let mut attempts = Vec::new();
    for _ in 0..3 {
        let world = shared_world(2, |b| b.max_unexpected_bytes(1 << 20));
        let copied = ring_of_exchanges(&world, 2);
        attempts.push(copied);
        if copied <= 24 << 20 {
            return;
        }
    }
    panic!(
        "bytes of large messages that went through a copy, in each of three worlds: {attempts:?}"
    );
}

/// Rings of three and four ranks, the large messages striped over three sockets per peer.
fn rings_over_several_sockets() {
    for n in [3, 4] {
        let world = shared_world(n, |b| b.sockets_per_peer(3).max_unexpected_bytes(1 << 20));
        ring_of_exchanges(&world, 1);
    }
}

/// An exchange with this rank itself is a send to itself and a receive of that message.
fn exchange_with_itself() {
    let world = shared_world(2, |b| b);
    let t = &world[0];
    let tag = Tag::user(2).unwrap();
    let mut buf = [0u8; 4];
    let got = t
        .send_recv_into(0, 0, tag, &[b"ab", b"cd"], &mut buf, t.op_timeout())
        .unwrap();
    assert_eq!((got, &buf), (Some(4), b"abcd"));
}

/// A peer that sends nothing: the exchange's send goes through, its receive ends at the
/// deadline with `None`, and the message the peer sends later is not lost.
fn a_silent_peer_ends_the_receive_at_its_deadline() {
    let world = shared_world(2, |b| b);
    let tag = Tag::user(4).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let started = Instant::now();
    let got = world[0]
        .send_recv_into(1, 1, tag, &[b"ping"], &mut buf, Duration::from_millis(200))
        .unwrap();
    assert_eq!(got, None);
    assert!(started.elapsed() >= Duration::from_millis(200));
    assert_eq!(world[1].recv_bytes(0, 4).unwrap(), b"ping");
    world[1].send_bytes(0, 4, &pattern(1, 0, 1 << 20)).unwrap();
    let got = world[0]
        .recv_message_into(1, tag, &mut buf, world[0].op_timeout())
        .unwrap();
    assert_eq!(got, Some(1 << 20));
    assert!(buf == pattern(1, 0, 1 << 20));
}

/// A message longer than the exchange's buffer is a length mismatch naming the peer.
fn a_longer_message_is_a_length_mismatch() {
    let world = shared_world(2, |b| b);
    let tag = Tag::user(6).unwrap();
    let peer = {
        let t = Arc::clone(&world[1]);
        thread::spawn(move || {
            let mut buf = [0u8; 8];
            t.send_recv_into(0, 0, tag, &[&[7u8; 100]], &mut buf, t.op_timeout())
        })
    };
    let mut small = [0u8; 10];
    let err = world[0]
        .send_recv_into(1, 1, tag, &[&[1u8; 8]], &mut small, world[0].op_timeout())
        .unwrap_err();
    assert!(
        matches!(
            err,
            CollectiveError::LengthMismatch {
                peer: Some(1),
                expected: 10,
                got: 100,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(peer.join().unwrap().unwrap(), Some(8));
}

/// A peer that closes its transport in the middle of an exchange of a large message: the
/// exchange fails with `PeerLost` naming it instead of waiting.
fn a_lost_peer_ends_the_exchange() {
    let world = shared_world(2, |b| b.max_unexpected_bytes(1 << 20));
    let mut world = world.into_iter();
    let (first, second) = (world.next().unwrap(), world.next().unwrap());
    let closer = thread::spawn(move || {
        let mut buf = [0u8; 16];
        // Takes a little of the large message, then goes away.
        let _ = second.recv_message_into(0, Tag::user(8).unwrap(), &mut buf, Duration::ZERO);
        thread::sleep(Duration::from_millis(100));
        drop(second);
    });
    let tag = Tag::user(8).unwrap();
    let mut buf = vec![0u8; 32 << 20];
    let err = first
        .send_recv_into(
            1,
            1,
            tag,
            &[&pattern(0, 0, 32 << 20)],
            &mut buf,
            first.op_timeout(),
        )
        .unwrap_err();
    assert!(
        matches!(err, CollectiveError::PeerLost { peer: 1, .. }),
        "{err}"
    );
    closer.join().unwrap();
}

fn main() {
    common::run(
        &[
            ("both_directions_at_once", both_directions_at_once),
            ("rings_over_several_sockets", rings_over_several_sockets),
            ("exchange_with_itself", exchange_with_itself),
            (
                "a_silent_peer_ends_the_receive_at_its_deadline",
                a_silent_peer_ends_the_receive_at_its_deadline,
            ),
            (
                "a_longer_message_is_a_length_mismatch",
                a_longer_message_is_a_length_mismatch,
            ),
            (
                "a_lost_peer_ends_the_exchange",
                a_lost_peer_ends_the_exchange,
            ),
        ],
        |role| Err(format!("no worker role {role} in this binary")),
    );
}
