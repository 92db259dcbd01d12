//! `ProcessGroup` and the collective algorithms of RLX, written only against the `Transport` contract.
