//! Plans that follow the cables: threads whose transport reports a link matrix of a chain or
//! a ring numbered against the cabling (scrambled, worlds 2 to 8) must ring along the cables,
//! a full mesh must exchange with every peer at once (the direct algorithms), and every
//! collective must still be exact (against the serial reference, every dtype and reduction,
//! with each algorithm, including the rank-order ring and the direct ones), on the world and
//! on a sub-group whose matrix is the world's restricted to it.

mod common;

use std::sync::Arc;

use rlx_collective::conformance::{self, ConformanceOptions, SplitMix};
use rlx_collective::{
    Algorithm, CollectiveOp, Delegate, MemTransport, ProcessGroup, Reach, Topology, Transport,
};

/// A thread rank that reports `topology` as its link matrix.
struct Cabled {
    inner: Arc<MemTransport>,
    topology: Topology,
}

impl Delegate for Cabled {
    fn inner(&self) -> &dyn Transport {
        &*self.inner
    }

    fn topology(&self) -> Option<Topology> {
        Some(self.topology.clone())
    }
}

/// The link matrix of ranks joined by a cable for each pair of `cables`, and by nothing else.
fn cabled(n: u32, cables: &[(u32, u32)]) -> Topology {
    Topology::from_cables(n, cables, false)
}

/// The link matrix of `n` ranks with a cable between every pair.
fn mesh(n: u32) -> Topology {
    let cables: Vec<(u32, u32)> = (0..n)
        .flat_map(|a| (a + 1..n).map(move |b| (a, b)))
        .collect();
    cabled(n, &cables)
}

/// The ranks 0..n in an order drawn from `seed`.
fn scrambled(n: u32, seed: u64) -> Vec<u32> {
    let mut rng = SplitMix::seeded(seed);
    let mut ranks: Vec<u32> = (0..n).collect();
    for i in (1..ranks.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        ranks.swap(i, j);
    }
    ranks
}

/// The groups of a thread world of `n` ranks whose transports report `topology`.
fn world(n: u32, topology: &Topology) -> Vec<ProcessGroup> {
    MemTransport::fan_out(n)
        .into_iter()
        .map(|inner| {
            let cabled = Cabled {
                inner,
                topology: topology.clone(),
            };
            ProcessGroup::new(Arc::new(cabled) as Arc<dyn Transport>)
        })
        .collect()
}

/// How many hops of `group`'s rings cross another machine.
fn routed_hops(group: &ProcessGroup) -> usize {
    let topology = group.topology().expect("a link matrix");
    topology.routed_hops(group.ring_order()).len()
}

fn options(seed: u64) -> ConformanceOptions {
    ConformanceOptions {
        ops: vec![
            CollectiveOp::AllReduce,
            CollectiveOp::ReduceScatter,
            CollectiveOp::AllGather,
            CollectiveOp::AllToAll,
            CollectiveOp::Broadcast,
        ],
        sizes: vec![0, 1, 7, 13, 1009],
        max_segment_bytes: Some(256),
        seed,
        ..ConformanceOptions::default()
    }
}

