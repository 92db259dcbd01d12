//! Moving link 0 to a rank of this host onto a shared-memory lane (`lane.rs`), at both ends.
//!
//! The lanes a rank made for its offers and the peers' lanes it mapped wait here, per peer,
//! until the switch. The sender switches at its next send once the peer accepted its lane: it
//! writes a [`FrameKind::Lane`] frame on the socket and hands the link a [`LaneWriter`] as its
//! outbound medium. The receiver, when that frame arrives, hands the link a [`LaneReader`] as
//! its inbound medium. From then on the link reads and writes through the medium contract
//! (`medium.rs`) and knows nothing of lanes.

use rlx_transport::{CollectiveError, Tag};

use super::SameHost;
use crate::error::{Lost, protocol_lost};
use crate::frame::{FrameHeader, FrameKind};
use crate::progress::link::{HeaderSent, Link, LinkRx, PeerIo, TxState, on_link_zero};
use crate::sync::{Mutex, lock};

use super::lane::{LaneIn, LaneOut, LaneReader, LaneWriter};

/// One peer's lanes before the switch.
#[derive(Debug, Default)]
struct Waiting {
    /// The lane this rank made for its offer to the peer, until the peer accepts it and this
    /// rank switches link 0 to it.
    made: Option<LaneOut>,
    /// The peer's lane, mapped when its offer was taken, until its switch frame arrives.
    mapped: Option<LaneIn>,
}

/// The lanes of every peer that are made or mapped but not switched to yet.
#[derive(Debug)]
pub(in crate::progress) struct Lanes {
    /// Indexed by rank.
    waiting: Box<[Mutex<Waiting>]>,
}

impl Lanes {
    /// No lanes yet, for a world of `world` ranks.
    pub(in crate::progress) fn new(world: u32) -> Self {
        Self {
            waiting: (0..world).map(|_| Mutex::new(Waiting::default())).collect(),
        }
    }

    /// Keeps `lane`, mapped from `peer`'s offer, for its switch frame.
    pub(super) fn keep_mapped(&self, peer: u32, lane: LaneIn) {
        if let Some(waiting) = self.waiting.get(peer as usize) {
            lock(waiting).mapped = Some(lane);
        }
    }

    /// Makes the lane to `peer` of a ring of `ring` bytes unless it exists, and returns its
    /// name for the offer (zeros: none, the system refused).
    pub(super) fn make(&self, peer: u32, ring: u64) -> (u64, u64) {
        let Some(waiting) = self.waiting.get(peer as usize) else {
            return (0, 0);
        };
        let mut waiting = lock(waiting);
        if waiting.made.is_none() {
            waiting.made = LaneOut::create(ring);
        }
        waiting.made.as_ref().map_or((0, 0), LaneOut::name)
    }
}

impl SameHost<'_> {
    /// Moves link 0 to `to` onto the lane this rank made once the peer accepted it: the switch
    /// frame goes on the socket, everything after it into the ring. A socket that takes
    /// nothing now leaves the switch to a later send. Called by every send, under the peer's
    /// send lock (`tx`).
    pub(in crate::progress) fn switch_to_lane(
        &self,
        to: u32,
        io: &PeerIo,
        tx: &mut TxState,
    ) -> Result<(), CollectiveError> {
        // Every send passes here: a link switched already, or to a rank of another host (which
        // never has a lane), costs no lock.
        if tx.switched_out.is_some() || !self.single_copy.on_this_host(to) {
            return Ok(());
        }
        let Some(waiting) = self.lanes.waiting.get(to as usize) else {
            return Ok(());
        };
        let mut waiting = lock(waiting);
        if !waiting.made.as_ref().is_some_and(LaneOut::accepted) {
            return Ok(());
        }
        let Some(link) = io.links.first() else {
            return Ok(());
        };
        // The writer wakes a sleeping reader through a second handle to the socket; without
        // one (no descriptor left) the link stays on TCP.
        let Ok(socket) = link.stream.try_clone() else {
            return Ok(());
        };
        let header = FrameHeader::whole(FrameKind::Lane, Tag::from_raw(0), 0, 0).encode();
        let limit = self.core.cfg.op_timeout;
        match self
            .core
            .send_header_whole(to, io, link, &header, "a lane switch", limit)
        {
            Ok(HeaderSent::Whole) => {
                if let Some(ring) = waiting.made.take() {
                    tx.switched_out = Some(Box::new(LaneWriter::new(ring, socket)));
                }
                tracing::debug!(peer = to, "link 0 writes into the shared-memory lane");
                Ok(())
            }
            // A stall comes back as the loss of the peer, below.
            Ok(HeaderSent::NotStarted | HeaderSent::Stalled { .. }) => Ok(()),
            Ok(HeaderSent::Aborted) => Err(CollectiveError::Aborted),
            Err(lost) => {
                let err = lost.error(to);
                self.core.lose(to, lost);
                Err(err)
            }
        }
    }

    /// `from` switched link 0 (`k` must be 0) to its lane, which this rank mapped: the link
    /// reads the lane from now on.
    pub(super) fn on_lane_switch(
        &self,
        from: u32,
        k: usize,
        link: &Link,
        rx: &mut LinkRx,
    ) -> Result<(), Lost> {
        on_link_zero(from, k, "lane switch")?;
        let mapped = self
            .lanes
            .waiting
            .get(from as usize)
            .and_then(|w| lock(w).mapped.take());
        let Some(ring) = mapped else {
            return Err(protocol_lost(CollectiveError::protocol(
                Some(from),
                "switch to a shared-memory lane this rank did not map".to_owned(),
            )));
        };
        let socket = link.stream.try_clone().map_err(|e| {
            Lost::Gone(format!(
                "its link 0 switched to a shared-memory lane and this rank has no descriptor \
                 left to read it ({e})"
            ))
        })?;
        // Past the switch the socket carries only wake-ups and heartbeats.
        rx.start = rx.end;
        rx.header = None;
        link.switch_inbound(Box::new(LaneReader::new(ring, socket)));
        tracing::info!(
            peer = from,
            "peer {from}: its messages arrive through a shared-memory lane"
        );
        Ok(())
    }
}
