//! Islands: groups of ranks joined among themselves by cables and to each other only by a
//! switch or routes, as when Thunderbolt meshes of Macs are joined by Ethernet or Wi-Fi.
//!
//! A flat ring over such a cluster crosses the slow network on every step: each of its hops
//! between islands carries 2(n-1)/n of the buffer. The two-level all-reduce
//! (`all_reduce::two_level`) sends only 1/k of it there for islands of k ranks, so it needs
//! to know the islands; this module finds them in the link matrix. Every rank computes them
//! from the same matrix, so every rank gets the same islands without a message.
//!
//! The islands are the connected parts of the matrix's cables. The two-level plan applies
//! when there are at least two and they are all of the same size, at least two ranks each:
//! rank `j` of every island (its `j`-th lowest) then all-reduces block `j` with the rank `j`
//! of every other island. Islands of different sizes, a single island (a mesh, a chain) or
//! ranks with no cable at all (a star) have none, and their groups run the flat plans.

use std::fmt;

use rlx_transport::{Reach, Topology};

use crate::ring_order::RingOrder;

/// The islands of a group (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Islands {
    /// The group ranks of each island, lowest first; islands ordered by their lowest rank.
    members: Vec<Vec<u32>>,
    /// Each island's ring order over its own ranks (indices into its `members`), following
    /// its cables.
    rings: Vec<RingOrder>,
    /// Rank order over as many ranks as there are islands: the ring across them.
    across: RingOrder,
}

/// Where one rank sits in the islands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Seat {
    /// Which island.
    pub(crate) island: usize,
    /// The rank's index in its island.
    pub(crate) local: usize,
}

impl Islands {
    /// The islands of the `size` ranks of a group whose link matrix is `topology` (indexed by
    /// group rank), or `None` when the two-level plan does not apply (see the module docs).
    pub(crate) fn find(topology: Option<&Topology>, size: u32) -> Option<Islands> {
        let topology = topology.filter(|t| t.size() == size)?;
        let members = cabled_parts(topology);
        let k = members.first()?.len();
        if members.len() < 2 || k < 2 || members.iter().any(|island| island.len() != k) {
            return None;
        }
        let rings = members
            .iter()
            .map(|island| {
                let restricted = topology.restricted(island);
                RingOrder::following(restricted.as_ref(), k as u32)
            })
            .collect();
        let across = RingOrder::ranks(members.len() as u32);
        Some(Islands {
            members,
            rings,
            across,
        })
    }

    /// The number of islands.
    pub(crate) fn count(&self) -> usize {
        self.members.len()
    }

    /// The number of ranks in each island.
    pub(crate) fn island_size(&self) -> usize {
        self.members.first().map_or(0, Vec::len)
    }

    /// Where group rank `rank` sits, or `None` for a rank of no island.
    pub(crate) fn seat(&self, rank: u32) -> Option<Seat> {
        self.members.iter().enumerate().find_map(|(island, ranks)| {
            let local = ranks.iter().position(|&r| r == rank)?;
            Some(Seat { island, local })
        })
    }

    /// The group ranks of island `island`, lowest first.
    pub(crate) fn island(&self, island: usize) -> &[u32] {
        self.members.get(island).map_or(&[], Vec::as_slice)
    }

    /// The ring order of island `island` over its own ranks.
    pub(crate) fn ring_of(&self, island: usize) -> Option<&RingOrder> {
        self.rings.get(island)
    }

    /// The group ranks with index `local` in their island, one per island in island order:
    /// the ranks that all-reduce block `local` across the islands.
    pub(crate) fn across(&self, local: usize) -> Vec<u32> {
        self.members
            .iter()
            .filter_map(|island| island.get(local).copied())
            .collect()
    }

    /// The ring order across the islands (rank order over one rank per island).
    pub(crate) fn ring_across(&self) -> &RingOrder {
        &self.across
    }
}

impl fmt::Display for Islands {
    /// The islands as `0,1 | 2,3`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, island) in self.members.iter().enumerate() {
            if i > 0 {
                f.write_str(" | ")?;
            }
            for (j, rank) in island.iter().enumerate() {
                if j > 0 {
                    f.write_str(",")?;
                }
                write!(f, "{rank}")?;
            }
        }
        Ok(())
    }
}

