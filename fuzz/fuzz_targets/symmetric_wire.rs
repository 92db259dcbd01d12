//! Fuzz target `symmetric_wire`: its body is `rlx_transport::fuzzing::symmetric_wire`, which the replay test of
//! the crate also runs over `corpus/symmetric_wire/`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Err(violation) = rlx_transport::fuzzing::symmetric_wire(data) {
        panic!("symmetric_wire: {violation}");
    }
});
