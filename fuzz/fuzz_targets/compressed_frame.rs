//! Fuzz target `compressed_frame`: its body is `rlx_collective::fuzzing::compressed_frame`, which the replay test of
//! the crate also runs over `corpus/compressed_frame/`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Err(violation) = rlx_collective::fuzzing::compressed_frame(data) {
        panic!("compressed_frame: {violation}");
    }
});
