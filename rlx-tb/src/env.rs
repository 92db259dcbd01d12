//! The `RLX_*` environment variable of the Thunderbolt transport, in one place: its name,
//! [`VARIABLES`] (the documented list the README's table of variables mirrors), and the read
//! of the link filter it holds.
//!
//! Everything else a Thunderbolt rank reads is shared with TCP: the launch variables of
//! [`rlx_transport::env`] (except `RLX_SOCKET_IFNAME`) and the engine's tuning of
//! [`rlx_net::env`].

use rlx_transport::env::Variable;
use rlx_transport::ifname::IfnameFilter;
use rlx_transport::{CollectiveError, Result};

/// The environment variable that overrides discovery, in NCCL's `NCCL_SOCKET_IFNAME` syntax.
pub const TB_IFNAME_ENV: &str = "RLX_TB_IFNAME";

/// Every variable of this crate, in the README's order.
pub const VARIABLES: &[Variable] = &[Variable {
    name: TB_IFNAME_ENV,
    backends: &["tb"],
    default: "detected Thunderbolt links; with `--netns --transport tb` over islands or a `+star`, `thunderbolt,eth0`",
    meaning: "the Thunderbolt links, in NCCL syntax, instead of detection",
}];

/// The `RLX_TB_IFNAME` filter, when the variable is set.
pub(crate) fn filter_from_env() -> Result<Option<IfnameFilter>> {
    match std::env::var(TB_IFNAME_ENV) {
        Ok(spec) => Ok(Some(IfnameFilter::parse(&spec)?)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => Err(CollectiveError::config(format!(
            "{TB_IFNAME_ENV} is not valid unicode"
        ))),
    }
}
