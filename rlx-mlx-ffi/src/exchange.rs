//! The direct exchange: all-reduces small enough that every rank sends its whole contribution
//! to every other over the links and combines them all itself, in rank order and in the wide
//! type MLX would reduce in, instead of pausing the links for MLX's collective (see
//! [`DIRECT_EXCHANGE_MAX`] for when, and the measurements behind it). Contributions travel in
//! pieces with tags of their own, a bounded number of them ahead of the slowest peer.

use std::time::{Duration, Instant};

use rlx_transport::{CollectiveError, Result, Tag};

use crate::frame::{Header, Kind};
use crate::native::ReducePlan;
use crate::pause::{ANNOUNCE_PHASE, Descriptor, decode_descriptor, encode_descriptor};
use crate::shared::{Demand, Shared};
use crate::sync::lock;

/// By default, all-reduces whose contribution (in the wide type MLX would reduce), times the
/// number of other ranks, is at most this many bytes run as one direct exchange over MLX's
/// send/recv when every rank is linked to every other (rings of two or three ranks, MPI):
/// each rank sends its contribution to all others and combines all of them in rank order, in
/// the wide type. A native collective first pauses the links (a small MLX message each way)
/// and then runs MLX's own, whose ring on a busy machine waits for scheduler ticks between
/// its busy-polling threads. Measured on two loopback ranks of a 2-core machine (f32 sums,
/// medians of 3 interleaved runs of 200-call medians, ranks bound to a core each, µs,
/// exchange vs pause + MLX all_sum): 32 KiB 37.5 vs 53.4, 256 KiB 90 vs 101, 1 MiB 696 vs
/// 4927, 2 MiB 939 vs 7725, 4 MiB 3281 vs 11853, 8 MiB 6757 vs 10333, 16 MiB 13142 vs
/// 20014, 64 MiB 71170 vs 73994 (earlier runs: 81 ms vs 72 ms). Hence 16 MiB; the exchange
/// also holds every peer's contribution at once. `RLX_MLX_DIRECT_MAX` or
/// [`MlxTransport::set_direct_exchange_max`] change it.
///
/// [`MlxTransport::set_direct_exchange_max`]: crate::MlxTransport::set_direct_exchange_max
pub(crate) const DIRECT_EXCHANGE_MAX: usize = 16 << 20;

/// Wire bytes of each piece of a direct exchange (more for exchanges so large that they
/// would need more than [`MAX_EXCHANGE_PIECES`]). Measured as for [`DIRECT_EXCHANGE_MAX`]
/// (µs, pieces of 128 KiB / 256 KiB / 1 MiB): 1 MiB 814 / 615 / 404, 2 MiB 1195 / 988 /
/// 1111, 16 MiB 16725 / 16100 / 17198, 64 MiB 93415 / 81242 / 83970.
const EXCHANGE_PIECE: usize = 256 << 10;

/// Pieces of a direct exchange up to this many bytes go out on the caller's thread; larger
/// ones are queued for the link's sender thread, and the caller waits for the peers' pieces
/// with its deadline. An MLX send cannot be abandoned: it waits while the peer's socket
/// buffer is full (a peer that has given up the exchange no longer reads), and forever when
/// MLX stopped the connection's worker after the peer died just before the send was issued.
/// Loopback socket buffers start near 144 KiB, so a piece this small completes without the
/// peer reading; the window around a peer's death remains for it, as for every small send
/// made on the caller's thread.
pub(crate) const EXCHANGE_DIRECT_SEND_MAX: usize = 64 << 10;

/// How many pieces of a direct exchange a rank sends beyond the last one it holds from every
/// peer. Measured with `cargo xtask bench --transport mlx --peers` (2 runs each, ours / MLX
/// time, pieces through the sender threads): one ahead 8 MiB 0.84 / 1.19, 16 MiB 1.12 /
/// 1.37; two ahead 0.80 / 0.82 and 1.03 / 0.87.
const EXCHANGE_AHEAD: usize = 2;

/// How often a direct exchange waiting for one peer's piece looks whether another peer was
/// lost.
const EXCHANGE_WATCH: Duration = Duration::from_millis(10);

/// Phase of the transport-group tag of a direct exchange's first piece; later pieces count
/// down from it.
const EXCHANGE_TOP_PHASE: u16 = ANNOUNCE_PHASE - 1;

/// The most pieces one direct exchange is cut into (each piece has a tag phase of its own,
/// below the reserved phases).
const MAX_EXCHANGE_PIECES: usize = 4096;

