//! [`ThunderboltTransport`] and its [`ThunderboltTransportBuilder`]: `rlx-net`'s
//! [`TcpTransport`] with every socket pinned to a Thunderbolt link, and the symmetric heap
//! served over it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rlx_net::{TcpTransport, TcpTransportBuilder};
use rlx_transport::ifname::IfnameFilter;
use rlx_transport::{
    Admission, CollectiveError, LaunchEnv, PendingJoiner, Result, Symmetric, Transport,
};

use crate::bootstrap::{LinkMap, Resolved, kernel_route, plan};
use crate::discovery::{self, Interface};
use crate::sys;

/// The symmetric one-sided heap served over Thunderbolt links; see
/// [`ThunderboltTransport::with_heap`].
pub type ThunderboltHeap = Symmetric<ThunderboltTransport>;

/// The Thunderbolt transport: the TCP transport of `rlx-net` — same rendezvous, handshake,
/// framing, progress and failure detection — with every listening and connecting socket pinned
/// to a Thunderbolt link (`SO_BINDTODEVICE` on Linux, `IP_BOUND_IF`/`IPV6_BOUND_IF` on
/// macOS), listening on and advertising the link's own address.
///
/// Build one with [`ThunderboltTransport::from_env`] (the launch variables of
/// [`rlx_transport::bootstrap`], plus `RLX_TB_IFNAME`) or [`ThunderboltTransport::builder`].
/// The build fails with [`CollectiveError::Config`] when no Thunderbolt link is up (listing
/// every interface seen) or when an address of the rendezvous is routed through another
/// interface; it never falls back to another network. Several links to a peer come from a
/// hostfile whose entries list several addresses, one per link.
///
/// Blocking calls, failures and `Drop` behave as those of [`TcpTransport`].
///
/// # Examples
///
/// ```no_run
/// use rlx_tb::ThunderboltTransport;
/// use rlx_transport::Transport;
///
/// // RLX_RANK=1 RLX_WORLD_SIZE=2 RLX_MASTER_ADDR=169.254.10.1 RLX_MASTER_PORT=29500
/// let transport = ThunderboltTransport::from_env()?;
/// println!("rank {} on {:?}", transport.rank(), transport.links()[0].name);
/// transport.barrier()?;
/// # Ok::<(), rlx_transport::CollectiveError>(())
/// ```
#[derive(Debug)]
pub struct ThunderboltTransport {
    inner: TcpTransport,
    links: Vec<Interface>,
    home: Interface,
}

/// Configures and builds a [`ThunderboltTransport`]; see [`ThunderboltTransport::builder`].
///
/// It holds a [`TcpTransportBuilder`] and sets every option the two transports share (rank,
/// world size, hostfile or master address, timeouts, secret, job id, frame cap, sockets per
/// peer, tuning) through one door, [`tcp`](Self::tcp), instead of repeating them; its own
/// methods are only what Thunderbolt adds: which links ([`ifname`](Self::ifname),
/// [`links`](Self::links)) and the launch environment without `RLX_SOCKET_IFNAME`
/// ([`launch_env`](Self::launch_env)).
#[derive(Clone, Debug, Default)]
pub struct ThunderboltTransportBuilder {
    tcp: TcpTransportBuilder,
    ifname: Option<IfnameFilter>,
    links: Option<Vec<Interface>>,
}

impl ThunderboltTransportBuilder {
    /// Sets the options shared with TCP on the underlying [`TcpTransportBuilder`]: the rank
    /// and world size, the rendezvous (hostfile or master address: addresses on Thunderbolt
    /// links, IPv6 link-local ones as `"[fe80::1%thunderbolt0]:5000"`, one per link), timeouts,
    /// frame cap, secret, job id, sockets per peer, tuning. Its bind address and socket setup
    /// hook are replaced at build time by the link's address and the pinning hook.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use rlx_tb::ThunderboltTransport;
    ///
    /// let builder = ThunderboltTransport::builder().tcp(|tcp| {
    ///     tcp.rank(1)
    ///         .world_size(2)
    ///         .master("169.254.10.1", 29500)
    ///         .op_timeout(Duration::from_secs(60))
    /// });
    /// # drop(builder);
    /// ```
    pub fn tcp(mut self, adjust: impl FnOnce(TcpTransportBuilder) -> TcpTransportBuilder) -> Self {
        self.tcp = adjust(self.tcp);
        self
    }

