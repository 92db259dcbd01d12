//! Blame after a stall: when one rank stops calling into its group (a process stopped with
//! SIGSTOP, or a rank stuck outside the collectives), every other rank fails with an error
//! naming that rank — not the neighbour it happened to wait on, which was itself waiting.
//! Each rank of worlds of 2 to 5 ranks is stalled in turn, over `MemTransport`, and a rank
//! stuck mid-message behind the stalled one is checked over TCP.
//!
//! The order of events is arranged by the operation timeouts, not by sleeps: in each world one
//! survivor, the walker, gives up after [`WALK_TIMEOUT`] and every other rank only after the
//! harness's long timeout. The walker is then the first and only rank to time out, every rank
//! it probes is still waiting and answers within one wait slice of 10 ms (far inside the
//! walker's probe window, a tenth of its timeout), and the other survivors fail through the
//! walker's group-wide notice, which names the rank its walk ended at. Had the walker blamed
//! the neighbour it waited on where that neighbour was only waiting itself, every survivor
//! would name that neighbour.

mod common;

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use common::hooked::Hooked;
use rlx_collective::{
    Algorithm, CollectiveError, CollectiveOp, MemTransport, ProcessGroup, ReduceKind, Tag,
    Transport, WORLD_GROUP_ID,
};

/// Operation timeout of the one survivor of a world that walks the chain of waits. Every other
/// survivor only has to reach its wait within it, which takes milliseconds even on a loaded
/// machine, and the walker's probe window (a tenth of it, 300 ms) is thirty wait slices.
const WALK_TIMEOUT: Duration = Duration::from_secs(3);
/// Operations a survivor runs at most before it must have failed.
const ROUNDS: usize = 3;
/// The phase of the world group's tag space (sequence number 0) that carries wait probes (see
/// the `wait_chain` module).
const PROBE_PHASE: u16 = u16::MAX - 1;

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

/// One world of a scenario: its size, the rank that stalls, and the survivor that walks the
/// chain of waits.
#[derive(Clone, Copy, Debug)]
struct Stall {
    n: u32,
    stalled: u32,
    walker: u32,
}

/// Runs one world in which rank `stall.stalled` never calls into its group while the others
/// run `body` `ROUNDS` times, then a barrier; rank `stall.walker` gives up after
/// [`WALK_TIMEOUT`], the others after the harness's long timeout. Returns every survivor's
/// first error and the barrier's result.
fn stall_world(
    stall: Stall,
    setup: fn(&ProcessGroup),
    body: fn(&ProcessGroup) -> Result<(), CollectiveError>,
) -> Vec<Seen> {
    let Stall { n, stalled, walker } = stall;
    let release = Arc::new(Barrier::new(n as usize));
    let start = Arc::new(Barrier::new(n as usize - 1));
    let threads: Vec<_> = MemTransport::fan_out_with_timeout(n, common::TEST_TIMEOUT)
        .into_iter()
        .map(|inner| {
            let op_timeout = if inner.rank() == walker {
                WALK_TIMEOUT
            } else {
                common::TEST_TIMEOUT
            };
            // An operation timeout of its own, so that the ranks of one world give up at
            // different times.
            let group =
                ProcessGroup::new(Arc::new(Hooked::new(inner).fixed_op_timeout(op_timeout)));
            let release = Arc::clone(&release);
            let start = Arc::clone(&start);
            thread::spawn(move || {
                let rank = group.rank();
                setup(&group);
                if rank == stalled {
                    // Stopped: the group is held open but never driven, until every survivor
                    // is done.
                    release.wait();
                    return None;
                }
                // The survivors start together, so that the walker's timeout runs while every
                // other survivor is on its way into its wait.
                start.wait();
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
                    "{what}: rank {stalled} stalled, but rank {rank} gave {other:?} in {label}"
                ),
            }
        }
    }
}

/// Runs the worlds of `stalls` at once and checks every survivor's blame. The worlds are
/// independent, and their order of events does not depend on how busy the machine is: only
/// the walker's probe window does, with thirty wait slices to spare.
fn check_stalls(
    what: &str,
    stalls: Vec<Stall>,
    setup: fn(&ProcessGroup),
    body: fn(&ProcessGroup) -> Result<(), CollectiveError>,
) {
    let worlds: Vec<_> = stalls
        .into_iter()
        .map(|stall| thread::spawn(move || (stall, stall_world(stall, setup, body))))
        .collect();
    for world in worlds {
        let (stall, seen) = world
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p));
        let Stall { n, stalled, walker } = stall;
        assert_eq!(seen.len(), (n - 1) as usize);
        assert_blames(
            &format!("{what}, world {n}, rank {stalled} stalled, rank {walker} walking"),
            stalled,
            &seen,
        );
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

