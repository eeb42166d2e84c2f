//! The streamer (docs/c-api.md): a ring of aligned slots, the slot table that
//! governs them, and the I/O workers that fill them from the vault.
//!
//! [`Streamer::prefetch`] and [`Streamer::claim`] run in the caller's thread
//! and only touch atomics (see `slots`); reads happen on the worker threads.
//! Nothing here knows about C: the `ffi` module wraps this API.
//!
//! One concept a file:
//!
//! - `handle`: the [`Streamer`] and what its threads share (`Shared`, the
//!   counters), its accessors and stats.
//! - `open`: opening (the config resolved into a ring, descriptors, a
//!   histogram; the threads started) and stopping at drop.
//! - `claims`: one expert at a time: prefetch, claim, wait, release; the
//!   [`Claim`] guard and its [`SlotInfo`].
//! - `sets`: a layer's working set: `prefetch_set` (which settles the
//!   layer's bets) and `claim_any`.
//! - `slots` (the slot table), `ring` (the slots' memory), `worker` (the I/O
//!   workers), `prewarm`, `elastic` (populate and the elastic ring),
//!   `predict` (the bets on a layer's routing), `drive` (the engine's busy
//!   time and the drive's idle time).
//!
//! Only `slots` and `ring` are built under `--cfg loom`.

#[cfg(not(loom))]
mod claims;
#[cfg(not(loom))]
mod drive;
#[cfg(not(loom))]
pub(crate) mod elastic;
#[cfg(not(loom))]
mod handle;
#[cfg(not(loom))]
mod open;
#[cfg(not(loom))]
mod predict;
#[cfg(not(loom))]
mod prewarm;
mod ring;
#[cfg(not(loom))]
mod sets;
pub(crate) mod slots;
#[cfg(not(loom))]
mod worker;

#[cfg(not(loom))]
pub use crate::config::DEFAULT_TRACE_CAPACITY;
pub use crate::config::{Config, Policy, Populate, Stats};
#[cfg(not(loom))]
pub use claims::{Claim, Priority, SlotInfo};
#[cfg(not(loom))]
pub(crate) use handle::Shared;
#[cfg(not(loom))]
pub use handle::Streamer;
#[cfg(not(loom))]
pub use open::{DEFAULT_WORKERS, MAX_WORKERS};
#[cfg(not(loom))]
#[doc(hidden)]
pub use worker::{BlobReader, FileReader};
