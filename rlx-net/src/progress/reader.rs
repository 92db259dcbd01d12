//! The link service: the reader side that decodes frame headers on one link, lands payloads in
//! the caller's buffer, an owned buffer or nowhere (read from the socket, or from the sender's
//! memory for a single-copy frame), and accounts the bytes in the matching state. The
//! [`Reader`] also drains links a thread holds for nobody's receive in particular (a blocked
//! sender, the watcher, a catch-up), and withdraws a receive whose deadline passed while it
//! read.

use std::io;
use std::time::Instant;

use rlx_transport::{FAILURE_WIRE_LEN, Failure};

use crate::error::{Lost, protocol_lost};
use crate::frame::{FrameHeader, FrameKind, HEADER_LEN, OFFER_LEN};
use crate::matching::{Holder, Landing, Outcome, PostId, Withdrawn};

use crate::sync::lock;

use super::core::Core;
use super::link::{Destination, Link, LinkRx, OwnReceive, Payload, PeerIo, RawDest, on_link_zero};
use super::same_host::{DESCRIPTOR_LEN, SameHost, descriptor};

/// Payloads at least this long (with nothing staged) are read straight into their destination.
const DIRECT_READ_MIN: u64 = 16 * 1024;

/// What one round of servicing a link achieved.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Service {
    /// Bytes moved; call again.
    Progress,
    /// The socket has nothing more now.
    Idle,
    /// The next frame cannot be taken now (budget, or waiting for link 0).
    Parked,
    /// The caller's own receive finished.
    OwnDone,
}

/// Whether the bytes a step needs are in the staging buffer.
enum Staged {
    /// They are.
    Ready,
    /// More bytes were read; look again.
    More,
    /// The socket has nothing now.
    Idle,
}

enum PayloadStep {
    Moved(usize),
    NeedFill,
    Idle,
}

/// Where the matching state says a frame's bytes go; `None` when the frame must wait (park).
fn destination_of(landing: Landing) -> Option<Destination> {
    match landing {
        Landing::Park => None,
        Landing::Caller => Some(Destination::Caller),
        Landing::Owned(ptr) => Some(Destination::Owned(RawDest(ptr))),
        Landing::Discard => Some(Destination::Discard),
    }
}

/// The fixed-length body a frame of `kind` carries after its header, read whole before the
/// frame is handled (a data frame's payload is streamed instead).
fn body_len(kind: FrameKind) -> usize {
    match kind {
        FrameKind::Failure => FAILURE_WIRE_LEN,
        FrameKind::Offer => OFFER_LEN,
        FrameKind::SingleCopy => DESCRIPTOR_LEN,
        FrameKind::Data | FrameKind::Beat | FrameKind::Close | FrameKind::Lane => 0,
    }
}

fn internal_lost(from: u32) -> Lost {
    Lost::Protocol(format!(
        "frame from rank {from} addressed a receive buffer that is not present"
    ))
}

/// What one step of the reader asks of its loop.
enum Next {
    /// Look at the link again.
    Again,
    /// The round is over with this outcome.
    Done(Service),
}

/// The reader's view: the engine's core, and the same-host room it hands same-host frames to.
#[derive(Clone, Copy)]
pub(super) struct Reader<'a> {
    core: &'a Core,
    same_host: SameHost<'a>,
}

impl<'a> Reader<'a> {
    pub(super) fn new(core: &'a Core, same_host: SameHost<'a>) -> Self {
        Self { core, same_host }
    }
}