impl Shared {
    /// An all-reduce as one direct exchange (see [`DIRECT_EXCHANGE_MAX`]): every rank sends
    /// its contribution to every other in pieces (see [`exchange_pieces`]), the first behind
    /// the operation's descriptor, so a rank that called a different operation fails with
    /// `InvalidArgument` instead of mixing data. A rank sends piece k + [`EXCHANGE_AHEAD`]
    /// once it holds every peer's piece k, so a bounded amount is in flight per link; large
    /// pieces go through the links' sender threads (see [`EXCHANGE_DIRECT_SEND_MAX`]), so the
    /// caller only ever waits with its deadline.
    pub(crate) fn exchange_all_reduce(
        &self,
        data: &mut [u8],
        plan: ReducePlan,
        descriptor: Descriptor,
    ) -> Result<()> {
        let s = self;
        let _one_at_a_time = lock(&s.collective);
        let seq = s.next_native_seq();
        // MLX's wire type is the caller's own for in-place plans, which are then reduced
        // straight in the caller's buffer; other plans reduce in a widened copy.
        let mut widened = (!plan.in_place()).then(|| plan.widen(data));
        let wire_len = widened.as_ref().map_or(data.len(), Vec::len);
        let pieces = exchange_pieces(wire_len, plan.wire.size());
        // Phases count down from just below the announcements' (at most
        // `MAX_EXCHANGE_PIECES` of them), clear of phase 0, which the symmetric heap's tags
        // use on the transport group's first sequence numbers.
        let tag = |piece: usize| {
            Tag::op(
                rlx_transport::TRANSPORT_GROUP,
                seq,
                EXCHANGE_TOP_PHASE - piece as u16,
            )
        };
        let head = encode_descriptor(descriptor);
        s.check_usable()?;
        // The receivers read before anything is sent: then a direct send that waits for the
        // peer to read cannot wait for a peer that waits likewise.
        let peers: Vec<u32> = (0..s.world).filter(|&p| p != s.rank).collect();
        let _demands: Vec<Demand<'_>> = peers
            .iter()
            .filter_map(|&from| Some((s.link_index(s.last_hop_from(from))?, from)))
            .flat_map(|(index, from)| {
                (0..pieces.len()).map(move |piece| Demand::register(s, index, from, tag(piece)))
            })
            .collect();
        let send_piece = |piece: usize| -> Result<()> {
            let mine: &[u8] = widened.as_deref().unwrap_or(data);
            let body = &mine[pieces[piece].clone()];
            let first: [&[u8]; 2] = [&head, body];
            let later: [&[u8]; 1] = [body];
            let parts: &[&[u8]] = if piece == 0 { &first } else { &later };
            for &peer in &peers {
                s.send_directly_up_to(
                    Header {
                        kind: Kind::Data,
                        src: s.rank,
                        dst: peer,
                        tag: tag(piece).raw(),
                        len: parts.iter().map(|p| p.len() as u64).sum(),
                    },
                    parts,
                    EXCHANGE_DIRECT_SEND_MAX,
                )?;
            }
            Ok(())
        };
        let deadline = Instant::now() + s.op_timeout;
        // Takes rank `from`'s piece `piece` once it has arrived. The wait goes in slices, so
        // that the loss of another peer, whose pieces will then never come, ends it too (the
        // peers that noticed first stop sending).
        let take = |from: u32, piece: usize| -> Result<Vec<u8>> {
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(CollectiveError::Timeout {
                        peer: Some(from),
                        op: "all_reduce",
                        after: s.op_timeout,
                    });
                }
                if let Some(message) = s.inbox.take(from, tag(piece), left.min(EXCHANGE_WATCH))? {
                    return Ok(message);
                }
                if let Some(&lost) = peers.iter().find(|&&p| s.inbox.is_lost(p)) {
                    return Err(CollectiveError::PeerLost {
                        peer: lost,
                        reason: format!(
                            "lost during a direct all-reduce, while rank {} waited for rank {from}",
                            s.rank
                        ),
                    });
                }
            }
        };
        // Where a piece's elements start: the first carries the descriptor in front.
        let skip = |piece: usize| if piece == 0 { head.len() } else { 0 };
        // Checks peer `from`'s piece: its length, and for the first, the descriptor.
        let check = |from: u32, piece: usize, message: &[u8]| -> Result<()> {
            let expected = skip(piece) + pieces[piece].len();
            if piece == 0 {
                let theirs = decode_descriptor(message);
                if theirs != Some(descriptor) || message.len() != expected {
                    return Err(s.mismatch("all_reduce", descriptor, from, theirs));
                }
            } else if message.len() != expected {
                return Err(CollectiveError::protocol(
                    Some(from),
                    format!(
                        "piece {piece} of a direct all-reduce has {} bytes, not {expected}",
                        message.len()
                    ),
                ));
            }
            Ok(())
        };
        // Every contribution is checked before the caller's buffer is touched, so a failed
        // exchange leaves it as it was; and every peer's piece is taken before any is checked,
        // so a mismatched call leaves none of them behind in the inbox. `theirs[p][k]` is
        // piece k of the p-th peer.
        let mut theirs: Vec<Vec<Vec<u8>>> = vec![Vec::with_capacity(pieces.len()); peers.len()];
        // The first piece goes alone, so that a mismatched call is found before any other
        // piece is sent; then up to `EXCHANGE_AHEAD` pieces travel ahead of the one awaited.
        send_piece(0)?;
        for piece in 0..pieces.len() {
            for (p, &from) in peers.iter().enumerate() {
                theirs[p].push(take(from, piece)?);
            }
            for (p, &from) in peers.iter().enumerate() {
                check(from, piece, &theirs[p][piece])?;
            }
            let first_unsent = if piece == 0 {
                1
            } else {
                piece + EXCHANGE_AHEAD
            };
            for ahead in first_unsent..(piece + 1 + EXCHANGE_AHEAD).min(pieces.len()) {
                send_piece(ahead)?;
            }
        }
        let (lower, higher) = theirs.split_at_mut(s.rank as usize);
        let mine: &mut [u8] = match widened.as_mut() {
            Some(wide) => wide,
            None => data,
        };
        for (piece, range) in pieces.iter().enumerate() {
            // Rank order without copying this rank's elements: the lower ranks' pieces are
            // combined in the first one's, which then goes in front of this rank's; the
            // higher ranks' follow one by one.
            let at = skip(piece);
            if let Some((first, rest)) = lower.split_first_mut() {
                for other in rest.iter() {
                    plan.accumulate(&mut first[piece][at..], &other[piece][at..]);
                }
                plan.accumulate_after(&mut mine[range.clone()], &first[piece][at..]);
            }
            for other in higher.iter() {
                plan.accumulate(&mut mine[range.clone()], &other[piece][at..]);
            }
        }
        match widened {
            Some(wide) => plan.narrow(&wide, data, s.world),
            None => Ok(()),
        }
    }
}

