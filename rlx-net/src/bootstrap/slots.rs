//! The bounded set of connections a bootstrap listener (the link listener or the rendezvous
//! store) is handshaking with, so that strangers can never crowd out a rank.
//!
//! Every accepted connection takes a slot until it is handed over or ends. A connection that
//! has not identified itself yet (no complete hello or registration, or no proof of the job
//! secret when one is set) may be evicted to make room: when its source address already holds
//! [`MAX_PER_ADDRESS`] slots, that address's oldest unidentified connection goes; when all
//! [`MAX_HANDSHAKES`] slots are taken, the oldest unidentified connection of the address with
//! the most slots goes. A rank sends its hello at once, so it is never the oldest for long,
//! and a rank that is evicted or refused anyway is told why (the `busy` answer) and retries.
//! Only when every slot holds an identified connection is a newcomer refused, with that reason.

use std::io::Write;
use std::net::{IpAddr, Shutdown, SocketAddr, TcpStream};
use std::sync::Mutex;
use std::time::Instant;

/// Most connections handshaken at once by one listener; every one costs a thread.
pub(super) const MAX_HANDSHAKES: usize = 64;
/// Most slots one source address holds before its own oldest unidentified connection is
/// evicted for its newcomer. Half the slots: ranks on one host share an address, and up to
/// this many of their links may connect at once.
pub(super) const MAX_PER_ADDRESS: usize = MAX_HANDSHAKES / 2;

/// One connection in the handshake.
#[derive(Debug)]
struct Pending {
    id: u64,
    from: SocketAddr,
    since: Instant,
    identified: bool,
    /// A handle on the connection, to end it when it is evicted or bootstrap is over.
    stream: TcpStream,
}

#[derive(Debug, Default)]
struct State {
    next_id: u64,
    pending: Vec<Pending>,
}

/// What an evicted or refused connection is sent, from the reason it is closed.
pub(super) type BusyReply = Box<dyn Fn(&str) -> Vec<u8> + Send + Sync>;

/// The slots of one listener; see the module docs.
pub(super) struct Slots {
    /// This rank, for the log.
    rank: u32,
    /// The listener, for the log (`"link listener"`, `"rendezvous store"`).
    what: &'static str,
    /// What an evicted or refused connection is sent before it is closed, as the protocol of
    /// the listener encodes a refusal with [`RefusalCode::Busy`](crate::handshake::RefusalCode).
    busy: BusyReply,
    state: Mutex<State>,
}

/// A connection's slot; dropping it frees the slot.
pub(super) struct Slot<'a> {
    slots: &'a Slots,
    id: u64,
}

impl Slot<'_> {
    /// The connection proved who it is: from now on it cannot be evicted. False when it was
    /// evicted before (it was then told so and closed, and its handshake must stop).
    pub(super) fn identified(&self) -> bool {
        let Ok(mut state) = self.slots.state.lock() else {
            return false;
        };
        match state.pending.iter_mut().find(|p| p.id == self.id) {
            Some(p) => {
                p.identified = true;
                true
            }
            None => false,
        }
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        if let Ok(mut state) = self.slots.state.lock() {
            state.pending.retain(|p| p.id != self.id);
        }
    }
}

impl Slots {
    /// The slots of `what` on `rank`, whose refusals `busy` encodes.
    pub(super) fn new(rank: u32, what: &'static str, busy: BusyReply) -> Self {
        Slots {
            rank,
            what,
            busy,
            state: Mutex::new(State::default()),
        }
    }

    /// Gives the connection `stream` from `from` a slot, evicting an unidentified connection
    /// when there is no room (see the module docs); `None` when every slot holds an identified
    /// connection (the newcomer is then refused and closed).
    pub(super) fn admit(&self, stream: &TcpStream, from: SocketAddr) -> Option<Slot<'_>> {
        let Ok(mut state) = self.state.lock() else {
            return None;
        };
        let same_address = state
            .pending
            .iter()
            .filter(|p| p.from.ip() == from.ip())
            .count();
        let crowded = if same_address >= MAX_PER_ADDRESS {
            Some((from.ip(), same_address))
        } else if state.pending.len() >= MAX_HANDSHAKES {
            // With no connection to evict, the search below finds none and refuses the newcomer.
            Some(busiest(&state.pending).unwrap_or((from.ip(), 0)))
        } else {
            None
        };
        if let Some((ip, held)) = crowded {
            let victim = state
                .pending
                .iter()
                .enumerate()
                .filter(|(_, p)| !p.identified && p.from.ip() == ip)
                .min_by_key(|(_, p)| p.since)
                .map(|(index, _)| index);
            match victim {
                Some(index) => {
                    let victim = state.pending.swap_remove(index);
                    let reason = format!(
                        "evicted: the {} of rank {} had {} handshakes in flight ({held} from \
                         {ip}), and this was the oldest connection from {ip} that had not \
                         identified itself",
                        self.what,
                        self.rank,
                        state.pending.len() + 1
                    );
                    self.close(&victim.stream, victim.from, &reason);
                }
                None => {
                    let reason = format!(
                        "refused: the {} of rank {} has {} handshakes in flight, none of them \
                         from a stranger it could evict; retry",
                        self.what,
                        self.rank,
                        state.pending.len()
                    );
                    self.close(stream, from, &reason);
                    return None;
                }
            }
        }
        let handle = stream.try_clone().ok()?;
        let id = state.next_id;
        state.next_id += 1;
        state.pending.push(Pending {
            id,
            from,
            since: Instant::now(),
            identified: false,
            stream: handle,
        });
        Some(Slot { slots: self, id })
    }

    /// Tells the connection from `from` why it is closed (best effort), closes it and logs it.
    fn close(&self, stream: &TcpStream, from: SocketAddr, reason: &str) {
        let mut s = stream;
        let _ = s.write_all(&(self.busy)(reason));
        let _ = stream.shutdown(Shutdown::Both);
        tracing::warn!(rank = self.rank, %from, listener = self.what, reason, "closed a connection");
    }

    /// Closes every connection still in the handshake: bootstrap is over (or failed), and the
    /// threads handshaking with them must end.
    pub(super) fn close_all(&self) {
        if let Ok(state) = self.state.lock() {
            for p in &state.pending {
                let _ = p.stream.shutdown(Shutdown::Both);
            }
        }
    }
}

/// The address holding the most slots of connections that have not identified themselves,
/// and how many.
fn busiest(pending: &[Pending]) -> Option<(IpAddr, usize)> {
    let unidentified = || pending.iter().filter(|p| !p.identified);
    let mut best: Option<(IpAddr, usize)> = None;
    for p in unidentified() {
        let ip = p.from.ip();
        let held = unidentified().filter(|q| q.from.ip() == ip).count();
        if best.is_none_or(|(_, most)| held > most) {
            best = Some((ip, held));
        }
    }
    best
}
