//! What bootstrap is told (the builder's [`BootConfig`], the socket setup hook) and what it
//! hands back ([`Established`]).

use std::io;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use rlx_transport::{Rendezvous, Topology, ifname::IfnameFilter};
use socket2::Socket;

/// What a socket is about to do when the socket setup hook
/// ([`TcpTransportBuilder::socket_setup`](crate::TcpTransportBuilder::socket_setup)) sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SocketRole {
    /// A listening socket (a link listener, or rank 0's rendezvous store) about to be bound to
    /// this local address, which may be unspecified (`0.0.0.0`, `::`).
    Listen(SocketAddr),
    /// A socket about to connect to this address (a peer's listener, or the rendezvous store).
    Connect(SocketAddr),
    /// A connection a listener accepted from this peer address, before anything is read from
    /// it. An error from the hook closes the connection (logged at `warn`), as a stranger's is.
    Accepted(SocketAddr),
}

/// The signature of a socket setup hook: it sees every socket bootstrap creates, before
/// `bind` or `connect`, and may refuse it with an error.
pub(crate) type SocketSetupFn = dyn Fn(&Socket, SocketRole) -> io::Result<()> + Send + Sync;

/// A socket setup hook as the bootstrap configuration carries it.
#[derive(Clone)]
pub(crate) struct SocketSetup(pub(crate) Arc<SocketSetupFn>);

impl std::fmt::Debug for SocketSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SocketSetup(..)")
    }
}

/// How long a connection to a bootstrap listener (a link listener, the rendezvous store) may
/// take to say who it is, and a connector to hear the answer, unless the builder says
/// otherwise.
pub(crate) const DEFAULT_HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// What bootstrap needs to know (assembled by the builder).
#[derive(Clone, Debug)]
pub(crate) struct BootConfig {
    pub(crate) rank: u32,
    pub(crate) world: u32,
    pub(crate) rendezvous: Rendezvous,
    pub(crate) connect_timeout: Duration,
    /// The deadline of every handshake, from the moment the connection is made.
    pub(crate) hello_timeout: Duration,
    pub(crate) job: [u8; 16],
    pub(crate) secret: Option<Vec<u8>>,
    pub(crate) links: u32,
    pub(crate) bind_ip: Option<IpAddr>,
    pub(crate) ifname: Option<IfnameFilter>,
    pub(crate) socket_setup: Option<SocketSetup>,
}

/// The established links: `links[r]` holds rank `r`'s connections in link order (empty for
/// this rank).
#[derive(Debug)]
pub(crate) struct Established {
    pub(crate) links: Vec<Vec<TcpStream>>,
    pub(crate) addrs: Vec<Option<SocketAddr>>,
    /// The link matrix, from the networks every rank registered in the store or, with a
    /// hostfile, sent every peer once its links were up.
    pub(crate) topology: Option<Topology>,
}

/// One established link: the peer's rank, the link index and the connection.
pub(super) type Link = (u32, u32, TcpStream);
