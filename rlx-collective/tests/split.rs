//! `split`: sub-groups by color and key, like `MPI_Comm_split`, whose collectives run
//! concurrently with the parent's and with each other's.

mod common;

use std::sync::Arc;

use rlx_collective::{CollectiveError, ReduceKind};

#[test]
fn sub_groups_order_by_key_and_run_beside_the_parent() {
    let world = 6u32;
    let results = common::on_each(common::world(world), move |group| {
        let me = group.rank();
        // Even and odd ranks, each ordered by descending world rank.
        let sub = group
            .split(Some(me % 2), -(me as i32))?
            .expect("every rank gave a color");
        assert_eq!(sub.world_size(), 3);
        let expected_members: Vec<u32> = (0..world).rev().filter(|r| r % 2 == me % 2).collect();
        assert_eq!(sub.members(), expected_members.as_slice());
        assert_ne!(sub.group_id(), group.group_id());

        // A parent all-reduce in flight while the sub-group works.
        let parent = Arc::new(group.clone());
        let pending = parent.spawn_all_reduce(vec![1.0; 5000], ReduceKind::Sum);
        for round in 0..10 {
            let mut x = vec![me as f32 + round as f32; 3000];
            sub.all_reduce(&mut x, ReduceKind::Sum)?;
            let want: f32 = expected_members
                .iter()
                .map(|&r| r as f32 + round as f32)
                .sum();
            assert_eq!(x, vec![want; 3000]);
            let gathered = sub.all_gather(&[me as f32])?;
            assert_eq!(
                gathered,
                expected_members
                    .iter()
                    .map(|&r| r as f32)
                    .collect::<Vec<_>>()
            );
        }
        assert_eq!(pending.join()?, vec![world as f32; 5000]);

        // A nested split: the sub-group's rank 0 opts out.
        let nested = sub.split(if sub.rank() == 0 { None } else { Some(7) }, 0)?;
        match nested {
            None => assert_eq!(sub.rank(), 0),
            Some(nested) => {
                assert_eq!(nested.world_size(), 2);
                assert_ne!(nested.group_id(), sub.group_id());
                assert_ne!(nested.group_id(), group.group_id());
                let mut x = [1i32.to_le_bytes(), 2i32.to_le_bytes()].concat();
                nested.all_reduce_typed(&mut x, rlx_collective::DType::I32, ReduceKind::Sum)?;
                assert_eq!(x, [2i32.to_le_bytes(), 4i32.to_le_bytes()].concat());
            }
        }
        Ok::<_, CollectiveError>(sub.group_id())
    });
    let ids: Vec<u16> = results.into_iter().map(|r| r.unwrap()).collect();
    // Members of one color agree on the id; the two colors' groups share no rank, so they may
    // or may not share it, but within a color it must be the same everywhere.
    for r in 0..world as usize {
        assert_eq!(ids[r], ids[r % 2]);
    }
}

#[test]
fn no_color_joins_no_group_and_single_rank_groups_work() {
    let results = common::on_each(common::world(4), |group| {
        let color = match group.rank() {
            0 => None,
            r => Some(r),
        };
        let sub = group.split(color, 0)?;
        if let Some(sub) = &sub {
            assert_eq!(sub.world_size(), 1);
            let mut x = [3.0f32, 5.0];
            sub.all_reduce(&mut x, ReduceKind::Mean)?;
            assert_eq!(x, [3.0, 5.0]);
        }
        Ok::<_, CollectiveError>(sub.is_some())
    });
    let joined: Vec<bool> = results.into_iter().map(|r| r.unwrap()).collect();
    assert_eq!(joined, vec![false, true, true, true]);
}

#[test]
fn every_collective_conforms_on_concurrent_sub_groups() {
    use rlx_collective::DType;
    use rlx_collective::conformance::{self, ConformanceOptions};

    let results = common::on_each(common::world(5), |group| {
        let me = group.rank();
        // Colors {0, 2, 4} and {1, 3}, each in reverse rank order, run side by side.
        let sub = group
            .split(Some(me % 2), -(me as i32))?
            .expect("every rank gave a color");
        let options = ConformanceOptions {
            dtypes: vec![DType::F16, DType::I8, DType::F64],
            sizes: vec![0, 7, 1000],
            all_roots: true,
            max_segment_bytes: Some(128),
            ..ConformanceOptions::default()
        };
        conformance::run(&sub, &options)
    });
    for r in results {
        let report = r.unwrap();
        assert!(report.passed(), "{}", report.summary());
        assert!(!report.cases().is_empty());
    }
}
