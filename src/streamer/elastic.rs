//! The elastic ring (docs/c-api.md, "Elastic ring"): a monitor thread that
//! samples memory pressure every [`INTERVAL`] and decides how many slots
//! may hold data, and the background pre-faulting of `populate`.
//!
//! The decision is [`decide`], a pure function of one
//! [`MemoryPressure`] sample and the ring's shape, tested with fixed
//! samples. It looks at *headroom*: memory that may still be committed
//! before pressure, which `sys` computes from non-reclaimable use (a
//! cgroup's usage minus its file cache) and the system's available memory,
//! never from raw usage, since page cache counts in a cgroup's usage and is
//! given back on demand.
//!
//! - Headroom under the low watermark (or the OS says memory is critical):
//!   shrink, taking idle slots offline (the slot table's
//!   `retire_idle_slot`, in eviction order) and releasing their pages, until
//!   the headroom would be back at the high watermark.
//! - Headroom above the high watermark by at least a slot, and no memory
//!   stall: grow, giving back as many offline slots as fit above the high
//!   watermark, so that filling them does not shrink the ring again.
//!
//! It never touches a claimed or loading slot (the slot table refuses), never
//! waits for one (a slot it cannot retire now is retried at the next
//! sample), and keeps at least [`MIN_ACTIVE_SLOTS`] slots (or the whole ring
//! if smaller). Between samples the thread sleeps (`park_timeout`), so an
//! idle streamer pays a few small file reads every [`INTERVAL`]
//! ([`FAST_INTERVAL`] while the headroom is under the high watermark).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::slots::OFFLINE;
use super::Shared;
use crate::sys::{MemoryPressure, PressureProbe};

/// Time between two samples of memory pressure.
pub(crate) const INTERVAL: Duration = Duration::from_millis(200);
/// Time between two samples while the headroom is under the high
/// watermark: a neighbour's allocations are met sooner, and only while
/// memory is short does the monitor cost more.
pub(crate) const FAST_INTERVAL: Duration = Duration::from_millis(50);
/// The elastic ring never goes below this many slots (or the ring's size).
pub const MIN_ACTIVE_SLOTS: u32 = 8;
/// A memory stall (`some avg10`, percent) at or above this blocks growth.
pub(crate) const STALL_BLOCKS_GROWTH: f64 = 10.0;

const MIB: u64 = 1 << 20;
/// Bytes committed by one populate call (a multiple of every page size).
const POPULATE_CHUNK: usize = 4 << 20;

/// The low and high watermarks of headroom for a memory limit: low is
/// `limit / 16` within 32 MiB..=1 GiB, high twice that.
pub fn watermarks(limit_bytes: u64) -> (u64, u64) {
    let low = (limit_bytes / 16).clamp(32 * MIB, 1024 * MIB);
    (low, 2 * low)
}

/// What the monitor does after a sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Take this many idle slots offline.
    Shrink(u32),
    /// Give this many offline slots back.
    Grow(u32),
    /// Nothing.
    Hold,
}

/// The step for one sample, for a ring of `slots` slots of `slot_bytes` of
/// which `offline` are offline. Pure; see the module doc.
pub(crate) fn decide(sample: &MemoryPressure, slots: u32, offline: u32, slot_bytes: u64) -> Step {
    let slot_bytes = slot_bytes.max(1);
    let (low, high) = watermarks(sample.limit_bytes);
    let active = slots.saturating_sub(offline);
    let floor = slots.min(MIN_ACTIVE_SLOTS);
    let headroom = sample.headroom_bytes;
    if headroom < low || sample.critical {
        let wanted = (high.saturating_sub(headroom))
            .div_ceil(slot_bytes)
            .max(1)
            // Critical with headroom left: an eighth of the ring.
            .max(if sample.critical {
                u64::from(active.div_ceil(8))
            } else {
                0
            });
        let room = active.saturating_sub(floor);
        let n = wanted.min(u64::from(room)) as u32;
        return if n > 0 { Step::Shrink(n) } else { Step::Hold };
    }
    let stalled = sample
        .stall_percent
        .is_some_and(|s| s >= STALL_BLOCKS_GROWTH);
    if offline > 0 && !stalled {
        let fit = headroom.saturating_sub(high) / slot_bytes;
        let n = fit.min(u64::from(offline)) as u32;
        if n > 0 {
            return Step::Grow(n);
        }
    }
    Step::Hold
}

