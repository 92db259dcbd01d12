//! The link service: the reader side that decodes frame headers on one link, lands payloads in
//! the caller's buffer, an owned buffer or nowhere (read from the socket, or from the sender's
//! memory for a single-copy frame), and accounts the bytes in the matching state.

use std::io;

use rlx_transport::{CollectiveError, FAILURE_WIRE_LEN, Failure};

use crate::error::{Lost, protocol_lost};
use crate::frame::{FrameHeader, FrameKind, HEADER_LEN, OFFER_LEN};
use crate::matching::{Landing, PostId};
use crate::sync::lock;

use super::Engine;
use super::link::{Land, Link, LinkRx, Payload, RawDest};
use super::same_host::{DESCRIPTOR_LEN, descriptor};

/// Payloads at least this long (with nothing staged) are read straight into their destination.
const DIRECT_READ_MIN: u64 = 16 * 1024;

/// The receiving thread's own posted receive, while it reads.
pub(super) struct Own<'a> {
    pub(super) id: PostId,
    pub(super) buf: Option<&'a mut [u8]>,
}

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
fn land_of(landing: Landing) -> Option<Land> {
    match landing {
        Landing::Park => None,
        Landing::Caller => Some(Land::Caller),
        Landing::Owned(ptr) => Some(Land::Owned(RawDest(ptr))),
        Landing::Discard => Some(Land::Discard),
    }
}

/// Frames of `what` travel on link 0 only, where they keep their place in the message order.
fn on_link_zero(from: u32, k: usize, what: &str) -> Result<(), Lost> {
    if k == 0 {
        return Ok(());
    }
    Err(protocol_lost(CollectiveError::protocol(
        Some(from),
        format!("{what} on link {k} (only link 0 carries them)"),
    )))
}

fn internal_lost(from: u32) -> Lost {
    Lost::Protocol(format!(
        "frame from rank {from} addressed a receive buffer that is not present"
    ))
}