/// In a ring rank r waits on rank r - 1, so the survivors wait in a chain that ends at the
/// stalled rank. The walker is the survivor at the far end of it (the stalled rank's
/// predecessor), which waits on a rank that is only waiting itself: it must still name the
/// stalled rank, and so must every survivor it tells.
#[test]
fn a_stalled_rank_is_blamed_by_every_survivor_of_a_ring() {
    for n in 2..=5u32 {
        let stalls = (0..n)
            .map(|stalled| Stall {
                n,
                stalled,
                walker: (stalled + n - 1) % n,
            })
            .collect();
        check_stalls("ring all_reduce", stalls, force_ring, ring_all_reduce);
    }
}

/// Here the survivors wait in different operations, and who waits on whom depends on the
/// algorithms chosen: every survivor walks in turn, each in a world of its own, so that every
/// chain of waits is followed once, across operations, whatever its length.
#[test]
fn a_stalled_rank_is_blamed_by_every_survivor_of_mixed_collectives() {
    for n in 2..=5u32 {
        let stalls = (0..n)
            .flat_map(|stalled| {
                (0..n)
                    .filter(move |&walker| walker != stalled)
                    .map(move |walker| Stall { n, stalled, walker })
            })
            .collect();
        check_stalls("mixed collectives", stalls, no_setup, mixed);
    }
}

/// Ranks blocked in point-to-point receives are part of the chain too: rank r waits on
/// rank r + 1 and the last rank is stalled; rank 0, at the far end of the chain, walks it.
#[test]
fn point_to_point_receives_are_part_of_the_chain() {
    let stalls = (2..=4u32)
        .map(|n| Stall {
            n,
            stalled: n - 1,
            walker: 0,
        })
        .collect();
    check_stalls("recv", stalls, no_setup, |group| {
        group.recv_f32(group.rank() + 1, 5).map(|_| ())
    });
}

