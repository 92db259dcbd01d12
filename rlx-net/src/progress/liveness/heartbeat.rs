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
//! - *Floods.* A peer whose messages fill the unexpected budget while nobody here receives
//!   any of them (its links parked, its message count unchanged) for twice the operation
//!   timeout is dropped as a protocol offender, with a reason that says how much it holds. A
//!   legitimate rank that sends to a tag nobody receives has by then been told by its own
//!   send, which timed out after one operation timeout naming this rank; a stranger that
//!   passed the handshake no longer holds a link and the budget's memory for good.
//! - *This process stopped.* When a round comes far later than due (this process was stopped
//!   or starved itself), everyone's silence is forgiven once: the peers were not silent, this
//!   side was not listening. If they gave up on this rank meanwhile, their closed sockets say
//!   so at the next read.

use std::time::{Duration, Instant};

use rlx_transport::Tag;

use crate::error::Lost;
use crate::frame::{FrameHeader, FrameKind};
use crate::sync::lock;

use crate::progress::config::SILENT_BEATS;
use crate::progress::core::Core;
use crate::progress::link::HeaderSent;
use crate::progress::link::PeerIo;
use crate::progress::socket::{poll, pollfd};

/// Default of [`EngineConfig::heartbeat`](crate::progress::EngineConfig::heartbeat): one beat a second,
/// so that a silent peer is lost after 5 s.
pub(crate) const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(1);

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
    /// Since when the peer has held the unexpected budget with nothing received, and its
    /// incoming message count then.
    flooding: Option<(u64, Instant)>,
}

/// One peer's standing in the matching state, as a round of the monitor found it.
#[derive(Clone, Copy, Debug)]
struct PeerStanding {
    lost: bool,
    /// A link of the peer is parked: this side stopped reading it.
    parked: bool,
    /// See [`PeerState::held_back`](crate::matching::PeerState::held_back).
    held: Option<(u64, u64)>,
}

/// The heartbeat monitor; the watcher thread owns it and calls [`Pulse::tick`] every round.
#[derive(Debug)]
pub(in crate::progress) struct Pulse {
    interval: Duration,
    window: Duration,
    /// How long a peer may hold the unexpected budget with nothing received.
    flood_window: Duration,
    round: Duration,
    last_round: Instant,
    peers: Vec<PeerPulse>,
}

impl Pulse {
    /// The monitor of the peers of `core`'s engine, or `None` when heartbeats are off.
    pub(in crate::progress) fn new(core: &Core) -> Option<Self> {
        let interval = core.cfg.heartbeat;
        if interval.is_zero() {
            return None;
        }
        let now = Instant::now();
        Some(Self {
            interval,
            window: interval * SILENT_BEATS,
            flood_window: core.cfg.op_timeout.saturating_mul(2),
            round: interval / ROUNDS_PER_BEAT,
            last_round: now,
            peers: (0..core.world)
                .map(|_| PeerPulse {
                    heard_at: now,
                    beat_at: now,
                    seq_seen: 0,
                    flooding: None,
                })
                .collect(),
        })
    }

