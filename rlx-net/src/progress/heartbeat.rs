//! Peer liveness that does not wait for the operation timeout: heartbeats on every link, and
//! the silence rule that declares a peer lost.
//!
//! A stopped process (SIGSTOP, a debugger), a pulled cable or a machine gone to sleep sends no
//! reset, so without this only the operation timeout (300 s by default) would notice. The
//! background watcher runs a [`Pulse`] each round:
//! - *Beats.* When nothing went out to a peer for one interval, the watcher writes a header-only
//!   [`FrameKind::Beat`] frame on each of its links. It comes from the transport's own thread,
//!   so a caller that computes for an hour without calling the transport still beats. A beat is
//!   written only while this thread holds the peer's send lock (a send in progress owns the
//!   links until its last byte, so a beat never lands inside another frame), and only on a link
//!   whose socket has room (a peer that stopped reading gets no beat; its own silence, or its
//!   parked links, decide).
//! - *Silence.* Every read of a link notes that its peer was heard (any byte counts, not only
//!   beats). A peer that was not heard on any link for [`SILENT_BEATS`] intervals is lost, with
//!   a reason that says for how long it sent nothing. A peer whose links are parked is never
//!   blamed: this side stopped reading it (its unexpected budget is full), so its bytes wait
//!   unread in the kernel.
//! - *This process stopped.* When a round comes far later than due (this process was stopped
//!   or starved itself), everyone's silence is forgiven once: the peers were not silent, this
//!   side was not listening. If they gave up on this rank meanwhile, their closed sockets say
//!   so at the next read.

use std::io;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use rlx_transport::Tag;

use crate::error::Lost;
use crate::frame::{FrameHeader, FrameKind, HEADER_LEN};
use crate::sync::lock;

use super::Engine;
use super::link::PeerIo;
use super::socket::{poll, pollfd, write_frame};

/// Default of [`EngineConfig::heartbeat`](super::EngineConfig::heartbeat): one beat a second,
/// so that a silent peer is lost after 5 s.
pub(crate) const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(1);

/// A peer not heard from for this many heartbeat intervals is lost. Five leaves room for a
/// beat delayed by a loaded machine (the watcher thread waiting for a core) several times over.
const SILENT_BEATS: u32 = 5;

/// Rounds of the monitor per heartbeat interval: silence is measured to a quarter interval.
const ROUNDS_PER_BEAT: u32 = 4;

/// What the monitor knows about one peer.
#[derive(Debug)]
struct PeerPulse {
    /// When bytes from the peer were last noticed.
    heard_at: Instant,
    /// When the monitor last made sure something went out to the peer.
    beat_at: Instant,
    /// The peer's message count when the monitor last looked: a change means a message went
    /// out since, and no beat is needed.
    seq_seen: u64,
}

/// The heartbeat monitor; the watcher thread owns it and calls [`Pulse::tick`] every round.
#[derive(Debug)]
pub(super) struct Pulse {
    interval: Duration,
    window: Duration,
    round: Duration,
    last_round: Instant,
    peers: Vec<PeerPulse>,
}

impl Pulse {
    /// The monitor of `engine`'s peers, or `None` when heartbeats are off.
    pub(super) fn new(engine: &Engine) -> Option<Self> {
        let interval = engine.cfg.heartbeat;
        if interval.is_zero() {
            return None;
        }
        let now = Instant::now();
        Some(Self {
            interval,
            window: interval * SILENT_BEATS,
            round: interval / ROUNDS_PER_BEAT,
            last_round: now,
            peers: (0..engine.world)
                .map(|_| PeerPulse {
                    heard_at: now,
                    beat_at: now,
                    seq_seen: 0,
                })
                .collect(),
        })
    }