#[test]
fn chains_numbered_against_their_cables_ring_along_them_and_stay_exact() {
    for n in 2..=8u32 {
        let chain = scrambled(n, u64::from(n) * 31);
        let cables: Vec<(u32, u32)> = chain.windows(2).map(|w| (w[0], w[1])).collect();
        let topology = cabled(n, &cables);
        let reports = common::on_each(world(n, &topology), move |group| {
            let routed = routed_hops(&group);
            let order = group.ring_order().to_vec();
            let planned = group.planned_algorithm(CollectiveOp::AllReduce, 1 << 20);
            (
                routed,
                order,
                planned,
                conformance::run(&group, &options(u64::from(n))),
            )
        });
        for (rank, (routed, order, planned, report)) in reports.into_iter().enumerate() {
            let line = if n >= 3 {
                Algorithm::BidirectionalChain
            } else {
                Algorithm::Ring
            };
            assert_eq!(planned, line, "{n} ranks cabled {chain:?}");
            // A chain's ring crosses the other machines once, on the hop that closes it.
            assert!(routed <= 1, "{n} ranks cabled {chain:?}: ring {order:?}");
            let report = report.unwrap_or_else(|e| panic!("{n} ranks, rank {rank}: {e}"));
            assert!(
                report.passed(),
                "{n} ranks cabled {chain:?}: {}",
                report.summary()
            );
            for forced in [Algorithm::RankOrderRing, Algorithm::BidirectionalChain] {
                let cases = report
                    .cases()
                    .iter()
                    .filter(|c| c.name.ends_with(forced.name()))
                    .count();
                // Two ranks have one cable whatever the plan: no line to run along.
                let expected = forced != Algorithm::BidirectionalChain || n >= 3;
                assert_eq!(cases > 0, expected, "{n} ranks: cases forcing {forced}");
            }
        }
    }
}

#[test]
fn a_sub_group_rings_along_the_cables_among_its_members() {
    // Six ranks cabled in a ring 0-3-1-4-2-5-0; the sub-group of the even ranks {0, 2, 4}
    // has cables 2-4 only among itself (group ranks 1-2), so its ring starts 0-1-2 or
    // 0-2-1 and crosses others on two hops at most.
    let ring = [0u32, 3, 1, 4, 2, 5];
    let cables: Vec<(u32, u32)> = (0..6).map(|i| (ring[i], ring[(i + 1) % 6])).collect();
    let topology = cabled(6, &cables);
    let reports = common::on_each(world(6, &topology), |group| {
        assert_eq!(routed_hops(&group), 0, "ring {:?}", group.ring_order());
        let color = (group.rank() % 2 == 0).then_some(0);
        let sub = group.split(color, group.rank() as i32)?;
        let Some(sub) = sub else {
            return Ok(None);
        };
        let sub_topology = sub.topology().expect("the sub-group's matrix");
        assert_eq!(sub_topology.size(), 3);
        assert_eq!(
            sub_topology.reach(1, 2),
            Reach::Cable,
            "world ranks 2 and 4"
        );
        conformance::run(&sub, &options(66)).map(Some)
    });
    for report in reports.into_iter().flatten().flatten() {
        assert!(report.passed(), "{}", report.summary());
    }
}

#[test]
fn a_full_mesh_exchanges_with_every_peer_at_once_and_stays_exact() {
    for n in 3..=6u32 {
        let topology = mesh(n);
        let reports = common::on_each(world(n, &topology), move |group| {
            let report = conformance::run(&group, &options(u64::from(n) + 100));
            // Past the small sizes, `Auto` picks the direct all-reduce.
            let mut data = vec![1.0f32; 1 << 16];
            group.all_reduce(&mut data, rlx_collective::ReduceKind::Sum)?;
            assert!(data.iter().all(|&x| x == n as f32));
            let all_reduce = group.flight_record().pop().expect("the all-reduce's entry");
            let sent = vec![1i32; n as usize * 16384];
            let received = group.all_to_all(&sent)?;
            assert!(received.iter().all(|&x| x == 1));
            let all_to_all = group.flight_record().pop().expect("the all-to-all's entry");
            let mine =
                group.reduce_scatter(&vec![2.0f32; 1 << 16], rlx_collective::ReduceKind::Sum)?;
            assert!(mine.iter().all(|&x| x == 2.0 * n as f32));
            let reduce_scatter = group
                .flight_record()
                .pop()
                .expect("the reduce-scatter's entry");
            let mut hidden = vec![group.rank() as f32; 1 << 16];
            group.broadcast(1, &mut hidden)?;
            assert!(hidden.iter().all(|&x| x == 1.0));
            let broadcast = group.flight_record().pop().expect("the broadcast's entry");
            Ok::<_, rlx_collective::CollectiveError>((
                report?,
                [
                    all_reduce.algorithm,
                    all_to_all.algorithm,
                    reduce_scatter.algorithm,
                    broadcast.algorithm,
                ],
            ))
        });
        for (rank, outcome) in reports.into_iter().enumerate() {
            let (report, algorithms) =
                outcome.unwrap_or_else(|e| panic!("{n} ranks, rank {rank}: {e}"));
            assert!(report.passed(), "{n}-rank mesh: {}", report.summary());
            let direct = Some(Algorithm::Direct.name());
            assert_eq!(algorithms, [direct; 4], "{n}-rank mesh");
        }
    }
}

