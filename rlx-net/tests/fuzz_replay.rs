//! Replays the checked-in seed corpora of this crate's fuzz targets (`fuzz/corpus/<target>/`)
//! through the same functions the `cargo fuzz` targets call, so that every input the fuzzer
//! ever needed a fix for stays fixed on stable Rust.
//!
//! `RLX_WRITE_FUZZ_SEEDS=1 cargo test -p rlx-net --test fuzz_replay` rewrites the seeds that the
//! encoders produce (the inputs found by fuzzing stay as they are).

use rlx_net::fuzzing;
use rlx_transport::fuzzing::{check_or_write_seeds, corpus_root, replay_corpus};

#[test]
fn frame_header() {
    replay_corpus("frame_header", fuzzing::frame_header).unwrap();
}

#[test]
fn handshake_acceptor() {
    replay_corpus("handshake_acceptor", fuzzing::handshake_acceptor).unwrap();
}

#[test]
fn handshake_connector() {
    replay_corpus("handshake_connector", fuzzing::handshake_connector).unwrap();
}

#[test]
fn store_server() {
    replay_corpus("store_server", fuzzing::store_server).unwrap();
}

#[test]
fn store_client() {
    replay_corpus("store_client", fuzzing::store_client).unwrap();
}

#[test]
fn admission() {
    replay_corpus("admission", fuzzing::admission).unwrap();
}

/// The checked-in seeds are what the encoders produce (`RLX_WRITE_FUZZ_SEEDS=1` rewrites them).
#[test]
fn seed_corpus_is_what_the_encoders_produce() {
    check_or_write_seeds(&corpus_root(), &fuzzing::seeds()).unwrap();
}
