//! Hostile peers against live ranks (threads of this process over loopback), each case with
//! the job's results checked exactly, the process's resident memory held under a stated bound,
//! and the offending connection logged with its reason (the transport's `tracing` warnings,
//! captured here).
//!
//! - During bootstrap, at a rank's link listener and at the rendezvous store: garbage, a
//!   hello or registration cut short (closed, or left silent until its deadline), a wrong job
//!   id, a wrong protocol version, a duplicate rank and out-of-range ranks.
//! - A stranger at the store of a job with `RLX_JOB_SECRET`: a registration with a wrong
//!   proof, one without the secret, one that stalls before its proof, and a whole rank built
//!   with the wrong secret. None of them can publish an address or read the table. And a
//!   fake store that cannot prove the secret is refused by the rank.
//! - After the handshake, a "rank" played by this test: garbage, a truncated frame header, a
//!   frame length of 2^62, a flood of valid frames for a tag nobody receives, and a slowloris
//!   that drips a frame one byte at a time while the real ranks run.
//!
//! The slowloris drips at most one byte per `RLX_HOSTILE_DRIP_MS` (500 by default) while the
//! real ranks exchange for `RLX_HOSTILE_SLOWLORIS_SECS` (3 by default); set them to run the
//! scenario for longer.
//!
//! Only the deadlines a case measures are short: the ranks wait for the hellos and answers of
//! each other as long as for anything else, so that a loaded machine cannot make a real rank
//! miss one.
//! The hostile clients hand-craft the documented wire layouts (`src/handshake.rs`,
//! `src/frame.rs`, `src/bootstrap/store/wire.rs`).

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use common::in_process::{all_reduce_is_exact, build, free_ports, joined, loopback};
use common::observed::{RssBound, log, logged, serial};
use common::{PROTOCOL_VERSION, exchange_networks, hello, job_digest};
use rlx_net::{SocketRole, TcpTransport, TcpTransportBuilder};
use rlx_transport::{CollectiveError, Tag, Transport};

/// The hello deadline of rank 0's link listener in the case that measures how a silent
/// stranger is closed at it. Every other deadline of a handshake is [`TIMEOUT`].
const HELLO_TIMEOUT: Duration = Duration::from_secs(1);
/// Bootstrap, handshake and operation timeout: a bound for a hang, far above what the tests
/// need.
const TIMEOUT: Duration = Duration::from_secs(30);
/// Length of a link listener's answer to a hello that it accepts (no reason follows).
const REPLY_LEN: u64 = 74;
/// How much the resident memory of this process may grow during a case that buffers nothing
/// on purpose (thread stacks, socket bookkeeping, the allocator's slack).
const RSS_SLACK_KIB: u64 = 16 << 10;

/// A store registration of `rank` in a world of `world`, claiming the address `addr` (and no
/// network).
fn registration(job: &str, world: u32, rank: u32, secret: bool, addr: ([u8; 4], u16)) -> Vec<u8> {
    let mut out = b"RLXSTOR\n".to_vec();
    out.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    out.extend_from_slice(&u32::from(secret).to_le_bytes());
    out.extend_from_slice(&job_digest(job));
    out.extend_from_slice(&world.to_le_bytes());
    out.extend_from_slice(&rank.to_le_bytes());
    out.extend_from_slice(&0xBAD_u64.to_le_bytes());
    out.extend_from_slice(&[9; 16]);
    out.push(1);
    out.push(4);
    out.extend_from_slice(&addr.0);
    out.extend_from_slice(&addr.1.to_le_bytes());
    // No networks, and a listener on the fake address only.
    out.push(0);
    out.push(0);
    out
}

/// A connection to the local `port`, once something listens there.
fn connect(port: u16) -> TcpStream {
    let start = Instant::now();
    loop {
        match TcpStream::connect(loopback(port)) {
            Ok(s) => {
                s.set_read_timeout(Some(TIMEOUT)).expect("a read timeout");
                return s;
            }
            Err(_) if start.elapsed() < TIMEOUT => thread::sleep(Duration::from_millis(10)),
            Err(e) => panic!("cannot connect to port {port}: {e}"),
        }
    }
}

/// Everything the listener sends until it closes the connection.
fn answer(s: &mut TcpStream) -> Vec<u8> {
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    out
}

/// Sends `bytes` to the link listener at `port`; returns the refusal's code and reason, or
/// `None` when the listener closed the connection without a reply.
fn link_refusal(port: u16, bytes: &[u8], close: bool) -> Option<(u32, String)> {
    let mut s = connect(port);
    s.write_all(bytes).expect("the stranger's bytes");
    if close {
        s.shutdown(Shutdown::Write).expect("a half close");
    }
    let reply = answer(&mut s);
    if reply.len() < 74 {
        return None;
    }
    assert_eq!(&reply[0..8], b"RLXTCP\r\n");
    let code = u32::from_le_bytes(reply[12..16].try_into().unwrap());
    Some((code, String::from_utf8_lossy(&reply[74..]).into_owned()))
}

