//! Fuzz target `hostfile`: its body is `rlx_transport::fuzzing::hostfile`, which the replay test of
//! the crate also runs over `corpus/hostfile/`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Err(violation) = rlx_transport::fuzzing::hostfile(data) {
        panic!("hostfile: {violation}");
    }
});
