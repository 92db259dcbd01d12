//! What the algorithms put on the wire, counted by the TCP transport
//! ([`Transport::traffic`](rlx_collective::Transport::traffic)) on 2 to 8 ranks over loopback:
//! a ring all-reduce of S bytes sends 2(n-1)/n·S per rank, a ring all-gather producing S bytes
//! and a ring reduce-scatter of S bytes (n-1)/n·S, within 1%. Results are checked too, so the
//! counts are of operations that worked.
//!
//! How many of those bytes went through a copy is not judged here: a segment that arrives
//! before its rank posts the receive is copied, as it should be, and when that happens depends
//! on how the ranks are scheduled. rlx-net's `a_posted_exchange_receives_in_place` checks, with
//! the order arranged, that a posted receive takes nothing through a copy.

#![cfg(feature = "tcp")]

mod common;

use std::time::Duration;

use rlx_collective::{ProcessGroup, ReduceKind};

/// Elements of the buffers (4 MiB of f32): many segments for every world size, with segments
/// capped at [`SEGMENT`].
const COUNT: usize = 1 << 20;

/// The segment cap, so that every world size moves its blocks in several segments (ranks that
/// all share a host would otherwise move each block in one, `Transport::segment_hint`).
const SEGMENT: usize = 256 << 10;

/// One collective run (and checked) on one rank.
type Op = fn(&ProcessGroup);

/// Bytes every rank sent (to other ranks) while `op` ran on every rank of `world`.
fn bytes_of(world: &[ProcessGroup], op: Op) -> Vec<u64> {
    let before: Vec<_> = world
        .iter()
        .map(|g| g.transport().traffic().expect("TCP counts its traffic"))
        .collect();
    std::thread::scope(|s| {
        for g in world {
            s.spawn(move || {
                g.barrier().expect("the barrier before");
                op(g);
                g.barrier().expect("the barrier after");
            });
        }
    });
    world
        .iter()
        .zip(before)
        .map(|(g, before)| {
            let after = g.transport().traffic().expect("TCP counts its traffic");
            after.sent_bytes - before.sent_bytes
        })
        .collect()
}

fn all_reduce(g: &ProcessGroup) {
    let mut data = vec![1.0f32; COUNT];
    g.all_reduce(&mut data, ReduceKind::Sum)
        .expect("all_reduce");
    let n = g.world_size() as f32;
    assert!(data.iter().all(|&x| x == n), "rank {}: wrong sum", g.rank());
}

fn all_gather(g: &ProcessGroup) {
    let local = vec![g.rank() as f32; COUNT / g.world_size() as usize];
    let all = g.all_gather(&local).expect("all_gather");
    for (i, chunk) in all.chunks(local.len()).enumerate() {
        assert!(
            chunk.iter().all(|&x| x == i as f32),
            "rank {}: block {i}",
            g.rank()
        );
    }
}

fn reduce_scatter(g: &ProcessGroup) {
    let data = vec![2.0f32; COUNT];
    let mine = g
        .reduce_scatter(&data, ReduceKind::Sum)
        .expect("reduce_scatter");
    let n = g.world_size() as f32;
    assert!(
        mine.iter().all(|&x| x == 2.0 * n),
        "rank {}: wrong block",
        g.rank()
    );
}

#[test]
fn ring_collectives_move_the_bytes_the_schedule_says() {
    let bytes = (COUNT * 4) as f64;
    for n in 2..=8u32 {
        let world = common::tcp_world(n, common::free_port(), |rank, n, port| {
            common::loopback_builder(rank, n, port, Duration::from_secs(60))
        });
        for g in &world {
            g.set_max_segment_bytes(Some(SEGMENT));
        }
        let nf = f64::from(n);
        let ops: [(&str, Op, f64); 3] = [
            ("all_reduce", all_reduce, 2.0 * (nf - 1.0) / nf * bytes),
            ("all_gather", all_gather, (nf - 1.0) / nf * bytes),
            ("reduce_scatter", reduce_scatter, (nf - 1.0) / nf * bytes),
        ];
        for (name, op, expected) in ops {
            // The all-gather's output is n equal blocks of COUNT / n elements.
            let expected = if name == "all_gather" {
                expected * (COUNT / n as usize * n as usize) as f64 / COUNT as f64
            } else {
                expected
            };
            for (rank, sent) in bytes_of(&world, op).into_iter().enumerate() {
                let off = (sent as f64 - expected).abs() / expected;
                assert!(
                    off <= 0.01,
                    "{name} on {n} ranks: rank {rank} sent {sent} bytes, the schedule says \
                     {expected:.0} ({:.2}% off)",
                    off * 100.0
                );
            }
        }
    }
}
