//! `ProcessGroup::shrink`: after ranks die at random points of random collectives, every
//! survivor's shrink returns the same group of the survivors, and the collectives that follow
//! on it are exact. Checked over `MemTransport` and over `TcpTransport` on loopback (threads
//! here; separate processes, SIGKILL and SIGSTOP in `shrink_processes.rs` and in
//! `cargo xtask test-cluster --kill R@OP --shrink`), plus every single-crash point of the
//! agreement itself, enumerated.

mod common;

use common::checked::{Rng, plan, run_checked};
use common::hooked::Hooked;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use rlx_collective::{
    CollectiveError, FatalCause, MemTransport, ProcessGroup, ReduceKind, Tag, Transport,
};

/// Operation timeout of the worlds here: a hang shows up as this long a wait.
const OP_TIMEOUT: Duration = Duration::from_secs(60);

/// What one rank of a trial saw.
#[derive(Debug)]
enum Outcome {
    /// A victim: it went away.
    Died,
    /// A survivor: the members of its new group, and when it had the group.
    Shrunk { members: Vec<u32>, at: Instant },
}

/// One trial: every rank runs `plan`; each victim aborts its transport from a second thread
/// a random few hundred microseconds into step `kill_at`, the survivors fail, shrink, and run
/// `after` more checked collectives on the new group. Returns each rank's outcome and when
/// the last victim went.
fn trial(
    groups: Vec<ProcessGroup>,
    victims: &[u32],
    seed: u64,
    after: usize,
) -> (Vec<Outcome>, Instant) {
    let steps = plan(seed, 12);
    let mut rng = Rng::seeded(seed ^ 0xA5A5);
    let kill_at = rng.below(8) as usize;
    let delay = Duration::from_micros(rng.below(400));
    let killed_at = Arc::new(Mutex::new(None::<Instant>));
    let outcomes = common::on_each(groups, {
        let victims = victims.to_vec();
        let killed_at = Arc::clone(&killed_at);
        move |group| {
            let me = group.rank();
            let victim = victims.contains(&me);
            for (step, &(op, len)) in steps.iter().enumerate() {
                if victim && step == kill_at {
                    let transport = Arc::clone(group.transport());
                    let killed_at = Arc::clone(&killed_at);
                    thread::spawn(move || {
                        thread::sleep(delay);
                        *killed_at.lock().unwrap() = Some(Instant::now());
                        transport.abort();
                    });
                }
                if let Err(error) = run_checked(&group, op, step as u64, len) {
                    if victim {
                        return Outcome::Died;
                    }
                    assert!(error.is_fatal(), "rank {me} step {step} {op}: {error}");
                    break;
                }
            }
            if victim {
                // The abort may land after the victim finished its steps: it is gone either way.
                thread::sleep(delay + Duration::from_millis(5));
                return Outcome::Died;
            }
            // A survivor that finished every step before the failure reached it meets it here.
            let _ = group.barrier();
            let shrunk = group
                .shrink()
                .unwrap_or_else(|e| panic!("rank {me}: shrink failed: {e}"));
            let at = Instant::now();
            let members = shrunk.members().to_vec();
            for (step, (op, len)) in plan(seed.wrapping_add(1), after).into_iter().enumerate() {
                run_checked(&shrunk, op, step as u64, len).unwrap_or_else(|e| {
                    panic!("rank {me}: {op} step {step} on the shrunk group: {e}")
                });
            }
            Outcome::Shrunk { members, at }
        }
    });
    let killed = killed_at.lock().unwrap().unwrap_or_else(Instant::now);
    (outcomes, killed)
}

/// Checks a trial: every survivor holds the same group, of exactly the survivors; returns the
/// time from the kill to the last survivor holding it.
fn check_trial(outcomes: &[Outcome], victims: &[u32], killed: Instant, what: &str) -> Duration {
    let n = outcomes.len() as u32;
    let survivors: Vec<u32> = (0..n).filter(|r| !victims.contains(r)).collect();
    let mut latest = killed;
    for (rank, outcome) in outcomes.iter().enumerate() {
        match outcome {
            Outcome::Died => assert!(victims.contains(&(rank as u32)), "{what}: rank {rank} died"),
            Outcome::Shrunk { members, at } => {
                assert_eq!(members, &survivors, "{what}: rank {rank}'s new group");
                latest = latest.max(*at);
            }
        }
    }
    latest - killed
}