/// Bytes that are not a probe, under the probe phase, are a protocol error of their sender,
/// never a panic: the group then fails naming it.
#[test]
fn a_malformed_probe_is_a_protocol_error() {
    let groups = common::world(2);
    let transport = Arc::clone(groups[1].transport());
    let probe = Tag::op(WORLD_GROUP_ID, 0, PROBE_PHASE);
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

/// Bytes of the message rank 0 sends the stalled rank 1 first, twice rank 1's budget for
/// messages it was not asked for.
#[cfg(feature = "tcp")]
const FILLER_BYTES: usize = 2 << 20;

/// Waits until rank 0 (whose transport is `sender`) is inside the send that follows its
/// filler, and returns what it answered a probe from rank 2 (`prober`) with; `None` when it
/// did not answer within the harness's long timeout. The filler's send is over once rank 0's
/// traffic counts it (a message counts once it is sent whole). A probe sent after that can only
/// be answered from inside rank 0's next call, and only while it waits: the send stuck behind
/// rank 1, whose hook answers every 10 ms.
#[cfg(feature = "tcp")]
fn answer_from_inside_the_send(prober: &ProcessGroup, sender: &dyn Transport) -> Option<Vec<u8>> {
    /// The phase (sequence number 0) that carries the answers to wait probes.
    const ANSWER_PHASE: u16 = u16::MAX - 2;
    /// A wait probe: its kind, the rank the prober waits on (rank 0, a little-endian `u32`)
    /// and an empty description of its wait.
    const PROBE: [u8; 6] = [1, 0, 0, 0, 0, 0];
    let deadline = std::time::Instant::now() + common::TEST_TIMEOUT;
    while sender.traffic().map_or(0, |t| t.sent_bytes) < FILLER_BYTES as u64 {
        if std::time::Instant::now() >= deadline {
            return None;
        }
        thread::sleep(Duration::from_millis(1));
    }
    let transport = prober.transport();
    transport
        .send_message(0, Tag::op(WORLD_GROUP_ID, 0, PROBE_PHASE), &[&PROBE])
        .ok()?;
    let left = deadline.saturating_duration_since(std::time::Instant::now());
    transport
        .recv_message(0, Tag::op(WORLD_GROUP_ID, 0, ANSWER_PHASE), left)
        .ok()?
}

/// Over TCP a send blocks once the socket buffers on the way are full: rank 0 sends rank 1
/// (which never calls into its group, and buffers at most 1 MiB it was not asked for) 2 MiB,
/// then a message larger than every socket buffer, then rank 2 the message rank 2 waits for.
/// Rank 2 starts that wait only once rank 0 has answered a probe from inside the stuck send,
/// and only rank 2 has a short timeout: it times out waiting on rank 0 and probes it while
/// rank 0 is still stuck (rank 0 would wait a minute), so that the answer comes from the stuck
/// send and not from a walk of rank 0's own. Rank 0 must answer (it waits on rank 1), so that
/// rank 2 names rank 1; rank 1 then leaves, which ends rank 0's send, and rank 0 names rank 1
/// too.
#[cfg(feature = "tcp")]
#[test]
fn a_rank_stuck_sending_to_the_stalled_rank_is_not_blamed() {
    const BIG: usize = 64 << 20;
    /// An answer to a wait probe: its kind, then the world rank the answering rank waits on,
    /// here rank 1 (a little-endian `u32`), then what it waits in, after its length.
    const WAITS_ON_ONE: [u8; 5] = [2, 1, 0, 0, 0];
    const WAITS_IN: &[u8] = b"send(to 1, tag 5)";
    for how in [StuckSend::Send, StuckSend::Exchange] {
        let world = common::tcp_world(3, common::free_port(), |rank, n, port| {
            let op_timeout = if rank == 2 {
                WALK_TIMEOUT
            } else {
                common::TEST_TIMEOUT
            };
            common::loopback_builder(rank, n, port, op_timeout).max_unexpected_bytes(1 << 20)
        });
        let [zero, one, two] = <[ProcessGroup; 3]>::try_from(world).expect("three ranks");
        let sender = Arc::clone(zero.transport());
        // Rank 2's group outlives rank 0's call, so that nothing but rank 1 leaving ends it.
        let two_held = two.clone();
        let stuck = thread::spawn(move || {
            // Allocated first, so that rank 0 goes straight from the filler into the big send.
            let big = vec![1.0f32; BIG / 4];
            // A message rank 1 was not asked for, larger than its budget, lands there whole;
            // once it is held, rank 1 reads nothing more from rank 0.
            zero.send_f32(1, 4, &vec![0.5; FILLER_BYTES / 4])?;
            match how {
                StuckSend::Send => zero
                    .send_f32(1, 5, &big)
                    .and_then(|()| zero.send_f32(2, 6, &[2.0])),
                StuckSend::Exchange => {
                    let mut incoming = [0.0f32; 1];
                    zero.send_recv(1, &big, 2, &mut incoming, 5).map(|_| ())
                }
            }
        });
        let prober = thread::spawn(move || {
            if let StuckSend::Exchange = how {
                // Rank 0's receive from rank 2 lands; its answer never comes.
                if let Err(error) = two.send_f32(0, 5, &[3.0]) {
                    return (None, Err(error));
                }
            }
            let answer = answer_from_inside_the_send(&two, sender.as_ref());
            let result = two.recv_f32(0, 6).map(|_| ());
            (answer, result)
        });
        let (answer, waiting) = prober
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p));
        // Rank 1 leaves, as a stopped process that is then killed does: its links close,
        // which ends rank 0's stuck send (its own timeout is far away).
        drop(one);
        let sending = stuck
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p));
        drop(two_held);
        let expected = [&WAITS_ON_ONE[..], &[WAITS_IN.len() as u8], WAITS_IN].concat();
        assert_eq!(
            answer.as_deref(),
            Some(&expected[..]),
            "{how:?}: rank 0, stuck sending to rank 1, did not answer a probe with rank 1 \
             (rank 0 gave {sending:?})"
        );
        match &waiting {
            Err(error) if blamed(error) == Some(1) => {}
            other => panic!("{how:?}: rank 1 stalled, but rank 2 gave {other:?}"),
        }
        // Rank 0's call ends when rank 1's links close, mid-message: with the loss of rank 1,
        // or with rank 2's notice naming it, whichever rank 0 meets first.
        match &sending {
            Err(error)
                if blamed(error) == Some(1)
                    || matches!(error, CollectiveError::PeerLost { peer: 1, .. }) => {}
            other => panic!("{how:?}: rank 1 stalled, but rank 0 gave {other:?}"),
        }
    }
}
