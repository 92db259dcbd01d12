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
//! What the rest of the engine sees: the writer asks [`Engine::carriage`] once per message
//! whether it goes by single copy; the reader hands the same-host frames (offer, lane switch,
//! single-copy descriptor) to this room; before each send the writer lets it switch link 0 to
//! a lane (`Engine::switch_to_lane`), after which the link reads and writes the lane through
//! the medium contract. Every fast path falls back to TCP when a peer does not answer, a
//! permission is missing or the system lacks the calls.
//!
//! [`Engine::carriage`]: crate::progress::Engine

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
pub(crate) use single_copy::DEFAULT_MIN_SINGLE_COPY;
pub(in crate::progress) use single_copy::{Carriage, SingleCopy};
pub(in crate::progress) use switch::Lanes;
