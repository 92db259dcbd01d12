//! Routing and the send paths of an [`MlxTransport`](crate::MlxTransport): which link a frame
//! for a rank leaves on and through which link a rank's frames arrive, and how a frame goes
//! out: on the caller's thread when it is small and its link idle, else queued for the link's
//! sender thread, its body staged in an MLX array when that saves a copy. Every frame is a
//! [`FIRST_LEN`]-byte first piece (header and the start of the body) and, for longer bodies,
//! further pieces of at most [`PIECE_LEN`] bytes.

use rlx_transport::{CollectiveError, Result};

use crate::ffi::{HostArray, MAX_SEND_PARTS, ShimError};
use crate::frame::{HEADER_LEN, Header};
use crate::native::MlxDtype;
use crate::shared::{FIRST_LEN, Outgoing, PIECE_LEN, Shared};
use crate::sync::lock;

impl Shared {
    /// The index of the link to `peer`, if this rank is linked to it.
    pub(crate) fn link_index(&self, peer: u32) -> Option<usize> {
        self.links.iter().position(|l| l.peer == peer)
    }

    /// Number of links a message from this rank to `dst` crosses.
    pub(crate) fn hops_to(&self, dst: u32) -> u32 {
        let mut at = self.rank;
        let mut hops = 0;
        while at != dst && hops < self.world {
            at = self.topology.next_hop(at, dst, self.world);
            hops += 1;
        }
        hops
    }

    /// The linked peer through which messages from `src` arrive here.
    pub(crate) fn last_hop_from(&self, src: u32) -> u32 {
        let mut at = src;
        for _ in 0..self.world {
            let next = self.topology.next_hop(at, self.rank, self.world);
            if next == self.rank {
                return at;
            }
            at = next;
        }
        at
    }

    /// The index of the usable link a frame for `header.dst` leaves on.
    fn first_hop_link(&self, header: &Header) -> Result<usize> {
        let hop = self.topology.next_hop(self.rank, header.dst, self.world);
        let index = self.link_index(hop).ok_or_else(|| {
            CollectiveError::unsupported(format!(
                "rank {} has no MLX link towards rank {} (next hop {hop})",
                self.rank, header.dst
            ))
        })?;
        self.check_link(index, hop)?;
        Ok(index)
    }

    /// Fails when the transport is going away or link `index` (to `hop`) is dead.
    fn check_link(&self, index: usize, hop: u32) -> Result<()> {
        let state = lock(&self.state);
        if state.aborted || state.closing {
            return Err(CollectiveError::Aborted);
        }
        if let Some(reason) = &state.dead[index] {
            return Err(CollectiveError::PeerLost {
                peer: hop,
                reason: reason.clone(),
            });
        }
        Ok(())
    }

    /// Queues a frame for `to` (another rank) on the link of the first hop.
    pub(crate) fn enqueue(&self, header: Header, body: Vec<u8>) -> Result<()> {
        let index = self.first_hop_link(&header)?;
        self.links[index].push(Outgoing::Frame(header, body));
        Ok(())
    }

    /// Sends a caller's frame: small ones go out on the calling thread when the link is
    /// idle (a hand-off to the sender thread costs a wake-up, and on a small machine a
    /// receiver busy-polling in MLX can delay that thread by a scheduler tick); the rest
    /// are queued behind the link's earlier frames.
    pub(crate) fn send_or_enqueue(&self, header: Header, body: Vec<u8>) -> Result<()> {
        self.send_directly_up_to(header, &[&body], FIRST_LEN - HEADER_LEN)
    }

    /// [`Shared::send_or_enqueue`] of the body made of `parts`, sending bodies of up to
    /// `direct_max` bytes on the calling thread when the link is idle. A large direct send can
    /// wait for the peer to read, so only the direct exchange, whose peers are reading while
    /// they take part, raises the limit (see
    /// [`EXCHANGE_DIRECT_SEND_MAX`](crate::exchange::EXCHANGE_DIRECT_SEND_MAX)).
    pub(crate) fn send_directly_up_to(
        &self,
        header: Header,
        parts: &[&[u8]],
        direct_max: usize,
    ) -> Result<()> {
        let hop = self.topology.next_hop(self.rank, header.dst, self.world);
        if parts.iter().map(|p| p.len()).sum::<usize>() <= direct_max {
            if let Some(index) = self.link_index(hop) {
                let link = &self.links[index];
                if let Ok(_sending) = link.sending.try_lock() {
                    if lock(&link.queue).is_empty() {
                        self.check_link(index, hop)?;
                        return self.send_frame(hop, &header, parts).map_err(|e| {
                            let reason = format!("MLX send to rank {hop} failed: {e}");
                            self.link_failed(index, reason.clone());
                            CollectiveError::PeerLost { peer: hop, reason }
                        });
                    }
                }
            }
        }
        self.enqueue_staged(header, parts)
    }

