//! The header RLX puts in front of every message it sends over MLX's untagged send/recv, so
//! that the receiving side can demultiplex by tag, route, and pause for native collectives.
//!
//! A header is [`HEADER_LEN`] bytes, little-endian:
//!
//! | bytes | field |
//! |-------|-------|
//! | 0..4  | magic `RLXM` |
//! | 4     | kind ([`Kind`]) |
//! | 5..8  | zero |
//! | 8..12 | source rank |
//! | 12..16| destination rank |
//! | 16..24| tag (for a pause: the operation descriptor) |
//! | 24..32| body length in bytes (for a pause: the operation's byte length) |

use rlx_transport::{CollectiveError, Result};

/// Size of an encoded [`Header`].
pub(crate) const HEADER_LEN: usize = 32;

const MAGIC: [u8; 4] = *b"RLXM";

/// What a header announces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A message body of `len` bytes follows.
    Data,
    /// A [`rlx_transport::Failure`] notice of `len` bytes follows.
    Failure,
    /// The sender stops sending until its native collective is done; no body.
    Pause,
    /// The sender's transport is closing; no body, nothing follows.
    Bye,
}

impl Kind {
    const fn code(self) -> u8 {
        match self {
            Kind::Data => 1,
            Kind::Failure => 2,
            Kind::Pause => 3,
            Kind::Bye => 4,
        }
    }

    fn from_code(code: u8) -> Option<Kind> {
        [Kind::Data, Kind::Failure, Kind::Pause, Kind::Bye]
            .into_iter()
            .find(|k| k.code() == code)
    }
}

/// A decoded header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    pub(crate) kind: Kind,
    pub(crate) src: u32,
    pub(crate) dst: u32,
    pub(crate) tag: u64,
    pub(crate) len: u64,
}

impl Header {
    pub(crate) fn encode(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        out[0..4].copy_from_slice(&MAGIC);
        out[4] = self.kind.code();
        out[8..12].copy_from_slice(&self.src.to_le_bytes());
        out[12..16].copy_from_slice(&self.dst.to_le_bytes());
        out[16..24].copy_from_slice(&self.tag.to_le_bytes());
        out[24..32].copy_from_slice(&self.len.to_le_bytes());
        out
    }

    /// Decodes a header received from the linked peer `peer` in a world of `world` ranks,
    /// refusing bodies longer than `max_body`.
    pub(crate) fn decode(
        bytes: &[u8; HEADER_LEN],
        peer: u32,
        world: u32,
        max_body: u64,
    ) -> Result<Header> {
        let bad = |detail: String| CollectiveError::protocol(Some(peer), detail);
        if bytes[0..4] != MAGIC {
            return Err(bad(format!(
                "bad frame magic {:02x?} (not an RLX peer or a desynchronised link)",
                &bytes[0..4]
            )));
        }
        let kind = Kind::from_code(bytes[4])
            .ok_or_else(|| bad(format!("unknown frame kind {}", bytes[4])))?;
        let word = |r: std::ops::Range<usize>| {
            let mut b = [0u8; 4];
            b.copy_from_slice(&bytes[r]);
            u32::from_le_bytes(b)
        };
        let long = |r: std::ops::Range<usize>| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&bytes[r]);
            u64::from_le_bytes(b)
        };
        let header = Header {
            kind,
            src: word(8..12),
            dst: word(12..16),
            tag: long(16..24),
            len: long(24..32),
        };
        if header.src >= world || header.dst >= world {
            return Err(bad(format!(
                "frame from rank {} to rank {} in a world of {world}",
                header.src, header.dst
            )));
        }
        let body = match kind {
            Kind::Data | Kind::Failure => header.len,
            Kind::Pause | Kind::Bye => 0,
        };
        if body > max_body {
            return Err(bad(format!(
                "frame body of {body} bytes exceeds the limit of {max_body}"
            )));
        }
        Ok(header)
    }

    /// Length of the body that follows this header.
    pub(crate) fn body_len(&self) -> u64 {
        match self.kind {
            Kind::Data | Kind::Failure => self.len,
            Kind::Pause | Kind::Bye => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_garbage() {
        let h = Header {
            kind: Kind::Data,
            src: 2,
            dst: 0,
            tag: 0xFFFF_0000_0001_0002,
            len: 1 << 20,
        };
        assert_eq!(Header::decode(&h.encode(), 1, 3, 1 << 20).unwrap(), h);
        assert!(Header::decode(&h.encode(), 1, 3, (1 << 20) - 1).is_err());
        assert!(Header::decode(&h.encode(), 1, 2, 1 << 20).is_err());
        let mut bad = h.encode();
        bad[0] = b'X';
        assert!(Header::decode(&bad, 1, 3, u64::MAX).is_err());
        let mut bad = h.encode();
        bad[4] = 9;
        assert!(Header::decode(&bad, 1, 3, u64::MAX).is_err());
        let pause = Header {
            kind: Kind::Pause,
            len: u64::MAX,
            ..h
        };
        let decoded = Header::decode(&pause.encode(), 1, 3, 0).unwrap();
        assert_eq!(decoded.body_len(), 0);
        assert_eq!(decoded.len, u64::MAX);
    }
}
