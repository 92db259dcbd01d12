//! `rlx-tb-probe`: checks a host's Thunderbolt setup the way the transport will use it.
//!
//! ```text
//! rlx-tb-probe                                  list interfaces and the selected links
//! rlx-tb-probe connect [--unpinned] ADDR:PORT   connect, pinned to the link, and report
//! rlx-tb-probe listen [--unpinned] [--count N] ADDR:PORT
//!                                               listen, pinned, and accept N connections
//! ```
//!
//! Addresses may be IPv6 link-local with a scope (`[fe80::2%thunderbolt0]:5000`); the scope's
//! interface is then the link. Otherwise the first link of discovery (`RLX_TB_IFNAME` applies)
//! is used. Every failure is printed with its cause and exits with status 1.

use std::io::Write;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use rlx_tb::{Interface, discover, parse_scoped, pin_socket, pinned_interface, scoped_addr};
use rlx_transport::{CollectiveError, Result};
use socket2::{Domain, SockAddr, Socket, Type};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

fn io(source: std::io::Error) -> CollectiveError {
    CollectiveError::Io { peer: None, source }
}

/// The address to use and, when `pinned`, the link to pin to: the address's scope, or the
/// first discovered link.
fn resolve(address: &str, pinned: bool) -> Result<(SocketAddr, Option<Interface>)> {
    let (ip, scope, port) = parse_scoped(address)?;
    let port = port.ok_or_else(|| CollectiveError::config(format!("{address:?} has no port")))?;
    let link = match scope {
        Some(name) => Some(Interface::by_name(&name)?),
        None if pinned => Some(discover()?.remove(0)),
        None => None,
    };
    let addr = match &link {
        Some(link) => scoped_addr(ip, port, link)?,
        None => SocketAddr::new(ip, port),
    };
    Ok((addr, link.filter(|_| pinned)))
}

fn socket_for(addr: &SocketAddr) -> Result<Socket> {
    Socket::new(Domain::for_address(*addr), Type::STREAM, None).map_err(io)
}

fn describe_pin(socket: &Socket) -> Result<String> {
    Ok(match pinned_interface(socket)? {
        Some(name) => format!("pinned to {name}"),
        None => "not pinned".to_owned(),
    })
}

fn list() -> Result<()> {
    let links = discover()?;
    for link in links {
        let addrs: Vec<String> = link.addrs.iter().map(ToString::to_string).collect();
        let evidence = link.thunderbolt.as_ref().map_or_else(
            || "selected by RLX_TB_IFNAME".to_owned(),
            ToString::to_string,
        );
        println!(
            "link {} index {} ({evidence}) addresses [{}]",
            link.name,
            link.index,
            addrs.join(", ")
        );
    }
    Ok(())
}

fn connect(address: &str, pinned: bool) -> Result<()> {
    let (addr, link) = resolve(address, pinned)?;
    let socket = socket_for(&addr)?;
    if let Some(link) = &link {
        pin_socket(&socket, link)?;
    }
    socket
        .connect_timeout(&SockAddr::from(addr), CONNECT_TIMEOUT)
        .map_err(|e| {
            io(std::io::Error::new(
                e.kind(),
                format!(
                    "connect to {addr} ({}): {e}",
                    describe_pin(&socket).unwrap_or_default()
                ),
            ))
        })?;
    let local = socket.local_addr().map_err(io)?.as_socket();
    println!(
        "connected {} -> {addr}, {}",
        local.map_or_else(|| "?".to_owned(), |a| a.to_string()),
        describe_pin(&socket)?
    );
    Ok(())
}

fn listen(address: &str, pinned: bool, count: u32) -> Result<()> {
    let (addr, link) = resolve(address, pinned)?;
    let socket = socket_for(&addr)?;
    if let Some(link) = &link {
        pin_socket(&socket, link)?;
    }
    socket.set_reuse_address(true).map_err(io)?;
    socket.bind(&SockAddr::from(addr)).map_err(io)?;
    socket.listen(16).map_err(io)?;
    println!("listening on {addr}, {}", describe_pin(&socket)?);
    std::io::stdout().flush().map_err(io)?;
    for _ in 0..count {
        let (conn, peer) = socket.accept().map_err(io)?;
        let peer = peer
            .as_socket()
            .map_or_else(|| "?".to_owned(), |a| a.to_string());
        println!("accepted from {peer}, {}", describe_pin(&conn)?);
        std::io::stdout().flush().map_err(io)?;
    }
    Ok(())
}

fn run(args: &[String]) -> Result<()> {
    let usage = || {
        CollectiveError::invalid(
            "usage: rlx-tb-probe [connect [--unpinned] ADDR:PORT | listen [--unpinned] [--count N] ADDR:PORT]",
        )
    };
    let Some((command, rest)) = args.split_first() else {
        return list();
    };
    let mut pinned = true;
    let mut count = 1u32;
    let mut address = None;
    let mut it = rest.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--unpinned" => pinned = false,
            "--count" => {
                count = it.next().and_then(|n| n.parse().ok()).ok_or_else(usage)?;
            }
            other if address.is_none() => address = Some(other.to_owned()),
            _ => return Err(usage()),
        }
    }
    let address = address.ok_or_else(usage)?;
    match command.as_str() {
        "connect" => connect(&address, pinned),
        "listen" => listen(&address, pinned, count),
        _ => Err(usage()),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("rlx-tb-probe: {err}");
            ExitCode::FAILURE
        }
    }
}
