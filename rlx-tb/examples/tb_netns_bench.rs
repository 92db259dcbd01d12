//! Latency and bandwidth of the Thunderbolt transport between two network namespaces joined by
//! `thunderbolt0` veth links that `tbf` limits to 20 Gbit/s (about what TCP reaches over
//! Thunderbolt 4), next to `iperf3` over the same links in the same run: the 8 B round trip of
//! send/receive and of a heap get, and the bandwidth of sends, puts and gets of 32 MiB, with
//! the bytes of every kind of transfer checked.
//!
//! `cargo run --release -p rlx-tb --example tb_netns_bench` as root (namespaces and qdiscs);
//! the example starts its ranks by re-executing itself inside the namespaces.

#[allow(
    dead_code,
    reason = "the example uses only part of the tests' namespace harness"
)]
#[path = "../tests/netns/mod.rs"]
mod netns;

use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use netns::{Net, Shape, run, v4};
use rlx_tb::ThunderboltTransport;
use rlx_transport::symmetric::SymmetricTransport;
use rlx_transport::{CollectiveError, Result, Transport};

const MODE_ENV: &str = "RLX_TB_BENCH_MODE";
const LEN: usize = 32 << 20;
const REPS: usize = 16;
const ROUND_TRIPS: usize = 3000;
const WARMUP: usize = 300;

fn pattern(seed: u8) -> Vec<u8> {
    (0..LEN)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn median_us(mut samples: Vec<Duration>) -> f64 {
    samples.sort();
    samples
        .get(samples.len() / 2)
        .map_or(0.0, |d| d.as_secs_f64() * 1e6)
}

fn gbit_per_s(bytes: usize, elapsed: Duration) -> f64 {
    bytes as f64 * 8.0 / elapsed.as_secs_f64() / 1e9
}

/// Both ranks: rank 0 drives every measurement, rank 1 answers (its heap service serves the
/// one-sided operations while it waits in a barrier) and checks what rank 0 put.
fn rank_main() -> Result<()> {
    let heap = ThunderboltTransport::from_env()?.with_heap((LEN + 4096) as u64)?;
    let me = heap.rank();
    let peer = 1 - me;
    let region = heap.alloc(LEN as u64)?;
    let word = heap.alloc(8)?;
    let mut results = Vec::new();

    // Send/receive ping-pong of 8 bytes.
    let mut samples = Vec::with_capacity(ROUND_TRIPS);
    for i in 0..WARMUP + ROUND_TRIPS {
        let start = Instant::now();
        if me == 0 {
            heap.send_bytes(peer, 1, &[7u8; 8])?;
            heap.recv_bytes(peer, 1)?;
        } else {
            let got = heap.recv_bytes(peer, 1)?;
            heap.send_bytes(peer, 1, &got)?;
        }
        if i >= WARMUP {
            samples.push(start.elapsed());
        }
    }
    results.push(format!(
        "send/recv 8 B round trip {:.1} us",
        median_us(samples)
    ));

    // Heap get of 8 bytes.
    heap.barrier()?;
    if me == 0 {
        let mut samples = Vec::with_capacity(ROUND_TRIPS);
        let mut buf = [0u8; 8];
        for i in 0..WARMUP + ROUND_TRIPS {
            let start = Instant::now();
            heap.get(peer, word.offset(), &mut buf)?;
            if i >= WARMUP {
                samples.push(start.elapsed());
            }
        }
        results.push(format!("get 8 B round trip {:.1} us", median_us(samples)));
    }
    heap.barrier()?;

    // One-way sends of 32 MiB, acknowledged at the end.
    let data = pattern(me as u8);
    let expected = pattern(peer as u8);
    let start = Instant::now();
    for _ in 0..REPS {
        if me == 0 {
            heap.send_bytes(peer, 2, &data)?;
        } else {
            let got = heap.recv_bytes(peer, 2)?;
            if got != expected {
                return Err(CollectiveError::invalid("a 32 MiB message arrived wrong"));
            }
        }
    }
    if me == 1 {
        heap.send_bytes(peer, 3, &[])?;
    } else {
        heap.recv_bytes(peer, 3)?;
        results.push(format!(
            "send 32 MiB {:.2} Gbit/s",
            gbit_per_s(LEN * REPS, start.elapsed())
        ));
    }

    // Puts of 32 MiB into rank 1's heap, then gets of them back.
    heap.barrier()?;
    if me == 0 {
        let start = Instant::now();
        for _ in 0..REPS {
            heap.put(peer, region.offset(), &data)?;
        }
        results.push(format!(
            "put 32 MiB {:.2} Gbit/s",
            gbit_per_s(LEN * REPS, start.elapsed())
        ));
        let mut back = vec![0u8; LEN];
        let start = Instant::now();
        for _ in 0..REPS {
            heap.get(peer, region.offset(), &mut back)?;
        }
        results.push(format!(
            "get 32 MiB {:.2} Gbit/s",
            gbit_per_s(LEN * REPS, start.elapsed())
        ));
        if back != data {
            return Err(CollectiveError::invalid(
                "a 32 MiB get returned wrong bytes",
            ));
        }
    }
    heap.barrier()?;
    if me == 1 {
        let mut landed = vec![0u8; LEN];
        heap.heap().read(region.offset(), &mut landed)?;
        if landed != pattern(0) {
            return Err(CollectiveError::invalid("the 32 MiB puts landed wrong"));
        }
        println!("DONE");
    } else {
        println!("RESULTS {}", results.join("; "));
    }
    heap.barrier()
}

/// iperf3 from rank 0's namespace to rank 1's over `thunderbolt0`, in Gbit/s as the receiver
/// counted it.
fn iperf3(net: &Net) -> std::result::Result<String, String> {
    let (Some(client), Some(server)) = (&net.ranks[0], &net.ranks[1]) else {
        return Err("the ranks have no namespaces".to_owned());
    };
    let mut server = Command::new("ip")
        .args(["netns", "exec", server, "iperf3", "-s", "-1"])
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| format!("iperf3 -s: {e}"))?;
    let mut report = Err("iperf3 never connected".to_owned());
    for _ in 0..50 {
        std::thread::sleep(Duration::from_millis(100));
        report = run(
            "ip",
            &[
                "netns",
                "exec",
                client,
                "iperf3",
                "-c",
                &v4(0, 1),
                "-t",
                "3",
                "-f",
                "g",
            ],
        );
        if report.is_ok() {
            break;
        }
    }
    let _ = server.kill();
    let _ = server.wait();
    let report = report?;
    report
        .lines()
        .find(|l| l.contains("receiver"))
        .and_then(|l| {
            l.split_whitespace()
                .skip_while(|w| *w != "GBytes" && *w != "MBytes")
                .nth(1)
        })
        .map(|rate| format!("iperf3 {rate} Gbit/s"))
        .ok_or_else(|| format!("no receiver line in {report}"))
}