impl Reader<'_> {
    /// Moves bytes on one link whose reader role this thread holds.
    pub(super) fn service(
        &self,
        from: u32,
        k: usize,
        link: &Link,
        rx: &mut LinkRx,
        mut own: Option<&mut OwnReceive<'_>>,
    ) -> Result<Service, Lost> {
        loop {
            let next = match rx.header {
                _ if rx.payload.is_some() => {
                    self.continue_payload(from, link, rx, own.as_deref_mut())?
                }
                None => self.read_header(from, link, rx)?,
                Some(header) => self.on_frame(from, k, link, rx, header, own.as_deref_mut())?,
            };
            if let Next::Done(service) = next {
                return Ok(service);
            }
        }
    }

    /// Decodes the next frame header once it is staged.
    fn read_header(&self, from: u32, link: &Link, rx: &mut LinkRx) -> Result<Next, Lost> {
        match self.stage(from, link, rx, HEADER_LEN)? {
            Staged::Ready => {}
            Staged::More => return Ok(Next::Again),
            Staged::Idle => return Ok(Next::Done(Service::Idle)),
        }
        let mut bytes = [0u8; HEADER_LEN];
        bytes.copy_from_slice(&rx.staging[rx.start..rx.start + HEADER_LEN]);
        let header =
            FrameHeader::decode(from, &bytes, self.core.cfg.max_frame).map_err(protocol_lost)?;
        rx.start += HEADER_LEN;
        rx.header = Some(header);
        Ok(Next::Again)
    }

    /// Handles the frame whose header was read, once the fixed-length body of its kind is
    /// staged: the reader's own kinds here, the same-host room's control frames there.
    fn on_frame(
        &self,
        from: u32,
        k: usize,
        link: &Link,
        rx: &mut LinkRx,
        header: FrameHeader,
        own: Option<&mut OwnReceive<'_>>,
    ) -> Result<Next, Lost> {
        match self.stage(from, link, rx, body_len(header.kind))? {
            Staged::Ready => {}
            Staged::More => return Ok(Next::Again),
            Staged::Idle => return Ok(Next::Done(Service::Idle)),
        }
        let own_id = own.as_ref().map(|o| o.id);
        match header.kind {
            // The bytes were noted as heard when they were read; nothing else to do.
            FrameKind::Beat => {
                rx.header = None;
                Ok(Next::Again)
            }
            FrameKind::Close => {
                let addr = self.core.peers.get(from as usize).and_then(|p| p.as_ref());
                let addr = addr.map_or("an unknown address", |p| p.addr.as_str());
                Err(Lost::Departed(format!(
                    "it closed its transport (connection to {addr})"
                )))
            }
            FrameKind::Failure => self.on_failure_frame(from, k, rx, &header, own_id),
            FrameKind::Data => self.on_data_frame(from, k, rx, &header, own_id),
            FrameKind::SingleCopy => self.on_single_copy_frame(from, k, rx, &header, own),
            FrameKind::Offer | FrameKind::Lane => {
                self.same_host
                    .on_same_host_control(from, k, link, rx, &header)?;
                Ok(Next::Again)
            }
        }
    }

    /// A failure notice: matched like a message, or parked when its receiver's queue is full.
    fn on_failure_frame(
        &self,
        from: u32,
        k: usize,
        rx: &mut LinkRx,
        header: &FrameHeader,
        own_id: Option<PostId>,
    ) -> Result<Next, Lost> {
        on_link_zero(from, k, "failure notice")?;
        let failure = Failure::decode(from, &rx.staging[rx.start..rx.start + FAILURE_WIRE_LEN])
            .map_err(protocol_lost)?;
        let mut st = lock(&self.core.hub.state);
        let taken = st
            .on_failure(from, header.seq, header.tag, failure)
            .map_err(protocol_lost)?;
        if !taken {
            st.peers[from as usize].links[k].parked = true;
            return Ok(Next::Done(Service::Parked));
        }
        let done = own_id.is_some_and(|id| st.is_done(from, id));
        drop(st);
        rx.start += FAILURE_WIRE_LEN;
        rx.header = None;
        self.core.hub.wake();
        Ok(Next::Done(if done {
            Service::OwnDone
        } else {
            Service::Progress
        }))
    }

    /// A frame of a streamed message: matching says where its payload lands, or parks it.
    fn on_data_frame(
        &self,
        from: u32,
        k: usize,
        rx: &mut LinkRx,
        header: &FrameHeader,
        own_id: Option<PostId>,
    ) -> Result<Next, Lost> {
        let mut st = lock(&self.core.hub.state);
        let landing = if header.offset == 0 {
            on_link_zero(from, k, "message start")?;
            st.on_first_frame(from, header, own_id)
        } else {
            st.on_stripe(from, k, header, own_id)
        }
        .map_err(protocol_lost)?;
        let Some(land) = destination_of(landing) else {
            st.peers[from as usize].links[k].parked = true;
            return Ok(Next::Done(Service::Parked));
        };
        st.peers[from as usize].links[k].parked = false;
        rx.header = None;
        if header.len == 0 {
            let done = own_id.is_some_and(|id| st.is_done(from, id));
            drop(st);
            self.core.hub.wake();
            return Ok(Next::Done(if done {
                Service::OwnDone
            } else {
                Service::Progress
            }));
        }
        drop(st);
        rx.payload = Some(Payload {
            seq: header.seq,
            land,
            at: header.offset,
            remaining: header.len,
        });
        Ok(Next::Again)
    }

    /// The one frame of a message carried by single copy: matched like the first frame of any
    /// message, then read from the sender's memory by the same-host room.
    fn on_single_copy_frame(
        &self,
        from: u32,
        k: usize,
        rx: &mut LinkRx,
        header: &FrameHeader,
        own: Option<&mut OwnReceive<'_>>,
    ) -> Result<Next, Lost> {
        on_link_zero(from, k, "single-copy frame")?;
        let own_id = own.as_ref().map(|o| o.id);
        let desc = descriptor(from, &rx.staging[rx.start..], header.total)?;
        let pid = self.same_host.single_copy_source(from)?;
        let mut st = lock(&self.core.hub.state);
        let landing = st
            .on_first_frame(from, header, own_id)
            .map_err(protocol_lost)?;
        let Some(land) = destination_of(landing) else {
            st.peers[from as usize].links[k].parked = true;
            return Ok(Next::Done(Service::Parked));
        };
        st.peers[from as usize].links[k].parked = false;
        drop(st);
        rx.start += DESCRIPTOR_LEN;
        rx.header = None;
        self.same_host
            .take_single_copy(from, pid, header, &desc, land, own)?;
        Ok(Next::Done(
            if self.account(from, header.seq, header.total, own_id)? {
                Service::OwnDone
            } else {
                Service::Progress
            },
        ))
    }

    /// Moves the next piece of the payload being read, and accounts it in the matching state.
    fn continue_payload(
        &self,
        from: u32,
        link: &Link,
        rx: &mut LinkRx,
        own: Option<&mut OwnReceive<'_>>,
    ) -> Result<Next, Lost> {
        let own_id = own.as_ref().map(|o| o.id);
        let Some(payload) = rx.payload.as_mut() else {
            return Ok(Next::Again);
        };
        let step = self.move_payload(
            from,
            link,
            payload,
            &mut rx.staging,
            &mut rx.start,
            rx.end,
            own,
        )?;
        match step {
            PayloadStep::Moved(n) => {
                let seq = payload.seq;
                if payload.remaining == 0 {
                    rx.payload = None;
                }
                Ok(Next::Done(if self.account(from, seq, n as u64, own_id)? {
                    Service::OwnDone
                } else {
                    Service::Progress
                }))
            }
            // Nothing is staged: one more byte makes progress.
            PayloadStep::NeedFill => match self.stage(from, link, rx, rx.staged() + 1)? {
                Staged::Ready | Staged::More => Ok(Next::Again),
                Staged::Idle => Ok(Next::Done(Service::Idle)),
            },
            PayloadStep::Idle => Ok(Next::Done(Service::Idle)),
        }
    }

    /// Moves the next piece of a payload: from the staging buffer, or straight from the socket
    /// when the piece is large and nothing is staged.
    #[allow(clippy::too_many_arguments, reason = "the split borrows of one LinkRx")]
    fn move_payload(
        &self,
        from: u32,
        link: &Link,
        payload: &mut Payload,
        staging: &mut [u8],
        start: &mut usize,
        end: usize,
        own: Option<&mut OwnReceive<'_>>,
    ) -> Result<PayloadStep, Lost> {
        let staged = end - *start;
        let want = payload.remaining.min(usize::MAX as u64) as usize;
        let at = payload.at as usize;
        let n = if staged > 0 {
            let n = staged.min(want);
            let src = &staging[*start..*start + n];
            match payload.land {
                Destination::Caller => match own.and_then(|o| o.buf.as_deref_mut()) {
                    Some(buf) => buf[at..at + n].copy_from_slice(src),
                    None => return Err(internal_lost(from)),
                },
                Destination::Owned(dest) => {
                    // SAFETY: see `RawDest`: `at + n` lies inside the message (checked when
                    // the frame header was decoded and matched) and this link alone writes
                    // this stripe's range while the message is arriving.
                    unsafe {
                        std::ptr::copy_nonoverlapping(src.as_ptr(), dest.0.add(at), n);
                    }
                }
                Destination::Discard => {}
            }
            *start += n;
            n
        } else if payload.remaining >= DIRECT_READ_MIN
            && !matches!(payload.land, Destination::Discard)
        {
            let result = match payload.land {
                Destination::Caller => match own.and_then(|o| o.buf.as_deref_mut()) {
                    Some(buf) => link.read(&mut buf[at..at + want]),
                    None => return Err(internal_lost(from)),
                },
                Destination::Owned(dest) => {
                    // SAFETY: as above; the slice covers exactly the unwritten rest of this
                    // link's stripe, which nothing else reads or writes meanwhile.
                    let slice = unsafe { std::slice::from_raw_parts_mut(dest.0.add(at), want) };
                    link.read(slice)
                }
                Destination::Discard => Ok(0),
            };
            match result {
                Ok(0) => return Err(self.core.lost_eof(from)),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(PayloadStep::Idle),
                Err(e) => return Err(self.core.lost_from_io(from, "reading", &e)),
            }
        } else {
            return Ok(PayloadStep::NeedFill);
        };
        payload.at += n as u64;
        payload.remaining -= n as u64;
        let owned = matches!(payload.land, Destination::Owned(_));
        self.core.traffic.received(n as u64, owned);
        Ok(PayloadStep::Moved(n))
    }

    /// Reads more of `link` into the staging buffer unless `n` bytes are staged already.
    fn stage(&self, from: u32, link: &Link, rx: &mut LinkRx, n: usize) -> Result<Staged, Lost> {
        if rx.staged() >= n {
            return Ok(Staged::Ready);
        }
        match rx.fill(link) {
            Ok(0) => Err(self.core.lost_eof(from)),
            Ok(_) => Ok(Staged::More),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(Staged::Idle),
            Err(e) => Err(self.core.lost_from_io(from, "reading", &e)),
        }
    }

    /// Records `n` bytes of message `seq`; returns whether the caller's own receive is done.
    fn account(&self, from: u32, seq: u64, n: u64, own: Option<PostId>) -> Result<bool, Lost> {
        let mut st = lock(&self.core.hub.state);
        let completed = st.on_bytes(from, seq, n).map_err(protocol_lost)?;
        let done = own.is_some_and(|id| st.is_done(from, id));
        drop(st);
        if completed && !done {
            self.core.hub.wake();
        }
        Ok(done)
    }

    /// Services every held link until it is idle or parked, then releases them all.
    pub(super) fn drain_held(&self, held: &[(u32, usize)]) {
        let mut lost_peers: Vec<(u32, Lost)> = Vec::new();
        for &(rank, k) in held {
            if lost_peers.iter().any(|(r, _)| *r == rank) {
                continue;
            }
            let Some(Some(peer)) = self.core.peers.get(rank as usize) else {
                continue;
            };
            // A caller asked for this link meanwhile: it reads it into its own buffer, which
            // is better than landing its message here and copying it again.
            if lock(&self.core.hub.state).peers[rank as usize].links[k].wanted {
                continue;
            }
            let link = &peer.links[k];
            let mut rx = link.rx();
            // A bounded number of rounds keeps a busy link from starving the others.
            for _ in 0..64 {
                match self.service(rank, k, link, &mut rx, None) {
                    Ok(Service::Progress) => continue,
                    Ok(_) => break,
                    Err(lost) => {
                        lost_peers.push((rank, lost));
                        break;
                    }
                }
            }
        }
        {
            let mut st = lock(&self.core.hub.state);
            let now = Instant::now();
            for &(rank, k) in held {
                let slot = &mut st.peers[rank as usize].links[k];
                slot.holder = Holder::Free;
                // A caller waited for this link: the watcher leaves it to the callers for a
                // while. Otherwise a caller whose messages the watcher delivered (and so never
                // held the link, never refreshing this) would find the watcher back on the
                // link at once, and every later message would take the watcher's hand-off.
                // Links nobody asked for stay the watcher's, so it keeps draining them.
                if slot.wanted {
                    slot.released_at = now;
                }
                slot.wanted = false;
            }
            for peer in st.peers.iter_mut() {
                peer.drop_arriving_if_lost();
            }
        }
        for (rank, lost) in lost_peers {
            self.core.lose(rank, lost);
        }
        if !held.is_empty() {
            self.core.hub.wake();
        }
    }

    /// The deadline passed while this thread reads for its own receive: withdraw it, and if
    /// its message was landing in the caller's buffer, point the links mid-stripe at the owned
    /// copy the matching state made.
    pub(super) fn withdraw_while_reading(
        &self,
        from: u32,
        io: &PeerIo,
        own: &mut OwnReceive<'_>,
    ) -> Option<Outcome> {
        let withdrawn = lock(&self.core.hub.state).withdraw(from, own.id, own.buf.as_deref());
        match withdrawn {
            Withdrawn::Finished(outcome) => Some(outcome),
            Withdrawn::Gone => None,
            Withdrawn::Moved { seq, base } => {
                for link in &io.links {
                    let mut rx = link.rx();
                    if let Some(p) = rx.payload.as_mut() {
                        if p.seq == seq && matches!(p.land, Destination::Caller) {
                            p.land = Destination::Owned(RawDest(base));
                        }
                    }
                }
                None
            }
        }
    }
}
