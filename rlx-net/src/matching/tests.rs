//! Unit tests of the matching state: every transition and the invariants it keeps, without
//! sockets.

use super::*;
use crate::frame::{FrameHeader, FrameKind};

fn tag(n: u32) -> Tag {
    Tag::user(n).unwrap()
}

fn header(seq: u64, tag: Tag, total: u64, offset: u64, len: u64) -> FrameHeader {
    FrameHeader {
        kind: FrameKind::Data,
        tag,
        seq,
        total,
        offset,
        len,
    }
}

/// Lands `bytes` as message `seq` the way a reader does; returns the landing used.
fn land(st: &mut State, from: u32, seq: u64, t: Tag, bytes: &[u8]) -> Landing {
    let h = FrameHeader::whole(FrameKind::Data, t, seq, bytes.len() as u64);
    let landing = st.on_first_frame(from, &h, None).unwrap();
    if let Landing::Owned(ptr) = landing {
        // SAFETY: the buffer has `bytes.len()` bytes and nothing else touches it meanwhile.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), ptr, bytes.len()) };
    }
    if !matches!(landing, Landing::Park) && !bytes.is_empty() {
        st.on_bytes(from, seq, bytes.len() as u64).unwrap();
    }
    landing
}

fn ready(st: &mut State, from: u32, t: Tag) -> Vec<u8> {
    match st.begin_recv(from, t, None).unwrap() {
        Begin::Ready(Outcome::Owned(b)) => b,
        other => panic!("expected a queued message, got {other:?}"),
    }
}

/// A message a receive took and gave back is the next one of its tag again, before the
/// later ones, and a message still arriving behind it (whose sequence number the put-back
/// entry takes, at the head of the queue) still completes as itself.
#[test]
fn a_message_put_back_comes_first_for_its_tag() {
    let mut st = State::new(2, 1, 1 << 20, u64::MAX);
    land(&mut st, 1, 0, tag(1), b"a1");
    let h = header(1, tag(2), 4, 0, 4);
    assert!(matches!(
        st.on_first_frame(1, &h, None).unwrap(),
        Landing::Owned(_)
    ));
    st.on_bytes(1, 1, 2).unwrap();
    let taken = ready(&mut st, 1, tag(1));
    assert_eq!(taken, b"a1");
    st.put_back(1, tag(1), Outcome::Owned(taken), None);
    land(&mut st, 1, 2, tag(1), b"a2");
    st.on_bytes(1, 1, 2).unwrap();
    assert_eq!(ready(&mut st, 1, tag(1)), b"a1");
    assert_eq!(ready(&mut st, 1, tag(1)), b"a2");
    assert_eq!(ready(&mut st, 1, tag(2)).len(), 4);
    // A landed message is put back from the receive's own buffer.
    st.put_back(1, tag(3), Outcome::Landed(2), Some(b"xyz"));
    assert_eq!(ready(&mut st, 1, tag(3)), b"xy");
}

#[test]
fn unexpected_messages_queue_in_order_per_tag() {
    let mut st = State::new(2, 1, 1 << 20, u64::MAX);
    land(&mut st, 1, 0, tag(1), b"a1");
    land(&mut st, 1, 1, tag(2), b"b1");
    land(&mut st, 1, 2, tag(1), b"a2");
    land(&mut st, 1, 3, tag(3), b"");
    assert_eq!(ready(&mut st, 1, tag(2)), b"b1");
    assert_eq!(ready(&mut st, 1, tag(1)), b"a1");
    assert_eq!(ready(&mut st, 1, tag(1)), b"a2");
    assert_eq!(ready(&mut st, 1, tag(3)), b"");
    assert!(matches!(
        st.begin_recv(1, tag(1), None).unwrap(),
        Begin::Posted(_)
    ));
}

#[test]
fn the_readers_own_receive_lands_in_its_buffer() {
    let mut st = State::new(2, 1, 1 << 20, u64::MAX);
    let Begin::Posted(id) = st.begin_recv(1, tag(1), Some(8)).unwrap() else {
        panic!("nothing was queued");
    };
    let h = FrameHeader::whole(FrameKind::Data, tag(1), 0, 5);
    assert!(matches!(
        st.on_first_frame(1, &h, Some(id)).unwrap(),
        Landing::Caller
    ));
    st.on_bytes(1, 0, 5).unwrap();
    assert!(matches!(st.poll_post(1, id), Some(Ok(Outcome::Landed(5)))));
    // Too long for the buffer: consumed and reported.
    let Begin::Posted(id) = st.begin_recv(1, tag(1), Some(4)).unwrap() else {
        panic!("nothing was queued");
    };
    let h = FrameHeader::whole(FrameKind::Data, tag(1), 1, 9);
    assert!(matches!(
        st.on_first_frame(1, &h, Some(id)).unwrap(),
        Landing::Discard
    ));
    st.on_bytes(1, 1, 9).unwrap();
    assert!(matches!(
        st.poll_post(1, id),
        Some(Ok(Outcome::TooLong {
            capacity: 4,
            got: 9
        }))
    ));
}

