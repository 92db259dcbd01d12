//! MLX's native collectives through `MlxTransport` (2 and 3 ranks over MLX's ring on
//! loopback, real processes): every dtype × reduction × awkward length against a serial
//! reference computed with RLX's precision rules, a clear `Unsupported` for what MLX cannot
//! do, and mismatched calls failing on every rank without breaking the transport.

#![cfg(feature = "mlx")]

mod cluster;

use half::{bf16, f16};
use rlx_mlx_ffi::MlxTransport;
use std::sync::Arc;

use rlx_transport::symmetric::{Symmetric, SymmetricTransport};
use rlx_transport::{CollectiveError, DType, NativeCollectives, NativeOp, ReduceKind, Transport};

const COUNTS: [usize; 5] = [0, 1, 3, 1000, 70_001];

/// A count whose f32 all-reduce is still exchanged directly by default, in several pieces.
const LARGE: usize = 600_001;

/// Rank `rank`'s `j`-th element, as an exactly representable small value (large ones for the
/// integer types, so that sums saturate).
fn value(rank: u32, j: usize, dtype: DType) -> f64 {
    let r = f64::from(rank);
    let small = ((rank as usize * 7 + j * 3) % 50) as f64 - 20.0;
    match dtype {
        DType::I8 => (((rank as usize * 37 + j * 11) % 256) as f64) - 128.0,
        DType::U8 => ((rank as usize * 37 + j * 11) % 256) as f64,
        DType::I32 if j % 3 == 0 => f64::from(i32::MAX) - r,
        DType::I32 if j % 3 == 1 => f64::from(i32::MIN) + r,
        DType::I64 => small * 1e12,
        DType::I32 => small + r,
        _ => small + 0.5 * r,
    }
}

fn encode(values: &[f64], dtype: DType) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() * dtype.size());
    for &v in values {
        match dtype {
            DType::F16 => out.extend_from_slice(&f16::from_f64(v).to_le_bytes()),
            DType::BF16 => out.extend_from_slice(&bf16::from_f64(v).to_le_bytes()),
            DType::F32 => out.extend_from_slice(&(v as f32).to_le_bytes()),
            DType::F64 => out.extend_from_slice(&v.to_le_bytes()),
            DType::I8 => out.push(v as i8 as u8),
            DType::U8 => out.push(v as u8),
            DType::I32 => out.extend_from_slice(&(v as i32).to_le_bytes()),
            DType::I64 => out.extend_from_slice(&(v as i64).to_le_bytes()),
            other => panic!("no encoding for {other}"),
        }
    }
    out
}

fn rank_values(rank: u32, count: usize, dtype: DType) -> Vec<f64> {
    (0..count).map(|j| value(rank, j, dtype)).collect()
}

/// The serial reference: contributions combined in a wide type, then one narrowing.
fn reference(world: u32, count: usize, dtype: DType, reduce: ReduceKind) -> Vec<u8> {
    let n = f64::from(world);
    let per_rank: Vec<Vec<f64>> = (0..world).map(|r| rank_values(r, count, dtype)).collect();
    let combined: Vec<f64> = (0..count)
        .map(|j| {
            let column = per_rank.iter().map(|v| v[j]);
            match reduce {
                ReduceKind::Max => column.fold(f64::MIN, f64::max),
                ReduceKind::Min => column.fold(f64::MAX, f64::min),
                ReduceKind::Sum => column.sum(),
                ReduceKind::Mean => {
                    let sum: f64 = column.sum();
                    if dtype.is_float() {
                        sum / n
                    } else {
                        // Round to nearest, halves away from zero.
                        (sum / n).round()
                    }
                }
                other => panic!("no reference for {other}"),
            }
        })
        .collect();
    // The inputs are small enough that f64 holds every sum exactly; narrowing below
    // saturates integers and rounds floats once, as RLX's rules ask.
    let narrowed: Vec<f64> = combined
        .into_iter()
        .map(|v| match dtype {
            DType::I8 => v.clamp(-128.0, 127.0),
            DType::U8 => v.clamp(0.0, 255.0),
            DType::I32 => v.clamp(f64::from(i32::MIN), f64::from(i32::MAX)),
            DType::F16 | DType::BF16 | DType::F32 => f64::from(v as f32),
            _ => v,
        })
        .collect();
    encode(&narrowed, dtype)
}

/// Runs a native `reduce` over `count` elements of `dtype` from rank `me` of `n` and checks the
/// result against the serial reference.
fn reduce_and_check(
    native: &dyn NativeCollectives,
    me: u32,
    n: u32,
    count: usize,
    dtype: DType,
    reduce: ReduceKind,
) {
    let mut data = encode(&rank_values(me, count, dtype), dtype);
    native
        .all_reduce(&mut data, dtype, reduce)
        .unwrap_or_else(|e| panic!("{reduce} of {count} {dtype}: {e}"));
    assert!(
        data == reference(n, count, dtype, reduce),
        "{reduce} of {count} {dtype} differs from the serial reference"
    );
}

