//! What bootstrap's errors say: a rendezvous that times out names the rank that never came
//! when only one can be missing, a rank whose store closes the connection without an answer
//! is told so (not "failed to fill whole buffer"), and a connection the store evicts to make
//! room is sent the reason. The ranks are threads of this process over loopback.

use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::Duration;

use rlx_net::TcpTransport;
use rlx_transport::CollectiveError;

fn free_port() -> u16 {
    rlx_transport::ports::free_loopback_ports(1).expect("a free loopback port")[0]
}

fn rank(
    rank: u32,
    world: u32,
    port: u16,
    connect: Duration,
) -> Result<TcpTransport, CollectiveError> {
    TcpTransport::builder()
        .rank(rank)
        .world_size(world)
        .master("127.0.0.1", port)
        .connect_timeout(connect)
        .build()
}

#[test]
fn a_two_rank_rendezvous_timeout_names_rank_1() {
    let err = rank(0, 2, free_port(), Duration::from_secs(1)).expect_err("rank 1 never comes");
    assert!(
        matches!(
            err,
            CollectiveError::Timeout {
                peer: Some(1),
                op: "rendezvous",
                ..
            }
        ),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.starts_with("rendezvous timed out after") && text.ends_with("waiting for peer rank 1"),
        "{text}"
    );
}

/// Reads exactly one registration (see `src/bootstrap/store/wire.rs`): the fixed part up to
/// the count of addresses, then each address by its family.
fn read_registration(stream: &mut impl Read) {
    // Magic, version, flags, job digest, world, rank, instance and nonce; then the count.
    let mut fixed = [0u8; 8 + 4 + 4 + 16 + 4 + 4 + 8 + 16 + 1];
    stream.read_exact(&mut fixed).expect("a registration");
    assert_eq!(&fixed[..8], b"RLXSTOR\n", "a registration");
    for _ in 0..fixed[fixed.len() - 1] {
        let mut family = [0u8; 1];
        stream.read_exact(&mut family).expect("an address family");
        // The address and port; an IPv6 address also has its scope.
        let rest = match family[0] {
            4 => 4 + 2,
            6 => 16 + 4 + 2,
            other => panic!("address family {other}"),
        };
        stream.read_exact(&mut vec![0u8; rest]).expect("an address");
    }
    // Then the networks: their count, and each as a family, an address and a prefix length.
    let mut count = [0u8; 1];
    stream.read_exact(&mut count).expect("a count of networks");
    for _ in 0..count[0] {
        let mut family = [0u8; 1];
        stream.read_exact(&mut family).expect("a network family");
        let rest = match family[0] {
            4 => 4 + 1,
            6 => 16 + 1,
            other => panic!("network family {other}"),
        };
        stream.read_exact(&mut vec![0u8; rest]).expect("a network");
    }
    // Last, whether the rank listens on every address.
    stream
        .read_exact(&mut [0u8; 1])
        .expect("where the rank listens");
}

#[test]
fn a_store_that_closes_without_an_answer_is_named() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a listener");
    let port = listener.local_addr().expect("its address").port();
    // A "store" that reads the registration and hangs up.
    let store = thread::spawn(move || {
        let (mut stream, _) = listener.accept().expect("the rank's connection");
        // All of it, so that closing sends an orderly end of stream rather than a reset. The
        // timeout only bounds a wait for bytes that never come.
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .expect("a read timeout");
        read_registration(&mut stream);
    });
    let err = rank(1, 2, port, Duration::from_secs(10)).expect_err("the store hung up");
    store.join().expect("the store thread");
    let text = err.to_string();
    assert!(
        text.contains(&format!(
            "the rendezvous store at 127.0.0.1:{port} (rank 0)"
        )) && text.contains("registering rank 1")
            && text.contains("closed the connection without an answer")
            && !text.contains("failed to fill whole buffer"),
        "{text}"
    );
}

#[test]
fn a_connection_evicted_from_a_full_store_is_told_why() {
    let port = free_port();
    let root = thread::spawn(move || rank(0, 2, port, Duration::from_secs(60)));
    let connect = || loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(stream) => break stream,
            Err(_) => thread::sleep(Duration::from_millis(20)),
        }
    };
    // Silent connections, one more than the store has handshake slots: the oldest makes
    // room for the newest and is told why.
    let mut oldest = connect();
    oldest
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("a read timeout");
    let others: Vec<TcpStream> = (0..64).map(|_| connect()).collect();
    let mut answer = Vec::new();
    let _ = oldest.read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer);
    assert!(
        text.contains("evicted") && text.contains("rendezvous store of rank 0"),
        "{text:?}"
    );
    drop(others);
    // Rank 1 still gets in.
    let other = thread::spawn(move || rank(1, 2, port, Duration::from_secs(60)));
    root.join()
        .expect("rank 0's thread")
        .expect("rank 0 bootstraps");
    other
        .join()
        .expect("rank 1's thread")
        .expect("rank 1 bootstraps");
}
