//! Compressed all-reduce of f32 values: a segmented ring whose reduce-scatter hops carry
//! compressed partial sums and whose all-gather forwards the owners' compressed final blocks
//! unchanged, with error feedback through the caller's [`Compressor`].
//!
//! Schedule, per pipeline segment (the block arithmetic of `reduce_scatter::ring` and
//! `all_gather::ring`, from [`layout`]):
//! - Reduce-scatter: at step 0 rank `r` compresses its contribution (its elements plus its
//!   residual) of block `r-1` and sends it to `r+1`; at every step it decompresses the partial
//!   that arrives from `r-1`, adds its own contribution in f32 and compresses the sum again for
//!   the next hop. At the last step the sum is block `r`'s final value, which `r` compresses
//!   once more.
//! - All-gather: that final frame goes around the ring as it is; every rank, `r` included,
//!   decompresses the same bytes, so every rank ends with bit-identical results (`Mean` then
//!   divides each decompressed value by n, also on every rank alike).
//!
//! So every rank sends 2(n-1)/n of the compressed buffer, the bandwidth optimum of the format.
//!
//! Error feedback: each rank compresses each element once per call (its first hop, a forwarded
//! partial, or its own final block) and keeps `value - decompressed` in the [`Compressor`]'s
//! residual; the next call adds the residual to the rank's contribution. The errors of every
//! compression thus re-enter the sum one call later, and the outputs of K calls on fixed inputs
//! average to the exact sum up to the last residual over K.
//!
//! Agreement: before any frame, a header (format, reduction, element count, int8 block size)
//! goes around the ring in n-1 steps, so every rank sees every other rank's header and a rank
//! that passed another format, reduction or length fails the call with
//! [`CollectiveError::InvalidArgument`] or [`CollectiveError::LengthMismatch`] on every rank
//! (each finds it itself) rather than decoding frames as garbage. It costs n-1 hops of
//! 20-byte messages, which is small next to the buffers compression pays off for. The header
//! uses only ring neighbours, like the data, so it runs on every transport.
//!
//! Frames are then fixed by the agreed header: a frame of another length, or an int8 frame
//! with a NaN, infinite or negative scale, is [`CollectiveError::Protocol`] naming the sender.

use crate::compression::{Compression, Compressor, FRAME_CHUNK, INT8_BLOCK};
use crate::layout::{self, Blocks};
use crate::op::OpCtx;
use crate::{CollectiveError, DType, ReduceKind, Result};

/// Bytes of the agreement header.
const HEADER_BYTES: usize = 20;

/// Version of the header and frame layout.
const VERSION: u8 = 1;

/// What every rank must agree on, as the header carries it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    /// The group rank whose call this header describes.
    pub(crate) origin: u32,
    pub(crate) compression: Compression,
    pub(crate) reduce: ReduceKind,
    pub(crate) count: u64,
}

impl Header {
    pub(crate) fn encode(self) -> [u8; HEADER_BYTES] {
        let mut out = [0u8; HEADER_BYTES];
        out[0] = VERSION;
        out[1] = self.compression.code();
        out[2] = self.reduce.code();
        out[4..8].copy_from_slice(&(INT8_BLOCK as u32).to_le_bytes());
        out[8..12].copy_from_slice(&self.origin.to_le_bytes());
        out[12..20].copy_from_slice(&self.count.to_le_bytes());
        out
    }

    /// Decodes a header that world rank `peer` sent; a malformed one is a protocol error.
    pub(crate) fn decode(bytes: &[u8], peer: u32, group_size: u32) -> Result<Header> {
        let bad = |what: String| CollectiveError::protocol(Some(peer), what);
        let bytes: &[u8; HEADER_BYTES] = bytes.try_into().map_err(|_| {
            bad(format!(
                "compressed all-reduce header of {} bytes, expected {HEADER_BYTES}",
                bytes.len()
            ))
        })?;
        let word = |at: usize| {
            u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
        };
        if bytes[0] != VERSION {
            return Err(bad(format!(
                "compressed all-reduce header version {}, expected {VERSION}",
                bytes[0]
            )));
        }
        // The encoder writes zero; anything else is not one of our headers.
        if bytes[3] != 0 {
            return Err(bad(format!(
                "compressed all-reduce header with reserved byte {}",
                bytes[3]
            )));
        }
        let compression = Compression::from_code(bytes[1])
            .ok_or_else(|| bad(format!("unknown compression code {}", bytes[1])))?;
        let reduce = ReduceKind::ALL
            .into_iter()
            .find(|kind| kind.code() == bytes[2])
            .ok_or_else(|| bad(format!("unknown reduction code {}", bytes[2])))?;
        if word(4) as usize != INT8_BLOCK {
            return Err(bad(format!(
                "int8 blocks of {} elements, expected {INT8_BLOCK}",
                word(4)
            )));
        }
        let origin = word(8);
        if origin >= group_size {
            return Err(bad(format!(
                "header of rank {origin} in a group of {group_size}"
            )));
        }
        let mut count = [0u8; 8];
        count.copy_from_slice(&bytes[12..20]);
        Ok(Header {
            origin,
            compression,
            reduce,
            count: u64::from_le_bytes(count),
        })
    }

