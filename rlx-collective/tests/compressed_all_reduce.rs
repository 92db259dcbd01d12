//! `ProcessGroup::all_reduce_compressed` on in-process worlds: error bounds against an f64
//! reference for every format, world size 1-8 and awkward counts; bit-identical results; the
//! error feedback's 1/K convergence (and a control without it that does not converge); the
//! bytes on the wire against the format's optimum; hostile frames from a fake peer; and ranks
//! that disagree on the format, reduction or length.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rlx_collective::{
    CollectiveError, Compression, Compressor, Failure, INT8_BLOCK, MemTransport, ProcessGroup,
    ReduceKind, Tag, Transport, WORLD_GROUP_ID,
};

/// Counts that reach the edges: none, one, primes, exactly one int8 block, and several
/// blocks and pipeline segments.
const COUNTS: [usize; 9] = [0, 1, 2, 7, 13, 256, 257, 1031, 5003];

/// A deterministic input of `rank`: mixed signs and magnitudes over three decades.
fn input(rank: u32, count: usize) -> Vec<f32> {
    (0..count)
        .map(|i| {
            let x = (i as f32 * 0.731 + rank as f32 * 1.37).sin();
            x * (1 + (i * 7 + rank as usize) % 1000) as f32 / 10.0
        })
        .collect()
}

/// The bound on one element's error after a call: each of the n compressions of a partial
/// sum (never larger than the sum of magnitudes) adds at most the format's rounding error.
fn bound(compression: Compression, n: usize, magnitude: f64, block_magnitude: f64) -> f64 {
    let per_hop = match compression {
        Compression::None => magnitude * f64::from(f32::EPSILON),
        Compression::Bf16 => magnitude / 256.0,
        Compression::Fp16 => magnitude / 2048.0,
        Compression::Int8 => block_magnitude / 254.0,
        _ => unreachable!("a format this test does not know"),
    };
    // The f32 additions along the chain round too.
    n as f64 * (per_hop * 1.001 + magnitude * f64::from(f32::EPSILON))
}

#[test]
fn every_format_world_and_count_is_within_its_bound_and_bit_identical() {
    for n in 1..=8u32 {
        let results = common::on_each(common::world(n), move |group| {
            // Small segments, so that the larger counts run several pipeline segments whose
            // int8 blocks end early.
            group.set_max_segment_bytes(Some(1000));
            let mut out = Vec::new();
            for compression in Compression::ALL {
                for op in [ReduceKind::Sum, ReduceKind::Mean] {
                    for count in COUNTS {
                        let mut data = input(group.rank(), count);
                        let mut compressor = Compressor::new(compression);
                        group
                            .all_reduce_compressed(&mut data, op, &mut compressor)
                            .unwrap();
                        out.push((compression, op, count, data));
                    }
                }
            }
            out
        });
        let n_us = n as usize;
        for (case, (compression, op, count, data)) in results[0].iter().enumerate() {
            for (rank, theirs) in results.iter().enumerate() {
                let same = theirs[case]
                    .3
                    .iter()
                    .zip(data)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(
                    same,
                    "n={n} {compression} {op} count {count}: rank {rank} differs"
                );
            }
            let inputs: Vec<Vec<f32>> = (0..n).map(|r| input(r, *count)).collect();
            let magnitude = |i: usize| inputs.iter().map(|x| f64::from(x[i].abs())).sum::<f64>();
            let divisor = if *op == ReduceKind::Mean {
                n as f64
            } else {
                1.0
            };
            for (i, &got) in data.iter().enumerate() {
                let exact = inputs.iter().map(|x| f64::from(x[i])).sum::<f64>() / divisor;
                let error = (f64::from(got) - exact).abs();
                let allowed = if n == 1 {
                    0.0
                } else {
                    // Int8 blocks are cut per pipeline segment, so take the largest magnitude
                    // of the surrounding elements as the block's.
                    let near = i.saturating_sub(INT8_BLOCK)..(i + INT8_BLOCK).min(*count);
                    let block = near.map(magnitude).fold(0.0, f64::max);
                    bound(*compression, n_us, magnitude(i), block) / divisor
                };
                assert!(
                    error <= allowed,
                    "n={n} {compression} {op} count {count} element {i}: got {got}, exact \
                     {exact}, error {error:.3e} > {allowed:.3e}"
                );
            }
        }
    }
}