    /// Beats where a link was silent, and declares silent peers lost; does nothing until a
    /// round is due. Never blocks.
    pub(super) fn tick(&mut self, engine: &Engine) {
        let now = Instant::now();
        let since = now.duration_since(self.last_round);
        if since < self.round {
            return;
        }
        self.last_round = now;
        let stalled_here = since > self.window / 2;
        if stalled_here {
            tracing::info!(
                late_ms = since.as_millis() as u64,
                "heartbeat round came late (this process was stopped or starved): peer silence forgiven"
            );
        }
        // Which peers are already lost, and which have a link this side stopped reading.
        let standing: Vec<(bool, bool)> = {
            let st = lock(&engine.hub.state);
            st.peers
                .iter()
                .map(|p| (p.lost.is_some(), p.links.iter().any(|l| l.parked)))
                .collect()
        };
        for (rank, (pulse, &(lost, parked))) in self.peers.iter_mut().zip(&standing).enumerate() {
            let Some(Some(io)) = engine.peers.get(rank) else {
                continue;
            };
            if lost {
                continue;
            }
            let rank = rank as u32;
            // Every link's flag is taken, so that none carries an old mark into a later round.
            let heard = io
                .links
                .iter()
                .fold(false, |any, link| link.take_heard() | any);
            if heard || parked || stalled_here {
                pulse.heard_at = now;
            }
            let silent = now.duration_since(pulse.heard_at);
            if silent >= self.window {
                engine.lose(
                    rank,
                    Lost::Gone(format!(
                        "it sent nothing for {} ms (heartbeats every {} ms; link to {})",
                        silent.as_millis(),
                        self.interval.as_millis(),
                        io.addr
                    )),
                );
                continue;
            }
            if now.duration_since(pulse.beat_at) >= self.interval {
                pulse.beat_at = now;
                if let Err(lost) = engine.beat(rank, io, &mut pulse.seq_seen, self.interval) {
                    engine.lose(rank, lost);
                }
            }
        }
    }
}

impl Engine {
    /// Writes a heartbeat on every link to `rank` that has room, unless a send is in progress
    /// or a message went out since the last look (`seq_seen`).
    fn beat(
        &self,
        rank: u32,
        io: &PeerIo,
        seq_seen: &mut u64,
        interval: Duration,
    ) -> Result<(), Lost> {
        // A send holding the lock is on the wire already, or stuck behind a peer that does not
        // read; either way a beat could not go out before it.
        let Ok(tx) = io.tx.try_lock() else {
            return Ok(());
        };
        if tx.next_seq != *seq_seen {
            *seq_seen = tx.next_seq;
            return Ok(());
        }
        let header = FrameHeader::whole(FrameKind::Beat, Tag::from_raw(0), 0, 0).encode();
        for link in &io.links {
            let mut fds = [pollfd(link.fd(), libc::POLLOUT)];
            poll(&mut fds, Duration::ZERO);
            if fds[0].revents & libc::POLLOUT == 0 {
                continue;
            }
            let mut sent = 0;
            let started = Instant::now();
            while sent < HEADER_LEN {
                match write_frame(&link.stream, &header, &[], 0, 0, sent as u64) {
                    Ok(n) => sent += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(self.lost_from_io(rank, "sending a heartbeat", &e)),
                }
                if sent == 0 || sent == HEADER_LEN {
                    break;
                }
                // A writable socket takes 48 bytes whole in practice; should it take only
                // part, the rest must follow before any other frame, or the link is unusable.
                if started.elapsed() >= interval {
                    return Err(Lost::Gone(format!(
                        "a heartbeat to {} stalled after {sent} of {HEADER_LEN} bytes (link unusable)",
                        io.addr
                    )));
                }
                let mut fds = [
                    pollfd(link.fd(), libc::POLLOUT),
                    pollfd(self.abort_rx.as_raw_fd(), libc::POLLIN),
                ];
                poll(&mut fds, Duration::from_millis(10));
                if self.is_aborted() {
                    break;
                }
            }
        }
        Ok(())
    }
}
