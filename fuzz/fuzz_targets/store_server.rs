//! Fuzz target `store_server`: its body is `rlx_net::fuzzing::store_server`, which the replay test of
//! the crate also runs over `corpus/store_server/`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Err(violation) = rlx_net::fuzzing::store_server(data) {
        panic!("store_server: {violation}");
    }
});
