//! `ProcessGroup::grow`: after a shrink from 4 ranks to 3, a new process joins with the job's
//! rendezvous information and the 4-rank group's collectives are exact; the members keep
//! their ranks and the joiner takes the next one. Over `MemTransport` (a joiner thread) and
//! over `TcpTransport` on loopback (a joiner that reaches the job at its rendezvous address,
//! including after the original rank 0, the rendezvous host, was lost); a joiner with the
//! wrong job secret is refused and the group is undisturbed.

mod common;

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use common::checked::{plan, run_checked};
use rlx_collective::{CollectiveError, MemTransport, ProcessGroup, ReduceKind, Transport};

/// Operation timeout of the worlds here.
const OP_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the members wait for their joiner.
const JOIN_WAIT: Duration = Duration::from_secs(60);

/// What every rank of the grown world does: 50 checked collectives, then its rank and the
/// world rank of every member.
fn exercise(group: &ProcessGroup, seed: u64) -> (u32, u32) {
    for (step, (op, len)) in plan(seed, 50).into_iter().enumerate() {
        run_checked(group, op, step as u64, len)
            .unwrap_or_else(|e| panic!("rank {}: {op} step {step}: {e}", group.rank()));
    }
    (group.rank(), group.world_size())
}

/// Members of a 4-rank world lose `victim`, shrink, and grow by one; returns the grown
/// world's (rank, size) of every survivor, in old rank order.
fn survive_and_grow(groups: Vec<ProcessGroup>, victim: u32, seed: u64) -> Vec<Option<(u32, u32)>> {
    common::on_each(groups, move |group| {
        if group.rank() == victim {
            group.transport().abort();
            return None;
        }
        let mut x = [1.0f32];
        let error = group
            .all_reduce(&mut x, ReduceKind::Sum)
            .expect_err("the victim is gone");
        assert!(error.is_fatal(), "{error}");
        let shrunk = group.shrink().expect("a shrink");
        assert_eq!(shrunk.world_size(), 3);
        let grown = shrunk.grow(1, JOIN_WAIT).expect("a grow");
        assert_eq!(grown.rank(), shrunk.rank(), "a member kept its rank");
        Some(exercise(&grown, seed))
    })
}

#[test]
fn mem_a_joiner_restores_a_shrunk_world_of_four() {
    for victim in [0, 2] {
        let transports = MemTransport::fan_out_with_timeout(4, OP_TIMEOUT);
        let joiner = transports[1].joiner();
        let newcomer = thread::spawn(move || {
            let transport = joiner.join(JOIN_WAIT).expect("admitted");
            let group = ProcessGroup::joined(transport).expect("the grown world");
            exercise(&group, 9)
        });
        let groups = transports
            .into_iter()
            .map(|t| ProcessGroup::new(t as Arc<dyn Transport>))
            .collect();
        let members = survive_and_grow(groups, victim, 9);
        let mut ranks: Vec<(u32, u32)> = members.into_iter().flatten().collect();
        ranks.push(newcomer.join().expect("the joiner thread"));
        ranks.sort_unstable();
        assert_eq!(ranks, [(0, 4), (1, 4), (2, 4), (3, 4)], "victim {victim}");
    }
}

#[test]
fn mem_grow_times_out_on_every_member_when_nobody_joins() {
    let results = common::on_each(common::world_with_timeout(3, OP_TIMEOUT), |group| {
        group.grow(1, Duration::from_millis(200)).map(|_| ())
    });
    for (rank, result) in results.into_iter().enumerate() {
        match result {
            Err(CollectiveError::Timeout { .. }) if rank == 0 => {}
            Err(CollectiveError::PeerFailed { peer: 0, detail }) if rank != 0 => {
                assert!(detail.contains("grow"), "{detail}");
            }
            other => panic!("rank {rank}: {other:?}"),
        }
    }
}

