//! The order of a group's ranks around its rings, chosen from the link matrix so that every
//! hop it can take over a cable does, whatever the rank numbering.
//!
//! A ring's steps send from each rank to the next at once, so its speed is that of its
//! slowest hop; a hop between ranks that no cable joins crosses a third machine, whose cables
//! then carry two hops' bytes. On a chain of four Macs numbered against the cabling (0-2-1-3)
//! the rank-order ring 0→1→2→3→0 puts two hops on the middle cable in each direction and runs
//! at half its speed, while the ring 0→2→1→3→0 puts at most one (the hop that closes a chain's
//! ring crosses the others, in the direction they do not use).
//!
//! The order is the cheapest cycle by [`Reach::hop_cost`](rlx_transport::Reach::hop_cost)
//! (cable, switch, route), found exactly for up to [`EXACT_RANKS`] ranks (Held and Karp's dynamic programme over subsets,
//! 12² · 2¹² steps) and greedily above (each next rank the cheapest unvisited one). Every rank
//! computes it from the same matrix and so gets the same order. Rank order is kept whenever
//! it costs no more, so a star, one host, a full mesh or a group without a matrix rings as it
//! always did.

use std::fmt;

use rlx_transport::Topology;

/// The largest group whose order is searched exactly.
pub(crate) const EXACT_RANKS: usize = 12;

/// Where each group rank sits around the group's rings (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RingOrder {
    /// The group rank at each position, starting with rank 0.
    order: Vec<u32>,
}

impl RingOrder {
    /// Rank order, for `size` ranks.
    pub(crate) fn ranks(size: u32) -> RingOrder {
        RingOrder {
            order: (0..size).collect(),
        }
    }

    /// The order of the `size` ranks of a group whose link matrix is `topology` (indexed by
    /// group rank), or rank order without one.
    pub(crate) fn following(topology: Option<&Topology>, size: u32) -> RingOrder {
        match topology {
            Some(t) if t.size() == size && !t.is_uniform() => {
                let n = size as usize;
                let cost = |a: u32, b: u32| t.reach(a, b).hop_cost();
                let found = if n <= EXACT_RANKS {
                    cheapest_cycle(n, &cost)
                } else {
                    greedy_cycle(n, &cost)
                };
                let rank_order = RingOrder::ranks(size);
                if cycle_cost(&found, &cost) < cycle_cost(&rank_order.order, &cost) {
                    RingOrder {
                        order: lower_neighbour_first(found),
                    }
                } else {
                    rank_order
                }
            }
            _ => RingOrder::ranks(size),
        }
    }

    /// Whether this is rank order.
    pub(crate) fn is_rank_order(&self) -> bool {
        in_rank_order(&self.order)
    }

    /// The group ranks in ring order.
    pub(crate) fn ranks_in_order(&self) -> &[u32] {
        &self.order
    }

    /// The hops of this order that no cable or switch carries (each crosses another machine),
    /// as (from, to) pairs, for the start-up line.
    pub(crate) fn routed_hops(&self, topology: &Topology) -> Vec<(u32, u32)> {
        topology.routed_hops(&self.order)
    }
}

impl fmt::Display for RingOrder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, rank) in self.order.iter().enumerate() {
            if i > 0 {
                f.write_str("-")?;
            }
            write!(f, "{rank}")?;
        }
        Ok(())
    }
}

/// The cycle of `order` run in the direction whose second rank is the lower of rank 0's two
/// neighbours, so that a cycle is written one way only (`0-2-1-3`, never `0-3-1-2`).
fn lower_neighbour_first(mut order: Vec<u32>) -> Vec<u32> {
    if order.len() > 2 && order[1] > order[order.len() - 1] {
        order[1..].reverse();
    }
    order
}

/// Whether `order` lists the ranks in rank order.
fn in_rank_order(order: &[u32]) -> bool {
    order.iter().enumerate().all(|(i, &r)| i == r as usize)
}

