//! The exchange path: a send and a receive issued together (a ring step, a pairwise swap, a
//! pipeline hand-off that also takes the previous stage's output), run by one thread that
//! writes the outgoing message and reads the incoming one into the caller's buffer in turn.
//!
//! Without it a collective step is a send followed by a receive: while the send's write
//! blocks, the frame coming the other way has no posted buffer and lands in an owned copy
//! within the unexpected budget, to be copied again when the receive is posted, and a message
//! longer than the socket buffers stops each direction while the other drains. Posting the
//! receive first and holding the reader role of its links for the whole send lets every
//! incoming byte go straight to its destination while the outgoing bytes stream.

use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use rlx_transport::{CollectiveError, Tag, blocked_send};

use crate::frame::FrameKind;
use crate::matching::{Begin, Outcome, Withdrawn};
use crate::sync::lock;

use super::core::Core;
use super::hook::ProgressHook;
use super::link::{Link, OwnReceive, PeerIo};
use super::reader::{Reader, Service};
use super::recv::Receiver;
use super::socket::{POLL_FDS, poll, pollfd};
use super::writer::{WhileSending, Writer};

/// How long a blocked exchange waits for its sockets before it also reads every other free
/// link, as a blocked plain send does.
const EXCHANGE_WAIT: Duration = Duration::from_millis(1);

/// The receive half of an exchange while its send is being written: the send's progress hook.
pub(super) struct ExchangeRecv<'a> {
    core: &'a Core,
    reader: Reader<'a>,
    from: u32,
    own: OwnReceive<'a>,
    /// This thread holds the reader role of every link to `from` for `own.id`.
    holds: bool,
    /// The receive finished (or its peer was lost) during the send.
    done: bool,
}

/// The exchange's view: the writer for its send, the receiver for its receive, and the reader
/// its receive reads through while the send is written.
#[derive(Clone, Copy)]
pub(super) struct Exchange<'a> {
    core: &'a Core,
    writer: Writer<'a>,
    receiver: Receiver<'a>,
    reader: Reader<'a>,
}

impl<'a> Exchange<'a> {
    pub(super) fn new(
        core: &'a Core,
        writer: Writer<'a>,
        receiver: Receiver<'a>,
        reader: Reader<'a>,
    ) -> Self {
        Self {
            core,
            writer,
            receiver,
            reader,
        }
    }

    /// Sends `parts` to `to` under `tag` and receives the next message from `from` under
    /// `tag` into `buf`, at once. The receive then waits up to `timeout` counted from the end
    /// of the send; `Ok(None)` when it passes.
    pub(crate) fn send_recv(
        &self,
        to: u32,
        from: u32,
        tag: Tag,
        parts: &[&[u8]],
        buf: &mut [u8],
        timeout: Duration,
    ) -> Result<Option<Outcome>, CollectiveError> {
        if to == self.core.rank || from == self.core.rank {
            self.writer.send(to, FrameKind::Data, tag, parts)?;
            return self.receiver.recv(from, tag, Some(buf), timeout);
        }
        self.core.check_rank(to)?;
        let io = self.core.peer_io(from)?;
        let st = lock(&self.core.hub.state);
        let (mut st, id) = match self.core.hub.post(st, from, tag, Some(buf.len()))? {
            (st, Begin::Posted(id)) => (st, id),
            (st, Begin::Ready(outcome)) => {
                drop(st);
                self.core.hub.wake();
                if let Err(error) = self.writer.send(to, FrameKind::Data, tag, parts) {
                    lock(&self.core.hub.state).put_back(from, tag, outcome, None);
                    return Err(error);
                }
                return Ok(Some(outcome));
            }
        };
        let holds = self.core.hub.try_acquire(self.core, &mut st, from, id);
        drop(st);
        let mut receive = ExchangeRecv {
            core: self.core,
            reader: self.reader,
            from,
            own: OwnReceive { id, buf: Some(buf) },
            holds,
            done: false,
        };
        let hook = WhileSending::Hook(&mut receive);
        let sent = self
            .writer
            .send_with(to, FrameKind::Data, tag, parts, hook, None);
        let holding = receive.reading();
        if let Err(error) = sent {
            self.undo_receive(io, tag, &mut receive, holding);
            return Err(error);
        }
        if receive.holds && !holding {
            self.core.hub.release_links(self.core, from);
        }
        let buf = receive.own.buf;
        // A receive that finished while the send was written returns without waiting: only
        // one still on its way reads the clock for its deadline.
        let deadline = if receive.done {
            None
        } else {
            Instant::now().checked_add(timeout)
        };
        let st = lock(&self.core.hub.state);
        self.core
            .hub
            .complete(&self.receiver, st, from, id, buf, deadline, holding)
    }

