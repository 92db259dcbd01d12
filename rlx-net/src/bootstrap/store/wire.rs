//! The store's wire codec: a rank's registration (magic, version, flags, job, world, rank,
//! process instance, nonce, addresses, networks), the store's challenge when the job has a secret, and
//! its reply (the table, or a refusal).
//!
//! With `RLX_JOB_SECRET`, both sides prove they hold it before the store accepts a
//! registration (see [`crate::auth`]): the store answers the registration with a challenge
//! (its nonce and its MAC over the registration, which carries the rank's nonce), the rank
//! checks that MAC and answers with its own over the registration and the store's nonce. Only
//! then does the store record the rank, so that nobody without the secret can publish an
//! address for a rank or read the table. Without a secret the flags say so, the nonce goes
//! unused, and the store answers the registration with the table, as before.

use std::io::{self, Read};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use rlx_transport::topology::Subnet;

use crate::auth::{self, MAC_LEN, NONCE_LEN};
use crate::handshake::{PROTOCOL_VERSION, Refusal, RefusalCode};

use crate::bootstrap::config::BootConfig;

/// Most addresses one rank may publish in the store.
const MAX_ADDRS: usize = 16;
/// Most networks one rank may publish in the store (a Mac with every Thunderbolt port cabled,
/// Ethernet and Wi-Fi, with IPv4 and IPv6 on each, stays well below).
const MAX_NETWORKS: usize = 32;
pub(super) const STORE_MAGIC: [u8; 8] = *b"RLXSTOR\n";
/// The registration's flag that says the rank holds a job secret.
const FLAG_SECRET: u32 = 1;
/// The status of a store reply that carries the table.
pub(super) const STATUS_TABLE: u32 = 0;
/// The status of a store reply that challenges a registration to prove the job secret; above
/// every refusal code, so that no refusal is mistaken for it.
pub(super) const STATUS_CHALLENGE: u32 = 0x100;
/// The label of the store's MAC.
const STORE_LABEL: &[u8] = b"rlx-store";
/// The label of a registering rank's MAC.
const RANK_LABEL: &[u8] = b"rlx-store-rank";

/// What a rank publishes in the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Registration {
    pub(crate) instance: u64,
    pub(crate) addrs: Vec<SocketAddr>,
    /// The networks of the rank's interfaces, from which every rank works out the same link
    /// matrix (see [`rlx_transport::topology`]).
    pub(crate) networks: Vec<Subnet>,
    /// Whether the rank listens on every address of the host (not only on `addrs`), so that a
    /// peer may connect to it at its address in a network they share, over a cable rather
    /// than along the route to the advertised address.
    pub(crate) listens_everywhere: bool,
}

fn put_addr(out: &mut Vec<u8>, addr: &SocketAddr) {
    put_ip(out, addr.ip());
    if let SocketAddr::V6(a) = addr {
        out.extend_from_slice(&a.scope_id().to_le_bytes());
    }
    out.extend_from_slice(&addr.port().to_le_bytes());
}

/// A network: its address (family and octets) and its prefix length.
fn put_network(out: &mut Vec<u8>, network: &Subnet) {
    put_ip(out, network.addr);
    out.push(network.prefix);
}

/// An IP address as its family (4 or 6) and its octets.
fn put_ip(out: &mut Vec<u8>, ip: IpAddr) {
    match ip {
        IpAddr::V4(ip) => {
            out.push(4);
            out.extend_from_slice(&ip.octets());
        }
        IpAddr::V6(ip) => {
            out.push(6);
            out.extend_from_slice(&ip.octets());
        }
    }
}

/// An IP address as [`put_ip`] wrote it; `what` names it in the error of an unknown family.
fn get_ip(r: &mut impl Read, what: &str) -> io::Result<IpAddr> {
    let mut family = [0u8; 1];
    r.read_exact(&mut family)?;
    match family[0] {
        4 => {
            let mut b = [0u8; 4];
            r.read_exact(&mut b)?;
            Ok(IpAddr::V4(Ipv4Addr::from(b)))
        }
        6 => {
            let mut b = [0u8; 16];
            r.read_exact(&mut b)?;
            Ok(IpAddr::V6(Ipv6Addr::from(b)))
        }
        other => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("unknown {what} family {other}"),
        )),
    }
}

