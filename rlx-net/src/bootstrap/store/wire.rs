//! The store's wire codec: a rank's registration (magic, version, job, world, rank, process
//! instance, addresses) and the store's reply (the table, or a refusal).

use std::io::{self, Read};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::handshake::{PROTOCOL_VERSION, Refusal, RefusalCode};

use crate::bootstrap::config::BootConfig;

/// Most addresses one rank may publish in the store.
const MAX_ADDRS: usize = 16;
pub(super) const STORE_MAGIC: [u8; 8] = *b"RLXSTOR\n";

/// What a rank publishes in the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Registration {
    pub(crate) instance: u64,
    pub(crate) addrs: Vec<SocketAddr>,
}

fn put_addr(out: &mut Vec<u8>, addr: &SocketAddr) {
    match addr {
        SocketAddr::V4(a) => {
            out.push(4);
            out.extend_from_slice(&a.ip().octets());
        }
        SocketAddr::V6(a) => {
            out.push(6);
            out.extend_from_slice(&a.ip().octets());
            out.extend_from_slice(&a.scope_id().to_le_bytes());
        }
    }
    out.extend_from_slice(&addr.port().to_le_bytes());
}

fn get_addr(r: &mut impl Read) -> io::Result<SocketAddr> {
    let mut family = [0u8; 1];
    r.read_exact(&mut family)?;
    let ip = match family[0] {
        4 => {
            let mut b = [0u8; 4];
            r.read_exact(&mut b)?;
            (IpAddr::V4(Ipv4Addr::from(b)), 0)
        }
        6 => {
            let mut b = [0u8; 16];
            r.read_exact(&mut b)?;
            let mut scope = [0u8; 4];
            r.read_exact(&mut scope)?;
            (IpAddr::V6(Ipv6Addr::from(b)), u32::from_le_bytes(scope))
        }
        other => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("unknown address family {other}"),
            ));
        }
    };
    let mut port = [0u8; 2];
    r.read_exact(&mut port)?;
    let port = u16::from_le_bytes(port);
    Ok(match ip {
        (IpAddr::V6(v6), scope) => SocketAddr::V6(std::net::SocketAddrV6::new(v6, port, 0, scope)),
        (ip, _) => SocketAddr::new(ip, port),
    })
}

/// The registration message: magic, version, job, world, rank, instance, addresses.
pub(crate) fn encode_registration(cfg: &BootConfig, reg: &Registration) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(&STORE_MAGIC);
    out.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    out.extend_from_slice(&cfg.job);
    out.extend_from_slice(&cfg.world.to_le_bytes());
    out.extend_from_slice(&cfg.rank.to_le_bytes());
    out.extend_from_slice(&reg.instance.to_le_bytes());
    out.push(reg.addrs.len().min(MAX_ADDRS) as u8);
    for a in reg.addrs.iter().take(MAX_ADDRS) {
        put_addr(&mut out, a);
    }
    out
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

pub(super) fn read_addrs(r: &mut impl Read) -> io::Result<Vec<SocketAddr>> {
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

/// Reads and checks a registration; returns the rank and what it published.
pub(super) fn read_registration(
    cfg: &BootConfig,
    r: &mut impl Read,
) -> Result<(u32, Registration), Refusal> {
    let other = |e: io::Error| Refusal::new(RefusalCode::Other, format!("bad registration: {e}"));
    let mut magic = [0u8; 8];
    r.read_exact(&mut magic).map_err(other)?;
    if magic != STORE_MAGIC {
        return Err(Refusal::new(
            RefusalCode::NotRlx,
            "not an RLX store registration (wrong magic)",
        ));
    }
    let version = read_u32(r).map_err(other)?;
    if version != PROTOCOL_VERSION {
        return Err(Refusal::new(
            RefusalCode::Version,
            format!("protocol version {version}"),
        ));
    }
    let mut job = [0u8; 16];
    r.read_exact(&mut job).map_err(other)?;
    if job != cfg.job {
        return Err(Refusal::new(RefusalCode::WrongJob, "the job id differs"));
    }
    let world = read_u32(r).map_err(other)?;
    if world != cfg.world {
        return Err(Refusal::new(
            RefusalCode::WrongWorld,
            format!("world size {world} differs from the store's {}", cfg.world),
        ));
    }
    let rank = read_u32(r).map_err(other)?;
    if rank == 0 || rank >= world {
        return Err(Refusal::new(
            RefusalCode::BadRank,
            format!("rank {rank} cannot register"),
        ));
    }
    let instance = read_u64(r).map_err(other)?;
    let addrs = read_addrs(r).map_err(other)?;
    Ok((rank, Registration { instance, addrs }))
}

pub(super) fn store_reply(status: Result<&[Registration], &Refusal>) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&STORE_MAGIC);
    match status {
        Ok(table) => {
            out.extend_from_slice(&0u32.to_le_bytes());
            out.extend_from_slice(&(table.len() as u32).to_le_bytes());
            for reg in table {
                out.extend_from_slice(&reg.instance.to_le_bytes());
                out.push(reg.addrs.len().min(MAX_ADDRS) as u8);
                for a in reg.addrs.iter().take(MAX_ADDRS) {
                    put_addr(&mut out, a);
                }
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
        };
        let bytes = encode_registration(&cfg, &reg);
        let (rank, back) = read_registration(&cfg, &mut &bytes[..]).unwrap();
        assert_eq!((rank, back), (2, reg));
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
    }
}
