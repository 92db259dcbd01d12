//! The frame format of an established link: a fixed 48-byte header, then the payload.
//!
//! Pure functions, no I/O: [`FrameHeader::encode`] and [`FrameHeader::decode`] are all the
//! progress engine knows about bytes on the wire, and the tests below drive them without
//! sockets.
//!
//! | bytes | field | meaning |
//! |---|---|---|
//! | 0 | kind | [`FrameKind`] |
//! | 1..8 | reserved | zero |
//! | 8..16 | tag | the operation identity ([`Tag::raw`]) |
//! | 16..24 | seq | the sender's message number towards this peer (0, 1, 2, ...) |
//! | 24..32 | total | the whole message's length |
//! | 32..40 | offset | where this frame's payload starts inside the message |
//! | 40..48 | len | this frame's payload length |
//!
//! All integers are little-endian `u64`s. A message travels as one frame, or, striped over
//! several links, as one frame per link covering disjoint ranges; the frame at offset 0 always
//! travels on link 0, so link 0 sees every message in send order. A message between two ranks
//! of one host may instead travel as one [`FrameKind::SingleCopy`] frame on link 0, whose bytes on
//! the wire say where the receiver reads the message in the sender's memory.

use rlx_transport::{CollectiveError, FAILURE_WIRE_LEN, Tag};

/// Payload length of a [`FrameKind::Offer`] frame: the sender's process id, the addresses of
/// its nonce and of its `accepted` word, the 16-byte nonce, and its lane file's descriptor
/// number and id (zero when it has none).
pub(crate) const OFFER_LEN: usize = 56;

/// Encoded size of a [`FrameHeader`].
pub(crate) const HEADER_LEN: usize = 48;

/// What a frame carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FrameKind {
    /// (Part of) a message body.
    Data = 1,
    /// A [`rlx_transport::Failure`] notice for `tag`; the payload is its [`FAILURE_WIRE_LEN`](rlx_transport::FAILURE_WIRE_LEN)-byte encoding.
    Failure = 2,
    /// The sender is closing its transport on purpose; no payload, no seq of its own.
    Close = 3,
    /// A heartbeat: the sender's transport is alive, and this link was silent in its direction
    /// for a while. No payload, no seq of its own; the receiver only notes that it heard.
    Beat = 4,
    /// A whole message the receiver reads from the sender's memory (same host, see
    /// `progress/single_copy.rs`): `total` and `len` are the message's length, offset 0, and
    /// the frame's bytes on the wire are a fixed-size descriptor of where the message lies.
    SingleCopy = 5,
    /// An offer to be read by the single-copy path: the sender's process id and where its
    /// nonce and its `accepted` word lie (`progress/single_copy.rs`). A fixed-size payload,
    /// no seq of its own; the first frame of link 0 between ranks of one host.
    Offer = 6,
    /// From the next byte on, link 0 carries the sender's frames through the shared-memory
    /// lane its offer named (`progress/lane.rs`); the socket carries only wake-ups and
    /// heartbeats. No payload, no seq of its own.
    Lane = 7,
}

/// A decoded frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FrameHeader {
    pub(crate) kind: FrameKind,
    pub(crate) tag: Tag,
    pub(crate) seq: u64,
    pub(crate) total: u64,
    pub(crate) offset: u64,
    pub(crate) len: u64,
}

impl FrameHeader {
    /// A header for the whole of a message of `len` bytes.
    pub(crate) fn whole(kind: FrameKind, tag: Tag, seq: u64, len: u64) -> Self {
        Self {
            kind,
            tag,
            seq,
            total: len,
            offset: 0,
            len,
        }
    }

    /// The header's 48 bytes.
    pub(crate) fn encode(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        out[0] = self.kind as u8;
        out[8..16].copy_from_slice(&self.tag.raw().to_le_bytes());
        out[16..24].copy_from_slice(&self.seq.to_le_bytes());
        out[24..32].copy_from_slice(&self.total.to_le_bytes());
        out[32..40].copy_from_slice(&self.offset.to_le_bytes());
        out[40..48].copy_from_slice(&self.len.to_le_bytes());
        out
    }

