//! Federated averaging with a slow edge client: every rank is a client with data of its own
//! for one linear model; each round it trains locally from the current global model, and
//! `federated_average` averages what reaches rank 0 before the round's deadline. The last
//! client is slow in every third round (it sleeps, as a phone on a bad link would): those
//! rounds go on without it, it still receives their average, and since the next round starts
//! only once every client has the model, it rejoins that round; its late contribution is never
//! counted. The model converges all the same.
//!
//! ```sh
//! cargo build --release -p rlx-collective --example federated
//! cargo xtask launch -n 4 -- target/release/examples/federated --rounds 12
//! ```

use std::process::ExitCode;
use std::time::Duration;

use rlx_collective::{CollectiveError, ProcessGroup};

/// The weights every client's data comes from.
const TRUE_WEIGHTS: [f32; 3] = [1.0, -2.0, 0.5];

/// The rounds and the slow client's behaviour.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Config {
    /// Federated rounds.
    pub(crate) rounds: usize,
    /// How long rank 0 waits for contributions each round.
    pub(crate) deadline: Duration,
    /// How long the slow client sleeps in its slow rounds (every third round, from round 1).
    pub(crate) slow_by: Duration,
    /// Local gradient steps per round.
    pub(crate) local_steps: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            rounds: 12,
            deadline: Duration::from_millis(200),
            slow_by: Duration::from_millis(800),
            local_steps: 10,
        }
    }
}

/// What a client saw.
#[derive(Clone, Debug)]
pub(crate) struct Report {
    /// Distance of the global model from the true weights before the first round.
    pub(crate) first_error: f32,
    /// Distance after the last round.
    pub(crate) final_error: f32,
    /// Participants of every round (rank 0 only; empty elsewhere).
    pub(crate) participants: Vec<usize>,
}

/// Client `rank`'s examples: inputs of its own and their exact targets.
fn client_data(rank: u32) -> Vec<([f32; 3], f32)> {
    let mut seed = 0x5851_F42D_4C95_7F2Du64 ^ u64::from(rank + 1).wrapping_mul(0x9E37_79B9);
    (0..32)
        .map(|_| {
            let x: [f32; 3] = std::array::from_fn(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                ((seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            });
            let y = x.iter().zip(TRUE_WEIGHTS).map(|(a, w)| a * w).sum();
            (x, y)
        })
        .collect()
}

fn distance(w: &[f32]) -> f32 {
    w.iter()
        .zip(TRUE_WEIGHTS)
        .map(|(a, b)| (a - b) * (a - b))
        .sum::<f32>()
        .sqrt()
}

/// Whether the slow client is slow in `round`.
fn is_slow_round(round: usize) -> bool {
    round % 3 == 1
}

/// Runs the rounds on `group`; the last rank is the slow client.
pub(crate) fn run(group: &ProcessGroup, cfg: &Config) -> Result<Report, CollectiveError> {
    let rank = group.rank();
    let slow = group.world_size() > 1 && rank + 1 == group.world_size();
    let data = client_data(rank);
    let mut model = vec![0.0f32; 3];
    let first_error = distance(&model);
    let mut participants = Vec::new();
    for round in 0..cfg.rounds {
        for _ in 0..cfg.local_steps {
            let mut grad = [0.0f32; 3];
            for (x, y) in &data {
                let err: f32 = x.iter().zip(&model).map(|(a, w)| a * w).sum::<f32>() - y;
                for i in 0..3 {
                    grad[i] += 2.0 * err * x[i] / data.len() as f32;
                }
            }
            for i in 0..3 {
                model[i] -= 0.1 * grad[i];
            }
        }
        if slow && is_slow_round(round) {
            std::thread::sleep(cfg.slow_by);
        }
        let counted = group.federated_average(&mut model, cfg.deadline)?;
        if rank == 0 {
            eprintln!(
                "round {round:2}: {counted} of {} clients, error {:.4}",
                group.world_size(),
                distance(&model)
            );
            participants.push(counted);
        }
        // The server starts the next round when every client has the new model, as a real
        // one schedules its rounds: a client that was late rejoins on time.
        group.barrier()?;
    }
    Ok(Report {
        first_error,
        final_error: distance(&model),
        participants,
    })
}

#[allow(
    dead_code,
    reason = "the tests include this file for `run` and never call main"
)]
fn main() -> ExitCode {
    let mut cfg = Config::default();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match (arg.as_str(), args.next().and_then(|v| v.parse().ok())) {
            ("--rounds", Some(v)) => cfg.rounds = v,
            _ => {
                eprintln!("usage: federated [--rounds N]");
                return ExitCode::FAILURE;
            }
        }
    }
    let outcome = rlx_collective::init().and_then(|group| {
        let report = run(&group, &cfg)?;
        Ok((group.rank(), group.world_size(), report))
    });
    match outcome {
        Ok((rank, world, report)) => {
            if rank == 0 {
                let short = report.participants.iter().filter(|&&n| n < world as usize);
                println!(
                    "federated: {world} clients, {} rounds: the slow client missed {} round(s) \
                     and rejoined; error {:.4} -> {:.5}",
                    cfg.rounds,
                    short.count(),
                    report.first_error,
                    report.final_error
                );
            }
            if report.final_error < report.first_error / 10.0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("federated: {e}");
            ExitCode::FAILURE
        }
    }
}
