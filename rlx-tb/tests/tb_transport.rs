//! `ThunderboltTransport` jobs in network namespaces: every rank is a real process in its own
//! namespace, launched the way a user launches one (`RLX_RANK`, `RLX_MASTER_ADDR`,
//! `RLX_HOSTFILE`, ... read by `ThunderboltTransport::from_env`), joined to the others by veth
//! links named `thunderbolt0` (and `thunderbolt1`) that meet on a bridge in a hub namespace.
//!
//! - All-to-all point-to-point messages and barriers, through the rendezvous store over IPv4
//!   and through a hostfile of IPv6 link-local addresses with their scopes; with two links per
//!   rank, a hostfile listing two addresses per rank.
//! - The symmetric heap (put, get, fetch-add, compare-swap, put-with-signal and `wait_until`,
//!   remote bounds errors) over the pinned links, and 10,000 random puts, gets and fetch-adds
//!   from 4 ranks checked against each rank's model (`heap_model/mod.rs`).
//! - Each successful job is shown to use only the Thunderbolt links: while the ranks hold
//!   their connections, `ss` in every namespace must list every TCP socket (listeners,
//!   connections, closed store connections) as bound to a link (`addr%thunderbolt0:port`),
//!   with one established connection per peer and link.
//! - The inspection's control: the same job over the unpinned `TcpTransport` must fail it.
//! - Refusals: a rendezvous reachable only over `other0` fails every rank with a `Config` error
//!   naming `other0`, and a namespace without a Thunderbolt link fails with the `Config` error
//!   listing its interfaces; the same job with `RLX_TB_IFNAME==other0` (the user's explicit
//!   choice) builds, so the refusal is the transport's, not the network's.
//!
//! The binary is its own runner (`harness = false`): without `RLX_TB_TEST_MODE` it is the
//! parent, which creates the namespaces (uniquely named, removed on every path), starts the
//! ranks as copies of itself under `ip netns exec`, and checks them; with it, it is one rank.
//! The namespaces come from `netns/mod.rs`. The tests in namespaces need root; without it they
//! show as ignored with that reason (and fail under `CI=true`), and the tests on the host's own
//! network still run.

mod heap_model;
mod netns;
mod trials;

use heap_model::check;

use std::io::Write;
use std::process::ExitCode;

use netns::{Net, Shape, other_v4, v4, v6};
use rlx_tb::{ThunderboltHeap, ThunderboltTransport};
use rlx_transport::symmetric::SymmetricTransport;
use rlx_transport::{CollectiveError, Result, Transport};

const MODE_ENV: &str = "RLX_TB_TEST_MODE";
/// Random heap operations per rank: 10,000 from a 4-rank job.
const RANDOM_OPS_PER_RANK: usize = 2500;

// ----- the ranks ---------------------------------------------------------------------------

/// The bytes rank `from` sends rank `to` in `round`; the lengths cover empty, small, and (in
/// the last round) striped messages.
fn payload(from: u32, to: u32, round: u32) -> Vec<u8> {
    let len = match round {
        0 => 0,
        1 => 3000 + 17 * from as usize,
        2 => 100_000 + 5 * to as usize,
        _ => (2 << 20) + 3,
    };
    (0..len)
        .map(|i| (i as u32).wrapping_mul(31) ^ from.wrapping_mul(7) ^ to.wrapping_mul(101))
        .map(|x| x as u8)
        .collect()
}

/// Every rank sends every other rank a message per round and checks what it receives.
fn all_to_all(t: &dyn Transport) -> Result<()> {
    let n = t.world_size();
    let me = t.rank();
    let peers: Vec<u32> = (0..n).filter(|&p| p != me).collect();
    // Small rounds: everything sent first, then everything received.
    for round in 0..3 {
        for &peer in &peers {
            t.send_bytes(peer, 10 + round, &payload(me, peer, round))?;
        }
        for &peer in &peers {
            let got = t.recv_bytes(peer, 10 + round)?;
            check(got == payload(peer, me, round), || {
                format!(
                    "rank {me} round {round}: wrong {} bytes from {peer}",
                    got.len()
                )
            })?;
        }
        t.barrier()?;
    }
    // The large round pairwise in peer order (the lower rank sends first), which needs no
    // buffering beyond one message in flight per pair.
    for &peer in &peers {
        let expect = payload(peer, me, 3);
        let mine = payload(me, peer, 3);
        let got = if me < peer {
            t.send_bytes(peer, 13, &mine)?;
            t.recv_bytes(peer, 13)?
        } else {
            let got = t.recv_bytes(peer, 13)?;
            t.send_bytes(peer, 13, &mine)?;
            got
        };
        check(got == expect, || {
            format!("rank {me}: wrong large message from {peer}")
        })?;
    }
    t.barrier()
}