fn parent() -> std::result::Result<(), String> {
    let mut net = Net::create(&Shape {
        ranks: 2,
        links: 1,
        other: false,
        without_thunderbolt: None,
    })?;
    for ns in net.ranks.iter().flatten() {
        run(
            "ip",
            &[
                "netns",
                "exec",
                ns,
                "tc",
                "qdisc",
                "add",
                "dev",
                "thunderbolt0",
                "root",
                "tbf",
                "rate",
                "20gbit",
                "burst",
                "16mb",
                "latency",
                "10ms",
            ],
        )?;
    }
    println!("thunderbolt0 veth links limited by tbf to 20 Gbit/s");
    println!("{}", iperf3(&net)?);
    let mut job = net.launch(MODE_ENV, "rank", |_| {
        vec![
            ("RLX_MASTER_ADDR".to_owned(), v4(0, 0)),
            ("RLX_MASTER_PORT".to_owned(), "29500".to_owned()),
        ]
    })?;
    let said = net.first_lines(&mut job)?;
    net.finish(&mut job)?;
    for result in said[0].trim_start_matches("RESULTS ").split("; ") {
        println!("{result}");
    }
    println!("{}", iperf3(&net)?);
    Ok(())
}

fn main() -> ExitCode {
    if std::env::var(MODE_ENV).is_ok() {
        return match rank_main() {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("rank: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if let Some(reason) = netns::unavailable() {
        eprintln!("tb_netns_bench cannot create network namespaces and qdiscs: {reason}");
        return ExitCode::FAILURE;
    }
    match parent() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tb_netns_bench: {e}");
            ExitCode::FAILURE
        }
    }
}
