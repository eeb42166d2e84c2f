//! The pre-warm thread (docs/c-api.md): while the engine is not busy, it brings the
//! historically hottest experts into the ring, so the first tokens of a
//! session find them resident.
//!
//! It takes experts hottest first (ties by ascending (layer, expert)), skips
//! resident ones, and issues one speculative-queue read at a time: it waits
//! for that read to land, then pauses 4 ms. It stops when the hottest
//! `budget` experts are all resident or in flight. `pause(true)` makes it
//! stop issuing; once that call returns, at most the one read already issued
//! may still start. `pause(false)` resumes it, and it re-warms what requests
//! have evicted since, within the same budget. Warming one expert never
//! evicts another of the warm set (it stops when only those are idle). It
//! never claims (so it never takes a read error meant for the engine), and it
//! is joined at close.
//!
//! A resume after a complete pass, with nothing evicted or taken offline
//! since and the same active slots, does nothing: the pass left every target
//! resident, and they still are (a target's count grows only when it is
//! claimed, which makes it resident; a pass whose read failed is not
//! complete). An engine that resumes it after every token of an all-hit
//! decode wakes a thread that goes straight back to sleep instead of ranking
//! the histogram each time.
//!
//! While the elastic ring is shrunk, the budget shrinks with it, the
//! engine's share of slots kept.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::Thread;
use std::time::Duration;

use crossbeam_utils::Backoff;

use super::slots::{Origin, Prefetched, Spare};
use super::Shared;

/// Pause between two pre-warm reads.
pub(crate) const PACE: Duration = Duration::from_millis(4);

/// The engine's side of the pre-warm thread.
pub(crate) struct Control {
    /// The engine is busy: issue nothing.
    paused: AtomicBool,
    /// The thread is between its last check of `paused` and the end of a
    /// prefetch call; `pause(true)` waits for this to clear.
    issuing: AtomicBool,
    /// Experts to keep warm (the hottest `budget`).
    pub(crate) budget: u32,
    thread: OnceLock<Thread>,
    /// Passes over the targets so far (for tests).
    passes: AtomicU64,
}

impl Control {
    pub(crate) fn new(budget: u32) -> Control {
        Control {
            paused: AtomicBool::new(false),
            issuing: AtomicBool::new(false),
            budget,
            thread: OnceLock::new(),
            passes: AtomicU64::new(0),
        }
    }

    pub(crate) fn set_thread(&self, t: Thread) {
        let _ = self.thread.set(t);
    }

    pub(crate) fn wake(&self) {
        if let Some(t) = self.thread.get() {
            t.unpark();
        }
    }

    /// `busy = true`: stop issuing reads; returns once no new pre-warm read
    /// can start other than one already issued. `false`: resume.
    pub(crate) fn pause(&self, busy: bool) {
        // SeqCst, with the SeqCst accesses in `issue`: either the thread sees
        // `paused` before it prefetches, or we see its `issuing` flag and wait
        // for that prefetch call to finish.
        self.paused.store(busy, Ordering::SeqCst);
        if busy {
            // The wait is for at most one prefetch call (no I/O): spin
            // briefly, then yield.
            let backoff = Backoff::new();
            while self.issuing.load(Ordering::SeqCst) {
                backoff.snooze();
            }
        } else {
            self.wake();
        }
    }

    pub(crate) fn paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }

    /// Passes over the targets the thread has made.
    pub(crate) fn passes(&self) -> u64 {
        self.passes.load(Ordering::Relaxed)
    }
}

/// What a complete pass left warm stays warm while these are unchanged:
/// experts evicted, experts taken offline, active slots.
fn epoch(shared: &Shared) -> (u64, u64, u32) {
    (
        shared.table.evictions(),
        shared.table.retired(),
        shared.elastic.active.load(Ordering::Relaxed),
    )
}

/// The thread's body. Returns at shutdown.
pub(crate) fn run(shared: Arc<Shared>) {
    let control = &shared.prewarm;
    let stopping = || shared.shutdown.load(Ordering::Acquire);
    // The epoch at the start of the last pass that went through every target.
    let mut warm_as_of = None;
    while !stopping() {
        if control.paused() {
            std::thread::park();
            continue;
        }
        let now = epoch(&shared);
        if warm_as_of != Some(now) {
            warm_as_of = warm_pass(&shared).then_some(now);
        }
        if stopping() {
            return;
        }
        // Done (or paused, or the ring is busy): sleep until resumed or
        // closed. A pass that was cut short by a full ring retries later.
        std::thread::park_timeout(Duration::from_millis(250));
    }
}

/// One pass over the hottest `budget` experts: true when it left all of
/// them resident, false when it was cut short (paused, closing, or a full
/// ring) or a target's read failed.
fn warm_pass(shared: &Shared) -> bool {
    let control = &shared.prewarm;
    control.passes.fetch_add(1, Ordering::Relaxed);
    // A histogram file may count ids the vault has no blob for (it is
    // untrusted input): only real experts are targets.
    let mut targets = shared.histogram.hottest_first();
    targets.retain(|&id| shared.vault.entry_by_id(id).is_some());
    // A ring the elastic monitor shrank keeps the engine's share of slots
    // (`slots − budget`) and warms fewer experts, so warming never fights
    // the engine for the slots memory pressure left.
    let slots = shared.table.slots();
    let active = shared.elastic.active.load(Ordering::Relaxed).min(slots);
    let reserve = slots.saturating_sub(control.budget);
    targets.truncate(active.saturating_sub(reserve).min(control.budget) as usize);
    // Warming one target must never evict another.
    let mut spare = vec![0u64; shared.histogram.len().div_ceil(64)];
    for &id in &targets {
        spare[id as usize / 64] |= 1 << (id % 64);
    }
    // A target whose read failed is not warm: the pass is not complete, so
    // the next resume tries it again (a claim that takes the error clears it
    // for a retry).
    let mut complete = true;
    for &id in &targets {
        if shared.shutdown.load(Ordering::Acquire) || control.paused() {
            return false;
        }
        if shared.table.present(id) {
            continue;
        }
        match issue(shared, id, &spare) {
            Some(Prefetched::Queued { .. }) => {
                shared.wake.one();
                // One read at a time: wait for it to land (or fail, or be
                // taken over), then pace.
                while shared.table.in_flight(id) {
                    if shared.shutdown.load(Ordering::Acquire) {
                        return false;
                    }
                    std::thread::park_timeout(Duration::from_millis(1));
                }
                complete &= shared.table.present(id);
                std::thread::park_timeout(PACE);
            }
            Some(Prefetched::RingFull) => {
                // Its reservation was dropped: a claim_wait may be waiting.
                shared.landed.notify();
                return false;
            }
            Some(Prefetched::Present) => {}
            Some(Prefetched::ErrorPending) => complete = false,
            None => return false, // paused
        }
    }
    complete
}

/// Prefetches `id` for pre-warm unless the engine paused us. None if paused.
fn issue(shared: &Shared, id: u32, spare: &[u64]) -> Option<Prefetched> {
    let control = &shared.prewarm;
    control.issuing.store(true, Ordering::SeqCst);
    if control.paused.load(Ordering::SeqCst) {
        control.issuing.store(false, Ordering::SeqCst);
        return None;
    }
    let r = shared.table.prefetch_sparing(
        id,
        Origin::Prewarm,
        Spare::Bits {
            base: 0,
            bits: spare,
        },
    );
    control.issuing.store(false, Ordering::SeqCst);
    Some(r)
}
