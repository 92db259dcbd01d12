//! `MlxTransport` on MLX's `mpi` backend: 2 ranks under `mpirun` (Open MPI), when it is
//! installed, including a split of the world. A test binary of its own, so that it does not
//! share the machine with the ring tests running in parallel.

#![cfg(feature = "mlx")]

mod cluster;

use half::f16;
use rlx_mlx_ffi::MlxTransport;
use rlx_transport::{DType, ReduceKind, Transport};

/// Point-to-point, native f16 sums on both the direct-exchange and the MLX path, against a
/// serial reference, and a barrier.
fn mpi_body(t: &MlxTransport) {
    assert_eq!(t.world_size(), 2);
    let me = t.rank();
    t.send_bytes(1 - me, 4, &[me as u8; 1000]).unwrap();
    assert_eq!(t.recv_bytes(1 - me, 4).unwrap(), vec![(1 - me) as u8; 1000]);
    let native = t.native_collectives().unwrap();
    let value = |rank: u32, j: usize| ((j * 3 + rank as usize * 7) % 50) as f32 - 20.0;
    // The default limit exchanges every count directly; then everything through MLX's own.
    for (count, direct_max) in [0usize, 1, 3, 1000, 70_001]
        .into_iter()
        .flat_map(|count| [(count, usize::MAX), (count, 0)])
    {
        t.set_direct_exchange_max(direct_max);
        let mut data: Vec<u8> = (0..count)
            .flat_map(|j| f16::from_f32(value(me, j)).to_le_bytes())
            .collect();
        native
            .all_reduce(&mut data, DType::F16, ReduceKind::Sum)
            .unwrap();
        let expected: Vec<u8> = (0..count)
            .flat_map(|j| f16::from_f32(value(0, j) + value(1, j)).to_le_bytes())
            .collect();
        assert!(
            data == expected,
            "sum of {count} f16 (direct limit {direct_max})"
        );
    }
    t.barrier().unwrap();

    // MPI can split: the same two ranks in the opposite order form a world of their own, whose
    // point-to-point and native collectives work beside the parent's.
    let sub = t.split(0, 1 - me as i32).unwrap();
    assert_eq!((sub.rank(), sub.world_size()), (1 - me, 2));
    let other = 1 - sub.rank();
    sub.send_bytes(other, 4, &[sub.rank() as u8; 5]).unwrap();
    assert_eq!(sub.recv_bytes(other, 4).unwrap(), vec![other as u8; 5]);
    // Through MLX's collective on the split group.
    sub.set_direct_exchange_max(0);
    let mut data = f32::from(sub.rank() as u16 + 1)
        .to_le_bytes()
        .repeat(70_001);
    sub.native_collectives()
        .unwrap()
        .all_reduce(&mut data, DType::F32, ReduceKind::Sum)
        .unwrap();
    assert!(data == 3.0f32.to_le_bytes().repeat(70_001));
    sub.barrier().unwrap();
    drop(sub);
    t.barrier().unwrap();
}

#[test]
fn mpi_two_ranks() {
    if !cluster::mpi("mpi_two_ranks", mpi_body) {
        eprintln!("mpirun is not installed: the MPI backend was not exercised");
    }
}
