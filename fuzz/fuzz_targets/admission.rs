//! Fuzz target `admission`: its body is `rlx_net::fuzzing::admission`, which the replay test of
//! the crate also runs over `corpus/admission/`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Err(violation) = rlx_net::fuzzing::admission(data) {
        panic!("admission: {violation}");
    }
});