fn mem_world(n: u32) -> Vec<ProcessGroup> {
    common::world_with_timeout(n, OP_TIMEOUT)
}

/// Median and maximum of `times`.
fn summary(times: &mut [Duration]) -> (Duration, Duration) {
    times.sort_unstable();
    (times[times.len() / 2], times[times.len() - 1])
}

fn kill_trials(
    world: impl Fn(u32) -> Vec<ProcessGroup>,
    n: u32,
    kills: u32,
    trials: u64,
    what: &str,
) {
    let mut times = Vec::new();
    for seed in 0..trials {
        let mut rng = Rng::seeded(seed.wrapping_mul(31).wrapping_add(u64::from(n)));
        let mut victims = Vec::new();
        while victims.len() < kills as usize {
            let v = rng.below(u64::from(n)) as u32;
            if !victims.contains(&v) {
                victims.push(v);
            }
        }
        let label = format!("{what}, world {n}, victims {victims:?}, seed {seed}");
        let (outcomes, killed) = trial(world(n), &victims, seed, 100);
        times.push(check_trial(&outcomes, &victims, killed, &label));
    }
    let (median, max) = summary(&mut times);
    eprintln!(
        "{what}: world {n}, {kills} killed, {trials} trials: kill to new group median {median:?}, max {max:?}"
    );
}

#[test]
fn mem_kill_one_of_four_at_random_points_100_trials() {
    kill_trials(mem_world, 4, 1, 100, "mem");
}

#[test]
fn mem_kill_two_of_eight() {
    kill_trials(mem_world, 8, 2, 20, "mem");
}

#[test]
fn mem_kill_rank_zero_in_every_world_size() {
    for n in 2..=8 {
        let (outcomes, killed) = trial(mem_world(n), &[0], u64::from(n), 20);
        check_trial(
            &outcomes,
            &[0],
            killed,
            &format!("mem, world {n}, rank 0 killed"),
        );
    }
}

#[test]
fn shrink_of_a_healthy_group_keeps_every_member_and_a_new_id() {
    for n in 1..=8 {
        let results = common::on_each(mem_world(n), |group| {
            let shrunk = group.shrink().expect("a healthy shrink");
            let mut x = vec![1.0f32; 5];
            shrunk
                .all_reduce(&mut x, ReduceKind::Sum)
                .expect("an all-reduce");
            (
                group.group_id(),
                shrunk.group_id(),
                shrunk.members().to_vec(),
                x,
            )
        });
        for (old, new, members, x) in &results {
            assert_ne!(old, new, "world {n}: the new group reuses the old id");
            assert_eq!(*new, results[0].1, "world {n}: ids differ across ranks");
            assert_eq!(members, &(0..n).collect::<Vec<_>>(), "world {n}");
            assert_eq!(x, &vec![n as f32; 5], "world {n}");
        }
    }
}

#[test]
fn shrinking_twice_loses_a_second_rank() {
    let results = common::on_each(mem_world(5), |group| {
        let me = group.rank();
        if me == 4 {
            group.transport().abort();
            return None;
        }
        let _ = group.barrier();
        let once = group.shrink().expect("the first shrink");
        if me == 1 {
            once.transport().abort();
            return None;
        }
        let _ = once.barrier();
        let twice = once.shrink().expect("the second shrink");
        let mut x = [f32::from(u8::try_from(me).unwrap())];
        twice
            .all_reduce(&mut x, ReduceKind::Sum)
            .expect("an all-reduce");
        Some((twice.members().to_vec(), x[0]))
    });
    for result in results.into_iter().flatten() {
        assert_eq!(result, (vec![0, 2, 3], 5.0));
    }
}

/// Every single crash of the agreement: in worlds of 2 to 5 ranks, one rank (each in turn)
/// dies at its k-th send of a shrink (each k up to more sends than a shrink makes, so the
/// last cases are crash-free), while another rank was already lost before it. Every survivor
/// must end the shrink, and all of them with the same group; a group that still holds the
/// rank that died during the shrink fails its next operation, and a second shrink then
/// removes it.
#[test]
fn every_single_crash_point_of_the_agreement_leaves_one_agreed_group() {
    for n in 3..=5u32 {
        for dying in 0..n {
            for lost_before in [None, Some((dying + 1) % n)] {
                for k in 1..=(2 * n as u64 + 2) {
                    crash_case(n, dying, lost_before, k);
                }
            }
        }
    }
}