fn get_network(r: &mut impl Read) -> io::Result<Subnet> {
    let addr = get_ip(r, "network")?;
    let width = if addr.is_ipv4() { 32 } else { 128 };
    let mut prefix = [0u8; 1];
    r.read_exact(&mut prefix)?;
    if prefix[0] > width {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a /{} prefix on {addr}", prefix[0]),
        ));
    }
    Ok(Subnet {
        addr,
        prefix: prefix[0],
    })
}

/// A registration's addresses and networks, each list led by its length.
fn put_reachability(out: &mut Vec<u8>, reg: &Registration) {
    out.push(reg.addrs.len().min(MAX_ADDRS) as u8);
    for a in reg.addrs.iter().take(MAX_ADDRS) {
        put_addr(out, a);
    }
    out.extend(encode_networks(&reg.networks));
    out.push(u8::from(reg.listens_everywhere));
}

/// A list of networks led by its length (at most [`MAX_NETWORKS`]), as a registration carries
/// them and as ranks of a hostfile rendezvous exchange them over their links.
pub(crate) fn encode_networks(networks: &[Subnet]) -> Vec<u8> {
    let mut out = vec![networks.len().min(MAX_NETWORKS) as u8];
    for network in networks.iter().take(MAX_NETWORKS) {
        put_network(&mut out, network);
    }
    out
}

/// The networks after a registration's addresses, or one rank's list over a link.
pub(crate) fn read_networks(r: &mut impl Read) -> io::Result<Vec<Subnet>> {
    let mut n = [0u8; 1];
    r.read_exact(&mut n)?;
    if usize::from(n[0]) > MAX_NETWORKS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} networks (at most {MAX_NETWORKS})", n[0]),
        ));
    }
    (0..n[0]).map(|_| get_network(r)).collect()
}

fn get_addr(r: &mut impl Read) -> io::Result<SocketAddr> {
    let ip = get_ip(r, "address")?;
    let scope = if ip.is_ipv6() {
        let mut scope = [0u8; 4];
        r.read_exact(&mut scope)?;
        u32::from_le_bytes(scope)
    } else {
        0
    };
    let mut port = [0u8; 2];
    r.read_exact(&mut port)?;
    let port = u16::from_le_bytes(port);
    Ok(match ip {
        IpAddr::V6(v6) => SocketAddr::V6(std::net::SocketAddrV6::new(v6, port, 0, scope)),
        ip => SocketAddr::new(ip, port),
    })
}

/// The registration message of `cfg`'s rank: magic, version, flags, job, world, rank,
/// instance, `nonce` and addresses.
pub(crate) fn encode_registration(
    cfg: &BootConfig,
    reg: &Registration,
    nonce: &[u8; NONCE_LEN],
) -> Vec<u8> {
    let mut out = Vec::with_capacity(80);
    out.extend_from_slice(&STORE_MAGIC);
    out.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    let flags = if cfg.secret.is_some() { FLAG_SECRET } else { 0 };
    out.extend_from_slice(&flags.to_le_bytes());
    out.extend_from_slice(&cfg.job);
    out.extend_from_slice(&cfg.world.to_le_bytes());
    out.extend_from_slice(&cfg.rank.to_le_bytes());
    out.extend_from_slice(&reg.instance.to_le_bytes());
    out.extend_from_slice(nonce);
    put_reachability(&mut out, reg);
    out
}

/// The store's MAC over a registration as it was sent (`registration`) and the store's nonce.
pub(super) fn store_mac(
    secret: &[u8],
    registration: &[u8],
    nonce: &[u8; NONCE_LEN],
) -> [u8; MAC_LEN] {
    auth::mac(secret, &[STORE_LABEL, registration, nonce])
}

/// Whether `tag` is the store's MAC over `registration` and `nonce`.
pub(super) fn verify_store_mac(
    secret: &[u8],
    registration: &[u8],
    nonce: &[u8; NONCE_LEN],
    tag: &[u8; MAC_LEN],
) -> bool {
    auth::verify(secret, &[STORE_LABEL, registration, nonce], tag)
}

/// A registering rank's MAC over its registration and the store's nonce.
pub(super) fn rank_mac(
    secret: &[u8],
    registration: &[u8],
    nonce: &[u8; NONCE_LEN],
) -> [u8; MAC_LEN] {
    auth::mac(secret, &[RANK_LABEL, registration, nonce])
}

