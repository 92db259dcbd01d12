//! Replays the checked-in seed corpus of this crate's fuzz target (`fuzz/corpus/<target>/`)
//! through the same function the `cargo fuzz` target calls, so that every input the fuzzer
//! ever needed a fix for stays fixed on stable Rust.
//!
//! `RLX_WRITE_FUZZ_SEEDS=1 cargo test -p rlx-collective --test fuzz_replay` rewrites the seeds that the
//! encoders produce (the inputs found by fuzzing stay as they are).

use rlx_collective::fuzzing;
use rlx_transport::fuzzing::{check_or_write_seeds, corpus_root, replay_corpus};

#[test]
fn compressed_frame() {
    replay_corpus("compressed_frame", fuzzing::compressed_frame).unwrap();
}

/// The checked-in seeds are what the encoders produce (`RLX_WRITE_FUZZ_SEEDS=1` rewrites them).
#[test]
fn seed_corpus_is_what_the_encoders_produce() {
    check_or_write_seeds(&corpus_root(), &fuzzing::seeds()).unwrap();
}
