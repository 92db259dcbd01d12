//! Slow connections during bootstrap: strangers that open many connections to the rendezvous
//! store or to a rank's link listener and send one plausible byte at a time (a slowloris) must
//! never keep the ranks from meeting. Each connection is closed at its own hello deadline,
//! however slowly its bytes trickle in; when the handshake slots are full, the oldest
//! connection that has not identified itself makes room for a newcomer; and the job then
//! rendezvouses and all-reduces exactly. The ranks are threads of this process over loopback.
//! They wait for each other's hellos and answers as long as for anything else, so that a
//! loaded machine cannot make a real rank miss its deadline; only the case that measures how a
//! stranger is closed at its deadline gives the listener it watches a short one.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

mod common;

use common::in_process::{all_reduce_is_exact, build, free_ports, joined, loopback};
use rlx_net::TcpTransport;

/// The hello deadline of the store in the case that measures it.
const HELLO_TIMEOUT: Duration = Duration::from_secs(1);
/// How long bootstrap and every handshake may take: a bound for a hang, far above what the
/// tests need.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(60);
/// Handshake slots of a listener.
const SLOTS: usize = 64;
/// Slow connections per attacked listener: more than the handshake slots.
const SLOW: usize = 70;
/// The pause between two bytes of a slow connection.
const DRIP: Duration = Duration::from_millis(500);

/// A crowd of slow connections to one address, reconnecting whenever one is closed, until
/// dropped.
struct Slowloris {
    stop: Arc<AtomicBool>,
    /// Connections made so far.
    connected: Arc<AtomicUsize>,
    /// Connections the listener closed so far.
    closed: Arc<AtomicUsize>,
    threads: Vec<JoinHandle<()>>,
}

