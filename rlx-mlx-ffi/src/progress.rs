//! The threads behind an [`MlxTransport`](crate::MlxTransport): per linked peer a sender
//! that drains the link's queue into MLX sends and a receiver that reads frames, delivers
//! them into the inbox, forwards them or parks for a native collective; and one collective
//! thread that runs MLX's collectives so that callers can give up on them at their deadline.
//! See the `transport` module docs for the protocol they follow.

use std::time::{Duration, Instant};

use rlx_transport::inbox::Delivery;
use rlx_transport::{Failure, Tag};

use crate::frame::{HEADER_LEN, Header, Kind};
use crate::pool::abandon_on_failure;
use crate::shared::{ABORT_POLL, FIRST_LEN, MAX_MESSAGE_LEN, Outgoing, PIECE_LEN, Shared};
use crate::sync::{lock, wait, wait_timeout};

/// How long a receiver waits for this rank's own pause frames to go out before it posts the
/// receive for the peer's pause anyway (see `receiver_loop`).
pub(crate) const PAUSE_GRACE: Duration = Duration::from_millis(2);

/// The collective thread: runs MLX collectives handed over by `Shared::native` until the
/// transport closes.
pub(crate) fn collective_loop(shared: &Shared) {
    loop {
        let job = {
            let mut jobs = lock(&shared.jobs);
            loop {
                if let Some(job) = jobs.pop_front() {
                    break job;
                }
                let state = lock(&shared.state);
                let done = state.closing || state.aborted;
                drop(state);
                if done {
                    return;
                }
                jobs = wait_timeout(&shared.job_queued, jobs, ABORT_POLL);
            }
        };
        job(shared);
    }
}

/// The sender thread of link `index`: drains the link's queue into MLX sends.
pub(crate) fn sender_loop(shared: &Shared, index: usize) {
    let link = &shared.links[index];
    loop {
        {
            let mut queue = lock(&link.queue);
            while queue.is_empty() {
                queue = wait(&link.queued, queue);
            }
        }
        let _sending = lock(&link.sending);
        let Some(item) = lock(&link.queue).pop_front() else {
            continue;
        };
        {
            let state = lock(&shared.state);
            if state.dead[index].is_some() {
                // A peer that said goodbye first waits for this rank's goodbye, which may be
                // queued behind frames that can no longer go out: those are dropped.
                if !state.peer_left[index] {
                    return;
                }
                if !matches!(item, Outgoing::Bye) {
                    continue;
                }
            }
        }
        match item {
            Outgoing::Frame(header, body) => {
                if let Err(e) = shared.send_frame(link.peer, &header, &[&body]) {
                    shared
                        .link_failed(index, format!("MLX send to rank {} failed: {e}", link.peer));
                    return;
                }
            }
            Outgoing::Staged(header, head, rest) => {
                match shared.send_staged(link.peer, &header, &head, &rest) {
                    Ok(()) => shared.arrays.give_back(rest),
                    Err(e) => {
                        let e = abandon_on_failure(e, rest);
                        shared.link_failed(
                            index,
                            format!("MLX send to rank {} failed: {e}", link.peer),
                        );
                        return;
                    }
                }
            }
            Outgoing::Pause(header) => {
                if let Err(e) = shared.send_frame(link.peer, &header, &[]) {
                    shared
                        .link_failed(index, format!("MLX send to rank {} failed: {e}", link.peer));
                    return;
                }
                let mut state = lock(&shared.state);
                state.sender_paused[index] = true;
                shared.changed.notify_all();
                shared.park(state, index);
            }
            Outgoing::Bye => {
                let bye = Header {
                    kind: Kind::Bye,
                    src: shared.rank,
                    dst: link.peer,
                    tag: 0,
                    len: 0,
                };
                let _ = shared.send_frame(link.peer, &bye, &[]);
                return;
            }
        }
    }
}

