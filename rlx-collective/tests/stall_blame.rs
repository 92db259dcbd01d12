//! Blame after a stall: when one rank stops calling into its group (a process stopped with
//! SIGSTOP, or a rank stuck outside the collectives), every other rank fails with an error
//! naming that rank — not the neighbour it happened to wait on, which was itself waiting.
//! Each rank of worlds of 2 to 5 ranks is stalled in turn, over `MemTransport`.

mod common;

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use rlx_collective::{Algorithm, CollectiveError, CollectiveOp, ProcessGroup, ReduceKind};

/// Operation timeout of the worlds here: short, so that the stall is caught quickly.
const OP_TIMEOUT: Duration = Duration::from_secs(1);
/// How much earlier a survivor further down the chain of waits enters the operation than the
/// next one up: far more than a failure notice needs to travel, so that without the walk
/// along the chain the first rank to time out would name its own neighbour.
const STAGGER: Duration = Duration::from_millis(150);
/// Operations a survivor runs at most before it must have failed.
const ROUNDS: usize = 3;

/// What one survivor saw: its rank, the first error of its operations, and the result of the
/// barrier it ran afterwards.
type Seen = (
    u32,
    Result<(), CollectiveError>,
    Result<(), CollectiveError>,
);

/// What a survivor's error blames: the awaited peer of a timeout, or a notice's culprit.
fn blamed(error: &CollectiveError) -> Option<u32> {
    match error {
        CollectiveError::Timeout { peer, .. } => *peer,
        CollectiveError::GroupFailed { peer, .. } => Some(*peer),
        _ => None,
    }
}