/// The byte ranges of the pieces a direct exchange of `len` wire bytes of `element`-byte
/// elements is sent in: at least one (possibly empty), each a whole number of elements.
fn exchange_pieces(len: usize, element: usize) -> Vec<std::ops::Range<usize>> {
    let piece = EXCHANGE_PIECE.max(len.div_ceil(MAX_EXCHANGE_PIECES));
    let piece = piece.div_ceil(element) * element;
    let mut pieces = Vec::with_capacity(len.div_ceil(piece).max(1));
    let mut at = 0;
    loop {
        let end = (at + piece).min(len);
        pieces.push(at..end);
        at = end;
        if at == len {
            return pieces;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exchange_pieces_cover_the_buffer_in_whole_elements() {
        assert_eq!(exchange_pieces(0, 4), vec![0..0]);
        assert_eq!(exchange_pieces(12, 4), vec![0..12]);
        assert_eq!(
            exchange_pieces(2 * EXCHANGE_PIECE + 8, 8),
            vec![
                0..EXCHANGE_PIECE,
                EXCHANGE_PIECE..2 * EXCHANGE_PIECE,
                2 * EXCHANGE_PIECE..2 * EXCHANGE_PIECE + 8,
            ]
        );
        for (len, element) in [
            (4 << 20, 4),
            (3 * 1_000_003, 3),
            (1 << 34, 8),
            (70_001 * 2, 2),
        ] {
            let pieces = exchange_pieces(len, element);
            assert!(
                pieces.len() <= MAX_EXCHANGE_PIECES,
                "{len}: {} pieces",
                pieces.len()
            );
            assert_eq!(pieces[0].start, 0);
            assert_eq!(pieces.last().unwrap().end, len);
            for pair in pieces.windows(2) {
                assert_eq!(pair[0].end, pair[1].start);
                assert_eq!(pair[0].len() % element, 0, "{len}: {pair:?}");
            }
        }
    }
}