/// The elastic ring's state the streamer reads for its stats.
#[derive(Debug)]
pub(crate) struct ElasticState {
    /// Slots that may hold data now.
    pub(crate) active: AtomicU32,
    pub(crate) shrinks: AtomicU64,
    pub(crate) grows: AtomicU64,
}

impl ElasticState {
    pub(crate) fn new(slots: u32) -> ElasticState {
        ElasticState {
            active: AtomicU32::new(slots),
            shrinks: AtomicU64::new(0),
            grows: AtomicU64::new(0),
        }
    }
}

/// Pre-faults the ring slot by slot, stopping early if headroom falls under
/// the high watermark or the streamer shuts down: `threads` threads share
/// the slots (each takes the next one not yet taken).
pub(crate) fn populate(shared: &Shared, probe: Option<&PressureProbe>, threads: usize) {
    let table = &shared.table;
    let slots = table.slots();
    let slot_bytes = shared.slot_bytes as usize;
    // Acquire: pairs with the Release store of `shutdown` in `stop`.
    let stopping = || shared.shutdown.load(Ordering::Acquire);
    let next = AtomicU32::new(0);
    let full = std::sync::atomic::AtomicBool::new(false);
    let one = || loop {
        if stopping() || full.load(Ordering::Relaxed) {
            return;
        }
        let slot = next.fetch_add(1, Ordering::Relaxed);
        if slot >= slots {
            return;
        }
        if let Some(p) = probe {
            if p.sample()
                .is_ok_and(|s| s.headroom_bytes < watermarks(s.limit_bytes).1)
            {
                full.store(true, Ordering::Relaxed);
                return;
            }
        }
        // Populating never changes the bytes, so it is safe whatever
        // state the slot is in; an OFFLINE one is skipped (no elastic
        // step runs before this ends, so none is).
        if table.word(slot).state() != OFFLINE {
            // In pieces of POPULATE_CHUNK, so a close waits for one
            // piece at most (committing is slow where memory is
            // virtualised: about 0.4 GB/s on the development VM).
            let start = slot as usize * slot_bytes;
            let mut done = 0;
            while done < slot_bytes && !stopping() {
                let len = POPULATE_CHUNK.min(slot_bytes - done);
                // A refusal only means the first load commits those
                // pages. Only pages known to be committed settle the
                // ring's promise: advice (an old kernel's fallback,
                // Apple) keeps it until close, as those pages come
                // later, where the memory probe cannot foresee them.
                if let Ok(true) = shared.ring.reservation().populate(start + done, len) {
                    shared.promise.settle(len as u64);
                }
                done += len;
            }
        }
    };
    if threads <= 1 {
        one();
    } else {
        std::thread::scope(|s| {
            for _ in 1..threads {
                // A thread the OS refuses leaves its share to the others.
                let _ = std::thread::Builder::new()
                    .name("smoe-populate".into())
                    .spawn_scoped(s, one);
            }
            one();
        });
    }
}