/// The cost of the cycle through `order` and back to its start.
fn cycle_cost(order: &[u32], cost: &impl Fn(u32, u32) -> u32) -> u64 {
    let n = order.len();
    (0..n)
        .map(|i| u64::from(cost(order[i], order[(i + 1) % n])))
        .sum()
}

/// The cheapest cycle of `n` ranks starting at rank 0, exactly: `best[set][last]` is the
/// cheapest path from 0 through the ranks of `set` ending at `last`. Ties go to the lower
/// rank, so the answer depends only on the costs.
fn cheapest_cycle(n: usize, cost: &impl Fn(u32, u32) -> u32) -> Vec<u32> {
    if n <= 2 {
        return (0..n as u32).collect();
    }
    const NONE: u64 = u64::MAX;
    let full = 1usize << n;
    let mut best = vec![NONE; full * n];
    let mut came_from = vec![0u8; full * n];
    // The path that holds rank 0 alone (the set {0} is 1) and ends there.
    best[n] = 0;
    for set in (1..full).filter(|s| s & 1 == 1) {
        for last in 0..n {
            let here = best[set * n + last];
            if here == NONE || set & (1 << last) == 0 {
                continue;
            }
            for next in (1..n).filter(|&k| set & (1 << k) == 0) {
                let to = (set | 1 << next) * n + next;
                let through = here + u64::from(cost(last as u32, next as u32));
                if through < best[to] {
                    best[to] = through;
                    came_from[to] = last as u8;
                }
            }
        }
    }
    let all = full - 1;
    let closing =
        |last: usize| best[all * n + last].saturating_add(u64::from(cost(last as u32, 0)));
    let mut last = (1..n).min_by_key(|&l| (closing(l), l)).unwrap_or(1);
    let mut order = Vec::with_capacity(n);
    let mut set = all;
    while last != 0 {
        order.push(last as u32);
        let previous = usize::from(came_from[set * n + last]);
        set &= !(1 << last);
        last = previous;
    }
    order.push(0);
    order.reverse();
    order
}

/// A cycle of `n` ranks from rank 0, each next rank the cheapest of those not yet placed (the
/// lowest on a tie).
fn greedy_cycle(n: usize, cost: &impl Fn(u32, u32) -> u32) -> Vec<u32> {
    let mut order = vec![0u32];
    let mut placed = vec![false; n];
    placed[0] = true;
    while order.len() < n {
        let last = order[order.len() - 1];
        let next = (0..n as u32)
            .filter(|&k| !placed[k as usize])
            .min_by_key(|&k| (cost(last, k), k))
            .unwrap_or(0);
        placed[next as usize] = true;
        order.push(next);
    }
    order
}

/// One rank's place in a ring: its neighbours, and which rank's block each position stands
/// for. The ring algorithms run by positions; a block travels under the position of the rank
/// that owns it, so rank `r` still ends with block `r`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RingSeat<'a> {
    /// The group rank at each position; `None` for rank order.
    order: Option<&'a [u32]>,
    size: usize,
    position: usize,
}

impl<'a> RingSeat<'a> {
    /// Group rank `rank`'s seat in a ring of `size` ranks in `order` (rank order for `None`).
    pub(crate) fn new(order: Option<&'a RingOrder>, size: usize, rank: u32) -> RingSeat<'a> {
        let mut seat = RingSeat {
            order: order.map(RingOrder::ranks_in_order),
            size,
            position: 0,
        };
        seat.position = seat.position_of(rank);
        seat
    }

    /// Whether the ring runs in rank order.
    pub(crate) fn is_rank_order(&self) -> bool {
        self.order.is_none_or(in_rank_order)
    }

    /// This rank's position.
    pub(crate) fn position(&self) -> usize {
        self.position
    }

    /// The position of group rank `rank`.
    pub(crate) fn position_of(&self, rank: u32) -> usize {
        self.order
            .and_then(|o| o.iter().position(|&r| r == rank))
            .unwrap_or(rank as usize)
    }

    /// The group rank at `position`, whose block travels under it.
    pub(crate) fn rank_at(&self, position: usize) -> usize {
        self.order
            .and_then(|o| o.get(position))
            .map_or(position, |&r| r as usize)
    }

    /// The rank this one sends to.
    pub(crate) fn next(&self) -> u32 {
        self.rank_at((self.position + 1) % self.size) as u32
    }

    /// The rank this one receives from.
    pub(crate) fn prev(&self) -> u32 {
        self.rank_at((self.position + self.size - 1) % self.size) as u32
    }
}

#[cfg(test)]
mod tests {
    use rlx_transport::Reach;

