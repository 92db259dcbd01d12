//! After a length mismatch: what every member passed to the operation, gathered from the
//! failure notices the members send when their part fails, so that every rank's error names
//! the rank whose length differs. The rank that finds a mismatch knows only the message it
//! received, often a segment of its neighbour's buffer, and the ranks that hear of it through
//! a notice know less still.
//!
//! Every member whose part of an operation fails with a length mismatch, found or heard of,
//! tells every other member under the operation's tag and says in the notice what it passed
//! (see `OpCtx::fail`). A rank then gathers the other members' notices for up to
//! [`CENSUS_WINDOW`], less once every member has answered. A member that failed otherwise, is
//! lost, or succeeded (a broadcast's root receives nothing, so it never finds a mismatch) is
//! left out, and the error names what the others said. Messages of the operation that arrive
//! meanwhile are dropped: the operation has failed, and no later one takes them.

use std::time::{Duration, Instant};

use crate::{CollectiveError, Tag, Transport};

/// The longest a rank waits for the other members' notices after a length mismatch. Their
/// notices follow within a round trip of the first one, since every member's part fails on
/// it; the window only bounds the wait for a member that never sends one.
pub(crate) const CENSUS_WINDOW: Duration = Duration::from_secs(5);

/// What the members passed to the operation under `tag`, as (world rank, bytes): `known`
/// (this rank's own length, and what a notice already received said), completed from the
/// notices of the other `members` (world ranks) that arrive within `window`.
pub(crate) fn gather(
    transport: &dyn Transport,
    tag: Tag,
    members: &[u32],
    mut known: Vec<(u32, u64)>,
    window: Duration,
) -> Vec<(u32, u64)> {
    let deadline = Instant::now() + window;
    for &member in members {
        if known.iter().any(|&(rank, _)| rank == member) {
            continue;
        }
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match transport.recv_message(member, tag, left) {
                // A message of the failed operation: nothing takes it any more.
                Ok(Some(_)) => continue,
                Err(CollectiveError::LengthMismatch { lengths, .. }) => {
                    known.extend(lengths.into_iter().filter(|&(rank, _)| rank == member));
                }
                // The member failed otherwise, is lost, or the window has passed.
                Ok(None) | Err(_) => {}
            }
            break;
        }
    }
    known.sort_unstable();
    known
}
