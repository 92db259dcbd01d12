//! Interface filters in NCCL's `NCCL_SOCKET_IFNAME` syntax, shared by `RLX_SOCKET_IFNAME` (TCP)
//! and `RLX_TB_IFNAME` (Thunderbolt).
//!
//! The syntax is a comma-separated list of names. By default each name is a prefix (`eth`
//! matches `eth0` and `eth1`); a leading `=` makes every name exact; a leading `^` turns the list
//! into an exclusion list. `^=` combines both (exclude exactly these names).

use std::fmt;

use crate::CollectiveError;

/// A parsed interface filter; see the module docs.
///
/// # Examples
///
/// ```
/// use rlx_transport::ifname::IfnameFilter;
///
/// let filter = IfnameFilter::parse("^docker,lo")?;
/// assert!(filter.matches("eth0"));
/// assert!(!filter.matches("docker0"));
/// assert!(!filter.matches("lo"));
/// let exact = IfnameFilter::parse("=eth1")?;
/// assert!(exact.matches("eth1") && !exact.matches("eth10"));
/// # Ok::<(), rlx_transport::CollectiveError>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct IfnameFilter {
    exclude: bool,
    exact: bool,
    names: Vec<String>,
}

impl IfnameFilter {
    /// Parses `spec`; an empty list (or one of only separators) is a `Config` error because it
    /// would silently match everything or nothing.
    pub fn parse(spec: &str) -> Result<Self, CollectiveError> {
        let mut rest = spec.trim();
        let exclude = rest.starts_with('^');
        if exclude {
            rest = &rest[1..];
        }
        let exact = rest.starts_with('=');
        if exact {
            rest = &rest[1..];
        }
        let names: Vec<String> = rest
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(str::to_owned)
            .collect();
        if names.is_empty() {
            return Err(CollectiveError::config(format!(
                "interface filter {spec:?} names no interface"
            )));
        }
        Ok(Self {
            exclude,
            exact,
            names,
        })
    }

    /// Whether the interface called `name` passes the filter.
    pub fn matches(&self, name: &str) -> bool {
        let listed = self.names.iter().any(|n| {
            if self.exact {
                n == name
            } else {
                name.starts_with(n.as_str())
            }
        });
        listed != self.exclude
    }

    /// The names the filter lists, in order.
    pub(crate) fn names(&self) -> &[String] {
        &self.names
    }

    /// Whether this filter excludes rather than selects.
    pub fn is_exclusion(&self) -> bool {
        self.exclude
    }
}

impl fmt::Debug for IfnameFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for IfnameFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.exclude {
            f.write_str("^")?;
        }
        if self.exact {
            f.write_str("=")?;
        }
        // A first name that starts like a flag the printed flags leave open is set apart by a
        // leading separator, so that the printed filter parses back to this one.
        let first = self.names.first().map_or("", String::as_str);
        let open_flags: &[char] = match (self.exclude, self.exact) {
            (_, true) => &[],
            (true, false) => &['='],
            (false, false) => &['^', '='],
        };
        if first.starts_with(open_flags) {
            f.write_str(",")?;
        }
        f.write_str(&self.names.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_exact_and_exclusion() {
        let p = IfnameFilter::parse("eth,en").unwrap();
        assert!(p.matches("eth0") && p.matches("en5") && !p.matches("lo"));
        let e = IfnameFilter::parse("=eth0").unwrap();
        assert!(e.matches("eth0") && !e.matches("eth01"));
        let x = IfnameFilter::parse("^lo,docker").unwrap();
        assert!(x.is_exclusion() && !x.matches("lo") && !x.matches("docker0") && x.matches("eth0"));
        let xe = IfnameFilter::parse("^=lo").unwrap();
        assert!(!xe.matches("lo") && xe.matches("lo1"));
        assert_eq!(xe.to_string(), "^=lo");
    }

    /// Found by fuzzing (`ifname`): `", ^x"` (a prefix filter for names starting with `^x`)
    /// printed as `"^x"`, an exclusion list.
    #[test]
    fn names_that_start_like_flags_print_unambiguously() {
        for spec in [", ^x", ",=x", "^,=x", "=^x", "^=^x"] {
            let filter = IfnameFilter::parse(spec).unwrap();
            let printed = filter.to_string();
            assert_eq!(
                IfnameFilter::parse(&printed).unwrap(),
                filter,
                "{spec:?} {printed:?}"
            );
        }
        assert_eq!(IfnameFilter::parse(", ^x").unwrap().to_string(), ",^x");
    }

    #[test]
    fn empty_lists_are_refused() {
        for spec in ["", "^", "=", "^=", " , "] {
            assert!(IfnameFilter::parse(spec).is_err(), "{spec:?}");
        }
    }
}
