//! Which MLX distributed backend to run on, how `any` resolves from MLX's own launch
//! variables, and which ranks each backend links directly.

use std::fmt;
use std::str::FromStr;

use rlx_transport::CollectiveError;

/// An MLX distributed backend, as named by `mx.distributed.init(backend=...)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Backend {
    /// The first backend whose launch variables are present (ring, then MPI, then JACCL), as
    /// MLX itself picks; a world of one when none are.
    Any,
    /// MLX's TCP ring (`MLX_HOSTFILE`, `MLX_RANK`): each rank is linked to its two neighbours.
    Ring,
    /// JACCL over RDMA (`MLX_IBV_DEVICES`, `MLX_JACCL_COORDINATOR`, `MLX_RANK`; `MLX_JACCL_RING`
    /// selects its ring mode).
    Jaccl,
    /// MPI, loaded at run time (`MLX_MPI_LIBNAME`), under `mpirun`.
    Mpi,
}

impl Backend {
    /// The name MLX uses for the backend.
    pub const fn name(self) -> &'static str {
        match self {
            Backend::Any => "any",
            Backend::Ring => "ring",
            Backend::Jaccl => "jaccl",
            Backend::Mpi => "mpi",
        }
    }

    /// Resolves [`Backend::Any`] the way MLX's `init("any")` does, from the launch variables in
    /// `env` (a lookup such as `|k| std::env::var(k).ok()`); other backends are returned as they
    /// are. `None` means no backend's variables are present.
    pub fn resolve(self, env: impl Fn(&str) -> Option<String>) -> Option<Backend> {
        if self != Backend::Any {
            return Some(self);
        }
        let set = |k: &str| env(k).is_some_and(|v| !v.is_empty());
        if set("MLX_HOSTFILE") && set("MLX_RANK") {
            Some(Backend::Ring)
        } else if set("OMPI_COMM_WORLD_SIZE") || set("PMI_SIZE") || set("PMIX_RANK") {
            Some(Backend::Mpi)
        } else if set("MLX_IBV_DEVICES") {
            Some(Backend::Jaccl)
        } else {
            None
        }
    }

    #[cfg_attr(
        not(feature = "mlx"),
        allow(dead_code, reason = "used by the MLX-backed transport")
    )]
    /// How the ranks of this backend are connected (`env` as for [`Backend::resolve`]).
    pub(crate) fn topology(self, env: impl Fn(&str) -> Option<String>) -> Topology {
        match self {
            Backend::Ring => Topology::Ring,
            Backend::Jaccl if env("MLX_JACCL_RING").is_some_and(|v| !v.is_empty()) => {
                Topology::Ring
            }
            Backend::Jaccl | Backend::Mpi | Backend::Any => Topology::Mesh,
        }
    }

    #[cfg_attr(
        not(feature = "mlx"),
        allow(dead_code, reason = "used by the MLX-backed transport")
    )]
    /// Whether MLX's send and receive on this backend cut one byte stream per link, so that a
    /// frame sent in one piece may be received in several: MLX's ring with one socket per
    /// neighbour (one address per rank in `MLX_HOSTFILE`). With several sockets the ring splits
    /// each call over them by its size, and MPI and JACCL match whole messages, so there a
    /// frame is sent in the pieces it is received in.
    pub(crate) fn is_byte_stream(self, env: impl Fn(&str) -> Option<String>) -> bool {
        if self != Backend::Ring {
            return false;
        }
        let Some(path) = env("MLX_HOSTFILE") else {
            return false;
        };
        std::fs::read_to_string(&path)
            .ok()
            .and_then(|text| rlx_transport::bootstrap::parse_hostfile(&path, &text).ok())
            .is_some_and(|ranks| ranks.iter().all(|addresses| addresses.len() == 1))
    }

    #[cfg_attr(
        not(feature = "mlx"),
        allow(dead_code, reason = "used by the MLX-backed transport")
    )]
    /// Whether MLX implements `sum_scatter` on this backend (the ring and MPI backends throw).
    pub(crate) const fn has_sum_scatter(self) -> bool {
        matches!(self, Backend::Jaccl)
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Backend {
    type Err = CollectiveError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "any" => Ok(Backend::Any),
            "ring" => Ok(Backend::Ring),
            "jaccl" => Ok(Backend::Jaccl),
            "mpi" => Ok(Backend::Mpi),
            _ => Err(CollectiveError::config(format!(
                "unknown MLX backend {s:?} (expected any, ring, jaccl or mpi)"
            ))),
        }
    }
}

