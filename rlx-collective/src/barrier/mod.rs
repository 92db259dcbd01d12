//! Barrier: no rank leaves before every rank arrived.

pub(crate) mod dissemination;