/// Runs one world of `n` ranks in which rank `stalled` never calls into its group while the
/// others run `body` `ROUNDS` times (after `delay(rank)`), then run a barrier; returns every
/// survivor's first error and the barrier's result.
fn stall_world(
    n: u32,
    stalled: u32,
    setup: fn(&ProcessGroup),
    delay: impl Fn(u32) -> Duration + Send + Sync + 'static,
    body: fn(&ProcessGroup) -> Result<(), CollectiveError>,
) -> Vec<Seen> {
    let release = Arc::new(Barrier::new(n as usize));
    let delay = Arc::new(delay);
    let threads: Vec<_> = common::world_with_timeout(n, OP_TIMEOUT)
        .into_iter()
        .map(|group| {
            let release = Arc::clone(&release);
            let delay = Arc::clone(&delay);
            thread::spawn(move || {
                let rank = group.rank();
                setup(&group);
                if rank == stalled {
                    // Stopped: the group is held open but never driven, until every survivor
                    // is done.
                    release.wait();
                    return None;
                }
                thread::sleep(delay(rank));
                let first = (0..ROUNDS).try_for_each(|_| body(&group));
                let later = group.barrier();
                release.wait();
                Some((rank, first, later))
            })
        })
        .collect();
    threads
        .into_iter()
        .filter_map(|t| t.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
        .collect()
}

/// Checks that every survivor's error, and its later barrier's, blames `stalled` and names it.
fn assert_blames(what: &str, stalled: u32, seen: &[Seen]) {
    for (rank, first, later) in seen {
        for (result, label) in [(first, "its operation"), (later, "the barrier after it")] {
            match result {
                Err(error) if blamed(error) == Some(stalled) => assert!(
                    error.to_string().contains(&format!("rank {stalled}")),
                    "{what}: rank {rank}'s error in {label} does not name rank {stalled}: {error}"
                ),
                other => panic!(
                    "{what}: rank {stalled} stalled, but rank {rank}'s {label} gave {other:?}"
                ),
            }
        }
    }
}

fn force_ring(group: &ProcessGroup) {
    group
        .set_algorithm(CollectiveOp::AllReduce, Algorithm::Ring)
        .expect("the ring runs everywhere");
}

fn no_setup(_: &ProcessGroup) {}

fn ring_all_reduce(group: &ProcessGroup) -> Result<(), CollectiveError> {
    let mut data = vec![1.0f32; 4096];
    group.all_reduce(&mut data, ReduceKind::Sum)
}

/// A broadcast from rank 0 (which some survivors finish), then a small all-reduce (which
/// nobody does) and an all-gather.
fn mixed(group: &ProcessGroup) -> Result<(), CollectiveError> {
    let mut data = vec![0.5f32; 64];
    group.broadcast(0, &mut data)?;
    let mut small = [group.rank() as i64; 2];
    group.all_reduce(&mut small, ReduceKind::Max)?;
    group.all_gather(&[1.0f32; 8]).map(|_| ())
}

/// Runs `scenario` for every stalled rank of every world size at once per world size (the
/// worlds are independent) and checks the blame.
fn every_rank_stalled_in_turn(
    what: &str,
    setup: fn(&ProcessGroup),
    staggered: bool,
    body: fn(&ProcessGroup) -> Result<(), CollectiveError>,
) {
    for n in 2..=5u32 {
        let worlds: Vec<_> = (0..n)
            .map(|stalled| {
                thread::spawn(move || {
                    // In a ring rank r waits on rank r - 1: the survivor furthest down the
                    // chain from the stalled rank enters first and so times out first.
                    let delay = move |rank: u32| {
                        let distance = (rank + n - stalled) % n;
                        if staggered {
                            STAGGER * (n - 1 - distance)
                        } else {
                            Duration::ZERO
                        }
                    };
                    (stalled, stall_world(n, stalled, setup, delay, body))
                })
            })
            .collect();
        for world in worlds {
            let (stalled, seen) = world
                .join()
                .unwrap_or_else(|p| std::panic::resume_unwind(p));
            assert_eq!(seen.len(), (n - 1) as usize);
            assert_blames(
                &format!("{what}, world {n}, rank {stalled} stalled"),
                stalled,
                &seen,
            );
        }
    }
}

/// The ranks down the ring from the stalled one time out first, each waiting on a neighbour
/// that is itself waiting: they must still name the stalled rank.
#[test]
fn a_stalled_rank_is_blamed_by_every_survivor_of_a_ring() {
    every_rank_stalled_in_turn("ring all_reduce", force_ring, true, ring_all_reduce);
}

#[test]
fn a_stalled_rank_is_blamed_by_every_survivor_of_mixed_collectives() {
    every_rank_stalled_in_turn("mixed collectives", no_setup, false, mixed);
}

/// Ranks blocked in point-to-point receives are part of the chain too: rank r waits on
/// rank r + 1 and the last rank is stalled; rank 0 starts first and times out first.
#[test]
fn point_to_point_receives_are_part_of_the_chain() {
    for n in 2..=4u32 {
        let seen = stall_world(
            n,
            n - 1,
            no_setup,
            |rank| STAGGER * rank,
            |group| group.recv_f32(group.rank() + 1, 5).map(|_| ()),
        );
        assert_blames(&format!("recv, world {n}"), n - 1, &seen);
    }
}

/// Bytes that are not a probe, under the probe phase, are a protocol error of their sender,
/// never a panic: the group then fails naming it.
#[test]
fn a_malformed_probe_is_a_protocol_error() {
    let groups = common::world_with_timeout(2, OP_TIMEOUT);
    let transport = Arc::clone(groups[1].transport());
    // The probe phase of the world group, sequence number 0 (see the wait_chain module).
    let probe = rlx_collective::Tag::op(rlx_collective::WORLD_GROUP_ID, 0, u16::MAX - 1);
    transport
        .send_message(0, probe, &[b"not a probe"])
        .expect("rank 0 is there");
    let mut x = [1.0f32; 4];
    let result = groups[0].all_reduce(&mut x, ReduceKind::Sum);
    assert!(
        matches!(result, Err(CollectiveError::Protocol { peer: Some(1), .. })),
        "{result:?}"
    );
    drop(transport);
}

/// How a survivor gets stuck mid-message behind the stalled rank in
/// [`a_rank_stuck_sending_to_the_stalled_rank_is_not_blamed`].
#[cfg(feature = "tcp")]
#[derive(Clone, Copy, Debug)]
enum StuckSend {
    /// A point-to-point send.
    Send,
    /// An exchange whose send goes to the stalled rank and whose receive comes from another.
    Exchange,
}

/// Over TCP a send blocks once the socket buffers on the way are full: rank 0 sends rank 1
/// (which never calls into its group, and buffers at most 1 MiB it was not asked for) 2 MiB,
/// then a message larger than every socket buffer, then rank 2 the message rank 2 waits for. Rank 2 times out waiting on rank 0 and
/// probes it; rank 0, stuck inside the transport mid-message, must still answer (it waits on
/// rank 1), so that both survivors name rank 1.
#[cfg(feature = "tcp")]
#[test]
fn a_rank_stuck_sending_to_the_stalled_rank_is_not_blamed() {
    const BIG: usize = 64 << 20;
    for how in [StuckSend::Send, StuckSend::Exchange] {
        let world = common::tcp_world(3, common::free_port(), |rank, n, port| {
            common::loopback_builder(rank, n, port, OP_TIMEOUT).max_unexpected_bytes(1 << 20)
        });
        let release = Arc::new(Barrier::new(3));
        let ranks: Vec<_> = world
            .into_iter()
            .map(|group| {
                let release = Arc::clone(&release);
                thread::spawn(move || {
                    // A message rank 1 was not asked for, larger than its budget, lands there
                    // whole; once it is held, rank 1 reads nothing more from rank 0.
                    let filled = match group.rank() {
                        0 => group.send_f32(1, 4, &vec![0.5; 2 << 18]),
                        _ => Ok(()),
                    };
                    // Rank 0 starts its stuck send well after rank 2 starts waiting, so that
                    // rank 2 times out and probes while the send is still stuck rather than
                    // when rank 0 has timed out too (and answers from its own walk).
                    if group.rank() == 0 {
                        thread::sleep(OP_TIMEOUT * 6 / 10);
                    }
                    let result = match (group.rank(), how) {
                        _ if filled.is_err() => Some(filled),
                        (1, _) => None,
                        (0, StuckSend::Send) => Some(
                            group
                                .send_f32(1, 5, &vec![1.0; BIG / 4])
                                .and_then(|()| group.send_f32(2, 6, &[2.0])),
                        ),
                        (0, StuckSend::Exchange) => {
                            let mut incoming = [0.0f32; 1];
                            Some(
                                group
                                    .send_recv(1, &vec![1.0f32; BIG / 4], 2, &mut incoming, 5)
                                    .map(|_| ()),
                            )
                        }
                        (_, StuckSend::Send) => Some(group.recv_f32(0, 6).map(|_| ())),
                        (_, StuckSend::Exchange) => Some(
                            // Rank 0's receive from rank 2 lands; its answer never comes.
                            group
                                .send_f32(0, 5, &[3.0])
                                .and_then(|()| group.recv_f32(0, 6).map(|_| ())),
                        ),
                    };
                    release.wait();
                    result.map(|r| (group.rank(), r))
                })
            })
            .collect();
        for rank in ranks {
            let Some((rank, result)) = rank.join().expect("a rank thread") else {
                continue;
            };
            // Rank 0's own send to rank 1 times out mid-message, which ends that link.
            let lost_one = |error: &CollectiveError| {
                matches!(error, CollectiveError::PeerLost { peer: 1, .. })
            };
            match &result {
                Err(error) if blamed(error) == Some(1) || (rank == 0 && lost_one(error)) => {}
                other => panic!("{how:?}: rank 1 stalled, but rank {rank} gave {other:?}"),
            }
        }
    }
}
