//! The opening exchange of every link: who is calling, for which job, and (optionally) proof
//! that both sides hold the job secret.
//!
//! 1. The connecting side sends a [`Hello`]: magic, protocol version, job digest, world size,
//!    its rank, the link index, its process instance and a nonce.
//! 2. The accepting side checks it ([`check_hello`]) and answers with a [`Reply`]: accepted or
//!    refused with a code and a reason the caller can print. With a secret, the reply carries
//!    the acceptor's HMAC over the hello and a fresh nonce of its own.
//! 3. With a secret only: the connector answers with its HMAC over the hello and the acceptor's
//!    nonce, and the acceptor sends one verdict byte (accepted, wrong proof, or a duplicate of
//!    a link already connected: the acceptor claims a rank's link only once it is proven).
//!
//! Everything here is byte encoding and checking without sockets; `bootstrap/` runs it.

use sha2::{Digest, Sha256};

use rlx_transport::CollectiveError;

use crate::auth::{self, MAC_LEN};

/// First bytes of every hello and reply.
pub(crate) const MAGIC: [u8; 8] = *b"RLXTCP\r\n";
/// Version of this wire protocol (frames, handshake and rendezvous store). 2: failure notices
/// may carry `Failure::GroupFailed` (kind 3), which version 1 cannot decode. 3: a store
/// registration carries flags and a nonce, the store proves and checks the job secret, and
/// links carry heartbeat frames (kind 4), which version 2 refuses as unknown. 4: ranks of one
/// host offer to be read by each other (frame kind 6) and may send single-copy frames (kind 5).
/// 5: a single-copy frame's descriptor names a bounce file and the bounced length (112 bytes
/// instead of 88). 6: an offer names a shared-memory lane (56 bytes instead of 40), and link 0
/// may switch to it (frame kind 7). 7: a failure notice is 25 bytes instead of 17 (a length
/// mismatch says what its sender passed). 8: a store registration and the store's table list
/// each rank's networks after its addresses. 9: and then whether the rank listens on every
/// address of its host. 10: after a hostfile rendezvous, once every link is up, each rank
/// sends every peer its networks on link 0 (a count, then each network as a registration
/// lists it) before any frame.
pub(crate) const PROTOCOL_VERSION: u32 = 10;
/// Encoded size of a [`Hello`].
pub(crate) const HELLO_LEN: usize = 72;
/// Encoded size of a [`Reply`] without its reason text.
pub(crate) const REPLY_LEN: usize = 74;
/// Longest refusal reason sent or read.
pub(crate) const MAX_REASON: usize = 512;

/// The acceptor's verdict on the connector's proof of the secret: accepted.
pub(crate) const VERDICT_OK: u8 = 0;
/// The verdict: the proof is wrong (the secrets differ).
pub(crate) const VERDICT_BAD_PROOF: u8 = 1;
/// The verdict: the proof is right, but the rank's link is already connected.
pub(crate) const VERDICT_DUPLICATE: u8 = 2;

const FLAG_SECRET: u32 = 1;

/// A 16-byte digest of the job id: equal ids give equal digests, and the id itself (which may
/// name hosts) never goes on the wire.
pub(crate) fn job_digest(job_id: &str) -> [u8; 16] {
    let full = Sha256::digest(job_id.as_bytes());
    let mut out = [0u8; 16];
    out.copy_from_slice(&full[..16]);
    out
}

/// The connector's opening message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Hello {
    pub(crate) version: u32,
    pub(crate) has_secret: bool,
    pub(crate) job: [u8; 16],
    pub(crate) world_size: u32,
    pub(crate) rank: u32,
    pub(crate) link: u32,
    pub(crate) links: u32,
    pub(crate) instance: u64,
    pub(crate) nonce: [u8; 16],
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(w)
}

impl Hello {
    pub(crate) fn encode(&self) -> [u8; HELLO_LEN] {
        let mut out = [0u8; HELLO_LEN];
        out[0..8].copy_from_slice(&MAGIC);
        out[8..12].copy_from_slice(&self.version.to_le_bytes());
        let flags = if self.has_secret { FLAG_SECRET } else { 0 };
        out[12..16].copy_from_slice(&flags.to_le_bytes());
        out[16..32].copy_from_slice(&self.job);
        out[32..36].copy_from_slice(&self.world_size.to_le_bytes());
        out[36..40].copy_from_slice(&self.rank.to_le_bytes());
        out[40..44].copy_from_slice(&self.link.to_le_bytes());
        out[44..48].copy_from_slice(&self.links.to_le_bytes());
        out[48..56].copy_from_slice(&self.instance.to_le_bytes());
        out[56..72].copy_from_slice(&self.nonce);
        out
    }

