//! The `RLX_DEBUG` switch: a rank-prefixed stderr subscriber for the `tracing` diagnostics of
//! every RLX crate, installed by [`init`](crate::init()) (and by launchers' ranks) when the
//! variable is set.
//!
//! The libraries themselves never install a subscriber. This one is installed only when the
//! program asks for it through the environment, and never over a subscriber the program
//! installed itself.

use std::io::Write;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;

use crate::env::{self, DEBUG_VAR, PREFIXED_VAR};

/// Installs the stderr subscriber when `RLX_DEBUG` is set (and not `0`) and no global
/// subscriber exists yet, prefixing every line with `[rank R]` (the rank that the launch
/// environment names, or `?`) unless `RLX_OUTPUT_PREFIXED` (set, and not `0`) says the
/// launcher does that already.
/// Returns whether it installed one. Call it once, early; [`init`](crate::init()) does.
///
/// An unparsable `RLX_DEBUG` still installs the subscriber, at `info`, and says so, so that
/// a typo never silences the diagnostics a user asked for.
pub fn install_debug_subscriber() -> bool {
    let Some(directives) = env::read(DEBUG_VAR).and_then(|value| value.into_string().ok()) else {
        return false;
    };
    let (filter, bad) = match EnvFilter::try_new(directives.trim()) {
        Ok(filter) => (filter, None),
        Err(e) => (EnvFilter::new("info"), Some(e)),
    };
    let prefix = if env::read(PREFIXED_VAR).is_some() {
        String::new()
    } else {
        // Only the rank variables: the rest of the launch environment (a hostfile to read)
        // is the transport's business, read once when it starts.
        let rank = rlx_transport::bootstrap::RANK_VARS
            .iter()
            .find_map(|name| std::env::var(name).ok())
            .and_then(|value| value.trim().parse::<u32>().ok())
            .map_or_else(|| "?".to_owned(), |rank| rank.to_string());
        format!("[rank {rank}] ")
    };
    let installed = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false)
        .with_writer(RankPrefixed { prefix })
        .try_init()
        .is_ok();
    if let (true, Some(e)) = (installed, bad) {
        tracing::warn!("{DEBUG_VAR}={directives:?} is not a filter ({e}); showing info");
    }
    installed
}

/// Writes every formatted event to stderr in one piece, after the rank prefix, so that the
/// lines of several ranks sharing a terminal never interleave mid-line.
#[derive(Debug)]
struct RankPrefixed {
    prefix: String,
}

impl<'a> MakeWriter<'a> for RankPrefixed {
    type Writer = PrefixedLine<'a>;

    fn make_writer(&'a self) -> Self::Writer {
        PrefixedLine {
            prefix_len: self.prefix.len(),
            line: self.prefix.as_bytes().to_vec(),
            lifetime: std::marker::PhantomData,
        }
    }
}

/// One event's text after the prefix it starts with, written out in one call when dropped.
#[derive(Debug)]
struct PrefixedLine<'a> {
    prefix_len: usize,
    line: Vec<u8>,
    lifetime: std::marker::PhantomData<&'a RankPrefixed>,
}

impl Write for PrefixedLine<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.line.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for PrefixedLine<'_> {
    fn drop(&mut self) {
        if self.line.len() == self.prefix_len {
            return;
        }
        // Diagnostics must never fail the program; a closed stderr loses them.
        let _ = std::io::stderr().lock().write_all(&self.line);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_is_buffered_whole_until_it_is_written() {
        let writer = RankPrefixed {
            prefix: "[rank 3] ".to_owned(),
        };
        let mut line = writer.make_writer();
        line.write_all(b"INFO first half, ").unwrap();
        line.write_all(b"second half\n").unwrap();
        assert_eq!(line.line, b"[rank 3] INFO first half, second half\n");
        // Dropping it writes the prefixed line to stderr in one call.
        drop(line);
    }
}