    /// Chooses the links with an NCCL-style filter instead of `RLX_TB_IFNAME` (see
    /// [`select_links`](crate::select_links) for what it selects).
    pub fn ifname(mut self, filter: IfnameFilter) -> Self {
        self.ifname = Some(filter);
        self
    }

    /// Uses exactly these links, skipping discovery (for example links from
    /// [`discover`](crate::discover) that the caller filtered further).
    pub fn links(mut self, links: Vec<Interface>) -> Self {
        self.links = Some(links);
        self
    }

    /// Applies everything [`LaunchEnv`] read from the environment, except
    /// `RLX_SOCKET_IFNAME`: Thunderbolt links are chosen by discovery and `RLX_TB_IFNAME`.
    pub fn launch_env(self, env: LaunchEnv) -> Self {
        self.tcp(|tcp| {
            tcp.launch_env(LaunchEnv {
                ifname: None,
                ..env
            })
        })
    }

    /// Finds the links, checks the rendezvous against them, then rendezvous with every rank,
    /// connecting and handshaking every link pinned; waits up to the connect timeout for all
    /// ranks.
    ///
    /// Fails with `Config` when no link is up (listing the interfaces seen), when this rank's
    /// addresses do not belong to a link, or when the route to a peer's or the store's
    /// address leaves through another interface; with `Io` naming the peer when a peer
    /// advertised through the store cannot be reached over a link.
    pub fn build(self) -> Result<ThunderboltTransport> {
        let rendezvous = self.tcp.rendezvous_spec().cloned().ok_or_else(|| {
            CollectiveError::config("no rendezvous: give a hostfile or a master address")
        })?;
        let rank = self
            .tcp
            .rank_spec()
            .ok_or_else(|| CollectiveError::config("no rank given"))?;
        let seen = sys::list_interfaces()?;
        let links = match self.links {
            Some(links) => links,
            None => {
                let filter = match self.ifname {
                    Some(filter) => Some(filter),
                    None => crate::env::filter_from_env()?,
                };
                discovery::select_links(&seen, filter.as_ref())?
            }
        };
        let resolved = Resolved::resolve(&rendezvous)?;
        let plan = plan(rank, &resolved, LinkMap::new(links, seen)?, &kernel_route)?;
        let map = Arc::new(plan.map);
        let pinning = Arc::clone(&map);
        let mut tcp = self
            .tcp
            .socket_setup(move |socket, role| pinning.pin(socket, role));
        if let Some(ip) = plan.bind {
            tcp = tcp.bind_addr(ip);
        }
        let inner = tcp.build()?;
        Ok(ThunderboltTransport {
            inner,
            links: map.links().to_vec(),
            home: map.home().clone(),
        })
    }

    /// [`build`](Self::build), then [`ThunderboltTransport::with_heap`].
    pub fn build_with_heap(self, heap_size: u64) -> Result<ThunderboltHeap> {
        self.build()?.with_heap(heap_size)
    }
}

impl ThunderboltTransport {
    /// A builder with the defaults of [`TcpTransport::builder`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use rlx_tb::ThunderboltTransport;
    ///
    /// // Two Macs cabled twice: rank 0 listens on both links, rank 1 reaches it over both.
    /// let hostfile = vec![
    ///     vec!["169.254.1.1:5000".to_owned(), "169.254.2.1:5000".to_owned()],
    ///     vec!["169.254.1.2:5000".to_owned(), "169.254.2.2:5000".to_owned()],
    /// ];
    /// let transport = ThunderboltTransport::builder()
    ///     .tcp(|tcp| tcp.rank(0).hostfile(hostfile))
    ///     .build()?;
    /// # Ok::<(), rlx_transport::CollectiveError>(())
    /// ```
    pub fn builder() -> ThunderboltTransportBuilder {
        ThunderboltTransportBuilder::default()
    }

    /// Builds the transport from the launch environment: every variable of
    /// [`rlx_transport::bootstrap`] except `RLX_SOCKET_IFNAME`, with `RLX_TB_IFNAME` choosing
    /// the links when detection should not, and the TCP engine's tuning variables
    /// (`RLX_SPIN_US`, `RLX_HEARTBEAT_MS`, ...; see [`TcpTransportBuilder::tuning_env`]).
    pub fn from_env() -> Result<ThunderboltTransport> {
        let mut builder = Self::builder().launch_env(LaunchEnv::from_env()?);
        builder.tcp = builder.tcp.tuning_env()?;
        builder.build()
    }