    /// Decodes a hello; only the magic and the flags are checked here (a stranger's bytes get
    /// a refusal whose reason says so, and flags this version does not know would be lost in
    /// decoding), everything else is [`check_hello`]'s job.
    pub(crate) fn decode(bytes: &[u8; HELLO_LEN]) -> Result<Self, Refusal> {
        if bytes[0..8] != MAGIC {
            return Err(Refusal::new(
                RefusalCode::NotRlx,
                "not an RLX TCP hello (wrong magic)",
            ));
        }
        let flags = u32_at(bytes, 12);
        if flags & !FLAG_SECRET != 0 {
            return Err(Refusal::new(
                RefusalCode::Version,
                format!(
                    "unknown hello flags {flags:#x} (protocol version {PROTOCOL_VERSION} knows only the job secret's)"
                ),
            ));
        }
        let mut job = [0u8; 16];
        job.copy_from_slice(&bytes[16..32]);
        let mut instance = [0u8; 8];
        instance.copy_from_slice(&bytes[48..56]);
        let mut nonce = [0u8; 16];
        nonce.copy_from_slice(&bytes[56..72]);
        Ok(Self {
            version: u32_at(bytes, 8),
            has_secret: u32_at(bytes, 12) & FLAG_SECRET != 0,
            job,
            world_size: u32_at(bytes, 32),
            rank: u32_at(bytes, 36),
            link: u32_at(bytes, 40),
            links: u32_at(bytes, 44),
            instance: u64::from_le_bytes(instance),
            nonce,
        })
    }
}

/// Why an acceptor refused a hello.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RefusalCode {
    NotRlx = 1,
    Version = 2,
    WrongJob = 3,
    WrongWorld = 4,
    BadRank = 5,
    Duplicate = 6,
    Secret = 7,
    BadLink = 8,
    Impostor = 9,
    /// The listener had no room for the connection (see `bootstrap/slots.rs`); a rank
    /// retries.
    Busy = 10,
    Other = 255,
}

impl RefusalCode {
    fn from_u32(code: u32) -> Self {
        match code {
            1 => Self::NotRlx,
            2 => Self::Version,
            3 => Self::WrongJob,
            4 => Self::WrongWorld,
            5 => Self::BadRank,
            6 => Self::Duplicate,
            7 => Self::Secret,
            8 => Self::BadLink,
            9 => Self::Impostor,
            10 => Self::Busy,
            _ => Self::Other,
        }
    }
}

/// A refusal: a code and a human-readable reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub(crate) code: RefusalCode,
    pub(crate) reason: String,
}

impl Refusal {
    pub(crate) fn new(code: RefusalCode, reason: impl Into<String>) -> Self {
        let mut reason: String = reason.into();
        if reason.len() > MAX_REASON {
            let mut cut = MAX_REASON;
            while !reason.is_char_boundary(cut) {
                cut -= 1;
            }
            reason.truncate(cut);
        }
        Self { code, reason }
    }
}

/// What the accepting side expects of every hello.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Expectation<'a> {
    pub(crate) job: [u8; 16],
    pub(crate) world_size: u32,
    pub(crate) my_rank: u32,
    pub(crate) links: u32,
    pub(crate) has_secret: bool,
    /// Process instances from the rendezvous store (`None` for a hostfile, whose processes
    /// publish none).
    pub(crate) instances: Option<&'a [u64]>,
}

/// Checks a decoded hello against what this acceptor expects. Duplicates are checked by the
/// caller, which knows which `(rank, link)` pairs have already arrived.
pub(crate) fn check_hello(hello: &Hello, expect: &Expectation<'_>) -> Result<(), Refusal> {
    if hello.version != PROTOCOL_VERSION {
        return Err(Refusal::new(
            RefusalCode::Version,
            format!(
                "protocol version {} is not {PROTOCOL_VERSION}",
                hello.version
            ),
        ));
    }
    if hello.job != expect.job {
        return Err(Refusal::new(
            RefusalCode::WrongJob,
            "the job id differs (another job, or RLX_JOB_ID differs)",
        ));
    }
    if hello.has_secret != expect.has_secret {
        return Err(Refusal::new(
            RefusalCode::Secret,
            "RLX_JOB_SECRET is set on one side only",
        ));
    }
    if hello.world_size != expect.world_size {
        return Err(Refusal::new(
            RefusalCode::WrongWorld,
            format!(
                "world size {} differs from rank {}'s world size {}",
                hello.world_size, expect.my_rank, expect.world_size
            ),
        ));
    }
    if hello.rank >= expect.world_size || hello.rank <= expect.my_rank {
        return Err(Refusal::new(
            RefusalCode::BadRank,
            format!(
                "rank {} may not connect to rank {} (only ranks above it do, in a world of {})",
                hello.rank, expect.my_rank, expect.world_size
            ),
        ));
    }
    if hello.links != expect.links || hello.link >= expect.links {
        return Err(Refusal::new(
            RefusalCode::BadLink,
            format!(
                "link {} of {} does not fit this job's {} links per peer",
                hello.link, hello.links, expect.links
            ),
        ));
    }
    if let Some(instances) = expect.instances {
        let registered = instances.get(hello.rank as usize).copied();
        if registered != Some(hello.instance) {
            return Err(Refusal::new(
                RefusalCode::Impostor,
                format!(
                    "this process is not the rank {} that registered with the rendezvous store",
                    hello.rank
                ),
            ));
        }
    }
    Ok(())
}