fn crash_case(n: u32, dying: u32, lost_before: Option<u32>, k: u64) {
    let what = format!("world {n}, rank {dying} dies at send {k}, lost before: {lost_before:?}");
    let groups: Vec<ProcessGroup> = MemTransport::fan_out_with_timeout(n, OP_TIMEOUT)
        .into_iter()
        .map(|t| {
            // Dies (aborts) on its `die_after`-th send, counting from its creation: the
            // single-crash points of an agreement, one per send.
            let die_after = if t.rank() == dying { k } else { u64::MAX };
            let sends = AtomicU64::new(0);
            let inner = Arc::clone(&t);
            ProcessGroup::new(Arc::new(Hooked::new(t).before_send(move |_| {
                if sends.fetch_add(1, Ordering::SeqCst) + 1 >= die_after {
                    inner.abort();
                    return Err(CollectiveError::Aborted);
                }
                Ok(())
            })) as Arc<dyn Transport>)
        })
        .collect();
    let results = common::on_each(groups, move |group| {
        let me = group.rank();
        if Some(me) == lost_before {
            group.transport().abort();
            return None;
        }
        let shrunk = match group.shrink() {
            Ok(shrunk) => shrunk,
            Err(error) => {
                assert_eq!(me, dying, "a survivor's shrink failed: {error}");
                return None;
            }
        };
        if me == dying {
            // It may have finished its part before its crash point: it is gone now anyway.
            shrunk.transport().abort();
            return None;
        }
        let first = shrunk.members().to_vec();
        let mut x = [1.0f32];
        let group = match shrunk.all_reduce(&mut x, ReduceKind::Sum) {
            Ok(()) => shrunk,
            Err(error) => {
                assert!(error.is_fatal(), "{error}");
                assert!(
                    first.contains(&dying),
                    "a group without the dead rank failed: {error}"
                );
                let _ = shrunk.barrier();
                let again = shrunk.shrink().expect("a second shrink");
                x = [1.0];
                again
                    .all_reduce(&mut x, ReduceKind::Sum)
                    .expect("an all-reduce");
                again
            }
        };
        assert_eq!(x[0], group.world_size() as f32);
        Some((first, group.members().to_vec()))
    });
    let survivors: Vec<u32> = (0..n)
        .filter(|&r| r != dying && Some(r) != lost_before)
        .collect();
    let held: Vec<_> = results.into_iter().flatten().collect();
    assert_eq!(held.len(), survivors.len(), "{what}");
    for (first, last) in &held {
        assert_eq!(
            first, &held[0].0,
            "{what}: survivors left the first shrink with different groups"
        );
        assert_eq!(last, &survivors, "{what}: the final group");
    }
}

