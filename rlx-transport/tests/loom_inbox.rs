//! Loom models of the [`Inbox`]: every interleaving of a delivery, a lost peer or an abort with
//! a blocked or polling receive. Run with `cargo xtask loom`.

#![cfg(rlx_loom)]

use std::time::Duration;

use loom::sync::Arc;
use loom::thread;
use rlx_transport::inbox::{Delivery, Inbox};
use rlx_transport::{CollectiveError, Tag};

fn tag(n: u32) -> Tag {
    Tag::user(n).unwrap()
}

/// A receive that blocks while a sender delivers two messages on two tags gets its own message,
/// and the other stays queued.
#[test]
fn blocked_receive_gets_its_message() {
    loom::model(|| {
        let inbox = Arc::new(Inbox::new(0));
        let sender = {
            let inbox = inbox.clone();
            thread::spawn(move || {
                inbox.deliver(1, tag(2), Delivery::Data(vec![2])).unwrap();
                inbox.deliver(1, tag(1), Delivery::Data(vec![1])).unwrap();
            })
        };
        let got = inbox.take(1, tag(1), Duration::from_secs(3600)).unwrap();
        assert_eq!(got, Some(vec![1]));
        sender.join().unwrap();
        assert_eq!(
            inbox.take(1, tag(2), Duration::ZERO).unwrap(),
            Some(vec![2])
        );
    });
}

/// A polling receive racing a delivery either gets the message or leaves it queued: nothing is
/// lost and nothing is seen twice.
#[test]
fn polling_receive_never_loses_a_message() {
    loom::model(|| {
        let inbox = Arc::new(Inbox::new(0));
        let sender = {
            let inbox = inbox.clone();
            thread::spawn(move || {
                inbox.deliver(1, tag(1), Delivery::Data(vec![7])).unwrap();
            })
        };
        let first = inbox.take(1, tag(1), Duration::ZERO).unwrap();
        sender.join().unwrap();
        let second = inbox.take(1, tag(1), Duration::ZERO).unwrap();
        let seen: Vec<_> = first.into_iter().chain(second).collect();
        assert_eq!(seen, vec![vec![7]]);
    });
}

/// Two receivers on different tags, two deliveries: each gets exactly its own.
#[test]
fn two_waiters_each_get_their_own() {
    loom::model(|| {
        let inbox = Arc::new(Inbox::new(0));
        let other = {
            let inbox = inbox.clone();
            thread::spawn(move || inbox.take(1, tag(2), Duration::from_secs(3600)).unwrap())
        };
        let sender = {
            let inbox = inbox.clone();
            thread::spawn(move || {
                inbox.deliver(1, tag(1), Delivery::Data(vec![1])).unwrap();
                inbox.deliver(1, tag(2), Delivery::Data(vec![2])).unwrap();
            })
        };
        assert_eq!(
            inbox.take(1, tag(1), Duration::from_secs(3600)).unwrap(),
            Some(vec![1])
        );
        assert_eq!(other.join().unwrap(), Some(vec![2]));
        sender.join().unwrap();
    });
}

/// An abort racing a blocked receive always wakes it with `Aborted`.
#[test]
fn abort_wakes_a_blocked_receive() {
    loom::model(|| {
        let inbox = Arc::new(Inbox::new(0));
        let aborter = {
            let inbox = inbox.clone();
            thread::spawn(move || inbox.abort())
        };
        let got = inbox.take(1, tag(1), Duration::from_secs(3600));
        assert!(matches!(got, Err(CollectiveError::Aborted)));
        aborter.join().unwrap();
    });
}

/// A peer that delivers and then is lost: the receive gets the message first, and only the
/// next receive reports the loss.
#[test]
fn lost_peer_after_delivery_drains_first() {
    loom::model(|| {
        let inbox = Arc::new(Inbox::new(0));
        let peer = {
            let inbox = inbox.clone();
            thread::spawn(move || {
                inbox.deliver(1, tag(1), Delivery::Data(vec![5])).unwrap();
                inbox.mark_lost(1, "exited");
            })
        };
        let first = inbox.take(1, tag(1), Duration::from_secs(3600)).unwrap();
        assert_eq!(first, Some(vec![5]));
        let second = inbox.take(1, tag(1), Duration::from_secs(3600));
        assert!(matches!(
            second,
            Err(CollectiveError::PeerLost { peer: 1, .. })
        ));
        peer.join().unwrap();
    });
}
