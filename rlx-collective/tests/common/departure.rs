//! The survivors' side of a departure trial, shared by the in-process form (`departure.rs`)
//! and the process form (`departure_processes.rs`): the planned collectives until one fails
//! (the leaver is gone), then `shrink`, then every collective kind and a point-to-point ring
//! on the new group, each checked against the serial reference.

use std::fmt::Debug;

use rlx_collective::{ProcessGroup, ReduceKind};

use super::checked::{OPS, Rng, plan, run_checked};

/// What every departure trial draws from its seed: the world, the rank that leaves, how many
/// collectives every rank runs first, and whether the others then wait, idle, until it has
/// left. Each form's own draw adds how the rank leaves.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Departure {
    pub(crate) seed: u64,
    /// 2 to 8 ranks.
    pub(crate) world: u32,
    pub(crate) leaver: u32,
    /// Collectives every rank runs before the leaver leaves.
    pub(crate) before: usize,
    /// Whether the survivors wait, idle, until the leaver is gone.
    pub(crate) idle: bool,
}

impl Departure {
    /// The draw of trial `seed`, from `rng` (seeded with it), which the caller draws on from.
    pub(crate) fn draw(seed: u64, rng: &mut Rng) -> Self {
        let world = 2 + rng.below(7) as u32;
        Departure {
            seed,
            world,
            leaver: rng.below(u64::from(world)) as u32,
            before: rng.below(4) as usize,
            idle: rng.below(3) == 0,
        }
    }
}

/// How many planned collectives a trial draws; the survivors cycle through them until one
/// fails, however long the leaver takes to leave.
const PLANNED: usize = 64;

/// Step `step` of a trial's plan, `(collective, element count)`: the plan repeats.
pub(crate) fn step_of(steps: &[(&'static str, usize)], step: usize) -> (&'static str, usize) {
    steps[step % steps.len()]
}

/// The plan every rank of trial `seed` follows, the leaver included.
pub(crate) fn trial_plan(seed: u64) -> Vec<(&'static str, usize)> {
    plan(seed, PLANNED)
}

/// What a survivor does: `before` planned collectives with every rank present; then, when
/// the trial is `idle`, `wait_gone` (which returns once the leaver has left); then the
/// planned collectives until one fails; then shrink, and every collective kind and a ring
/// exchange on the new group. Returns the new group's members (world ranks). `trial` names
/// the trial in every panic.
pub(crate) fn survive(
    group: &ProcessGroup,
    seed: u64,
    before: usize,
    idle: Option<&mut dyn FnMut()>,
    trial: &dyn Debug,
) -> Vec<u32> {
    let steps = trial_plan(seed);
    let mut step = 0;
    if let Some(wait_gone) = idle {
        // Between operations: nothing runs until the leaver has left.
        for _ in 0..before {
            let (op, len) = step_of(&steps, step);
            run_checked(group, op, step as u64, len)
                .unwrap_or_else(|e| panic!("{trial:?}: every rank is still here: {e}"));
            step += 1;
        }
        wait_gone();
    }
    // The leaver is gone or going: some collective from here on fails.
    loop {
        let (op, len) = step_of(&steps, step);
        if run_checked(group, op, step as u64, len).is_err() {
            break;
        }
        step += 1;
    }
    let shrunk = group
        .shrink()
        .unwrap_or_else(|e| panic!("{trial:?}: shrink on rank {}: {e}", group.rank()));
    for (step, op) in OPS.iter().enumerate() {
        for len in [0, 1, 97, 4099] {
            run_checked(&shrunk, op, (step * 4 + len) as u64, len)
                .unwrap_or_else(|e| panic!("{trial:?}: {op} of {len} on the new group: {e}"));
        }
    }
    ring_exchange(&shrunk, trial);
    shrunk.members().to_vec()
}

/// Every member sends its rank to the next and receives the previous one's, then all-reduces.
fn ring_exchange(group: &ProcessGroup, trial: &dyn Debug) {
    let (rank, n) = (group.rank(), group.world_size());
    if n < 2 {
        return;
    }
    let mine = [rank as i64; 5];
    let mut theirs = [0i64; 5];
    let prev = (rank + n - 1) % n;
    group
        .send_recv((rank + 1) % n, &mine, prev, &mut theirs, 11)
        .unwrap_or_else(|e| panic!("{trial:?}: ring exchange on the new group: {e}"));
    assert_eq!(theirs, [prev as i64; 5], "{trial:?}");
    let mut x = [1.0f32; 3];
    group
        .all_reduce(&mut x, ReduceKind::Sum)
        .unwrap_or_else(|e| panic!("{trial:?}: a last all_reduce: {e}"));
    assert_eq!(x, [n as f32; 3], "{trial:?}");
}