    /// Sends one frame, whose body is `parts` one after the other, over MLX to the linked
    /// `peer`.
    pub(crate) fn send_frame(
        &self,
        peer: u32,
        header: &Header,
        parts: &[&[u8]],
    ) -> Result<(), ShimError> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let head = header.encode();
        let zeros = [0u8; FIRST_LEN];
        // A first piece is always FIRST_LEN bytes long, so a short body is padded.
        let pad = &zeros[..FIRST_LEN.saturating_sub(HEADER_LEN + len)];
        if self.byte_stream && len <= PIECE_LEN - HEADER_LEN {
            // One MLX send instead of two: the receiver still reads the first piece and the
            // rest separately, which a byte stream allows.
            if parts.len() + 2 > MAX_SEND_PARTS {
                return self.send_frame(peer, header, &[&parts.concat()]);
            }
            // Gathered on the stack: no allocation per frame.
            let mut gathered: [&[u8]; MAX_SEND_PARTS] = [&[]; MAX_SEND_PARTS];
            gathered[0] = &head;
            gathered[1..=parts.len()].copy_from_slice(parts);
            gathered[parts.len() + 1] = pad;
            return self.group.send_parts(peer, &gathered[..parts.len() + 2]);
        }
        let joined;
        let body = match parts {
            [] => &[][..],
            [one] => one,
            _ => {
                joined = parts.concat();
                &joined[..]
            }
        };
        let inline = body.len().min(FIRST_LEN - HEADER_LEN);
        self.group
            .send_parts(peer, &[&head, &body[..inline], pad])?;
        for piece in body[inline..].chunks(PIECE_LEN) {
            self.group.send(peer, piece)?;
        }
        Ok(())
    }

    /// Sends one frame whose body is `head` and then the bytes of `rest` (see
    /// [`Outgoing::Staged`]) over MLX to the linked `peer`: the first piece and whatever of
    /// the body precedes the array go out gathered, the array as a message of its own. The
    /// receiver reads a frame as its first piece and then the rest of the body, however the
    /// sender cut it, since `head` is exactly what the first piece holds of the body.
    pub(crate) fn send_staged(
        &self,
        peer: u32,
        header: &Header,
        head: &[u8],
        rest: &HostArray,
    ) -> Result<(), ShimError> {
        let encoded = header.encode();
        let zeros = [0u8; FIRST_LEN];
        let pad = &zeros[..FIRST_LEN.saturating_sub(HEADER_LEN + head.len())];
        self.group.send_parts(peer, &[&encoded, head, pad])?;
        if rest.nbytes() > 0 {
            self.group.send_array(peer, rest)?;
        }
        Ok(())
    }

    /// Queues frame `header` whose body is `parts` one after the other for the link to
    /// `header.dst`, staged in an MLX array (see [`Outgoing::Staged`]) when it is longer than
    /// a first piece, so that it is copied once on its way out.
    fn enqueue_staged(&self, header: Header, parts: &[&[u8]]) -> Result<()> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let inline = FIRST_LEN - HEADER_LEN;
        // Frames the first piece holds whole, or too long for one MLX message, take the
        // ordinary queue.
        if len <= inline || len - inline > PIECE_LEN {
            return self.enqueue(header, parts.concat());
        }
        let mut head = Vec::with_capacity(inline);
        let mut rest: Option<&[u8]> = None;
        for (i, part) in parts.iter().enumerate() {
            let room = inline - head.len();
            if part.len() <= room {
                head.extend_from_slice(part);
                continue;
            }
            head.extend_from_slice(&part[..room]);
            if i + 1 == parts.len() {
                rest = Some(&part[room..]);
            }
            break;
        }
        let Some(rest) = rest else {
            // The bytes after the first piece span several parts: not worth staging.
            return self.enqueue(header, parts.concat());
        };
        let index = self.first_hop_link(&header)?;
        let staged = self
            .arrays
            .filled(MlxDtype::U8, rest)
            .map_err(|e| e.into_error("send"))?;
        self.links[index].push(Outgoing::Staged(header, head, staged));
        Ok(())
    }
}
