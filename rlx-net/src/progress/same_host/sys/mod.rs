//! Operating-system code of the same-host room: one file per facility, each with the Linux
//! calls and, for every other system, answers that say the facility is missing.
//!
//! # The contract each file provides
//!
//! - `cross_memory.rs`, reading and writing another process's memory in one kernel copy:
//!   `SUPPORTED` (whether the system has the calls at all), `own_pid()`, `read_from(pid,
//!   ranges, local)` and `read_at(pid, ranges, offset, local)` (copy the concatenated remote
//!   ranges, or a stretch of them, into `local`), `write_word(pid, addr, value)` (store one
//!   `u64` in the other process).
//! - `shared_memory.rs`, files both processes map: `SUPPORTED`, `create(len)` (an anonymous
//!   file that can grow but never shrink), `grow(fd, len)`, `open_peer_file(pid, fd)` (another
//!   process's file, with its length), `map(fd, len)` (a shared mapping, unmapped when its
//!   `SharedMap` drops).
//!
//! Every call returns `std::io::Result`: the OS error of a failed system call, or
//! `ErrorKind::Unsupported` where the system lacks the facility. The room above treats any
//! error as "this fast path is off for this peer" (or as the loss of the peer once a message
//! depends on it), never as a panic; where `SUPPORTED` is false it makes no offer at all, so the
//! other calls are never reached.
//!
//! The kernel allows these calls between two processes only where it would allow `ptrace` of
//! one by the other (the same user, and Yama's `ptrace_scope` permitting) and a container's
//! seccomp profile may forbid them; the room proves they work with a nonce before it relies on
//! them.

pub(in crate::progress::same_host) mod cross_memory;
pub(in crate::progress::same_host) mod shared_memory;
