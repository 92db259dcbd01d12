//! `all_reduce_compressed` between real processes over loopback TCP: the test re-executes its
//! own binary as three ranks that rendezvous through the environment (as `cargo xtask launch`
//! starts them), each checks every format against an f64 reference and the bit-identity of
//! its results with the other ranks', and that a rank passing another format makes every rank
//! fail with `InvalidArgument` while the group stays usable. The parent bounds the job's time
//! and reaps every process.

#![cfg(feature = "tcp")]

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rlx_collective::{CollectiveError, Compression, Compressor, ProcessGroup, ReduceKind};

/// Set in the re-executed binary: the rank's role.
const ROLE: &str = "RLX_COMPRESSED_TCP_WORKER";

/// The name of the test, which the ranks run with `--exact`.
const TEST: &str = "compressed_all_reduce_between_tcp_processes";

/// Ranks of the job.
const RANKS: u32 = 3;

/// How long the whole job may take before the parent kills it.
const JOB_TIMEOUT: Duration = Duration::from_secs(120);

/// A deterministic input of `rank`.
fn input(rank: u32, count: usize) -> Vec<f32> {
    (0..count)
        .map(|i| (i as f32 * 0.173 + rank as f32).cos() * (1 + (i + rank as usize) % 50) as f32)
        .collect()
}

/// One rank's checks; a panic fails the rank's process.
fn worker() {
    let group = rlx_collective::init().expect("joining the TCP group");
    let (rank, n) = (group.rank(), group.world_size());
    // 300 000 elements are several pipeline segments per block.
    for count in [0usize, 1, 1031, 300_000] {
        let inputs: Vec<Vec<f32>> = (0..n).map(|r| input(r, count)).collect();
        for compression in Compression::ALL {
            let mut data = inputs[rank as usize].clone();
            let mut compressor = Compressor::new(compression);
            group
                .all_reduce_compressed(&mut data, ReduceKind::Sum, &mut compressor)
                .unwrap_or_else(|e| panic!("{compression} count {count}: {e}"));
            let relative = match compression {
                Compression::None => 1e-6,
                Compression::Bf16 => 1.0 / 256.0,
                Compression::Fp16 => 1.0 / 2048.0,
                _ => 1.0 / 254.0,
            };
            // Every hop's partial sum is below the sum of magnitudes of the inputs, and int8
            // scales by the block's largest (at most 50 per input here).
            for (i, &got) in data.iter().enumerate() {
                let exact: f64 = inputs.iter().map(|x| f64::from(x[i])).sum();
                let magnitude = if compression == Compression::Int8 {
                    50.0 * f64::from(n)
                } else {
                    inputs.iter().map(|x| f64::from(x[i].abs())).sum()
                };
                let allowed = f64::from(n) * magnitude * relative * 1.01 + 1e-5;
                assert!(
                    (f64::from(got) - exact).abs() <= allowed,
                    "rank {rank} {compression} count {count} element {i}: {got} vs {exact}"
                );
            }
            assert_identical(&group, &data, compression, count);
        }
    }
    // The last rank asks for another format: every rank refuses, and the next call works.
    let format = if rank == n - 1 {
        Compression::Int8
    } else {
        Compression::Bf16
    };
    let mut data = input(rank, 500);
    let error = group
        .all_reduce_compressed(&mut data, ReduceKind::Sum, &mut Compressor::new(format))
        .unwrap_err();
    assert!(
        matches!(error, CollectiveError::InvalidArgument { .. }),
        "rank {rank}: {error}"
    );
    let mut ones = [1.0f32; 3];
    group
        .all_reduce_compressed(
            &mut ones,
            ReduceKind::Sum,
            &mut Compressor::new(Compression::Bf16),
        )
        .unwrap_or_else(|e| panic!("rank {rank}: the group is unusable after a mismatch: {e}"));
    assert_eq!(ones, [n as f32; 3], "rank {rank}");
}

/// Checks that every rank holds the same bits in `data`, through a plain all-gather of each
/// rank's hash of them.
fn assert_identical(group: &ProcessGroup, data: &[f32], compression: Compression, count: usize) {
    let hash = data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, x| {
        (h ^ u64::from(x.to_bits())).wrapping_mul(0x0000_0100_0000_01b3)
    });
    let all = group.all_gather(&[hash as i64]).unwrap();
    assert!(
        all.iter().all(|&h| h == hash as i64),
        "{compression} count {count}: results differ between ranks: {all:x?}"
    );
}

/// Reads what a finished child wrote.
fn output(child: &mut Child) -> String {
    let mut text = String::new();
    if let Some(out) = child.stdout.as_mut() {
        let _ = out.read_to_string(&mut text);
    }
    if let Some(err) = child.stderr.as_mut() {
        let _ = err.read_to_string(&mut text);
    }
    text
}

#[test]
fn compressed_all_reduce_between_tcp_processes() {
    if std::env::var_os(ROLE).is_some() {
        worker();
        return;
    }
    let port = rlx_transport::ports::free_loopback_ports(1).unwrap()[0];
    let exe = std::env::current_exe().unwrap();
    let mut children: Vec<Child> = (0..RANKS)
        .map(|rank| {
            Command::new(&exe)
                .args(["--exact", TEST, "--nocapture", "--test-threads=1"])
                .env(ROLE, "1")
                .env("RLX_RANK", rank.to_string())
                .env("RLX_WORLD_SIZE", RANKS.to_string())
                .env("RLX_MASTER_ADDR", "127.0.0.1")
                .env("RLX_MASTER_PORT", port.to_string())
                .env("RLX_TIMEOUT_MS", "60000")
                .env_remove("RLX_HOSTFILE")
                .env_remove("RLX_BACKEND")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let started = Instant::now();
    let mut statuses = vec![None; children.len()];
    while statuses.iter().any(Option::is_none) && started.elapsed() < JOB_TIMEOUT {
        for (child, status) in children.iter_mut().zip(statuses.iter_mut()) {
            if status.is_none() {
                *status = child.try_wait().unwrap();
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut failures = Vec::new();
    for (rank, (child, status)) in children.iter_mut().zip(&statuses).enumerate() {
        if status.is_none() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if !status.is_some_and(|s| s.success()) {
            failures.push(format!(
                "rank {rank} ({}):\n{}",
                status.map_or("killed at the timeout".to_owned(), |s| s.to_string()),
                output(child)
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
