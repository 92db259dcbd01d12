//! `MlxTransport` on MLX's `mpi` backend: 2 ranks under `mpirun` (Open MPI), including a split
//! of the world. A test binary of its own, so that it does not share the machine with the ring
//! tests running in parallel.
//!
//! Its runner is libtest-mimic (`harness = false`), so that a machine without `mpirun` shows
//! the test as ignored with that reason (under `CI=true`, where CI installs Open MPI, a
//! failure instead), and a build without the `mlx` feature shows it as ignored too.

#[cfg(feature = "mlx")]
mod cluster;

use libtest_mimic::{Arguments, Trial};

#[cfg(feature = "mlx")]
use half::f16;
#[cfg(feature = "mlx")]
use rlx_mlx_ffi::MlxTransport;
#[cfg(feature = "mlx")]
use rlx_transport::{DType, ReduceKind, Transport};

/// Point-to-point, native f16 sums on both the direct-exchange and the MLX path, against a
/// serial reference, and a barrier.
#[cfg(feature = "mlx")]
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

/// The test where this build has the backend: it runs, or on a machine without `mpirun`
/// shows as ignored with the reason (a failure under `CI=true`, where CI installs Open MPI).
#[cfg(feature = "mlx")]
fn trial(name: &'static str, in_ci: bool) -> Trial {
    if cluster::mpirun().is_some() {
        return Trial::test(name, move || {
            cluster::mpi(name, mpi_body);
            Ok(())
        });
    }
    let reason = "needs Open MPI's mpirun (apt-get install openmpi-bin libopenmpi-dev)";
    if in_ci {
        return Trial::test(name, move || {
            Err(libtest_mimic::Failed::from(format!(
                "CI=true, yet this test cannot run here: {reason}"
            )))
        });
    }
    Trial::test(name, || Ok(()))
        .with_ignored_flag(true)
        .with_kind(format!("skipped: {reason}"))
}

/// Without the `mlx` feature the backend is not built: the test is ignored, under CI too,
/// whose MLX step builds the feature and runs it.
#[cfg(not(feature = "mlx"))]
fn trial(name: &'static str, _in_ci: bool) -> Trial {
    Trial::test(name, || Ok(()))
        .with_ignored_flag(true)
        .with_kind("skipped: built without the `mlx` feature")
}

fn main() {
    let in_ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
    let mut args = Arguments::from_args();
    args.test_threads.get_or_insert(1);
    libtest_mimic::run(&args, vec![trial("mpi_two_ranks", in_ci)]).exit()
}
