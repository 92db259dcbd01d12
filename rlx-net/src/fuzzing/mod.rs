//! The bodies of the fuzz targets over the bytes this transport reads from strangers and peers:
//! frame headers, both sides of the link handshake, both ends of the rendezvous store, and both
//! sides of the admission desk.
//!
//! As in [`rlx_transport::fuzzing`], each target maps arbitrary bytes to a [`Verdict`] after
//! checking what must hold of the decoder's answer; the `cargo fuzz` targets of the `fuzz/`
//! crate and the replay tests of this crate call the same functions. The exchanges that run on
//! sockets in production run here on a [`Script`]: the fuzz input is everything the other side
//! sends, and what this side writes is collected and checked.
//!
//! Not a stable API: hidden from the documentation, for the fuzz crate and the replay tests.
//! The seed corpus of every target is in `seeds.rs`.

mod seeds;

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::time::Duration;

use rlx_transport::fuzzing::{Verdict, check};
use rlx_transport::{CollectiveError, FAILURE_WIRE_LEN, Rendezvous, Tag};

use crate::admission::Plan;
use crate::admission::desk::{
    self, ADMITTED, CHALLENGE, Credentials, MAGIC as JOIN_MAGIC, MAX_PLAN, REFUSED,
};
use crate::auth::MAC_LEN;
use crate::bootstrap::{
    BootConfig, Registration, connector_exchange, encode_registration, read_registration,
    store_exchange, store_reply,
};
use crate::frame::{FrameHeader, FrameKind, HEADER_LEN, OFFER_LEN};
use crate::handshake::{
    self, Expectation, HELLO_LEN, Hello, MAX_REASON, PROTOCOL_VERSION, REPLY_LEN, Refusal,
    RefusalCode, Reply, Side, VERDICT_DUPLICATE, VERDICT_OK,
};

pub use self::seeds::seeds;

/// The other side of an exchange: reads come from `input` (then end of file), writes are kept.
#[derive(Debug)]
pub struct Script<'a> {
    input: &'a [u8],
    /// Everything this side wrote.
    pub output: Vec<u8>,
}

impl<'a> Script<'a> {
    /// A peer that sends `input` and then closes.
    pub fn new(input: &'a [u8]) -> Self {
        Script {
            input,
            output: Vec::new(),
        }
    }
}

impl Read for Script<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.input.read(buf)
    }
}

impl Write for Script<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.output.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The frame cap of the `frame_header` target when its input does not choose one.
const FUZZ_FRAME_CAP: u64 = 1 << 20;
/// The world of the handshake, store and admission targets.
const WORLD: u32 = 4;
/// The job id of those targets.
const JOB: &str = "fuzz";
/// The job secret of their secret-holding variants.
const SECRET: &[u8] = b"fuzz-secret";
/// The nonce of the fixed hellos and replies, so that seeds can carry valid proofs.
const NONCE: [u8; 16] = [7; 16];

/// A bootstrap configuration of rank `rank` in the fuzz world, with or without the secret.
fn boot_config(rank: u32, secret: bool) -> BootConfig {
    BootConfig {
        rank,
        world: WORLD,
        rendezvous: Rendezvous::Store {
            host: "127.0.0.1".to_owned(),
            port: 1,
        },
        connect_timeout: Duration::from_secs(1),
        hello_timeout: Duration::from_secs(1),
        job: handshake::job_digest(JOB),
        secret: secret.then(|| SECRET.to_vec()),
        links: 2,
        bind_ip: None,
        ifname: None,
        socket_setup: None,
    }
}

fn store_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 1))
}

fn io_error(e: io::Error) -> CollectiveError {
    CollectiveError::Io {
        peer: Some(0),
        source: e,
    }
}

