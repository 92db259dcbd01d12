//! What a test-cluster rank checks of its group on an emulated cabling before the cases: that
//! the transport learned the cabling (every cable the launcher laid, as `RLX_CABLING`
//! declares it, is in the link matrix), that the rings follow the cables, and that `Auto`
//! picks the plan made for the shape (direct on a mesh, two levels on islands, both ways
//! along a chain, a ring elsewhere) for a large all-reduce. Over Thunderbolt, also that every
//! TCP socket of the rank is pinned to one of its links, as `ss` reads them back.

use std::process::Command;

use rlx_collective::cabling::{Cabling, Shape};
use rlx_collective::{CABLING_VAR, ProcessGroup, ReduceKind};

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
    if transport == TransportKind::Tb {
        sockets_pinned_to_links()?;
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

/// Whether every TCP socket `ss` lists is pinned to a Thunderbolt link (`addr%link:port`).
/// Each rank of an emulated cabling has a network namespace of its own, so those are this
/// rank's sockets: its links to every peer and what is left of the rendezvous. (Seen to fail
/// over TCP, whose sockets are not pinned.)
fn sockets_pinned_to_links() -> Result<(), String> {
    let links: Vec<String> = rlx_tb::discover()
        .map_err(|e| format!("the Thunderbolt links: {e}"))?
        .into_iter()
        .map(|link| link.name)
        .collect();
    let out = Command::new("ss")
        .arg("-tanH")
        .output()
        .map_err(|e| format!("ss, to read the sockets' pinning back: {e}"))?;
    let table = String::from_utf8_lossy(&out.stdout);
    let mut established = 0;
    for line in table.lines().filter(|l| !l.trim().is_empty()) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (state, local) = match fields.as_slice() {
            [state, _, _, local, ..] => (*state, *local),
            _ => return Err(format!("an unreadable ss line: {line:?}")),
        };
        let device = local
            .rsplit_once(':')
            .and_then(|(addr, _)| addr.split_once('%'))
            .map(|(_, device)| device.trim_end_matches(']'));
        if !device.is_some_and(|d| links.iter().any(|link| link == d)) {
            return Err(format!(
                "a socket is not pinned to a Thunderbolt link ({}): {line:?}",
                links.join(", ")
            ));
        }
        established += usize::from(state == "ESTAB");
    }
    if established == 0 {
        return Err(format!("ss lists no established connection: {table:?}"));
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