/// Whether `tag` is a registering rank's MAC over `registration` and `nonce`.
pub(super) fn verify_rank_mac(
    secret: &[u8],
    registration: &[u8],
    nonce: &[u8; NONCE_LEN],
    tag: &[u8; MAC_LEN],
) -> bool {
    auth::verify(secret, &[RANK_LABEL, registration, nonce], tag)
}

/// The store's challenge to a registration: its nonce and its MAC.
pub(super) fn encode_challenge(nonce: &[u8; NONCE_LEN], mac: &[u8; MAC_LEN]) -> Vec<u8> {
    let mut out = Vec::with_capacity(12 + NONCE_LEN + MAC_LEN);
    out.extend_from_slice(&STORE_MAGIC);
    out.extend_from_slice(&STATUS_CHALLENGE.to_le_bytes());
    out.extend_from_slice(nonce);
    out.extend_from_slice(mac);
    out
}

/// A reader that keeps a copy of every byte it hands out, so that a MAC is checked over a
/// registration exactly as it came (its length is bounded by the message's own caps).
struct Recording<'a, R> {
    inner: &'a mut R,
    bytes: Vec<u8>,
}

impl<R: Read> Read for Recording<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.bytes.extend_from_slice(&buf[..n]);
        Ok(n)
    }
}

pub(super) fn read_u32(r: &mut impl Read) -> io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

pub(super) fn read_u64(r: &mut impl Read) -> io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_le_bytes(b))
}

/// What [`read_reachability`] reads of a registration.
pub(super) struct Reachability {
    pub(super) addrs: Vec<SocketAddr>,
    pub(super) networks: Vec<Subnet>,
    pub(super) listens_everywhere: bool,
}

/// A registration's addresses, networks and where it listens, as [`put_reachability`] wrote
/// them.
pub(super) fn read_reachability(r: &mut impl Read) -> io::Result<Reachability> {
    let addrs = read_addrs(r)?;
    let networks = read_networks(r)?;
    let mut everywhere = [0u8; 1];
    r.read_exact(&mut everywhere)?;
    let listens_everywhere = match everywhere[0] {
        0 => false,
        1 => true,
        other => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("where a rank listens is 0 or 1, not {other}"),
            ));
        }
    };
    Ok(Reachability {
        addrs,
        networks,
        listens_everywhere,
    })
}

fn read_addrs(r: &mut impl Read) -> io::Result<Vec<SocketAddr>> {
    let mut n = [0u8; 1];
    r.read_exact(&mut n)?;
    if n[0] == 0 || usize::from(n[0]) > MAX_ADDRS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} addresses", n[0]),
        ));
    }
    (0..n[0]).map(|_| get_addr(r)).collect()
}

/// A registration as the store received and checked it.
#[derive(Debug)]
pub(crate) struct Received {
    pub(crate) rank: u32,
    pub(crate) reg: Registration,
    /// The registration's bytes, which the MACs of the job secret cover.
    pub(crate) bytes: Vec<u8>,
}

/// Reads and checks a registration against the store's `cfg`.
pub(crate) fn read_registration(cfg: &BootConfig, r: &mut impl Read) -> Result<Received, Refusal> {
    let r = &mut Recording {
        inner: r,
        bytes: Vec::with_capacity(80),
    };
    read_preamble(cfg, r)?;
    let rank = read_rank(cfg, r)?;
    let instance = read_u64(r).map_err(bad_registration)?;
    let mut nonce = [0u8; NONCE_LEN];
    r.read_exact(&mut nonce).map_err(bad_registration)?;
    let reach = read_reachability(r).map_err(bad_registration)?;
    Ok(Received {
        rank,
        reg: Registration {
            instance,
            addrs: reach.addrs,
            networks: reach.networks,
            listens_everywhere: reach.listens_everywhere,
        },
        bytes: std::mem::take(&mut r.bytes),
    })
}

/// The refusal of a registration that could not be read.
fn bad_registration(e: io::Error) -> Refusal {
    Refusal::new(RefusalCode::Other, format!("bad registration: {e}"))
}

