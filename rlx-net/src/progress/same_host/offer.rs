//! The offer: how two ranks of one host find out, once, when the transport is built, that
//! each may read the other's memory, and the same-host control frames the reader hands to this
//! room (a peer's offer, its switch of link 0 to a lane).
//!
//! A willing rank (its single-copy path or its lanes on) writes a [`FrameKind::Offer`] frame as the
//! first frame of link 0 to each peer on this host: its process id, the address and value of a
//! random nonce of its own, the address of its `accepted` word, and the name of its lane to that
//! peer (`lane.rs`), if it made one. A willing peer reads the nonce in the named process and,
//! when the bytes match, reads that peer's single-copy messages from that process from then on
//! and writes 1 into its `accepted` word (see `single_copy.rs` for the rest of the protocol).
//! Nothing waits for an answer: a missing permission or a peer that does not take the offer
//! leaves the fast paths off, and messages go over TCP as before.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::SameHost;
use crate::error::Lost;
use crate::frame::{FrameHeader, FrameKind, OFFER_LEN};
use crate::progress::link::{Link, LinkRx};

use super::lane::LaneIn;
use super::sys::cross_memory;

/// The segment size pipelined collectives use among ranks that all run on this host: the
/// largest they follow.
const ONE_HOST_SEGMENT: usize = rlx_transport::MAX_SEGMENT_HINT;

/// How long the offer waits for its socket (it is the first frame on an empty link).
pub(in crate::progress) const OFFER_WAIT: Duration = Duration::from_millis(100);

