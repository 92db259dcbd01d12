//! The typed API against the byte-level one: for every `Element` type, each generic
//! collective and point-to-point call on `&[T]` gives exactly the bytes that the
//! `*_typed(&[u8], DType)` form gives on the same data (which the reference tests check), on
//! 3 ranks, with counts that do not divide by the world size.

mod common;

use half::{bf16, f16};
use rlx_collective::{CollectiveError, DType, Element, ProcessGroup, ReduceKind};

/// Small values encoded as `dtype`, different on every rank and element.
fn encoded(dtype: DType, rank: u32, count: usize) -> Vec<u8> {
    (0..count)
        .flat_map(|i| {
            let v = (i as i64 * 3 + i64::from(rank) * 5) % 11 - 4;
            match dtype {
                DType::F16 => f16::from_f32(v as f32).to_le_bytes().to_vec(),
                DType::BF16 => bf16::from_f32(v as f32).to_le_bytes().to_vec(),
                DType::F32 => (v as f32).to_le_bytes().to_vec(),
                DType::F64 => (v as f64).to_le_bytes().to_vec(),
                DType::I8 => (v as i8).to_le_bytes().to_vec(),
                DType::U8 => ((v + 4) as u8).to_le_bytes().to_vec(),
                DType::I32 => (v as i32).to_le_bytes().to_vec(),
                DType::I64 => v.to_le_bytes().to_vec(),
                other => panic!("no encoding for {other}"),
            }
        })
        .collect()
}

fn as_bytes<T: Element>(values: &[T]) -> Vec<u8> {
    bytemuck::cast_slice(values).to_vec()
}

