//! The cablings `--netns` emulates (`--topology`, a [`Cabling`] as the library describes it):
//! what each cable's ends are called and addressed, and the rate of each class of link.
//!
//! Users cable Macs point to point: a full mesh when they have ports enough, a ring or a chain
//! when they do not, Thunderbolt islands joined through Ethernet; Linux boxes sit on a switch.
//! Each cable is a small network of its own (a /30, as MLX's JACCL documentation advises with
//! the Thunderbolt Bridge turned off), so two ranks without a cable between them have no route
//! to each other. A switch (the star) is one bridge with one link per rank on one /24. Nothing
//! here touches the system: [`plan`] only says what `Topology::create` builds.

use std::net::Ipv4Addr;

pub use rlx_transport::cabling::{Cabling, Shape};

use super::burst_bytes;

/// The two kinds of link, each with a rate of its own (`--rate tb=...,eth=...`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkClass {
    /// A Thunderbolt cable (or the Thunderbolt bridge of a star alone).
    Thunderbolt,
    /// The Ethernet switch alongside cables, or joining islands.
    Ethernet,
}

/// A cable between two ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cable {
    /// Its number, which places its /30.
    pub index: u32,
    /// The ranks it joins, the lower first.
    pub ends: [u32; 2],
}

/// The most cables a cabling may have: each takes a /30 of 10.214.0.0/16.
pub(super) const MAX_CABLES: u32 = 1 << 14;

impl Cable {
    /// The address of `rank`'s end (`rank` must be one of the ends).
    pub fn address(&self, rank: u32) -> Ipv4Addr {
        let base = u32::from(Ipv4Addr::new(10, 214, 0, 0)) + self.index * 4;
        Ipv4Addr::from(base + if rank == self.ends[0] { 1 } else { 2 })
    }

    /// The other end's rank, seen from `rank`.
    pub fn peer_of(&self, rank: u32) -> u32 {
        if rank == self.ends[0] {
            self.ends[1]
        } else {
            self.ends[0]
        }
    }
}

/// One link of a rank as it sees it: an interface, its address, and what is at the other end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankLink {
    /// The interface name inside the rank's namespace (`thunderbolt1`, `eth0`).
    pub ifname: String,
    /// The rank's address on it.
    pub address: Ipv4Addr,
    /// The prefix length of its network (30 for a cable, 24 for the switch).
    pub prefix: u8,
    /// The cable's far end, or `None` for the switch.
    pub peer: Option<u32>,
    /// Its class.
    pub class: LinkClass,
}

/// A cabling laid out for a world of a given size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The cables.
    pub cables: Vec<Cable>,
    /// The switch every rank is on, if any: its interface name and class.
    pub star: Option<(&'static str, LinkClass)>,
}

/// The switch's link when it is the only one: the Thunderbolt bridge `--netns` always emulated.
pub(super) const STAR_IFNAME: &str = "thunderbolt0";
/// The switch's link beside cables.
pub(super) const ETHERNET_IFNAME: &str = "eth0";

/// The cables and switch of `cabling` for `world` ranks.
pub fn plan(cabling: &Cabling, world: u32) -> Result<Plan, String> {
    let pairs = cabling
        .cables(world)
        .map_err(|e| format!("--topology: {e}"))?;
    if pairs.len() as u64 > u64::from(MAX_CABLES) {
        return Err(format!(
            "--topology {cabling} of {world} ranks needs {} cables; at most {MAX_CABLES} fit",
            pairs.len()
        ));
    }
    let cables = (0..)
        .zip(pairs)
        .map(|(index, ends)| Cable { index, ends })
        .collect();
    let star = cabling.with_star.then_some(match cabling.shape {
        Shape::Star => (STAR_IFNAME, LinkClass::Thunderbolt),
        _ => (ETHERNET_IFNAME, LinkClass::Ethernet),
    });
    Ok(Plan { cables, star })
}

