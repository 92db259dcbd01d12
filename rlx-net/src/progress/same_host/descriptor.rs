//! The single-copy descriptor: the bytes of the one frame that announces a message carried by
//! single copy, saying where its parts lie in the sender's memory, where the sender's `offered`
//! and `taken` words are, and which head of it is bounced (`bounce.rs`). Pure encoding and
//! checking, no I/O.

use rlx_transport::CollectiveError;

use crate::error::{Lost, protocol_lost};

/// Most parts (slices of the caller's) a pulled message may have; a message in more parts is
/// sent over TCP.
pub(crate) const MAX_PARTS: usize = 4;

/// Encoded size of a [`Descriptor`].
pub(crate) const DESCRIPTOR_LEN: usize = 48 + 16 * MAX_PARTS;

/// Where the bytes of a pulled message lie in the sender's memory, and the sender's words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Descriptor {
    /// Address of the sender's `offered` word.
    pub(crate) offered: u64,
    /// Address of the sender's `taken` word.
    pub(crate) taken: u64,
    /// `(address, length)` of each part, in message order.
    pub(crate) parts: [(u64, u64); MAX_PARTS],
    /// How many entries of `parts` are used.
    pub(crate) count: usize,
    /// The message's head, bounced through the sender's shared-memory file (`bounce.rs`).
    pub(crate) bounced: BouncedHead,
}

impl Descriptor {
    /// The descriptor's bytes: `offered`, `taken`, the part count, the bounce file's
    /// descriptor number, id and bounced length, then `MAX_PARTS` pairs of address and length
    /// (unused ones zero), all little-endian `u64`s.
    pub(crate) fn encode(&self) -> [u8; DESCRIPTOR_LEN] {
        let mut out = [0u8; DESCRIPTOR_LEN];
        out[0..8].copy_from_slice(&self.offered.to_le_bytes());
        out[8..16].copy_from_slice(&self.taken.to_le_bytes());
        out[16..24].copy_from_slice(&(self.count as u64).to_le_bytes());
        out[24..32].copy_from_slice(&self.bounced.fd.to_le_bytes());
        out[32..40].copy_from_slice(&self.bounced.id.to_le_bytes());
        out[40..48].copy_from_slice(&self.bounced.len.to_le_bytes());
        for (i, (addr, len)) in self.parts.iter().enumerate() {
            let at = PARTS_AT + 16 * i;
            out[at..at + 8].copy_from_slice(&addr.to_le_bytes());
            out[at + 8..at + 16].copy_from_slice(&len.to_le_bytes());
        }
        out
    }

    /// Decodes and checks a descriptor from `peer` for a message of `total` bytes: the parts
    /// must add up to exactly `total`, unused entries must be zero, and the bounced head must
    /// lie inside the message (with no file named when nothing is bounced).
    pub(crate) fn decode(
        peer: u32,
        bytes: &[u8; DESCRIPTOR_LEN],
        total: u64,
    ) -> Result<Self, CollectiveError> {
        let word = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&bytes[i..i + 8]);
            u64::from_le_bytes(w)
        };
        let bad = |detail: String| CollectiveError::protocol(Some(peer), detail);
        let count = word(16);
        if count == 0 || count > MAX_PARTS as u64 {
            return Err(bad(format!(
                "single-copy descriptor with {count} parts (1 to {MAX_PARTS} are allowed)"
            )));
        }
        let mut parts = [(0u64, 0u64); MAX_PARTS];
        let mut sum = 0u64;
        for (i, part) in parts.iter_mut().enumerate() {
            *part = (word(PARTS_AT + 16 * i), word(PARTS_AT + 8 + 16 * i));
            if i as u64 >= count && *part != (0, 0) {
                return Err(bad(
                    "single-copy descriptor with stray part bytes".to_owned()
                ));
            }
            sum = sum.checked_add(part.1).ok_or_else(|| {
                bad("single-copy descriptor whose part lengths overflow".to_owned())
            })?;
        }
        if sum != total {
            return Err(bad(format!(
                "single-copy descriptor covers {sum} bytes of a message of {total}"
            )));
        }
        let bounced = BouncedHead {
            fd: word(24),
            id: word(32),
            len: word(40),
        };
        if bounced.len > total || (bounced.len == 0 && bounced != BouncedHead::default()) {
            return Err(bad(format!(
                "single-copy descriptor bounces {} bytes of a message of {total} (file {}, id {:#x})",
                bounced.len, bounced.fd, bounced.id
            )));
        }
        Ok(Self {
            offered: word(0),
            taken: word(8),
            parts,
            count: count as usize,
            bounced,
        })
    }
}

/// Where the parts of a [`Descriptor`] start in its bytes.
const PARTS_AT: usize = 48;

/// What a descriptor says about the bounced head of its message.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct BouncedHead {
    /// The sender's descriptor number of its bounce file.
    pub(crate) fd: u64,
    /// The file's id (in its second word).
    pub(crate) id: u64,
    /// How many bytes of the message's start are bounced (0: none).
    pub(crate) len: u64,
}

/// Decodes a pulled frame's descriptor, as a protocol failure of the peer when it is bad.
pub(in crate::progress) fn descriptor(
    from: u32,
    bytes: &[u8],
    total: u64,
) -> Result<Descriptor, Lost> {
    let mut raw = [0u8; DESCRIPTOR_LEN];
    raw.copy_from_slice(&bytes[..DESCRIPTOR_LEN]);
    Descriptor::decode(from, &raw, total).map_err(protocol_lost)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_round_trip_and_bad_ones_are_refused() {
        let d = Descriptor {
            offered: 0x1000,
            taken: 0x1008,
            parts: [(0x7000, 100), (0x9000, 28), (0, 0), (0, 0)],
            count: 2,
            bounced: BouncedHead {
                fd: 9,
                id: 0x55,
                len: 100,
            },
        };
        assert_eq!(Descriptor::decode(3, &d.encode(), 128).unwrap(), d);
        let refused =
            |bytes: [u8; DESCRIPTOR_LEN], total: u64| match Descriptor::decode(3, &bytes, total) {
                Err(CollectiveError::Protocol {
                    peer: Some(3),
                    detail,
                }) => detail,
                other => panic!("expected a protocol error, got {other:?}"),
            };
        assert!(refused(d.encode(), 129).contains("128 bytes of a message of 129"));
        let mut none = d;
        none.count = 0;
        refused(none.encode(), 128);
        let mut many = d.encode();
        many[16..24].copy_from_slice(&5u64.to_le_bytes());
        refused(many, 128);
        let mut stray = d.encode();
        stray[PARTS_AT + 16 * 3] = 1;
        refused(stray, 128);
        let mut past = d;
        past.bounced.len = 129;
        assert!(refused(past.encode(), 128).contains("bounces 129 bytes"));
        let mut nameless = d;
        nameless.bounced.len = 0;
        refused(nameless.encode(), 128);
        let huge = Descriptor {
            parts: [(1, u64::MAX), (2, u64::MAX), (0, 0), (0, 0)],
            ..d
        };
        refused(huge.encode(), u64::MAX);
    }
}
