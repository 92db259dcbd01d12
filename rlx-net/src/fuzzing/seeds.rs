//! The seed corpus of the fuzz targets in the parent module: valid encodings from this crate's
//! encoders and a few malformed inputs per target, written under `fuzz/corpus/` and replayed
//! by the tests.

use rlx_transport::fuzzing::{Corpus, Seed};
use rlx_transport::topology::Subnet;

use super::*;

/// Valid encodings from this crate's encoders and a few malformed inputs, for every target
/// above: the seed corpus under `fuzz/corpus/`.
pub fn seeds() -> Vec<Seed> {
    let mut c = Corpus::default();
    frame_header_seeds(&mut c);
    handshake_acceptor_seeds(&mut c);
    handshake_connector_seeds(&mut c);
    store_server_seeds(&mut c);
    store_client_seeds(&mut c);
    admission_seeds(&mut c);
    c.into_seeds()
}

/// Seeds of the frame header: one of each kind, a huge length, a reserved byte.
fn frame_header_seeds(c: &mut Corpus) {
    let data = FrameHeader {
        kind: FrameKind::Data,
        tag: Tag::op(3, 9, 1),
        seq: 7,
        total: 1 << 16,
        offset: 4096,
        len: 8192,
    };
    c.add("frame_header", "data", data.encode().to_vec());
    let failure = FrameHeader::whole(
        FrameKind::Failure,
        Tag::from_raw(5),
        1,
        FAILURE_WIRE_LEN as u64,
    );
    c.add("frame_header", "failure", failure.encode().to_vec());
    let close = FrameHeader::whole(FrameKind::Close, Tag::from_raw(0), 0, 0);
    c.add("frame_header", "close", close.encode().to_vec());
    let pull = FrameHeader::whole(FrameKind::SingleCopy, Tag::op(1, 7, 0), 2, 1 << 20);
    c.add("frame_header", "single-copy", pull.encode().to_vec());
    let offer = FrameHeader::whole(FrameKind::Offer, Tag::from_raw(0), 0, OFFER_LEN as u64);
    c.add("frame_header", "single-copy-offer", offer.encode().to_vec());
    let huge = FrameHeader::whole(FrameKind::Data, Tag::from_raw(0), 0, 1 << 62);
    c.add("frame_header", "length-2-62", huge.encode().to_vec());
    c.add(
        "frame_header",
        "length-2-62-under-max-cap",
        [&huge.encode()[..], &u64::MAX.to_le_bytes()].concat(),
    );
    let mut reserved = data.encode();
    reserved[3] = 1;
    c.add("frame_header", "reserved-byte", reserved.to_vec());
}

/// Seeds of a link's acceptor: hellos with and without a secret's proof, and a stranger.
fn handshake_acceptor_seeds(c: &mut Corpus) {
    let hello = fixed_hello(false).encode();
    c.add(
        "handshake_acceptor",
        "rank-2",
        [&[0u8][..], &hello].concat(),
    );
    c.add(
        "handshake_acceptor",
        "rank-2-store",
        [&[2u8][..], &hello].concat(),
    );
    let secret_hello = fixed_hello(true).encode();
    let proof = handshake::mac(SECRET, Side::Connector, &secret_hello, &NONCE);
    c.add(
        "handshake_acceptor",
        "rank-2-secret-proof",
        [&[1u8][..], &secret_hello, &proof].concat(),
    );
    let mut stranger = hello;
    stranger[..8].copy_from_slice(b"GET / HT");
    c.add(
        "handshake_acceptor",
        "wrong-magic",
        [&[0u8][..], &stranger].concat(),
    );
}

/// Seeds of a link's connector: acceptances, refusals, verdicts, a reason too long.
fn handshake_connector_seeds(c: &mut Corpus) {
    let secret_hello = fixed_hello(true).encode();
    let accept = Reply {
        refusal: None,
        rank: 1,
        world_size: WORLD,
        nonce: NONCE,
        mac: [0; MAC_LEN],
    };
    c.add(
        "handshake_connector",
        "accepted",
        [&[0u8][..], &accept.encode()].concat(),
    );
    let busy = Reply {
        refusal: Some(Refusal::new(RefusalCode::Busy, "no room")),
        ..accept.clone()
    };
    c.add(
        "handshake_connector",
        "busy",
        [&[0u8][..], &busy.encode()].concat(),
    );
    let duplicate = Reply {
        refusal: Some(Refusal::new(RefusalCode::Duplicate, "duplicate rank 2")),
        ..accept.clone()
    };
    c.add(
        "handshake_connector",
        "duplicate",
        [&[0u8][..], &duplicate.encode()].concat(),
    );
    let proven = Reply {
        mac: handshake::mac(SECRET, Side::Acceptor, &secret_hello, &NONCE),
        ..accept.clone()
    };
    for (name, verdict) in [
        ("secret-ok", VERDICT_OK),
        ("secret-duplicate", VERDICT_DUPLICATE),
    ] {
        c.add(
            "handshake_connector",
            name,
            [&[1u8][..], &proven.encode(), &[verdict]].concat(),
        );
    }
    let mut long_reason = busy.encode();
    long_reason[REPLY_LEN - 2..REPLY_LEN].copy_from_slice(&600u16.to_le_bytes());
    c.add(
        "handshake_connector",
        "reason-too-long",
        [&[0u8][..], &long_reason].concat(),
    );
}

