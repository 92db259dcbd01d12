//! [`Failure`]: the notice a rank sends its peers when its part of an operation failed, and
//! its fixed-size wire format, so that the peers fail fast with an error that says why.

use crate::error::FatalCause;
use crate::{CollectiveError, Result};

/// A notice that a rank's part of an operation failed, sent with [`Transport::send_failure`](crate::Transport::send_failure) so
/// that peers fail fast with an error that says why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Failure {
    /// The sender found a length that did not match its own.
    LengthMismatch {
        /// The length the sender expected.
        expected: u64,
        /// The length the sender found.
        got: u64,
        /// What the sender itself passed to the operation, in bytes, when it knows: from the
        /// notices of every member, each can tell whose length differs.
        own: Option<u64>,
    },
    /// The sender's operation failed for a reason that concerns this operation only (an invalid
    /// argument, an unsupported request, ...).
    Failed,
    /// The sender's group can no longer be trusted: a fatal failure of kind `cause` involving
    /// world rank `culprit` (see [`CollectiveError::GroupFailed`]).
    GroupFailed {
        /// The rank the failure is about.
        culprit: u32,
        /// What kind of failure it was.
        cause: FatalCause,
    },
}

/// Encoded size of a [`Failure`] on the wire.
pub const FAILURE_WIRE_LEN: usize = 25;

/// The third field of a length mismatch that says the sender does not know its own length.
const UNKNOWN_LEN: u64 = u64::MAX;

impl Failure {
    /// The failure as 25 bytes (kind, then three little-endian `u64`s).
    pub fn encode(self) -> [u8; FAILURE_WIRE_LEN] {
        let (kind, a, b, c) = match self {
            Failure::LengthMismatch { expected, got, own } => {
                (1u8, expected, got, own.unwrap_or(UNKNOWN_LEN))
            }
            Failure::Failed => (2u8, 0, 0, 0),
            Failure::GroupFailed { culprit, cause } => {
                (3u8, u64::from(culprit), u64::from(cause.code()), 0)
            }
        };
        let mut out = [0u8; FAILURE_WIRE_LEN];
        out[0] = kind;
        out[1..9].copy_from_slice(&a.to_le_bytes());
        out[9..17].copy_from_slice(&b.to_le_bytes());
        out[17..25].copy_from_slice(&c.to_le_bytes());
        out
    }

    /// Decodes [`Failure::encode`]'s bytes received from `peer`.
    pub fn decode(peer: u32, bytes: &[u8]) -> Result<Failure> {
        let bad = || CollectiveError::protocol(Some(peer), "malformed failure notice");
        let bytes: &[u8; FAILURE_WIRE_LEN] = bytes.try_into().map_err(|_| bad())?;
        let field = |at: usize| {
            let mut word = [0u8; 8];
            word.copy_from_slice(&bytes[at..at + 8]);
            u64::from_le_bytes(word)
        };
        let (a, b, c) = (field(1), field(9), field(17));
        match bytes[0] {
            1 => Ok(Failure::LengthMismatch {
                expected: a,
                got: b,
                own: (c != UNKNOWN_LEN).then_some(c),
            }),
            // The encoder writes zeros after these kinds' fields; anything else is not our
            // notice.
            2 if a == 0 && b == 0 && c == 0 => Ok(Failure::Failed),
            3 if c != 0 => Err(bad()),
            3 => {
                let culprit = u32::try_from(a).map_err(|_| bad())?;
                let cause = u8::try_from(b)
                    .ok()
                    .and_then(FatalCause::from_code)
                    .ok_or_else(bad)?;
                Ok(Failure::GroupFailed { culprit, cause })
            }
            _ => Err(bad()),
        }
    }

    /// The error a receiver returns when it finds this notice from `peer`.
    pub fn into_error(self, peer: u32) -> CollectiveError {
        match self {
            // The receiver's operation names itself (see the collectives' operation context).
            Failure::LengthMismatch { expected, got, own } => CollectiveError::LengthMismatch {
                op: "recv",
                peer: Some(peer),
                expected,
                got,
                dtype: None,
                lengths: own.map(|own| vec![(peer, own)]).unwrap_or_default(),
            },
            Failure::Failed => CollectiveError::PeerFailed {
                peer,
                detail: "its side of the operation failed".to_owned(),
            },
            Failure::GroupFailed { culprit, cause } => CollectiveError::GroupFailed {
                peer: culprit,
                cause,
                reporter: peer,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failure_round_trips() {
        for f in [
            Failure::LengthMismatch {
                expected: 7,
                got: u64::MAX,
                own: Some(9),
            },
            Failure::LengthMismatch {
                expected: 7,
                got: 8,
                own: None,
            },
            Failure::Failed,
            Failure::GroupFailed {
                culprit: u32::MAX,
                cause: FatalCause::PeerLost,
            },
            Failure::GroupFailed {
                culprit: 0,
                cause: FatalCause::Io,
            },
        ] {
            assert_eq!(Failure::decode(3, &f.encode()).unwrap(), f);
        }
        assert!(Failure::decode(3, &[9u8; FAILURE_WIRE_LEN]).is_err());
        assert!(Failure::decode(3, &[1u8; 4]).is_err());
        // A culprit beyond u32 or an unknown cause is malformed, never truncated or guessed.
        let valid = Failure::GroupFailed {
            culprit: 7,
            cause: FatalCause::Timeout,
        }
        .encode();
        let mut wide = valid;
        wide[5] = 1;
        assert!(Failure::decode(3, &wide).is_err());
        let mut unknown = valid;
        unknown[9] = 200;
        assert!(Failure::decode(3, &unknown).is_err());
        unknown[9] = 2;
        unknown[10] = 1;
        assert!(Failure::decode(3, &unknown).is_err());
    }

    /// Found by fuzzing (`failure_notice`): a `Failed` notice with stray bytes in its unused
    /// fields was accepted, so one notice had many encodings.
    #[test]
    fn failed_notices_with_stray_fields_are_refused() {
        let mut stray = Failure::Failed.encode();
        stray[4] = 0x40;
        assert!(Failure::decode(3, &stray).is_err());
        stray[4] = 0;
        stray[16] = 1;
        assert!(Failure::decode(3, &stray).is_err());
    }

    #[test]
    fn a_group_notice_names_the_culprit_and_the_reporter() {
        let err = Failure::GroupFailed {
            culprit: 5,
            cause: FatalCause::PeerLost,
        }
        .into_error(2);
        assert!(matches!(
            err,
            CollectiveError::GroupFailed {
                peer: 5,
                cause: FatalCause::PeerLost,
                reporter: 2
            }
        ));
        assert!(err.is_fatal());
        assert_eq!(err.fatal_cause(), Some(FatalCause::PeerLost));
        let text = err.to_string();
        assert!(
            text.contains("peer rank 5") && text.contains("rank 2"),
            "{text}"
        );
        assert!(!Failure::Failed.into_error(2).is_fatal());
    }
}
