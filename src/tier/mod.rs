//! The device tier's rule (issue 50; docs/cuda.md, "A VRAM tier"): which
//! experts a host keeps in device slots (VRAM), filled by copies from
//! claimed ring slots, and which it leaves to the CPU.
//!
//! The rule knows nothing of a device: a slot is an index into memory the
//! host owns, and a copy is something the host queues and later reports.
//! One decode step goes:
//!
//! 1. [`DeviceTier::lookup`] for each expert the step uses: a slot whose
//!    copy has completed is a hit, held until [`DeviceTier::step_done`] so
//!    that no promotion overwrites it while the step's graph reads it;
//!    anything else is computed from the ring, as without the tier.
//! 2. [`DeviceTier::admit`] for each expert computed from the ring: a
//!    [`Promotion`] names the device slot to copy it into (and the expert
//!    it replaces). The host keeps the source ring slot claimed until the
//!    copy is done, then calls [`DeviceTier::loaded`] (or
//!    [`DeviceTier::failed`]: the slot is empty again, nothing left
//!    loading).
//! 3. [`DeviceTier::step_done`] once the step's graph has finished.
//!
//! Admission: an expert earns a slot. Every use is counted; an empty slot
//! takes any expert, and a full tier admits an expert only when it has been
//! used at least twice (since its count last halved) and more often than
//! the expert it would evict (the ready, unheld slot with the fewest uses,
//! the least recently used of those), so an expert used once stays on the
//! CPU: copying it to compute it once costs more than computing it where it
//! is. Counts halve every `HALVE_AFTER_SLOTS` uses per slot, so that the
//! tier follows a working set that moves.

use std::collections::HashMap;
use std::fmt;

/// Counts halve after this many uses per device slot.
const HALVE_AFTER_SLOTS: u64 = 64;

/// The uses an expert needs before it may evict another: one use never
/// pays for a copy (a count halved to 0 must not let a one-off in).
const MIN_USES_TO_EVICT: u64 = 2;

/// What a device slot holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Nothing: the next admission takes it.
    Empty,
    /// A copy in flight: never a hit, never a victim.
    Loading,
    /// The expert's bytes, ready to compute from.
    Ready,
}

#[derive(Clone, Copy, Debug)]
struct Slot {
    state: State,
    /// The expert loading or ready (meaningless when empty).
    expert: u32,
    /// Looked up in the step in progress: not a victim until `step_done`.
    held: bool,
    /// A hit since it was loaded (else an eviction counts a promotion
    /// never used).
    used: bool,
    /// The use tick of its last hit or its admission (the tie-break).
    last: u64,
}

/// A copy the host is to make: the expert's bytes from its claimed ring
/// slot into device slot `slot`, then [`DeviceTier::loaded`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Promotion {
    /// The device slot to fill.
    pub slot: u32,
    /// The expert to copy into it.
    pub expert: u32,
    /// The expert the slot held, now gone from the device (None: the slot
    /// was empty).
    pub evicted: Option<u32>,
}

/// The tier's counters since it was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TierStats {
    /// Experts looked up (every use of a decode step).
    pub lookups: u64,
    /// Lookups that found the expert ready in a device slot.
    pub hits: u64,
    /// Promotions handed out.
    pub promotions: u64,
    /// Promotions whose copy failed ([`DeviceTier::failed`]).
    pub failed: u64,
    /// Ready experts evicted without a single hit since they were loaded:
    /// copies that bought nothing.
    pub never_used: u64,
    /// Ready experts evicted.
    pub evictions: u64,
    /// Bytes the host reported copied ([`DeviceTier::loaded`]).
    pub bytes_copied: u64,
}

/// A call that does not fit the slot's state: the host's bookkeeping and
/// the tier's disagree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TierError {
    /// The slot index is not below the tier's slot count.
    NoSuchSlot {
        /// The index given.
        slot: u32,
        /// The tier's slots.
        slots: u32,
    },
    /// `loaded` or `failed` for a slot with no copy in flight.
    NotLoading {
        /// The index given.
        slot: u32,
    },
}

impl fmt::Display for TierError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            TierError::NoSuchSlot { slot, slots } => {
                write!(
                    f,
                    "device slot {slot} does not exist (the tier has {slots})"
                )
            }
            TierError::NotLoading { slot } => {
                write!(f, "device slot {slot} has no copy in flight")
            }
        }
    }
}

impl std::error::Error for TierError {}

/// The device tier's bookkeeping: see the module's documentation.
#[derive(Debug)]
pub struct DeviceTier {
    slots: Vec<Slot>,
    /// Expert → its slot (loading or ready).
    at: HashMap<u32, u32>,
    /// Expert → uses counted (halved now and then).
    counts: HashMap<u32, u64>,
    /// Uses counted since the counts last halved.
    since_halving: u64,
    /// Uses counted in all (the recency ticks).
    tick: u64,
    stats: TierStats,
}