/// The memory thread: pre-faults the ring when `populate` ([`populate`]),
/// then, with a `probe`, runs the elastic monitor until shutdown.
pub(crate) fn run(shared: Arc<Shared>, populate: bool, probe: Option<PressureProbe>) {
    let table = &shared.table;
    let slots = table.slots();
    let slot_bytes = shared.slot_bytes as usize;
    // Acquire: pairs with the Release store of `shutdown` in `stop`.
    let stopping = || shared.shutdown.load(Ordering::Acquire);
    if populate {
        self::populate(&shared, probe.as_ref(), 1);
    }
    let Some(probe) = probe else {
        return;
    };
    // Only this thread retires or restores slots, so it keeps the list.
    let mut offline: Vec<u32> = Vec::new();
    let state = &shared.elastic;
    // The first sample at once: a ring opened under pressure shrinks
    // before the engine's first batch, not a whole interval later.
    let mut interval = Duration::ZERO;
    loop {
        if !interval.is_zero() {
            std::thread::park_timeout(interval);
        }
        if stopping() {
            return;
        }
        let Ok(sample) = probe.sample() else {
            interval = INTERVAL;
            continue;
        };
        interval = if sample.headroom_bytes < watermarks(sample.limit_bytes).1 {
            FAST_INTERVAL
        } else {
            INTERVAL
        };
        match decide(&sample, slots, offline.len() as u32, shared.slot_bytes) {
            Step::Shrink(n) => {
                let before = offline.len();
                for _ in 0..n {
                    let Some(slot) = table.retire_idle_slot() else {
                        break; // every other slot is claimed or loading
                    };
                    // The slot is OFFLINE: no one reads or writes it. A
                    // failed discard only leaves its pages committed.
                    let _ = shared
                        .ring
                        .reservation()
                        .discard(slot as usize * slot_bytes, slot_bytes);
                    offline.push(slot);
                }
                if offline.len() > before {
                    // A slot seized for retirement counted as loading when a
                    // full ring's dropped reservation looked: wake the
                    // waiters it did not (`dropped_reservation`).
                    shared.landed.notify();
                    state.shrinks.fetch_add(1, Ordering::Relaxed);
                }
            }
            Step::Grow(n) => {
                for _ in 0..n {
                    let Some(slot) = offline.pop() else { break };
                    let restored = table.restore_slot(slot);
                    debug_assert!(restored, "slot {slot} was not offline");
                }
                state.grows.fetch_add(1, Ordering::Relaxed);
            }
            Step::Hold => continue,
        }
        state
            .active
            .store(slots - offline.len() as u32, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn sample(headroom_bytes: u64, limit_bytes: u64) -> MemoryPressure {
        MemoryPressure {
            headroom_bytes,
            limit_bytes,
            stall_percent: None,
            critical: false,
            source: "test".to_owned(),
        }
    }

    #[test]
    fn watermarks_scale_with_the_limit() {
        assert_eq!(watermarks(GIB), (64 * MIB, 128 * MIB));
        assert_eq!(watermarks(3 * GIB), (192 * MIB, 384 * MIB));
        assert_eq!(watermarks(64 * GIB), (GIB, 2 * GIB));
        assert_eq!(watermarks(0), (32 * MIB, 64 * MIB));
    }

    #[test]
    fn shrinks_back_to_the_high_watermark() {
        // 3 GiB cgroup: low 192 MiB, high 384 MiB; 12 MiB slots.
        let s = sample(100 * MIB, 3 * GIB);
        assert_eq!(decide(&s, 200, 0, 12 * MIB), Step::Shrink(24)); // 284 MiB / 12
        assert_eq!(
            decide(&s, 200, 190, 12 * MIB),
            Step::Shrink(2),
            "floor of 8"
        );
        assert_eq!(decide(&s, 200, 192, 12 * MIB), Step::Hold);
        assert_eq!(
            decide(&s, 4, 0, 12 * MIB),
            Step::Hold,
            "a ring under the floor"
        );
        assert_eq!(
            decide(&sample(0, 3 * GIB), 200, 0, 12 * MIB),
            Step::Shrink(32)
        );
    }

    #[test]
    fn grows_only_what_fits_above_the_high_watermark() {
        let mid = sample(300 * MIB, 3 * GIB);
        assert_eq!(
            decide(&mid, 200, 50, 12 * MIB),
            Step::Hold,
            "between the marks"
        );
        let some = sample(384 * MIB + 36 * MIB + 5, 3 * GIB);
        assert_eq!(decide(&some, 200, 50, 12 * MIB), Step::Grow(3));
        let lots = sample(2 * GIB, 3 * GIB);
        assert_eq!(decide(&lots, 200, 50, 12 * MIB), Step::Grow(50));
        assert_eq!(
            decide(&lots, 200, 0, 12 * MIB),
            Step::Hold,
            "nothing offline"
        );
        let stalled = MemoryPressure {
            stall_percent: Some(STALL_BLOCKS_GROWTH),
            ..lots.clone()
        };
        assert_eq!(decide(&stalled, 200, 50, 12 * MIB), Step::Hold);
    }

    #[test]
    fn critical_sheds_an_eighth_even_with_headroom() {
        let s = MemoryPressure {
            critical: true,
            ..sample(8 * GIB, 48 * GIB)
        };
        assert_eq!(decide(&s, 1000, 0, 10 * MIB), Step::Shrink(125));
        assert_eq!(decide(&s, 1000, 992, 10 * MIB), Step::Hold);
    }

    #[test]
    fn odd_inputs_do_not_panic() {
        for (h, l) in [(0, 0), (u64::MAX, u64::MAX), (u64::MAX, 0), (0, u64::MAX)] {
            for slot in [0, 1, u64::MAX] {
                let _ = decide(&sample(h, l), u32::MAX, u32::MAX, slot);
                let _ = decide(&sample(h, l), 0, 5, slot);
            }
        }
    }
}