    /// Beats where a link was silent, and declares silent peers lost; does nothing until a
    /// round is due. Never blocks.
    pub(in crate::progress) fn tick(&mut self, core: &Core) {
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
        // Which peers are already lost, which have a link this side stopped reading, and which
        // hold the unexpected budget.
        let standing: Vec<PeerStanding> = {
            let st = lock(&core.hub.state);
            st.peers
                .iter()
                .map(|p| PeerStanding {
                    lost: p.lost.is_some(),
                    parked: p.links.iter().any(|l| l.parked),
                    held: p.held_back(),
                })
                .collect()
        };
        for (rank, (pulse, standing)) in self.peers.iter_mut().zip(&standing).enumerate() {
            let PeerStanding { lost, parked, held } = *standing;
            let Some(Some(io)) = core.peers.get(rank) else {
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
            let flood_window = if stalled_here {
                None
            } else {
                Some(self.flood_window)
            };
            if let Some(reason) =
                pulse.follow_flood(held, now, flood_window, core.cfg.max_unexpected)
            {
                core.lose(
                    rank,
                    Lost::Protocol(format!("{reason} (link to {})", io.addr)),
                );
                continue;
            }
            let silent = now.duration_since(pulse.heard_at);
            if silent >= self.window {
                core.lose(
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
                if let Err(lost) = beat(core, rank, io, &mut pulse.seq_seen, self.interval) {
                    core.lose(rank, lost);
                }
            }
        }
    }
}

impl PeerPulse {
    /// Follows the peer's hold on the unexpected budget of `budget` bytes (`held`: see
    /// [`PeerState::held_back`](crate::matching::PeerState::held_back)); the reason to drop it
    /// once it has held the budget for `window` with nothing received. `window` is `None` when
    /// this process itself was stopped: the hold is counted afresh.
    fn follow_flood(
        &mut self,
        held: Option<(u64, u64)>,
        now: Instant,
        window: Option<Duration>,
        budget: u64,
    ) -> Option<String> {
        let Some((seq, bytes)) = held else {
            self.flooding = None;
            return None;
        };
        let since = match (self.flooding, window) {
            (Some((at_seq, since)), Some(_)) if at_seq == seq => since,
            _ => {
                self.flooding = Some((seq, now));
                now
            }
        };
        let held_for = now.duration_since(since);
        (held_for >= window?).then(|| {
            format!(
                "it holds {bytes} bytes of messages nobody on this rank receives (the \
                 unexpected budget is {} bytes) and nothing was received from it for {} ms, \
                 twice the operation timeout: dropped as a flood",
                budget,
                held_for.as_millis()
            )
        })
    }
}

/// Writes a heartbeat on every link to `rank` that has room, unless a send is in progress
/// or a message went out since the last look (`seq_seen`).
fn beat(
    core: &Core,
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
    // Beats go on the sockets even where link 0 switched to a lane: there they only prove
    // the peer alive, and cannot be left half written behind a full ring.
    for link in &io.links {
        let mut fds = [pollfd(link.fd(), libc::POLLOUT)];
        poll(&mut fds, Duration::ZERO);
        if fds[0].revents & libc::POLLOUT == 0 {
            continue;
        }
        if core.send_header_whole(rank, io, link, &header, "a heartbeat", interval)?
            == HeaderSent::Aborted
        {
            break;
        }
    }
    Ok(())
}

#[cfg(all(test, not(rlx_loom)))]
mod tests {
    use super::*;

    fn pulse(now: Instant) -> PeerPulse {
        PeerPulse {
            heard_at: now,
            beat_at: now,
            seq_seen: 0,
            flooding: None,
        }
    }

    /// A hold counts from when it was first seen at one message count; a received message
    /// (the count moves), a released budget or this process's own stall starts it afresh.
    #[test]
    fn a_flood_is_a_hold_that_outlasts_the_window_at_one_count() {
        let start = Instant::now();
        let window = Some(Duration::from_secs(4));
        let at = |secs| start + Duration::from_secs(secs);
        let mut peer = pulse(start);
        assert_eq!(peer.follow_flood(Some((7, 100)), at(0), window, 100), None);
        assert_eq!(peer.follow_flood(Some((7, 100)), at(3), window, 100), None);
        // A message was received: the count moved, the hold starts again.
        assert_eq!(peer.follow_flood(Some((8, 100)), at(5), window, 100), None);
        assert_eq!(peer.follow_flood(Some((8, 100)), at(8), window, 100), None);
        // The budget was released for a moment.
        assert_eq!(peer.follow_flood(None, at(9), window, 100), None);
        assert_eq!(peer.follow_flood(Some((8, 100)), at(10), window, 100), None);
        // This process was stopped: the hold is counted afresh.
        assert_eq!(peer.follow_flood(Some((8, 100)), at(13), None, 100), None);
        assert_eq!(peer.follow_flood(Some((8, 100)), at(16), window, 100), None);
        let reason = peer
            .follow_flood(Some((8, 60)), at(17), window, 100)
            .expect("held for the window");
        assert!(
            reason.contains("holds 60 bytes") && reason.contains("budget is 100 bytes"),
            "{reason}"
        );
    }
}