/// Seeds of the rendezvous store's server: registrations, cut short, of too many addresses.
fn store_server_seeds(c: &mut Corpus) {
    let registration = Registration {
        instance: 41,
        addrs: vec![
            SocketAddr::from(([10, 0, 0, 1], 7000)),
            "[fe80::1%3]:7001".parse().unwrap_or(store_addr()),
        ],
        networks: vec![Subnet {
            addr: [10, 0, 0, 1].into(),
            prefix: 30,
        }],
        listens_everywhere: true,
    };
    let nonce = [9u8; 16];
    let registered = encode_registration(&boot_config(1, false), &registration, &nonce);
    c.add("store_server", "rank-1", registered.clone());
    c.add(
        "store_server",
        "rank-0",
        encode_registration(&boot_config(0, false), &registration, &nonce),
    );
    c.add(
        "store_server",
        "truncated",
        registered[..registered.len() - 3].to_vec(),
    );
    let mut many = registered.clone();
    many[64] = 17;
    c.add("store_server", "17-addresses", many);
    c.add(
        "store_server",
        "stranger",
        b"GET / HTTP/1.1\r\n\r\n".to_vec(),
    );
}

/// Seeds of the rendezvous store's client: tables, refusals, a reason of the largest length.
fn store_client_seeds(c: &mut Corpus) {
    let table: Vec<Registration> = (0..WORLD)
        .map(|r| Registration {
            instance: u64::from(r) + 40,
            addrs: vec![SocketAddr::from(([10, 0, 0, r as u8], 7000))],
            networks: vec![Subnet {
                addr: [10, 0, 0, r as u8].into(),
                prefix: 24,
            }],
            listens_everywhere: r % 2 == 0,
        })
        .collect();
    let without_secret = |answer: Vec<u8>| [&[0u8][..], &answer].concat();
    c.add(
        "store_client",
        "table",
        without_secret(store_reply(Ok(&table))),
    );
    c.add(
        "store_client",
        "short-table",
        without_secret(store_reply(Ok(&table[..2]))),
    );
    let refusal = Refusal::new(RefusalCode::Busy, "no room");
    c.add(
        "store_client",
        "busy",
        without_secret(store_reply(Err(&refusal))),
    );
    let mut huge_reason = store_reply(Err(&refusal));
    huge_reason[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
    c.add(
        "store_client",
        "reason-length-max",
        without_secret(huge_reason),
    );
    c.add(
        "store_client",
        "table-to-a-rank-with-a-secret",
        [&[1u8][..], &store_reply(Ok(&table))].concat(),
    );
}

/// Seeds of the admission desk: a joiner admitted or refused, requests, a plan.
fn admission_seeds(c: &mut Corpus) {
    let plan = Plan {
        host: "10.0.0.7".to_owned(),
        port: 41000,
        job_id: "store:10.0.0.1:29500/grown-00ff".to_owned(),
    }
    .encode();
    let mut admitted = vec![0u8, CHALLENGE];
    admitted.extend_from_slice(&NONCE);
    admitted.extend_from_slice(&[0; MAC_LEN]);
    admitted.push(ADMITTED);
    for word in [4u32, 6, plan.len() as u32] {
        admitted.extend_from_slice(&word.to_le_bytes());
    }
    admitted.extend_from_slice(&plan);
    c.add("admission", "joiner-admitted", admitted.clone());
    let mut secret_joiner = admitted;
    secret_joiner[0] = 1;
    c.add("admission", "joiner-secret", secret_joiner);
    let reason = b"the group is not growing";
    let mut refused = vec![0u8, REFUSED];
    refused.extend_from_slice(&(reason.len() as u16).to_le_bytes());
    refused.extend_from_slice(reason);
    c.add("admission", "joiner-refused", refused);
    let mut request = vec![2u8];
    request.extend_from_slice(JOIN_MAGIC);
    request.extend_from_slice(&handshake::job_digest(JOB));
    request.extend_from_slice(&NONCE);
    request.extend_from_slice(&[0; MAC_LEN]);
    c.add("admission", "desk-request", request.clone());
    request[0] = 3;
    c.add("admission", "desk-request-secret", request);
    c.add("admission", "plan", [&[4u8][..], &plan].concat());
}
