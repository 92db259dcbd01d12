//! The agreement of a collective `alloc` or `free` of [`Symmetric`](super::Symmetric): what
//! each rank sends the others about its call and its result, in a fixed-size little-endian
//! record, and the error when two ranks' views differ.

use crate::symmetric::alloc::AllocRefusal;
use crate::{CollectiveError, Result};

/// Which collective heap operation an [`Agreement`] is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AgreementOp {
    Alloc,
    Free,
}

/// One rank's view of a collective `alloc` or `free`, exchanged so that every rank can check
/// that all made the same call with the same result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Agreement {
    pub(crate) op: AgreementOp,
    pub(crate) heap_size: u64,
    pub(crate) len: u64,
    /// The offset this rank got, or why it could not.
    pub(crate) outcome: Result<u64, AllocRefusal>,
}

pub(crate) const AGREEMENT_LEN: usize = 34;

impl Agreement {
    pub(crate) fn op_name(&self) -> &'static str {
        match self.op {
            AgreementOp::Alloc => "alloc",
            AgreementOp::Free => "free",
        }
    }

    pub(crate) fn encode(&self) -> [u8; AGREEMENT_LEN] {
        let mut out = [0u8; AGREEMENT_LEN];
        out[0] = match self.op {
            AgreementOp::Alloc => 1,
            AgreementOp::Free => 2,
        };
        let (status, a) = match self.outcome {
            Ok(offset) => (0u8, offset),
            Err(AllocRefusal::Empty) => (1, 0),
            Err(AllocRefusal::NoSpace { largest }) => (2, largest),
            Err(AllocRefusal::NotAllocated) => (3, 0),
        };
        out[1] = status;
        out[2..10].copy_from_slice(&self.heap_size.to_le_bytes());
        out[10..18].copy_from_slice(&self.len.to_le_bytes());
        out[18..26].copy_from_slice(&a.to_le_bytes());
        out
    }

    pub(crate) fn decode(peer: u32, bytes: &[u8]) -> Result<Agreement> {
        let bad = |what: &str| {
            CollectiveError::protocol(Some(peer), format!("malformed heap agreement: {what}"))
        };
        let bytes: &[u8; AGREEMENT_LEN] = bytes
            .try_into()
            .map_err(|_| bad(&format!("{} bytes instead of {AGREEMENT_LEN}", bytes.len())))?;
        let word = |at: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&bytes[at..at + 8]);
            u64::from_le_bytes(w)
        };
        let op = match bytes[0] {
            1 => AgreementOp::Alloc,
            2 => AgreementOp::Free,
            other => return Err(bad(&format!("unknown operation {other}"))),
        };
        let a = word(18);
        let outcome = match bytes[1] {
            0 => Ok(a),
            1 => Err(AllocRefusal::Empty),
            2 => Err(AllocRefusal::NoSpace { largest: a }),
            3 => Err(AllocRefusal::NotAllocated),
            other => return Err(bad(&format!("unknown status {other}"))),
        };
        Ok(Agreement {
            op,
            heap_size: word(2),
            len: word(10),
            outcome,
        })
    }

    /// The error when `peer`'s view differs from this one, if it does.
    pub(crate) fn disagreement(&self, peer: u32, theirs: &Agreement) -> Option<CollectiveError> {
        if theirs.heap_size != self.heap_size {
            return Some(CollectiveError::config(format!(
                "symmetric heap sizes differ: rank {peer} has {} bytes, this rank {}",
                theirs.heap_size, self.heap_size
            )));
        }
        if theirs.op != self.op || theirs.len != self.len {
            return Some(CollectiveError::invalid(format!(
                "collective heap calls differ: rank {peer} called {}({}) while this rank called {}({})",
                theirs.op_name(),
                theirs.len,
                self.op_name(),
                self.len
            )));
        }
        if theirs.outcome != self.outcome {
            return Some(match theirs.outcome {
                Err(refusal) => {
                    let mut err = theirs.refusal_error(refusal);
                    if let CollectiveError::InvalidArgument { what } = &mut err {
                        *what = format!("on rank {peer}: {what}");
                    }
                    err
                }
                Ok(offset) => CollectiveError::invalid(format!(
                    "{}({}) gave offset {offset} on rank {peer} but {:?} here: the ranks' heap calls were not made in the same order",
                    self.op_name(),
                    self.len,
                    self.outcome
                )),
            });
        }
        None
    }

    pub(crate) fn refusal_error(&self, refusal: AllocRefusal) -> CollectiveError {
        match refusal {
            AllocRefusal::Empty => CollectiveError::invalid("alloc of 0 bytes"),
            AllocRefusal::NoSpace { largest } => CollectiveError::invalid(format!(
                "alloc of {} bytes does not fit the symmetric heap of {} bytes (largest free block {largest})",
                self.len, self.heap_size
            )),
            AllocRefusal::NotAllocated => CollectiveError::invalid(format!(
                "free of a region of {} bytes that is not allocated",
                self.len
            )),
        }
    }
}