    /// The exchange's send failed: withdraws its receive (`holding`: this thread still reads
    /// the receive's links), gives the links back and puts back a message that finished
    /// meanwhile, so that a later receive takes it.
    fn undo_receive(&self, io: &PeerIo, tag: Tag, receive: &mut ExchangeRecv<'_>, holding: bool) {
        let (from, id) = (receive.from, receive.own.id);
        let finished = if holding {
            // Bytes of the receive may be landing in the caller's buffer: they move to a
            // copy of the transport's own, which a later receive takes.
            self.reader
                .withdraw_while_reading(from, io, &mut receive.own)
        } else {
            let own = receive.own.buf.as_deref();
            match lock(&self.core.hub.state).withdraw(from, id, own) {
                Withdrawn::Finished(outcome) => Some(outcome),
                Withdrawn::Gone | Withdrawn::Moved { .. } => None,
            }
        };
        if receive.holds {
            self.core.hub.release_links(self.core, from);
        }
        if let Some(outcome) = finished {
            let own = receive.own.buf.as_deref();
            lock(&self.core.hub.state).put_back(from, tag, outcome, own);
        }
    }
}

impl ExchangeRecv<'_> {
    /// Whether the receive reads its links now.
    fn reading(&self) -> bool {
        self.holds && !self.done
    }

    /// Whether the receive still needs the links it could not take when it was posted.
    fn wants_links(&self) -> bool {
        !self.holds && !self.done
    }

    /// Moves the exchange's receive on without blocking; returns whether any byte moved.
    fn serve_recv(&mut self) -> bool {
        if self.wants_links() {
            // Another thread (usually the background watcher, on links idle before the
            // exchange) held them: it gives them back once it sees they are wanted.
            let mut st = lock(&self.core.hub.state);
            if st.is_done(self.from, self.own.id) {
                self.done = true;
            } else {
                self.holds = self
                    .core
                    .hub
                    .try_acquire(self.core, &mut st, self.from, self.own.id);
            }
        }
        if !self.reading() {
            return false;
        }
        let Some(Some(io)) = self.core.peers.get(self.from as usize) else {
            self.done = true;
            return false;
        };
        let mut progress = false;
        for (k, link) in io.links.iter().enumerate() {
            let mut rx = link.rx();
            // A bounded number of rounds keeps the send moving too.
            for _ in 0..16 {
                match self
                    .reader
                    .service(self.from, k, link, &mut rx, Some(&mut self.own))
                {
                    Ok(Service::Progress) => progress = true,
                    Ok(Service::OwnDone) => {
                        // The links go back at once: the send may stay stuck behind its own
                        // peer for long, and meanwhile whoever reads free links (the watcher,
                        // a blocked send) must go on hearing this one, or its heartbeats go
                        // unread and a live rank is declared silent.
                        drop(rx);
                        self.done = true;
                        self.holds = false;
                        self.core.hub.release_links(self.core, self.from);
                        return true;
                    }
                    Ok(Service::Idle | Service::Parked) => break,
                    Err(lost) => {
                        // The receive will report the loss; the send finds out on its own.
                        drop(rx);
                        self.done = true;
                        self.core.hub.release_links(self.core, self.from);
                        self.holds = false;
                        self.core.lose(self.from, lost);
                        return true;
                    }
                }
            }
        }
        progress
    }

    /// Waits until one of the `pending` links of `io` is writable or a link of the exchange's
    /// receive is readable, then serves the receive; returns `false` when nothing happened
    /// within [`EXCHANGE_WAIT`], so that the send also reads the other free links.
    fn wait_for(&mut self, io: &PeerIo, pending: u64) -> bool {
        let Some(Some(rio)) = self.core.peers.get(self.from as usize) else {
            return false;
        };
        let woke = POLL_FDS.with(|fds| {
            let mut fds = fds.borrow_mut();
            fds.clear();
            io.push_writable(pending, &mut fds);
            let mut ready = false;
            {
                let st = lock(&self.core.hub.state);
                for (k, link) in rio.links.iter().enumerate() {
                    if !st.peers[self.from as usize].links[k].parked {
                        fds.push(pollfd(link.fd(), libc::POLLIN));
                        ready |= link.before_poll();
                    }
                }
            }
            fds.push(pollfd(self.core.abort_rx.as_raw_fd(), libc::POLLIN));
            if !ready {
                poll(&mut fds, EXCHANGE_WAIT);
            }
            rio.links.iter().for_each(Link::after_poll);
            ready || fds.iter().any(|fd| fd.revents != 0)
        });
        self.serve_recv();
        blocked_send::waiting();
        woke
    }
}

impl ProgressHook for ExchangeRecv<'_> {
    fn serve(&mut self) -> bool {
        self.serve_recv()
    }

    fn reading(&self) -> bool {
        ExchangeRecv::reading(self)
    }

    fn wait(&mut self, io: &PeerIo, pending: u64) -> bool {
        self.wait_for(io, pending)
    }
}