#[test]
fn a_rank_that_leaves_a_direct_all_reduce_is_named_by_every_other() {
    let n = 4;
    let topology = mesh(n);
    let outcomes = common::on_each(world(n, &topology), move |group| {
        if group.rank() == 3 {
            group.abort();
            return None;
        }
        let mut data = vec![1.0f32; 1 << 18];
        Some(
            group
                .all_reduce(&mut data, rlx_collective::ReduceKind::Sum)
                .map(|()| data.iter().all(|&x| x == n as f32)),
        )
    });
    for (rank, outcome) in outcomes.into_iter().enumerate().take(3) {
        match outcome.expect("a survivor's outcome") {
            Ok(exact) => assert!(exact, "rank {rank} finished with a wrong sum"),
            Err(error) => assert!(
                error.to_string().contains("rank 3"),
                "rank {rank} blamed another: {error}"
            ),
        }
    }
}

#[test]
fn a_rank_that_aborts_during_a_direct_all_reduce_is_named_or_the_result_is_exact() {
    // 16 MiB: blocks of 4 MiB, sixteen segments in the reduce-scatter's pipeline.
    let outcomes = all_reduce_while_rank_3_aborts(&mesh(4), 1 << 22);
    for (rank, outcome) in outcomes.into_iter().enumerate().take(3) {
        let error = outcome
            .expect("a survivor's outcome")
            .expect_err("an all-reduce without rank 3");
        assert!(
            error.to_string().contains("rank 3"),
            "rank {rank} blamed another: {error}"
        );
    }
}

/// The outcomes of an all-reduce of `elements` floats (each 1.0) on 4 ranks cabled as
/// `topology`, during which rank 3 aborts from another thread after 2 ms, before, during or
/// after its own part, wherever that thread gets to run: each survivor's result (whether the
/// sum is exact), and `None` for rank 3.
fn all_reduce_while_rank_3_aborts(
    topology: &Topology,
    elements: usize,
) -> Vec<Option<Result<bool, rlx_collective::CollectiveError>>> {
    common::on_each(world(4, topology), move |group| {
        let mut data = vec![1.0f32; elements];
        if group.rank() == 3 {
            let aborter = {
                let group = group.clone();
                std::thread::spawn(move || {
                    std::thread::sleep(std::time::Duration::from_millis(2));
                    group.abort();
                })
            };
            let _ = group.all_reduce(&mut data, rlx_collective::ReduceKind::Sum);
            aborter.join().expect("the aborting thread");
            return None;
        }
        Some(
            group
                .all_reduce(&mut data, rlx_collective::ReduceKind::Sum)
                .map(|()| data.iter().all(|&x| x == 4.0)),
        )
    })
}

/// The link matrix of `m` islands of `k` ranks, each a full mesh of cables, all on one switch;
/// the ranks are dealt to the islands in an order drawn from `seed`. Returns the matrix and
/// the islands' ranks.
fn islands_on_a_switch(m: u32, k: u32, seed: u64) -> (Topology, Vec<Vec<u32>>) {
    let n = m * k;
    let dealt = scrambled(n, seed);
    let islands: Vec<Vec<u32>> = dealt.chunks(k as usize).map(<[u32]>::to_vec).collect();
    let cables: Vec<(u32, u32)> = islands
        .iter()
        .flat_map(|island| {
            island
                .iter()
                .enumerate()
                .flat_map(|(i, &a)| island[i + 1..].iter().map(move |&b| (a, b)))
        })
        .collect();
    (Topology::from_cables(n, &cables, true), islands)
}

