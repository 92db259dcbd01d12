//! Starting a [`TcpTransport`] from its [`TcpTransportBuilder`]: rendezvous with every rank,
//! connect and handshake every link, and start the engine and its watcher thread.
//!
//! This is apart from `builder.rs`, which only holds the configuration, so that the
//! configuration (kept by a running transport for the worlds it grows into) does not depend
//! on the transport it makes.

use rlx_transport::{CollectiveError, Rendezvous, Result};

use crate::bootstrap::{self, BootConfig};
use crate::builder::TcpTransportBuilder;
use crate::handshake::job_digest;
use crate::progress::{Engine, EngineConfig, PeerIo};
use crate::sync::{Arc, thread};
use crate::transport::TcpTransport;

impl TcpTransportBuilder {
    /// Rendezvous with every rank, connect and handshake every link, and start the transport.
    /// Waits up to the connect timeout for all ranks.
    pub fn build(self) -> Result<TcpTransport> {
        let config = self.clone();
        let rendezvous = self.rendezvous.clone().ok_or_else(|| {
            CollectiveError::config("no rendezvous: give a hostfile or a master address")
        })?;
        let (rank, world, links) = self.shape(&rendezvous)?;
        let engine_config = self.engine_config();
        let job_id = self
            .job_id
            .clone()
            .unwrap_or_else(|| rendezvous.derived_job_id());
        let cfg = BootConfig {
            rank,
            world,
            rendezvous,
            connect_timeout: self.connect_timeout.unwrap_or(self.op_timeout),
            hello_timeout: self.hello_timeout,
            job: job_digest(&job_id),
            secret: self.secret,
            links,
            bind_ip: self.bind_ip,
            ifname: self.ifname,
            socket_setup: self.socket_setup,
        };
        let established = bootstrap::establish(&cfg)?;
        let topology = established.topology;
        let peers = established
            .links
            .into_iter()
            .zip(established.addrs)
            .enumerate()
            .map(|(r, (streams, addr))| (r as u32 != rank).then(|| PeerIo::new(streams, addr)))
            .collect();
        let engine = Engine::new(rank, world, engine_config, peers)
            .map_err(|source| CollectiveError::Io { peer: None, source })?;
        engine.offer_same_host();
        let engine = Arc::new(engine);
        let watcher = if world > 1 {
            let e = Arc::clone(&engine);
            Some(
                thread::Builder::new()
                    .name(format!("rlx-net-watch-{rank}"))
                    .spawn(move || e.watch())
                    .map_err(|source| CollectiveError::Io { peer: None, source })?,
            )
        } else {
            None
        };
        Ok(TcpTransport::running(
            rank, world, engine, watcher, config, topology,
        ))
    }

    /// This rank, the world size and the sockets per peer, checked: the world from the builder
    /// or the hostfile, the rank inside it, 1 to 64 links, a positive timeout and frame cap.
    fn shape(&self, rendezvous: &Rendezvous) -> Result<(u32, u32, u32)> {
        let world = match (rendezvous, self.world) {
            (_, Some(w)) => w,
            (Rendezvous::Hostfile(h), None) => u32::try_from(h.len())
                .map_err(|_| CollectiveError::config("the hostfile lists too many ranks"))?,
            (Rendezvous::Store { .. }, None) => {
                return Err(CollectiveError::config("no world size"));
            }
        };
        if world == 0 {
            return Err(CollectiveError::config("world size 0"));
        }
        let rank = self
            .rank
            .ok_or_else(|| CollectiveError::config("no rank given"))?;
        if rank >= world {
            return Err(CollectiveError::UnknownRank {
                rank,
                world_size: world,
            });
        }
        if self.op_timeout.is_zero() || self.max_frame == 0 {
            return Err(CollectiveError::config(
                "the operation timeout and the frame cap must be positive",
            ));
        }
        let links = match (self.sockets_per_peer, rendezvous) {
            (Some(n), _) => n,
            (None, Rendezvous::Hostfile(h)) => h.iter().map(Vec::len).max().unwrap_or(1) as u32,
            (None, Rendezvous::Store { .. }) => 1,
        };
        if !(1..=64).contains(&links) {
            return Err(CollectiveError::config(format!(
                "{links} sockets per peer (1 to 64 are supported)"
            )));
        }
        Ok((rank, world, links))
    }

    /// The engine's tuning, shared by every link.
    fn engine_config(&self) -> EngineConfig {
        EngineConfig {
            max_frame: self.max_frame,
            max_unexpected: self.max_unexpected,
            min_striped: self.min_striped.max(1),
            op_timeout: self.op_timeout,
            spin: self.spin,
            heartbeat: self.heartbeat,
            min_single_copy: self.min_single_copy,
            max_bounced: self.max_bounced,
            lane_bytes: self.lane_bytes,
            longest_hold: self.longest_hold,
            landing_grace: self.landing_grace,
        }
    }
}
