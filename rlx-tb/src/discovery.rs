//! Finding the Thunderbolt links of this host: the OS-neutral [`Interface`] description, the
//! selection rules (including the `RLX_TB_IFNAME` override) and [`discover`].
//!
//! Selection, with the interfaces the OS reported:
//! - without `RLX_TB_IFNAME`: every interface that is up and carries Thunderbolt evidence,
//!   except Thunderbolt ports that are members of a selected Thunderbolt bridge (their traffic
//!   and addresses live on the bridge);
//! - `RLX_TB_IFNAME` as a selection list (`thunderbolt0,en`, `=en5`): exactly the interfaces it
//!   names, Thunderbolt or not, that are up: the user's explicit choice overrides detection;
//! - `RLX_TB_IFNAME` as an exclusion list (`^thunderbolt1`): the detected links minus those.
//!
//! When nothing is selected the result is a [`CollectiveError::Config`] that lists every
//! interface seen and why it was not taken; there is never a fallback to another network.

use std::fmt;
use std::net::IpAddr;

use rlx_transport::ifname::IfnameFilter;
use rlx_transport::{CollectiveError, Result};

use crate::env::{TB_IFNAME_ENV, filter_from_env};
use crate::sys;

/// Why an interface is taken for a Thunderbolt link.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Evidence {
    /// Linux: the sysfs driver of the device is `thunderbolt-net`.
    Driver,
    /// Linux: the name starts with `thunderbolt`.
    Name,
    /// macOS: the system lists the port as a Thunderbolt hardware port (its name is given).
    HardwarePort(String),
    /// macOS: a bridge whose members are all Thunderbolt ports (the Thunderbolt Bridge).
    Bridge {
        /// The member ports.
        members: Vec<String>,
    },
}

impl fmt::Display for Evidence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Evidence::Driver => f.write_str("driver thunderbolt-net"),
            Evidence::Name => f.write_str("thunderbolt name"),
            Evidence::HardwarePort(port) => write!(f, "hardware port {port:?}"),
            Evidence::Bridge { members } => {
                write!(f, "bridge of Thunderbolt ports {}", members.join("+"))
            }
        }
    }
}

/// One network interface of the host, as discovery sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interface {
    /// The interface name (`thunderbolt0`, `bridge0`, `en5`).
    pub name: String,
    /// The OS interface index (the scope id of its IPv6 link-local addresses); 0 when unknown.
    pub index: u32,
    /// Whether the interface is administratively up and has a carrier.
    pub up: bool,
    /// Its addresses.
    pub addrs: Vec<IpAddr>,
    /// Why it is a Thunderbolt link, or `None` when nothing says it is.
    pub thunderbolt: Option<Evidence>,
    /// The driver the OS reports, for diagnostics (Linux sysfs).
    pub driver: Option<String>,
}

impl Interface {
    /// A plain interface record with no addresses and no evidence.
    pub fn new(name: impl Into<String>, index: u32, up: bool) -> Self {
        Self {
            name: name.into(),
            index,
            up,
            addrs: Vec::new(),
            thunderbolt: None,
            driver: None,
        }
    }

    /// The interface called `name` in the calling thread's network namespace, with its index,
    /// up state and addresses, but without Thunderbolt evidence (that needs the full scan of
    /// [`discover`]). Used to pin a socket to an interface the caller already chose.
    pub fn by_name(name: &str) -> Result<Interface> {
        sys::list_interfaces()?
            .into_iter()
            .find(|i| i.name == name)
            .ok_or_else(|| CollectiveError::config(format!("no network interface named {name:?}")))
    }

    /// Its IPv6 link-local addresses (`fe80::/10`), which need [`Interface::index`] as scope id.
    pub fn link_local_v6(&self) -> impl Iterator<Item = std::net::Ipv6Addr> + '_ {
        self.addrs.iter().filter_map(|a| match a {
            IpAddr::V6(v6) if crate::is_link_local_v6(v6) => Some(*v6),
            _ => None,
        })
    }

    fn describe(&self) -> String {
        let mut notes = Vec::new();
        match &self.thunderbolt {
            Some(evidence) => notes.push(evidence.to_string()),
            None => notes.push("not Thunderbolt".to_owned()),
        }
        if let Some(driver) = &self.driver {
            notes.push(format!("driver {driver}"));
        }
        if !self.up {
            notes.push("down".to_owned());
        }
        format!("{} ({})", self.name, notes.join(", "))
    }
}

/// The Thunderbolt links of this host: the OS code lists the interfaces and [`select_links`] picks
/// them, with `RLX_TB_IFNAME` read from the environment.
pub fn discover() -> Result<Vec<Interface>> {
    let seen = sys::list_interfaces()?;
    let filter = filter_from_env()?;
    let chosen = select_links(&seen, filter.as_ref())?;
    let seen: Vec<String> = seen.iter().map(Interface::describe).collect();
    let names: Vec<&str> = chosen.iter().map(|i| i.name.as_str()).collect();
    tracing::info!(links = ?names, filter = ?filter.map(|f| f.to_string()), "Thunderbolt links");
    tracing::debug!(interfaces = ?seen, "interfaces seen");
    Ok(chosen)
}

