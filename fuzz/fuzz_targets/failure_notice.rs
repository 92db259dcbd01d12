//! Fuzz target `failure_notice`: its body is `rlx_transport::fuzzing::failure_notice`, which the replay test of
//! the crate also runs over `corpus/failure_notice/`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Err(violation) = rlx_transport::fuzzing::failure_notice(data) {
        panic!("failure_notice: {violation}");
    }
});
