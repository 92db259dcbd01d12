//! The frames of one message ([`Frames`]): their headers, where each frame's bytes lie, and how
//! much of each the links took so far.

use std::io;

use rlx_transport::Tag;

use crate::frame::{FrameHeader, FrameKind, HEADER_LEN, Striping};
use crate::progress::link::{PeerIo, TxState};
use crate::progress::same_host::{Carriage, DESCRIPTOR_LEN};

/// Most frames one message is cut into: one bit each in a mask of pending frames.
const MAX_FRAMES: usize = 64;

/// One message being sent.
pub(super) struct Outgoing<'p, 'q> {
    pub(super) to: u32,
    pub(super) kind: FrameKind,
    pub(super) tag: Tag,
    pub(super) seq: u64,
    pub(super) parts: &'p [&'q [u8]],
    pub(super) total: u64,
}

/// The frames of one message and how much of each the links took.
pub(super) struct Frames<'p, 'q> {
    headers: [[u8; HEADER_LEN]; MAX_FRAMES],
    written: [u64; MAX_FRAMES],
    count: usize,
    /// Where each frame's bytes lie in the message's parts, or in the descriptor.
    stripes: Striping,
    parts: &'p [&'q [u8]],
    /// The bytes of the one frame of a message carried by single copy.
    descriptor: Option<[u8; DESCRIPTOR_LEN]>,
}

impl<'p, 'q> Frames<'p, 'q> {
    /// The frames of `msg` as it travels by `carriage` over the `links` links of its peer:
    /// a streamed data message one per stripe (from `min_striped` bytes), a notice or control
    /// frame whole on link 0, a message carried by single copy one frame whose header
    /// announces the whole message and whose bytes are the descriptor the peer reads it by.
    pub(super) fn new(
        msg: &Outgoing<'p, 'q>,
        carriage: &Carriage,
        links: usize,
        min_striped: u64,
    ) -> Self {
        let (kind, stripes, descriptor) = match carriage {
            Carriage::SingleCopy { descriptor, .. } => {
                let stripes = Striping::new(DESCRIPTOR_LEN as u64, 1, u64::MAX);
                (FrameKind::SingleCopy, stripes, Some(*descriptor))
            }
            Carriage::Stream if msg.kind == FrameKind::Data => {
                let stripes = Striping::new(msg.total, links, min_striped);
                (msg.kind, stripes, None)
            }
            Carriage::Stream => (msg.kind, Striping::new(msg.total, 1, u64::MAX), None),
        };
        let count = stripes.count().min(MAX_FRAMES);
        let mut headers = [[0u8; HEADER_LEN]; MAX_FRAMES];
        for (i, header) in headers.iter_mut().enumerate().take(count) {
            let (offset, len) = match descriptor {
                Some(_) => (0, msg.total),
                None => stripes.range(i),
            };
            *header = FrameHeader {
                kind,
                tag: msg.tag,
                seq: msg.seq,
                total: msg.total,
                offset,
                len,
            }
            .encode();
        }
        Self {
            headers,
            written: [0; MAX_FRAMES],
            count,
            stripes,
            parts: msg.parts,
            descriptor,
        }
    }

    fn frame_len(&self, i: usize) -> u64 {
        HEADER_LEN as u64 + self.stripes.range(i).1
    }

    pub(super) fn all_written(&self) -> bool {
        (0..self.count).all(|i| self.written[i] == self.frame_len(i))
    }

    /// The frames not fully written, one bit per frame (frame `i` goes on link `i`).
    pub(super) fn pending(&self) -> u64 {
        (0..self.count)
            .filter(|&i| self.written[i] < self.frame_len(i))
            .fold(0, |mask, i| mask | 1 << i)
    }

    /// Writes what each link takes now of its unfinished frame. Returns whether any byte moved
    /// and whether any link took a write at all (the message has started).
    pub(super) fn write_round(
        &mut self,
        io: &PeerIo,
        tx: &mut TxState,
    ) -> io::Result<(bool, bool)> {
        let descriptor: [&[u8]; 1] = [self.descriptor.as_ref().map_or(&[][..], |d| &d[..])];
        let wire = match self.descriptor {
            Some(_) => &descriptor[..],
            None => self.parts,
        };
        let (mut moved, mut started) = (false, false);
        for i in 0..self.count {
            if self.written[i] == self.frame_len(i) {
                continue;
            }
            let (offset, len) = self.stripes.range(i);
            let header = &self.headers[i];
            match io.write_frame(tx, i, header, wire, offset, len, self.written[i]) {
                Ok(n) => {
                    self.written[i] += n as u64;
                    moved |= n > 0;
                    started = true;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        Ok((moved, started))
    }
}
