//! A program started without a launcher: `rlx_collective::init()` with none of the rank,
//! world size, hostfile or master address variables set runs as a world of one rank (as MPI
//! and MLX run a program started on its own), and its collectives return their input.
//!
//! The test re-executes its own binary with every launch variable removed from the
//! environment, so that whatever launched the test run cannot leak into the check.

#![cfg(feature = "tcp")]

use std::process::Command;

use rlx_collective::{ReduceKind, bf16};
use rlx_transport::bootstrap::{RANK_VARS, WORLD_SIZE_VARS};
use rlx_transport::env::{HOSTFILE, MASTER_ADDR, MASTER_PORT};

/// Set in the re-executed copy of this test binary.
const CHILD: &str = "RLX_STANDALONE_TEST_CHILD";
/// The test that re-executes itself, as libtest names it.
const TEST: &str = "init_without_a_launcher_is_a_world_of_one";

/// What the re-executed copy runs: `init()` and one of each kind of call on the world of one.
fn child() {
    let group = rlx_collective::init().expect("init() without a launcher");
    assert_eq!((group.rank(), group.world_size()), (0, 1));
    let mut grads = vec![bf16::from_f32(1.5); 7];
    group
        .all_reduce(&mut grads, ReduceKind::Sum)
        .expect("all_reduce");
    assert_eq!(grads, vec![bf16::from_f32(1.5); 7]);
    let pending = group.spawn_all_reduce(vec![2.0f32; 3], ReduceKind::Mean);
    assert_eq!(pending.join().expect("spawn_all_reduce"), vec![2.0; 3]);
    let mut weights = [3i64; 5];
    group.broadcast(0, &mut weights).expect("broadcast");
    assert_eq!(weights, [3; 5]);
    group.barrier().expect("barrier");
    println!("standalone world of one: ok");
}

#[test]
fn init_without_a_launcher_is_a_world_of_one() {
    if std::env::var_os(CHILD).is_some() {
        child();
        return;
    }
    let mut command = Command::new(std::env::current_exe().expect("this test binary"));
    command.args(["--exact", TEST, "--nocapture", "--test-threads=1"]);
    let placing = [
        HOSTFILE,
        "MLX_HOSTFILE",
        MASTER_ADDR,
        MASTER_PORT,
        "MASTER_ADDR",
    ];
    for name in RANK_VARS.iter().chain(WORLD_SIZE_VARS).chain(&placing) {
        command.env_remove(name);
    }
    let out = command.env(CHILD, "1").output().expect("the child ran");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("standalone world of one: ok"),
        "status {}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}
