//! The same-host room: the fast paths between two ranks of one host, which move bytes through
//! memory instead of a loopback TCP connection. Everything above the byte stream (frames,
//! order, matching) stays what the TCP links define; this room only changes where bytes travel.
//!
//! - `offer.rs`: the offer a rank makes to every peer of its host when the transport is built
//!   (proving, with a nonce, that each can read the other's memory), and the same-host control
//!   frames the reader hands over.
//! - `single_copy.rs`: large messages read straight from the sender's buffer into the
//!   receiver's in one kernel copy, announced by a descriptor frame in the message's place on
//!   link 0.
//! - `descriptor.rs`: the bytes of a single-copy frame, encoded and checked.
//! - `bounce.rs`: the head of such a message copied through a shared-memory file of the
//!   sender's instead, by both ranks at once.
//! - `lane.rs`: link 0's byte stream to a peer of this host carried by a ring in a
//!   shared-memory file, as the link's media (`medium.rs`).
//! - `switch.rs`: the lanes made and mapped, per peer, until link 0 switches to them.
//! - `sys/`: the OS calls under all of them, behind the contract documented there.
//!
//! What the rest of the engine sees is one view, [`SameHost`]: the engine's shared core beside
//! this room's own state ([`SameHostState`]). The writer asks it once per message whether the
//! message goes by single copy ([`SameHost::carriage`]); the reader hands it the same-host
//! frames (offer, lane switch, single-copy descriptor); before each send the writer lets it
//! switch link 0 to a lane ([`SameHost::switch_to_lane`]), after which the link reads and
//! writes the lane through the medium contract; the engine's façade sends the offers it
//! writes ([`SameHost::offers`]). Every fast path falls back to TCP when a peer does not
//! answer, a permission is missing or the system lacks the calls.

mod bounce;
mod descriptor;
mod lane;
mod offer;
mod single_copy;
mod switch;
mod sys;

pub(crate) use bounce::DEFAULT_MAX_BOUNCED;
pub(in crate::progress) use descriptor::{DESCRIPTOR_LEN, descriptor};
pub(crate) use lane::DEFAULT_LANE_BYTES;
pub(in crate::progress) use offer::OFFER_WAIT;
pub(in crate::progress) use single_copy::Carriage;
pub(crate) use single_copy::DEFAULT_MIN_SINGLE_COPY;
use single_copy::SingleCopy;
use switch::Lanes;

use super::core::Core;

/// What the same-host room keeps for the life of the engine: the single-copy words and bounce
/// files of every peer, and the lanes made and mapped.
#[derive(Debug)]
pub(in crate::progress) struct SameHostState {
    single_copy: SingleCopy,
    lanes: Lanes,
}

impl SameHostState {
    /// The room of an engine of `here.len()` ranks, `here[r]` saying whether rank `r` runs on
    /// this host.
    pub(in crate::progress) fn new(here: Box<[bool]>) -> Self {
        let world = u32::try_from(here.len()).unwrap_or(u32::MAX);
        Self {
            single_copy: SingleCopy::new(here),
            lanes: Lanes::new(world),
        }
    }

    /// The room as the other rooms see it, standing on `core`.
    pub(in crate::progress) fn view<'a>(&'a self, core: &'a Core) -> SameHost<'a> {
        SameHost {
            core,
            single_copy: &self.single_copy,
            lanes: &self.lanes,
        }
    }
}

/// The same-host room's view: the engine's core and this room's state, nothing else.
#[derive(Clone, Copy)]
pub(in crate::progress) struct SameHost<'a> {
    core: &'a Core,
    single_copy: &'a SingleCopy,
    lanes: &'a Lanes,
}
