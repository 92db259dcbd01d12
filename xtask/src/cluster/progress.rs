//! The live per-rank progress display of test-cluster.
//!
//! On a terminal it redraws one line per rank in place (a few times a second) and prints log
//! lines above them; elsewhere (CI logs) it prints the log lines as they come and a compact
//! status line every few seconds, so that a log stays readable and still shows where a rank
//! was when something went wrong.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

/// How often a terminal display is redrawn.
const REDRAW_EVERY: Duration = Duration::from_millis(150);
/// How often a plain display prints a status line.
const PLAIN_EVERY: Duration = Duration::from_secs(5);

/// The display.
#[derive(Debug)]
pub(crate) struct Progress {
    terminal: bool,
    drawn: usize,
    last: Option<Instant>,
    started: Instant,
    width: usize,
}

impl Progress {
    /// A display on stderr.
    pub(crate) fn new() -> Progress {
        Progress {
            terminal: std::io::stderr().is_terminal(),
            drawn: 0,
            last: None,
            started: Instant::now(),
            width: 110,
        }
    }

    /// Shows `lines` (one per rank) if it is time to.
    pub(crate) fn update(&mut self, lines: &[String]) {
        let every = if self.terminal {
            REDRAW_EVERY
        } else {
            PLAIN_EVERY
        };
        if self.last.is_some_and(|t| t.elapsed() < every) {
            return;
        }
        self.last = Some(Instant::now());
        self.draw(lines);
    }

    /// Shows the final state once.
    pub(crate) fn finish(&mut self, lines: &[String]) {
        self.draw(lines);
        self.drawn = 0;
    }

    /// Prints a log line above the status lines.
    pub(crate) fn log(&mut self, line: &str) {
        let mut text = String::new();
        if self.terminal {
            self.erase(&mut text);
        }
        text.push_str(line);
        text.push('\n');
        // `eprint!` rather than a raw stderr handle, so that test harnesses capture it.
        eprint!("{text}");
    }

    fn erase(&mut self, text: &mut String) {
        if self.drawn > 0 {
            // Cursor up over the drawn block and clear to the end of the screen.
            text.push_str(&format!("\x1b[{}A\x1b[J", self.drawn));
            self.drawn = 0;
        }
    }

    fn draw(&mut self, lines: &[String]) {
        let mut text = String::new();
        if self.terminal {
            self.erase(&mut text);
            for line in lines {
                text.extend(line.chars().take(self.width));
                text.push('\n');
            }
            self.drawn = lines.len();
        } else {
            let elapsed = self.started.elapsed().as_secs();
            let joined: Vec<&str> = lines.iter().map(String::as_str).collect();
            text.push_str(&format!("[{elapsed:>4} s] {}\n", joined.join(" | ")));
        }
        eprint!("{text}");
    }
}