    /// Why `theirs` cannot be reduced with this rank's call, if it cannot.
    fn disagreement(&self, theirs: &Header, name: impl Fn(u32) -> u32) -> Option<CollectiveError> {
        let who = name(theirs.origin);
        if theirs.compression != self.compression {
            Some(CollectiveError::invalid(format!(
                "peer rank {who} compresses with {}, this rank with {}",
                theirs.compression, self.compression
            )))
        } else if theirs.reduce != self.reduce {
            Some(CollectiveError::invalid(format!(
                "peer rank {who} reduces with {}, this rank with {}",
                theirs.reduce, self.reduce
            )))
        } else if theirs.count != self.count {
            Some(CollectiveError::LengthMismatch {
                op: "all_reduce_compressed",
                peer: Some(who),
                expected: self.count.saturating_mul(4),
                got: theirs.count.saturating_mul(4),
                dtype: Some(crate::DType::F32),
                lengths: Vec::new(),
            })
        } else {
            None
        }
    }
}

/// All-reduces `data` in place with the compression and residual of `compressor`.
pub(crate) fn run(
    ctx: &OpCtx<'_>,
    data: &mut [f32],
    reduce: ReduceKind,
    compressor: &mut Compressor,
) -> Result<()> {
    ctx.start(DType::F32, std::mem::size_of_val(data))?;
    compressor.set_wire_bytes(0);
    if !matches!(reduce, ReduceKind::Sum | ReduceKind::Mean) {
        return Err(CollectiveError::invalid(format!(
            "all_reduce_compressed reduces with sum or mean, not {reduce}"
        )));
    }
    let compression = compressor.compression();
    let n = ctx.size() as usize;
    if n == 1 {
        return Ok(());
    }
    ctx.record_algorithm(ring_name(compression));
    let residual = compressor.residual_for(data.len())?;
    let blocks = Blocks::Balanced {
        count: data.len(),
        parts: n,
    };
    // Frames of at most half a segment (see `Ring::reduce`).
    let segment_bytes = ctx.segment_bytes(std::mem::size_of_val(data), 4);
    let mut segment_elems = (segment_bytes / 4).max(1);
    while segment_elems > 1 && 2 * compression.frame_bytes(segment_elems) > segment_bytes {
        segment_elems /= 2;
    }
    let segments = layout::segment_count(blocks.max_len(), segment_elems);
    let ring = Ring {
        ctx,
        compression,
        reduce,
        n,
        r: ctx.rank as usize,
        blocks,
        segments,
        sent: std::cell::Cell::new(0),
    };
    let header = Header {
        origin: ctx.rank,
        compression,
        reduce,
        count: data.len() as u64,
    };
    let result = ring
        .agree(header)
        .and_then(|()| ring.reduce(data, residual));
    let sent = ring.sent.get();
    compressor.set_wire_bytes(sent);
    if result.is_err() {
        // The residual may hold this call's errors for some elements and the last call's for
        // others; starting afresh is the only state that means something.
        compressor.reset();
    }
    result
}

/// The algorithm name in the flight recorder and traces.
fn ring_name(compression: Compression) -> &'static str {
    match compression {
        Compression::Bf16 => "compressed_ring_bf16",
        Compression::Fp16 => "compressed_ring_fp16",
        Compression::Int8 => "compressed_ring_int8",
        Compression::None => "compressed_ring_none",
    }
}

