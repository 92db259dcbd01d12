//! Non-blocking operations share the group's one progress worker instead of starting a thread
//! each. The test counts the threads of its process, so it is the only test of this target:
//! no other test's threads come and go meanwhile, and a sanitizer's own thread, started
//! before the count begins, stays out of the difference.

mod common;

/// A hundred non-blocking operations in flight add at most one thread per group.
#[cfg(target_os = "linux")]
#[test]
fn spawned_operations_share_one_worker_per_group() {
    let threads = || std::fs::read_dir("/proc/self/task").map_or(0, |d| d.count());
    let groups = common::world(2);
    let before = threads();
    let results = common::on_each(groups, move |group| {
        let handles: Vec<_> = (0..100)
            .map(|i| group.spawn_all_reduce(vec![i as f32; 2], rlx_collective::ReduceKind::Sum))
            .collect();
        let during = threads();
        let sums: Vec<f32> = handles
            .into_iter()
            .map(|h| h.join().map(|v| v[0]))
            .collect::<Result<_, _>>()?;
        Ok::<_, rlx_collective::CollectiveError>((during, sums))
    });
    for result in results {
        let (during, sums) = result.unwrap();
        // Two rank threads of the harness, and at most one worker per group.
        assert!(
            during <= before + 4,
            "{during} threads with {before} before"
        );
        let expected: Vec<f32> = (0..100).map(|i| 2.0 * i as f32).collect();
        assert_eq!(sums, expected);
    }
}
