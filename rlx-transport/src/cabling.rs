//! A cabling as a user describes it: a star (a switch), a full mesh of cables, a ring or a
//! chain of them, or islands of meshes joined by a switch; and which pairs of ranks it says a
//! cable joins.
//!
//! Users cable Macs point to point: a full mesh when they have ports enough, a ring or a chain
//! when they do not, Thunderbolt islands joined through Ethernet; Linux boxes sit on a switch.
//! The launcher's emulation lays out exactly these cables (`--netns --topology`), and a job may
//! declare the cabling it expects (`RLX_CABLING`, which the launcher sets for an emulated
//! one): [`Cabling::missing_cables`] then names every declared cable that the link matrix
//! (see [`crate::topology`]) does not show, so that a cable left out of a mesh is named by its
//! two ranks instead of only making the job slower. Pure parsing and arithmetic.

use std::fmt;
use std::str::FromStr;

use crate::topology::{Reach, Topology};
use crate::{CollectiveError, Result};

/// The shape of the cables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Shape {
    /// Every rank on one switch (one bridge), as Linux boxes on Ethernet.
    Star,
    /// A cable between every pair of ranks.
    Mesh,
    /// Rank i cabled to rank i + 1, and the last to the first.
    Ring,
    /// Rank i cabled to rank i + 1.
    Chain,
    /// `count` meshes of `size` ranks each (ranks numbered island by island), every rank also on
    /// one switch that joins the islands.
    Islands {
        /// How many islands.
        count: u32,
        /// Ranks per island.
        size: u32,
    },
}

/// A cabling: a shape of cables, and whether a switch joins every rank besides (the Ethernet a
/// Mac has next to its Thunderbolt cables).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cabling {
    /// The cables.
    pub shape: Shape,
    /// Whether every rank is also on a switch (always, for a star and for islands).
    pub with_star: bool,
    /// For a chain or a ring, the ranks in the order the cables join them, when not 0, 1, 2,
    /// ... (`chain:0-2-1-3`: ranks numbered against the cabling).
    pub order: Option<Vec<u32>>,
}

impl Default for Cabling {
    fn default() -> Self {
        Cabling {
            shape: Shape::Star,
            with_star: true,
            order: None,
        }
    }
}

impl FromStr for Cabling {
    type Err = CollectiveError;

    /// `star`, `mesh`, `ring`, `chain` (each of the last three with `+star` for a switch
    /// alongside; a ring or a chain optionally with the order of its ranks, `chain:0-2-1-3`),
    /// or `islands:AxB` (A meshes of B ranks joined by a switch).
    fn from_str(text: &str) -> Result<Self> {
        let (shape, alongside) = match text.strip_suffix("+star") {
            Some(shape) => (shape, true),
            None => (text, false),
        };
        let (shape, order) = match shape.split_once(':') {
            Some((kind @ ("chain" | "ring"), order)) => (kind, Some(rank_order(order, text)?)),
            _ => (shape, None),
        };
        let shape = match shape {
            "star" => Shape::Star,
            "mesh" => Shape::Mesh,
            "ring" => Shape::Ring,
            "chain" => Shape::Chain,
            _ => match shape.strip_prefix("islands:") {
                Some(sizes) => islands(sizes, text)?,
                None => {
                    return Err(CollectiveError::config(format!(
                        "cabling {text:?}: expected star, mesh, ring, chain (each but star \
                         optionally +star; ring and chain optionally :0-2-1-3, the ranks in \
                         cable order) or islands:AxB"
                    )));
                }
            },
        };
        if alongside && matches!(shape, Shape::Star | Shape::Islands { .. }) {
            return Err(CollectiveError::config(format!(
                "cabling {text:?}: a star and islands are on a switch already; drop +star"
            )));
        }
        let with_star = alongside || matches!(shape, Shape::Star | Shape::Islands { .. });
        Ok(Cabling {
            shape,
            with_star,
            order,
        })
    }
}

