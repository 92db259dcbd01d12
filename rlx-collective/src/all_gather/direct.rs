//! Direct all-gather for a full mesh of cables: every rank sends its block to every peer and
//! receives every peer's block at once, one exchange per cable, each on a thread of its own.
//!
//! A ring moves (n-1) blocks over one cable of each rank in each direction; on a mesh the
//! other n-2 cables of every rank idle. Here every cable carries one block each way, so the
//! time is one block over one cable where the ring takes n-1 (three times faster on four Macs
//! cabled in a mesh, when the cables and not the hosts bound it). The exchange with peer `r+s`
//! and `r-s` runs on thread `s` (the caller's own thread takes the last), so every step of
//! every rank is part of a permutation and no cable carries two messages one way. Blocks land
//! straight in the caller's buffer; nothing is allocated but the threads.

use crate::layout::{self, Blocks};
use crate::op::OpCtx;
use crate::{CollectiveError, Result};

/// Fills every block of `data` (cut by `blocks`, elements of `elem_size` bytes) from its owner;
/// block `rank` must already hold this rank's contribution. Needs at least two ranks.
pub(crate) fn run(
    ctx: &OpCtx<'_>,
    data: &mut [u8],
    elem_size: usize,
    blocks: Blocks,
) -> Result<()> {
    let n = ctx.size() as usize;
    let r = ctx.rank as usize;
    let mut others: Vec<Option<&mut [u8]>> = layout::blocks_mut(data, blocks, n, elem_size)
        .into_iter()
        .map(Some)
        .collect();
    let own: &[u8] = others[r].take().unwrap_or_default();
    let exchanges: Vec<(u32, u32, &mut [u8])> = (1..n)
        .filter_map(|s| {
            let (to, from) = ((r + s) % n, (r + n - s) % n);
            let into = others[from].take()?;
            Some((to as u32, from as u32, into))
        })
        .collect();
    concurrently(ctx, exchanges, |(to, from, into)| {
        ctx.send_recv_into(to, own, from, into)
    })
}

/// Runs `exchange` on every item of `work` at once, one scoped thread per item but the last,
/// which runs on the caller's thread, and returns the first error. A fatal error is told to
/// the group as soon as it happens, so that the other exchanges of this rank and of its peers
/// end at once instead of waiting on ranks that wait on this one.
pub(crate) fn concurrently<T: Send>(
    ctx: &OpCtx<'_>,
    work: Vec<T>,
    exchange: impl Fn(T) -> Result<()> + Sync,
) -> Result<()> {
    let exchange = |item: T| {
        exchange(item).inspect_err(|error| {
            if error.is_fatal() {
                ctx.notify_failure(error);
            }
        })
    };
    std::thread::scope(|scope| {
        let mut work = work;
        let last = work.pop();
        let threads: Vec<_> = work
            .into_iter()
            .map(|item| {
                std::thread::Builder::new()
                    .name(format!("rlx-{}-cable", ctx.name()))
                    .spawn_scoped(scope, || exchange(item))
            })
            .collect();
        let result = last.map_or(Ok(()), &exchange);
        result.and(join_all(threads))
    })
}

/// Waits for every thread of `threads` (each as spawning it went) and returns the first
/// error; a thread's panic goes on in the caller.
pub(crate) fn join_all(
    threads: Vec<std::io::Result<std::thread::ScopedJoinHandle<'_, Result<()>>>>,
) -> Result<()> {
    let mut result = Ok(());
    for thread in threads {
        let joined = match thread {
            Ok(handle) => match handle.join() {
                Ok(joined) => joined,
                Err(panic) => std::panic::resume_unwind(panic),
            },
            Err(source) => Err(CollectiveError::Io { peer: None, source }),
        };
        result = result.and(joined);
    }
    result
}
