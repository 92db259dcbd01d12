//! A chain of cables: ranks cabled one after another in a line (`a-b-c-d`), in whatever order
//! their numbers run, as Macs are when their ports run out.
//!
//! A ring around a chain closes with a hop that crosses every machine between its ends, so
//! the chain's all-reduce (`all_reduce::bidirectional_chain`) runs along the line instead, in
//! both directions at once; it needs the line's order, which this module finds in the link
//! matrix. Every rank finds the same line from the same matrix.

use rlx_transport::{Reach, Topology};

/// The ranks of a group cabled in a line, from one end to the other (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CablePath {
    /// Group ranks in line order, starting at the end with the lower rank.
    ranks: Vec<u32>,
}

impl CablePath {
    /// The line of the `size` ranks of a group whose link matrix is `topology`, when its
    /// cables form exactly one line through at least three ranks (two ranks have one cable
    /// whatever the plan); `None` otherwise.
    pub(crate) fn find(topology: Option<&Topology>, size: u32) -> Option<CablePath> {
        let topology = topology.filter(|t| t.size() == size && size >= 3)?;
        let cabled = |a: u32| (0..size).filter(move |&b| topology.reach(a, b) == Reach::Cable);
        let degree = |a: u32| cabled(a).count();
        if (0..size).any(|a| degree(a) == 0 || degree(a) > 2) {
            return None;
        }
        let start = (0..size).find(|&a| degree(a) == 1)?;
        let mut ranks = vec![start];
        let mut previous = None;
        let mut here = start;
        while let Some(next) = cabled(here).find(|&b| Some(b) != previous) {
            if ranks.contains(&next) {
                return None;
            }
            ranks.push(next);
            previous = Some(here);
            here = next;
        }
        (ranks.len() == size as usize).then_some(CablePath { ranks })
    }

    /// The group ranks in line order.
    pub(crate) fn ranks(&self) -> &[u32] {
        &self.ranks
    }

    /// The neighbours of group rank `rank` towards the line's start and towards its end, or
    /// `None` when it is not on the line.
    pub(crate) fn neighbours(&self, rank: u32) -> Option<(Option<u32>, Option<u32>)> {
        let at = self.ranks.iter().position(|&r| r == rank)?;
        let before = at.checked_sub(1).map(|p| self.ranks[p]);
        Some((before, self.ranks.get(at + 1).copied()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ranks joined by a cable for each pair of `cables`, and by nothing else.
    fn cabled(n: u32, cables: &[(u32, u32)]) -> Topology {
        Topology::from_cables(n, cables, false)
    }

    #[test]
    fn a_chain_numbered_against_its_cables_is_found_from_its_lower_end() {
        let chain = cabled(4, &[(2, 0), (0, 1), (1, 3)]);
        let path = CablePath::find(Some(&chain), 4).expect("a line");
        assert_eq!(path.ranks(), [2, 0, 1, 3]);
        assert_eq!(path.neighbours(0), Some((Some(2), Some(1))));
        assert_eq!(path.neighbours(2), Some((None, Some(0))));
        assert_eq!(path.neighbours(3), Some((Some(1), None)));
    }

    #[test]
    fn rings_meshes_stars_and_broken_lines_are_not_chains() {
        let ring = cabled(4, &[(0, 1), (1, 2), (2, 3), (3, 0)]);
        assert_eq!(CablePath::find(Some(&ring), 4), None);
        let mesh = cabled(3, &[(0, 1), (1, 2), (0, 2)]);
        assert_eq!(CablePath::find(Some(&mesh), 3), None);
        assert_eq!(CablePath::find(Some(&cabled(4, &[])), 4), None);
        let broken = cabled(4, &[(0, 1), (2, 3)]);
        assert_eq!(CablePath::find(Some(&broken), 4), None);
        let star_of_cables = cabled(4, &[(0, 1), (0, 2), (0, 3)]);
        assert_eq!(CablePath::find(Some(&star_of_cables), 4), None);
        let two = cabled(2, &[(0, 1)]);
        assert_eq!(CablePath::find(Some(&two), 2), None);
        assert_eq!(CablePath::find(None, 4), None);
    }
}