/// Target `frame_header`: 48 header bytes, then optionally 8 bytes of frame cap. An accepted
/// header encodes back to the same bytes, its range lies inside its message, the message
/// within the cap, and failure and close frames have their fixed lengths.
pub fn frame_header(data: &[u8]) -> Verdict {
    let Some((bytes, rest)) = data.split_first_chunk::<HEADER_LEN>() else {
        return Ok(());
    };
    let cap = rest
        .first_chunk::<8>()
        .map_or(FUZZ_FRAME_CAP, |c| u64::from_le_bytes(*c));
    let Ok(header) = FrameHeader::decode(5, bytes, cap) else {
        return Ok(());
    };
    check(header.encode() == *bytes, || {
        format!("{header:?} does not encode back to {bytes:02x?}")
    })?;
    check(header.total <= cap, || {
        format!("{header:?} exceeds the cap {cap}")
    })?;
    check(
        header
            .offset
            .checked_add(header.len)
            .is_some_and(|end| end <= header.total),
        || format!("{header:?} lies outside its message"),
    )?;
    match header.kind {
        FrameKind::Data => Ok(()),
        FrameKind::Failure => check(
            header.total == FAILURE_WIRE_LEN as u64 && header.len == header.total,
            || format!("failure frame {header:?}"),
        ),
        FrameKind::Close => check(header.total == 0, || format!("close frame {header:?}")),
        FrameKind::Beat => check(header.total == 0, || format!("heartbeat frame {header:?}")),
        FrameKind::Lane => check(header.total == 0, || {
            format!("lane switch frame {header:?}")
        }),
        FrameKind::Offer => check(
            header.total == OFFER_LEN as u64 && header.len == header.total,
            || format!("single-copy offer {header:?}"),
        ),
        FrameKind::SingleCopy => check(
            header.total > 0 && header.offset == 0 && header.len == header.total,
            || format!("single-copy frame {header:?}"),
        ),
    }
}

/// The hello that the handshake targets' connector (rank 2, link 0) sends.
fn fixed_hello(secret: bool) -> Hello {
    Hello {
        version: PROTOCOL_VERSION,
        has_secret: secret,
        job: handshake::job_digest(JOB),
        world_size: WORLD,
        rank: 2,
        link: 0,
        links: 2,
        instance: 42,
        nonce: NONCE,
    }
}

/// Target `handshake_acceptor`: one flags byte (bit 0: the acceptor holds the secret, bit 1: it
/// knows the process instances from a store), the 72-byte hello, then the connector's proof.
/// A decoded hello re-encodes to a hello that decodes equal; an accepted one is of this job,
/// version, world and secret setting, from a rank above the acceptor, on a link that exists,
/// and (with a store) of the registered instance; a proof verifies exactly when it is the
/// connector's MAC.
pub fn handshake_acceptor(data: &[u8]) -> Verdict {
    let Some((&flags, rest)) = data.split_first() else {
        return Ok(());
    };
    let Some((hello_bytes, proof)) = rest.split_first_chunk::<HELLO_LEN>() else {
        return Ok(());
    };
    let instances = [40, 41, 42, 43];
    let expect = Expectation {
        job: handshake::job_digest(JOB),
        world_size: WORLD,
        my_rank: 1,
        links: 2,
        has_secret: flags & 1 != 0,
        instances: (flags & 2 != 0).then_some(&instances[..]),
    };
    let hello = match Hello::decode(hello_bytes) {
        Ok(hello) => hello,
        Err(refusal) => return short_reason(&refusal),
    };
    let again = Hello::decode(&hello.encode()).map_err(|r| r.reason)?;
    check(again == hello, || {
        format!("{hello:?} re-encodes to a hello that decodes as {again:?}")
    })?;
    if let Err(refusal) = handshake::check_hello(&hello, &expect) {
        return short_reason(&refusal);
    }
    check(
        hello.version == PROTOCOL_VERSION
            && hello.job == expect.job
            && hello.world_size == WORLD
            && hello.has_secret == expect.has_secret
            && hello.rank > expect.my_rank
            && hello.rank < WORLD
            && hello.links == expect.links
            && hello.link < hello.links,
        || format!("{hello:?} was accepted by {expect:?}"),
    )?;
    if let Some(instances) = expect.instances {
        check(instances[hello.rank as usize] == hello.instance, || {
            format!("{hello:?} was accepted with another instance")
        })?;
    }
    if expect.has_secret
        && let Some(theirs) = proof.first_chunk::<MAC_LEN>()
    {
        let expected = handshake::mac(SECRET, Side::Connector, hello_bytes, &NONCE);
        let verified = handshake::verify_mac(SECRET, Side::Connector, hello_bytes, &NONCE, theirs);
        check(verified == (*theirs == expected), || {
            "the proof's verification disagrees with the MAC".to_owned()
        })?;
    }
    Ok(())
}