/// Sends `bytes` to the store at `port`; returns the refusal's status and reason, or `None`
/// when the store closed the connection without a reply.
fn store_refusal(port: u16, bytes: &[u8], close: bool) -> Option<(u32, String)> {
    let mut s = connect(port);
    s.write_all(bytes).expect("the stranger's bytes");
    if close {
        s.shutdown(Shutdown::Write).expect("a half close");
    }
    let reply = answer(&mut s);
    if reply.len() < 16 {
        return None;
    }
    assert_eq!(&reply[0..8], b"RLXSTOR\n");
    let status = u32::from_le_bytes(reply[8..12].try_into().unwrap());
    Some((status, String::from_utf8_lossy(&reply[16..]).into_owned()))
}

fn builder(rank: u32, world: u32, job: &str) -> TcpTransportBuilder {
    TcpTransport::builder()
        .rank(rank)
        .world_size(world)
        .job_id(job)
        .op_timeout(TIMEOUT)
        .connect_timeout(TIMEOUT)
        .hello_timeout(TIMEOUT)
}

fn hostfile(ports: &[u16]) -> Vec<Vec<String>> {
    ports
        .iter()
        .map(|p| vec![format!("127.0.0.1:{p}")])
        .collect()
}

/// The bytes `socket`'s connection has received so far: `tcpi_bytes_received` of Linux's
/// `TCP_INFO`, `tcpi_rxbytes` of macOS's `TCP_CONNECTION_INFO`.
fn bytes_received(socket: &socket2::Socket) -> u64 {
    #[cfg(target_os = "linux")]
    let received = tcp_info::<libc::tcp_info>(socket, libc::TCP_INFO).tcpi_bytes_received;
    #[cfg(target_os = "macos")]
    let received =
        tcp_info::<libc::tcp_connection_info>(socket, libc::TCP_CONNECTION_INFO).tcpi_rxbytes;
    received
}

/// The `IPPROTO_TCP` option `option` of `socket`, a C struct of type `T`.
fn tcp_info<T>(socket: &socket2::Socket, option: libc::c_int) -> T {
    // SAFETY: `T` is one of the kernel's TCP information structs, plain old data for which all
    // zeroes is a valid value.
    let mut info: T = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<T>() as libc::socklen_t;
    // SAFETY: `info` is a writable `T` of `len` bytes, and the descriptor is open for as long
    // as `socket` is borrowed.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_TCP,
            option,
            (&raw mut info).cast(),
            &mut len,
        )
    };
    assert_eq!(
        rc,
        0,
        "TCP information: {}",
        std::io::Error::last_os_error()
    );
    info
}