impl Plan {
    /// `rank`'s links: its cables, named `thunderbolt0`, `thunderbolt1`, ... in the order of
    /// the peer's rank, then the switch.
    pub fn links_of(&self, rank: u32) -> Vec<RankLink> {
        let mut cables: Vec<&Cable> = self
            .cables
            .iter()
            .filter(|c| c.ends.contains(&rank))
            .collect();
        cables.sort_by_key(|c| c.peer_of(rank));
        let mut links: Vec<RankLink> = cables
            .into_iter()
            .enumerate()
            .map(|(i, cable)| RankLink {
                ifname: format!("thunderbolt{i}"),
                address: cable.address(rank),
                prefix: 30,
                peer: Some(cable.peer_of(rank)),
                class: LinkClass::Thunderbolt,
            })
            .collect();
        if let Some((ifname, class)) = self.star {
            links.push(RankLink {
                ifname: ifname.to_owned(),
                address: star_address(rank),
                prefix: 24,
                peer: None,
                class,
            });
        }
        links
    }
}

/// `rank`'s address on the switch.
pub(super) fn star_address(rank: u32) -> Ipv4Addr {
    // `Topology::create` refuses a switch of more than 250 ranks, so the last octet stays in
    // 1..=250.
    Ipv4Addr::new(10, 213, 0, u8::try_from(rank + 1).unwrap_or(u8::MAX))
}

/// The `tbf` rate of each class of link (`--rate`): one rate for every link (`20gbit`), or one
/// per class (`tb=2gbit,eth=200mbit`; a class left out is not limited).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rates {
    thunderbolt: Option<String>,
    ethernet: Option<String>,
}

impl Rates {
    /// The rates `--rate` describes, each checked.
    pub fn parse(text: &str) -> Result<Rates, String> {
        if !text.contains('=') {
            burst_bytes(text)?;
            return Ok(Rates {
                thunderbolt: Some(text.to_owned()),
                ethernet: Some(text.to_owned()),
            });
        }
        let mut rates = Rates::default();
        for part in text.split(',') {
            let (class, rate) = part.split_once('=').unwrap_or((part, ""));
            burst_bytes(rate)?;
            let slot = match class.trim() {
                "tb" => &mut rates.thunderbolt,
                "eth" => &mut rates.ethernet,
                other => {
                    return Err(format!(
                        "--rate {text:?}: unknown link class {other:?} (tb for cables, eth for the switch)"
                    ));
                }
            };
            *slot = Some(rate.trim().to_owned());
        }
        Ok(rates)
    }