impl DeviceTier {
    /// A tier of `slots` device slots, all empty. Zero slots is a tier
    /// that never promotes: every use is computed from the ring.
    pub fn new(slots: u32) -> DeviceTier {
        DeviceTier {
            slots: vec![
                Slot {
                    state: State::Empty,
                    expert: 0,
                    held: false,
                    used: false,
                    last: 0,
                };
                slots as usize
            ],
            at: HashMap::new(),
            counts: HashMap::new(),
            since_halving: 0,
            tick: 0,
            stats: TierStats::default(),
        }
    }

    /// Device slots.
    pub fn slots(&self) -> u32 {
        self.slots.len() as u32
    }

    /// The counters.
    pub fn stats(&self) -> TierStats {
        self.stats
    }

    /// A use of `expert` in the step in progress: its device slot when its
    /// copy has completed (a hit, held until [`step_done`](Self::step_done)),
    /// else None (compute it from the ring). Counted for admission either
    /// way.
    pub fn lookup(&mut self, expert: u32) -> Option<u32> {
        self.count(expert);
        self.stats.lookups += 1;
        let &slot = self.at.get(&expert)?;
        let s = &mut self.slots[slot as usize];
        if s.state != State::Ready {
            return None;
        }
        s.held = true;
        s.used = true;
        s.last = self.tick;
        self.stats.hits += 1;
        Some(slot)
    }

    /// Whether `expert`, just computed from the ring, earns a device slot:
    /// a promotion to carry out, or None (already there or loading, no
    /// slot free of the step, used once only, or its count does not beat
    /// the victim's). O(slots) when the tier is full.
    pub fn admit(&mut self, expert: u32) -> Option<Promotion> {
        if self.at.contains_key(&expert) {
            return None;
        }
        let slot = match self.slots.iter().position(|s| s.state == State::Empty) {
            Some(free) => free,
            None => {
                let count = self.count_of(expert);
                if count < MIN_USES_TO_EVICT {
                    return None;
                }
                let victim = self.victim()?;
                if count <= self.count_of(self.slots[victim].expert) {
                    return None;
                }
                victim
            }
        };
        let s = &mut self.slots[slot];
        let evicted = (s.state == State::Ready).then_some(s.expert);
        if let Some(old) = evicted {
            self.at.remove(&old);
            self.stats.evictions += 1;
            if !s.used {
                self.stats.never_used += 1;
            }
        }
        *s = Slot {
            state: State::Loading,
            expert,
            held: false,
            used: false,
            last: self.tick,
        };
        self.at.insert(expert, slot as u32);
        self.stats.promotions += 1;
        Some(Promotion {
            slot: slot as u32,
            expert,
            evicted,
        })
    }

    /// The host's copy into `slot` has completed (`bytes` copied): the
    /// expert is ready from the next lookup on.
    pub fn loaded(&mut self, slot: u32, bytes: u64) -> Result<(), TierError> {
        let s = self.loading(slot)?;
        s.state = State::Ready;
        self.stats.bytes_copied = self.stats.bytes_copied.saturating_add(bytes);
        Ok(())
    }

    /// The host's copy into `slot` failed or was abandoned: the slot is
    /// empty again, and its expert will be computed from the ring.
    pub fn failed(&mut self, slot: u32) -> Result<(), TierError> {
        let s = self.loading(slot)?;
        s.state = State::Empty;
        let expert = s.expert;
        self.at.remove(&expert);
        self.stats.failed += 1;
        Ok(())
    }

    /// The step's graph has finished: the slots it read may be evicted.
    pub fn step_done(&mut self) {
        for s in &mut self.slots {
            s.held = false;
        }
    }

    /// Where `expert` stands: its slot and whether its copy has completed.
    pub fn slot_of(&self, expert: u32) -> Option<(u32, bool)> {
        let &slot = self.at.get(&expert)?;
        Some((slot, self.slots[slot as usize].state == State::Ready))
    }

    fn loading(&mut self, slot: u32) -> Result<&mut Slot, TierError> {
        let slots = self.slots.len() as u32;
        let s = self
            .slots
            .get_mut(slot as usize)
            .ok_or(TierError::NoSuchSlot { slot, slots })?;
        if s.state != State::Loading {
            return Err(TierError::NotLoading { slot });
        }
        Ok(s)
    }

    /// The ready, unheld slot with the fewest uses, the least recently used
    /// of those; None when every slot is loading or held.
    fn victim(&self) -> Option<usize> {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.state == State::Ready && !s.held)
            .min_by_key(|(_, s)| (self.count_of(s.expert), s.last))
            .map(|(i, _)| i)
    }

    fn count_of(&self, expert: u32) -> u64 {
        self.counts.get(&expert).copied().unwrap_or(0)
    }

    fn count(&mut self, expert: u32) {
        self.tick += 1;
        *self.counts.entry(expert).or_insert(0) += 1;
        self.since_halving += 1;
        if self.since_halving >= HALVE_AFTER_SLOTS * (self.slots.len() as u64).max(1) {
            self.since_halving = 0;
            self.counts.retain(|_, c| {
                *c /= 2;
                *c > 0
            });
        }
    }
}

#[cfg(test)]
mod tests;