    /// Wraps the transport in a symmetric heap of `heap_size` bytes (every rank must choose the
    /// same size), served over the same pinned links; see [`Symmetric::new`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use rlx_tb::ThunderboltTransport;
    /// use rlx_transport::symmetric::SymmetricTransport;
    /// use rlx_transport::Transport;
    ///
    /// let heap = ThunderboltTransport::from_env()?.with_heap(1 << 20)?;
    /// let counter = heap.alloc(8)?;
    /// heap.fetch_add(0, counter.offset(), 1)?;
    /// heap.barrier()?;
    /// # Ok::<(), rlx_transport::CollectiveError>(())
    /// ```
    pub fn with_heap(self, heap_size: u64) -> Result<ThunderboltHeap> {
        Symmetric::new(Arc::new(self), heap_size)
    }

    /// The Thunderbolt links in use, in discovery order.
    pub fn links(&self) -> &[Interface] {
        &self.links
    }

    /// The link of the rendezvous: where the store is reached (or hosted) or where this rank's
    /// first hostfile address lives.
    pub fn home_link(&self) -> &Interface {
        &self.home
    }

    /// The TCP transport underneath.
    pub fn tcp(&self) -> &TcpTransport {
        &self.inner
    }

    /// The address of `rank`'s first link, when connected.
    pub fn peer_addr(&self, rank: u32) -> Option<SocketAddr> {
        self.inner.peer_addr(rank)
    }
}

/// Why a Thunderbolt world cannot grow, in the errors of its [`Admission`].
pub(crate) const GROWING_UNSUPPORTED: &str = "growing a Thunderbolt world: the TCP admission \
    would listen for joiners and connect the grown world on sockets that are not pinned to the \
    Thunderbolt links (its link map was planned for the old world), and a joiner has no \
    Thunderbolt way in (rlx_collective::join is TCP only)";

/// Every method forwards to the TCP transport underneath, except [`admission`]: growing
/// refuses with [`CollectiveError::Unsupported`] naming why (see `GROWING_UNSUPPORTED`),
/// instead of growing a world whose new links leave the Thunderbolt cables.
///
/// [`admission`]: Transport::admission
impl rlx_transport::Delegate for ThunderboltTransport {
    fn inner(&self) -> &dyn Transport {
        &self.inner
    }

    fn admission(&self) -> Option<&dyn Admission> {
        Some(self)
    }
}

/// The refusal of `GROWING_UNSUPPORTED`, at the first step `ProcessGroup::grow` takes, so
/// that the group's rank 0 tells every member why and no rank waits for its deadline.
impl Admission for ThunderboltTransport {
    fn await_joiners(
        &self,
        _count: u32,
        _timeout: Duration,
    ) -> Result<Vec<Box<dyn PendingJoiner>>> {
        Err(CollectiveError::unsupported(GROWING_UNSUPPORTED))
    }

    fn plan_world(&self, _size: u32) -> Result<Vec<u8>> {
        Err(CollectiveError::unsupported(GROWING_UNSUPPORTED))
    }

    fn successor(&self, _plan: &[u8], _rank: u32, _size: u32) -> Result<Arc<dyn Transport>> {
        Err(CollectiveError::unsupported(GROWING_UNSUPPORTED))
    }
}

// Loopback stands in for a Thunderbolt link here, as in the netns tests' `RLX_TB_IFNAME==lo`;
// the interface is named `lo` on Linux only.
#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn growing_is_refused_with_the_reason() {
        let lo = sys::list_interfaces()
            .unwrap()
            .into_iter()
            .find(|i| i.name == "lo")
            .unwrap();
        let transport = ThunderboltTransport::builder()
            .links(vec![lo])
            .tcp(|tcp| tcp.rank(0).hostfile(vec![vec!["127.0.0.1:0".to_owned()]]))
            .build()
            .unwrap();
        let admission = transport.admission().expect("an admission that refuses");
        let refusals = [
            admission
                .await_joiners(1, Duration::from_millis(1))
                .map(drop),
            admission.plan_world(2).map(drop),
            admission.successor(&[], 0, 2).map(drop),
        ];
        for refusal in refusals {
            let err = refusal.unwrap_err();
            assert!(
                matches!(err, CollectiveError::Unsupported { .. })
                    && err
                        .to_string()
                        .contains("not pinned to the Thunderbolt links"),
                "{err}"
            );
        }
        // Everything else is the TCP transport's.
        assert_eq!((transport.rank(), transport.world_size()), (0, 1));
        transport.barrier().unwrap();
    }
}