    /// The rate of links of `class`, if limited.
    pub fn of(&self, class: LinkClass) -> Option<&str> {
        match class {
            LinkClass::Thunderbolt => self.thunderbolt.as_deref(),
            LinkClass::Ethernet => self.ethernet.as_deref(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan_of(topology: &str, world: u32) -> Plan {
        plan(&topology.parse::<Cabling>().unwrap(), world).unwrap()
    }

    fn pairs(plan: &Plan) -> Vec<[u32; 2]> {
        plan.cables.iter().map(|c| c.ends).collect()
    }

    #[test]
    fn each_shape_cables_the_pairs_it_names() {
        assert_eq!(pairs(&plan_of("star", 4)), Vec::<[u32; 2]>::new());
        assert_eq!(pairs(&plan_of("mesh", 3)), [[0, 1], [0, 2], [1, 2]]);
        assert_eq!(pairs(&plan_of("ring", 4)), [[0, 1], [1, 2], [2, 3], [0, 3]]);
        assert_eq!(pairs(&plan_of("ring", 2)), [[0, 1]]);
        assert_eq!(pairs(&plan_of("chain", 4)), [[0, 1], [1, 2], [2, 3]]);
        assert_eq!(pairs(&plan_of("islands:2x2", 4)), [[0, 1], [2, 3]]);
        assert_eq!(
            pairs(&plan_of("chain:0-2-1-3", 4)),
            [[0, 2], [1, 2], [1, 3]]
        );
        assert_eq!(
            pairs(&plan_of("ring:3-1-0-2", 4)),
            [[1, 3], [0, 1], [0, 2], [2, 3]]
        );
        assert_eq!(plan_of("mesh", 8).cables.len(), 28);
        assert_eq!(plan_of("mesh", 1).cables.len(), 0);
    }

    #[test]
    fn the_switch_is_there_when_asked_and_named_as_a_user_sees_it() {
        assert_eq!(
            plan_of("star", 2).star,
            Some(("thunderbolt0", LinkClass::Thunderbolt))
        );
        assert_eq!(plan_of("mesh", 2).star, None);
        assert_eq!(
            plan_of("mesh+star", 2).star,
            Some(("eth0", LinkClass::Ethernet))
        );
        assert_eq!(
            plan_of("islands:2x3", 6).star,
            Some(("eth0", LinkClass::Ethernet))
        );
        for text in [
            "star",
            "mesh",
            "ring+star",
            "chain+star",
            "islands:3x1",
            "chain:1-0+star",
        ] {
            assert_eq!(text.parse::<Cabling>().unwrap().to_string(), text);
        }
    }

    #[test]
    fn a_rank_sees_its_cables_by_peer_then_the_switch() {
        let chain = plan_of("chain+star", 3);
        let middle = chain.links_of(1);
        let seen: Vec<_> = middle
            .iter()
            .map(|l| (l.ifname.as_str(), l.address.to_string(), l.prefix, l.peer))
            .collect();
        assert_eq!(
            seen,
            [
                ("thunderbolt0", "10.214.0.2".to_owned(), 30, Some(0)),
                ("thunderbolt1", "10.214.0.5".to_owned(), 30, Some(2)),
                ("eth0", "10.213.0.2".to_owned(), 24, None),
            ]
        );
        // The two ends of a cable share its /30 and nobody else's.
        let first = chain.cables[0];
        assert_eq!(first.address(0).to_string(), "10.214.0.1");
        assert_eq!(first.address(1).to_string(), "10.214.0.2");
        let last = Cable {
            index: MAX_CABLES - 1,
            ends: [0, 1],
        };
        assert_eq!(last.address(1).to_string(), "10.214.255.254");
    }

    #[test]
    fn bad_cablings_are_named() {
        for (text, says) in [
            ("torus", "expected star, mesh"),
            ("islands:2", "islands:AxB"),
            ("islands:0x4", "islands:AxB"),
            ("star+star", "drop +star"),
            ("islands:2x2+star", "drop +star"),
        ] {
            let error = text.parse::<Cabling>().unwrap_err().to_string();
            assert!(error.contains(says), "{text}: {error}");
        }
        let error = plan_error("islands:2x2", 5);
        assert!(error.contains("2 × 2 ranks, not the 5"), "{error}");
        let error = plan_error("chain:0-1-1", 3);
        assert!(error.contains("each of the 3 ranks 0 to 2 once"), "{error}");
        assert!(
            "chain:0-x"
                .parse::<Cabling>()
                .unwrap_err()
                .to_string()
                .contains("joined by '-'")
        );
        let error = plan_error("mesh", 250);
        assert!(error.contains("31125 cables"), "{error}");
    }

    fn plan_error(topology: &str, world: u32) -> String {
        plan(&topology.parse::<Cabling>().unwrap(), world).unwrap_err()
    }

    #[test]
    fn switch_addresses_are_in_one_subnet() {
        assert_eq!(star_address(0).to_string(), "10.213.0.1");
        assert_eq!(star_address(249).to_string(), "10.213.0.250");
    }

    #[test]
    fn rates_are_one_for_all_links_or_one_per_class() {
        let all = Rates::parse("20gbit").unwrap();
        assert_eq!(all.of(LinkClass::Thunderbolt), Some("20gbit"));
        assert_eq!(all.of(LinkClass::Ethernet), Some("20gbit"));
        let split = Rates::parse("tb=2gbit,eth=200mbit").unwrap();
        assert_eq!(split.of(LinkClass::Thunderbolt), Some("2gbit"));
        assert_eq!(split.of(LinkClass::Ethernet), Some("200mbit"));
        let only = Rates::parse("eth=1gbit").unwrap();
        assert_eq!(only.of(LinkClass::Thunderbolt), None);
        assert!(
            Rates::parse("wifi=1gbit")
                .unwrap_err()
                .contains("unknown link class")
        );
        assert!(Rates::parse("tb=fast").is_err());
    }
}