#[test]
fn the_budget_parks_frames_but_admits_one_large_message() {
    let mut st = State::new(2, 1, 10, u64::MAX);
    assert!(matches!(
        land(&mut st, 1, 0, tag(1), &[1; 100]),
        Landing::Owned(_)
    ));
    assert!(matches!(
        land(&mut st, 1, 1, tag(1), &[2; 3]),
        Landing::Park
    ));
    assert_eq!(ready(&mut st, 1, tag(1)), vec![1; 100]);
    assert!(matches!(
        land(&mut st, 1, 1, tag(1), &[2; 3]),
        Landing::Owned(_)
    ));
    assert!(matches!(
        land(&mut st, 1, 2, tag(1), &[3; 7]),
        Landing::Owned(_)
    ));
    assert!(matches!(
        land(&mut st, 1, 3, tag(1), &[4; 1]),
        Landing::Park
    ));
    // A frame a receive waits for needs no budget.
    assert!(matches!(
        st.begin_recv(1, tag(9), None).unwrap(),
        Begin::Posted(_)
    ));
    let h = FrameHeader::whole(FrameKind::Data, tag(9), 3, 50);
    assert!(matches!(
        st.on_first_frame(1, &h, None).unwrap(),
        Landing::Owned(_)
    ));
}

#[test]
fn sequence_and_stripes_are_checked() {
    let mut st = State::new(2, 2, 1 << 30, 4096);
    let bad = FrameHeader::whole(FrameKind::Data, tag(1), 5, 1);
    assert!(st.on_first_frame(1, &bad, None).is_err());
    let total = 3 * 4096;
    let cut = Striping::new(total, 2, 4096);
    let (o1, l1) = cut.range(1);
    // A stripe of a message link 0 has not announced waits.
    let early = header(0, tag(1), total, o1, l1);
    assert!(matches!(
        st.on_stripe(1, 1, &early, None).unwrap(),
        Landing::Park
    ));
    let (o0, l0) = cut.range(0);
    assert!(
        st.on_first_frame(1, &header(0, tag(1), total, o0, l0 + 1), None)
            .is_err()
    );
    assert!(matches!(
        st.on_first_frame(1, &header(0, tag(1), total, o0, l0), None)
            .unwrap(),
        Landing::Owned(_)
    ));
    assert!(
        st.on_stripe(1, 1, &header(0, tag(1), total, o1 + 1, l1 - 1), None)
            .is_err()
    );
    assert!(
        st.on_stripe(1, 1, &header(0, tag(2), total, o1, l1), None)
            .is_err()
    );
    assert!(matches!(
        st.on_stripe(1, 1, &early, None).unwrap(),
        Landing::Owned(_)
    ));
    assert!(
        st.on_stripe(1, 1, &early, None).is_err(),
        "a stripe is taken once"
    );
    assert!(!st.on_bytes(1, 0, l0).unwrap());
    assert!(st.on_bytes(1, 0, l1).unwrap());
    assert_eq!(ready(&mut st, 1, tag(1)).len(), total as usize);
    assert!(
        st.on_stripe(1, 1, &early, None).is_err(),
        "finished messages take no stripes"
    );
}

#[test]
fn a_deadline_mid_message_moves_it_out_of_the_callers_buffer() {
    let mut st = State::new(2, 1, 1 << 20, u64::MAX);
    let Begin::Posted(id) = st.begin_recv(1, tag(1), Some(6)).unwrap() else {
        panic!("nothing was queued");
    };
    let h = FrameHeader::whole(FrameKind::Data, tag(1), 0, 6);
    assert!(matches!(
        st.on_first_frame(1, &h, Some(id)).unwrap(),
        Landing::Caller
    ));
    st.on_bytes(1, 0, 3).unwrap();
    let own = *b"abc???";
    let Withdrawn::Moved { seq: 0, base } = st.withdraw(1, id, Some(&own)) else {
        panic!("the message was landing in the caller's buffer");
    };
    // SAFETY: `base` is the moved message's 6-byte buffer; the rest lands there.
    unsafe { std::ptr::copy_nonoverlapping(b"def".as_ptr(), base.add(3), 3) };
    st.on_bytes(1, 0, 3).unwrap();
    assert_eq!(ready(&mut st, 1, tag(1)), b"abcdef");
}

#[test]
fn a_lost_peer_drains_first_and_notices_fail_fast() {
    let mut st = State::new(2, 1, 1 << 20, u64::MAX);
    land(&mut st, 1, 0, tag(1), b"kept");
    assert!(st.on_failure(1, 1, tag(2), Failure::Failed).unwrap());
    let err = match st.begin_recv(1, tag(2), None).unwrap() {
        Begin::Ready(Outcome::Failure(f)) => f.into_error(1),
        other => panic!("expected the notice, got {other:?}"),
    };
    assert!(matches!(err, CollectiveError::PeerFailed { peer: 1, .. }));
    // A message still arriving is dropped only once no reader holds the link.
    let h = FrameHeader::whole(FrameKind::Data, tag(3), 2, 10);
    st.on_first_frame(1, &h, None).unwrap();
    st.peers[1].links[0].holder = Holder::Background;
    st.mark_lost(1, Lost::Gone("reset".into()));
    assert_eq!(st.peers[1].arriving.len(), 1);
    st.peers[1].links[0].holder = Holder::Free;
    st.peers[1].drop_arriving_if_lost();
    assert!(st.peers[1].arriving.is_empty());
    assert_eq!(ready(&mut st, 1, tag(1)), b"kept");
    assert!(matches!(
        st.begin_recv(1, tag(3), None),
        Err(CollectiveError::PeerLost { peer: 1, .. })
    ));
}
