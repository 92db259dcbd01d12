//! A receive under the wrong tag (rank 0 sends tag 7, rank 1 waits for tag 8) is reported as
//! what it is when it times out: [`CollectiveError::Unreceived`], naming the tag waited for
//! and the peer's messages that wait unreceived, in elements of the type asked for. Over
//! `MemTransport` and over `TcpTransport` on loopback. Nothing depends on timing: rank 0
//! follows its tag-7 message with one under tag 9, which rank 1 receives first, so the tag-7
//! message has arrived (messages of one pair arrive in order) before the tag-8 receive starts;
//! that receive always times out, since no tag-8 message comes; and rank 0 waits for rank 1's
//! verdict before it leaves.

mod common;

use std::sync::{Arc, Barrier};
use std::time::Duration;

use rlx_collective::{CollectiveError, ProcessGroup, bf16};

/// Short, since the tag-8 receive is meant to time out, yet long enough that the tag-9
/// message reaches a rank of a busy machine first.
const OP_TIMEOUT: Duration = Duration::from_secs(2);

fn wrong_tag(groups: Vec<ProcessGroup>) {
    let done = Arc::new(Barrier::new(2));
    let results = common::on_each(groups, move |group| {
        let outcome = if group.rank() == 0 {
            group
                .send(1, 7, &[bf16::from_f32(1.0); 1024])
                .and_then(|()| group.send(1, 9, &[1u8]))
                .map(|()| None)
        } else {
            group.recv::<u8>(0, 9).expect("the tag-9 message");
            group
                .recv::<bf16>(0, 8)
                .map(|_| None)
                .or_else(|e| Ok(Some(e)))
        };
        done.wait();
        outcome
    });
    let error = results
        .into_iter()
        .nth(1)
        .and_then(|r| r.expect("rank 1's call returned"))
        .expect("rank 1's receive failed");
    assert!(
        matches!(
            error,
            CollectiveError::Unreceived {
                peer: 0,
                tag: 8,
                ..
            }
        ),
        "{error:?}"
    );
    let text = error.to_string();
    assert!(
        text.starts_with("recv from peer rank 0 under tag 8 timed out after")
            && text.ends_with(
                "rank 0 sent this rank what no receive took: tag 7 (1024 bf16 elements, 2048 \
                 bytes)"
            ),
        "{text}"
    );
}

#[test]
fn a_receive_on_the_wrong_tag_names_the_message_waiting_under_another_mem() {
    wrong_tag(common::world_with_timeout(2, OP_TIMEOUT));
}

#[cfg(feature = "tcp")]
#[test]
fn a_receive_on_the_wrong_tag_names_the_message_waiting_under_another_tcp() {
    wrong_tag(common::tcp_world(
        2,
        common::free_port(),
        |rank, n, port| common::loopback_builder(rank, n, port, OP_TIMEOUT),
    ))
}
