//! What a test-cluster rank checks of its group on an emulated cabling before the cases: that
//! the transport learned the cabling (every cable the launcher laid, as `RLX_CABLING`
//! declares it, is in the link matrix), that the rings follow the cables, and that `Auto`
//! picks the plan made for the shape (direct on a mesh, two levels on islands, both ways
//! along a chain, a ring elsewhere) for a large all-reduce. From the sockets `ss` lists: that
//! each cabled peer is connected over its cable, and over Thunderbolt that every socket is
//! pinned to one of the rank's links.

use std::process::Command;

use rlx_collective::cabling::{Cabling, Shape};
use rlx_collective::{CABLING_VAR, ProcessGroup, Reach, ReduceKind};

use crate::world::TransportKind;

/// Elements of the all-reduce whose plan is checked: 64 KiB of f32, past the small sizes.
const PLANNED_ELEMENTS: usize = 16 * 1024;

/// Every check of the module docs; at most `most` hops of the ring order may lack a cable or a
/// switch.
pub(super) fn check(
    group: &ProcessGroup,
    most: usize,
    transport: TransportKind,
) -> Result<(), String> {
    rings_follow_cables(group, most)?;
    let sockets = sockets()?;
    cables_carry_their_pairs(group, &sockets)?;
    if transport == TransportKind::Tb {
        pinned_to_links(&sockets)?;
    }
    let Some(text) = std::env::var(CABLING_VAR).ok() else {
        return Ok(());
    };
    let declared: Cabling = text
        .parse()
        .map_err(|e| format!("{CABLING_VAR}={text}: {e}"))?;
    if let Some(topology) = group.topology() {
        let differences = declared.differences(&topology);
        if !differences.is_empty() {
            return Err(format!(
                "the link matrix is not the cabling laid: {}",
                differences.join("; ")
            ));
        }
    }
    planned_for(group, &declared)
}

/// Whether `group` knows its link matrix and rings along the cables: at most `most` hops of
/// its ring order without a cable or a switch.
fn rings_follow_cables(group: &ProcessGroup, most: usize) -> Result<(), String> {
    let Some(topology) = group.topology() else {
        return Err("the transport reports no link matrix on a cabling".to_owned());
    };
    let order = group.ring_order();
    let routed: Vec<String> = topology
        .routed_hops(order)
        .into_iter()
        .map(|(a, b)| format!("{a}->{b}"))
        .collect();
    if routed.len() > most {
        return Err(format!(
            "ring order {order:?} crosses other machines on {} hops ({}); along the cables \
             it would cross at most {most}",
            routed.len(),
            routed.join(", ")
        ));
    }
    Ok(())
}

/// One TCP socket as `ss -tanH` lists it.
struct Socket {
    state: String,
    /// The local address without its port, and the interface it is pinned to (`%dev`).
    local: String,
    device: Option<String>,
    /// The peer's address without its port.
    peer: String,
}

/// This rank's TCP sockets. Each rank of an emulated cabling has a network namespace of its
/// own, so `ss` lists this rank's alone: its links to every peer and what is left of the
/// rendezvous.
fn sockets() -> Result<Vec<Socket>, String> {
    let out = Command::new("ss")
        .arg("-tanH")
        .output()
        .map_err(|e| format!("ss, to read the sockets back: {e}"))?;
    let host = |address: &str| {
        let without_port = address.rsplit_once(':').map_or(address, |(a, _)| a);
        let bare = without_port.trim_start_matches('[').trim_end_matches(']');
        match bare.split_once('%') {
            Some((ip, device)) => (ip.to_owned(), Some(device.to_owned())),
            None => (bare.to_owned(), None),
        }
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(
            |line| match line.split_whitespace().collect::<Vec<_>>()[..] {
                [state, _, _, local, peer, ..] => {
                    let (local, device) = host(local);
                    Ok(Socket {
                        state: state.to_owned(),
                        local,
                        device,
                        peer: host(peer).0,
                    })
                }
                _ => Err(format!("an unreadable ss line: {line:?}")),
            },
        )
        .collect()
}

/// Whether every cabled peer's connection runs over the cable between the two (this rank's
/// end to the peer's), whatever address the rendezvous gave (seen to fail when the far
/// ranks' identities were used instead).
fn cables_carry_their_pairs(group: &ProcessGroup, sockets: &[Socket]) -> Result<(), String> {
    let Some(topology) = group.topology() else {
        return Ok(());
    };
    let me = group.rank();
    for peer in (0..group.world_size()).filter(|&p| p != me) {
        let Some(link) = topology.link(me, peer).filter(|l| l.reach == Reach::Cable) else {
            continue;
        };
        let (Some(local), Some(remote)) = (link.local, link.remote) else {
            continue;
        };
        let over_cable = sockets.iter().any(|s| {
            s.state == "ESTAB" && s.local == local.to_string() && s.peer == remote.to_string()
        });
        if !over_cable {
            return Err(format!(
                "no connection to rank {peer} over the cable between the two ({local} to \
                 {remote})"
            ));
        }
    }
    Ok(())
}

/// Whether every socket is pinned to a Thunderbolt link (`addr%link:port` in `ss`; seen to
/// fail over TCP, whose sockets are not pinned).
fn pinned_to_links(sockets: &[Socket]) -> Result<(), String> {
    let links: Vec<String> = rlx_tb::discover()
        .map_err(|e| format!("the Thunderbolt links: {e}"))?
        .into_iter()
        .map(|link| link.name)
        .collect();
    if let Some(loose) = sockets
        .iter()
        .find(|s| !s.device.as_ref().is_some_and(|d| links.contains(d)))
    {
        return Err(format!(
            "a socket from {} to {} is not pinned to a Thunderbolt link ({})",
            loose.local,
            loose.peer,
            links.join(", ")
        ));
    }
    if !sockets.iter().any(|s| s.state == "ESTAB") {
        return Err("ss lists no established connection".to_owned());
    }
    Ok(())
}

/// Runs one large all-reduce and checks that `Auto` chose the plan made for `declared`, and
/// that the result is exact.
fn planned_for(group: &ProcessGroup, declared: &Cabling) -> Result<(), String> {
    let n = group.world_size();
    let expected: &[&str] = match declared.shape {
        Shape::Mesh if n >= 3 => &["direct"],
        Shape::Islands { count, size } if count >= 2 && size >= 2 => &["two_level"],
        Shape::Chain if n >= 3 => &["bidirectional_chain"],
        Shape::Star if n >= 8 => &["halving_doubling"],
        _ => &["ring", "ring in cable order"],
    };
    let mut data = vec![1.0f32; PLANNED_ELEMENTS];
    group
        .all_reduce(&mut data, ReduceKind::Sum)
        .map_err(|e| format!("the all-reduce that checks the plan: {e}"))?;
    if let Some(i) = data.iter().position(|&x| x != n as f32) {
        return Err(format!(
            "the all-reduce that checks the plan: element {i} is {}, expected {n}",
            data[i]
        ));
    }
    let chosen = group
        .flight_record()
        .pop()
        .and_then(|entry| entry.algorithm);
    match chosen {
        Some(algorithm) if expected.contains(&algorithm) => Ok(()),
        other => Err(format!(
            "on the cabling {declared}, Auto ran a {} KiB all-reduce with {other:?}; the plan \
             for that shape is {expected:?}",
            PLANNED_ELEMENTS * 4 / 1024
        )),
    }
}
