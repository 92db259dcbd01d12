//! Fuzz target `frame_header`: its body is `rlx_net::fuzzing::frame_header`, which the replay test of
//! the crate also runs over `corpus/frame_header/`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Err(violation) = rlx_net::fuzzing::frame_header(data) {
        panic!("frame_header: {violation}");
    }
});