/// Mean over `calls` all-reduces of the same inputs, as the largest error of that mean
/// against the exact sum after each number of calls in `checkpoints`.
fn errors_of_repeated_sums(
    compression: Compression,
    feedback: bool,
    checkpoints: &'static [usize],
) -> Vec<f64> {
    const N: u32 = 4;
    const COUNT: usize = 1000;
    let errors = common::on_each(common::world(N), move |group| {
        let exact: Vec<f64> = (0..COUNT)
            .map(|i| (0..N).map(|r| f64::from(input(r, COUNT)[i])).sum())
            .collect();
        let mut compressor = Compressor::new(compression);
        let mut total = vec![0f64; COUNT];
        let mut errors = Vec::new();
        let last = *checkpoints.last().unwrap();
        for call in 1..=last {
            if !feedback {
                compressor.reset();
            }
            let mut data = input(group.rank(), COUNT);
            group
                .all_reduce_compressed(&mut data, ReduceKind::Sum, &mut compressor)
                .unwrap();
            for (t, x) in total.iter_mut().zip(&data) {
                *t += f64::from(*x);
            }
            if checkpoints.contains(&call) {
                let worst = total
                    .iter()
                    .zip(&exact)
                    .map(|(t, e)| (t / call as f64 - e).abs())
                    .fold(0.0, f64::max);
                errors.push(worst);
            }
        }
        errors
    });
    errors.into_iter().next().unwrap()
}

#[test]
fn error_feedback_makes_the_mean_of_repeated_sums_converge_like_one_over_k() {
    const CHECKPOINTS: &[usize] = &[1, 2, 5, 10, 20, 50, 100, 200];
    for compression in [Compression::Int8, Compression::Bf16, Compression::Fp16] {
        let with = errors_of_repeated_sums(compression, true, CHECKPOINTS);
        let without = errors_of_repeated_sums(compression, false, CHECKPOINTS);
        let first = with[0];
        assert!(first > 0.0, "{compression}: the first call was exact");
        for (&k, &error) in CHECKPOINTS.iter().zip(&with) {
            // K × error stays bounded (by the residual, at most a few single-call errors),
            // which is the 1/K trend.
            assert!(
                error * k as f64 <= 4.0 * first,
                "{compression}: after {k} calls the mean's error is {error:.3e}, first {first:.3e}"
            );
        }
        assert!(
            with[CHECKPOINTS.len() - 1] <= first / 50.0,
            "{compression}: {with:?}"
        );
        // The control: without feedback every call makes the same error, so the mean does not
        // improve.
        for &error in &without {
            assert!(
                error >= 0.5 * first,
                "{compression}: the control converged: {without:?}"
            );
        }
        assert!(
            without[CHECKPOINTS.len() - 1] >= 20.0 * with[CHECKPOINTS.len() - 1],
            "{compression}: with {with:?} without {without:?}"
        );
        eprintln!("{compression}: with feedback {with:?}, without {without:?}");
    }
}

/// A transport that counts the bytes of every message it sends (receives go through the
/// trait's default `recv_message_into`, which is enough for a test).
struct Counting {
    inner: Arc<MemTransport>,
    sent: AtomicU64,
}

// Not a `Delegate`: the trait's provided methods route every send through `send_message`,
// where it is counted; forwarding them would bypass the count.
impl Transport for Counting {
    fn rank(&self) -> u32 {
        self.inner.rank()
    }

    fn world_size(&self) -> u32 {
        self.inner.world_size()
    }

    fn send_message(&self, to: u32, tag: Tag, parts: &[&[u8]]) -> rlx_collective::Result<()> {
        let bytes: usize = parts.iter().map(|p| p.len()).sum();
        self.sent.fetch_add(bytes as u64, Ordering::Relaxed);
        self.inner.send_message(to, tag, parts)
    }

    fn recv_message(
        &self,
        from: u32,
        tag: Tag,
        timeout: Duration,
    ) -> rlx_collective::Result<Option<Vec<u8>>> {
        self.inner.recv_message(from, tag, timeout)
    }

    fn send_failure(&self, to: u32, tag: Tag, failure: Failure) -> rlx_collective::Result<()> {
        self.inner.send_failure(to, tag, failure)
    }

    fn op_timeout(&self) -> Duration {
        self.inner.op_timeout()
    }

    fn abort(&self) {
        self.inner.abort();
    }
}

