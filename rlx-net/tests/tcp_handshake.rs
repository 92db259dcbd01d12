//! Refusals: while a 4-rank job bootstraps on fixed ports, raw TCP clients send garbage, an
//! oversized length, a wrong magic, a wrong job id, a wrong world size and a duplicate rank,
//! and a second process claims rank 2. Each is refused with a reason (and logged), the
//! impostor process fails with a clear error, and the job completes. After a handshake, a
//! frame longer than the cap is a protocol error naming the length and the cap. The hostile
//! clients hand-craft the documented wire layout (`src/handshake.rs`, `src/frame.rs`).

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{
    PROTOCOL_VERSION, assert_all_ok, free_port, hello, spawn, wait_all, wait_established,
};
use rlx_transport::{CollectiveError, Transport};

const JOB: &str = "refusal-test";

fn worker(role: &str) -> Result<(), String> {
    match role {
        "ring" => {
            let t = common::from_env()?;
            common::ring_check(&t)
        }
        "expect-oversize" => {
            let t = common::from_env()?;
            match t.recv_bytes(1, 0) {
                Err(CollectiveError::Protocol {
                    peer: Some(1),
                    detail,
                }) => {
                    println!("protocol error: {detail}");
                    Ok(())
                }
                other => Err(format!("expected a protocol error, got {other:?}")),
            }
        }
        other => Err(format!("unknown role {other}")),
    }
}

fn connect(port: u16) -> TcpStream {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => {
                s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
                return s;
            }
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("cannot connect to port {port}: {e}"),
        }
    }
}

/// Sends `bytes` as a stranger and returns the refusal's code and reason.
fn refused(port: u16, bytes: &[u8]) -> (u32, String) {
    let mut s = connect(port);
    s.write_all(bytes).unwrap();
    let mut fixed = [0u8; 74];
    s.read_exact(&mut fixed).expect("a reply to the stranger");
    assert_eq!(&fixed[0..8], b"RLXTCP\r\n");
    let code = u32::from_le_bytes(fixed[12..16].try_into().unwrap());
    let len = u16::from_le_bytes([fixed[72], fixed[73]]) as usize;
    let mut reason = vec![0u8; len];
    s.read_exact(&mut reason).unwrap();
    let reason = String::from_utf8_lossy(&reason).into_owned();
    // The acceptor closes the connection after refusing.
    let mut rest = [0u8; 1];
    assert!(matches!(s.read(&mut rest), Ok(0) | Err(_)));
    (code, reason)
}

fn hostfile(ports: &[u16]) -> String {
    let entries: Vec<String> = ports
        .iter()
        .map(|p| format!("[\"127.0.0.1:{p}\"]"))
        .collect();
    format!("[{}]", entries.join(","))
}

fn env(rank: u32, hostfile: &str) -> Vec<(String, String)> {
    vec![
        ("RLX_RANK".into(), rank.to_string()),
        ("RLX_HOSTFILE".into(), hostfile.to_owned()),
        ("RLX_JOB_ID".into(), JOB.into()),
        ("RLX_TIMEOUT_MS".into(), "40000".into()),
    ]
}