fn heap_operations(t: &ThunderboltHeap) -> Result<()> {
    let n = t.world_size();
    let me = t.rank();
    let next = (me + 1) % n;
    let prev = (me + n - 1) % n;
    let slots = t.alloc(u64::from(n) * 64)?;
    let flag = t.alloc(8)?;
    let counter = t.alloc(8)?;
    let words = t.alloc(u64::from(n) * 8)?;
    let big = t.alloc(256 << 10)?;

    // Put-with-signal around the ring: the data is visible when the signal is.
    heap_model::ring_put_signal(t, slots, flag)?;

    // Atomics on rank 0: every rank sets its own bit and claims its own word once.
    let old = t.fetch_add(0, counter.offset(), 1 << me)?;
    check(old & (1 << me) == 0, || {
        format!("rank {me}: bit already set in {old:#x}")
    })?;
    let word = words.at(u64::from(me) * 8, 8)?;
    let first = t.compare_swap(0, word, 0, 100 + u64::from(me))?;
    let second = t.compare_swap(0, word, 0, 7)?;
    check(first == 0 && second == 100 + u64::from(me), || {
        format!("rank {me}: compare-swap gave {first} then {second}")
    })?;

    // A get of a pattern the neighbour wrote locally, and a put into the previous rank.
    let pattern = |rank: u32, i: usize| (i as u8).wrapping_mul(13) ^ (rank as u8).wrapping_mul(59);
    let mine: Vec<u8> = (0..(256usize << 10)).map(|i| pattern(me, i)).collect();
    t.heap().write(big.offset(), &mine)?;
    t.barrier()?;
    let mut theirs = vec![0u8; 256 << 10];
    t.get(next, big.offset(), &mut theirs)?;
    let wrong = (0..theirs.len()).position(|i| theirs[i] != pattern(next, i));
    check(wrong.is_none(), || {
        format!("rank {me}: byte {wrong:?} of the get from rank {next} is wrong")
    })?;
    t.barrier()?;
    t.put(prev, big.offset(), &[me as u8; 1000])?;
    t.barrier()?;
    let mut landed = [0u8; 1000];
    t.heap().read(big.offset(), &mut landed)?;
    check(landed == [next as u8; 1000], || {
        format!("rank {me}: the put from rank {next} is not visible after the barrier")
    })?;

    // Bounds errors come back to the initiator, naming the target.
    let size = t.heap().size();
    match t.put(next, size - 4, &[0u8; 8]) {
        Err(CollectiveError::OutOfBounds { rank, .. }) if rank == next => {}
        other => {
            return Err(CollectiveError::invalid(format!(
                "out-of-bounds put gave {other:?}"
            )));
        }
    }
    let mut total = [0u8; 8];
    t.get(0, counter.offset(), &mut total)?;
    let total = u64::from_le_bytes(total);
    check(total == (1 << n) - 1, || {
        format!("rank {me}: counter is {total:#x}")
    })?;
    t.barrier()
}

/// Tells the parent this rank is connected (and on which links), then holds the connections
/// until the parent has inspected them.
fn hold_for_inspection(t: &dyn Transport, links: &[rlx_tb::Interface]) -> Result<()> {
    let names: Vec<&str> = links.iter().map(|l| l.name.as_str()).collect();
    println!("READY {}", names.join(","));
    std::io::stdout()
        .flush()
        .map_err(|source| CollectiveError::Io { peer: None, source })?;
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .map_err(|source| CollectiveError::Io { peer: None, source })?;
    t.barrier()
}