impl SameHost<'_> {
    /// The offers this rank makes, one per peer on this host, when a fast path is on (see the
    /// module docs): each is the body of one [`FrameKind::Offer`] frame, which the engine
    /// writes on that peer's first link before any message, waiting at most [`OFFER_WAIT`].
    /// Nothing waits for an answer; until one arrives, messages to that peer go over TCP.
    pub(in crate::progress) fn offers(&self) -> Vec<(u32, [u8; OFFER_LEN])> {
        if !self.same_host_willing() {
            return Vec::new();
        }
        let mut offers = Vec::new();
        for peer in (0..self.core.world).filter(|&p| p != self.core.rank) {
            let Some(words) = self
                .single_copy
                .peer(peer)
                .filter(|_| self.single_copy.on_this_host(peer))
            else {
                continue;
            };
            let mut offer = [0u8; OFFER_LEN];
            offer[0..8].copy_from_slice(&u64::from(cross_memory::own_pid()).to_le_bytes());
            let nonce = self.single_copy.nonce.as_ptr() as usize as u64;
            offer[8..16].copy_from_slice(&nonce.to_le_bytes());
            let accepted = words.accepted.as_ptr() as usize as u64;
            offer[16..24].copy_from_slice(&accepted.to_le_bytes());
            offer[24..40].copy_from_slice(&self.single_copy.nonce[..]);
            let (lane_fd, lane_id) = self.make_lane(peer);
            offer[40..48].copy_from_slice(&lane_fd.to_le_bytes());
            offer[48..56].copy_from_slice(&lane_id.to_le_bytes());
            offers.push((peer, offer));
        }
        offers
    }

    /// Makes the lane to `peer` (`lane.rs`) when lanes are on, and returns its name for the
    /// offer (zeros: none).
    fn make_lane(&self, peer: u32) -> (u64, u64) {
        if self.core.cfg.lane_bytes == 0 {
            return (0, 0);
        }
        self.lanes.make(peer, self.core.cfg.lane_bytes)
    }

    /// Takes `peer`'s offer (the bytes of a [`FrameKind::Offer`] frame) when the nonce is where
    /// the peer says, in the process it names. With the single-copy path on here, this rank
    /// then reads the peer's large messages from that process, and writes the peer's
    /// `accepted` word so that it starts sending them by single copy. Anything else leaves the
    /// path off for that peer and is not an error: the offer is an optimisation.
    ///
    /// Returns the peer's lane, mapped and accepted, when the offer names one and lanes are on
    /// here; link 0 reads it once the peer's switch frame arrives.
    pub(in crate::progress) fn take_offer(&self, peer: u32, offer: &[u8]) -> Option<LaneIn> {
        if !self.same_host_willing() {
            return None;
        }
        let words = self.single_copy.peer(peer)?;
        let word = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&offer[i..i + 8]);
            u64::from_le_bytes(w)
        };
        let pid = u32::try_from(word(0)).unwrap_or(0);
        words.accepted_at.store(word(16), Ordering::Relaxed);
        let mut seen = [0u8; 16];
        let proven = pid != 0
            && cross_memory::read_from(pid, &[(word(8), 16)], &mut seen).is_ok()
            && seen[..] == offer[24..40];
        if !proven {
            tracing::debug!(
                peer,
                pid,
                "same-host offer not taken: its nonce was not readable"
            );
            return None;
        }
        // The first proven process stays the peer's: a later offer naming another is ignored.
        let current =
            match words
                .pull_from
                .compare_exchange(0, pid, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => pid,
                Err(current) => current,
            };
        if current != pid {
            return None;
        }
        if self.single_copy_on() {
            match cross_memory::write_word(pid, word(16), 1) {
                Ok(()) => tracing::info!(
                    peer,
                    pid,
                    "peer {peer}: on this host; large messages by single copy (cross-memory attach)"
                ),
                Err(e) => tracing::debug!(peer, pid, %e, "single-copy offer not answered"),
            }
        }
        let (lane_fd, lane_id) = (word(40), word(48));
        if lane_fd == 0 || self.core.cfg.lane_bytes == 0 {
            return None;
        }
        LaneIn::open(pid, lane_fd, lane_id)
            .inspect_err(|e| tracing::debug!(peer, pid, %e, "lane not mapped; link 0 stays on TCP"))
            .ok()
    }

    /// The segment size for pipelined collectives among `members` when they all run on this
    /// host (see `Transport::segment_hint`). Where the ranks run is seen alike from both ends
    /// of every link, so every member answers alike, whatever its own `RLX_SINGLE_COPY`: a
    /// setting of one rank's would make the members cut their buffers differently. Over the
    /// single-copy path each message costs a round trip of about 17 µs on the reference
    /// machine and pipelining buys nothing; over loopback TCP (the path switched off, or not
    /// permitted) 4 MiB segments measured as fast as 256 KiB ones.
    pub(in crate::progress) fn segment_hint(&self, members: &[u32]) -> Option<usize> {
        let all_here = members
            .iter()
            .all(|&m| m == self.core.rank || self.single_copy.on_this_host(m));
        (cross_memory::SUPPORTED && members.len() > 1 && all_here).then_some(ONE_HOST_SEGMENT)
    }

    /// Whether this rank offers to be read and takes its peers' offers: the system has the
    /// calls, and the single-copy path or the lanes are on. Each fast path has its own switch
    /// (`RLX_SINGLE_COPY`, `RLX_LANE_BYTES`); the offer serves both.
    fn same_host_willing(&self) -> bool {
        cross_memory::SUPPORTED && (self.single_copy_on() || self.core.cfg.lane_bytes > 0)
    }

    /// Whether this rank's single-copy path is on (`RLX_SINGLE_COPY` did not turn it off).
    pub(super) fn single_copy_on(&self) -> bool {
        self.core.cfg.min_single_copy != u64::MAX
    }

    /// Whether this rank reads large messages from `peer` by single copy (for tests and tools).
    pub(in crate::progress) fn pulls_from(&self, peer: u32) -> bool {
        self.single_copy_on()
            && self
                .single_copy
                .peer(peer)
                .is_some_and(|p| p.pull_from.load(Ordering::Relaxed) != 0)
    }

    /// Handles a same-host control frame whose body the reader staged in `rx`: `from`'s offer
    /// (its lane kept for the switch when this rank mapped it), or its switch of link 0 to that
    /// lane (`switch.rs`).
    pub(in crate::progress) fn on_same_host_control(
        &self,
        from: u32,
        k: usize,
        link: &Link,
        rx: &mut LinkRx,
        header: &FrameHeader,
    ) -> Result<(), Lost> {
        if header.kind != FrameKind::Offer {
            return self.on_lane_switch(from, k, link, rx);
        }
        let offer = &rx.staging[rx.start..rx.start + OFFER_LEN];
        if let Some(lane) = self.take_offer(from, offer) {
            self.lanes.keep_mapped(from, lane);
        }
        rx.start += OFFER_LEN;
        rx.header = None;
        Ok(())
    }
}
