//! The atomics the lock-free code uses: `std`'s normally, loom's under
//! `--cfg loom`, so the queue and the slot state machine can be model-checked
//! unchanged.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
#[cfg(loom)]
pub(crate) use loom::sync::Arc;
#[cfg(loom)]
pub(crate) use loom::thread;
#[cfg(loom)]
pub(crate) use loom::hint::spin_loop;

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
#[cfg(not(loom))]
#[allow(unused_imports)]
pub(crate) use std::sync::Arc;
#[cfg(not(loom))]
#[allow(unused_imports)]
pub(crate) use std::thread;
#[cfg(not(loom))]
#[allow(unused_imports)]
pub(crate) use std::hint::spin_loop;
