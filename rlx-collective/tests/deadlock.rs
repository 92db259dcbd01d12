//! Ranks that wait on each other are reported as a deadlock, on every rank of the cycle and
//! without blaming any of them: a receive under the wrong tag while the sender waits in a
//! barrier, two receives that no send matches, one rank in a collective while its peer waits
//! in a receive, and a ring of three receives. Each scenario runs ten times over
//! `MemTransport` and twice over `TcpTransport` on loopback.
//!
//! Nothing depends on timing: the waits never end by themselves, so each rank's wait times out
//! whatever the scheduling, and whichever rank walks the chain of waits first, the others learn
//! the cycle from its probes and its notice (see the `health` module). Every rank stays in its
//! group until all have their verdict, so that no rank's exit turns a wait into a lost peer.

mod common;

use std::sync::{Arc, Barrier};
use std::time::Duration;

use rlx_collective::{CollectiveError, ProcessGroup, ReduceKind, Result, Waiter, bf16};

/// The operation timeout: its tenth, the probe window, is thirty wait slices, which a rank of a
/// loaded machine needs to answer a probe.
const OP_TIMEOUT: Duration = Duration::from_secs(3);

/// Runs `body` on every rank of `groups` and returns each rank's error, once all have one.
fn verdicts(
    groups: Vec<ProcessGroup>,
    body: impl Fn(&ProcessGroup) -> Result<()> + Send + Sync + 'static,
) -> Vec<CollectiveError> {
    let done = Arc::new(Barrier::new(groups.len()));
    common::on_each(groups, move |group| {
        let outcome = body(&group);
        done.wait();
        outcome.expect_err("a deadlocked rank's call fails")
    })
}

/// The waits of a deadlock error, or a panic that says what came instead.
fn waits(rank: usize, error: &CollectiveError) -> &[Waiter] {
    match error {
        CollectiveError::Deadlock { waits, .. } => waits,
        other => panic!("rank {rank}: a deadlock, not {other:?} ({other})"),
    }
}

/// Checks that every rank reported a deadlock that names its own wait, `own(rank)`, and that
/// ranks of a two-rank cycle name the other's wait too.
fn check(errors: &[CollectiveError], own: impl Fn(u32) -> String) {
    for (rank, error) in errors.iter().enumerate() {
        let waits = waits(rank, error);
        let text = error.to_string();
        assert!(
            text.contains(" in a deadlock: ")
                || text.contains(" ended in a deadlock (found by rank "),
            "rank {rank}: {text}"
        );
        assert!(
            !text.contains("peer rank"),
            "rank {rank} blames a rank: {text}"
        );
        let everyone: Vec<u32> = if errors.len() == 2 {
            vec![0, 1]
        } else {
            vec![rank as u32]
        };
        for r in everyone {
            assert!(
                waits
                    .iter()
                    .any(|w| w.rank == r && w.waits_in.starts_with(&own(r))),
                "rank {rank} does not name rank {r}'s wait in {}: {text}",
                own(r)
            );
        }
    }
}

/// Rank 0 sends under tag 7 (then tag 9, which rank 1 receives first, so that tag 7 has
/// arrived) and waits in a barrier; rank 1 waits for tag 8.
fn wrong_tag(groups: Vec<ProcessGroup>) {
    let errors = verdicts(groups, |group| {
        if group.rank() == 0 {
            group.send(1, 7, &[bf16::from_f32(1.0); 1024])?;
            group.send(1, 9, &[1u8])?;
            group.barrier()
        } else {
            group.recv::<u8>(0, 9)?;
            group.recv::<bf16>(0, 8).map(drop)
        }
    });
    check(&errors, |rank| match rank {
        0 => "barrier #".to_owned(),
        _ => "recv(from 0, tag 8), while rank 0 sent it what no receive took: tag 7 (1024 bf16 \
              elements"
            .to_owned(),
    });
}

/// Rank 0 sends under tag 3 and waits for an answer under tag 4; rank 1 waits under tag 5.
fn receives_no_send_matches(groups: Vec<ProcessGroup>) {
    let errors = verdicts(groups, |group| {
        if group.rank() == 0 {
            group.send(1, 3, &[1.0f32; 16])?;
            group.recv::<f32>(1, 4).map(drop)
        } else {
            group.recv::<f32>(0, 5).map(drop)
        }
    });
    check(&errors, |rank| match rank {
        0 => "recv(from 1, tag 4)".to_owned(),
        _ => "recv(from 0, tag 5)".to_owned(),
    });
}

/// Rank 0 enters an all-reduce; rank 1 waits for a message from it instead.
fn collective_against_receive(groups: Vec<ProcessGroup>) {
    let errors = verdicts(groups, |group| {
        if group.rank() == 0 {
            group.all_reduce(&mut [1.0f32; 64], ReduceKind::Sum)
        } else {
            group.recv::<f32>(0, 2).map(drop)
        }
    });
    check(&errors, |rank| match rank {
        0 => "all_reduce #".to_owned(),
        _ => "recv(from 0, tag 2)".to_owned(),
    });
}

/// Three ranks, each waiting for the next.
fn ring_of_receives(groups: Vec<ProcessGroup>) {
    let errors = verdicts(groups, |group| {
        group.recv::<f32>((group.rank() + 1) % 3, 1).map(drop)
    });
    check(&errors, |rank| {
        format!("recv(from {}, tag 1)", (rank + 1) % 3)
    });
}

fn mem_world(n: u32) -> Vec<ProcessGroup> {
    common::world_with_timeout(n, OP_TIMEOUT)
}

#[test]
fn a_receive_under_the_wrong_tag_beside_a_barrier_is_a_deadlock_mem() {
    for _ in 0..10 {
        wrong_tag(mem_world(2));
    }
}

#[test]
fn receives_that_no_send_matches_are_a_deadlock_mem() {
    for _ in 0..10 {
        receives_no_send_matches(mem_world(2));
    }
}

#[test]
fn a_collective_against_a_receive_is_a_deadlock_mem() {
    for _ in 0..10 {
        collective_against_receive(mem_world(2));
    }
}

#[test]
fn a_ring_of_receives_is_a_deadlock_on_every_rank_mem() {
    for _ in 0..10 {
        ring_of_receives(mem_world(3));
    }
}

#[cfg(feature = "tcp")]
fn tcp_world(n: u32) -> Vec<ProcessGroup> {
    common::tcp_world(n, common::free_port(), |rank, n, port| {
        common::loopback_builder(rank, n, port, OP_TIMEOUT)
    })
}

#[cfg(feature = "tcp")]
#[test]
fn every_deadlock_is_named_over_tcp() {
    for _ in 0..2 {
        wrong_tag(tcp_world(2));
        receives_no_send_matches(tcp_world(2));
        collective_against_receive(tcp_world(2));
        ring_of_receives(tcp_world(3));
    }
}