/// A rank that stops answering (a stalled process) is declared dead after the operation
/// timeout; when it wakes up it fails with an error naming itself as excluded, and nothing it
/// sends reaches the survivors' new group.
///
/// The order is arranged, not timed: the stalled rank waits on a channel (it is silent to
/// the others, as a stopped process is) until every survivor has its new group, and the
/// survivors look for its message and run their new group's all-reduce only once it has
/// tried everything. Only the survivors' failed all-reduce and their shrink have to wait
/// out the silent rank, so only they run with a short timeout; the survivors switch to a
/// long one as soon as they have their new group.
#[test]
fn a_stalled_rank_that_wakes_up_is_excluded_and_cannot_reach_the_new_group() {
    /// How long the survivors wait for the silent rank before they declare it dead. It is
    /// also how late a survivor may be to the shrink before it is taken for dead itself, so
    /// it is well above what a loaded machine delays a thread.
    const SILENCE: Duration = Duration::from_secs(2);
    let timeouts: Vec<Arc<Mutex<Duration>>> =
        (0..4).map(|_| Arc::new(Mutex::new(SILENCE))).collect();
    let groups: Vec<ProcessGroup> = MemTransport::fan_out_with_timeout(4, SILENCE)
        .into_iter()
        .zip(&timeouts)
        .map(|(inner, timeout)| {
            // The survivors need a short timeout to declare the silent rank dead, and a long
            // one afterwards, so that no healthy operation of theirs can time out on a
            // loaded machine: the test changes it while they run.
            ProcessGroup::new(
                Arc::new(Hooked::new(inner).op_timeout(Arc::clone(timeout))) as Arc<dyn Transport>
            )
        })
        .collect();
    // Each survivor sends its rank once it has its new group; the stalled rank sends one
    // message per survivor once it has tried everything.
    let (shrunk_tx, shrunk_rx) = mpsc::channel::<u32>();
    let (tried_tx, tried_rx) = mpsc::channel::<()>();
    let (shrunk_rx, tried_rx) = (Mutex::new(shrunk_rx), Mutex::new(tried_rx));
    let results = common::on_each(groups, move |group| {
        let me = group.rank();
        if me == 2 {
            // Stalled through the survivors' failure and shrink.
            for _ in 0..3 {
                let survivor = shrunk_rx.lock().unwrap().recv_timeout(OP_TIMEOUT);
                assert!(survivor.is_ok(), "a survivor never finished its shrink");
            }
            let mut x = [1.0f32];
            let late = group.all_reduce(&mut x, ReduceKind::Sum);
            let shrink = group.shrink();
            // Whatever it tries to send to a survivor goes nowhere.
            let sent = group.send(0, 5, &[9.0f32]);
            for _ in 0..3 {
                tried_tx.send(()).unwrap();
            }
            return Err(Box::new((late.err(), shrink.err(), sent.err())));
        }
        let mut x = [1.0f32];
        let error = group
            .all_reduce(&mut x, ReduceKind::Sum)
            .expect_err("rank 2 is silent");
        assert!(error.is_fatal(), "{error}");
        let shrunk = group.shrink().expect("the survivors' shrink");
        // The silent rank is out: nothing from here on should wait on a short timeout.
        *timeouts[me as usize].lock().unwrap() = OP_TIMEOUT;
        shrunk_tx.send(me).unwrap();
        let woke = tried_rx.lock().unwrap().recv_timeout(OP_TIMEOUT);
        assert!(woke.is_ok(), "rank 2 never tried to reach the survivors");
        if shrunk.rank() == 0 {
            let stray = group
                .transport()
                .recv_message(2, Tag::user(5).unwrap(), Duration::ZERO);
            assert!(
                !matches!(stray, Ok(Some(_))),
                "rank 2's message arrived: {stray:?}"
            );
        }
        let mut y = [1.0f32; 3];
        shrunk
            .all_reduce(&mut y, ReduceKind::Sum)
            .expect("the new group works");
        Ok((shrunk.members().to_vec(), y))
    });
    for (rank, result) in results.into_iter().enumerate() {
        match result {
            Ok((members, y)) => {
                assert_eq!(members, [0, 1, 3], "rank {rank}");
                assert_eq!(y, [3.0; 3], "rank {rank}");
            }
            Err(stalled) => {
                let (late, shrink, sent) = *stalled;
                assert!(
                    late.is_some_and(|e| e.is_fatal()),
                    "the stalled rank's all-reduce"
                );
                match shrink {
                    Some(CollectiveError::GroupFailed {
                        peer: 2,
                        cause: FatalCause::Excluded,
                        ..
                    }) => {}
                    other => panic!("the stalled rank's shrink: {other:?}"),
                }
                assert!(sent.is_some(), "the stalled rank's send succeeded");
            }
        }
    }
}

#[cfg(feature = "tcp")]
mod tcp {
    use super::*;

    fn tcp_world(n: u32) -> Vec<ProcessGroup> {
        common::tcp_world(n, common::free_port(), |rank, n, port| {
            common::loopback_builder(rank, n, port, OP_TIMEOUT)
        })
    }

    #[test]
    fn tcp_kill_one_of_four_at_random_points_100_trials() {
        kill_trials(tcp_world, 4, 1, 100, "tcp");
    }

    #[test]
    fn tcp_kill_two_of_eight() {
        kill_trials(tcp_world, 8, 2, 10, "tcp");
    }

    #[test]
    fn tcp_kill_rank_zero() {
        for n in [2, 3, 5] {
            let (outcomes, killed) = trial(tcp_world(n), &[0], u64::from(n), 20);
            check_trial(
                &outcomes,
                &[0],
                killed,
                &format!("tcp, world {n}, rank 0 killed"),
            );
        }
    }
}
