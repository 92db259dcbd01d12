//! The `RLX_*` environment variables of this crate, in one place: their names (re-exported
//! where they always were: [`crate::BACKEND_VAR`], [`crate::DEBUG_VAR`], [`crate::PREFIXED_VAR`],
//! [`crate::flight::FLIGHT_DIR_VAR`]),
//! [`VARIABLES`] (the documented list the README's table of variables mirrors), and `read`,
//! through which the switches among them are read.
//!
//! The transports' own variables are listed by their crates (`rlx_transport::env`,
//! `rlx_net::env`, `rlx_tb::env`, `rlx_mlx_ffi::env`). As everywhere in the environment, `0`
//! turns a switch off: `RLX_DEBUG=0`, `RLX_OUTPUT_PREFIXED=0` and `RLX_FLIGHT_RECORDER=0` read
//! as unset.

use std::ffi::OsString;

use rlx_transport::env::Variable;

/// The environment variable that picks the backend: `tcp`, `tb` or `mlx`.
pub const BACKEND_VAR: &str = "RLX_BACKEND";

/// The environment variable that turns the diagnostics on, in `tracing-subscriber`'s
/// `EnvFilter` syntax: `RLX_DEBUG=info`, `RLX_DEBUG=rlx_net=debug,info`, ...
pub const DEBUG_VAR: &str = "RLX_DEBUG";

/// Set by a launcher that prefixes every line of a rank's output with the rank itself (as
/// `cargo xtask launch` and `test-cluster` do), so that the lines are not prefixed twice.
pub const PREFIXED_VAR: &str = "RLX_OUTPUT_PREFIXED";

/// The directory the flight records are dumped to, when set.
pub const FLIGHT_DIR_VAR: &str = "RLX_FLIGHT_RECORDER";

/// The cabling the job declares (`mesh`, `chain:0-2-1-3`, `islands:2x2`...; see
/// `rlx_transport::cabling`), which `init()` checks against the link matrix.
pub const CABLING_VAR: &str = "RLX_CABLING";

/// Every backend: `init()` reads these whichever it builds.
const ALL: &[&str] = &["tcp", "tb", "mlx"];

/// Every variable of this crate, in the README's order.
pub const VARIABLES: &[Variable] = &[
    Variable {
        name: BACKEND_VAR,
        backends: ALL,
        default: "the only backend compiled in, else tcp",
        meaning: "the backend `init()` builds: tcp, tb or mlx",
    },
    Variable {
        name: DEBUG_VAR,
        backends: ALL,
        default: "unset (0 = off)",
        meaning: "rank-prefixed diagnostics on stderr, in EnvFilter syntax",
    },
    Variable {
        name: PREFIXED_VAR,
        backends: ALL,
        default: "unset (0 = off)",
        meaning: "set by launchers that prefix each line with the rank themselves",
    },
    Variable {
        name: CABLING_VAR,
        backends: &["tcp", "tb"],
        default: "unset; with `--netns --topology`, the emulated cabling",
        meaning: "the cabling the job expects (star, mesh, ring, chain:0-2-1-3, islands:2x2); each declared cable the link matrix lacks is a warning naming its two ranks",
    },
    Variable {
        name: FLIGHT_DIR_VAR,
        backends: ALL,
        default: "unset (0 = off)",
        meaning: "directory the flight recorder dumps each rank's recent operations to",
    },
];

/// The value of switch `name` (`RLX_DEBUG`, `RLX_OUTPUT_PREFIXED`, `RLX_FLIGHT_RECORDER`),
/// `None` when it is unset or `0`, the environment's one spelling of "off".
pub(crate) fn read(name: &str) -> Option<OsString> {
    std::env::var_os(name).filter(|value| value.to_str().map(str::trim) != Some("0"))
}
