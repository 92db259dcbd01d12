//! Admission for [`TcpTransport`]: a process started with the job's rendezvous information
//! joins a running job ([`TcpTransportBuilder::join`]) while the members grow their group
//! (`ProcessGroup::grow`), and everyone builds the transport of the grown world.
//!
//! The leader listens on the job's rendezvous port (free again once bootstrap is over, and
//! taken over by the lowest survivor when the original rank 0 is gone) for the time it waits
//! for joiners; the wire protocol is in `desk.rs`. The grown world rendezvous through a new
//! store on the leader, at a fresh port, under a job id of its own, so that no process of the
//! old world can mistake it for its own.

// The desk's exchanges are the crate's too: `crate::fuzzing` drives both sides of them.
pub(crate) mod desk;

use std::net::{IpAddr, SocketAddr, TcpListener, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rlx_transport::{Admission, CollectiveError, PendingJoiner, Rendezvous, Result, Transport};

use crate::auth::random_bytes;
use crate::builder::TcpTransportBuilder;
use crate::handshake::job_digest;
use crate::transport::TcpTransport;
use desk::{Credentials, MAX_PLAN};

/// Where the grown world meets: its store and its job id.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) job_id: String,
}

impl Plan {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for field in [self.host.as_bytes(), self.job_id.as_bytes()] {
            out.extend_from_slice(&(field.len() as u16).to_le_bytes());
            out.extend_from_slice(field);
        }
        out.extend_from_slice(&self.port.to_le_bytes());
        out
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<Plan> {
        let bad = || CollectiveError::protocol(None, "a malformed plan of a grown world");
        let mut rest = bytes;
        let mut field = || -> Result<String> {
            let (len, tail) = rest.split_first_chunk::<2>().ok_or_else(bad)?;
            let len = usize::from(u16::from_le_bytes(*len));
            let (text, tail) = tail.split_at_checked(len).ok_or_else(bad)?;
            rest = tail;
            String::from_utf8(text.to_vec()).map_err(|_| bad())
        };
        let host = field()?;
        let job_id = field()?;
        let port = match rest {
            [a, b] => u16::from_le_bytes([*a, *b]),
            _ => return Err(bad()),
        };
        Ok(Plan { host, port, job_id })
    }
}

fn credentials(config: &TcpTransportBuilder) -> Credentials {
    Credentials {
        job: job_digest(&config.effective_job_id()),
        secret: config.secret_bytes(),
    }
}

/// The store address of the job's rendezvous, which joiners are told to reach.
fn rendezvous_store(config: &TcpTransportBuilder) -> Result<(String, u16)> {
    match config.rendezvous_spec() {
        Some(Rendezvous::Store { host, port }) => Ok((host.clone(), *port)),
        _ => Err(CollectiveError::config(
            "growing a group needs a store rendezvous (RLX_MASTER_ADDR and RLX_MASTER_PORT): \
             joiners find the job at that address",
        )),
    }
}

impl Admission for TcpTransport {
    fn await_joiners(&self, count: u32, timeout: Duration) -> Result<Vec<Box<dyn PendingJoiner>>> {
        let (_, port) = rendezvous_store(&self.config)?;
        let started = Instant::now();
        // The port may be in TIME_WAIT from the store that bootstrap closed; binding must
        // not wait for that.
        let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            .and_then(|s| s.set_reuse_address(true).map(|()| s))
            .and_then(|s| {
                let any = SocketAddr::from(([0, 0, 0, 0], port));
                s.bind(&any.into()).map(|()| s)
            })
            .and_then(|s| s.listen(64).map(|()| s))
            .map_err(|source| CollectiveError::Io {
                peer: None,
                source: std::io::Error::new(
                    source.kind(),
                    format!("listening for joiners on the rendezvous port {port}: {source}"),
                ),
            })?;
        let listener: TcpListener = socket.into();
        tracing::info!(port, count, "admission: waiting for joiners");
        desk::accept_joiners(
            &listener,
            &credentials(&self.config),
            count,
            started + timeout,
            timeout,
        )
    }