/// The matrix twice: with the default direct-exchange limit (every count here is exchanged
/// directly where all ranks are linked) and with every all-reduce sent through MLX's own.
fn matrix(t: &MlxTransport) {
    matrix_pass(t);
    t.set_direct_exchange_max(0);
    matrix_pass(t);
}

fn matrix_pass(t: &MlxTransport) {
    let native = t
        .native_collectives()
        .expect("MLX offers native collectives");
    let me = t.rank();
    let n = t.world_size();
    let mut ran = 0;
    for dtype in DType::ALL {
        for reduce in ReduceKind::ALL {
            let supported = native.supports(NativeOp::AllReduce, dtype, Some(reduce));
            for count in COUNTS {
                let mut data = encode(&rank_values(me, count, dtype), dtype);
                let result = native.all_reduce(&mut data, dtype, reduce);
                if supported {
                    result.unwrap_or_else(|e| panic!("{reduce} of {count} {dtype}: {e}"));
                    assert!(
                        data == reference(n, count, dtype, reduce),
                        "{reduce} of {count} {dtype} differs from the serial reference"
                    );
                    ran += 1;
                } else {
                    assert!(
                        matches!(result, Err(CollectiveError::Unsupported { .. })),
                        "{reduce} of {dtype} is not supported but gave {result:?}"
                    );
                }
            }
        }
        for count in COUNTS {
            let local = encode(&rank_values(me, count, dtype), dtype);
            let mut out = vec![0u8; local.len() * n as usize];
            native.all_gather(&local, &mut out, dtype).unwrap();
            let expected: Vec<u8> = (0..n)
                .flat_map(|r| encode(&rank_values(r, count, dtype), dtype))
                .collect();
            assert!(out == expected, "all_gather of {count} {dtype}");
        }
        // MLX's ring has no sum_scatter: the call must say so instead of trying.
        assert!(!native.supports(NativeOp::ReduceScatter, dtype, Some(ReduceKind::Sum)));
        let input = vec![0u8; dtype.size() * n as usize];
        let mut out = vec![0u8; dtype.size()];
        assert!(matches!(
            native.reduce_scatter(&input, &mut out, dtype, ReduceKind::Sum),
            Err(CollectiveError::Unsupported { .. })
        ));
    }
    // Sums, means, maxima and minima of the float and narrow integer types at least.
    assert!(
        ran >= 7 * 4 * COUNTS.len(),
        "only {ran} native all-reduces ran"
    );
    // Large enough for a direct exchange to go out in several pieces, some sent ahead.
    for (dtype, reduce) in [
        (DType::F32, ReduceKind::Sum),
        (DType::F16, ReduceKind::Mean),
        (DType::I32, ReduceKind::Max),
    ] {
        reduce_and_check(native, me, n, LARGE, dtype, reduce);
    }

    // A rank passing a different length fails on every rank, and the next call still works.
    for count in [1, LARGE] {
        let mut data = vec![0u8; 4 * (count + (me as usize % 2))];
        let mismatch = native.all_reduce(&mut data, DType::F32, ReduceKind::Sum);
        assert!(
            matches!(mismatch, Err(CollectiveError::InvalidArgument { .. })),
            "{mismatch:?}"
        );
    }
    let mut data = 1.0f32.to_le_bytes().to_vec();
    native
        .all_reduce(&mut data, DType::F32, ReduceKind::Sum)
        .unwrap();
    assert_eq!(data, (n as f32).to_le_bytes());
    t.barrier().unwrap();
}

#[test]
fn native_matrix_two_ranks() {
    cluster::ring("native_matrix_two_ranks", 2, matrix);
}

#[test]
fn native_matrix_three_ranks() {
    cluster::ring("native_matrix_three_ranks", 3, matrix);
}

/// With four ranks MLX's ring links only neighbours: the pause covers two links per rank,
/// small all-reduces go through MLX too (no direct exchange), and routed point-to-point
/// traffic before and after must stay intact.
fn four_ranks(t: &MlxTransport) {
    let native = t.native_collectives().unwrap();
    let me = t.rank();
    let n = t.world_size();
    for (dtype, reduce) in [
        (DType::F32, ReduceKind::Sum),
        (DType::F16, ReduceKind::Mean),
        (DType::I32, ReduceKind::Max),
        (DType::U8, ReduceKind::Sum),
    ] {
        for count in [0, 1, 5, 70_001] {
            let far = (me + 2) % n;
            t.send_bytes(far, 21, &[me as u8; 300]).unwrap();
            reduce_and_check(native, me, n, count, dtype, reduce);
            assert_eq!(t.recv_bytes(far, 21).unwrap(), vec![far as u8; 300]);
        }
    }
    let local = encode(&rank_values(me, 33, DType::BF16), DType::BF16);
    let mut out = vec![0u8; local.len() * n as usize];
    native.all_gather(&local, &mut out, DType::BF16).unwrap();
    let expected: Vec<u8> = (0..n)
        .flat_map(|r| encode(&rank_values(r, 33, DType::BF16), DType::BF16))
        .collect();
    assert!(out == expected);
    t.barrier().unwrap();
}

#[test]
fn native_four_ranks() {
    cluster::ring("native_four_ranks", 4, four_ranks);
}

