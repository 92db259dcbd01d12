//! The planning half of [`ProcessGroup::split`](crate::ProcessGroup::split), as plain
//! functions: what every rank publishes, and which group it ends in.
//!
//! Group ids: every rank keeps one "next free id" counter shared by all the groups of its
//! family. Each rank proposes its counter; a new group takes the largest proposal among its
//! members, and each member then moves its counter past that id. A rank's counter only grows
//! and always exceeds the ids of the groups it is in, so two groups that share a rank never
//! share an id. (Splits of different parents must therefore not run concurrently in one
//! process: both would read the same counter.)

use parking_lot::Mutex;

use crate::{CollectiveError, Result, TRANSPORT_GROUP};

/// Bytes one rank publishes: color (i64, -1 for none), key (i64), proposed id (u64).
pub(crate) const RECORD_LEN: usize = 24;

/// What one rank publishes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Record {
    pub(crate) color: Option<u32>,
    pub(crate) key: i32,
    pub(crate) proposal: u32,
}

impl Record {
    pub(crate) fn encode(self) -> [u8; RECORD_LEN] {
        let mut out = [0u8; RECORD_LEN];
        let color = self.color.map_or(-1i64, i64::from);
        out[..8].copy_from_slice(&color.to_le_bytes());
        out[8..16].copy_from_slice(&i64::from(self.key).to_le_bytes());
        out[16..].copy_from_slice(&u64::from(self.proposal).to_le_bytes());
        out
    }

    /// Decodes the record of parent rank `rank`; bytes a peer made up are a protocol error.
    pub(crate) fn decode(rank: u32, bytes: &[u8]) -> Result<Record> {
        let word = |i: usize| -> Result<i64> {
            bytes
                .get(i * 8..i * 8 + 8)
                .and_then(|b| b.first_chunk::<8>())
                .map(|b| i64::from_le_bytes(*b))
                .ok_or_else(|| CollectiveError::protocol(None, "short split record"))
        };
        let bad = |what: &str| {
            CollectiveError::protocol(None, format!("split record of group rank {rank}: {what}"))
        };
        let color = match word(0)? {
            -1 => None,
            c => Some(u32::try_from(c).map_err(|_| bad("color out of range"))?),
        };
        let key = i32::try_from(word(1)?).map_err(|_| bad("key out of range"))?;
        let proposal = u32::try_from(word(2)?).map_err(|_| bad("proposed id out of range"))?;
        Ok(Record {
            color,
            key,
            proposal,
        })
    }
}

/// This rank's "next free id" counter of one family of groups, shared by all of them.
#[derive(Debug)]
pub(crate) struct GroupIds {
    next: Mutex<u32>,
}

impl GroupIds {
    /// The counter of a new family whose world group has id `world`.
    pub(crate) fn after(world: u16) -> GroupIds {
        GroupIds {
            next: Mutex::new(u32::from(world) + 1),
        }
    }

    /// The id this rank proposes for the next group it splits off.
    pub(crate) fn proposal(&self) -> u32 {
        *self.next.lock()
    }

    /// Moves the counter past `id`, the id of a group this rank has joined.
    pub(crate) fn reserve(&self, id: u16) {
        let mut next = self.next.lock();
        *next = (*next).max(u32::from(id) + 1);
    }
}

/// The group id that proposal `id` stands for, or `Unsupported` when the family has used up
/// the id space (`what` names the operation that formed the group).
pub(crate) fn group_id_of(what: &str, id: u32) -> Result<u16> {
    u16::try_from(id)
        .ok()
        .filter(|&id| id != TRANSPORT_GROUP && id != 0)
        .ok_or_else(|| {
            CollectiveError::unsupported(format!(
                "{what}: group id {id} is out of range (at most {} groups per process family)",
                TRANSPORT_GROUP - 2
            ))
        })
}

/// Decodes the records every parent rank published (`all`, gathered in rank order) and plans
/// parent rank `me`'s new group (see [`plan`]).
pub(crate) fn plan_gathered(all: &[u8], me: u32) -> Result<Option<Plan>> {
    let records = all
        .chunks_exact(RECORD_LEN)
        .enumerate()
        .map(|(rank, bytes)| Record::decode(rank as u32, bytes))
        .collect::<Result<Vec<_>>>()?;
    plan(&records, me)
}

/// The group a rank ends in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    /// The new group's id.
    pub(crate) group_id: u16,
    /// Parent ranks of the members, in new-rank order.
    pub(crate) members: Vec<u32>,
    /// This rank's rank in the new group.
    pub(crate) rank: u32,
}

/// Plans parent rank `me`'s new group from everyone's records, or `None` if it gave no color.
pub(crate) fn plan(records: &[Record], me: u32) -> Result<Option<Plan>> {
    let Some(mine) = records.get(me as usize) else {
        return Err(CollectiveError::UnknownRank {
            rank: me,
            world_size: records.len() as u32,
        });
    };
    let Some(color) = mine.color else {
        return Ok(None);
    };
    let mut members: Vec<(i32, u32)> = records
        .iter()
        .enumerate()
        .filter(|(_, r)| r.color == Some(color))
        .map(|(rank, r)| (r.key, rank as u32))
        .collect();
    members.sort_unstable();
    let id = records
        .iter()
        .filter(|r| r.color == Some(color))
        .map(|r| r.proposal)
        .max()
        .unwrap_or(mine.proposal);
    let group_id = group_id_of("split", id)?;
    let rank = members
        .iter()
        .position(|&(_, rank)| rank == me)
        .unwrap_or(0) as u32;
    Ok(Some(Plan {
        group_id,
        members: members.into_iter().map(|(_, rank)| rank).collect(),
        rank,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(color: Option<u32>, key: i32, proposal: u32) -> Record {
        Record {
            color,
            key,
            proposal,
        }
    }

    #[test]
    fn records_round_trip() {
        for r in [rec(None, -5, 2), rec(Some(7), i32::MAX, 65000)] {
            assert_eq!(Record::decode(0, &r.encode()).unwrap(), r);
        }
        let mut bad = rec(Some(1), 0, 2).encode();
        bad[..8].copy_from_slice(&(-7i64).to_le_bytes());
        assert!(Record::decode(0, &bad).is_err());
    }

    #[test]
    fn plans_order_by_key_then_rank_and_take_the_largest_id() {
        let records = [
            rec(Some(0), 5, 2),
            rec(Some(1), 0, 3),
            rec(Some(0), 1, 4),
            rec(None, 0, 9),
            rec(Some(0), 1, 2),
        ];
        let p = plan(&records, 4).unwrap().unwrap();
        assert_eq!(p.members, vec![2, 4, 0]);
        assert_eq!(p.rank, 1);
        assert_eq!(p.group_id, 4);
        assert_eq!(plan(&records, 1).unwrap().unwrap().group_id, 3);
        assert_eq!(plan(&records, 3).unwrap(), None);
    }
}
