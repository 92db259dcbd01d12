//! A rank that leaves, cleanly (drops its group, so its transport closes) or by crashing (its
//! transport aborts, as a process killed mid-operation does): the survivors run collectives
//! until one fails, shrink, and the new group holds exactly the survivors and runs every
//! collective kind and a point-to-point ring exactly, inheriting nothing of the old group's
//! failure. Seeded trials over worlds of 2 to 8 ranks, the leaving rank, the way it leaves
//! and the moment drawn at random: after some collectives, a few hundred microseconds into
//! one (a crash), or between operations while the others are idle. Over `MemTransport` and
//! over `TcpTransport` on loopback (threads). SIGSTOPped processes are in
//! `shrink_processes.rs` and `frozen_rank.rs`.
//!
//! `DEPARTURE_TRIALS=1000 cargo test -p rlx-collective --test departure` runs the long form
//! (60 trials by default).

mod common;

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use common::checked::{Rng, run_checked};
use common::departure::{self, Departure};
use rlx_collective::ProcessGroup;

/// Operation timeout: generous, so that a busy machine never makes a live rank look dead.
const OP_TIMEOUT: Duration = Duration::from_secs(60);

/// One trial's draw: the shared part, and how the rank leaves.
#[derive(Clone, Copy, Debug)]
struct Draw {
    departure: Departure,
    /// Whether the leaver crashes (its transport aborts, as a process killed mid-operation
    /// does) instead of dropping its group.
    crash: bool,
    /// How far into its next collective a crashing leaver goes (unless idle).
    crash_after: Duration,
    tcp: bool,
}

impl Draw {
    fn new(seed: u64) -> Self {
        let mut rng = Rng::seeded(seed);
        Draw {
            departure: Departure::draw(seed, &mut rng),
            crash: rng.below(2) == 0,
            crash_after: Duration::from_micros(rng.below(400)),
            tcp: seed % 2 == 1,
        }
    }
}

impl std::ops::Deref for Draw {
    type Target = Departure;

    fn deref(&self) -> &Departure {
        &self.departure
    }
}

fn world(draw: Draw) -> Vec<ProcessGroup> {
    if draw.tcp {
        common::tcp_world(draw.world, common::free_port(), |rank, n, port| {
            common::loopback_builder(rank, n, port, OP_TIMEOUT)
        })
    } else {
        common::world_with_timeout(draw.world, OP_TIMEOUT)
    }
}

fn trial(draw: Draw) {
    // In an idle trial every rank meets here once the leaver has left.
    let gone = Arc::new(Barrier::new(draw.world as usize));
    let members = common::on_each(world(draw), move |group| {
        if group.rank() != draw.leaver {
            let mut wait_gone = || {
                gone.wait();
            };
            let idle = draw.idle.then_some(&mut wait_gone as &mut dyn FnMut());
            return Some(departure::survive(
                &group,
                draw.seed,
                draw.before,
                idle,
                &draw,
            ));
        }
        leave(group, draw);
        if draw.idle {
            gone.wait();
        }
        None
    });
    let want: Vec<u32> = (0..draw.world).filter(|&r| r != draw.leaver).collect();
    for (rank, got) in members.into_iter().enumerate() {
        if rank as u32 != draw.leaver {
            assert_eq!(got.as_deref(), Some(&want[..]), "{draw:?}: rank {rank}");
        }
    }
}

/// The leaver's part: its first `before` collectives, then it leaves. A clean leaver drops its
/// group; a crashing one aborts its transport, between operations when the trial is idle,
/// else from a second thread `crash_after` into the collective that follows (its own steps
/// then fail, and it stops).
fn leave(group: ProcessGroup, draw: Draw) {
    let crash_mid_operation = draw.crash && !draw.idle;
    // A crash during collective `before` stops there: if the abort comes only after it
    // finished, the survivors' next collective still misses this rank.
    let steps = departure::trial_plan(draw.seed);
    let mut killer = None;
    for step in 0..draw.before + usize::from(crash_mid_operation) {
        let (op, len) = departure::step_of(&steps, step);
        if crash_mid_operation && step == draw.before {
            let transport = Arc::clone(group.transport());
            killer = Some(thread::spawn(move || {
                thread::sleep(draw.crash_after);
                transport.abort();
            }));
        }
        // The others may already fail the last of these (a survivor that moved on reports
        // the loss); the leaver leaves either way.
        if run_checked(&group, op, step as u64, len).is_err() {
            break;
        }
    }
    if let Some(killer) = killer {
        killer.join().expect("the crash");
    } else if draw.crash {
        group.transport().abort();
    }
    drop(group);
}

/// How many trials run: `DEPARTURE_TRIALS`, else 60 (about 10 s on two cores).
fn trials() -> u64 {
    std::env::var("DEPARTURE_TRIALS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(60)
}

#[test]
fn a_rank_that_leaves_or_crashes_is_left_out_and_nothing_of_the_old_group_remains() {
    for seed in 0..trials() {
        trial(Draw::new(seed));
    }
}
