//! Fuzz target `ifname`: its body is `rlx_transport::fuzzing::ifname`, which the replay test of
//! the crate also runs over `corpus/ifname/`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Err(violation) = rlx_transport::fuzzing::ifname(data) {
        panic!("ifname: {violation}");
    }
});