#[test]
fn wire_bytes_per_rank_are_within_two_percent_of_the_formats_optimum() {
    const COUNT: usize = 1 << 18;
    for n in 2..=8u32 {
        let transports: Vec<Arc<Counting>> =
            MemTransport::fan_out_with_timeout(n, common::TEST_TIMEOUT)
                .into_iter()
                .map(|inner| {
                    Arc::new(Counting {
                        inner,
                        sent: AtomicU64::new(0),
                    })
                })
                .collect();
        let groups = transports
            .iter()
            .map(|t| ProcessGroup::new(Arc::clone(t) as Arc<dyn Transport>))
            .collect();
        let counted = Arc::new(transports);
        let seen = Arc::clone(&counted);
        let reports = common::on_each(groups, move |group| {
            let mut out = Vec::new();
            for compression in Compression::ALL {
                group.barrier().unwrap();
                let before = seen[group.rank() as usize].sent.load(Ordering::SeqCst);
                let mut data = input(group.rank(), COUNT);
                let mut compressor = Compressor::new(compression);
                group
                    .all_reduce_compressed(&mut data, ReduceKind::Sum, &mut compressor)
                    .unwrap();
                let after = seen[group.rank() as usize].sent.load(Ordering::SeqCst);
                out.push((compression, after - before, compressor.last_wire_bytes()));
            }
            out
        });
        for (rank, report) in reports.iter().enumerate() {
            for &(compression, counted, reported) in report {
                let per_element = compression.frame_bytes(COUNT) as f64 / COUNT as f64;
                let optimum = 2.0 * f64::from(n - 1) / f64::from(n) * COUNT as f64 * per_element;
                let ratio = counted as f64 / optimum;
                assert!(
                    (0.98..=1.02).contains(&ratio),
                    "n={n} rank {rank} {compression}: {counted} bytes sent, optimum {optimum:.0}"
                );
                assert_eq!(counted, reported, "n={n} rank {rank} {compression}");
            }
        }
    }
}

/// What the fake rank 1 of a two-rank world sends to rank 0 in its first operation.
enum Hostile {
    /// A header of the wrong length.
    ShortHeader,
    /// A valid header naming another format.
    OtherFormat,
    /// A valid header, then an int8 frame whose first scale is NaN.
    NanScale,
    /// A valid header, then a frame one byte short.
    ShortFrame,
}

/// The 20-byte header rank 1 would send for an int8 sum of `count` elements (the layout of
/// `all_reduce/compressed.rs`: version, format, reduction, pad, int8 block, origin, count).
fn header(format_code: u8, count: u64) -> Vec<u8> {
    let mut out = vec![1, format_code, ReduceKind::Sum.code(), 0];
    out.extend_from_slice(&(INT8_BLOCK as u32).to_le_bytes());
    out.extend_from_slice(&1u32.to_le_bytes());
    out.extend_from_slice(&count.to_le_bytes());
    out
}

/// Runs rank 0's int8 all-reduce of 512 elements against a fake rank 1 that sends `hostile`.
fn against_fake_peer(hostile: Hostile) -> CollectiveError {
    const COUNT: usize = 512;
    let transports = MemTransport::fan_out_with_timeout(2, Duration::from_secs(20));
    let fake = Arc::clone(&transports[1]);
    let group = ProcessGroup::new(Arc::clone(&transports[0]) as Arc<dyn Transport>);
    // The group's first operation has sequence number 0.
    let tag = Tag::op(WORLD_GROUP_ID, 0, 0);
    let int8 = 3u8;
    let frames: Vec<Vec<u8>> = match hostile {
        Hostile::ShortHeader => vec![header(int8, COUNT as u64)[..12].to_vec()],
        Hostile::OtherFormat => vec![header(1, COUNT as u64)],
        Hostile::NanScale => {
            // Rank 0 receives block 0 (elements 0..256) at the single reduce-scatter step.
            let mut frame = f32::NAN.to_le_bytes().to_vec();
            frame.resize(Compression::Int8.frame_bytes(256), 1);
            vec![header(int8, COUNT as u64), frame]
        }
        Hostile::ShortFrame => vec![
            header(int8, COUNT as u64),
            vec![0; Compression::Int8.frame_bytes(256) - 1],
        ],
    };
    for frame in &frames {
        fake.send_message(0, tag, &[frame]).unwrap();
    }
    let mut data = vec![1.0f32; COUNT];
    let mut compressor = Compressor::new(Compression::Int8);
    group
        .all_reduce_compressed(&mut data, ReduceKind::Sum, &mut compressor)
        .unwrap_err()
}