/// The acceptor's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Reply {
    pub(crate) refusal: Option<Refusal>,
    pub(crate) rank: u32,
    pub(crate) world_size: u32,
    pub(crate) nonce: [u8; 16],
    pub(crate) mac: [u8; MAC_LEN],
}

impl Reply {
    /// The reply's bytes: the fixed part, then the reason text.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let (code, reason) = match &self.refusal {
            Some(r) => (r.code as u32, r.reason.as_bytes()),
            None => (0, &[][..]),
        };
        let mut out = Vec::with_capacity(REPLY_LEN + reason.len());
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
        out.extend_from_slice(&code.to_le_bytes());
        out.extend_from_slice(&self.rank.to_le_bytes());
        out.extend_from_slice(&self.world_size.to_le_bytes());
        out.extend_from_slice(&self.nonce);
        out.extend_from_slice(&self.mac);
        out.extend_from_slice(&(reason.len() as u16).to_le_bytes());
        out.extend_from_slice(reason);
        out
    }

    /// Decodes the fixed part of a reply from the acceptor at `peer`; returns the reply (with
    /// an empty reason) and the length of the reason text that follows.
    pub(crate) fn decode(
        peer: u32,
        bytes: &[u8; REPLY_LEN],
    ) -> Result<(Self, usize), CollectiveError> {
        if bytes[0..8] != MAGIC {
            return Err(CollectiveError::protocol(
                Some(peer),
                "the listener is not an RLX TCP transport (wrong magic in its reply)",
            ));
        }
        let version = u32_at(bytes, 8);
        if version != PROTOCOL_VERSION {
            return Err(CollectiveError::protocol(
                Some(peer),
                format!("protocol version {version} is not {PROTOCOL_VERSION}"),
            ));
        }
        let code = u32_at(bytes, 12);
        let mut nonce = [0u8; 16];
        nonce.copy_from_slice(&bytes[24..40]);
        let mut mac = [0u8; MAC_LEN];
        mac.copy_from_slice(&bytes[40..72]);
        let reason_len = usize::from(u16::from_le_bytes([bytes[72], bytes[73]]));
        if reason_len > MAX_REASON {
            return Err(CollectiveError::protocol(
                Some(peer),
                format!("refusal reason of {reason_len} bytes exceeds {MAX_REASON}"),
            ));
        }
        let refusal = (code != 0).then(|| Refusal::new(RefusalCode::from_u32(code), ""));
        Ok((
            Self {
                refusal,
                rank: u32_at(bytes, 16),
                world_size: u32_at(bytes, 20),
                nonce,
                mac,
            },
            reason_len,
        ))
    }
}

/// Which side computes a MAC; the two sides use different labels so that a reflected MAC is
/// never valid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Side {
    Acceptor,
    Connector,
}

impl Side {
    /// The label the side's MACs start with.
    fn label(self) -> &'static [u8] {
        match self {
            Side::Acceptor => b"rlx-acceptor",
            Side::Connector => b"rlx-connector",
        }
    }
}

/// HMAC-SHA256 with `secret` over the side label, the hello and a nonce.
pub(crate) fn mac(
    secret: &[u8],
    side: Side,
    hello: &[u8; HELLO_LEN],
    nonce: &[u8; 16],
) -> [u8; MAC_LEN] {
    auth::mac(secret, &[side.label(), hello, nonce])
}