    use super::*;

    /// The link matrix of ranks joined by a cable each where `cables` says, and by nothing
    /// else.
    fn cabled(n: u32, cables: &[(u32, u32)]) -> Topology {
        Topology::from_cables(n, cables, false)
    }

    #[test]
    fn a_chain_numbered_against_its_cables_rings_along_them() {
        let chain = cabled(4, &[(0, 2), (2, 1), (1, 3)]);
        let order = RingOrder::following(Some(&chain), 4);
        assert_eq!(order.to_string(), "0-2-1-3");
        assert_eq!(order.routed_hops(&chain), [(3, 0)]);
        let seat = RingSeat::new(Some(&order), 4, 2);
        assert_eq!((seat.position(), seat.prev(), seat.next()), (1, 0, 1));
        assert_eq!(seat.rank_at(3), 3);
        // In rank order, the chain's ring would cross other machines on every hop but 1→2.
        assert_eq!(RingOrder::ranks(4).routed_hops(&chain).len(), 3);
    }

    #[test]
    fn uniform_and_unknown_cablings_keep_rank_order() {
        let mesh = cabled(4, &[(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]);
        assert!(RingOrder::following(Some(&mesh), 4).is_rank_order());
        assert!(RingOrder::following(None, 5).is_rank_order());
        // A ring cabled in rank order is already the cheapest.
        let ring = cabled(5, &[(0, 1), (1, 2), (2, 3), (3, 4), (4, 0)]);
        assert!(RingOrder::following(Some(&ring), 5).is_rank_order());
        // A matrix of another size (a group that grew) is not used.
        assert!(RingOrder::following(Some(&ring), 4).is_rank_order());
        let seat = RingSeat::new(None, 3, 0);
        assert_eq!((seat.prev(), seat.next()), (2, 1));
    }

    #[test]
    fn a_ring_numbered_against_its_cables_is_found_at_every_size() {
        // Ranks cabled in a ring in a scrambled order, from 3 to 14 ranks (past the exact
        // search, where the greedy search must still follow a ring's only path).
        for n in 3..=14u32 {
            let scrambled: Vec<u32> = (0..n).map(|i| (i * 5 + 3) % n).collect();
            if scrambled
                .iter()
                .collect::<std::collections::BTreeSet<_>>()
                .len()
                != n as usize
            {
                continue;
            }
            let cables: Vec<(u32, u32)> = (0..n as usize)
                .map(|i| (scrambled[i], scrambled[(i + 1) % n as usize]))
                .collect();
            let topology = cabled(n, &cables);
            let order = RingOrder::following(Some(&topology), n);
            assert!(
                order.routed_hops(&topology).is_empty(),
                "{n} ranks cabled {scrambled:?}: ring {order}"
            );
        }
    }

    #[test]
    fn islands_ring_through_each_island_before_the_next() {
        // Two islands of three cabled ranks, numbered alternately, on one switch.
        let cables = [(0, 2), (0, 4), (2, 4), (1, 3), (1, 5), (3, 5)];
        let topology = Topology::from_cables(6, &cables, true);
        let order = RingOrder::following(Some(&topology), 6);
        let switch_hops = (0..6)
            .filter(|&i| {
                let (a, b) = (order.order[i], order.order[(i + 1) % 6]);
                topology.reach(a, b) == Reach::Switch
            })
            .count();
        assert_eq!(switch_hops, 2, "ring {order}");
        assert_eq!(order.to_string(), "0-1-3-5-2-4");
    }
}
