//! Two ranks on loopback, as two processes: 8-byte ping-pong latency (median round trip / 2)
//! and one-way bandwidth at 512 KiB, 2 MiB, 32 MiB and 256 MiB, with every byte checked once
//! per size, next to `iperf3 -c 127.0.0.1` when iperf3 is installed.
//!
//! `cargo run --release -p rlx-net --example tcp_pingpong`; the example starts its second
//! rank by re-executing itself.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rlx_net::TcpTransport;
use rlx_transport::{Tag, Transport};

const ROLE: &str = "RLX_PINGPONG_RANK";
const SIZES: &[usize] = &[512 << 10, 2 << 20, 32 << 20, 256 << 20];

fn fill(buf: &mut [u8], seed: u8) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(31).wrapping_add(seed);
    }
}

fn rank_main(rank: u32, port: u16) -> Result<(), Box<dyn std::error::Error>> {
    let t = TcpTransport::builder()
        .rank(rank)
        .world_size(2)
        .master("127.0.0.1", port)
        .connect_timeout(Duration::from_secs(20))
        .spin(Duration::from_micros(
            std::env::var(rlx_net::env::SPIN_US)
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(50),
        ))
        .build()?;
    let peer = 1 - rank;
    let tag = Tag::user(1)?;
    let timeout = Duration::from_secs(60);
    let mut small = [0u8; 8];

    // Latency: rank 0 sends, rank 1 echoes.
    // RLX_PINGPONG_ITERS=0 skips the latency phase (for profiling the bandwidth sweep).
    let iters: usize = std::env::var("RLX_PINGPONG_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let mut samples = Vec::with_capacity(iters);
    let warmup = if iters == 0 { 0 } else { 1000 };
    for i in 0..iters + warmup {
        if rank == 0 {
            let start = Instant::now();
            t.send_message(peer, tag, &[&small])?;
            t.recv_message_into(peer, tag, &mut small, timeout)?;
            if i >= warmup {
                samples.push(start.elapsed());
            }
        } else {
            t.recv_message_into(peer, tag, &mut small, timeout)?;
            t.send_message(peer, tag, &[&small])?;
        }
    }
    if rank == 0 && !samples.is_empty() {
        samples.sort();
        let median = samples[samples.len() / 2];
        println!(
            "8 B ping-pong: median one-way latency {:.2} us (round trip {:.2} us, p99 rt {:.2} us)",
            median.as_secs_f64() * 1e6 / 2.0,
            median.as_secs_f64() * 1e6,
            samples[samples.len() * 99 / 100].as_secs_f64() * 1e6
        );
    }

    // Bandwidth: rank 0 sends `reps` messages, rank 1 receives into one buffer and acks.
    // RLX_PINGPONG_SIZES=33554432,... restricts the sweep (for profiling one size).
    let sizes: Vec<usize> = match std::env::var("RLX_PINGPONG_SIZES") {
        Ok(list) => list
            .split(',')
            .filter_map(|v| v.trim().parse().ok())
            .collect(),
        Err(_) => SIZES.to_vec(),
    };
    for &size in &sizes {
        let reps = ((1usize << 30) / size).clamp(8, 400);
        let mut buf = vec![0u8; size];
        // Touch every page first, on both sides, so the timing measures transfers and not
        // first-touch page faults (applications reuse their buffers).
        fill(&mut buf, if rank == 0 { 7 } else { 1 });
        t.barrier()?;
        let start = Instant::now();
        for _ in 0..reps {
            if rank == 0 {
                t.send_message(peer, tag, &[&buf])?;
            } else {
                t.recv_message_into(peer, tag, &mut buf, timeout)?;
            }
        }
        if rank == 0 {
            t.recv_message_into(peer, tag, &mut small, timeout)?;
            let secs = start.elapsed().as_secs_f64();
            println!(
                "one-way {:>4} MiB x {reps:>3}: {:.2} GB/s",
                size as f64 / (1 << 20) as f64,
                (size * reps) as f64 / secs / 1e9
            );
        } else {
            let mut want = vec![0u8; size];
            fill(&mut want, 7);
            if buf != want {
                return Err(format!("wrong bytes at size {size}").into());
            }
            t.send_message(peer, tag, &[&small])?;
        }
    }
    Ok(())
}

fn iperf3() {
    let Ok(mut server) = Command::new("iperf3")
        .args(["-s", "-1", "-p", "5299"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
    else {
        println!("iperf3: not installed");
        return;
    };
    std::thread::sleep(Duration::from_millis(300));
    let out = Command::new("iperf3")
        .args(["-c", "127.0.0.1", "-p", "5299", "-t", "5", "-f", "g"])
        .output();
    let _ = server.wait();
    match out {
        Ok(out) => {
            let text = String::from_utf8_lossy(&out.stdout);
            for line in text.lines().filter(|l| l.contains("receiver")) {
                println!("iperf3 -c 127.0.0.1 (one stream): {}", line.trim());
            }
        }
        Err(e) => println!("iperf3: {e}"),
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if let Ok(spec) = std::env::var(ROLE) {
        let (rank, port) = spec.split_once(':').ok_or("bad role")?;
        return rank_main(rank.parse()?, port.parse()?);
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let exe = std::env::current_exe()?;
    let mut peer = Command::new(&exe).env(ROLE, format!("1:{port}")).spawn()?;
    if std::env::var_os("RLX_PINGPONG_NO_IPERF").is_some() {
        let result = rank_main(0, port);
        peer.wait()?;
        return result;
    }
    let result = rank_main(0, port);
    let status = peer.wait()?;
    result?;
    if !status.success() {
        return Err("rank 1 failed".into());
    }
    iperf3();
    Ok(())
}