/// Whether `tag` is the MAC [`mac`] computes, compared in constant time.
pub(crate) fn verify_mac(
    secret: &[u8],
    side: Side,
    hello: &[u8; HELLO_LEN],
    nonce: &[u8; 16],
    tag: &[u8; MAC_LEN],
) -> bool {
    auth::verify(secret, &[side.label(), hello, nonce], tag)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello(rank: u32) -> Hello {
        Hello {
            version: PROTOCOL_VERSION,
            has_secret: false,
            job: job_digest("job"),
            world_size: 4,
            rank,
            link: 0,
            links: 1,
            instance: 77,
            nonce: [5; 16],
        }
    }

    fn expect() -> Expectation<'static> {
        Expectation {
            job: job_digest("job"),
            world_size: 4,
            my_rank: 1,
            links: 1,
            has_secret: false,
            instances: None,
        }
    }

    #[test]
    fn hello_round_trips_and_checks() {
        let h = hello(3);
        assert_eq!(Hello::decode(&h.encode()).unwrap(), h);
        check_hello(&h, &expect()).unwrap();
    }

    #[test]
    fn unknown_hello_flags_are_refused() {
        let mut bytes = hello(3).encode();
        bytes[12..16].copy_from_slice(&(FLAG_SECRET | 4).to_le_bytes());
        let refusal = Hello::decode(&bytes).unwrap_err();
        assert_eq!(refusal.code, RefusalCode::Version);
        assert!(refusal.reason.contains("0x5"), "{}", refusal.reason);
    }

    #[test]
    fn every_mismatch_is_refused_with_its_code() {
        let code = |h: Hello, e: Expectation<'_>| check_hello(&h, &e).unwrap_err().code;
        assert_eq!(
            code(
                Hello {
                    version: PROTOCOL_VERSION + 1,
                    ..hello(3)
                },
                expect()
            ),
            RefusalCode::Version
        );
        assert_eq!(
            code(
                Hello {
                    job: job_digest("other"),
                    ..hello(3)
                },
                expect()
            ),
            RefusalCode::WrongJob
        );
        assert_eq!(
            code(
                Hello {
                    world_size: 5,
                    ..hello(3)
                },
                expect()
            ),
            RefusalCode::WrongWorld
        );
        assert_eq!(code(hello(1), expect()), RefusalCode::BadRank);
        assert_eq!(code(hello(0), expect()), RefusalCode::BadRank);
        assert_eq!(code(hello(4), expect()), RefusalCode::BadRank);
        assert_eq!(
            code(
                Hello {
                    link: 1,
                    ..hello(2)
                },
                expect()
            ),
            RefusalCode::BadLink
        );
        assert_eq!(
            code(
                Hello {
                    has_secret: true,
                    ..hello(2)
                },
                expect()
            ),
            RefusalCode::Secret
        );
        let instances = [0, 0, 78, 0];
        let with_store = Expectation {
            instances: Some(&instances),
            ..expect()
        };
        assert_eq!(code(hello(2), with_store), RefusalCode::Impostor);
        let mut wrong_magic = hello(2).encode();
        wrong_magic[0] ^= 1;
        assert_eq!(
            Hello::decode(&wrong_magic).unwrap_err().code,
            RefusalCode::NotRlx
        );
    }

    #[test]
    fn replies_round_trip() {
        let r = Reply {
            refusal: Some(Refusal::new(RefusalCode::Duplicate, "duplicate rank 2")),
            rank: 1,
            world_size: 4,
            nonce: [1; 16],
            mac: [2; MAC_LEN],
        };
        let bytes = r.encode();
        let fixed: [u8; REPLY_LEN] = bytes[..REPLY_LEN].try_into().unwrap();
        let (decoded, reason_len) = Reply::decode(1, &fixed).unwrap();
        assert_eq!(&bytes[REPLY_LEN..], b"duplicate rank 2");
        assert_eq!(reason_len, 16);
        assert_eq!(decoded.refusal.unwrap().code, RefusalCode::Duplicate);
        assert_eq!((decoded.rank, decoded.world_size), (1, 4));
        let long = Refusal::new(RefusalCode::Other, "é".repeat(MAX_REASON));
        assert!(long.reason.len() <= MAX_REASON);
    }

    #[test]
    fn macs_bind_secret_side_and_nonce() {
        let h = hello(2).encode();
        let n = [9u8; 16];
        let m = mac(b"secret", Side::Acceptor, &h, &n);
        assert!(verify_mac(b"secret", Side::Acceptor, &h, &n, &m));
        assert!(!verify_mac(b"other", Side::Acceptor, &h, &n, &m));
        assert!(!verify_mac(b"secret", Side::Connector, &h, &n, &m));
        assert!(!verify_mac(b"secret", Side::Acceptor, &h, &[8; 16], &m));
    }
}