/// The fixed parameters of one compressed all-reduce.
struct Ring<'c, 'a> {
    ctx: &'c OpCtx<'a>,
    compression: Compression,
    reduce: ReduceKind,
    /// Group size and this rank.
    n: usize,
    r: usize,
    blocks: Blocks,
    segments: usize,
    /// Bytes this rank sent so far.
    sent: std::cell::Cell<u64>,
}

/// The f32 buffers of one frame chunk: the sum being formed and the image of its compressed
/// frame.
struct Sums {
    sum: Vec<f32>,
    image: Vec<f32>,
}

impl Ring<'_, '_> {
    fn next(&self) -> u32 {
        ((self.r + 1) % self.n) as u32
    }

    fn prev(&self) -> u32 {
        ((self.r + self.n - 1) % self.n) as u32
    }

    /// The bytes on the wire of `frame`, which holds `elements` values.
    fn wire<'f>(&self, frame: &'f [u32], elements: usize) -> &'f [u8] {
        &bytemuck::cast_slice::<u32, u8>(frame)[..self.compression.frame_bytes(elements)]
    }

    fn send(&self, bytes: &[u8]) -> Result<()> {
        self.ctx.send(self.next(), bytes)?;
        self.sent.set(self.sent.get() + bytes.len() as u64);
        Ok(())
    }

    /// Passes the headers around the ring: at step `s` this rank forwards the header of rank
    /// `r-s` and receives that of `r-s-1`, so after n-1 steps it has checked every other
    /// rank's. A disagreement is reported after the last step, so that every rank gets to see
    /// every header and finds the disagreement itself.
    fn agree(&self, mine: Header) -> Result<()> {
        let prev_world = self.ctx.world_rank(self.prev())?;
        let name = |rank: u32| self.ctx.world_rank(rank).unwrap_or(rank);
        let mut forward = mine;
        let mut disagreement = None;
        for step in 0..self.n - 1 {
            self.send(&forward.encode())?;
            let bytes = self
                .ctx
                .recv_within(self.prev(), self.ctx.timeout())?
                .ok_or_else(|| self.ctx.timed_out(prev_world, self.ctx.timeout()))?;
            let theirs = Header::decode(&bytes, prev_world, self.n as u32)?;
            let expected_origin = ((self.r + 2 * self.n - step - 1) % self.n) as u32;
            if theirs.origin != expected_origin {
                return Err(CollectiveError::protocol(
                    Some(prev_world),
                    format!(
                        "header of rank {} where rank {expected_origin}'s was due",
                        theirs.origin
                    ),
                ));
            }
            if disagreement.is_none() {
                disagreement = mine.disagreement(&theirs, name);
            }
            forward = theirs;
        }
        match disagreement {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }

    /// Receives the frame of `elements` values from the previous rank into `frame`.
    fn recv_frame(&self, frame: &mut [u32], elements: usize) -> Result<()> {
        let bytes = self.compression.frame_bytes(elements);
        let view = &mut bytemuck::cast_slice_mut::<u32, u8>(frame)[..bytes];
        match self.ctx.recv_into(self.prev(), view) {
            // The header fixed every frame's length, so another length is malformed.
            Err(CollectiveError::LengthMismatch { expected, got, .. }) => {
                let peer = self.ctx.world_rank(self.prev())?;
                Err(CollectiveError::protocol(
                    Some(peer),
                    format!(
                        "{} frame of {got} bytes where {expected} were due",
                        self.compression
                    ),
                ))
            }
            other => other,
        }
    }

    /// Compresses `sum` into `frame`, leaves its decompressed image in `image` and the
    /// compression error in `residual`.
    fn compress(
        &self,
        sum: &[f32],
        frame: &mut [u32],
        image: &mut [f32],
        residual: &mut [f32],
    ) -> Result<()> {
        self.compression.encode(sum, frame)?;
        let me = self.ctx.world_rank(self.ctx.rank)?;
        self.compression.decode(frame, image, Some(me))?;
        for ((error, &exact), &sent) in residual.iter_mut().zip(sum).zip(image.iter()) {
            let e = exact - sent;
            // An infinite or NaN input has no finite error to carry into the next call.
            *error = if e.is_finite() { e } else { 0.0 };
        }
        Ok(())
    }

    /// Decompresses the final `frame` of a block into `out`, the result of this call.
    fn finish(&self, frame: &[u32], out: &mut [f32]) -> Result<()> {
        let peer = self.ctx.world_rank(self.prev())?;
        self.compression.decode(frame, out, Some(peer))?;
        self.scale(out);
        Ok(())
    }

    /// Turns decompressed sums into the result of the reduction (divides by n for `Mean`).
    fn scale(&self, out: &mut [f32]) {
        if self.reduce == ReduceKind::Mean {
            let n = self.n as f32;
            for x in out {
                *x /= n;
            }
        }
    }

    /// Compresses this rank's contribution to `segment` of the block it sends at the first
    /// reduce-scatter step into `frame` (whose wire length it returns), keeping the error.
    fn first_hop(
        &self,
        segment: usize,
        data: &[f32],
        residual: &mut [f32],
        frame: &mut [u32],
        s: &mut Sums,
    ) -> Result<usize> {
        let (send_block, _) = layout::reduce_scatter_step(self.r, self.n, 0);
        let range = self.blocks.segment(send_block, self.segments, segment);
        let chunk_words = self.compression.frame_words(FRAME_CHUNK);
        let own = data[range.clone()].chunks(FRAME_CHUNK);
        let errors = residual[range.clone()].chunks_mut(FRAME_CHUNK);
        for (index, (own, error)) in own.zip(errors).enumerate() {
            let len = own.len();
            let sum = &mut s.sum[..len];
            add_contribution(sum, own, error, false);
            let frame = &mut frame[index * chunk_words..];
            self.compress(sum, frame, &mut s.image[..len], error)?;
        }
        Ok(range.len())
    }

    /// Folds the partial `frame` of `segment` that arrived at reduce-scatter step `step` into
    /// this rank's contribution and compresses the sum into `frame` again, for the next hop
    /// or, at the last step, as this rank's final block (whose image is its result). Works a
    /// [`FRAME_CHUNK`] at a time, so that the sums stay in the L1 cache.
    fn fold(
        &self,
        segment: usize,
        step: usize,
        data: &mut [f32],
        residual: &mut [f32],
        frame: &mut [u32],
        s: &mut Sums,
    ) -> Result<()> {
        let (_, recv_block) = layout::reduce_scatter_step(self.r, self.n, step);
        let range = self.blocks.segment(recv_block, self.segments, segment);
        let prev = self.ctx.world_rank(self.prev())?;
        let last = step == self.n - 2;
        let chunk_words = self.compression.frame_words(FRAME_CHUNK);
        let own = data[range.clone()].chunks_mut(FRAME_CHUNK);
        let errors = residual[range].chunks_mut(FRAME_CHUNK);
        for (index, (own, error)) in own.zip(errors).enumerate() {
            let len = own.len();
            let frame = &mut frame[index * chunk_words..];
            let sum = &mut s.sum[..len];
            self.compression.decode(frame, sum, Some(prev))?;
            add_contribution(sum, own, error, true);
            let image = &mut s.image[..len];
            self.compress(sum, frame, image, error)?;
            if last {
                // This rank's own block: its result is the image of the frame every other
                // rank will decompress.
                own.copy_from_slice(image);
                self.scale(own);
            }
        }
        Ok(())
    }

    /// The whole schedule of the module docs, one segment at a time, reordered so that the
    /// link carries bytes while this rank computes. The order of the messages on each link
    /// stays the same on both of its ends, so they still match; only the computing moves:
    /// - the first-hop frame of segment j+1 is compressed while segment j's final frame
    ///   travels, and leaves before this rank folds segment j's first partial, so it travels
    ///   during that fold;
    /// - an all-gather frame is forwarded before it is decompressed, and the segment's last
    ///   one is decompressed after the next segment's first frame has left.
    ///
    /// Each link thus carries at most two frames this rank has sent and its neighbour has not
    /// yet received, and segments are cut so that a frame holds at most half a segment's
    /// bytes: no more than the plain ring's one segment is ever in flight (the transport
    /// assumption of the crate docs).
    ///
    /// On two ranks over a 1 Gbit/s link (network namespaces, `tbf`), a 64 MiB int8 sum took
    /// 212-241 ms a call with every computation between a receive and the next send, and
    /// 139-144 ms reordered (the wire alone takes 137 ms), in runs on the shared 2-core machine
    /// whose load made other runs slower (see `BENCHMARKS.md`).
    fn reduce(&self, data: &mut [f32], residual: &mut [f32]) -> Result<()> {
        let (n, r, blocks, segments) = (self.n, self.r, self.blocks, self.segments);
        let longest = blocks.max_len().div_ceil(segments);
        let words = self.compression.frame_words(longest);
        let mut first = vec![0u32; words];
        let mut pending = vec![0u32; words];
        let mut send = vec![0u32; words];
        let mut recv = vec![0u32; words];
        let mut sums = Sums {
            sum: vec![0.0; FRAME_CHUNK],
            image: vec![0.0; FRAME_CHUNK],
        };
        let (_, first_recv_block) = layout::reduce_scatter_step(r, n, 0);
        let first_len = |segment: usize| blocks.segment(first_recv_block, segments, segment).len();

        let mut first_len_sent = self.first_hop(0, data, residual, &mut first, &mut sums)?;
        self.send(self.wire(&first, first_len_sent))?;
        self.recv_frame(&mut pending, first_len(0))?;
        if segments > 1 {
            first_len_sent = self.first_hop(1, data, residual, &mut first, &mut sums)?;
        }
        // The all-gather frame whose decompression waits for the next segment's first send.
        let mut deferred: Option<std::ops::Range<usize>> = None;
        for segment in 0..segments {
            let ahead = segment + 1 < segments;
            if ahead {
                self.send(self.wire(&first, first_len_sent))?;
            }
            if let Some(range) = deferred.take() {
                self.finish(&recv, &mut data[range])?;
            }
            self.fold(segment, 0, data, residual, &mut pending, &mut sums)?;
            std::mem::swap(&mut send, &mut pending);
            if ahead {
                self.recv_frame(&mut pending, first_len(segment + 1))?;
            }
            for step in 1..n - 1 {
                let (send_block, recv_block) = layout::reduce_scatter_step(r, n, step);
                let len = blocks.segment(send_block, segments, segment).len();
                self.send(self.wire(&send, len))?;
                let len = blocks.segment(recv_block, segments, segment).len();
                self.recv_frame(&mut recv, len)?;
                self.fold(segment, step, data, residual, &mut recv, &mut sums)?;
                std::mem::swap(&mut send, &mut recv);
            }
            // The all-gather: `send` holds this rank's final frame of the segment.
            let own = blocks.segment(r, segments, segment).len();
            self.send(self.wire(&send, own))?;
            if segment + 2 < segments {
                first_len_sent =
                    self.first_hop(segment + 2, data, residual, &mut first, &mut sums)?;
            }
            for step in 0..n - 1 {
                let (_, recv_block) = layout::all_gather_step(r, n, step);
                let range = blocks.segment(recv_block, segments, segment);
                self.recv_frame(&mut recv, range.len())?;
                if step < n - 2 {
                    self.send(self.wire(&recv, range.len()))?;
                    self.finish(&recv, &mut data[range])?;
                } else {
                    deferred = Some(range);
                }
            }
        }
        if let Some(range) = deferred {
            self.finish(&recv, &mut data[range])?;
        }
        Ok(())
    }
}

/// Adds this rank's contribution (its elements plus its residual) to `sum`, or stores it
/// there when `accumulate` is false.
fn add_contribution(sum: &mut [f32], own: &[f32], residual: &[f32], accumulate: bool) {
    let terms = sum.iter_mut().zip(own).zip(residual);
    if accumulate {
        for ((s, &x), &e) in terms {
            *s += x + e;
        }
    } else {
        for ((s, &x), &e) in terms {
            *s = x + e;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by fuzzing (`compressed_frame`): the header's reserved byte was ignored, so one
    /// header had 256 encodings.
    #[test]
    fn headers_round_trip_and_a_set_reserved_byte_is_refused() {
        let header = Header {
            origin: 2,
            compression: Compression::Int8,
            reduce: ReduceKind::Max,
            count: 1 << 20,
        };
        let mut bytes = header.encode();
        assert_eq!(Header::decode(&bytes, 1, 4).unwrap(), header);
        bytes[3] = 1;
        assert!(matches!(
            Header::decode(&bytes, 1, 4),
            Err(CollectiveError::Protocol { peer: Some(1), .. })
        ));
    }
}