/// Reads and checks what every registration starts with: magic, version, flags, job, and
/// whether both sides hold a job secret.
fn read_preamble(cfg: &BootConfig, r: &mut impl Read) -> Result<(), Refusal> {
    let mut magic = [0u8; 8];
    r.read_exact(&mut magic).map_err(bad_registration)?;
    if magic != STORE_MAGIC {
        return Err(Refusal::new(
            RefusalCode::NotRlx,
            "not an RLX store registration (wrong magic)",
        ));
    }
    let version = read_u32(r).map_err(bad_registration)?;
    if version != PROTOCOL_VERSION {
        return Err(Refusal::new(
            RefusalCode::Version,
            format!("protocol version {version} is not {PROTOCOL_VERSION}"),
        ));
    }
    let flags = read_u32(r).map_err(bad_registration)?;
    if flags & !FLAG_SECRET != 0 {
        return Err(Refusal::new(
            RefusalCode::Version,
            format!(
                "unknown registration flags {flags:#x} (protocol version {PROTOCOL_VERSION} knows only the job secret's)"
            ),
        ));
    }
    let mut job = [0u8; 16];
    r.read_exact(&mut job).map_err(bad_registration)?;
    if job != cfg.job {
        return Err(Refusal::new(
            RefusalCode::WrongJob,
            "the job id differs (another job, or RLX_JOB_ID differs)",
        ));
    }
    match (flags & FLAG_SECRET != 0, cfg.secret.is_some()) {
        (true, false) => Err(Refusal::new(
            RefusalCode::Secret,
            "RLX_JOB_SECRET is set on this rank but not on the store's (rank 0)",
        )),
        (false, true) => Err(Refusal::new(
            RefusalCode::Secret,
            "RLX_JOB_SECRET is set on the store's rank (rank 0) but not on this rank",
        )),
        _ => Ok(()),
    }
}

/// Reads the world size and the rank of a registration, which must be one the store takes.
fn read_rank(cfg: &BootConfig, r: &mut impl Read) -> Result<u32, Refusal> {
    let world = read_u32(r).map_err(bad_registration)?;
    if world != cfg.world {
        return Err(Refusal::new(
            RefusalCode::WrongWorld,
            format!("world size {world} differs from the store's {}", cfg.world),
        ));
    }
    let rank = read_u32(r).map_err(bad_registration)?;
    if rank == 0 || rank >= world {
        return Err(Refusal::new(
            RefusalCode::BadRank,
            format!(
                "rank {rank} cannot register (the store takes ranks 1 to {})",
                world.saturating_sub(1)
            ),
        ));
    }
    Ok(rank)
}