fn run_rank(mode: &str) -> Result<()> {
    match mode {
        "p2p" => {
            let t = ThunderboltTransport::from_env()?;
            all_to_all(&t)?;
            hold_for_inspection(&t, t.links())
        }
        "heap" => {
            let heap = ThunderboltTransport::from_env()?.with_heap(1 << 20)?;
            heap_operations(&heap)?;
            let links = heap.inner().links().to_vec();
            hold_for_inspection(&heap, &links)
        }
        "heap_random" => {
            let heap = ThunderboltTransport::from_env()?.with_heap(1 << 16)?;
            heap_model::random_operations(&heap, RANDOM_OPS_PER_RANK)?;
            let links = heap.inner().links().to_vec();
            hold_for_inspection(&heap, &links)
        }
        "tcp" => {
            // The plain TCP transport, unpinned: the control of the socket inspection.
            let t = rlx_net::TcpTransport::from_env()?;
            all_to_all(&t)?;
            hold_for_inspection(&t, &[])
        }
        "build" => {
            // The outcome of building is what the parent checks, on stdout.
            match ThunderboltTransport::from_env() {
                Ok(t) => {
                    println!("BUILT {}", t.home_link().name);
                    t.barrier()
                }
                Err(e @ CollectiveError::Config { .. }) => {
                    println!("CONFIG ERROR {e}");
                    Ok(())
                }
                Err(e) => {
                    println!("OTHER ERROR {e}");
                    Ok(())
                }
            }
        }
        other => Err(CollectiveError::invalid(format!("unknown mode {other}"))),
    }
}

// ----- the parent ------------------------------------------------------------------------

fn vars(pairs: &[(&str, String)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.clone()))
        .collect()
}

fn store_env(addr: String, port: u16) -> impl Fn(u32) -> Vec<(String, String)> {
    move |_| {
        vars(&[
            ("RLX_MASTER_ADDR", addr.clone()),
            ("RLX_MASTER_PORT", port.to_string()),
        ])
    }
}

fn hostfile_env(hostfile: String) -> impl Fn(u32) -> Vec<(String, String)> {
    move |_| vars(&[("RLX_HOSTFILE", hostfile.clone())])
}

/// Runs a job that must succeed, then inspects its sockets while the ranks hold them.
fn connected_job(
    shape: &Shape,
    mode: &str,
    links: &[&str],
    env: impl Fn(u32) -> Vec<(String, String)>,
) -> std::result::Result<(), String> {
    let mut net = Net::create(shape)?;
    let mut job = net.launch(MODE_ENV, mode, env)?;
    let said = net.first_lines(&mut job)?;
    let expected = format!("READY {}", links.join(","));
    if let Some(odd) = said.iter().find(|l| **l != expected) {
        let why = net.finish(&mut job).err().unwrap_or_default();
        return Err(format!("a rank said {odd:?}, not {expected:?}; {why}"));
    }
    let pinned = net.check_pinned(links);
    let finished = net.finish(&mut job);
    pinned.and(finished)
}

// ----- the tests ---------------------------------------------------------------------------

const FOUR_RANKS: Shape = Shape {
    ranks: 4,
    links: 1,
    other: false,
    without_thunderbolt: None,
};

fn store_ipv4_all_to_all() -> std::result::Result<(), String> {
    connected_job(
        &FOUR_RANKS,
        "p2p",
        &["thunderbolt0"],
        store_env(v4(0, 0), 29400),
    )
}

fn hostfile_ipv6_link_local_all_to_all() -> std::result::Result<(), String> {
    let entries: Vec<String> = (0..4)
        .map(|r| format!("[\"[{}%thunderbolt0]:7100\"]", v6(0, r)))
        .collect();
    let hostfile = format!("[{}]", entries.join(","));
    connected_job(
        &FOUR_RANKS,
        "p2p",
        &["thunderbolt0"],
        hostfile_env(hostfile),
    )
}

fn hostfile_two_links_per_peer() -> std::result::Result<(), String> {
    let shape = Shape {
        links: 2,
        ..FOUR_RANKS
    };
    let entries: Vec<String> = (0..4)
        .map(|r| format!("[\"{}:7200\", \"{}:7201\"]", v4(0, r), v4(1, r)))
        .collect();
    let hostfile = format!("[{}]", entries.join(","));
    connected_job(
        &shape,
        "p2p",
        &["thunderbolt0", "thunderbolt1"],
        hostfile_env(hostfile),
    )
}