/// Every malformed hello at a rank's link listener is refused with its reason, or closed when
/// it never completes, and logged with the stranger's address; ranks 1 and 2 then connect and
/// the job all-reduces exactly.
#[test]
fn malformed_hellos_are_refused_while_the_job_completes() {
    let _serial = serial();
    log();
    const JOB: &str = "hostile-hellos";
    let mut rss = RssBound::new(RSS_SLACK_KIB);
    let ports = free_ports(3);
    // Rank 1's connecting socket (a second descriptor of it), to see rank 0's answer arrive.
    let rank_1_link: Arc<Mutex<Option<socket2::Socket>>> = Arc::default();
    let make = |rank| {
        let b = builder(rank, 3, JOB).hostfile(hostfile(&ports));
        match rank {
            // The deadline of a silent stranger is measured at rank 0's listener below.
            0 => b.hello_timeout(HELLO_TIMEOUT),
            1 => {
                let link = Arc::clone(&rank_1_link);
                b.socket_setup(move |socket, role| {
                    if let SocketRole::Connect(_) = role {
                        *link.lock().unwrap_or_else(|p| p.into_inner()) = Some(socket.try_clone()?);
                    }
                    Ok(())
                })
            }
            _ => b,
        }
    };
    // Rank 1 joins first, so that its link to rank 0 is taken when a duplicate comes.
    let mut first = build(0..2, &make);
    // Rank 0 answers rank 1's hello only once it has claimed rank 1's link (see
    // `src/bootstrap/accept.rs`): with the whole answer received, a duplicate must find the
    // link taken. Rank 1 connects to rank 0 alone, so its last connecting socket is that link.
    let start = Instant::now();
    loop {
        let answered = rank_1_link
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .is_some_and(|s| bytes_received(s) >= REPLY_LEN);
        if answered {
            break;
        }
        assert!(
            start.elapsed() < TIMEOUT,
            "rank 0 never answered rank 1's hello"
        );
        thread::sleep(Duration::from_millis(5));
    }
    // Only the transport's own descriptor holds the link from here on.
    drop(rank_1_link.lock().unwrap_or_else(|p| p.into_inner()).take());
    let p0 = ports[0];
    let refused = |bytes: &[u8], needle: &str| {
        let (code, reason) = link_refusal(p0, bytes, false).expect("a refusal");
        assert!(
            code != 0 && reason.contains(needle),
            "{needle}: {code} {reason}"
        );
        logged(&["refused a connection", needle]);
    };
    let garbage: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    refused(&garbage, "wrong magic");
    refused(&hello("another-job", 3, 2), "job id differs");
    let mut old = hello(JOB, 3, 2);
    old[8..12].copy_from_slice(&(PROTOCOL_VERSION - 1).to_le_bytes());
    let old_version = format!(
        "protocol version {} is not {PROTOCOL_VERSION}",
        PROTOCOL_VERSION - 1
    );
    refused(&old, &old_version);
    refused(&hello(JOB, 3, 3), "rank 3 may not connect to rank 0");
    refused(&hello(JOB, 3, 0), "rank 0 may not connect to rank 0");
    refused(&hello(JOB, 3, u32::MAX), "rank 4294967295 may not connect");
    // Rank 1 connected while the strangers above were refused.
    let (code, reason) = link_refusal(p0, &hello(JOB, 3, 1), false).expect("a refusal");
    assert!(
        code != 0 && reason.contains("duplicate rank 1"),
        "{code} {reason}"
    );
    logged(&["refused a connection", "duplicate rank 1"]);
    // A hello cut short and closed: nothing to answer, the connection is closed and logged.
    assert_eq!(link_refusal(p0, &hello(JOB, 3, 2)[..30], true), None);
    logged(&["refused a connection", "closed after 30 bytes of its hello"]);
    // A hello cut short and left silent: closed at its deadline.
    let start = Instant::now();
    let mut silent = connect(p0);
    silent
        .write_all(&hello(JOB, 3, 2)[..30])
        .expect("half a hello");
    let said = answer(&mut silent);
    let dropped_after = start.elapsed();
    // Not before the deadline; and well before the stranger's own read timeout (`TIMEOUT`),
    // which is what would end the wait for a connection never closed. The wide upper bound
    // leaves a loaded machine room to run the listener late.
    assert!(
        dropped_after >= HELLO_TIMEOUT && dropped_after < TIMEOUT / 2,
        "a silent half hello was closed after {dropped_after:?} (deadline {HELLO_TIMEOUT:?})"
    );
    assert!(said.is_empty() || said.len() >= 74);
    logged(&[
        "refused a connection",
        "no complete hello before its deadline",
    ]);
    println!("a silent half hello was dropped after {dropped_after:?}");
    rss.check("after the strangers");
    first.extend(build(2..3, &make));
    all_reduce_is_exact(joined(first));
    rss.check("after the all-reduce");
    rss.report("malformed hellos");
}

/// Every malformed registration at the store is refused with its reason (or closed when it
/// never completes) and logged; the job then rendezvouses and all-reduces exactly.
#[test]
fn malformed_registrations_are_refused_while_the_job_completes() {
    let _serial = serial();
    log();
    const JOB: &str = "hostile-registrations";
    let mut rss = RssBound::new(RSS_SLACK_KIB);
    let port = free_ports(1)[0];
    let make = |rank| builder(rank, 3, JOB).master("127.0.0.1", port);
    let mut first = build(0..2, &make);
    let fake = ([127, 0, 0, 1], 9);
    let refused = |bytes: &[u8], needle: &str| {
        let (status, reason) = store_refusal(port, bytes, false).expect("a refusal");
        assert!(
            status != 0 && reason.contains(needle),
            "{needle}: {status} {reason}"
        );
        logged(&["refused a connection", needle]);
    };
    refused(&[0x5A; 200], "wrong magic");
    refused(
        &registration("another-job", 3, 2, false, fake),
        "job id differs",
    );
    let mut old = registration(JOB, 3, 2, false, fake);
    old[8..12].copy_from_slice(&(PROTOCOL_VERSION - 1).to_le_bytes());
    let old_version = format!(
        "protocol version {} is not {PROTOCOL_VERSION}",
        PROTOCOL_VERSION - 1
    );
    refused(&old, &old_version);
    refused(
        &registration(JOB, 3, 3, false, fake),
        "rank 3 cannot register",
    );
    refused(
        &registration(JOB, 3, 0, false, fake),
        "rank 0 cannot register",
    );
    refused(
        &registration(JOB, 4, 2, false, fake),
        "world size 4 differs",
    );
    refused(
        &registration(JOB, 3, 2, true, fake),
        "RLX_JOB_SECRET is set on this rank",
    );
    let mut too_many = registration(JOB, 3, 2, false, fake);
    // The address count, before one IPv4 address (7 bytes), the count of networks and where
    // the rank listens.
    let at = too_many.len() - 10;
    too_many[at] = 200;
    refused(&too_many, "200 addresses");
    let mut too_many = registration(JOB, 3, 2, false, fake);
    let at = too_many.len() - 2;
    too_many[at] = 200;
    refused(&too_many, "200 networks");
    // A registration cut short and closed: the store answers (the rank might still read) and
    // closes.
    let (status, reason) =
        store_refusal(port, &registration(JOB, 3, 2, false, fake)[..40], true).expect("a refusal");
    assert!(
        status != 0 && reason.contains("closed after 40 bytes of its registration"),
        "{reason}"
    );
    logged(&[
        "refused a connection",
        "closed after 40 bytes of its registration",
    ]);
    rss.check("after the strangers");
    first.extend(build(2..3, &make));
    all_reduce_is_exact(joined(first));
    rss.check("after the all-reduce");
    rss.report("malformed registrations");
}