    fn plan_world(&self, size: u32) -> Result<Vec<u8>> {
        let (rendezvous_host, _) = rendezvous_store(&self.config)?;
        tracing::debug!(size, "admission: planning the grown world");
        // Members reach the leader where its links to them are; the rendezvous host is where
        // the joiners reached it (and every rank when the leader is the original rank 0).
        let host = (0..self.world_size())
            .filter(|&r| r != self.rank())
            .find_map(|r| self.local_addr_towards(r))
            .map(|addr| addr.ip().to_string())
            .filter(|_| self.rank() != 0)
            .unwrap_or(rendezvous_host);
        let ip: IpAddr = (host.as_str(), 0)
            .to_socket_addrs()
            .ok()
            .and_then(|mut addrs| addrs.next())
            .map(|a| a.ip())
            .ok_or_else(|| CollectiveError::config(format!("cannot resolve {host:?}")))?;
        let port = TcpListener::bind((ip, 0))
            .and_then(|l| l.local_addr())
            .map_err(|source| CollectiveError::Io { peer: None, source })?
            .port();
        let nonce: [u8; 8] = random_bytes()?;
        let plan = Plan {
            host: ip.to_string(),
            port,
            job_id: format!(
                "{}/grown-{}",
                self.config.effective_job_id(),
                nonce.iter().map(|b| format!("{b:02x}")).collect::<String>()
            ),
        };
        let bytes = plan.encode();
        if bytes.len() > MAX_PLAN {
            return Err(CollectiveError::config(
                "the grown world's plan is too long",
            ));
        }
        Ok(bytes)
    }

    fn successor(&self, plan: &[u8], rank: u32, size: u32) -> Result<Arc<dyn Transport>> {
        Ok(Arc::new(build_planned(
            self.config.clone(),
            plan,
            rank,
            size,
        )?))
    }
}

/// This process's transport of the planned world.
fn build_planned(
    config: TcpTransportBuilder,
    plan: &[u8],
    rank: u32,
    size: u32,
) -> Result<TcpTransport> {
    let plan = Plan::decode(plan)?;
    config
        .rank(rank)
        .world_size(size)
        .master(plan.host, plan.port)
        .job_id(plan.job_id)
        .build()
}

impl TcpTransportBuilder {
    /// Joins a running job instead of starting one: reaches the job at its store rendezvous
    /// address (the builder's master address, which the job's current rank 0 listens on while
    /// its members run `ProcessGroup::grow`), proves it belongs to the job (the job id and
    /// `RLX_JOB_SECRET`), and returns this process's transport of the grown world. The rank
    /// and world size given to the builder are ignored: the members decide them. Waits up to
    /// the connect timeout (by default the operation timeout) for the members to admit it.
    pub fn join(self) -> Result<TcpTransport> {
        let (host, port) = rendezvous_store(&self)?;
        let addr = (host.as_str(), port)
            .to_socket_addrs()
            .ok()
            .and_then(|mut addrs| addrs.next())
            .ok_or_else(|| CollectiveError::config(format!("cannot resolve {host}:{port}")))?;
        let deadline = Instant::now() + self.effective_connect_timeout();
        let place = desk::join(addr, &credentials(&self), deadline)?;
        tracing::info!(rank = place.rank, world = place.size, "admission: admitted");
        build_planned(self, &place.plan, place.rank, place.size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_round_trip_and_bad_plans_are_refused() {
        let plan = Plan {
            host: "10.0.0.7".to_owned(),
            port: 41000,
            job_id: "store:10.0.0.1:29500/grown-00ff".to_owned(),
        };
        assert_eq!(Plan::decode(&plan.encode()).unwrap(), plan);
        let bytes = plan.encode();
        for cut in 0..bytes.len() {
            assert!(Plan::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut long = bytes.clone();
        long.push(0);
        assert!(Plan::decode(&long).is_err());
    }
}