fn store_heap_random_operations_match_the_model() -> std::result::Result<(), String> {
    connected_job(
        &FOUR_RANKS,
        "heap_random",
        &["thunderbolt0"],
        store_env(v4(0, 0), 29406),
    )
}

fn store_ipv6_link_local_all_to_all() -> std::result::Result<(), String> {
    let store = format!("{}%thunderbolt0", v6(0, 0));
    connected_job(
        &FOUR_RANKS,
        "p2p",
        &["thunderbolt0"],
        store_env(store, 29405),
    )
}

fn store_heap() -> std::result::Result<(), String> {
    connected_job(
        &FOUR_RANKS,
        "heap",
        &["thunderbolt0"],
        store_env(v4(0, 0), 29401),
    )
}

/// The control of the inspection: the same job over the plain TCP transport must be caught
/// with unpinned sockets, or the inspection would prove nothing.
fn the_inspection_catches_unpinned_sockets() -> std::result::Result<(), String> {
    let mut net = Net::create(&FOUR_RANKS)?;
    let mut job = net.launch(MODE_ENV, "tcp", store_env(v4(0, 0), 29404))?;
    net.first_lines(&mut job)?;
    let pinned = net.check_pinned(&["thunderbolt0"]);
    net.finish(&mut job)?;
    match pinned {
        Err(why) if why.contains("is not pinned to") => Ok(()),
        other => Err(format!(
            "the inspection let unpinned sockets pass: {other:?}"
        )),
    }
}

/// The TCP transport underneath, unpinned, with the store on a link-local address: every rank
/// scopes the link-local addresses of the table to its link towards the store (what lets the
/// Thunderbolt transport use a link-local store on macOS, where a scope id is required).
fn plain_tcp_over_a_link_local_store() -> std::result::Result<(), String> {
    let mut net = Net::create(&FOUR_RANKS)?;
    let store = format!("{}%thunderbolt0", v6(0, 0));
    let mut job = net.launch(MODE_ENV, "tcp", store_env(store, 29407))?;
    let said = net.first_lines(&mut job)?;
    let finished = net.finish(&mut job);
    match said.iter().find(|l| l.trim() != "READY") {
        Some(odd) => Err(format!("a rank said {odd:?}; {finished:?}")),
        None => finished,
    }
}

/// A loopback port below the ephemeral range (see `rlx_transport::ports`).
fn free_port() -> std::result::Result<u16, String> {
    rlx_transport::ports::free_loopback_ports(1)
        .map(|ports| ports[0])
        .map_err(|e| format!("no free loopback port: {e}"))
}

/// Without namespaces: the user may name any interface as the link, here loopback, and then
/// every socket of every rank is pinned to it.
fn loopback_chosen_explicitly_all_to_all() -> std::result::Result<(), String> {
    let mut net = Net::host(3);
    let store = store_env("127.0.0.1".to_owned(), free_port()?);
    let mut job = net.launch(MODE_ENV, "p2p", move |rank| {
        let mut env = store(rank);
        env.push(("RLX_TB_IFNAME".to_owned(), "=lo".to_owned()));
        env
    })?;
    let said = net.first_lines(&mut job)?;
    if let Some(odd) = said.iter().find(|l| *l != "READY lo") {
        let why = net.finish(&mut job).err().unwrap_or_default();
        return Err(format!("a rank said {odd:?}; {why}"));
    }
    let pinned = net.check_pinned(&["lo"]);
    let finished = net.finish(&mut job);
    pinned.and(finished)
}

