//! The rank-0 rendezvous store (`RLX_MASTER_ADDR:RLX_MASTER_PORT`): every rank registers its
//! process instance and listening addresses; when all have, the store sends everyone the table.
//! With `RLX_JOB_SECRET`, the store and each rank prove to each other that they hold it before
//! the registration counts, so that nobody else can publish an address or read the table.
//!
//! `wire.rs` encodes and checks the messages, `client.rs` registers a rank other than 0, and
//! `server.rs` is rank 0's store.

mod client;
mod server;
mod wire;

pub(super) use client::register;
pub(super) use server::serve_store;
// The client's exchange and the codec are the crate's too: `crate::fuzzing` drives both ends
// of the protocol.
pub(crate) use client::exchange as store_exchange;
pub(crate) use wire::{
    Registration, encode_networks, encode_registration, read_networks, read_registration,
    store_reply,
};