/// With a job secret, strangers at the store cannot publish an address for a rank or read
/// the table: a registration with a wrong proof, one without the secret, one that stalls
/// before its proof (holding rank 1's registration meanwhile), and a rank built with the wrong
/// secret are all refused with a reason; the real ranks then rendezvous and all-reduce
/// exactly, which they could not with a stranger's address in the table.
#[test]
fn strangers_cannot_write_to_an_authenticated_store() {
    let _serial = serial();
    log();
    const JOB: &str = "hostile-store";
    let mut rss = RssBound::new(RSS_SLACK_KIB);
    let port = free_ports(1)[0];
    let make = |rank| {
        builder(rank, 3, JOB)
            .master("127.0.0.1", port)
            .job_secret(b"the job's secret".to_vec())
    };
    let root = build(0..1, &make);
    let fake = ([10, 9, 8, 7], 4242);

    // A registration for rank 1 at a fake address, answered with a wrong proof.
    let mut s = connect(port);
    s.write_all(&registration(JOB, 3, 1, true, fake))
        .expect("the registration");
    let mut challenge = [0u8; 12 + 16 + 32];
    s.read_exact(&mut challenge).expect("the store's challenge");
    assert_eq!(&challenge[8..12], &0x100u32.to_le_bytes(), "a challenge");
    s.write_all(&[0x42; 32]).expect("a wrong proof");
    let reply = answer(&mut s);
    let reason = String::from_utf8_lossy(&reply[16.min(reply.len())..]).into_owned();
    assert_eq!(
        &reply[8..12],
        &7u32.to_le_bytes(),
        "refused for the secret: {reason}"
    );
    assert!(
        reason.contains("rank 1 failed to prove it holds RLX_JOB_SECRET"),
        "{reason}"
    );
    logged(&[
        "refused a connection",
        "rank 1 failed to prove it holds RLX_JOB_SECRET",
    ]);

    // A registration without the secret.
    let (status, reason) =
        store_refusal(port, &registration(JOB, 3, 1, false, fake), false).expect("a refusal");
    assert_eq!(status, 7, "{reason}");
    assert!(reason.contains("not on this rank"), "{reason}");

    // A whole rank with the wrong secret.
    let wrong = make(2).job_secret(b"another secret".to_vec()).build();
    let text = format!("{:?}", wrong.as_ref().map(|_| ()));
    assert!(
        matches!(wrong, Err(CollectiveError::Config { .. }))
            && text.contains("failed to prove it holds RLX_JOB_SECRET"),
        "a rank with the wrong secret: {text}"
    );
    println!("a rank with the wrong secret was told: {text}");

    // A stranger that sends rank 1's registration and stalls before its proof.
    let mut staller = connect(port);
    staller
        .write_all(&registration(JOB, 3, 1, true, fake))
        .expect("the registration");
    staller
        .read_exact(&mut challenge)
        .expect("the store's challenge");

    rss.check("after the strangers");
    let rest = build(1..3, &make);
    let mut world = joined(root);
    world.extend(joined(rest));
    for t in &world[1..] {
        assert_eq!(
            t.peer_addr(0).map(|a| a.ip().to_string()).as_deref(),
            Some("127.0.0.1"),
            "rank {} reached rank 0 where it really listens",
            t.rank()
        );
    }
    drop(staller);
    all_reduce_is_exact(world);
    rss.check("after the all-reduce");
    rss.report("strangers at an authenticated store");
}

