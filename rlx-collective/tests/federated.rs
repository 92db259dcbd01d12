//! Federated averaging with a late rank: the late contribution is discarded, never counted in
//! a later round, the participant counts are right, and rank 0 frees the stale message.

mod common;

use std::sync::{Mutex, mpsc};
use std::time::Duration;

use rlx_collective::CollectiveError;

#[test]
fn a_late_contribution_never_reaches_a_later_round() {
    let world = 4u32;
    let late = 3u32;
    // Rank 0 says when its first round is over; only then does the late rank contribute, so
    // it is late by construction, however the machine schedules the threads.
    let (round1_over, wait_for_round1) = mpsc::channel::<()>();
    let round1_over = Mutex::new(round1_over);
    let wait_for_round1 = Mutex::new(wait_for_round1);
    let results = common::on_each(common::world(world), move |group| {
        let me = group.rank();
        // Round 1: the late rank arrives after rank 0 has closed the round.
        let mut round1 = vec![1000.0 + me as f32; 6];
        if me == late {
            let waited = wait_for_round1.lock().map(|rx| rx.recv());
            assert!(matches!(waited, Ok(Ok(()))), "rank 0 never ended round 1");
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