    /// Decodes and validates a header received from `peer`; `max_frame` is the frame cap (the
    /// largest message this side accepts). Every length is checked before anyone may allocate
    /// from it.
    pub(crate) fn decode(
        peer: u32,
        bytes: &[u8; HEADER_LEN],
        max_frame: u64,
    ) -> Result<Self, CollectiveError> {
        let bad = |detail: String| CollectiveError::protocol(Some(peer), detail);
        let word = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&bytes[i..i + 8]);
            u64::from_le_bytes(w)
        };
        let kind = match bytes[0] {
            1 => FrameKind::Data,
            2 => FrameKind::Failure,
            3 => FrameKind::Close,
            4 => FrameKind::Beat,
            5 => FrameKind::SingleCopy,
            6 => FrameKind::Offer,
            7 => FrameKind::Lane,
            other => return Err(bad(format!("unknown frame kind {other}"))),
        };
        if bytes[1..8].iter().any(|&b| b != 0) {
            return Err(bad("reserved frame header bytes are not zero".to_owned()));
        }
        let header = Self {
            kind,
            tag: Tag::from_raw(word(8)),
            seq: word(16),
            total: word(24),
            offset: word(32),
            len: word(40),
        };
        if header.total > max_frame {
            return Err(bad(format!(
                "frame of {} bytes exceeds the frame cap of {max_frame} bytes",
                header.total
            )));
        }
        let end = header.offset.checked_add(header.len);
        if end.is_none_or(|end| end > header.total) {
            return Err(bad(format!(
                "frame range {}+{} lies outside its message of {} bytes",
                header.offset, header.len, header.total
            )));
        }
        if let Some(detail) = header.payload_error() {
            return Err(bad(detail));
        }
        Ok(header)
    }

    /// What is wrong with the payload length a header of its kind announces, if anything:
    /// control frames carry fixed bodies or none, and a single-copy frame covers its whole
    /// message.
    fn payload_error(&self) -> Option<String> {
        match self.kind {
            FrameKind::Data => {}
            FrameKind::Failure => {
                if self.total != FAILURE_WIRE_LEN as u64 || self.len != self.total {
                    return Some(format!(
                        "failure notice of {} bytes (expected {FAILURE_WIRE_LEN})",
                        self.total
                    ));
                }
            }
            FrameKind::Close => {
                if self.total != 0 {
                    return Some("close frame with a payload".to_owned());
                }
            }
            FrameKind::Beat => {
                if self.total != 0 {
                    return Some("heartbeat frame with a payload".to_owned());
                }
            }
            FrameKind::Lane => {
                if self.total != 0 {
                    return Some("lane switch frame with a payload".to_owned());
                }
            }
            FrameKind::Offer => {
                if self.total != OFFER_LEN as u64 || self.len != self.total {
                    return Some(format!(
                        "single-copy offer of {} bytes (expected {OFFER_LEN})",
                        self.total
                    ));
                }
            }
            FrameKind::SingleCopy => {
                if self.total == 0 || self.offset != 0 || self.len != self.total {
                    return Some(format!(
                        "single-copy frame covering {}+{} of a message of {} bytes (it must cover a whole, non-empty one)",
                        self.offset, self.len, self.total
                    ));
                }
            }
        }
        None
    }
}

/// How a message of `total` bytes is cut into stripes over `links` links: stripe `i` covers
/// `range(i)`. Messages below `min_striped` bytes (or with one link) are one stripe on link 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Striping {
    total: u64,
    stripes: u64,
    stripe_len: u64,
}

/// Stripes start on multiples of this, so that each lands on page boundaries of the buffer.
const STRIPE_ALIGN: u64 = 4096;

impl Striping {
    pub(crate) fn new(total: u64, links: usize, min_striped: u64) -> Self {
        let links = links.max(1) as u64;
        if links == 1 || total < min_striped {
            return Self {
                total,
                stripes: 1,
                stripe_len: total,
            };
        }
        let per = total.div_ceil(links).div_ceil(STRIPE_ALIGN) * STRIPE_ALIGN;
        Self {
            total,
            stripes: total.div_ceil(per),
            stripe_len: per,
        }
    }

    /// Number of stripes (one per link used, starting at link 0).
    pub(crate) fn count(&self) -> usize {
        self.stripes as usize
    }

