//! Fuzz target `launch_env`: its body is `rlx_transport::fuzzing::launch_env`, which the replay test of
//! the crate also runs over `corpus/launch_env/`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Err(violation) = rlx_transport::fuzzing::launch_env(data) {
        panic!("launch_env: {violation}");
    }
});