/// Every typed call of one rank next to its byte-level twin.
fn compare_on<T: Element>(group: &ProcessGroup) -> Result<(), CollectiveError> {
    let me = group.rank();
    let world = group.world_size();
    let dtype = T::DTYPE;
    let bytes = encoded(dtype, me, 7);
    let values: Vec<T> = bytemuck::pod_collect_to_vec(&bytes);
    let what = |op: &str| format!("{op} of {dtype} on rank {me}");

    let mut typed = values.clone();
    group.all_reduce(&mut typed, ReduceKind::Sum)?;
    let mut raw = bytes.clone();
    group.all_reduce_typed(&mut raw, dtype, ReduceKind::Sum)?;
    assert_eq!(as_bytes(&typed), raw, "{}", what("all_reduce"));

    let handle = group.spawn_all_reduce(values.clone(), ReduceKind::Max);
    let typed = handle.join()?;
    let mut raw = bytes.clone();
    group.all_reduce_typed(&mut raw, dtype, ReduceKind::Max)?;
    assert_eq!(as_bytes(&typed), raw, "{}", what("spawn_all_reduce"));

    let mut typed = values.clone();
    group.reduce(1, &mut typed, ReduceKind::Min)?;
    let mut raw = bytes.clone();
    group.reduce_typed(1, &mut raw, dtype, ReduceKind::Min)?;
    assert_eq!(as_bytes(&typed), raw, "{}", what("reduce"));

    let typed = group.reduce_scatter(&values, ReduceKind::Sum)?;
    let raw = group.reduce_scatter_typed(&bytes, dtype, ReduceKind::Sum)?;
    assert_eq!(as_bytes(&typed), raw, "{}", what("reduce_scatter"));

    let typed = group.all_gather(&values)?;
    let raw = group.all_gather_typed(&bytes, dtype)?;
    assert_eq!(as_bytes(&typed), raw, "{}", what("all_gather"));
    let mut into = vec![T::zeroed(); values.len() * world as usize];
    group.all_gather_into(&values, &mut into)?;
    assert_eq!(as_bytes(&into), raw, "{}", what("all_gather_into"));

    let typed = group.gather(2, &values)?;
    let raw = group.gather_typed(2, &bytes, dtype)?;
    assert_eq!(typed.map(|t| as_bytes(&t)), raw, "{}", what("gather"));

    let root_values: Vec<T> = bytemuck::pod_collect_to_vec(&encoded(dtype, 9, 3 * world as usize));
    let send: &[T] = if me == 0 { &root_values } else { &[] };
    let mut typed = vec![T::zeroed(); 3];
    group.scatter(0, send, &mut typed)?;
    let send_raw = as_bytes(send);
    let mut raw = vec![0u8; 3 * dtype.size()];
    group.scatter_typed(0, &send_raw, &mut raw, dtype)?;
    assert_eq!(as_bytes(&typed), raw, "{}", what("scatter"));
    let raw_scatter = raw;

    let mut typed = values.clone();
    group.broadcast(2, &mut typed)?;
    let mut raw = bytes.clone();
    group.broadcast_typed(2, &mut raw, dtype)?;
    assert_eq!(as_bytes(&typed), raw, "{}", what("broadcast"));
    let raw_broadcast = raw;

    let blocks: Vec<T> = bytemuck::pod_collect_to_vec(&encoded(dtype, me, 2 * world as usize));
    let typed = group.all_to_all(&blocks)?;
    let raw = group.all_to_all_typed(&as_bytes(&blocks), dtype)?;
    assert_eq!(as_bytes(&typed), raw, "{}", what("all_to_all"));
    let raw_all_to_all = raw;

    // The non-blocking forms give what the blocking ones gave.
    let mut reduced = values.clone();
    group.reduce(0, &mut reduced, ReduceKind::Sum)?;
    let spawned = group
        .spawn_reduce(0, values.clone(), ReduceKind::Sum)
        .join()?;
    assert_eq!(
        as_bytes(&spawned),
        as_bytes(&reduced),
        "{}",
        what("spawn_reduce")
    );
    let blocking = group.reduce_scatter(&values, ReduceKind::Sum)?;
    let spawned = group
        .spawn_reduce_scatter(values.clone(), ReduceKind::Sum)
        .join()?;
    assert_eq!(
        as_bytes(&spawned),
        as_bytes(&blocking),
        "{}",
        what("spawn_reduce_scatter")
    );
    let spawned = group.spawn_all_gather(values.clone()).join()?;
    assert_eq!(as_bytes(&spawned), group.all_gather_typed(&bytes, dtype)?);
    let spawned = group.spawn_gather(2, values.clone()).join()?;
    assert_eq!(
        spawned.map(|t| as_bytes(&t)),
        group.gather_typed(2, &bytes, dtype)?
    );
    let spawned = group.spawn_scatter(0, send.to_vec(), 3).join()?;
    assert_eq!(as_bytes(&spawned), raw_scatter, "{}", what("spawn_scatter"));
    let spawned = group.spawn_broadcast(2, values.clone()).join()?;
    assert_eq!(
        as_bytes(&spawned),
        raw_broadcast,
        "{}",
        what("spawn_broadcast")
    );
    let spawned = group.spawn_all_to_all(blocks.clone()).join()?;
    assert_eq!(
        as_bytes(&spawned),
        raw_all_to_all,
        "{}",
        what("spawn_all_to_all")
    );

    // A ring of point-to-point hand-offs: recv, then recv_into a larger buffer.
    let next = (me + 1) % world;
    let prev = (me + world - 1) % world;
    group.send(next, 3, &values)?;
    group.send(next, 3, &values)?;
    let got: Vec<T> = group.recv(prev, 3)?;
    assert_eq!(as_bytes(&got), encoded(dtype, prev, 7), "{}", what("recv"));
    let mut buf = vec![T::zeroed(); 10];
    let n = group.recv_into(prev, 3, &mut buf)?;
    assert_eq!(n, 7, "{}", what("recv_into"));
    assert_eq!(
        as_bytes(&buf[..n]),
        encoded(dtype, prev, 7),
        "{}",
        what("recv_into")
    );
    group.barrier()
}

fn compare<T: Element>() {
    for result in common::on_each(common::world(3), |group| compare_on::<T>(&group)) {
        result.unwrap();
    }
}

#[test]
fn every_element_type_matches_the_byte_level_forms() {
    compare::<f32>();
    compare::<f64>();
    compare::<f16>();
    compare::<bf16>();
    compare::<i8>();
    compare::<u8>();
    compare::<i32>();
    compare::<i64>();
}

#[test]
fn a_message_too_long_for_recv_into_is_a_length_mismatch() {
    let results = common::on_each(common::world(2), |group| {
        if group.rank() == 0 {
            group.send(1, 4, &[1i32, 2, 3])?;
            return Ok(None);
        }
        let mut buf = [0i32; 2];
        Ok::<_, CollectiveError>(Some(group.recv_into(0, 4, &mut buf)))
    });
    let mut results = results.into_iter();
    assert!(matches!(results.next(), Some(Ok(None))));
    match results.next() {
        Some(Ok(Some(Err(CollectiveError::LengthMismatch { expected, got, .. })))) => {
            assert_eq!((expected, got), (8, 12));
        }
        other => panic!("expected a LengthMismatch, got {other:?}"),
    }
}