/// Picks the links among `seen` by the rules of the module docs; the result keeps the order of
/// `seen` and is never empty.
pub fn select_links(seen: &[Interface], filter: Option<&IfnameFilter>) -> Result<Vec<Interface>> {
    let chosen: Vec<Interface> = match filter {
        Some(filter) if !filter.is_exclusion() => seen
            .iter()
            .filter(|i| i.up && filter.matches(&i.name))
            .cloned()
            .collect(),
        _ => {
            let bridged: Vec<&str> = seen
                .iter()
                .filter(|i| i.up)
                .filter_map(|i| match &i.thunderbolt {
                    Some(Evidence::Bridge { members }) => Some(members.iter().map(String::as_str)),
                    _ => None,
                })
                .flatten()
                .collect();
            seen.iter()
                .filter(|i| i.up && i.thunderbolt.is_some())
                .filter(|i| !bridged.contains(&i.name.as_str()))
                .filter(|i| filter.is_none_or(|f| f.matches(&i.name)))
                .cloned()
                .collect()
        }
    };
    if chosen.is_empty() {
        let listed: Vec<String> = seen.iter().map(Interface::describe).collect();
        let listed = if listed.is_empty() {
            "none".to_owned()
        } else {
            listed.join(", ")
        };
        let why = match filter {
            Some(filter) => format!("{TB_IFNAME_ENV}={filter} selects no interface that is up"),
            None => {
                format!("no Thunderbolt link is up (set {TB_IFNAME_ENV} to choose an interface)")
            }
        };
        return Err(CollectiveError::config(format!(
            "{why}; interfaces seen: {listed}"
        )));
    }
    Ok(chosen)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iface(name: &str, up: bool, evidence: Option<Evidence>) -> Interface {
        Interface {
            thunderbolt: evidence,
            ..Interface::new(name, 1, up)
        }
    }

    fn names(links: &[Interface]) -> Vec<&str> {
        links.iter().map(|i| i.name.as_str()).collect()
    }

    fn filter(spec: &str) -> IfnameFilter {
        IfnameFilter::parse(spec).unwrap()
    }

    #[test]
    fn no_thunderbolt_link_lists_what_was_seen() {
        let seen = vec![
            Interface {
                driver: Some("e1000e".into()),
                ..iface("eth0", true, None)
            },
            iface("wlan0", true, None),
            iface("thunderbolt0", false, Some(Evidence::Name)),
        ];
        let err = select_links(&seen, None).unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, CollectiveError::Config { .. }), "{text}");
        assert!(
            text.contains("eth0 (not Thunderbolt, driver e1000e)"),
            "{text}"
        );
        assert!(text.contains("wlan0"), "{text}");
        assert!(
            text.contains("thunderbolt0 (thunderbolt name, down)"),
            "{text}"
        );
        let err = select_links(&[], None).unwrap_err().to_string();
        assert!(err.contains("interfaces seen: none"), "{err}");
    }

    #[test]
    fn several_links_are_all_taken_in_order() {
        let seen = vec![
            iface("eth0", true, None),
            iface("thunderbolt1", true, Some(Evidence::Name)),
            iface("tbnet", true, Some(Evidence::Driver)),
            iface("thunderbolt0", true, Some(Evidence::Driver)),
        ];
        let links = select_links(&seen, None).unwrap();
        assert_eq!(names(&links), ["thunderbolt1", "tbnet", "thunderbolt0"]);
    }

    #[test]
    fn bridge_members_give_way_to_the_bridge() {
        let seen = vec![
            iface(
                "en1",
                true,
                Some(Evidence::HardwarePort("Thunderbolt 1".into())),
            ),
            iface(
                "en2",
                true,
                Some(Evidence::HardwarePort("Thunderbolt 2".into())),
            ),
            iface(
                "en3",
                true,
                Some(Evidence::HardwarePort("Thunderbolt 3".into())),
            ),
            iface(
                "bridge0",
                true,
                Some(Evidence::Bridge {
                    members: vec!["en1".into(), "en2".into()],
                }),
            ),
            iface("en0", true, None),
        ];
        let links = select_links(&seen, None).unwrap();
        assert_eq!(names(&links), ["en3", "bridge0"]);
    }

    #[test]
    fn the_override_selects_excludes_and_never_falls_back() {
        let seen = vec![
            iface("eth0", true, None),
            iface("thunderbolt0", true, Some(Evidence::Name)),
            iface("thunderbolt1", true, Some(Evidence::Name)),
            iface("eth1", false, None),
        ];
        let picked = select_links(&seen, Some(&filter("=eth0"))).unwrap();
        assert_eq!(names(&picked), ["eth0"]);
        let picked = select_links(&seen, Some(&filter("thunder"))).unwrap();
        assert_eq!(names(&picked), ["thunderbolt0", "thunderbolt1"]);
        let picked = select_links(&seen, Some(&filter("^=thunderbolt0"))).unwrap();
        assert_eq!(names(&picked), ["thunderbolt1"]);
        // Excluding every Thunderbolt link does not fall back to Ethernet.
        let err = select_links(&seen, Some(&filter("^thunderbolt"))).unwrap_err();
        assert!(
            err.to_string()
                .contains("^thunderbolt selects no interface"),
            "{err}"
        );
        // A selected interface that is down is not used either.
        assert!(select_links(&seen, Some(&filter("=eth1"))).is_err());
    }

    #[test]
    fn link_local_addresses_are_recognised() {
        let mut i = iface("thunderbolt0", true, Some(Evidence::Name));
        i.addrs = vec![
            "169.254.3.4".parse().unwrap(),
            "fe80::1".parse().unwrap(),
            "fd00::1".parse().unwrap(),
            "febf::2".parse().unwrap(),
        ];
        let ll: Vec<_> = i.link_local_v6().map(|a| a.to_string()).collect();
        assert_eq!(ll, ["fe80::1", "febf::2"]);
    }
}
