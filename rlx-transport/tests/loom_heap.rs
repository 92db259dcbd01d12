//! Loom models of the heap service: request ids matching out-of-order responses, quiet waiting
//! for every put (and reporting a dropped put's refusal), the ordering of a put before its
//! signal, the wake-up of `wait_until`, and the hand-over of requests from a peer's reader to
//! its server (order, a close that always ends the server, and the end of a departed peer's
//! stream, after which its queued requests are still served).
//! A remote peer is a loom thread that runs the service state machine on the shared heap.
//! Run with `cargo xtask loom`.

#![cfg(rlx_loom)]

use std::time::Duration;

use loom::sync::Arc;
use loom::thread;
use rlx_transport::CollectiveError;
use rlx_transport::symmetric::queue::RequestQueue;
use rlx_transport::symmetric::service::{self, Completions, OpKind, Outcome};
use rlx_transport::symmetric::wire::{self, Message};
use rlx_transport::symmetric::{Cmp, HeapFault, Signal, SymmetricHeap};

const LONG: Duration = Duration::from_secs(3600);

/// Serves one encoded request on `heap` and returns the encoded response, as the target's
/// server thread does.
fn serve_bytes(heap: &SymmetricHeap, request: &[u8]) -> Vec<u8> {
    match wire::decode(0, request).unwrap() {
        Message::Request(request) => service::serve(heap, &request),
        Message::Response(response) => panic!("not a request: {response:?}"),
    }
}

/// Two waiters for two requests to the same peer, answered in the opposite order: each gets
/// its own answer.
#[test]
fn request_ids_match_out_of_order_responses() {
    loom::model(|| {
        let table = Arc::new(Completions::new(0));
        let a = table.begin(1, OpKind::Atomic).unwrap();
        let b = table.begin(1, OpKind::Atomic).unwrap();
        let waiter = {
            let table = table.clone();
            thread::spawn(move || table.wait(1, a, "fetch_add", LONG).unwrap())
        };
        let responder = {
            let table = table.clone();
            thread::spawn(move || {
                table
                    .complete(1, wire::encode_value(b, 20).to_vec())
                    .unwrap();
                table
                    .complete(1, wire::encode_value(a, 10).to_vec())
                    .unwrap();
            })
        };
        assert_eq!(
            table.wait(1, b, "fetch_add", LONG).unwrap(),
            Outcome::Value(20)
        );
        assert_eq!(waiter.join().unwrap(), Outcome::Value(10));
        responder.join().unwrap();
    });
}

/// Quiet returns only after the target applied every put issued before it.
#[test]
fn quiet_waits_until_every_put_is_applied() {
    loom::model(|| {
        let heap = Arc::new(SymmetricHeap::new(1, 16).unwrap());
        let table = Arc::new(Completions::new(0));
        let first = table.begin(1, OpKind::Put).unwrap();
        let second = table.begin(1, OpKind::Put).unwrap();
        let requests = vec![
            [&wire::encode_put_header(first, 0)[..], &[1u8; 8]].concat(),
            [&wire::encode_put_header(second, 8)[..], &[2u8; 8]].concat(),
        ];
        let target = {
            let heap = heap.clone();
            let table = table.clone();
            thread::spawn(move || {
                for request in requests {
                    let reply = serve_bytes(&heap, &request);
                    table.complete(1, reply).unwrap();
                }
            })
        };
        table.detach(1, first);
        table.quiet(LONG).unwrap();
        let mut seen = [0u8; 16];
        heap.read(0, &mut seen).unwrap();
        assert_eq!(seen, [[1u8; 8], [2u8; 8]].concat().as_slice());
        target.join().unwrap();
        assert_eq!(table.wait(1, second, "put", LONG).unwrap(), Outcome::Ack);
    });
}

/// A put followed (in link order) by a put-with-signal: a target that wakes on the signal sees
/// both payloads.
#[test]
fn data_put_before_a_signal_is_visible_when_it_wakes() {
    loom::model(|| {
        let heap = Arc::new(SymmetricHeap::new(1, 24).unwrap());
        let server = {
            let heap = heap.clone();
            thread::spawn(move || {
                let put = [&wire::encode_put_header(0, 0)[..], &[7u8; 8]].concat();
                serve_bytes(&heap, &put);
                let signalled = [
                    &wire::encode_put_signal_header(1, 8, Signal::set(16, 1))[..],
                    &[9u8; 8],
                ]
                .concat();
                serve_bytes(&heap, &signalled);
            })
        };
        assert_eq!(heap.wait_until(16, Cmp::Eq, 1, LONG).unwrap(), 1);
        let mut seen = [0u8; 16];
        heap.read(0, &mut seen).unwrap();
        assert_eq!(seen, [[7u8; 8], [9u8; 8]].concat().as_slice());
        server.join().unwrap();
    });
}