/// The `0-2-1-3` of `chain:0-2-1-3`.
fn rank_order(order: &str, text: &str) -> Result<Vec<u32>> {
    order
        .split('-')
        .map(|rank| rank.trim().parse::<u32>())
        .collect::<std::result::Result<Vec<u32>, _>>()
        .map_err(|_| {
            CollectiveError::config(format!(
                "cabling {text:?}: the order is ranks joined by '-', as chain:0-2-1-3"
            ))
        })
}

/// The `AxB` of `islands:AxB`.
fn islands(sizes: &str, text: &str) -> Result<Shape> {
    let parsed = sizes
        .split_once('x')
        .and_then(|(a, b)| Some((a.parse::<u32>().ok()?, b.parse::<u32>().ok()?)));
    match parsed {
        Some((count, size)) if count >= 1 && size >= 1 => Ok(Shape::Islands { count, size }),
        _ => Err(CollectiveError::config(format!(
            "cabling {text:?}: islands are written islands:AxB, A islands of B ranks (e.g. \
             islands:2x2)"
        ))),
    }
}

impl fmt::Display for Cabling {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.shape {
            Shape::Star => return f.write_str("star"),
            Shape::Islands { count, size } => return write!(f, "islands:{count}x{size}"),
            Shape::Mesh => f.write_str("mesh")?,
            Shape::Ring => f.write_str("ring")?,
            Shape::Chain => f.write_str("chain")?,
        }
        if let Some(order) = &self.order {
            let ranks: Vec<String> = order.iter().map(u32::to_string).collect();
            write!(f, ":{}", ranks.join("-"))?;
        }
        if self.with_star {
            f.write_str("+star")
        } else {
            Ok(())
        }
    }
}

impl Cabling {
    /// How many hops of a ring through every rank must cross other machines on this cabling,
    /// whatever the numbering: one for a chain without a switch (the hop that closes it), none
    /// for every other shape. A ring order that follows the cables crosses no more.
    pub fn routed_ring_hops(&self) -> usize {
        usize::from(self.shape == Shape::Chain && !self.with_star)
    }

    /// The pairs of ranks this cabling joins by a cable in a world of `world` ranks, the lower
    /// rank first; an error when the cabling does not fit that world (islands of another size,
    /// an order that does not name every rank once).
    pub fn cables(&self, world: u32) -> Result<Vec<[u32; 2]>> {
        Ok(match self.shape {
            Shape::Star => Vec::new(),
            Shape::Mesh => mesh(0..world),
            Shape::Chain => along(&self.cable_order(world)?),
            Shape::Ring => {
                let order = self.cable_order(world)?;
                let mut pairs = along(&order);
                // A ring of two is one cable, as a chain of two; of one, none.
                if let (true, Some(first), Some(last)) = (world > 2, order.first(), order.last()) {
                    pairs.push([*first.min(last), *first.max(last)]);
                }
                pairs
            }
            Shape::Islands { count, size } => {
                if count.checked_mul(size) != Some(world) {
                    return Err(CollectiveError::config(format!(
                        "cabling {self} has {count} × {size} ranks, not the {world} asked for"
                    )));
                }
                (0..count)
                    .flat_map(|i| mesh(i * size..(i + 1) * size))
                    .collect()
            }
        })
    }

    /// The cables of this cabling that `reach` (how rank a reaches rank b) does not show as a
    /// [`Reach::Cable`], each with how its ranks reach each other instead.
    pub fn missing_cables(
        &self,
        world: u32,
        reach: impl Fn(u32, u32) -> Reach,
    ) -> Result<Vec<([u32; 2], Reach)>> {
        Ok(self
            .cables(world)?
            .into_iter()
            .map(|pair| (pair, reach(pair[0], pair[1])))
            .filter(|&(_, found)| found != Reach::Cable)
            .collect())
    }

    /// [`Cabling::missing_cables`] of a link matrix, in words: one line per missing cable,
    /// naming its ranks, or why the matrix cannot be checked.
    pub fn differences(&self, topology: &Topology) -> Vec<String> {
        match self.missing_cables(topology.size(), |a, b| topology.reach(a, b)) {
            Ok(missing) => missing
                .into_iter()
                .map(|([a, b], found)| {
                    format!(
                        "the cabling is declared {self}, but no cable joins ranks {a} and {b}: \
                         they reach each other {}",
                        found.as_words()
                    )
                })
                .collect(),
            Err(error) => vec![error.to_string()],
        }
    }