impl Slowloris {
    /// Starts `count` slow connections to `addr`, each sending the bytes of `prefix` (a
    /// plausible start of the listener's protocol, never complete) one per [`DRIP`].
    fn start(addr: SocketAddr, count: usize, prefix: &'static [u8]) -> Slowloris {
        let stop = Arc::new(AtomicBool::new(false));
        let connected = Arc::new(AtomicUsize::new(0));
        let closed = Arc::new(AtomicUsize::new(0));
        let threads = (0..count)
            .map(|_| {
                let (stop, connected, closed) = (
                    Arc::clone(&stop),
                    Arc::clone(&connected),
                    Arc::clone(&closed),
                );
                thread::spawn(move || {
                    while !stop.load(Ordering::SeqCst) {
                        let Ok(mut stream) = TcpStream::connect(addr) else {
                            // The listener is not up yet.
                            thread::sleep(Duration::from_millis(20));
                            continue;
                        };
                        connected.fetch_add(1, Ordering::SeqCst);
                        let _ = stream.set_nonblocking(true);
                        for byte in &prefix[..prefix.len() - 1] {
                            if stop.load(Ordering::SeqCst) || !is_open(&mut stream) {
                                break;
                            }
                            let _ = stream.write(std::slice::from_ref(byte));
                            thread::sleep(DRIP);
                        }
                        // Never complete: wait for the listener to give up on this connection.
                        while !stop.load(Ordering::SeqCst) && is_open(&mut stream) {
                            thread::sleep(DRIP);
                        }
                        if !stop.load(Ordering::SeqCst) {
                            closed.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                })
            })
            .collect();
        Slowloris {
            stop,
            connected,
            closed,
            threads,
        }
    }

    /// Waits (bounded by the connect timeout) until every connection of the crowd was made
    /// once and the listener, with more connections than handshake slots, closed some: it is
    /// full when the ranks come.
    fn wait_full(&self) {
        let start = Instant::now();
        while self.connected.load(Ordering::SeqCst) < SLOW
            || self.closed.load(Ordering::SeqCst) < SLOW - SLOTS
        {
            assert!(
                start.elapsed() < CONNECT_TIMEOUT,
                "the slow connections never filled the listener"
            );
            thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Slowloris {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Whether the listener has not closed `stream` yet: nothing to read and no error. A
/// refusal's text counts as closed (the listener closes right after it).
fn is_open(stream: &mut TcpStream) -> bool {
    let mut byte = [0u8; 64];
    matches!(stream.read(&mut byte), Err(e) if e.kind() == ErrorKind::WouldBlock)
}

fn builder(rank: u32, world: u32) -> rlx_net::TcpTransportBuilder {
    TcpTransport::builder()
        .rank(rank)
        .world_size(world)
        .op_timeout(CONNECT_TIMEOUT)
        .connect_timeout(CONNECT_TIMEOUT)
        .hello_timeout(CONNECT_TIMEOUT)
}

/// Bootstraps a 3-rank world made by `make`: the ranks below `first_connecting` start, the
/// listeners at `crowded` (sent `prefix` byte by byte) fill with slow connections, then the
/// other ranks start; every rank must bootstrap, and an all-reduce be exact.
fn bootstrap_among_crowds(
    make: impl Fn(u32) -> rlx_net::TcpTransportBuilder,
    first_connecting: u32,
    crowded: &[u16],
    prefix: &'static [u8],
) {
    let listening = build(0..first_connecting, &make);
    let crowds: Vec<Slowloris> = crowded
        .iter()
        .map(|&port| Slowloris::start(loopback(port), SLOW, prefix))
        .collect();
    for crowd in &crowds {
        crowd.wait_full();
    }
    let connecting = build(first_connecting..3, &make);
    let mut world = joined(listening);
    world.extend(joined(connecting));
    drop(crowds);
    all_reduce_is_exact(world);
}

#[test]
fn slow_connections_to_the_store_do_not_block_rendezvous() {
    let port = free_ports(1)[0];
    bootstrap_among_crowds(
        |rank| builder(rank, 3).master("127.0.0.1", port),
        1,
        &[port],
        b"RLXSTOR\n",
    );
}

/// Rank 0 accepts ranks 1 and 2, rank 1 accepts rank 2: both listeners are crowded before the
/// ranks that connect to them start.
#[test]
fn slow_connections_to_link_listeners_do_not_block_bootstrap() {
    let ports = free_ports(3);
    let hostfile: Vec<Vec<String>> = ports
        .iter()
        .map(|p| vec![format!("127.0.0.1:{p}")])
        .collect();
    bootstrap_among_crowds(
        |rank| builder(rank, 3).hostfile(hostfile.clone()),
        2,
        &ports[..2],
        b"RLXTCP\r\n",
    );
}

/// One slow connection is closed at its hello deadline, with the reason, while the store is
/// still waiting for a rank (not only when rendezvous ends).
#[test]
fn a_slow_connection_is_closed_at_its_deadline() {
    let port = free_ports(1)[0];
    // Only the store's rank has the short deadline measured here; rank 1 waits for rank 0's
    // answers as long as for anything else. Rank 0's deadline also bounds rank 1's own
    // registration and hello, which rank 1 sends whole at once.
    let make = |rank| match rank {
        0 => builder(rank, 2)
            .master("127.0.0.1", port)
            .hello_timeout(HELLO_TIMEOUT),
        _ => builder(rank, 2).master("127.0.0.1", port),
    };
    let root = build(0..1, &make);
    let mut stream = loop {
        match TcpStream::connect(loopback(port)) {
            Ok(stream) => break stream,
            Err(_) => thread::sleep(Duration::from_millis(20)),
        }
    };
    stream.set_nonblocking(true).expect("a non-blocking socket");
    let start = Instant::now();
    let mut answer = Vec::new();
    // Far longer than the deadline, far shorter than the rendezvous's connect timeout, and
    // shorter than the plausible start of a registration takes to trickle in: the store's
    // magic and protocol version, then a job id that the store can refuse only once it is
    // complete.
    let bound = HELLO_TIMEOUT * 10;
    let mut plausible = b"RLXSTOR\n".to_vec();
    plausible.extend_from_slice(&common::PROTOCOL_VERSION.to_le_bytes());
    plausible.extend_from_slice(&[0; 16]);
    let mut sent = 0;
    let closed = loop {
        if let Some(byte) = plausible.get(sent) {
            let _ = stream.write(std::slice::from_ref(byte));
            sent += 1;
        }
        let mut buf = [0u8; 256];
        match stream.read(&mut buf) {
            Ok(0) => break true,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(_) => break true,
        }
        if start.elapsed() > bound {
            break false;
        }
        thread::sleep(DRIP);
    };
    assert!(
        closed,
        "a connection sending a byte every {DRIP:?} was still open after {bound:?} (hello \
         deadline {HELLO_TIMEOUT:?})"
    );
    let text = String::from_utf8_lossy(&answer);
    assert!(text.contains("deadline"), "the store's answer: {text:?}");
    // The store is still waiting for rank 1, which now joins.
    let other = build(1..2, &make);
    let mut world = joined(root);
    world.extend(joined(other));
    all_reduce_is_exact(world);
}

/// The hello a connector sends (see `handshake.rs`), claiming `rank`'s only link in a world of
/// `world` with a secret, for the job `job_id`.
fn hello_with_secret(job_id: &str, world: u32, rank: u32) -> Vec<u8> {
    use sha2::Digest;
    let mut out = b"RLXTCP\r\n".to_vec();
    out.extend_from_slice(&common::PROTOCOL_VERSION.to_le_bytes());
    out.extend_from_slice(&1u32.to_le_bytes());
    out.extend_from_slice(&sha2::Sha256::digest(job_id.as_bytes())[..16]);
    for field in [world, rank, 0, 1] {
        out.extend_from_slice(&field.to_le_bytes());
    }
    out.extend_from_slice(&0u64.to_le_bytes());
    out.extend_from_slice(&[7; 16]);
    out
}

/// With a job secret, a stranger who knows the job id sends rank 1's hello first and then
/// stalls instead of proving the secret: it must not take rank 1's link, so the real rank 1
/// still connects.
#[test]
fn a_stranger_that_stalls_before_its_proof_does_not_take_a_ranks_link() {
    const JOB: &str = "stalled-stranger";
    let ports = free_ports(2);
    let hostfile: Vec<Vec<String>> = ports
        .iter()
        .map(|p| vec![format!("127.0.0.1:{p}")])
        .collect();
    let make = |rank| {
        builder(rank, 2)
            .hostfile(hostfile.clone())
            .job_id(JOB)
            .job_secret(b"the secret".to_vec())
    };
    let root = build(0..1, &make);
    let mut stranger = loop {
        match TcpStream::connect(loopback(ports[0])) {
            Ok(stream) => break stream,
            Err(_) => thread::sleep(Duration::from_millis(20)),
        }
    };
    stranger
        .write_all(&hello_with_secret(JOB, 2, 1))
        .expect("the stranger's hello");
    // The acceptor answers the hello with its own proof and waits for the stranger's.
    let mut reply = [0u8; 74];
    stranger
        .read_exact(&mut reply)
        .expect("the acceptor's reply");
    assert_eq!(&reply[12..16], &[0; 4], "the hello itself is accepted");
    let rank_1 = build(1..2, &make);
    let mut world = joined(root);
    world.extend(joined(rank_1));
    drop(stranger);
    all_reduce_is_exact(world);
}
