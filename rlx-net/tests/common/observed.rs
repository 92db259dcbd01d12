//! What an in-process test observes of the transport beside its results: the warnings it logs
//! (captured by a `tracing` subscriber of the test process) and the resident memory the
//! process holds, under a bound. Cases that measure either run one at a time ([`serial`]).

use std::io::Write;
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use super::in_process::vm_rss_kib;

/// One case at a time: they measure this process's memory and read one shared log.
pub(crate) fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// The transport's warnings, captured from the first call on.
pub(crate) fn log() -> &'static Mutex<Vec<u8>> {
    static LOG: OnceLock<&'static Mutex<Vec<u8>>> = OnceLock::new();
    LOG.get_or_init(|| {
        let buffer: &'static Mutex<Vec<u8>> = Box::leak(Box::new(Mutex::new(Vec::new())));
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("warn"))
            .with_ansi(false)
            .with_writer(move || Capture(buffer))
            .init();
        buffer
    })
}

/// A writer into the captured log.
pub(crate) struct Capture(&'static Mutex<Vec<u8>>);

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Waits (up to 10 s) until one line of the log holds every one of `needles`; returns it.
pub(crate) fn logged(needles: &[&str]) -> String {
    let start = Instant::now();
    loop {
        let text =
            String::from_utf8_lossy(&log().lock().unwrap_or_else(|p| p.into_inner())).into_owned();
        if let Some(line) = text.lines().find(|l| needles.iter().all(|n| l.contains(n))) {
            return line.to_owned();
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no log line holds {needles:?}:\n{text}"
        );
        thread::sleep(Duration::from_millis(10));
    }
}

/// The resident memory at the start of a case, and the bound it must stay under.
pub(crate) struct RssBound {
    start_kib: u64,
    bound_kib: u64,
    peak_kib: u64,
}

impl RssBound {
    pub(crate) fn new(bound_kib: u64) -> Self {
        let start_kib = vm_rss_kib();
        RssBound {
            start_kib,
            bound_kib,
            peak_kib: start_kib,
        }
    }

    /// Samples the resident memory and fails the case when it grew beyond the bound.
    pub(crate) fn check(&mut self, when: &str) {
        let now = vm_rss_kib();
        self.peak_kib = self.peak_kib.max(now);
        assert!(
            now <= self.start_kib + self.bound_kib,
            "{when}: resident memory grew from {} KiB to {now} KiB, beyond the bound of {} KiB",
            self.start_kib,
            self.bound_kib
        );
    }

    pub(crate) fn report(&self, case: &str) {
        println!(
            "{case}: resident memory {} KiB at the start, peak {} KiB (+{} KiB, bound +{} KiB)",
            self.start_kib,
            self.peak_kib,
            self.peak_kib - self.start_kib,
            self.bound_kib
        );
    }
}