    /// The ranks of a chain or a ring in cable order: the order given, which must name every
    /// rank of `world` once, or 0, 1, 2, ...
    fn cable_order(&self, world: u32) -> Result<Vec<u32>> {
        let Some(order) = &self.order else {
            return Ok((0..world).collect());
        };
        let mut sorted = order.clone();
        sorted.sort_unstable();
        if sorted != (0..world).collect::<Vec<u32>>() {
            return Err(CollectiveError::config(format!(
                "cabling {self} must name each of the {world} ranks 0 to {} once",
                world.saturating_sub(1)
            )));
        }
        Ok(order.clone())
    }
}

/// A cable between each two ranks next to each other in `order`, the lower rank first.
fn along(order: &[u32]) -> Vec<[u32; 2]> {
    order
        .windows(2)
        .map(|pair| [pair[0].min(pair[1]), pair[0].max(pair[1])])
        .collect()
}

/// A cable between every pair of `ranks`.
fn mesh(ranks: std::ops::Range<u32>) -> Vec<[u32; 2]> {
    let end = ranks.end;
    ranks
        .flat_map(|a| (a + 1..end).map(move |b| [a, b]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The link matrix of `n` ranks on one switch with a cable for each pair of `cables`.
    fn matrix(n: u32, cables: &[[u32; 2]]) -> Topology {
        let pairs: Vec<(u32, u32)> = cables.iter().map(|&[a, b]| (a, b)).collect();
        Topology::from_cables(n, &pairs, true)
    }

    #[test]
    fn a_mesh_missing_a_cable_names_its_ranks() {
        let mesh: Cabling = "mesh+star".parse().unwrap();
        let all = mesh.cables(4).unwrap();
        assert_eq!(all.len(), 6);
        assert!(mesh.differences(&matrix(4, &all)).is_empty());
        let short: Vec<[u32; 2]> = all.iter().copied().filter(|&p| p != [1, 3]).collect();
        let differences = mesh.differences(&matrix(4, &short));
        assert_eq!(differences.len(), 1, "{differences:?}");
        assert!(
            differences[0].contains("no cable joins ranks 1 and 3")
                && differences[0].contains("through a switch"),
            "{}",
            differences[0]
        );
    }

    #[test]
    fn chains_rings_and_islands_name_the_cables_they_declare() {
        let chain: Cabling = "chain:0-2-1-3".parse().unwrap();
        assert_eq!(chain.cables(4).unwrap(), [[0, 2], [1, 2], [1, 3]]);
        let ring: Cabling = "ring".parse().unwrap();
        assert_eq!(ring.cables(3).unwrap(), [[0, 1], [1, 2], [0, 2]]);
        assert_eq!(ring.cables(2).unwrap(), [[0, 1]]);
        let islands: Cabling = "islands:2x2".parse().unwrap();
        assert_eq!(islands.cables(4).unwrap(), [[0, 1], [2, 3]]);
        // A chain cabled in rank order is not the chain 0-2-1-3.
        let wrong = chain.differences(&matrix(4, &[[0, 1], [1, 2], [2, 3]]));
        assert_eq!(wrong.len(), 2, "{wrong:?}");
        // Islands of another world are a difference of their own.
        assert!(islands.differences(&matrix(5, &[]))[0].contains("not the 5"));
    }

    #[test]
    fn cablings_read_back_as_written_and_bad_ones_are_named() {
        for text in ["star", "mesh", "ring+star", "chain:0-2-1-3", "islands:3x2"] {
            let cabling: Cabling = text.parse().unwrap();
            assert_eq!(cabling.to_string(), text);
        }
        for (text, says) in [
            ("cube", "expected star, mesh"),
            ("islands:2", "islands:AxB"),
            ("star+star", "drop +star"),
            ("chain:0-x", "joined by '-'"),
        ] {
            let error = text.parse::<Cabling>().unwrap_err().to_string();
            assert!(error.contains(says), "{text}: {error}");
        }
    }
}