/// The receiver thread of link `index`: posts an MLX receive while somebody needs what comes
/// through the link, and routes what arrives.
pub(crate) fn receiver_loop(shared: &Shared, index: usize) {
    let peer = shared.links[index].peer;
    loop {
        {
            let mut state = lock(&shared.state);
            // While pausing, the receive for the peer's pause is posted only once this rank's
            // own pauses are out: a posted receive busy-polls a core in MLX, and on a small
            // machine it would starve the sender threads both ranks are waiting for.
            //
            // The wait for this rank's pauses is bounded: a sender can be stuck behind a large
            // frame that the peer only drains once its own receiver reads, so after
            // `PAUSE_GRACE` the receive is posted regardless.
            let mut pausing_since: Option<Instant> = None;
            loop {
                if state.aborted || state.dead[index].is_some() {
                    return;
                }
                if state.owned {
                    // The collective thread reads the links until the collective ends.
                    state = wait(&shared.changed, state);
                    continue;
                }
                let now = Instant::now();
                state.polled[index].retain(|e| e.2 > now);
                if state.always_receive
                    || state.closing
                    || !state.demand[index].is_empty()
                    || !state.polled[index].is_empty()
                {
                    break;
                }
                if state.pausing > 0 {
                    let since = *pausing_since.get_or_insert_with(Instant::now);
                    let waited = since.elapsed();
                    if state.sender_paused.iter().all(|&p| p) || waited >= PAUSE_GRACE {
                        break;
                    }
                    state = wait_timeout(&shared.changed, state, PAUSE_GRACE - waited);
                    continue;
                }
                pausing_since = None;
                state = wait(&shared.changed, state);
            }
            state.receiving[index] = true;
        }
        let paused = match receive_one(shared, index) {
            Ok(paused) => paused,
            Err(reason) => {
                let state = lock(&shared.state);
                let quiet = state.closing || state.aborted;
                drop(state);
                if !quiet {
                    shared.link_failed(index, reason);
                } else {
                    shared.inbox.mark_lost(peer, reason);
                }
                return;
            }
        };
        let mut state = lock(&shared.state);
        if let Some(descriptor) = paused {
            // The peer's next bytes belong to its native collective: nothing more is read
            // until this rank's has run.
            state.peer_paused[index] = Some(descriptor);
            shared.changed.notify_all();
            shared.park(state, index);
            state = lock(&shared.state);
        }
        state.receiving[index] = false;
        shared.changed.notify_all();
        if state.aborted || state.dead[index].is_some() {
            return;
        }
    }
}

/// Receives and handles one frame from link `index`: data and failure notices are delivered
/// or forwarded; a pause frame's descriptor is returned (whoever reads it owns the link
/// until the collective ends). An error ends the link.
pub(crate) fn receive_one(shared: &Shared, index: usize) -> Result<Option<(u64, u64)>, String> {
    let peer = shared.links[index].peer;
    let mut first = [0u8; FIRST_LEN];
    shared
        .group
        .recv(peer, &mut first)
        .map_err(|e| format!("MLX recv from rank {peer} failed: {e}"))?;
    let mut head = [0u8; HEADER_LEN];
    head.copy_from_slice(&first[..HEADER_LEN]);
    let header =
        Header::decode(&head, peer, shared.world, MAX_MESSAGE_LEN).map_err(|e| e.to_string())?;
    match header.kind {
        Kind::Bye => {
            lock(&shared.state).peer_left[index] = true;
            Err(format!("rank {peer} closed its MLX transport"))
        }
        Kind::Pause => Ok(Some((header.tag, header.len))),
        Kind::Data | Kind::Failure => {
            let len = usize::try_from(header.body_len())
                .map_err(|_| format!("frame of {} bytes from rank {peer}", header.len))?;
            let inline = len.min(FIRST_LEN - HEADER_LEN);
            let mut body = Vec::new();
            body.try_reserve_exact(len)
                .map_err(|_| format!("cannot allocate {len} bytes for a frame from rank {peer}"))?;
            body.extend_from_slice(&first[HEADER_LEN..HEADER_LEN + inline]);
            while body.len() < len {
                let piece = (len - body.len()).min(PIECE_LEN);
                shared
                    .group
                    .recv_append(peer, &mut body, piece)
                    .map_err(|e| format!("MLX recv from rank {peer} failed: {e}"))?;
            }
            if header.dst != shared.rank {
                // Forwarding only fails when the next link is gone; the sender then learns of
                // it through its own timeout, as on any lossy route.
                let _ = shared.enqueue(header, body);
                return Ok(None);
            }
            let tag = Tag::from_raw(header.tag);
            let delivery = match header.kind {
                Kind::Failure => Delivery::Failure(
                    Failure::decode(header.src, &body).map_err(|e| e.to_string())?,
                ),
                _ => Delivery::Data(body),
            };
            let mut state = lock(&shared.state);
            if let Some(at) = state.demand[index]
                .iter()
                .position(|e| (e.1, e.2) == (header.src, header.tag))
            {
                state.demand[index].remove(at);
            }
            state.polled[index].retain(|e| (e.0, e.1) != (header.src, header.tag));
            drop(state);
            let _ = shared.inbox.deliver(header.src, tag, delivery);
            Ok(None)
        }
    }
}
