//! One thread per cable: how the direct plans of a full mesh (see [`crate::select::Algorithm::Direct`])
//! run their exchanges with every peer at once, and end together when one of them fails.
//!
//! Each exchange is an ordinary blocking call of [`OpCtx`] on a scoped thread of its own, so
//! every wait keeps its slices, probes and notices. A fatal error is told to the group as soon
//! as it happens ([`tell_if_fatal`]): the other exchanges of this rank, and those of its peers,
//! then end at their next slice instead of waiting on ranks that wait on this one.

use std::thread::{Scope, ScopedJoinHandle};

use crate::op::OpCtx;
use crate::{CollectiveError, Result};

/// The peers of exchange `s` (1 to n-1) of rank `r` of `n`: it sends to `r+s` and receives
/// from `r-s`. Every exchange `s` of all ranks together is a permutation, so each cable
/// carries one message each way.
pub(crate) fn partners(r: usize, n: usize, s: usize) -> (usize, usize) {
    ((r + s) % n, (r + n - s) % n)
}

/// Runs `exchange` on every item of `work` at once, one scoped thread per item but the last,
/// which runs on the caller's thread, and returns the first error.
pub(crate) fn concurrently<T: Send>(
    ctx: &OpCtx<'_>,
    work: Vec<T>,
    exchange: impl Fn(T) -> Result<()> + Sync,
) -> Result<()> {
    let exchange = |item: T| exchange(item).inspect_err(|error| tell_if_fatal(ctx, error));
    std::thread::scope(|scope| {
        let mut work = work;
        let last = work.pop();
        let threads: Vec<_> = work
            .into_iter()
            .map(|item| spawn(scope, ctx, || exchange(item)))
            .collect();
        let result = last.map_or(Ok(()), &exchange);
        result.and(join_all(threads))
    })
}

/// A spawn of the thread of one cable of `ctx`'s operation, named after it; a thread that
/// cannot be spawned is an error at [`join_all`].
pub(crate) type CableThread<'scope> = std::io::Result<ScopedJoinHandle<'scope, Result<()>>>;

/// Spawns `work` on a thread of `scope` named after `ctx`'s operation.
pub(crate) fn spawn<'scope, 'env>(
    scope: &'scope Scope<'scope, 'env>,
    ctx: &OpCtx<'_>,
    work: impl FnOnce() -> Result<()> + Send + 'scope,
) -> CableThread<'scope> {
    std::thread::Builder::new()
        .name(format!("rlx-{}-cable", ctx.name()))
        .spawn_scoped(scope, work)
}

/// Waits for every thread of `threads` and returns the first error; a thread's panic goes on
/// in the caller.
pub(crate) fn join_all(threads: Vec<CableThread<'_>>) -> Result<()> {
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

/// Tells the group of `error` at once when it is fatal (see the module docs).
pub(crate) fn tell_if_fatal(ctx: &OpCtx<'_>, error: &CollectiveError) {
    if error.is_fatal() {
        ctx.notify_failure(error);
    }
}