/// Without namespaces: an override that names no interface fails every rank with a `Config`
/// error listing the interfaces seen.
fn a_missing_link_is_a_config_error() -> std::result::Result<(), String> {
    let mut net = Net::host(2);
    let store = store_env("127.0.0.1".to_owned(), free_port()?);
    let mut job = net.launch(MODE_ENV, "build", move |rank| {
        let mut env = store(rank);
        env.push(("RLX_TB_IFNAME".to_owned(), "=rlxnolink0".to_owned()));
        env
    })?;
    let said = net.first_lines(&mut job)?;
    net.finish(&mut job)?;
    let want = "CONFIG ERROR configuration error: RLX_TB_IFNAME==rlxnolink0 selects no interface";
    match said
        .iter()
        .find(|l| !l.starts_with(want) || !l.contains("lo (not Thunderbolt"))
    {
        Some(odd) => Err(format!("a rank said {odd:?}")),
        None => Ok(()),
    }
}

fn refuses_other_networks() -> std::result::Result<(), String> {
    let shape = Shape {
        other: true,
        without_thunderbolt: Some(3),
        ..FOUR_RANKS
    };
    let mut net = Net::create(&shape)?;
    // The store on rank 0's other0 address: reachable, but not over Thunderbolt.
    let mut job = net.launch(MODE_ENV, "build", store_env(other_v4(0), 29402))?;
    let said = net.first_lines(&mut job)?;
    net.finish(&mut job)?;
    let expect = [
        "belongs to interface other0, not to a Thunderbolt link",
        "leaves through other0",
        "leaves through other0",
        "no Thunderbolt link is up",
    ];
    for (rank, (line, want)) in said.iter().zip(expect).enumerate() {
        if !line.starts_with("CONFIG ERROR") || !line.contains(want) {
            return Err(format!(
                "rank {rank} said {line:?}, expected a config error with {want:?}"
            ));
        }
    }
    if !said[3].contains("other0 (not Thunderbolt") {
        return Err(format!(
            "rank 3 did not list the interfaces it saw: {:?}",
            said[3]
        ));
    }
    // The user may choose other0 explicitly, and then the same job builds over it.
    let chosen = store_env(other_v4(0), 29403);
    let mut job = net.launch(MODE_ENV, "build", move |rank| {
        let mut env = chosen(rank);
        env.push(("RLX_TB_IFNAME".to_owned(), "=other0".to_owned()));
        env
    })?;
    let said = net.first_lines(&mut job)?;
    net.finish(&mut job)?;
    if let Some(odd) = said.iter().find(|l| **l != "BUILT other0") {
        return Err(format!("with RLX_TB_IFNAME==other0 a rank said {odd:?}"));
    }
    Ok(())
}

type Test = (&'static str, trials::Body);

/// Tests on this host's own network, which run without root.
const HOST_TESTS: &[Test] = &[
    (
        "loopback_chosen_explicitly_all_to_all",
        loopback_chosen_explicitly_all_to_all,
    ),
    (
        "a_missing_link_is_a_config_error",
        a_missing_link_is_a_config_error,
    ),
];

/// Tests in network namespaces, which need root.
const NETNS_TESTS: &[Test] = &[
    ("store_ipv4_all_to_all", store_ipv4_all_to_all),
    (
        "hostfile_ipv6_link_local_all_to_all",
        hostfile_ipv6_link_local_all_to_all,
    ),
    ("hostfile_two_links_per_peer", hostfile_two_links_per_peer),
    (
        "store_ipv6_link_local_all_to_all",
        store_ipv6_link_local_all_to_all,
    ),
    ("store_heap", store_heap),
    (
        "store_heap_random_operations_match_the_model",
        store_heap_random_operations_match_the_model,
    ),
    (
        "plain_tcp_over_a_link_local_store",
        plain_tcp_over_a_link_local_store,
    ),
    (
        "the_inspection_catches_unpinned_sockets",
        the_inspection_catches_unpinned_sockets,
    ),
    ("refuses_other_networks", refuses_other_networks),
];

fn main() -> ExitCode {
    if let Ok(mode) = std::env::var(MODE_ENV) {
        return match run_rank(&mode) {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => {
                eprintln!("rank mode {mode}: {err}");
                ExitCode::FAILURE
            }
        };
    }
    let netns = netns::unavailable();
    let host = HOST_TESTS
        .iter()
        .map(|&(name, body)| trials::trial(name, body, None));
    let in_namespaces = NETNS_TESTS
        .iter()
        .map(|&(name, body)| trials::trial(name, body, netns));
    trials::run(host.chain(in_namespaces).collect())
}
