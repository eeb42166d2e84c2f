//! smoe streams Mixture-of-Experts expert weights from an SSD into a
//! pre-allocated ring of aligned memory slots, so an inference engine can run
//! a model far larger than RAM.
//!
//! Layers, from the bottom:
//! - [`vault`]: the on-disk format (`experts.smoe`), its validating reader and
//!   its streaming writer. Pure Rust, no platform calls.
//! - `sys`: every platform call (direct-I/O open, positional reads, aligned
//!   allocation, memory probes), one file for Linux and one for Apple.
//! - `streamer`: the ring, the slot state machine, the queues and the I/O
//!   workers. Knows nothing of C.
//! - `ffi`: the C API. Converts pointers and errors, catches panics; no logic.
//!
//! The contract (vault bytes, histogram file, C API) is `SPEC.md` in the
//! shared folder; the README lists what this crate adds to it.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

pub mod budget;
mod error;
#[cfg(not(loom))]
pub mod ffi;
pub mod json;
#[cfg(not(loom))]
pub mod pack;
pub mod popularity;
pub(crate) mod queue;
pub mod router;
pub mod streamer;
mod sync;
pub mod sys;
pub mod vault;

pub use error::{Error, ErrorKind, Result};
#[cfg(not(loom))]
pub use streamer::{Claim, Config, Priority, SlotInfo, Stats, Streamer};
pub use sys::DirectIo;

/// Internals re-exported for the benchmarks only; not part of the API.
#[doc(hidden)]
pub mod __bench {
    pub use crate::queue::Queue;
}
