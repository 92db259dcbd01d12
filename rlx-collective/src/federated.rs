//! Bounded-staleness federated averaging: one round per call, each with its own operation
//! identity, so a contribution that misses its round can never be counted in a later one.
//!
//! Non-root ranks send their contribution to rank 0 (phase 0 of the round) and wait for the
//! round's result (phase 1): the participant count as a little-endian `u64`, then the average.
//! Rank 0 waits until the deadline, always counts itself, averages in f64 what arrived and
//! sends the result to every other rank directly, so a late rank still finds the result of
//! its round waiting and stays in step.
//!
//! Rank 0 remembers which ranks missed which recent rounds and, at the start of every round,
//! polls those old tags without waiting, so late contributions are freed instead of piling up
//! in its inbox. It remembers at most [`MAX_TRACKED_ROUNDS`] rounds.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::op::OpCtx;
use crate::{CollectiveError, Result, Tag};

/// How many past rounds with missing contributions rank 0 keeps polling.
pub(crate) const MAX_TRACKED_ROUNDS: usize = 256;

/// Rank 0's record of contributions that missed their round.
#[derive(Debug, Default)]
pub(crate) struct StaleRounds {
    /// (round tag, group ranks that have not delivered yet), oldest first.
    rounds: VecDeque<(Tag, Vec<u32>)>,
}

impl StaleRounds {
    /// Frees every late contribution that has arrived since the last round.
    fn drain(&mut self, ctx: &OpCtx<'_>) {
        for (tag, missing) in &mut self.rounds {
            missing.retain(|&rank| {
                let Ok(peer) = ctx.world_rank(rank) else {
                    return false;
                };
                // Anything but "not yet" (a message, a lost peer, a failure notice) settles
                // the slot; the bytes themselves are discarded.
                matches!(
                    ctx.transport.recv_message(peer, *tag, Duration::ZERO),
                    Ok(None)
                )
            });
        }
        self.rounds.retain(|(_, missing)| !missing.is_empty());
    }

    fn remember(&mut self, tag: Tag, missing: Vec<u32>) {
        if missing.is_empty() {
            return;
        }
        if self.rounds.len() == MAX_TRACKED_ROUNDS {
            self.rounds.pop_front();
        }
        self.rounds.push_back((tag, missing));
    }

    /// Number of contributions still outstanding from past rounds.
    pub(crate) fn outstanding(&self) -> usize {
        self.rounds.iter().map(|(_, m)| m.len()).sum()
    }
}

fn le_f32s(bytes: &[u8]) -> impl Iterator<Item = f32> + '_ {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
}

/// Runs one round: contributes `data` and replaces it by the round's average. Returns the
/// number of participants on rank 0 (1 in a group of one) and 0 elsewhere. `stale` is rank
/// 0's record of late contributions; only rank 0 locks it.
pub(crate) fn run(
    ctx: &OpCtx<'_>,
    stale: &Mutex<StaleRounds>,
    data: &mut [f32],
    deadline: Duration,
) -> Result<usize> {
    if ctx.size() == 1 {
        return Ok(1);
    }
    if ctx.rank == 0 {
        run_root(ctx, &mut stale.lock(), data, deadline)
    } else {
        run_member(ctx, data, deadline).map(|()| 0)
    }
}

/// Runs one round on rank 0: returns the participant count and leaves the average in `data`.
fn run_root(
    ctx: &OpCtx<'_>,
    stale: &mut StaleRounds,
    data: &mut [f32],
    deadline: Duration,
) -> Result<usize> {
    stale.drain(ctx);
    let start = Instant::now();
    let mut sum: Vec<f64> = data.iter().map(|&x| f64::from(x)).collect();
    let mut participants = 1usize;
    let mut missing = Vec::new();
    let expected = std::mem::size_of_val(data);
    for rank in 1..ctx.size() {
        let remaining = deadline.saturating_sub(start.elapsed());
        match ctx.recv_within(rank, remaining) {
            Ok(Some(bytes)) if bytes.len() == expected => {
                for (s, x) in sum.iter_mut().zip(le_f32s(&bytes)) {
                    *s += f64::from(x);
                }
                participants += 1;
            }
            Ok(Some(bytes)) => {
                let error = CollectiveError::LengthMismatch {
                    op: ctx.name(),
                    peer: ctx.world_rank(rank).ok(),
                    expected: expected as u64,
                    got: bytes.len() as u64,
                    dtype: None,
                    lengths: Vec::new(),
                };
                // The members wait on the result phase, so that is where they must hear it.
                ctx.phase(1).notify_failure(&error);
                return Err(error);
            }
            Ok(None) => missing.push(rank),
            // A lost or failed edge device does not hold up the others: it simply does not
            // take part in this round. Aborts still end the call.
            Err(CollectiveError::Aborted) => return Err(CollectiveError::Aborted),
            Err(_) => {}
        }
    }
    stale.remember(ctx.tag(), missing);
    let count = participants as f64;
    for (x, s) in data.iter_mut().zip(&sum) {
        *x = (*s / count) as f32;
    }
    let header = (participants as u64).to_le_bytes();
    let body: &[u8] = bytemuck::cast_slice(data);
    let result = ctx.phase(1);
    for rank in 1..ctx.size() {
        match result.send_parts(rank, &[&header, body]) {
            Ok(()) | Err(CollectiveError::PeerLost { .. }) => {}
            Err(other) => return Err(other),
        }
    }
    Ok(participants)
}

/// Runs one round on a non-root rank: contributes `data` and replaces it by the round's
/// average.
fn run_member(ctx: &OpCtx<'_>, data: &mut [f32], deadline: Duration) -> Result<()> {
    ctx.send(0, bytemuck::cast_slice(data))?;
    let result = ctx.phase(1);
    let wait = deadline.saturating_add(ctx.timeout());
    let bytes = result
        .recv_within(0, wait)?
        .ok_or_else(|| ctx.timed_out(ctx.world_rank(0).unwrap_or(0), wait))?;
    let expected = 8 + std::mem::size_of_val(data);
    if bytes.len() != expected {
        return Err(CollectiveError::LengthMismatch {
            op: ctx.name(),
            peer: ctx.world_rank(0).ok(),
            expected: expected as u64,
            got: bytes.len() as u64,
            dtype: None,
            lengths: Vec::new(),
        });
    }
    for (x, v) in data.iter_mut().zip(le_f32s(&bytes[8..])) {
        *x = v;
    }
    Ok(())
}
