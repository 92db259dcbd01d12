//! Loom models of the progress engine's matching state (`rlx_net::model`): a posted receive
//! against an arriving frame, a deadline, a lost peer and an abort, and a reader parked on an
//! exhausted budget. Run with `cargo xtask loom`.

#![cfg(rlx_loom)]

use loom::sync::Arc;
use loom::thread;
use rlx_net::model::{Model, Posted};
use rlx_transport::{CollectiveError, Tag};

fn tag(n: u32) -> Tag {
    Tag::user(n).unwrap()
}

fn budget() -> u64 {
    1 << 20
}

/// A receive posted before or after its frame arrives gets exactly that frame.
#[test]
fn posted_receive_meets_arriving_frame() {
    loom::model(|| {
        let m = Arc::new(Model::new(2, budget()));
        let reader = {
            let m = m.clone();
            thread::spawn(move || m.arrive(1, 0, tag(1), b"abc").unwrap())
        };
        let got = match m.post(1, tag(1)).unwrap() {
            Posted::Ready(b) => b,
            Posted::Waiting(id) => m.wait(1, id).unwrap(),
        };
        assert!(reader.join().unwrap());
        assert_eq!(got, b"abc");
        assert_eq!(m.unexpected(1), 0);
    });
}

/// A deadline racing an arrival: the message is delivered exactly once, either to the
/// receive that gave up (it had finished) or to the next receive.
#[test]
fn deadline_races_arrival() {
    loom::model(|| {
        let m = Arc::new(Model::new(2, budget()));
        let reader = {
            let m = m.clone();
            thread::spawn(move || m.arrive(1, 0, tag(1), b"x").unwrap())
        };
        let first = match m.post(1, tag(1)).unwrap() {
            Posted::Ready(b) => Some(b),
            Posted::Waiting(id) => m.give_up(1, id).transpose().unwrap(),
        };
        reader.join().unwrap();
        let second = m.poll(1, tag(1)).unwrap();
        let seen: Vec<_> = first.into_iter().chain(second).collect();
        assert_eq!(seen, vec![b"x".to_vec()]);
    });
}

/// A peer that sends and then dies: the message still reaches the waiting receive (drain
/// first), and the next receive fails with `PeerLost` naming the peer.
#[test]
fn loss_after_arrival_drains_first() {
    loom::model(|| {
        let m = Arc::new(Model::new(2, budget()));
        let peer = {
            let m = m.clone();
            thread::spawn(move || {
                m.arrive(1, 0, tag(1), b"last").unwrap();
                m.lose(1);
            })
        };
        let got = match m.post(1, tag(1)).unwrap() {
            Posted::Ready(b) => b,
            Posted::Waiting(id) => m.wait(1, id).unwrap(),
        };
        assert_eq!(got, b"last");
        peer.join().unwrap();
        let err = m.post(1, tag(1)).unwrap_err();
        assert!(matches!(err, CollectiveError::PeerLost { peer: 1, .. }));
    });
}

/// A loss racing a waiting receive on another peer's tag never wakes it with data, and a
/// receive from the lost peer fails rather than hanging.
#[test]
fn loss_wakes_the_waiter() {
    loom::model(|| {
        let m = Arc::new(Model::new(3, budget()));
        let killer = {
            let m = m.clone();
            thread::spawn(move || m.lose(2))
        };
        let result = match m.post(2, tag(1)) {
            Ok(Posted::Waiting(id)) => m.wait(2, id),
            Ok(Posted::Ready(b)) => Ok(b),
            Err(e) => Err(e),
        };
        killer.join().unwrap();
        assert!(matches!(
            result,
            Err(CollectiveError::PeerLost { peer: 2, .. })
        ));
        assert!(m.poll(1, tag(1)).unwrap().is_none());
    });
}

/// Abort wakes a blocked receive with `Aborted`.
#[test]
fn abort_wakes_the_waiter() {
    loom::model(|| {
        let m = Arc::new(Model::new(2, budget()));
        let aborter = {
            let m = m.clone();
            thread::spawn(move || m.abort())
        };
        let result = match m.post(1, tag(1)) {
            Ok(Posted::Waiting(id)) => m.wait(1, id),
            Ok(Posted::Ready(b)) => Ok(b),
            Err(e) => Err(e),
        };
        aborter.join().unwrap();
        assert!(matches!(result, Err(CollectiveError::Aborted)));
    });
}

/// With a budget of one message, the reader parks on the second frame until the receiver has
/// taken the first; nothing deadlocks, order holds, and buffering never exceeds the budget.
#[test]
fn parked_reader_resumes_when_budget_frees() {
    loom::model(|| {
        let m = Arc::new(Model::new(2, 4));
        let reader = {
            let m = m.clone();
            thread::spawn(move || {
                m.arrive_blocking(1, 0, tag(1), b"one").unwrap();
                m.arrive_blocking(1, 1, tag(1), b"two").unwrap();
            })
        };
        let mut got = Vec::new();
        while got.len() < 2 {
            assert!(m.unexpected(1) <= 4);
            match m.post(1, tag(1)).unwrap() {
                Posted::Ready(b) => got.push(b),
                Posted::Waiting(id) => got.push(m.wait(1, id).unwrap()),
            }
        }
        reader.join().unwrap();
        assert_eq!(got, vec![b"one".to_vec(), b"two".to_vec()]);
    });
}
