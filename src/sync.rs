//! The atomics the lock-free code uses: `std`'s normally, loom's under
//! `--cfg loom`, so the queue and the slot state machine can be model-checked
//! unchanged; likewise the CAS retry backoff.

#[cfg(loom)]
pub(crate) use loom::cell::UnsafeCell;
#[cfg(loom)]
pub(crate) use loom::sync::atomic::{
    fence, AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering,
};
#[cfg(loom)]
pub(crate) use loom::sync::Arc;
#[cfg(loom)]
pub(crate) use loom::thread;

/// Exponential backoff for a lost compare-and-swap: crossbeam's, which
/// spins 1, 2, 4, … 64 times and never yields the thread.
#[cfg(not(loom))]
pub(crate) use crossbeam_utils::Backoff;

/// Under loom, a stand-in for crossbeam's `Backoff` whose `spin` is loom's
/// `spin_loop`, a yield point the model checker sees (crossbeam's own spins
/// on the CPU hint, which loom does not know).
#[cfg(loom)]
pub(crate) struct Backoff;

#[cfg(loom)]
impl Backoff {
    /// A fresh backoff.
    pub(crate) fn new() -> Self {
        Backoff
    }

    /// Lets the other modelled threads run before the retry.
    pub(crate) fn spin(&self) {
        loom::hint::spin_loop();
    }

    /// As `spin` (crossbeam's yields the thread after a few spins).
    pub(crate) fn snooze(&self) {
        loom::thread::yield_now();
    }
}
/// A number unique to the calling thread (threads are numbered in the
/// order they first ask), for spreading threads over shards.
#[cfg(not(loom))]
pub(crate) fn thread_index() -> usize {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    thread_local! {
        static INDEX: usize = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    INDEX.with(|i| *i)
}

/// Under loom, numbered per modelled execution, so every run of a model
/// picks the same shards.
#[cfg(loom)]
pub(crate) fn thread_index() -> usize {
    loom::lazy_static! {
        static ref NEXT: AtomicUsize = AtomicUsize::new(0);
    }
    loom::thread_local! {
        static INDEX: usize = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    INDEX.with(|i| *i)
}

#[cfg(not(loom))]
#[allow(unused_imports)]
pub(crate) use std::sync::atomic::{
    fence, AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering,
};
#[cfg(not(loom))]
#[allow(unused_imports)]
pub(crate) use std::sync::Arc;
#[cfg(not(loom))]
#[allow(unused_imports)]
pub(crate) use std::thread;

/// `std::cell::UnsafeCell` behind loom's closure API (`with` / `with_mut`), so
/// code written against loom's cell compiles unchanged without `--cfg loom`,
/// where loom checks every access for data races.
#[cfg(not(loom))]
#[allow(dead_code)]
#[derive(Debug, Default)]
#[repr(transparent)]
pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

#[cfg(not(loom))]
#[allow(dead_code)]
impl<T> UnsafeCell<T> {
    /// A cell holding `value`.
    pub(crate) const fn new(value: T) -> Self {
        UnsafeCell(std::cell::UnsafeCell::new(value))
    }

    /// Runs `f` with a shared pointer to the contents. The caller makes sure
    /// no one writes the contents while `f` reads them.
    #[inline]
    pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }

    /// Runs `f` with a mutable pointer to the contents. The caller makes sure
    /// no one else reads or writes the contents while `f` uses them.
    #[inline]
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}
