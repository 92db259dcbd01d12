//! Loom models of the flight recorder's lock-free ring of point-to-point calls: every
//! interleaving of calls starting and ending in one slot with a reader taking a snapshot.
//! Run with `cargo xtask loom`.

#![cfg(rlx_loom)]

use loom::sync::Arc;
use loom::thread;
use rlx_collective::DType;
use rlx_collective::flight::point_to_point::{Call, CallRing, PointToPoint};
use rlx_collective::flight::{FlightEntry, FlightState};

/// Call number `seq`, every field derived from the number so a mixture of two is visible.
fn call(seq: u32) -> Call {
    let (kind, dtype) = match seq {
        0 => (PointToPoint::Send, DType::F32),
        _ => (PointToPoint::Recv, DType::BF16),
    };
    Call {
        kind,
        peer: seq + 10,
        tag: seq + 20,
        dtype,
        elements: Some(u64::from(seq) + 30),
    }
}

fn issued_us(seq: u32) -> u64 {
    u64::from(seq) * 1_000_000 + 5
}

/// Runs call `seq` from start to end; it ends 3 ms after it started, failed if `fails`.
fn run(ring: &CallRing, seq: u32, fails: bool) {
    let started = ring.started(seq, call(seq), issued_us(seq));
    let error = fails.then(|| format!("call {seq} failed"));
    ring.ended(started, issued_us(seq) + 3000, error);
}

/// Checks that `entry` is wholly one call's: its fields, and a state its end agrees with.
fn check(entry: &FlightEntry) {
    let seq = entry.seq;
    let expected = call(seq);
    assert_eq!(entry.op, expected.kind.name());
    assert_eq!((entry.peer, entry.tag), (Some(seq + 10), Some(seq + 20)));
    assert_eq!(entry.dtype, Some(expected.dtype.name()));
    assert_eq!(entry.elements, expected.elements);
    assert_eq!(entry.issued_us, issued_us(seq));
    match entry.state {
        FlightState::Running => assert_eq!((entry.ended_us, &entry.error), (None, &None)),
        FlightState::Done => {
            assert_eq!(entry.ended_us, Some(issued_us(seq) + 3000));
            assert_eq!(entry.error, None);
        }
        FlightState::Failed => {
            assert_eq!(entry.ended_us, Some(issued_us(seq) + 3000));
            assert_eq!(entry.error, Some(format!("call {seq} failed")));
        }
        other => panic!("a point-to-point call recorded as {other:?}"),
    }
}

/// A reader copying a call while the call one ring length later takes its slot sees one whole
/// call or none, never a mixture; afterwards the slot holds the later call, failed, with its
/// message.
#[test]
fn a_reader_never_mixes_two_calls_of_one_slot() {
    loom::model(|| {
        let ring = Arc::new(CallRing::new(1));
        let writer = {
            let ring = ring.clone();
            thread::spawn(move || {
                run(&ring, 0, false);
                run(&ring, 1, true);
            })
        };
        thread::yield_now();
        let seen = ring.snapshot(1, 2);
        assert!(seen.len() <= 1);
        seen.iter().for_each(check);
        writer.join().unwrap();
        let after = ring.snapshot(1, 2);
        assert_eq!(after.len(), 1);
        check(&after[0]);
        assert_eq!((after[0].seq, after[0].state), (1, FlightState::Failed));
    });
}

/// Two calls one ring length apart that start and end at once leave exactly one of them in
/// the slot, whole and ended.
#[test]
fn calls_racing_for_a_slot_leave_one_whole() {
    loom::model(|| {
        let ring = Arc::new(CallRing::new(1));
        let writers: Vec<_> = [(0, false), (1, true)]
            .into_iter()
            .map(|(seq, fails)| {
                let ring = ring.clone();
                thread::spawn(move || run(&ring, seq, fails))
            })
            .collect();
        for writer in writers {
            writer.join().unwrap();
        }
        let after = ring.snapshot(1, 2);
        assert_eq!(after.len(), 1);
        check(&after[0]);
        assert_ne!(after[0].state, FlightState::Running);
    });
}