#[test]
fn islands_all_reduce_in_two_levels_and_stay_exact() {
    for (m, k) in [(2u32, 2u32), (2, 3), (3, 2), (2, 4), (4, 2)] {
        let n = m * k;
        let (topology, islands) = islands_on_a_switch(m, k, u64::from(n * 7 + m));
        let reports = common::on_each(world(n, &topology), move |group| {
            assert!(group.supports_algorithm(CollectiveOp::AllReduce, Algorithm::TwoLevel));
            let mut options = options(u64::from(n) + 200);
            options.ops = vec![CollectiveOp::AllReduce];
            let report = conformance::run(&group, &options)?;
            // Past the small sizes, `Auto` picks the two levels; 1031 elements leave blocks
            // of different lengths in each island.
            let mut data: Vec<f32> = (0..(1 << 14) + 1031)
                .map(|i| (i % 97) as f32 + group.rank() as f32)
                .collect();
            group.all_reduce(&mut data, rlx_collective::ReduceKind::Sum)?;
            let entry = group.flight_record().pop().expect("the all-reduce's entry");
            Ok::<_, rlx_collective::CollectiveError>((report, entry.algorithm, data))
        });
        let ranks_sum = (n * (n - 1) / 2) as f32;
        for (rank, outcome) in reports.into_iter().enumerate() {
            let (report, algorithm, data) =
                outcome.unwrap_or_else(|e| panic!("islands {islands:?}, rank {rank}: {e}"));
            assert!(report.passed(), "islands {islands:?}: {}", report.summary());
            let two_level = report
                .cases()
                .iter()
                .filter(|c| c.name.ends_with(Algorithm::TwoLevel.name()))
                .count();
            assert!(two_level > 0, "no case forced the two levels");
            assert_eq!(
                algorithm,
                Some(Algorithm::TwoLevel.name()),
                "islands {islands:?}"
            );
            for (i, &x) in data.iter().enumerate() {
                let expected = (i % 97) as f32 * n as f32 + ranks_sum;
                assert_eq!(x, expected, "islands {islands:?}, rank {rank}, element {i}");
            }
        }
    }
}

#[test]
fn two_levels_are_refused_on_a_group_without_islands() {
    let topology = mesh(4);
    let outcomes = common::on_each(world(4, &topology), |group| {
        let supported = group.supports_algorithm(CollectiveOp::AllReduce, Algorithm::TwoLevel);
        let forced = group.set_algorithm(CollectiveOp::AllReduce, Algorithm::TwoLevel);
        (supported, forced)
    });
    for (supported, forced) in outcomes {
        assert!(!supported);
        let error = forced.expect_err("two levels on a mesh");
        assert!(error.to_string().contains("needs islands"), "{error}");
    }
}

#[test]
fn a_rank_that_aborts_during_a_chain_all_reduce_is_named_by_every_other() {
    // A line 2-0-3-1: rank 3 sits between 0 and 1, so both halves' streams cross it.
    let topology = cabled(4, &[(2, 0), (0, 3), (3, 1)]);
    let outcomes = all_reduce_while_rank_3_aborts(&topology, 1 << 22);
    for (rank, outcome) in outcomes.into_iter().enumerate() {
        let Some(outcome) = outcome else { continue };
        match outcome {
            Ok(exact) => assert!(exact, "rank {rank} finished with a wrong sum"),
            Err(error) => assert!(
                error.to_string().contains("rank 3"),
                "rank {rank} blamed another: {error}"
            ),
        }
    }
}
