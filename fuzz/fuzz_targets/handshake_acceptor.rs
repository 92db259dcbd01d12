//! Fuzz target `handshake_acceptor`: its body is `rlx_net::fuzzing::handshake_acceptor`, which the replay test of
//! the crate also runs over `corpus/handshake_acceptor/`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Err(violation) = rlx_net::fuzzing::handshake_acceptor(data) {
        panic!("handshake_acceptor: {violation}");
    }
});
