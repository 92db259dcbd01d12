//! The rank-0 rendezvous store (`RLX_MASTER_ADDR:RLX_MASTER_PORT`): every rank registers its
//! process instance and listening addresses; when all have, the store sends everyone the table.
//!
//! `wire.rs` encodes and checks the messages, `client.rs` registers a rank other than 0, and
//! `server.rs` is rank 0's store.

mod client;
mod server;
mod wire;

pub(super) use client::register;
pub(super) use server::serve_store;
pub(super) use wire::Registration;