#[test]
fn hostile_frames_fail_with_errors_that_name_the_peer() {
    for (hostile, what) in [
        (Hostile::ShortHeader, "short header"),
        (Hostile::NanScale, "NaN scale"),
        (Hostile::ShortFrame, "short frame"),
    ] {
        let error = against_fake_peer(hostile);
        assert!(
            matches!(error, CollectiveError::Protocol { peer: Some(1), .. }),
            "{what}: {error}"
        );
        assert!(error.to_string().contains("peer rank 1"), "{what}: {error}");
    }
    let error = against_fake_peer(Hostile::OtherFormat);
    assert!(
        matches!(error, CollectiveError::InvalidArgument { .. }),
        "{error}"
    );
    let message = error.to_string();
    assert!(
        message.contains("peer rank 1") && message.contains("bf16") && message.contains("int8"),
        "{message}"
    );
}

#[test]
fn ranks_that_disagree_fail_on_every_rank_and_the_group_stays_usable() {
    for n in [2u32, 3, 4, 5] {
        let outcomes = common::on_each(common::world(n), move |group| {
            let rank = group.rank();
            let mut data = input(rank, 300);
            // The last rank asks for another format, then for another reduction, then passes
            // another length.
            let odd = rank == n - 1;
            let format = if odd {
                Compression::Int8
            } else {
                Compression::Bf16
            };
            let format_error = group
                .all_reduce_compressed(&mut data, ReduceKind::Sum, &mut Compressor::new(format))
                .unwrap_err();
            let op = if odd {
                ReduceKind::Mean
            } else {
                ReduceKind::Sum
            };
            let op_error = group
                .all_reduce_compressed(&mut data, op, &mut Compressor::new(Compression::Bf16))
                .unwrap_err();
            let mut other = input(rank, if odd { 301 } else { 300 });
            let length_error = group
                .all_reduce_compressed(
                    &mut other,
                    ReduceKind::Sum,
                    &mut Compressor::new(Compression::Bf16),
                )
                .unwrap_err();
            let mut after = [1.0f32; 4];
            let usable = group.all_reduce_compressed(
                &mut after,
                ReduceKind::Sum,
                &mut Compressor::new(Compression::Int8),
            );
            (format_error, op_error, length_error, usable.map(|()| after))
        });
        for (rank, (format_error, op_error, length_error, after)) in
            outcomes.into_iter().enumerate()
        {
            assert!(
                matches!(format_error, CollectiveError::InvalidArgument { .. }),
                "n={n} rank {rank}: {format_error}"
            );
            assert!(
                matches!(op_error, CollectiveError::InvalidArgument { .. }),
                "n={n} rank {rank}: {op_error}"
            );
            assert!(
                matches!(length_error, CollectiveError::LengthMismatch { .. }),
                "n={n} rank {rank}: {length_error}"
            );
            assert_eq!(after.unwrap(), [n as f32; 4], "n={n} rank {rank}");
        }
    }
}

#[test]
fn unsupported_reductions_non_finite_int8_and_mixed_tensors_are_refused() {
    let outcomes = common::on_each(common::world(2), |group| {
        let mut data = [1.0f32, 2.0];
        let mut compressor = Compressor::new(Compression::Int8);
        let max = group.all_reduce_compressed(&mut data, ReduceKind::Max, &mut compressor);
        let mut nan = [1.0f32, f32::NAN];
        let non_finite = group.all_reduce_compressed(&mut nan, ReduceKind::Sum, &mut compressor);
        group
            .all_reduce_compressed(&mut data, ReduceKind::Sum, &mut compressor)
            .unwrap();
        let mut longer = [1.0f32; 3];
        let mixed = group.all_reduce_compressed(&mut longer, ReduceKind::Sum, &mut compressor);
        (max, non_finite, mixed)
    });
    for (max, non_finite, mixed) in outcomes {
        assert!(matches!(max, Err(CollectiveError::InvalidArgument { .. })));
        // The rank with the NaN refuses it; its peer hears that it failed.
        assert!(matches!(
            non_finite,
            Err(CollectiveError::InvalidArgument { .. } | CollectiveError::PeerFailed { .. })
        ));
        assert!(matches!(
            mixed,
            Err(CollectiveError::InvalidArgument { .. })
        ));
    }
}

#[test]
fn the_flight_recorder_names_the_operation_and_its_algorithm() {
    let records = common::on_each(common::world(2), |group| {
        let mut data = [1.0f32; 8];
        let mut compressor = Compressor::new(Compression::Fp16);
        group
            .all_reduce_compressed(&mut data, ReduceKind::Sum, &mut compressor)
            .unwrap();
        group.flight_record()
    });
    for record in records {
        let entry = record.last().unwrap();
        assert_eq!(entry.op, "all_reduce_compressed", "{entry:?}");
        assert_eq!(entry.algorithm, Some("compressed_ring_fp16"), "{entry:?}");
        assert_eq!(entry.elements, Some(8), "{entry:?}");
    }
}