fn strangers_are_refused_while_the_job_completes() {
    let ports: Vec<u16> = (0..4).map(|_| free_port()).collect();
    let hf = hostfile(&ports);
    let mut children = common::Reaper::default();
    for rank in 0..3 {
        children.0.push(spawn("ring", &env(rank, &hf)));
    }
    // Rank 3 starts only after every stranger has been turned away, so rank 0 is still
    // accepting. Rank 2 connects to rank 0, then to rank 1 once that handshake is over
    // (`src/bootstrap/connect.rs`), and rank 0 answers a hello only once it has claimed the
    // connector's link: a connection to rank 1's listener (nobody else connects there yet)
    // shows that rank 0 holds rank 2's link, which the duplicate below must find taken.
    wait_established(ports[1], 1);

    let (code, reason) = refused(ports[0], &[0xAB; 72]);
    assert!(
        code != 0 && reason.contains("magic"),
        "garbage: {code} {reason}"
    );

    let mut oversized = [0u8; 72];
    oversized[0] = 1;
    oversized[24..32].copy_from_slice(&u64::MAX.to_le_bytes());
    oversized[40..48].copy_from_slice(&u64::MAX.to_le_bytes());
    let (code, reason) = refused(ports[0], &oversized);
    assert!(
        code != 0 && reason.contains("magic"),
        "oversized: {code} {reason}"
    );

    let mut wrong_magic = hello(JOB, 4, 3);
    wrong_magic[3] = b'X';
    let (code, reason) = refused(ports[0], &wrong_magic);
    assert!(
        code != 0 && reason.contains("magic"),
        "magic: {code} {reason}"
    );

    // A peer of the previous protocol (whose store registrations have no room for a proof of
    // the job secret).
    let mut old_version = hello(JOB, 4, 3);
    old_version[8..12].copy_from_slice(&(PROTOCOL_VERSION - 1).to_le_bytes());
    let (code, reason) = refused(ports[0], &old_version);
    assert!(
        code != 0 && reason.contains("protocol version"),
        "version: {code} {reason}"
    );

    let (code, reason) = refused(ports[0], &hello("another-job", 4, 3));
    assert!(
        code != 0 && reason.contains("job id"),
        "job: {code} {reason}"
    );

    let (code, reason) = refused(ports[1], &hello(JOB, 5, 3));
    assert!(
        code != 0 && reason.contains("world size 5"),
        "world: {code} {reason}"
    );

    let (code, reason) = refused(ports[0], &hello(JOB, 4, 2));
    assert!(
        code != 0 && reason.contains("duplicate rank 2"),
        "duplicate: {code} {reason}"
    );

    // A second process that believes it is rank 2 (listening elsewhere) is refused by rank 0,
    // the first rank it connects to.
    let mut impostor_ports = ports.clone();
    impostor_ports[2] = free_port();
    let impostor = spawn("ring", &env(2, &hostfile(&impostor_ports)));
    let impostor = wait_all(vec![impostor], Duration::from_secs(60));
    assert!(!impostor[0].ok, "{impostor:#?}");
    assert!(
        impostor[0].stdout.contains("duplicate rank 2"),
        "{impostor:#?}"
    );

    children.0.push(spawn("ring", &env(3, &hf)));
    let done = wait_all(children.take(), Duration::from_secs(60));
    assert_all_ok(&done);
    for (rank, f) in done.iter().enumerate() {
        assert!(
            f.stdout.contains(&format!("ok rank {rank} of 4")),
            "{done:#?}"
        );
    }
    let log = &done[0].stderr;
    for needle in ["wrong magic", "job id", "duplicate rank 2"] {
        assert!(log.contains(needle), "rank 0 should log {needle:?}: {log}");
    }
}

fn store_refuses_strangers() {
    let port = free_port();
    let mut children = common::Reaper::default();
    for rank in 0..2u32 {
        let e = common::rlx_env(rank, 3, "127.0.0.1", port);
        children.0.push(spawn("ring", &e));
    }
    let mut s = connect(port);
    s.write_all(&[0x55; 64]).unwrap();
    let mut magic = [0u8; 8];
    s.read_exact(&mut magic).unwrap();
    assert_eq!(&magic, b"RLXSTOR\n");
    let mut status = [0u8; 4];
    s.read_exact(&mut status).unwrap();
    assert_ne!(u32::from_le_bytes(status), 0);
    // The last rank registers only now, so the store was still open for the stranger.
    let e = common::rlx_env(2, 3, "127.0.0.1", port);
    children.0.push(spawn("ring", &e));
    let done = wait_all(children.take(), Duration::from_secs(60));
    assert_all_ok(&done);
    assert!(done[0].stderr.contains("wrong magic"), "{done:#?}");
}

fn oversized_frame_after_handshake() {
    let ports = [free_port(), free_port()];
    let hf = hostfile(&ports);
    let mut e = env(0, &hf);
    e.push(("RLX_MAX_FRAME_BYTES".into(), "1048576".into()));
    let child = spawn("expect-oversize", &e);
    let mut s = connect(ports[0]);
    s.write_all(&hello(JOB, 2, 1)).unwrap();
    let mut fixed = [0u8; 74];
    s.read_exact(&mut fixed).unwrap();
    assert_eq!(
        u32::from_le_bytes(fixed[12..16].try_into().unwrap()),
        0,
        "accepted"
    );
    common::exchange_networks(&mut s);
    let mut frame = [0u8; 48];
    frame[0] = 1;
    frame[24..32].copy_from_slice(&1_048_577u64.to_le_bytes());
    frame[40..48].copy_from_slice(&1_048_577u64.to_le_bytes());
    s.write_all(&frame).unwrap();
    let done = wait_all(vec![child], Duration::from_secs(60));
    assert_all_ok(&done);
    let out = &done[0].stdout;
    assert!(out.contains("1048577") && out.contains("1048576"), "{out}");
}

fn main() {
    common::run(
        &[
            (
                "strangers_are_refused_while_the_job_completes",
                strangers_are_refused_while_the_job_completes,
            ),
            ("store_refuses_strangers", store_refuses_strangers),
            (
                "oversized_frame_after_handshake",
                oversized_frame_after_handshake,
            ),
        ],
        worker,
    );
}