impl Engine {
    /// Moves bytes on one link whose reader role this thread holds.
    pub(super) fn service(
        &self,
        from: u32,
        k: usize,
        link: &Link,
        rx: &mut LinkRx,
        mut own: Option<&mut Own<'_>>,
    ) -> Result<Service, Lost> {
        let own_id = own.as_ref().map(|o| o.id);
        loop {
            if let Some(payload) = rx.payload.as_mut() {
                let n = self.move_payload(
                    from,
                    link,
                    payload,
                    &mut rx.staging,
                    &mut rx.start,
                    rx.end,
                    own.as_deref_mut(),
                )?;
                match n {
                    PayloadStep::Moved(n) => {
                        let seq = payload.seq;
                        if payload.remaining == 0 {
                            rx.payload = None;
                        }
                        if self.account(from, seq, n as u64, own_id)? {
                            return Ok(Service::OwnDone);
                        }
                        return Ok(Service::Progress);
                    }
                    // Nothing is staged: one more byte makes progress.
                    PayloadStep::NeedFill => match self.stage(from, link, rx, rx.staged() + 1)? {
                        Staged::Ready | Staged::More => continue,
                        Staged::Idle => return Ok(Service::Idle),
                    },
                    PayloadStep::Idle => return Ok(Service::Idle),
                }
            }
            if rx.header.is_none() {
                match self.stage(from, link, rx, HEADER_LEN)? {
                    Staged::Ready => {}
                    Staged::More => continue,
                    Staged::Idle => return Ok(Service::Idle),
                }
                let mut bytes = [0u8; HEADER_LEN];
                bytes.copy_from_slice(&rx.staging[rx.start..rx.start + HEADER_LEN]);
                let header =
                    FrameHeader::decode(from, &bytes, self.cfg.max_frame).map_err(protocol_lost)?;
                rx.start += HEADER_LEN;
                rx.header = Some(header);
            }
            let Some(header) = rx.header else {
                continue;
            };
            match header.kind {
                // The bytes were noted as heard when they were read; nothing else to do.
                FrameKind::Beat => {
                    rx.header = None;
                    continue;
                }
                FrameKind::Close => {
                    let addr = self.peers.get(from as usize).and_then(|p| p.as_ref());
                    let addr = addr.map_or("an unknown address", |p| p.addr.as_str());
                    return Err(Lost::Gone(format!(
                        "it closed its transport (connection to {addr})"
                    )));
                }
                FrameKind::Failure => {
                    match self.stage(from, link, rx, FAILURE_WIRE_LEN)? {
                        Staged::Ready => {}
                        Staged::More => continue,
                        Staged::Idle => return Ok(Service::Idle),
                    }
                    on_link_zero(from, k, "failure notice")?;
                    let failure =
                        Failure::decode(from, &rx.staging[rx.start..rx.start + FAILURE_WIRE_LEN])
                            .map_err(protocol_lost)?;
                    let mut st = lock(&self.hub.state);
                    let taken = st
                        .on_failure(from, header.seq, header.tag, failure)
                        .map_err(protocol_lost)?;
                    if !taken {
                        st.peers[from as usize].links[k].parked = true;
                        return Ok(Service::Parked);
                    }
                    let done = own_id.is_some_and(|id| st.is_done(from, id));
                    drop(st);
                    rx.start += FAILURE_WIRE_LEN;
                    rx.header = None;
                    self.hub.wake();
                    if done {
                        return Ok(Service::OwnDone);
                    }
                    return Ok(Service::Progress);
                }
                FrameKind::Offer => {
                    match self.stage(from, link, rx, OFFER_LEN)? {
                        Staged::Ready => {}
                        Staged::More => continue,
                        Staged::Idle => return Ok(Service::Idle),
                    }
                    let offer = &rx.staging[rx.start..rx.start + OFFER_LEN];
                    if let Some(lane) = self.take_offer(from, offer) {
                        rx.lane_offered = Some(lane);
                    }
                    rx.start += OFFER_LEN;
                    rx.header = None;
                    continue;
                }
                FrameKind::Lane => {
                    on_link_zero(from, k, "lane switch")?;
                    let Some(lane) = rx.lane_offered.take() else {
                        return Err(protocol_lost(CollectiveError::protocol(
                            Some(from),
                            "switch to a shared-memory lane this rank did not map".to_owned(),
                        )));
                    };
                    // Past the switch the socket carries only wake-ups and heartbeats.
                    rx.start = rx.end;
                    rx.header = None;
                    link.switch_to_lane(lane);
                    tracing::debug!(peer = from, "link 0 reads the shared-memory lane");
                    continue;
                }
                FrameKind::Pull => {
                    match self.stage(from, link, rx, DESCRIPTOR_LEN)? {
                        Staged::Ready => {}
                        Staged::More => continue,
                        Staged::Idle => return Ok(Service::Idle),
                    }
                    on_link_zero(from, k, "single-copy frame")?;
                    let desc = descriptor(from, &rx.staging[rx.start..], header.total)?;
                    let pid = self.pull_source(from)?;
                    let mut st = lock(&self.hub.state);
                    let landing = st
                        .on_first_frame(from, &header, own_id)
                        .map_err(protocol_lost)?;
                    let Some(land) = land_of(landing) else {
                        st.peers[from as usize].links[k].parked = true;
                        return Ok(Service::Parked);
                    };
                    st.peers[from as usize].links[k].parked = false;
                    drop(st);
                    rx.start += DESCRIPTOR_LEN;
                    rx.header = None;
                    self.take_pulled(from, pid, &header, &desc, land, own.as_deref_mut())?;
                    if self.account(from, header.seq, header.total, own_id)? {
                        return Ok(Service::OwnDone);
                    }
                    return Ok(Service::Progress);
                }
                FrameKind::Data => {
                    let mut st = lock(&self.hub.state);
                    let landing = if header.offset == 0 {
                        on_link_zero(from, k, "message start")?;
                        st.on_first_frame(from, &header, own_id)
                    } else {
                        st.on_stripe(from, k, &header, own_id)
                    }
                    .map_err(protocol_lost)?;
                    let Some(land) = land_of(landing) else {
                        st.peers[from as usize].links[k].parked = true;
                        return Ok(Service::Parked);
                    };
                    st.peers[from as usize].links[k].parked = false;
                    rx.header = None;
                    if header.len == 0 {
                        let done = own_id.is_some_and(|id| st.is_done(from, id));
                        drop(st);
                        self.hub.wake();
                        if done {
                            return Ok(Service::OwnDone);
                        }
                        return Ok(Service::Progress);
                    }
                    drop(st);
                    rx.payload = Some(Payload {
                        seq: header.seq,
                        land,
                        at: header.offset,
                        remaining: header.len,
                    });
                }
            }
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
        own: Option<&mut Own<'_>>,
    ) -> Result<PayloadStep, Lost> {
        let staged = end - *start;
        let want = payload.remaining.min(usize::MAX as u64) as usize;
        let at = payload.at as usize;
        let n = if staged > 0 {
            let n = staged.min(want);
            let src = &staging[*start..*start + n];
            match payload.land {
                Land::Caller => match own.and_then(|o| o.buf.as_deref_mut()) {
                    Some(buf) => buf[at..at + n].copy_from_slice(src),
                    None => return Err(internal_lost(from)),
                },
                Land::Owned(dest) => {
                    // SAFETY: see `RawDest`: `at + n` lies inside the message (checked when
                    // the frame header was decoded and matched) and this link alone writes
                    // this stripe's range while the message is arriving.
                    unsafe {
                        std::ptr::copy_nonoverlapping(src.as_ptr(), dest.0.add(at), n);
                    }
                }
                Land::Discard => {}
            }
            *start += n;
            n
        } else if payload.remaining >= DIRECT_READ_MIN && !matches!(payload.land, Land::Discard) {
            let result = match payload.land {
                Land::Caller => match own.and_then(|o| o.buf.as_deref_mut()) {
                    Some(buf) => link.read(&mut buf[at..at + want]),
                    None => return Err(internal_lost(from)),
                },
                Land::Owned(dest) => {
                    // SAFETY: as above; the slice covers exactly the unwritten rest of this
                    // link's stripe, which nothing else reads or writes meanwhile.
                    let slice = unsafe { std::slice::from_raw_parts_mut(dest.0.add(at), want) };
                    link.read(slice)
                }
                Land::Discard => Ok(0),
            };
            match result {
                Ok(0) => return Err(self.lost_eof(from)),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(PayloadStep::Idle),
                Err(e) => return Err(self.lost_from_io(from, "reading", &e)),
            }
        } else {
            return Ok(PayloadStep::NeedFill);
        };
        payload.at += n as u64;
        payload.remaining -= n as u64;
        let owned = matches!(payload.land, Land::Owned(_));
        self.traffic.received(n as u64, owned);
        Ok(PayloadStep::Moved(n))
    }

    /// Reads more of `link` into the staging buffer unless `n` bytes are staged already.
    fn stage(&self, from: u32, link: &Link, rx: &mut LinkRx, n: usize) -> Result<Staged, Lost> {
        if rx.staged() >= n {
            return Ok(Staged::Ready);
        }
        match rx.fill(link) {
            Ok(0) => Err(self.lost_eof(from)),
            Ok(_) => Ok(Staged::More),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(Staged::Idle),
            Err(e) => Err(self.lost_from_io(from, "reading", &e)),
        }
    }

    /// Records `n` bytes of message `seq`; returns whether the caller's own receive is done.
    fn account(&self, from: u32, seq: u64, n: u64, own: Option<PostId>) -> Result<bool, Lost> {
        let mut st = lock(&self.hub.state);
        let completed = st.on_bytes(from, seq, n).map_err(protocol_lost)?;
        let done = own.is_some_and(|id| st.is_done(from, id));
        drop(st);
        if completed && !done {
            self.hub.wake();
        }
        Ok(done)
    }
}
