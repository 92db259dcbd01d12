//! Replays the checked-in seed corpora of this crate's fuzz targets (`fuzz/corpus/<target>/`)
//! through the same functions the `cargo fuzz` targets call, so that every input the fuzzer
//! ever needed a fix for stays fixed on stable Rust.
//!
//! `RLX_WRITE_FUZZ_SEEDS=1 cargo test -p rlx-transport --test fuzz_replay` rewrites the seeds that the
//! encoders produce (the inputs found by fuzzing stay as they are).

use rlx_transport::fuzzing::{self, replay_corpus};

#[test]
fn hostfile() {
    replay_corpus("hostfile", fuzzing::hostfile).unwrap();
}

#[test]
fn ifname() {
    replay_corpus("ifname", fuzzing::ifname).unwrap();
}

#[test]
fn launch_env() {
    replay_corpus("launch_env", fuzzing::launch_env).unwrap();
}

#[test]
fn symmetric_wire() {
    replay_corpus("symmetric_wire", fuzzing::symmetric_wire).unwrap();
}

#[test]
fn failure_notice() {
    replay_corpus("failure_notice", fuzzing::failure_notice).unwrap();
}

/// The checked-in seeds are what the encoders produce (`RLX_WRITE_FUZZ_SEEDS=1` rewrites them).
#[test]
fn seed_corpus_is_what_the_encoders_produce() {
    fuzzing::check_or_write_seeds(&fuzzing::corpus_root(), &fuzzing::seeds()).unwrap();
}