fn short_reason(refusal: &Refusal) -> Verdict {
    check(refusal.reason.len() <= MAX_REASON, || {
        format!("a refusal reason of {} bytes", refusal.reason.len())
    })
}

/// Target `handshake_connector`: one flags byte (bit 0: the connector holds the secret), then
/// everything the acceptor (rank 1) answers the connector's hello with. The link is established
/// only after a reply that accepts rank 2 of this world from rank 1 (and, with the secret, that
/// proves the acceptor's MAC and ends in an accepting verdict); the connector writes its own
/// proof exactly when it holds the secret, and nothing else.
pub fn handshake_connector(data: &[u8]) -> Verdict {
    let Some((&flags, answer)) = data.split_first() else {
        return Ok(());
    };
    let secret = flags & 1 != 0;
    let cfg = boot_config(2, secret);
    let hello_bytes = fixed_hello(secret).encode();
    let mut from = answer;
    let mut to = Vec::new();
    let result = connector_exchange(&cfg, 1, 0, "fuzz", &hello_bytes, &mut from, &mut to);
    let Ok(established) = result else {
        return Ok(());
    };
    let fixed = answer
        .first_chunk::<REPLY_LEN>()
        .ok_or("a link without a complete reply")?;
    let (reply, reason_len) = Reply::decode(1, fixed).map_err(|e| e.to_string())?;
    if !established {
        return check(
            reply
                .refusal
                .as_ref()
                .is_some_and(|r| r.code == RefusalCode::Busy),
            || format!("{reply:?} made the connector retry"),
        );
    }
    check(
        reply.refusal.is_none() && reply.rank == 1 && reply.world_size == WORLD,
        || format!("{reply:?} established a link"),
    )?;
    if secret {
        check(
            handshake::verify_mac(
                SECRET,
                Side::Acceptor,
                &hello_bytes,
                &reply.nonce,
                &reply.mac,
            ),
            || "a link without the acceptor's proof".to_owned(),
        )?;
        let verdict = answer.get(REPLY_LEN + reason_len).copied();
        check(verdict == Some(VERDICT_OK), || {
            format!("a link after verdict {verdict:?}")
        })?;
        let mine = handshake::mac(SECRET, Side::Connector, &hello_bytes, &reply.nonce);
        check(to == mine, || {
            "the connector's proof is not its MAC".to_owned()
        })
    } else {
        check(to.is_empty(), || {
            format!("{} bytes written without a secret", to.len())
        })
    }
}

/// Target `store_server`: a registration as a stranger or a rank sends it to the store of a
/// world of 4 (without a secret). An accepted registration is of a rank other than 0 inside
/// the world, publishes 1 to 16 addresses, keeps exactly the bytes it was read from (which the
/// secret's MACs cover), and is what the client encodes for that rank with that nonce.
pub fn store_server(data: &[u8]) -> Verdict {
    let cfg = boot_config(0, false);
    let mut r = data;
    let result = read_registration(&cfg, &mut r);
    let consumed = &data[..data.len() - r.len()];
    let received = match result {
        Ok(accepted) => accepted,
        Err(refusal) => return short_reason(&refusal),
    };
    let rank = received.rank;
    check(rank > 0 && rank < WORLD, || {
        format!("rank {rank} registered")
    })?;
    check((1..=16).contains(&received.reg.addrs.len()), || {
        format!("{} addresses registered", received.reg.addrs.len())
    })?;
    check(received.bytes == consumed, || {
        "the registration's recorded bytes differ from what was read".to_owned()
    })?;
    let nonce: [u8; 16] = consumed
        .get(REGISTRATION_NONCE_AT..REGISTRATION_NONCE_AT + 16)
        .and_then(|n| n.try_into().ok())
        .unwrap_or([0; 16]);
    let encoded = encode_registration(&boot_config(rank, false), &received.reg, &nonce);
    check(encoded == consumed, || {
        format!(
            "{:?} of rank {rank} encodes differently from what was read",
            received.reg
        )
    })
}