/// A rank with a job secret refuses a fake store at the rendezvous address: one whose proof of
/// the secret is wrong, and one that sends a table without any proof (the address table of a
/// store that could not prove the secret is never used).
#[test]
fn a_rank_refuses_a_store_that_cannot_prove_the_secret() {
    let _serial = serial();
    log();
    let mut rss = RssBound::new(RSS_SLACK_KIB);
    let listener = TcpListener::bind(loopback(0)).expect("a fake store");
    let port = listener.local_addr().expect("its address").port();
    let mut challenge = b"RLXSTOR\n".to_vec();
    challenge.extend_from_slice(&0x100u32.to_le_bytes());
    challenge.extend_from_slice(&[1; 16]);
    challenge.extend_from_slice(&[2; 32]);
    let mut table = b"RLXSTOR\n".to_vec();
    table.extend_from_slice(&0u32.to_le_bytes());
    table.extend_from_slice(&2u32.to_le_bytes());
    for _ in 0..2 {
        table.extend_from_slice(&0u64.to_le_bytes());
        table.extend_from_slice(&[1, 4, 10, 9, 8, 7, 0x92, 0x10]);
    }
    for (answer, needle) in [
        (&challenge, "failed to prove it holds RLX_JOB_SECRET"),
        (
            &table,
            "sent its table without proving it holds RLX_JOB_SECRET",
        ),
    ] {
        let rank = builder(1, 2, "fake-store")
            .master("127.0.0.1", port)
            .job_secret(b"the job's secret".to_vec());
        let rank = thread::spawn(move || rank.build());
        let (mut s, _) = listener.accept().expect("the rank's registration");
        let mut registration = [0u8; 256];
        let _ = s.read(&mut registration).expect("a registration");
        s.write_all(answer).expect("the fake answer");
        let error = rank
            .join()
            .expect("the rank's thread")
            .expect_err("the rank refuses the fake store");
        println!("a rank answered by a fake store was told: {error}");
        assert!(error.to_string().contains(needle), "{needle}: {error:?}");
    }
    rss.check("after the fake stores");
    rss.report("a fake store");
}

/// Ranks 0 and 1 of a 3-rank world over a hostfile, and the links to both of them of a rank
/// 2 that this test plays. `tune` adjusts each real rank's builder (given its rank).
fn world_with_a_hostile_rank(
    job: &str,
    tune: impl Fn(u32, TcpTransportBuilder) -> TcpTransportBuilder,
) -> (Vec<TcpTransport>, Vec<TcpStream>) {
    let ports = free_ports(3);
    let make = |rank| tune(rank, builder(rank, 3, job).hostfile(hostfile(&ports)));
    let real = build(0..2, &make);
    let links = ports[..2]
        .iter()
        .map(|&port| {
            let mut s = connect(port);
            s.write_all(&hello(job, 3, 2)).expect("the hostile hello");
            let mut reply = [0u8; 74];
            s.read_exact(&mut reply).expect("the reply");
            assert_eq!(&reply[12..16], &[0; 4], "the hostile rank 2 is accepted");
            s.set_read_timeout(None).expect("no read timeout");
            exchange_networks(&mut s);
            s
        })
        .collect();
    (joined(real), links)
}

