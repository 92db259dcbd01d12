//! Loom models of the progress engine's receive loop, the code that ships (`Hub::recv` with its
//! reader role, follower sleep, conditional wake, deadline withdraw, loss and abort), over
//! fake sockets (`rlx_net::loom_rank`) whose peers are loom threads: a posted receive against
//! an arriving frame, a leader handing a follower its frame, a deadline, a lost peer and an
//! abort. Run with `cargo xtask loom`.

#![cfg(rlx_loom)]

use std::time::Duration;

use loom::sync::Arc;
use loom::thread;
use rlx_net::loom_rank::LoomRank;
use rlx_transport::{CollectiveError, Tag};

fn tag(n: u32) -> Tag {
    Tag::user(n).unwrap()
}

fn budget() -> u64 {
    1 << 20
}

/// Longer than any test moves the modelled clock: such a receive never times out.
const FOREVER: Duration = Duration::from_secs(3600);
/// The deadline of the receives that race one.
const SHORT: Duration = Duration::from_secs(1);

/// A receive posted before or after its frame arrives gets exactly that frame, landed in the
/// caller's buffer.
#[test]
fn posted_receive_meets_arriving_frame() {
    loom::model(|| {
        let rank = Arc::new(LoomRank::new(2, budget()));
        let peer = {
            let rank = rank.clone();
            thread::spawn(move || rank.send_from(1, 0, tag(1), b"abc"))
        };
        let mut buf = [0u8; 3];
        let got = rank.recv_into(1, tag(1), &mut buf, FOREVER).unwrap();
        peer.join().unwrap();
        assert_eq!(got, Some(3));
        assert_eq!(&buf, b"abc");
        assert_eq!(rank.unexpected(1), 0);
    });
}

/// Two receivers wait on one peer: whichever holds the reader role lands the other's frame in
/// a buffer of its own and wakes it, or hands the role over when its own receive is done;
/// neither sleeps forever and each gets its frame.
#[test]
fn follower_is_handed_its_frame() {
    loom::model(|| {
        let rank = Arc::new(LoomRank::new(2, budget()));
        rank.send_from(1, 0, tag(1), b"one");
        rank.send_from(1, 1, tag(2), b"two");
        let other = {
            let rank = rank.clone();
            thread::spawn(move || rank.recv(1, tag(2), FOREVER).unwrap())
        };
        let mine = rank.recv(1, tag(1), FOREVER).unwrap();
        let theirs = other.join().unwrap();
        assert_eq!(mine.as_deref(), Some(&b"one"[..]));
        assert_eq!(theirs.as_deref(), Some(&b"two"[..]));
        assert_eq!(rank.unexpected(1), 0);
    });
}

/// A deadline racing an arrival: the message is delivered exactly once, either to the
/// receive that gave up (it had finished first) or to the next receive.
#[test]
fn deadline_races_arrival() {
    loom::model(|| {
        let rank = Arc::new(LoomRank::new(2, budget()));
        let peer = {
            let rank = rank.clone();
            thread::spawn(move || rank.send_from(1, 0, tag(1), b"x"))
        };
        let clock = {
            let rank = rank.clone();
            thread::spawn(move || rank.advance(2 * SHORT))
        };
        let first = rank.recv(1, tag(1), SHORT).unwrap();
        peer.join().unwrap();
        clock.join().unwrap();
        let seen = match first {
            Some(bytes) => bytes,
            None => rank.recv(1, tag(1), FOREVER).unwrap().unwrap(),
        };
        assert_eq!(seen, b"x");
        assert_eq!(rank.unexpected(1), 0);
    });
}

/// A peer that sends and then hangs up: the message still reaches the receive (the frames
/// before the hang-up are read first), and the next receive fails with `PeerLost`.
#[test]
fn hang_up_after_arrival_drains_first() {
    loom::model(|| {
        let rank = Arc::new(LoomRank::new(2, budget()));
        let peer = {
            let rank = rank.clone();
            thread::spawn(move || {
                rank.send_from(1, 0, tag(1), b"last");
                rank.hang_up(1);
            })
        };
        let got = rank.recv(1, tag(1), FOREVER).unwrap();
        assert_eq!(got.as_deref(), Some(&b"last"[..]));
        peer.join().unwrap();
        let err = rank.recv(1, tag(1), FOREVER).unwrap_err();
        assert!(matches!(err, CollectiveError::PeerLost { peer: 1, .. }));
    });
}