#[cfg_attr(
    not(feature = "mlx"),
    allow(dead_code, reason = "used by the MLX-backed transport")
)]
/// Which ranks MLX lets a rank exchange point-to-point messages with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Topology {
    /// Only the left and right neighbours (MLX's ring refuses any other peer).
    Ring,
    /// Every rank.
    Mesh,
}

#[cfg_attr(
    not(feature = "mlx"),
    allow(dead_code, reason = "used by the MLX-backed transport")
)]
impl Topology {
    /// The distinct peers `rank` is directly linked to, in ascending order.
    pub(crate) fn links(self, rank: u32, world: u32) -> Vec<u32> {
        let mut peers: Vec<u32> = match self {
            Topology::Mesh => (0..world).filter(|&p| p != rank).collect(),
            Topology::Ring if world < 2 => Vec::new(),
            Topology::Ring => vec![(rank + 1) % world, (rank + world - 1) % world],
        };
        peers.sort_unstable();
        peers.dedup();
        peers
    }

    /// The linked peer a message from `rank` to `dst` (another rank) goes to first.
    ///
    /// On a ring the message travels the shorter way round (rightwards on a tie); every hop
    /// applies the same rule and keeps the direction, so all messages from one source to one
    /// destination take one path and stay in order.
    pub(crate) fn next_hop(self, rank: u32, dst: u32, world: u32) -> u32 {
        match self {
            Topology::Mesh => dst,
            Topology::Ring => {
                let rightwards = (dst + world - rank) % world;
                if rightwards <= world / 2 {
                    (rank + 1) % world
                } else {
                    (rank + world - 1) % world
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names() {
        for b in [Backend::Any, Backend::Ring, Backend::Jaccl, Backend::Mpi] {
            assert_eq!(b.name().parse::<Backend>().unwrap(), b);
        }
        assert!(matches!(
            "nccl".parse::<Backend>(),
            Err(CollectiveError::Config { .. })
        ));
    }

    #[test]
    fn any_resolves_like_mlx() {
        let ring = |k: &str| matches!(k, "MLX_HOSTFILE" | "MLX_RANK").then(|| "x".to_owned());
        assert_eq!(Backend::Any.resolve(ring), Some(Backend::Ring));
        let mpi = |k: &str| (k == "OMPI_COMM_WORLD_SIZE").then(|| "2".to_owned());
        assert_eq!(Backend::Any.resolve(mpi), Some(Backend::Mpi));
        assert_eq!(Backend::Any.resolve(|_| None), None);
        assert_eq!(Backend::Mpi.resolve(|_| None), Some(Backend::Mpi));
    }

    /// Follows `next_hop` from every source to every destination and checks that the walk
    /// arrives, only ever steps to linked peers, and takes at most half the ring.
    #[test]
    fn ring_routes_reach_every_rank() {
        for world in 2..9u32 {
            for src in 0..world {
                for dst in (0..world).filter(|&d| d != src) {
                    let mut at = src;
                    let mut hops = 0;
                    while at != dst {
                        let next = Topology::Ring.next_hop(at, dst, world);
                        assert!(Topology::Ring.links(at, world).contains(&next));
                        at = next;
                        hops += 1;
                        assert!(hops <= world / 2, "{src}->{dst} in a ring of {world}");
                    }
                }
            }
        }
    }

    #[test]
    fn links() {
        assert_eq!(Topology::Ring.links(0, 2), vec![1]);
        assert_eq!(Topology::Ring.links(0, 3), vec![1, 2]);
        assert_eq!(Topology::Ring.links(2, 5), vec![1, 3]);
        assert_eq!(Topology::Ring.links(0, 1), Vec::<u32>::new());
        assert_eq!(Topology::Mesh.links(1, 3), vec![0, 2]);
    }
}
