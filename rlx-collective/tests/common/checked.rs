//! Checked collectives for the membership tests: a seeded plan of random collectives and a
//! runner that checks each result exactly against the serial reference.

use rlx_collective::{CollectiveError, ProcessGroup, ReduceKind};

/// The seeded generator of the trials (so a failing trial can be replayed by seed).
pub(crate) use rlx_collective::conformance::SplitMix as Rng;

/// The collectives a trial draws from.
pub(crate) const OPS: [&str; 6] = [
    "all_reduce",
    "broadcast",
    "all_gather",
    "reduce_scatter",
    "gather",
    "barrier",
];

/// Runs collective `op` (number `step` of a sequence) on `group` and checks its result
/// exactly against the serial reference; values are small integers, so sums are exact in f32.
pub(crate) fn run_checked(
    group: &ProcessGroup,
    op: &str,
    step: u64,
    len: usize,
) -> Result<(), CollectiveError> {
    let n = group.world_size() as usize;
    let me = group.rank() as usize;
    let value = |rank: usize, i: usize| ((rank * 7 + i * 3 + step as usize) % 251) as f32;
    let mine: Vec<f32> = (0..len).map(|i| value(me, i)).collect();
    let sum = |i: usize| (0..n).map(|r| value(r, i)).sum::<f32>();
    match op {
        "all_reduce" => {
            let mut data = mine;
            group.all_reduce(&mut data, ReduceKind::Sum)?;
            let want: Vec<f32> = (0..len).map(sum).collect();
            assert_eq!(data, want, "all_reduce step {step} on group rank {me}");
        }
        "broadcast" => {
            let root = (step as usize % n) as u32;
            let mut data = if me as u32 == root {
                mine
            } else {
                vec![0.0; len]
            };
            group.broadcast(root, &mut data)?;
            let want: Vec<f32> = (0..len).map(|i| value(root as usize, i)).collect();
            assert_eq!(data, want, "broadcast step {step} on group rank {me}");
        }
        "all_gather" => {
            let got = group.all_gather(&mine)?;
            let want: Vec<f32> = (0..n)
                .flat_map(|r| (0..len).map(move |i| value(r, i)))
                .collect();
            assert_eq!(got, want, "all_gather step {step} on group rank {me}");
        }
        "reduce_scatter" => {
            let data: Vec<f32> = (0..len * n).map(|i| value(me, i)).collect();
            let got = group.reduce_scatter(&data, ReduceKind::Sum)?;
            let want: Vec<f32> = (me * len..(me + 1) * len).map(sum).collect();
            assert_eq!(got, want, "reduce_scatter step {step} on group rank {me}");
        }
        "gather" => {
            let got = group.gather(0, &mine)?;
            if me == 0 {
                let want: Vec<f32> = (0..n)
                    .flat_map(|r| (0..len).map(move |i| value(r, i)))
                    .collect();
                assert_eq!(got, Some(want), "gather step {step}");
            }
        }
        _ => group.barrier()?,
    }
    Ok(())
}

/// The sequence of (collective, element count) every rank of a trial runs.
pub(crate) fn plan(seed: u64, steps: usize) -> Vec<(&'static str, usize)> {
    let mut rng = Rng::seeded(seed);
    let counts = [0usize, 1, 7, 97, 1024, 4099];
    (0..steps)
        .map(|_| {
            (
                OPS[rng.below(OPS.len() as u64) as usize],
                counts[rng.below(counts.len() as u64) as usize],
            )
        })
        .collect()
}
