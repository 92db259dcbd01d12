//! Federated averaging with a late rank: the late contribution is discarded, never counted in
//! a later round, the participant counts are right, and rank 0 frees the stale message.

mod common;

use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use common::hooked::Hooked;
use rlx_collective::{CollectiveError, MemTransport, ProcessGroup, Transport};

/// Round 1's deadline runs from rank 0's start of the round, so the order is arranged rather
/// than left to the scheduler: rank 0 starts round 1 only once ranks 1 and 2 have handed
/// their contributions over (they are on time whatever the deadline), and the late rank
/// contributes only once rank 0 has closed the round (it is late whatever the machine does).
#[test]
fn a_late_contribution_never_reaches_a_later_round() {
    let world = 4u32;
    let late = 3u32;
    let (handed_over, wait_for_contributions) = mpsc::channel::<u32>();
    let groups: Vec<ProcessGroup> = MemTransport::fan_out_with_timeout(world, common::TEST_TIMEOUT)
        .into_iter()
        .map(|inner| {
            // Ranks 1 and 2 say once their first message to rank 0 under phase 0 (their
            // round-1 contribution) has been handed over. `MemTransport`'s send is
            // synchronous: once it returns, the message waits in rank 0's inbox, so rank 0
            // finds it at once whenever it looks.
            let rank = inner.rank();
            let on_time = rank != 0 && rank != late;
            let handed_over = Mutex::new(on_time.then(|| handed_over.clone()));
            ProcessGroup::new(Arc::new(Hooked::new(inner).after_send(move |to, tag| {
                if to == 0 && !tag.is_user() && tag.phase() == 0 {
                    if let Some(tx) = handed_over.lock().unwrap().take() {
                        let _ = tx.send(rank);
                    }
                }
            })) as Arc<dyn Transport>)
        })
        .collect();
    let wait_for_contributions = Mutex::new(wait_for_contributions);
    let (round1_over, wait_for_round1) = mpsc::channel::<()>();
    let round1_over = Mutex::new(round1_over);
    let wait_for_round1 = Mutex::new(wait_for_round1);
    let results = common::on_each(groups, move |group| {
        let me = group.rank();
        // Round 1: the late rank arrives after rank 0 has closed the round.
        let mut round1 = vec![1000.0 + me as f32; 6];
        if me == late {
            let waited = wait_for_round1.lock().map(|rx| rx.recv());
            assert!(matches!(waited, Ok(Ok(()))), "rank 0 never ended round 1");
        }
        if me == 0 {
            let rx = wait_for_contributions.lock().unwrap();
            for _ in 0..2 {
                let member = rx.recv_timeout(common::TEST_TIMEOUT);
                assert!(member.is_ok(), "ranks 1 and 2 did not both contribute");
            }
        }
        let n1 = group.federated_average(&mut round1, Duration::from_millis(200))?;
        if me == 0 {
            let told = round1_over.lock().map(|tx| tx.send(()));
            assert!(matches!(told, Ok(Ok(()))), "the late rank stopped waiting");
        }
        // Round 2: everyone is on time (the deadline is far away).
        let mut round2 = vec![me as f32; 6];
        let n2 = group.federated_average(&mut round2, Duration::from_secs(30))?;
        // Round 3 lets rank 0 collect the stale round-1 message.
        let mut round3 = vec![2.0f32; 6];
        let n3 = group.federated_average(&mut round3, Duration::from_secs(30))?;
        Ok::<_, CollectiveError>((
            n1,
            round1,
            n2,
            round2,
            n3,
            round3,
            group.federated_outstanding(),
        ))
    });
    for (rank, r) in results.into_iter().enumerate() {
        let (n1, round1, n2, round2, n3, round3, outstanding) = r.unwrap();
        // Round 1 averages ranks 0, 1, 2 only: (1000 + 1001 + 1002) / 3.
        assert_eq!(round1, vec![1001.0; 6], "rank {rank}");
        // Round 2 is the mean of 0..4 with no trace of round 1's 1003.
        assert_eq!(round2, vec![1.5; 6], "rank {rank}");
        assert_eq!(round3, vec![2.0; 6], "rank {rank}");
        if rank == 0 {
            assert_eq!((n1, n2, n3), (3, 4, 4));
            assert_eq!(outstanding, 0, "the stale contribution was not freed");
        } else {
            assert_eq!((n1, n2, n3), (0, 0, 0));
        }
    }
}

#[test]
fn a_world_of_one_averages_itself() {
    let groups = common::world(1);
    let mut x = vec![1.25f32, -3.0];
    assert_eq!(
        groups[0]
            .federated_average(&mut x, Duration::from_millis(10))
            .unwrap(),
        1
    );
    assert_eq!(x, vec![1.25, -3.0]);
}