/// A loss noticed by the watcher races a receive from that peer: the receive fails with
/// `PeerLost` whether it was asleep, reading or not yet posted, and never hangs; other peers'
/// receives are untouched.
#[test]
fn loss_wakes_the_waiter() {
    loom::model(|| {
        let rank = Arc::new(LoomRank::new(3, budget()));
        let killer = {
            let rank = rank.clone();
            thread::spawn(move || rank.lose(2))
        };
        let result = rank.recv(2, tag(1), FOREVER);
        killer.join().unwrap();
        assert!(matches!(
            result,
            Err(CollectiveError::PeerLost { peer: 2, .. })
        ));
        assert!(rank.recv(1, tag(1), Duration::ZERO).unwrap().is_none());
    });
}

/// A loss racing a receive with a deadline and an arriving frame: the receive ends with the
/// frame, at its deadline, or with `PeerLost`, and never hangs.
#[test]
fn loss_races_deadline_and_arrival() {
    loom::model(|| {
        let rank = Arc::new(LoomRank::new(2, budget()));
        rank.send_from(1, 0, tag(1), b"y");
        let killer = {
            let rank = rank.clone();
            thread::spawn(move || rank.lose(1))
        };
        let clock = {
            let rank = rank.clone();
            thread::spawn(move || rank.advance(2 * SHORT))
        };
        let result = rank.recv(1, tag(1), SHORT);
        killer.join().unwrap();
        clock.join().unwrap();
        match result {
            Ok(Some(bytes)) => assert_eq!(bytes, b"y"),
            Ok(None) | Err(CollectiveError::PeerLost { peer: 1, .. }) => {}
            Err(other) => panic!("unexpected {other:?}"),
        }
    });
}

/// Abort wakes a blocked receive, whether it sleeps as a follower or reads, with `Aborted`.
#[test]
fn abort_wakes_the_waiter() {
    loom::model(|| {
        let rank = Arc::new(LoomRank::new(2, budget()));
        let aborter = {
            let rank = rank.clone();
            thread::spawn(move || rank.abort())
        };
        let follower = {
            let rank = rank.clone();
            thread::spawn(move || rank.recv(1, tag(2), FOREVER))
        };
        let result = rank.recv(1, tag(1), FOREVER);
        aborter.join().unwrap();
        assert!(matches!(result, Err(CollectiveError::Aborted)));
        assert!(matches!(
            follower.join().unwrap(),
            Err(CollectiveError::Aborted)
        ));
    });
}

/// A catch-up after a stop takes every link no receiver holds: a link the background watcher
/// holds is waited for until the watcher gives it back, never skipped, and never waited for
/// past the deadline.
#[test]
fn a_sweep_waits_for_the_links_the_watcher_holds() {
    loom::model(|| {
        let rank = Arc::new(LoomRank::new(3, budget()));
        rank.watcher_takes(2);
        let watcher = {
            let rank = rank.clone();
            thread::spawn(move || rank.watcher_releases(2))
        };
        let mut taken = rank.sweep(FOREVER);
        watcher.join().unwrap();
        taken.sort_unstable();
        assert_eq!(taken, [1, 2]);
    });
    loom::model(|| {
        let rank = Arc::new(LoomRank::new(2, budget()));
        rank.watcher_takes(1);
        let clock = {
            let rank = rank.clone();
            thread::spawn(move || rank.advance(Duration::from_millis(200)))
        };
        // The watcher never lets go: the sweep ends at its deadline, with nothing taken.
        let taken = rank.sweep(Duration::from_millis(100));
        clock.join().unwrap();
        assert!(taken.is_empty(), "{taken:?}");
    });
}
