//! Message tags: the 64-bit key that matches a receive with a send.
//!
//! A [`Tag`] packs three fields so that every collective operation has its own identity on the
//! wire and can never consume another operation's bytes:
//!
//! | bits   | field | meaning |
//! |--------|-------|---------|
//! | 63..48 | group | 0 for user point-to-point, otherwise the id of a process group |
//! | 47..16 | seq   | the operation's sequence number within its group |
//! | 15..0  | phase | a sub-channel inside one operation |
//!
//! User tags are `u32` values below [`TAG_RESERVED_BASE`]; they live in group 0. The values
//! `TAG_RESERVED_BASE..=u32::MAX` are reserved, as are all tags of non-zero groups, which the
//! collectives allocate. Phase `u16::MAX` of sequence number 0 of every collective group
//! carries that group's group-wide failure notices ([`Failure::GroupFailed`]), and phases
//! `u16::MAX - 1` and `u16::MAX - 2` the probes that find the unresponsive rank after a
//! timeout and their answers.
//!
//! [`Failure::GroupFailed`]: crate::Failure::GroupFailed

use std::fmt;

use crate::CollectiveError;

/// First user-level tag value that belongs to the collectives; user point-to-point calls with a
/// tag at or above it fail with [`CollectiveError::InvalidArgument`].
pub const TAG_RESERVED_BASE: u32 = 0xFFF0_0000;

/// The group id reserved for the transport's own traffic. Its sequence numbers are assigned
/// once, here: 0 is the default [`barrier`], 1 the symmetric heap's request/response service,
/// 2 the heap's collective `alloc`/`free` agreement, 3 the notice of an exclusion
/// ([`EXCLUSION_TAG`]).
///
/// [`barrier`]: crate::Transport::barrier
pub const TRANSPORT_GROUP: u16 = 0xFFFF;

/// The tag of the notice a rank gets when a peer excludes it
/// ([`Transport::exclude_peer`](crate::Transport::exclude_peer)): a
/// [`Failure::GroupFailed`](crate::Failure::GroupFailed) naming the excluded rank with cause
/// [`FatalCause::Excluded`](crate::FatalCause::Excluded). It arrives before the link closes, so
/// a rank that finds its peers gone can tell "they went on without me" from "they died".
pub const EXCLUSION_TAG: Tag = Tag::op(TRANSPORT_GROUP, 3, 0);

/// A 64-bit message tag; see the module docs for its layout.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tag(u64);

impl Tag {
    /// A user point-to-point tag, or `InvalidArgument` if `tag` is in the reserved range.
    pub fn user(tag: u32) -> Result<Tag, CollectiveError> {
        if tag >= TAG_RESERVED_BASE {
            return Err(CollectiveError::invalid(format!(
                "tag {tag:#x} is reserved for collectives (user tags must be below {TAG_RESERVED_BASE:#x})"
            )));
        }
        Ok(Tag(u64::from(tag)))
    }

    /// The tag of phase `phase` of operation `seq` on group `group`. `group` must not be 0
    /// (that is the user space); 0 is mapped to 1 so a collective can never collide with user
    /// traffic.
    pub const fn op(group: u16, seq: u32, phase: u16) -> Tag {
        let group = if group == 0 { 1 } else { group };
        Tag(((group as u64) << 48) | ((seq as u64) << 16) | phase as u64)
    }

    /// The tag as it goes on the wire.
    pub const fn raw(self) -> u64 {
        self.0
    }

    /// A tag read off the wire; any value is a valid tag.
    pub const fn from_raw(raw: u64) -> Tag {
        Tag(raw)
    }

    /// The group field (0 for user tags).
    pub const fn group(self) -> u16 {
        (self.0 >> 48) as u16
    }

    /// The sequence field.
    pub const fn seq(self) -> u32 {
        (self.0 >> 16) as u32
    }

    /// The phase field.
    pub const fn phase(self) -> u16 {
        self.0 as u16
    }

    /// Whether this is a user point-to-point tag.
    pub const fn is_user(self) -> bool {
        self.0 < TAG_RESERVED_BASE as u64
    }
}

impl fmt::Debug for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_user() {
            write!(f, "user tag {}", self.0)
        } else {
            write!(
                f,
                "group {} op {} phase {}",
                self.group(),
                self.seq(),
                self.phase()
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_tags_refuse_the_reserved_range() {
        assert!(Tag::user(0).is_ok());
        assert!(Tag::user(TAG_RESERVED_BASE - 1).is_ok());
        assert!(matches!(
            Tag::user(TAG_RESERVED_BASE),
            Err(CollectiveError::InvalidArgument { .. })
        ));
        assert!(Tag::user(u32::MAX).is_err());
    }

    #[test]
    fn op_tags_never_collide_with_user_tags() {
        let t = Tag::op(0, 0, 0);
        assert!(!t.is_user());
        let t = Tag::op(7, 0xDEAD_BEEF, 3);
        assert_eq!((t.group(), t.seq(), t.phase()), (7, 0xDEAD_BEEF, 3));
        assert!(!t.is_user());
        assert_eq!(Tag::from_raw(t.raw()), t);
    }
}
