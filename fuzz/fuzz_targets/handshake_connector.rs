//! Fuzz target `handshake_connector`: its body is `rlx_net::fuzzing::handshake_connector`, which the replay test of
//! the crate also runs over `corpus/handshake_connector/`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Err(violation) = rlx_net::fuzzing::handshake_connector(data) {
        panic!("handshake_connector: {violation}");
    }
});