/// The connected parts of `topology`'s cables, each's ranks lowest first, ordered by their
/// lowest rank.
fn cabled_parts(topology: &Topology) -> Vec<Vec<u32>> {
    let n = topology.size();
    let mut part_of: Vec<Option<usize>> = vec![None; n as usize];
    let mut parts: Vec<Vec<u32>> = Vec::new();
    for start in 0..n {
        if part_of[start as usize].is_some() {
            continue;
        }
        let part = parts.len();
        part_of[start as usize] = Some(part);
        let mut ranks = vec![start];
        let mut next = 0;
        while let Some(&rank) = ranks.get(next) {
            next += 1;
            for other in 0..n {
                if part_of[other as usize].is_none() && topology.reach(rank, other) == Reach::Cable
                {
                    part_of[other as usize] = Some(part);
                    ranks.push(other);
                }
            }
        }
        ranks.sort_unstable();
        parts.push(ranks);
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ranks on one switch, with a cable between the ranks of each pair of `cables`.
    fn switched(n: u32, cables: &[(u32, u32)]) -> Topology {
        Topology::from_cables(n, cables, true)
    }

    /// The cables of a full mesh among `ranks`.
    fn mesh_of(ranks: &[u32]) -> Vec<(u32, u32)> {
        let mut cables = Vec::new();
        for (i, &a) in ranks.iter().enumerate() {
            for &b in &ranks[i + 1..] {
                cables.push((a, b));
            }
        }
        cables
    }

    #[test]
    fn meshes_joined_by_a_switch_are_islands_whatever_the_numbering() {
        let mut cables = mesh_of(&[0, 3, 4]);
        cables.extend(mesh_of(&[1, 2, 5]));
        let islands = Islands::find(Some(&switched(6, &cables)), 6).expect("two islands");
        assert_eq!(islands.to_string(), "0,3,4 | 1,2,5");
        assert_eq!((islands.count(), islands.island_size()), (2, 3));
        assert_eq!(
            islands.seat(2),
            Some(Seat {
                island: 1,
                local: 1
            })
        );
        assert_eq!(islands.across(2), [4, 5]);
        assert_eq!(islands.island(1), [1, 2, 5]);
    }

    #[test]
    fn an_island_ring_follows_its_own_cables() {
        // Two chains of four, each numbered against its cables: 0-4-2-6 and 1-5-3-7.
        let cables = [(0, 4), (4, 2), (2, 6), (1, 5), (5, 3), (3, 7)];
        let islands = Islands::find(Some(&switched(8, &cables)), 8).expect("two islands");
        assert_eq!(islands.to_string(), "0,2,4,6 | 1,3,5,7");
        // Local indices 0, 2, 1, 3 are ranks 0, 4, 2, 6: the cables' order.
        let ring = islands.ring_of(0).expect("island 0's ring");
        assert_eq!(ring.ranks_in_order(), [0, 2, 1, 3]);
    }

    #[test]
    fn shapes_without_equal_islands_have_none() {
        let star = switched(4, &[]);
        assert_eq!(Islands::find(Some(&star), 4), None);
        let mesh = switched(4, &mesh_of(&[0, 1, 2, 3]));
        assert_eq!(Islands::find(Some(&mesh), 4), None);
        let chain = switched(4, &[(0, 2), (2, 1), (1, 3)]);
        assert_eq!(Islands::find(Some(&chain), 4), None);
        let uneven = switched(5, &[(0, 1), (2, 3), (3, 4), (2, 4)]);
        assert_eq!(Islands::find(Some(&uneven), 5), None);
        // One island of two and a lone rank.
        let lone = switched(3, &[(0, 1)]);
        assert_eq!(Islands::find(Some(&lone), 3), None);
        // No matrix, or one of another size (a group that grew).
        assert_eq!(Islands::find(None, 4), None);
        let pairs = switched(4, &[(0, 1), (2, 3)]);
        assert!(Islands::find(Some(&pairs), 4).is_some());
        assert_eq!(Islands::find(Some(&pairs), 5), None);
    }
}