    /// `(offset, len)` of stripe `i`.
    pub(crate) fn range(&self, i: usize) -> (u64, u64) {
        let start = (i as u64 * self.stripe_len).min(self.total);
        let end = (start + self.stripe_len).min(self.total);
        (start, end - start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAP: u64 = 1 << 20;

    #[test]
    fn headers_round_trip() {
        let h = FrameHeader {
            kind: FrameKind::Data,
            tag: Tag::op(3, 9, 1),
            seq: u64::MAX - 1,
            total: CAP,
            offset: 4096,
            len: CAP - 4096,
        };
        assert_eq!(FrameHeader::decode(1, &h.encode(), CAP).unwrap(), h);
        let f = FrameHeader::whole(
            FrameKind::Failure,
            Tag::user(1).unwrap(),
            0,
            FAILURE_WIRE_LEN as u64,
        );
        assert_eq!(FrameHeader::decode(1, &f.encode(), CAP).unwrap(), f);
        let c = FrameHeader::whole(FrameKind::Close, Tag::from_raw(0), 0, 0);
        assert_eq!(FrameHeader::decode(1, &c.encode(), CAP).unwrap(), c);
        let b = FrameHeader::whole(FrameKind::Beat, Tag::from_raw(0), 0, 0);
        assert_eq!(FrameHeader::decode(1, &b.encode(), CAP).unwrap(), b);
        let p = FrameHeader::whole(FrameKind::SingleCopy, Tag::op(1, 2, 0), 5, CAP);
        assert_eq!(FrameHeader::decode(1, &p.encode(), CAP).unwrap(), p);
        let o = FrameHeader::whole(FrameKind::Offer, Tag::from_raw(0), 0, OFFER_LEN as u64);
        assert_eq!(FrameHeader::decode(1, &o.encode(), CAP).unwrap(), o);
        let l = FrameHeader::whole(FrameKind::Lane, Tag::from_raw(0), 0, 0);
        assert_eq!(FrameHeader::decode(1, &l.encode(), CAP).unwrap(), l);
    }

    fn refused(bytes: [u8; HEADER_LEN]) -> String {
        match FrameHeader::decode(7, &bytes, CAP) {
            Err(CollectiveError::Protocol {
                peer: Some(7),
                detail,
            }) => detail,
            other => panic!("expected a protocol error, got {other:?}"),
        }
    }

    #[test]
    fn oversized_frames_name_length_and_cap() {
        let h = FrameHeader::whole(FrameKind::Data, Tag::from_raw(0), 0, CAP + 1);
        let detail = refused(h.encode());
        assert!(detail.contains(&(CAP + 1).to_string()), "{detail}");
        assert!(detail.contains(&CAP.to_string()), "{detail}");
        let huge = FrameHeader::whole(FrameKind::Data, Tag::from_raw(0), 0, u64::MAX);
        refused(huge.encode());
    }

    #[test]
    fn hostile_headers_are_refused() {
        let mut unknown = FrameHeader::whole(FrameKind::Data, Tag::from_raw(0), 0, 1).encode();
        unknown[0] = 99;
        refused(unknown);
        let mut reserved = FrameHeader::whole(FrameKind::Data, Tag::from_raw(0), 0, 1).encode();
        reserved[5] = 1;
        refused(reserved);
        let overflow = FrameHeader {
            kind: FrameKind::Data,
            tag: Tag::from_raw(0),
            seq: 0,
            total: 10,
            offset: u64::MAX,
            len: 2,
        };
        refused(overflow.encode());
        let outside = FrameHeader {
            offset: 8,
            len: 3,
            ..overflow
        };
        refused(outside.encode());
        refused(FrameHeader::whole(FrameKind::Failure, Tag::from_raw(0), 0, 16).encode());
        refused(FrameHeader::whole(FrameKind::Close, Tag::from_raw(0), 0, 1).encode());
        refused(FrameHeader::whole(FrameKind::Beat, Tag::from_raw(0), 0, 1).encode());
        refused(FrameHeader::whole(FrameKind::Lane, Tag::from_raw(0), 0, 1).encode());
        let partial_pull = FrameHeader {
            kind: FrameKind::SingleCopy,
            offset: 0,
            len: 4,
            ..overflow
        };
        refused(partial_pull.encode());
        refused(FrameHeader::whole(FrameKind::Offer, Tag::from_raw(0), 0, 8).encode());
        refused([0xAB; HEADER_LEN]);
    }

    #[test]
    fn stripes_cover_the_message_exactly() {
        for total in [0u64, 1, 4095, 4096, 1 << 20, (1 << 20) + 7, 10_000_019] {
            for links in 1..=5 {
                let s = Striping::new(total, links, 64 * 1024);
                assert!(s.count() >= 1 && s.count() <= links);
                let mut next = 0;
                for i in 0..s.count() {
                    let (offset, len) = s.range(i);
                    assert_eq!(offset, next);
                    assert!(len > 0 || total == 0);
                    next += len;
                }
                assert_eq!(next, total, "total {total} links {links}");
            }
        }
        assert_eq!(Striping::new(1000, 4, 64 * 1024).count(), 1);
    }
}