#[test]
fn federated_rounds_go_on_across_shrink_and_grow() {
    let transports = MemTransport::fan_out_with_timeout(4, OP_TIMEOUT);
    let joiner = transports[0].joiner();
    let newcomer = thread::spawn(move || {
        let group = ProcessGroup::joined(joiner.join(JOIN_WAIT).expect("admitted"))
            .expect("the grown world");
        let mut model = vec![100.0f32; 4];
        group
            .federated_average(&mut model, Duration::from_secs(30))
            .expect("a round");
        model
    });
    let groups = transports
        .into_iter()
        .map(|t| ProcessGroup::new(t as Arc<dyn Transport>))
        .collect();
    let results = common::on_each(groups, |group| {
        let me = group.rank();
        let mut model = vec![me as f32; 4];
        if me == 3 {
            // A client that contributes to round 0, then leaves.
            let _ = group.federated_average(&mut model, Duration::from_secs(30));
            group.transport().abort();
            return None;
        }
        group
            .federated_average(&mut model, Duration::from_secs(30))
            .expect("round 0 with every client");
        let mut x = [1.0f32];
        let _ = group.all_reduce(&mut x, ReduceKind::Sum);
        let shrunk = group.shrink().expect("a shrink");
        let mut model = vec![shrunk.rank() as f32 * 3.0; 4];
        shrunk
            .federated_average(&mut model, Duration::from_secs(30))
            .expect("a round of the survivors");
        let survivors_round = model[0];
        let grown = shrunk.grow(1, JOIN_WAIT).expect("a grow");
        let mut model = vec![grown.rank() as f32; 4];
        grown
            .federated_average(&mut model, Duration::from_secs(30))
            .expect("a round with the joiner");
        Some((survivors_round, model))
    });
    for result in results.into_iter().flatten() {
        // Survivors 0, 1, 2 contribute 0, 3, 6: mean 3.
        assert_eq!(result.0, 3.0);
        // Grown ranks 0, 1, 2 contribute 0, 1, 2 and the joiner 100: mean 25.75.
        assert_eq!(result.1, vec![25.75; 4]);
    }
    assert_eq!(newcomer.join().expect("the joiner"), vec![25.75; 4]);
}

#[cfg(feature = "tcp")]
mod tcp {
    use super::*;
    use rlx_net::{TcpTransport, TcpTransportBuilder};

    fn builder(port: u16, secret: &str) -> TcpTransportBuilder {
        TcpTransport::builder()
            .master("127.0.0.1", port)
            .op_timeout(OP_TIMEOUT)
            .connect_timeout(JOIN_WAIT)
            .job_secret(secret.as_bytes().to_vec())
    }

    #[test]
    fn tcp_a_joiner_restores_a_shrunk_world_of_four_even_without_rank_0() {
        for victim in [2, 0] {
            let port = common::free_port();
            let groups = common::tcp_world(4, port, |rank, n, port| {
                builder(port, "s3cret").rank(rank).world_size(n)
            });
            // A stranger with the wrong secret comes first: it is refused, and the members
            // go on waiting for the real joiner, who comes after it.
            let newcomer = thread::spawn(move || {
                match builder(port, "wrong").join() {
                    Err(CollectiveError::Config { what }) => {
                        assert!(what.contains("secret"), "{what}");
                    }
                    other => panic!("the stranger was not refused: {other:?}"),
                }
                let transport = builder(port, "s3cret").join().expect("admitted");
                let group = ProcessGroup::joined(Arc::new(transport)).expect("the grown world");
                exercise(&group, 5)
            });
            let members = survive_and_grow(groups, victim, 5);
            let mut ranks: Vec<(u32, u32)> = members.into_iter().flatten().collect();
            ranks.push(newcomer.join().expect("the joiner thread"));
            ranks.sort_unstable();
            assert_eq!(ranks, [(0, 4), (1, 4), (2, 4), (3, 4)], "victim {victim}");
        }
    }
}