/// Where a registration carries its nonce: after the magic (8), version, flags (4 each), job
/// digest (16), world, rank (4 each) and instance (8).
const REGISTRATION_NONCE_AT: usize = 48;

/// Target `store_client`: the store's answers to rank 1's registration in a world of 4; the
/// first input byte chooses whether the rank holds the job secret. An accepted table lists
/// every rank, is exactly what the store encodes for it, and never comes to a rank with a
/// secret (the store's proof covers the rank's registration, which no input can forge); a
/// refusal's reason is read only up to its cap.
pub fn store_client(data: &[u8]) -> Verdict {
    let Some((&selector, input)) = data.split_first() else {
        return Ok(());
    };
    let secret = selector % 2 == 1;
    let cfg = boot_config(1, secret);
    let me = Registration {
        instance: 7,
        addrs: vec![SocketAddr::from(([10, 0, 0, 2], 7000))],
        networks: Vec::new(),
        listens_everywhere: true,
    };
    let mut script = Script::new(input);
    let result = store_exchange(&mut script, &cfg, &me, &[5; 16], store_addr(), io_error);
    let consumed = data.len() - 1 - script.input.len();
    match result {
        Err(_) | Ok(None) => check(consumed <= input.len(), || "read past the input".to_owned()),
        Ok(Some(table)) => {
            check(!secret, || {
                "a table accepted without the store proving the secret".to_owned()
            })?;
            check(table.len() == WORLD as usize, || {
                format!("a table of {} ranks", table.len())
            })?;
            let encoded = store_reply(Ok(&table));
            check(encoded == input[..consumed], || {
                format!("{table:?} encodes differently from what was read")
            })
        }
    }
}

fn credentials(secret: bool) -> Credentials {
    Credentials {
        job: handshake::job_digest(JOB),
        secret: secret.then(|| SECRET.to_vec()),
    }
}

/// Target `admission`: one selector byte, then what the other side sends. Selector mod 5: 0
/// and 1, the joiner's side without and with the secret (the input is the desk's answers);
/// 2 and 3, the desk's side without and with the secret (the input is the joiner's messages);
/// 4, the plan of a grown world. A joiner is admitted only with a rank inside its world and a
/// plan within the cap, and never by a desk that did not prove the secret (the joiner's nonce
/// is fresh, so no input can carry that proof); the desk accepts only a request of this job,
/// and with the secret never one that did not prove it; an accepted plan encodes back to the
/// same bytes.
pub fn admission(data: &[u8]) -> Verdict {
    let Some((&selector, input)) = data.split_first() else {
        return Ok(());
    };
    match selector % 5 {
        side @ (0 | 1) => {
            let secret = side == 1;
            let mut script = Script::new(input);
            let Ok(place) = desk::join_on(&mut script, store_addr(), &credentials(secret)) else {
                return Ok(());
            };
            check(!secret, || {
                "admitted by a desk that cannot know the nonce".into()
            })?;
            check(
                place.rank < place.size && place.plan.len() <= MAX_PLAN,
                || format!("admitted as {place:?}"),
            )
        }
        side @ (2 | 3) => {
            let secret = side == 3;
            let mut script = Script::new(input);
            if desk::prove_on(&mut script, &credentials(secret)).is_err() {
                return Ok(());
            }
            check(!secret, || "a joiner proved a fresh nonce".into())?;
            check(
                input.starts_with(JOIN_MAGIC)
                    && input.get(8..24) == Some(&handshake::job_digest(JOB)[..]),
                || "a request of another job was accepted".into(),
            )
        }
        _ => {
            let Ok(plan) = Plan::decode(input) else {
                return Ok(());
            };
            check(plan.encode() == input, || {
                format!("{plan:?} encodes differently from what was read")
            })
        }
    }
}
