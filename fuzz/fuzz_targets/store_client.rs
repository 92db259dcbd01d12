//! Fuzz target `store_client`: its body is `rlx_net::fuzzing::store_client`, which the replay test of
//! the crate also runs over `corpus/store_client/`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Err(violation) = rlx_net::fuzzing::store_client(data) {
        panic!("store_client: {violation}");
    }
});