/// Remote atomics from two peers and a local waiter for their sum: the waiter always wakes.
#[test]
fn wait_until_wakes_for_concurrent_atomics() {
    loom::model(|| {
        let heap = Arc::new(SymmetricHeap::new(0, 8).unwrap());
        let peers: Vec<_> = (1..=2u64)
            .map(|peer| {
                let heap = heap.clone();
                thread::spawn(move || {
                    let reply = serve_bytes(&heap, &wire::encode_fetch_add(peer, 0, peer));
                    assert!(matches!(
                        wire::decode(0, &reply).unwrap(),
                        Message::Response(wire::Response::Value { .. })
                    ));
                })
            })
            .collect();
        assert_eq!(heap.wait_until(0, Cmp::Ge, 3, LONG).unwrap(), 3);
        for peer in peers {
            peer.join().unwrap();
        }
    });
}

/// A put's handle dropped while its refusal arrives: in either order the refusal reaches the
/// next quiet, exactly once.
#[test]
fn a_dropped_handle_racing_its_answer_reports_to_quiet() {
    loom::model(|| {
        let table = Arc::new(Completions::new(0));
        let put = table.begin(1, OpKind::Put).unwrap();
        let dropper = {
            let table = table.clone();
            thread::spawn(move || table.detach(1, put))
        };
        let fault = HeapFault::OutOfBounds {
            offset: 16,
            len: 8,
            heap_size: 16,
        };
        let answer = wire::encode_fault(put, fault).to_vec();
        table.complete(1, answer).unwrap();
        dropper.join().unwrap();
        assert!(matches!(
            table.quiet(LONG),
            Err(CollectiveError::OutOfBounds { rank: 1, .. })
        ));
        table.quiet(LONG).unwrap();
    });
}

/// An abort racing a quiet with a put in flight always ends the quiet with `Aborted`.
#[test]
fn abort_ends_a_quiet() {
    loom::model(|| {
        let table = Arc::new(Completions::new(0));
        table.begin(1, OpKind::Put).unwrap();
        let aborter = {
            let table = table.clone();
            thread::spawn(move || table.abort())
        };
        assert!(matches!(table.quiet(LONG), Err(CollectiveError::Aborted)));
        aborter.join().unwrap();
    });
}

/// The reader hands two requests to a waiting server: the server gets both, in order, and no
/// wake-up is lost whichever side runs first.
#[test]
fn the_server_takes_the_readers_requests_in_order() {
    loom::model(|| {
        let queue = Arc::new(RequestQueue::new());
        let reader = {
            let queue = queue.clone();
            thread::spawn(move || {
                assert!(queue.push(vec![1]));
                assert!(queue.push(vec![2]));
            })
        };
        assert_eq!(queue.pop(), Some(vec![1]));
        assert_eq!(queue.pop(), Some(vec![2]));
        reader.join().unwrap();
    });
}

/// Dropping the transport closes the queue while the server may be waiting on it: the server
/// always returns, and a reader that pushes after the close is told to stop.
#[test]
fn closing_the_queue_ends_a_waiting_server() {
    loom::model(|| {
        let queue = Arc::new(RequestQueue::new());
        let server = {
            let queue = queue.clone();
            thread::spawn(move || {
                let mut served = 0;
                while queue.pop().is_some() {
                    served += 1;
                }
                served
            })
        };
        let pushed = queue.push(vec![7]);
        queue.close();
        assert!(!queue.push(vec![8]), "a closed queue takes nothing");
        let served = server.join().unwrap();
        assert!(served <= usize::from(pushed));
    });
}

/// A peer whose stream ends (it left) while the server may be waiting: the server serves every
/// request the reader queued before the end, in order, and then returns; nothing is pushed
/// after the end.
#[test]
fn ending_the_queue_serves_what_it_holds_then_stops_the_server() {
    loom::model(|| {
        let queue = Arc::new(RequestQueue::new());
        let server = {
            let queue = queue.clone();
            thread::spawn(move || {
                let mut served = Vec::new();
                while let Some(request) = queue.pop() {
                    served.push(request);
                }
                served
            })
        };
        assert!(queue.push(vec![1]));
        assert!(queue.push(vec![2]));
        queue.end();
        assert!(!queue.push(vec![3]), "an ended queue takes nothing");
        assert_eq!(server.join().unwrap(), vec![vec![1], vec![2]]);
    });
}