pub(crate) fn store_reply(status: Result<&[Registration], &Refusal>) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&STORE_MAGIC);
    match status {
        Ok(table) => {
            out.extend_from_slice(&STATUS_TABLE.to_le_bytes());
            out.extend_from_slice(&(table.len() as u32).to_le_bytes());
            for reg in table {
                out.extend_from_slice(&reg.instance.to_le_bytes());
                put_reachability(&mut out, reg);
            }
        }
        Err(refusal) => {
            out.extend_from_slice(&(refusal.code as u32).to_le_bytes());
            let reason = refusal.reason.as_bytes();
            out.extend_from_slice(&(reason.len() as u32).to_le_bytes());
            out.extend_from_slice(reason);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use rlx_transport::Rendezvous;

    use super::*;
    use crate::handshake;

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn registrations_round_trip_and_strangers_are_refused() {
        let cfg = BootConfig {
            rank: 2,
            world: 3,
            rendezvous: Rendezvous::Store {
                host: "127.0.0.1".into(),
                port: 1,
            },
            connect_timeout: Duration::from_secs(1),
            hello_timeout: Duration::from_secs(1),
            job: handshake::job_digest("j"),
            secret: None,
            links: 1,
            bind_ip: None,
            ifname: None,
            socket_setup: None,
        };
        let reg = Registration {
            instance: 42,
            addrs: vec![sa("10.0.0.1:7"), sa("[fe80::1%3]:8")],
            networks: vec![
                Subnet {
                    addr: "10.0.0.1".parse().unwrap(),
                    prefix: 30,
                },
                Subnet {
                    addr: "fd00::1".parse().unwrap(),
                    prefix: 64,
                },
            ],
            listens_everywhere: true,
        };
        let bytes = encode_registration(&cfg, &reg, &[3; NONCE_LEN]);
        // Where a rank listens is a yes or a no.
        let mut maybe = bytes.clone();
        if let Some(last) = maybe.last_mut() {
            *last = 2;
        }
        assert!(read_registration(&cfg, &mut &maybe[..]).is_err());
        let received = read_registration(&cfg, &mut &bytes[..]).unwrap();
        assert_eq!((received.rank, received.reg), (2, reg.clone()));
        assert_eq!(
            received.bytes, bytes,
            "the MACs cover the registration as it came"
        );
        let other_job = BootConfig {
            job: handshake::job_digest("k"),
            ..cfg.clone()
        };
        let refusal = read_registration(&other_job, &mut &bytes[..]).unwrap_err();
        assert_eq!(refusal.code, RefusalCode::WrongJob);
        let refusal = read_registration(&cfg, &mut &[0u8; 80][..]).unwrap_err();
        assert_eq!(refusal.code, RefusalCode::NotRlx);
        let mut truncated = bytes.clone();
        truncated.truncate(bytes.len() - 3);
        assert!(read_registration(&cfg, &mut &truncated[..]).is_err());
        let mut old_version = bytes.clone();
        old_version[8..12].copy_from_slice(&(PROTOCOL_VERSION - 1).to_le_bytes());
        let refusal = read_registration(&cfg, &mut &old_version[..]).unwrap_err();
        assert_eq!(refusal.code, RefusalCode::Version);
        // Flags this version does not know were once read past (and lost when re-encoded);
        // the fuzzer's round trip found it.
        let mut unknown_flags = bytes.clone();
        unknown_flags[12..16].copy_from_slice(&0xffff_0000u32.to_le_bytes());
        let refusal = read_registration(&cfg, &mut &unknown_flags[..]).unwrap_err();
        assert_eq!(refusal.code, RefusalCode::Version);
        assert!(refusal.reason.contains("0xffff0000"), "{}", refusal.reason);
        let out_of_range = encode_registration(
            &BootConfig {
                rank: 3,
                ..cfg.clone()
            },
            &reg,
            &[0; 16],
        );
        let refusal = read_registration(&cfg, &mut &out_of_range[..]).unwrap_err();
        assert_eq!(refusal.code, RefusalCode::BadRank);
        // A secret on one side only is refused with a reason naming the side that lacks it.
        let with_secret = BootConfig {
            secret: Some(b"s".to_vec()),
            ..cfg.clone()
        };
        let refusal = read_registration(
            &cfg,
            &mut &encode_registration(&with_secret, &reg, &[0; 16])[..],
        )
        .unwrap_err();
        assert_eq!(refusal.code, RefusalCode::Secret);
        assert!(
            refusal.reason.contains("not on the store"),
            "{}",
            refusal.reason
        );
        let refusal = read_registration(&with_secret, &mut &bytes[..]).unwrap_err();
        assert!(
            refusal.reason.contains("not on this rank"),
            "{}",
            refusal.reason
        );
    }

    #[test]
    fn store_and_rank_proofs_bind_the_secret_the_registration_and_the_nonce() {
        let (reg, nonce) = (b"a registration".as_slice(), [4; NONCE_LEN]);
        let store = store_mac(b"secret", reg, &nonce);
        assert!(verify_store_mac(b"secret", reg, &nonce, &store));
        assert!(!verify_store_mac(b"wrong", reg, &nonce, &store));
        assert!(!verify_store_mac(
            b"secret",
            b"another registration",
            &nonce,
            &store
        ));
        assert!(!verify_store_mac(b"secret", reg, &[5; NONCE_LEN], &store));
        // A proof reflected back to the side that made it is never valid.
        assert!(!verify_rank_mac(b"secret", reg, &nonce, &store));
        let rank = rank_mac(b"secret", reg, &nonce);
        assert!(verify_rank_mac(b"secret", reg, &nonce, &rank));
        assert!(!verify_store_mac(b"secret", reg, &nonce, &rank));
        let challenge = encode_challenge(&nonce, &store);
        assert_eq!(&challenge[..8], &STORE_MAGIC);
        assert_eq!(&challenge[8..12], &STATUS_CHALLENGE.to_le_bytes());
        assert_eq!(challenge.len(), 12 + NONCE_LEN + MAC_LEN);
    }
}