/// A checked exchange between the real ranks 0 and 1 (each sends the other `rounds` messages
/// and checks what it gets), run on both at once; returns the slowest round.
fn exchange_is_exact(world: &[TcpTransport], rounds: u32) -> Duration {
    thread::scope(|scope| {
        let threads: Vec<_> = world
            .iter()
            .map(|t| {
                scope.spawn(move || {
                    let (me, other) = (t.rank(), 1 - t.rank());
                    let mut slowest = Duration::ZERO;
                    for round in 0..rounds {
                        let start = Instant::now();
                        let mine: Vec<u8> = (0..65_536u32)
                            .map(|i| (i ^ round ^ (me << 7)) as u8)
                            .collect();
                        t.send_bytes(other, 11, &mine).expect("a send");
                        let got = t.recv_bytes(other, 11).expect("a receive");
                        let expected: Vec<u8> = (0..65_536u32)
                            .map(|i| (i ^ round ^ (other << 7)) as u8)
                            .collect();
                        assert!(got == expected, "rank {me}, round {round}: wrong bytes");
                        slowest = slowest.max(start.elapsed());
                    }
                    slowest
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("a rank thread"))
            .max()
            .unwrap_or_default()
    })
}

/// The 48-byte header of a data frame carrying the whole of a `len`-byte message.
fn frame_header(tag: u32, seq: u64, len: u64) -> [u8; 48] {
    let mut h = [0u8; 48];
    h[0] = 1;
    h[8..16].copy_from_slice(&Tag::user(tag).expect("a user tag").raw().to_le_bytes());
    h[16..24].copy_from_slice(&seq.to_le_bytes());
    h[24..32].copy_from_slice(&len.to_le_bytes());
    h[40..48].copy_from_slice(&len.to_le_bytes());
    h
}

/// The error rank `t` gets when it next waits for the hostile rank 2 (which it must have
/// dropped already, or within a few seconds).
fn dropped_hostile(t: &TcpTransport) -> CollectiveError {
    t.recv_bytes_timeout(2, 99, Duration::from_secs(5))
        .expect_err("the hostile rank 2 is dropped")
}

/// After the handshake, a hostile rank 2 sends garbage to rank 0, a truncated frame header to
/// rank 1, then a frame header announcing 2^62 bytes, then a single-copy frame without having
/// offered to be read, then a switch to a lane it never offered; each offender is dropped with its reason and logged, the real ranks
/// exchange exactly meanwhile, and nothing is allocated for the announced length.
#[test]
fn hostile_frames_drop_the_offender_while_the_job_completes() {
    let _serial = serial();
    log();
    let mut rss = RssBound::new(RSS_SLACK_KIB);
    let (world, mut hostile) = world_with_a_hostile_rank("hostile-frames", |_, b| b);
    let start = Instant::now();
    hostile[0].write_all(&[0xEE; 4096]).expect("garbage");
    hostile[1]
        .write_all(&frame_header(5, 0, 100)[..20])
        .expect("a truncated header");
    hostile[1].shutdown(Shutdown::Write).expect("a half close");
    let error_0 = dropped_hostile(&world[0]);
    let error_1 = dropped_hostile(&world[1]);
    println!("offenders dropped {:?} after their bytes", start.elapsed());
    assert!(
        matches!(&error_0, CollectiveError::Protocol { peer: Some(2), detail } if detail.contains("unknown frame kind 238")),
        "garbage: {error_0:?}"
    );
    assert!(
        matches!(&error_1, CollectiveError::PeerLost { peer: 2, .. }),
        "a truncated header: {error_1:?}"
    );
    logged(&[
        "peer broke the protocol",
        "peer=2",
        "unknown frame kind 238",
    ]);
    logged(&["peer lost", "peer=2"]);
    exchange_is_exact(&world, 20);
    rss.check("after garbage and a truncated header");
    drop(world);

    let (world, mut hostile) = world_with_a_hostile_rank("hostile-frames-2", |_, b| b);
    let start = Instant::now();
    hostile[0]
        .write_all(&frame_header(5, 0, 1 << 62))
        .expect("a huge header");
    let error = dropped_hostile(&world[0]);
    println!(
        "a 2^62-byte frame dropped its sender after {:?}",
        start.elapsed()
    );
    assert!(
        matches!(&error, CollectiveError::Protocol { peer: Some(2), detail }
            if detail.contains("frame of 4611686018427387904 bytes exceeds the frame cap")),
        "2^62: {error:?}"
    );
    logged(&["peer broke the protocol", "4611686018427387904"]);
    exchange_is_exact(&world, 20);
    rss.check("after a 2^62-byte frame");
    drop(world);

    // A single-copy frame from a peer that never offered to be read: its descriptor is well
    // formed, but nothing is read from any process for it.
    let (world, mut hostile) = world_with_a_hostile_rank("hostile-frames-3", |_, b| b);
    let mut pull = frame_header(5, 0, 1 << 20);
    pull[0] = 5;
    let mut descriptor = [0u8; 112];
    descriptor[16..24].copy_from_slice(&1u64.to_le_bytes());
    descriptor[48..56].copy_from_slice(&0x10_0000u64.to_le_bytes());
    descriptor[56..64].copy_from_slice(&(1u64 << 20).to_le_bytes());
    hostile[0].write_all(&pull).expect("a single-copy header");
    hostile[0].write_all(&descriptor).expect("its descriptor");
    let error = dropped_hostile(&world[0]);
    assert!(
        matches!(&error, CollectiveError::Protocol { peer: Some(2), detail }
            if detail.contains("did not prove it runs on this host")),
        "a single-copy frame without an offer: {error:?}"
    );
    logged(&[
        "peer broke the protocol",
        "did not prove it runs on this host",
    ]);
    exchange_is_exact(&world, 20);
    rss.check("after a single-copy frame without an offer");
    drop(world);

    // A switch to a shared-memory lane nobody offered: the link cannot move anywhere.
    let (world, mut hostile) = world_with_a_hostile_rank("hostile-frames-4", |_, b| b);
    let mut switch = frame_header(5, 0, 0);
    switch[0] = 7;
    hostile[0].write_all(&switch).expect("a lane switch");
    let error = dropped_hostile(&world[0]);
    assert!(
        matches!(&error, CollectiveError::Protocol { peer: Some(2), detail }
            if detail.contains("lane this rank did not map")),
        "a lane switch without an offer: {error:?}"
    );
    logged(&["peer broke the protocol", "lane this rank did not map"]);
    exchange_is_exact(&world, 20);
    rss.check("after a lane switch without an offer");
    rss.report("hostile frames");
}

/// A hostile rank 2 floods rank 0 with valid frames for a tag nobody receives: rank 0 holds at
/// most its unexpected budget (plus one message) for it and pushes back through TCP, so the
/// flooder's writes stall and the process's memory stays bounded, while the real ranks
/// exchange exactly. After twice the operation timeout rank 0 drops the flooder, logging why.
/// A legitimate rank that floods a tag nobody receives gets a timeout of its send that names
/// the rank that does not receive (before it would be dropped the same way).
///
/// The operation timeout is long enough that a loaded machine delays no exchange past it, and
/// that the legitimate flooder's timeout comes a whole timeout before it would be dropped.
#[test]
fn a_flood_for_a_tag_nobody_receives_is_bounded_by_the_budget() {
    let _serial = serial();
    log();
    const BUDGET: u64 = 8 << 20;
    const MESSAGE: usize = 1 << 20;
    const OP_TIMEOUT: Duration = Duration::from_secs(5);
    // How long the flooder's writes must have been blocked, all of its flood written, before
    // it takes rank 0 to be pushing back rather than slow.
    const STALLED: Duration = Duration::from_secs(2);
    // Per flooding peer (the hostile rank 2, then the real rank 1): the budget and the one
    // message admitted beyond it; and the message the flooders build.
    let mut rss = RssBound::new(RSS_SLACK_KIB + 2 * (BUDGET + 2 * MESSAGE as u64) / 1024);
    let (world, mut hostile) = world_with_a_hostile_rank("hostile-flood", |_, b| {
        b.max_unexpected_bytes(BUDGET).op_timeout(OP_TIMEOUT)
    });
    let flood = thread::spawn({
        let mut link = hostile.remove(0);
        move || {
            // Short waits, so that the loop sees for how long its writes have been blocked.
            link.set_write_timeout(Some(Duration::from_millis(100)))
                .expect("a write timeout");
            let mut frame = frame_header(77, 0, MESSAGE as u64).to_vec();
            frame.resize(48 + MESSAGE, 0xA5);
            let (mut seq, mut at, mut written) = (0u64, 0, 0u64);
            let mut moved_at = Instant::now();
            // At least the budget and the message beyond it, so that rank 0 fills its budget
            // and stops reading however late it reads; then until the writes stay blocked. A
            // transport that never pushes back is caught by the bound on what was written.
            loop {
                if at == frame.len() {
                    seq += 1;
                    frame[..48].copy_from_slice(&frame_header(77, seq, MESSAGE as u64));
                    at = 0;
                }
                let full = written >= BUDGET + MESSAGE as u64;
                match link.write(&frame[at..]) {
                    Ok(n) => {
                        at += n;
                        written += n as u64;
                        moved_at = Instant::now();
                    }
                    Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                        if full && moved_at.elapsed() >= STALLED {
                            break;
                        }
                        assert!(
                            moved_at.elapsed() < TIMEOUT,
                            "rank 0 stopped reading after {written} bytes, short of its budget"
                        );
                    }
                    // Rank 0 dropped the flooder already: its budget was full for twice its
                    // operation timeout while this thread waited for a core.
                    Err(_) if full => break,
                    Err(e) => panic!("the flood failed after {written} bytes: {e}"),
                }
                if written >= BUDGET + 64 * MESSAGE as u64 {
                    break;
                }
            }
            (written, link)
        }
    });
    let slowest = exchange_is_exact(&world, 50);
    let (written, link) = flood.join().expect("the flood");
    rss.check("during the flood");
    println!(
        "the flood stalled after {} MiB (budget {} MiB); the slowest exchange took {slowest:?}",
        written >> 20,
        BUDGET >> 20
    );
    assert!(
        written < BUDGET + 32 * MESSAGE as u64,
        "the flooder wrote {written} bytes past a budget of {BUDGET}"
    );
    // Rank 0 then drops the flooder: twice the operation timeout after the budget filled, its
    // link ends (the beats rank 0 sent before are read past) and the reason is logged. The
    // bound only ends a wait for a drop that never comes.
    let mut link = link;
    link.set_read_timeout(Some(Duration::from_millis(200)))
        .expect("a read timeout");
    let waiting = Instant::now();
    let mut scratch = vec![0u8; 4096];
    loop {
        match link.read(&mut scratch) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
        assert!(
            waiting.elapsed() < 2 * OP_TIMEOUT + TIMEOUT,
            "rank 0 still holds the flooder's link after {:?}",
            waiting.elapsed()
        );
    }
    let line = logged(&["peer broke the protocol", "dropped as a flood"]);
    println!(
        "the flooder was dropped {:?} after its flood stalled: {line}",
        waiting.elapsed()
    );
    drop(link);
    exchange_is_exact(&world, 5);

    // A legitimate rank that does the same: its send times out, naming the rank.
    let start = Instant::now();
    let error = (0..1024)
        .find_map(|_| world[1].send_bytes(0, 78, &vec![1u8; MESSAGE]).err())
        .expect("the flooding rank's send fails");
    println!(
        "the flooding rank 1 was told after {:?}: {error}",
        start.elapsed()
    );
    assert!(
        matches!(
            error,
            CollectiveError::Timeout {
                peer: Some(0),
                op: "send",
                ..
            }
        ),
        "{error:?}"
    );
    rss.check("after the legitimate flood");
    rss.report("a flood for a tag nobody receives");
}

fn env_or(var: &str, default: u64) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// During the run, a hostile rank 2 sends rank 0 the start of a frame header and then drips
/// the rest one byte at a time (a slowloris during bootstrap is `tcp_slow_connections.rs`'s),
/// so that rank 0 holds an incomplete frame from it for the whole case while the real ranks
/// exchange. They keep exchanging exactly, which shows that no reader of rank 0 waits for the
/// rest of that frame: a byte is dripped only between two batches of exchanges, so a batch
/// that needed the next byte would wait for it until an exchange timed out. A receive from
/// rank 2 ends at its deadline with nothing, and when the slowloris gives up mid-frame rank 0
/// drops it with the reason.
#[test]
fn a_slowloris_during_the_run_does_not_slow_the_job() {
    let _serial = serial();
    log();
    let mut rss = RssBound::new(RSS_SLACK_KIB);
    let drip = Duration::from_millis(env_or("RLX_HOSTILE_DRIP_MS", 500));
    let duration = Duration::from_secs(env_or("RLX_HOSTILE_SLOWLORIS_SECS", 3));
    // The real ranks' operation timeout, long enough for a loaded machine.
    const OP_TIMEOUT: Duration = Duration::from_secs(8);
    // When no batch has asked for a byte for this long, the slowloris drips one anyway: a
    // batch held up by a reader waiting for it has timed out by then, and the reader is let go
    // so that the test fails on that timeout instead of hanging.
    const BACKSTOP: Duration = Duration::from_secs(10);
    // Beats every 3 s: rank 0 loses a peer not heard for 15 s, longer than the backstop (the
    // slowloris sends no beats, only its drip).
    const HEARTBEAT: Duration = Duration::from_secs(3);
    const SENT_AT_ONCE: usize = 8;
    let (world, mut hostile) = world_with_a_hostile_rank("hostile-slowloris", |_, b| {
        b.op_timeout(OP_TIMEOUT).heartbeat(HEARTBEAT)
    });
    let (ask, asked) = mpsc::channel::<()>();
    let slowloris = thread::spawn({
        let mut link = hostile.remove(0);
        move || {
            // A frame of a 4 KiB message: at one byte a drip it does not complete during the
            // case. The slowloris drips when asked, at most one byte per drip, until the test
            // drops its sender.
            let mut frame = frame_header(5, 0, 4096).to_vec();
            frame.resize(48 + 4096, 0x33);
            link.write_all(&frame[..SENT_AT_ONCE])
                .expect("the start of a header");
            let mut sent = SENT_AT_ONCE;
            let mut dripped_at = Instant::now();
            while sent < frame.len() {
                match asked.recv_timeout(BACKSTOP) {
                    Ok(()) if dripped_at.elapsed() < drip => continue,
                    Ok(()) | Err(mpsc::RecvTimeoutError::Timeout) => {}
                    Err(mpsc::RecvTimeoutError::Disconnected) => break,
                }
                link.write_all(&frame[sent..=sent]).expect("a byte");
                sent += 1;
                dripped_at = Instant::now();
            }
            // The connection stays open, the frame unfinished, until the test drops it.
            (sent, link)
        }
    });
    let start = Instant::now();
    let mut rounds = 0;
    let mut slowest = Duration::ZERO;
    while start.elapsed() < duration {
        slowest = slowest.max(exchange_is_exact(&world, 10));
        rounds += 10;
        ask.send(()).expect("the slowloris waits to be asked");
    }
    // The slowloris still holds its frame, and rank 0 still hears it: its last byte came
    // at most a drip and a batch ago, far less than the 15 s of silence that would lose it.
    let waited = world[0].recv_bytes_timeout(2, 99, Duration::from_secs(2));
    assert!(matches!(waited, Ok(None)), "{waited:?}");
    drop(ask);
    let (sent, link) = slowloris.join().expect("the slowloris");
    println!(
        "{rounds} exchanges during a {duration:?} slowloris ({sent} bytes, one per {drip:?}); \
         the slowest took {slowest:?}"
    );
    drop(link);
    let error = dropped_hostile(&world[0]);
    assert!(
        matches!(error, CollectiveError::PeerLost { peer: 2, .. }),
        "{error:?}"
    );
    logged(&["peer lost", "peer=2"]);
    rss.check("after the slowloris");
    rss.report("a slowloris during the run");
}