/// A rank that reaches a native collective early must still forward what the others send
/// each other before it: rank 1 starts an all-reduce at once, while rank 0 first sends rank 2
/// a message whose route runs through rank 1. Then a call with a mismatched length fails on
/// every rank without touching the links, and the next one works.
fn early_forwarder(t: &MlxTransport) {
    let native = t.native_collectives().unwrap();
    let me = t.rank();
    let n = t.world_size();
    if me == 0 {
        std::thread::sleep(std::time::Duration::from_millis(300));
        t.send_bytes(2, 5, b"through rank 1").unwrap();
    }
    if me == 2 {
        assert_eq!(t.recv_bytes(0, 5).unwrap(), b"through rank 1");
    }
    let mut data = 1.0f32.to_le_bytes().to_vec();
    native
        .all_reduce(&mut data, DType::F32, ReduceKind::Sum)
        .unwrap();
    assert_eq!(data, (n as f32).to_le_bytes());

    let mut data = vec![0u8; if me == 0 { 8 } else { 4 }];
    let mismatch = native.all_reduce(&mut data, DType::F32, ReduceKind::Sum);
    assert!(
        matches!(mismatch, Err(CollectiveError::InvalidArgument { .. })),
        "{mismatch:?}"
    );
    let mut data = 2.0f32.to_le_bytes().to_vec();
    native
        .all_reduce(&mut data, DType::F32, ReduceKind::Sum)
        .unwrap();
    assert_eq!(data, (2.0 * n as f32).to_le_bytes());
    t.barrier().unwrap();
}

#[test]
fn native_after_routed_traffic_four_ranks() {
    cluster::ring("native_after_routed_traffic_four_ranks", 4, early_forwarder);
}

/// Native collectives next to point-to-point traffic: a message sent just before the
/// collective must be read past (and delivered) by whoever owns the links, and a receive
/// posted by another thread during the collective (which makes that rank pause through its
/// link threads while the others take their links directly) must neither swallow collective
/// bytes nor lose its message.
fn p2p_around_native(t: &MlxTransport) {
    // Through MLX's collective, which is what pauses the links.
    t.set_direct_exchange_max(0);
    let native = t.native_collectives().unwrap();
    let me = t.rank();
    let n = t.world_size();
    let next = (me + 1) % n;
    let prev = (me + n - 1) % n;
    let count = 70_001;
    for round in 0..4u8 {
        // Sent before the collective, received after it.
        t.send_bytes(next, 40, &[round; 3]).unwrap();
        // Rank 0 waits on another thread for a message sent only after the collective.
        let waiting = (me == 0).then(|| {
            std::thread::scope(|scope| {
                let waiter = scope.spawn(|| t.recv_bytes(n - 1, 41));
                std::thread::sleep(std::time::Duration::from_millis(50));
                reduce_and_check(native, me, n, count, DType::F32, ReduceKind::Sum);
                waiter.join().unwrap()
            })
        });
        if me != 0 {
            reduce_and_check(native, me, n, count, DType::F32, ReduceKind::Sum);
        }
        if me == n - 1 {
            t.send_bytes(0, 41, &[round + 100]).unwrap();
        }
        assert_eq!(t.recv_bytes(prev, 40).unwrap(), vec![round; 3]);
        if let Some(got) = waiting {
            assert_eq!(got.unwrap(), vec![round + 100]);
        }
        t.barrier().unwrap();
    }
}

#[test]
fn p2p_around_native_two_ranks() {
    cluster::ring("p2p_around_native_two_ranks", 2, p2p_around_native);
}

#[test]
fn p2p_around_native_three_ranks() {
    cluster::ring("p2p_around_native_three_ranks", 3, p2p_around_native);
}

/// The symmetric heap over an MLX transport, with native all-reduces before and after its
/// first collective allocation: the heap's service and agreement messages and the direct
/// exchanges' pieces share the transport's own tag space and must not take each other's
/// messages.
fn heap_beside_native(t: &Arc<MlxTransport>) {
    let heap = Symmetric::new(Arc::clone(t), 1 << 16).unwrap();
    let native = t.native_collectives().unwrap();
    let me = t.rank();
    let n = t.world_size();
    for count in [1, 1000, 70_001] {
        reduce_and_check(native, me, n, count, DType::F32, ReduceKind::Sum);
    }
    let region = heap.alloc(64).unwrap();
    let next = (me + 1) % n;
    heap.put(next, region.offset(), &[me as u8 + 1; 64])
        .unwrap();
    t.barrier().unwrap();
    let prev = (me + n - 1) % n;
    let mut got = [0u8; 64];
    heap.get(me, region.offset(), &mut got).unwrap();
    assert_eq!(got, [prev as u8 + 1; 64]);
    reduce_and_check(native, me, n, 3, DType::F32, ReduceKind::Max);
    heap.free(region).unwrap();
    t.barrier().unwrap();
    drop(heap);
}

#[test]
fn heap_beside_native_two_ranks() {
    cluster::ring_shared("heap_beside_native_two_ranks", 2, heap_beside_native);
}
