//! The slot table: every slot's state word, the identity map (dense expert id
//! → slot), the recency stamps and the two read queues. This is the
//! lock-free heart of the streamer; it owns no memory and does no I/O, so
//! loom can check it whole (`loom.rs`).
//!
//! It must never block, allocate or take a lock on the prefetch, claim and
//! release paths, and never hand out a slot whose refcount it has not raised.
//!
//! The table's rooms, one concept each:
//!
//! - `word.rs`: the state word's bit layout, its legal transitions and the
//!   ticket encoding; [`Word`] is the only reader of its bits.
//! - `victim.rs`: which idle slot a take evicts (LRU and adaptive scan and
//!   rank), and the recency and claim hints it reads.
//! - `pins.rs`: shared mode, where claims of a contended slot pin it in
//!   per-thread counters, and the seize that reads them.
//! - this file: the table and its transitions (take, claim, release, the
//!   workers' begin and finish, retire and restore) over the identity map.
//! - `tests.rs`, `loom.rs`: the unit tests of the transitions (each room
//!   has its own) and the loom models.
//!
//! # The identity map
//!
//! `map[id]` is a hint: NONE, RESERVED (a thread is choosing a slot for `id`;
//! everyone else treats `id` as in flight), or the ticket (slot, generation)
//! of the load taken for `id`. The state word is the truth: a map entry
//! naming a slot whose word has another generation (or is EMPTY) is stale
//! and is cleared by whoever sees it. Only the thread that
//! moved the map entry from NONE to RESERVED may store a slot index into it, so
//! an expert never has two slots and is never read twice at once.
//!
//! # Retirement
//!
//! OFFLINE is the elastic ring's: the memory monitor retires an idle slot
//! (chosen by the same victim function as eviction) when memory is short,
//! releases its pages, and restores it when the pressure ends. Retiring is a
//! take with no new load: the generation is bumped (outstanding tickets and
//! map entries of the old load become stale) and the old id's map entry is
//! cleared. No path but `restore_slot` leaves OFFLINE: the eviction scan
//! and the fresh-slot path take only EMPTY/READY/CONSUMED words, so an
//! OFFLINE slot is invisible to prefetch and claim, exactly as if the ring
//! were smaller.

use crossbeam_utils::CachePadded;

use crate::queue::Queue;
use crate::sync::{AtomicU32, AtomicU64, AtomicU8, Backoff, Ordering};

mod pins;
mod victim;
mod word;

#[cfg(loom)]
mod loom;
#[cfg(all(test, not(loom)))]
mod tests;

use crate::config::Policy;
pub(crate) use pins::MAX_PINS;
pub(crate) use victim::{Shape, Spare};
pub(crate) use word::{split_ticket, Origin, CONSUMED, MAX_REFS, MAX_SLOTS, OFFLINE, READY};

use pins::{Pinned, Pins, Seized, Skip};
use word::{next_generation, pin_shard_of, ticket, AtomicWord, Word};
use word::{EMPTY, EVICTING, GEN_MAX, QUEUED, READING};

/// A speculative or pre-warm read begins only while fewer demand reads than
/// this are in progress (`next_job`).
const BETS_WHILE_DEMAND_READS_BELOW: u32 = 1;

/// `map` entry: no slot.
const NONE: u64 = u64::MAX;
/// `map` entry: a prefetch is choosing a slot for this id.
const RESERVED: u64 = u64::MAX - 1;

/// A read a worker must do: load `id` into `slot` for generation `generation`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ReadJob {
    pub(crate) slot: u32,
    pub(crate) generation: u64,
    pub(crate) id: u32,
    /// Who the read is for (which `reads_*` counter it counts in).
    pub(crate) origin: Origin,
}

/// The answer to a prefetch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Prefetched {
    /// A read was queued into `slot`; `evicted` says whether the slot held
    /// another expert.
    Queued { slot: u32, evicted: bool },
    /// Already resident or in flight: nothing to do.
    Present,
    /// A read failed and its error waits for the next claim.
    ErrorPending,
    /// Every slot is claimed or loading.
    RingFull,
}

/// The answer to a claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Claimed {
    /// The slot is the caller's until it releases `ticket`.
    Ready { slot: u32, ticket: u64, hit: bool },
    /// Loading; `queued` when this claim queued the read (so a worker must
    /// be woken).
    Pending { queued: bool },
    /// The last read of this expert failed; the error is now forgotten.
    Failed,
    /// Every slot is claimed or loading, so no read could be queued.
    RingFull,
    /// The slot already holds `MAX_REFS` claims.
    TooManyClaims,
    /// Neither resident nor in flight, and nothing was queued
    /// ([`SlotTable::claim_present`]).
    Absent,
}

/// What one pass of [`SlotTable::claim_set`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SetClaim {
    /// The claim of member `member`: Ready, or its read's failure
    /// (Failed), or TooManyClaims.
    Member { member: usize, claimed: Claimed },
    /// Nothing to claim yet: a member is loading, or another expert whose
    /// slot a member can take once it lands.
    Wait,
    /// No member is resident or in flight and every active slot is held.
    Full,
}

/// [`SlotTable::claim_set`]'s answer, with what it queued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SetPass {
    pub(crate) found: SetClaim,
    /// Reads queued by this pass (workers to wake).
    pub(crate) queued: u32,
    /// A take found the ring full (a waiting claim of the member may need
    /// to look again).
    pub(crate) ring_full: bool,
}

/// What [`SlotTable::occupancy`] counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Occupancy {
    /// Slots a claim holds (refcount or pins above 0).
    pub(crate) held: u32,
    /// Slots queued for a read, being read, or being seized by an evictor.
    pub(crate) loading: u32,
}

/// Why a release was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Stale;

/// Work items in the queues: a ticket (slot + generation).
type Item = u64;

/// One slot's shared state, alone on its cache line: the state word, the
/// tick and the ids that eviction reads together, so a scan reads one line
/// per slot and claims of different slots on different cores never write the
/// same line.
#[repr(align(64))]
struct Cell {
    /// The state word; layout in `word.rs`.
    word: AtomicWord,
    /// When the slot was last taken, loaded, claimed or asked for again: the
    /// recency order, `tick << SEQ_BITS | seq` (`victim::next_stamp`), where
    /// `tick` is the load clock (how many loads ago: the never-claimed
    /// slot's turnover bound, the adaptive policy's visits). Only a hint for
    /// choosing a victim; correctness never depends on it.
    stamp: AtomicU64,
    /// The dense id of the slot's current (or last) load. Written only by
    /// the thread whose take moved the slot to QUEUED, before it publishes
    /// the load's ticket (map store, queue push, both Release), so a worker
    /// that popped the ticket reads the right id; eviction reads it to clear
    /// the old id's map entry, with a compare-exchange on that exact ticket,
    /// so a stale read there changes nothing.
    id: AtomicU32,
    /// The layer index of `id` (`id / experts_per_layer`), written with it:
    /// the adaptive policy reads it for every candidate, without a division.
    layer: AtomicU32,
    /// Adaptive policy: the claims of the expert `id` so far, counting those
    /// of its earlier loads ([`SlotTable::claims`]). Written by claims
    /// with a plain load and store (a lost increment only blurs a hint);
    /// on this line, which the claim's compare-exchange owns already.
    count: AtomicU32,
    /// The bytes the worker read for the current load, stored before its
    /// READY (Relaxed: that Release publishes it with the slot's bytes);
    /// the load's first claim adds it to `speculative_claimed_bytes` when
    /// the load was a bet (a statistic).
    bytes: AtomicU64,
}

impl Cell {
    fn new(generation: u64) -> Cell {
        Cell {
            word: AtomicWord::new(Word::empty(generation)),
            stamp: AtomicU64::new(0),
            id: AtomicU32::new(0),
            layer: AtomicU32::new(0),
            count: AtomicU32::new(0),
            bytes: AtomicU64::new(0),
        }
    }
}

/// See the module doc.
pub(crate) struct SlotTable {
    /// One cell per slot, each on its own cache line.
    cells: Box<[Cell]>,
    /// Dense id → `ticket(slot, generation)` of the load that holds it,
    /// RESERVED or NONE (a hint; see the module doc). The generation makes
    /// every clearing compare-exchange exact: an entry for a later load of
    /// the same slot is never cleared by a thread that saw an earlier one.
    map: Box<[AtomicU64]>,
    /// Per dense id: 1 when its last read failed and no claim has reported
    /// it yet.
    failed: Box<[AtomicU8]>,
    /// The load clock: advanced once per load taken (a miss), read with a
    /// plain load everywhere else, so a hit writes no shared line.
    clock: CachePadded<AtomicU64>,
    /// Slots below this index have been handed out at least once; above it
    /// are fresh EMPTY slots, taken without a scan.
    fresh: CachePadded<AtomicU32>,
    demand: Queue<Item>,
    speculative: Queue<Item>,
    /// Reads begun as demand and not finished: while any is, no speculative
    /// read begins (`next_job`), so a bet never shares the drive with a read
    /// the engine waits for.
    demand_reading: CachePadded<AtomicU32>,
    /// Loads that replaced another expert (a statistic).
    evictions: CachePadded<AtomicU64>,
    /// Evictions of loads no claim ever took (READY): reads wasted, most
    /// often speculation that did not come true (a statistic).
    evicted_unclaimed: CachePadded<AtomicU64>,
    /// Bytes of speculative loads (neither demand nor pre-warm when they
    /// landed) whose first claim has come: the rest of the speculative
    /// bytes read were never claimed (a statistic).
    speculative_claimed_bytes: CachePadded<AtomicU64>,
    /// Loaded experts the elastic ring took offline with their slot (the
    /// pre-warm thread's cue, with `evictions`, that something left the
    /// ring).
    retired: CachePadded<AtomicU64>,
    shape: Shape,
    /// Adaptive policy: per layer, the load clock when the engine last
    /// started loading that layer's experts (a load of that layer right
    /// after a load of another one). Written on loads only.
    visit_start: Box<[AtomicU64]>,
    /// Adaptive policy: the layer of the last load.
    last_layer: CachePadded<AtomicU32>,
    /// Adaptive policy, per dense id: its claims during its earlier loads,
    /// saved from the slot's count when the slot is reused. Written and read
    /// on loads only. Empty under LRU.
    claims: Box<[AtomicU32]>,
    /// Shared mode: the pin counters, one row per shard of threads
    /// (`pins.rs`).
    pins: Pins,
}

// Construction and reading.
impl SlotTable {
    /// A table of `slots` EMPTY slots for `ids` dense expert ids, LRU.
    pub(crate) fn new(slots: u32, ids: u32) -> SlotTable {
        Self::with_first_generation(slots, ids, 0)
    }

    /// A table with an eviction policy and the vault's shape.
    pub(crate) fn with_shape(slots: u32, ids: u32, shape: Shape) -> SlotTable {
        assert!(shape.experts_per_layer > 0 && shape.layers > 0);
        SlotTable {
            shape,
            visit_start: (0..shape.layers).map(|_| AtomicU64::new(0)).collect(),
            claims: match shape.policy {
                Policy::Lru => Box::new([]),
                Policy::Adaptive => (0..ids).map(|_| AtomicU32::new(0)).collect(),
            },
            ..Self::new(slots, ids)
        }
    }

    /// A table whose slots start at `generation` instead of 0, so tests
    /// reach the generation's wrap point without 2^43 loads.
    pub(crate) fn with_first_generation(slots: u32, ids: u32, generation: u64) -> SlotTable {
        assert!(slots > 0 && u64::from(slots) <= MAX_SLOTS && generation <= GEN_MAX);
        // Each (slot, generation) is pushed at most once per queue, and a
        // slot's stale entries are skipped when popped; 4 × slots leaves room
        // for stale entries of earlier generations.
        let cap = (slots as usize * 4).next_power_of_two().max(64);
        SlotTable {
            cells: (0..slots).map(|_| Cell::new(generation)).collect(),
            map: (0..ids).map(|_| AtomicU64::new(NONE)).collect(),
            failed: (0..ids).map(|_| AtomicU8::new(0)).collect(),
            clock: CachePadded::new(AtomicU64::new(1)),
            fresh: CachePadded::new(AtomicU32::new(0)),
            demand: Queue::with_capacity(cap),
            speculative: Queue::with_capacity(cap),
            demand_reading: CachePadded::new(AtomicU32::new(0)),
            evictions: CachePadded::new(AtomicU64::new(0)),
            evicted_unclaimed: CachePadded::new(AtomicU64::new(0)),
            speculative_claimed_bytes: CachePadded::new(AtomicU64::new(0)),
            retired: CachePadded::new(AtomicU64::new(0)),
            shape: Shape {
                policy: Policy::Lru,
                experts_per_layer: ids.max(1),
                layers: 1,
            },
            visit_start: Box::new([AtomicU64::new(0)]),
            last_layer: CachePadded::new(AtomicU32::new(u32::MAX)),
            claims: Box::new([]),
            pins: Pins::new(slots),
        }
    }

    /// The eviction policy.
    pub(crate) fn policy(&self) -> Policy {
        self.shape.policy
    }

    #[inline]
    pub(crate) fn slots(&self) -> u32 {
        self.cells.len() as u32
    }

    /// The current state word of `slot` (for stats and tests).
    pub(crate) fn word(&self, slot: u32) -> Word {
        self.cells[slot as usize].word.load(Ordering::Acquire)
    }

    /// The dense id of `slot`'s current or last load (for diagnostics).
    pub(crate) fn slot_id(&self, slot: u32) -> u32 {
        self.cells[slot as usize].id.load(Ordering::Relaxed)
    }

    /// When `slot` was last used (`victim::next_stamp`).
    pub(crate) fn stamp(&self, slot: u32) -> u64 {
        self.cells[slot as usize].stamp.load(Ordering::Relaxed)
    }

    /// Loads so far that replaced another expert.
    pub(crate) fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }

    /// Loaded experts the elastic ring has taken offline so far.
    pub(crate) fn retired(&self) -> u64 {
        self.retired.load(Ordering::Relaxed)
    }

    /// Evictions of loads no claim had taken.
    pub(crate) fn evicted_unclaimed(&self) -> u64 {
        self.evicted_unclaimed.load(Ordering::Relaxed)
    }

    /// Bytes of speculative loads that a claim has taken so far.
    pub(crate) fn speculative_claimed_bytes(&self) -> u64 {
        self.speculative_claimed_bytes.load(Ordering::Relaxed)
    }

    /// What the ring's slots are doing now, by one pass over their words
    /// (and the pin counters of SHARED slots): a snapshot that may be stale
    /// by the time it returns.
    pub(crate) fn occupancy(&self) -> Occupancy {
        let mut o = Occupancy::default();
        for i in 0..self.slots() {
            let w = self.word(i);
            match w.state() {
                QUEUED | READING | EVICTING => o.loading += 1,
                READY | CONSUMED
                    if w.is_held() || (w.shared() && self.pins.pinned(i, Ordering::Relaxed)) =>
                {
                    o.held += 1
                }
                _ => {}
            }
        }
        o
    }

    /// Number of slots holding loaded data.
    pub(crate) fn resident(&self) -> u32 {
        (0..self.slots())
            .filter(|&i| self.word(i).is_loaded())
            .count() as u32
    }

    /// Number of OFFLINE slots (for tests; the streamer counts its own).
    #[cfg(test)]
    pub(crate) fn offline(&self) -> u32 {
        (0..self.slots())
            .filter(|&i| self.word(i).state() == OFFLINE)
            .count() as u32
    }
}

// The identity map: what holds an id.
impl SlotTable {
    /// The slot holding `id`'s data, if it is loaded (READY or CONSUMED).
    pub(crate) fn resident_slot(&self, id: u32) -> Option<u32> {
        let (slot, w) = self.current(id)?;
        w.is_loaded().then_some(slot)
    }

    /// The slot and word of `id`'s current load, if the map names one and
    /// the word still holds it (same id and generation, not EMPTY).
    fn current(&self, id: u32) -> Option<(u32, Word)> {
        let m = self.map[id as usize].load(Ordering::Acquire);
        if m >= RESERVED {
            return None;
        }
        let (slot, generation) = split_ticket(m);
        let w = self.word(slot);
        w.holds(generation).then_some((slot, w))
    }

    /// Whether `id` is queued or being read (not yet loaded).
    pub(crate) fn in_flight(&self, id: u32) -> bool {
        self.map[id as usize].load(Ordering::Acquire) == RESERVED
            || self
                .current(id)
                .is_some_and(|(_, w)| matches!(w.state(), QUEUED | READING))
    }

    /// Whether `id` is loaded or being loaded.
    pub(crate) fn present(&self, id: u32) -> bool {
        self.map[id as usize].load(Ordering::Acquire) == RESERVED || self.current(id).is_some()
    }
}

// Take: a prefetch takes a slot for an id and queues its read.
impl SlotTable {
    /// Makes sure `id` is resident or in flight; queues a read if not.
    /// Never waits.
    pub(crate) fn prefetch(&self, id: u32, origin: Origin) -> Prefetched {
        self.prefetch_sparing(id, origin, Spare::Nothing)
    }

    /// [`SlotTable::prefetch`] that never evicts a slot holding an id
    /// `spare` names: the pre-warm thread uses it so that warming one expert
    /// never evicts another it keeps warm, a working set so that its later
    /// members never evict its earlier ones.
    pub(crate) fn prefetch_sparing(&self, id: u32, origin: Origin, spare: Spare<'_>) -> Prefetched {
        let demand = origin == Origin::Demand;
        let entry = &self.map[id as usize];
        loop {
            // Acquire: pairs with the Release store of a slot index below, so
            // the slot's word already shows `id` when we read it.
            let m = entry.load(Ordering::Acquire);
            if m == RESERVED {
                return Prefetched::Present;
            }
            if m != NONE {
                let (slot, generation) = split_ticket(m);
                if self.ensure_demand_if_queued(slot, generation, demand) {
                    return Prefetched::Present;
                }
                // Stale hint: the slot was taken for another expert (or its
                // read failed). Clear it; losing this race is harmless.
                let _ = entry.compare_exchange(m, NONE, Ordering::AcqRel, Ordering::Relaxed);
                continue;
            }
            if self.failed[id as usize].load(Ordering::Acquire) != 0 {
                return Prefetched::ErrorPending;
            }
            // AcqRel: we become the only thread that may install a slot for
            // `id` (others now see RESERVED and stand back).
            if entry
                .compare_exchange(NONE, RESERVED, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
            {
                continue;
            }
            let Some((slot, generation, evicted)) = self.take_slot(id, origin, spare) else {
                // Release: pairs with the Acquire load above.
                entry.store(NONE, Ordering::Release);
                return Prefetched::RingFull;
            };
            // Release: publishes the slot's new word (written by take_slot)
            // to anyone who finds `slot` through the map.
            let item = ticket(slot, generation);
            entry.store(item, Ordering::Release);
            let queue = if demand {
                &self.demand
            } else {
                &self.speculative
            };
            if queue.push(item).is_err() {
                // Cannot happen while capacity ≥ 4 × slots holds the live
                // and stale entries; undo rather than leave a slot stranded.
                self.abandon(slot, generation, id);
                return Prefetched::RingFull;
            }
            return Prefetched::Queued { slot, evicted };
        }
    }

    /// Whether `id` is resident or in flight, as [`SlotTable::prefetch`]
    /// would find it, without taking a slot when it is not: a resident one
    /// is marked recently used, and with a demand `origin` a read waiting in
    /// the speculative queue is promoted.
    pub(crate) fn refresh(&self, id: u32, origin: Origin) -> bool {
        // Acquire: as in `prefetch_sparing`.
        let m = self.map[id as usize].load(Ordering::Acquire);
        if m == RESERVED {
            return true;
        }
        if m == NONE {
            return false;
        }
        let (slot, generation) = split_ticket(m);
        self.ensure_demand_if_queued(slot, generation, origin == Origin::Demand)
    }

    /// True when `slot` holds `id` (loading or loaded). With `demand`, a read
    /// still waiting in the speculative queue is promoted: marked demand and
    /// pushed onto the demand queue, where a worker will find it first.
    fn ensure_demand_if_queued(&self, slot: u32, generation: u64, demand: bool) -> bool {
        let cell = &self.cells[slot as usize].word;
        // Acquire: see the word's latest transition before deciding.
        let mut w = cell.load(Ordering::Acquire);
        loop {
            if !w.holds(generation) {
                return false;
            }
            if w.is_loaded() {
                // Asked for again: recently used. Without this, prefetching a
                // layer's experts (one resident, one not) could evict the
                // resident one to make room for the other, just before both
                // are claimed.
                self.touch(slot);
                return true;
            }
            if !demand || w.demand() || w.state() != QUEUED {
                return true;
            }
            let promoted = w.with_demand();
            match cell.compare_exchange(w, promoted, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    // A full demand queue only delays the read: it is still
                    // in the speculative queue.
                    let _ = self.demand.push(ticket(slot, w.generation()));
                    return true;
                }
                Err(now) => w = now,
            }
        }
    }

    /// Undo a take whose queue push failed: the slot goes back to EMPTY.
    fn abandon(&self, slot: u32, generation: u64, id: u32) {
        let cell = &self.cells[slot as usize].word;
        let w = cell.load(Ordering::Acquire);
        // Release: the slot is free again. If a worker took the read
        // meanwhile (it was pushed to no queue, so only via a promotion),
        // the load goes on and its map entry stays.
        let freed = w.state() == QUEUED
            && w.generation() == generation
            && cell
                .compare_exchange(
                    w,
                    w.with_state(EMPTY).without_origin(),
                    Ordering::Release,
                    Ordering::Relaxed,
                )
                .is_ok();
        if freed {
            let _ = self.map[id as usize].compare_exchange(
                ticket(slot, generation),
                NONE,
                Ordering::AcqRel,
                Ordering::Relaxed,
            );
        }
    }

    /// Drops `id`'s read when it still waits in a queue as a bet (QUEUED,
    /// neither demand nor pre-warm: no claim waits for it), so that it
    /// never starts: the slot goes back to EMPTY (its generation kept, so
    /// the queue's entry is stale and the worker that pops it skips it) and
    /// the map entry is cleared, as if the bet had never been queued. A
    /// claim or a demand prefetch racing with it either marks the read
    /// demand first (then nothing is dropped) or finds the slot EMPTY and
    /// queues a read of its own. Returns whether a read was dropped.
    pub(crate) fn drop_speculative(&self, id: u32) -> bool {
        let entry = &self.map[id as usize];
        // Acquire: as in `prefetch_sparing`.
        let m = entry.load(Ordering::Acquire);
        if m == NONE || m == RESERVED {
            return false;
        }
        let (slot, generation) = split_ticket(m);
        let cell = &self.cells[slot as usize].word;
        // Acquire: the word's latest transition (a promotion, a worker's
        // begin) before deciding.
        let w = cell.load(Ordering::Acquire);
        if w.state() != QUEUED || w.generation() != generation || w.origin() != Origin::Speculative
        {
            return false;
        }
        // AcqRel: Acquire as above; Release makes the slot free again for
        // whoever takes it next. Losing to a promotion or a worker's begin
        // (the word changed) drops nothing.
        if cell
            .compare_exchange(
                w,
                w.with_state(EMPTY).without_origin(),
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_err()
        {
            return false;
        }
        // AcqRel: as every map clearing; the ticket is this load's alone.
        let _ = entry.compare_exchange(m, NONE, Ordering::AcqRel, Ordering::Relaxed);
        true
    }

    /// Makes `id`'s load the first idle slot to evict when it is a bet that
    /// was read and that no claim has taken (READY, speculative): called
    /// for a bet its layer's set did not name. It stays in the ring, a hit
    /// if a later claim wants it, but no longer counts as the head of a
    /// burst about to be claimed, which an unclaimed load is spared as for
    /// `UNCLAIMED_TURNOVERS` turns of the ring: wrong guesses would
    /// otherwise take that many turns' worth of slots from the experts the
    /// engine uses. Only the recency hint changes (`victim::DEMOTED`, which no
    /// load or touch gives, is older than every other and counts as stale). A claim or a load racing with it wins: the stamp is swapped
    /// only from the value read before the word was checked.
    pub(crate) fn demote_speculative(&self, id: u32) {
        let Some(entry) = self.map.get(id as usize) else {
            return;
        };
        // Acquire: as in `drop_speculative`.
        let m = entry.load(Ordering::Acquire);
        if m == NONE || m == RESERVED {
            return;
        }
        let (slot, generation) = split_ticket(m);
        let cell = &self.cells[slot as usize];
        let stamp = cell.stamp.load(Ordering::Relaxed);
        // Acquire: the word's latest transition (a claim, a new load).
        let w = cell.word.load(Ordering::Acquire);
        if w.state() != READY
            || w.generation() != generation
            || w.origin() != Origin::Speculative
            || w.is_held()
        {
            return;
        }
        // Relaxed: a hint; a touch since the load above keeps its stamp.
        let _ = cell.stamp.compare_exchange(
            stamp,
            victim::DEMOTED,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }

    /// Takes a slot for `id`: a fresh one if any is left, else the least
    /// recently used idle one. Returns (slot, new generation, evicted).
    fn take_slot(&self, id: u32, origin: Origin, spare: Spare<'_>) -> Option<(u32, u64, bool)> {
        let n = self.slots();
        self.start_visit(id);
        if self.fresh.load(Ordering::Relaxed) < n {
            let i = self.fresh.fetch_add(1, Ordering::Relaxed);
            if i < n {
                // Untouched unless a scan took it first (EMPTY looks oldest
                // to the scan); the take's compare-exchange checks the word.
                let seen = self.cells[i as usize].word.load(Ordering::Relaxed);
                if seen.state() == EMPTY {
                    if let Some(t) = self.try_take(i, seen, id, origin) {
                        return Some(t);
                    }
                }
            }
        }
        // Each failed compare-exchange means another thread changed a slot we
        // chose; a fresh scan sees that. Give up after as many rounds as there
        // are slots: the ring is busy beyond what a prefetch should wait for.
        let mut skip = Skip::default();
        for _ in 0..n.max(Skip::ROUNDS) {
            let (i, w) = self.victim(id, origin, spare, &skip)?;
            let w = match self.seize(i, w) {
                Seized::Idle(w) => w,
                Seized::Pinned => {
                    skip.push(i);
                    continue;
                }
                Seized::Changed => continue,
            };
            if let Some(t) = self.try_take(i, w, id, origin) {
                return Some(t);
            }
            debug_assert!(w.state() != EVICTING, "only the evictor writes EVICTING");
        }
        None
    }

    /// Moves slot `i` from the idle word `seen` to QUEUED for `id`.
    fn try_take(&self, i: u32, seen: Word, id: u32, origin: Origin) -> Option<(u32, u64, bool)> {
        let generation = next_generation(seen.generation());
        let new = Word::new(QUEUED, generation, origin);
        // AcqRel: Acquire orders the last claimant's reads of the slot (its
        // Release in `release`) before the worker's writes; Release publishes
        // the new identity to whoever reads the word next.
        let cell = &self.cells[i as usize];
        cell.word
            .compare_exchange(seen, new, Ordering::AcqRel, Ordering::Relaxed)
            .ok()?;
        // A load is the one event that advances the clock.
        let now = self.clock.fetch_add(1, Ordering::Relaxed) + 1;
        cell.stamp.store(victim::load_stamp(now), Ordering::Relaxed);
        // The slot is ours (QUEUED, refcount 0): nobody else writes its ids
        // or its count (a claimant's count store happens before its release,
        // which our Acquire above ordered before us).
        let old_id = cell.id.swap(id, Ordering::Relaxed);
        if let Some(claims) = self.claims.get(id as usize) {
            if seen.state() != EMPTY {
                if let Some(old) = self.claims.get(old_id as usize) {
                    old.store(cell.count.load(Ordering::Relaxed), Ordering::Relaxed);
                }
            }
            cell.count
                .store(claims.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        let layer = id / self.shape.experts_per_layer;
        cell.layer.store(layer, Ordering::Relaxed);
        let evicted = seen.state() != EMPTY;
        if evicted {
            self.evictions.fetch_add(1, Ordering::Relaxed);
            if seen.state() == READY {
                self.evicted_unclaimed.fetch_add(1, Ordering::Relaxed);
            }
            // The old load's map entry may still name this slot; clear it.
            // (A failed or abandoned load cleared its own entry.) The ticket
            // is unique to that load, so a stale `old_id` clears nothing.
            let _ = self.map[old_id as usize].compare_exchange(
                ticket(i, seen.generation()),
                NONE,
                Ordering::AcqRel,
                Ordering::Relaxed,
            );
        }
        Some((i, generation, evicted))
    }
}

// The workers' hand-off: begin a queued read, finish it.
impl SlotTable {
    /// The next read for a worker, demand first; a speculative (or
    /// pre-warm) read only while no demand read is in progress, so that a
    /// bet fills the drive's idle time and never takes bandwidth from a read
    /// the engine waits for. None when there is nothing to begin. Entries
    /// made stale by a promotion or a newer generation are skipped.
    pub(crate) fn next_job(&self) -> Option<ReadJob> {
        loop {
            let item = match self.demand.pop() {
                Some(item) => item,
                // Acquire: pairs with the Release decrement in `end_read`;
                // a stale count only delays a bet or lets one overlap.
                None if self.demand_reading.load(Ordering::Acquire)
                    < BETS_WHILE_DEMAND_READS_BELOW =>
                {
                    self.speculative.pop()?
                }
                None => return None,
            };
            let (slot, generation) = split_ticket(item);
            let cell = &self.cells[slot as usize].word;
            // Acquire: the word written by the prefetch that queued the item.
            let mut w = cell.load(Ordering::Acquire);
            loop {
                if w.state() != QUEUED || w.generation() != generation {
                    break; // stale: taken by another worker, or abandoned
                }
                // Acquire: the slot's previous readers are done (see try_take),
                // so the worker may now overwrite its bytes.
                match cell.compare_exchange(
                    w,
                    w.with_state(READING),
                    Ordering::Acquire,
                    Ordering::Acquire,
                ) {
                    Ok(_) => {
                        if w.origin() == Origin::Demand {
                            self.demand_reading.fetch_add(1, Ordering::Relaxed);
                        }
                        // The id was stored before the ticket was pushed:
                        // this pop (Acquire) ordered that store before us.
                        let id = self.cells[slot as usize].id.load(Ordering::Relaxed);
                        return Some(ReadJob {
                            slot,
                            generation,
                            id,
                            origin: w.origin(),
                        });
                    }
                    Err(now) => w = now,
                }
            }
        }
    }

    /// Whether `next_job` may find a read to begin (possibly a stale one):
    /// a demand item, or a speculative one while no demand read is in
    /// progress.
    pub(crate) fn has_work(&self) -> bool {
        !self.demand.is_empty()
            || (!self.speculative.is_empty()
                && self.demand_reading.load(Ordering::Acquire) < BETS_WHILE_DEMAND_READS_BELOW)
    }

    /// Whether the speculative queue holds an item (possibly a stale one).
    pub(crate) fn has_speculative(&self) -> bool {
        !self.speculative.is_empty()
    }

    /// A begun read ended (loaded or failed). True when it was the last
    /// demand read in progress: speculative reads may begin now (the caller
    /// wakes workers for them).
    fn end_read(&self, job: &ReadJob) -> bool {
        // Release: pairs with `next_job`'s Acquire load.
        job.origin == Origin::Demand
            && self.demand_reading.fetch_sub(1, Ordering::Release) == BETS_WHILE_DEMAND_READS_BELOW
    }

    /// Publishes a finished read: READY, with a fresh tick.
    #[cfg(any(test, loom))]
    pub(crate) fn finish_ok(&self, job: ReadJob) {
        self.finish_loaded(job, 0);
    }

    /// Publishes a finished read of `bytes` bytes: READY, with a fresh
    /// tick. Returns who the load was for in the end (a claim that waited
    /// for it while it was read made it demand), and whether speculative
    /// reads may begin now (it was the last demand read in progress).
    pub(crate) fn finish_loaded(&self, job: ReadJob, bytes: u64) -> (Origin, bool) {
        let origin = self.publish_loaded(job, bytes);
        (origin, self.end_read(&job))
    }

    fn publish_loaded(&self, job: ReadJob, bytes: u64) -> Origin {
        self.touch(job.slot);
        let slot = &self.cells[job.slot as usize];
        slot.bytes.store(bytes, Ordering::Relaxed);
        let cell = &slot.word;
        let mut w = cell.load(Ordering::Relaxed);
        loop {
            debug_assert!(w.state() == READING && w.generation() == job.generation);
            // Release: publishes the bytes the worker wrote into the slot
            // (and `bytes`) to every claim that Acquires this word.
            match cell.compare_exchange(
                w,
                w.with_state(READY),
                Ordering::Release,
                Ordering::Relaxed,
            ) {
                Ok(_) => return w.origin(),
                Err(now) => w = now, // a claim set D meanwhile
            }
        }
    }

    /// Records a failed read: the error waits for the next claim of the id,
    /// and the slot goes back to EMPTY. True when speculative reads may
    /// begin now (it was the last demand read in progress).
    pub(crate) fn finish_failed(&self, job: ReadJob) -> bool {
        self.fail_read(job);
        self.end_read(&job)
    }

    fn fail_read(&self, job: ReadJob) {
        // Release: the error (stored by the caller before this call) is
        // visible to the claim that Acquires the flag.
        self.failed[job.id as usize].store(1, Ordering::Release);
        let cell = &self.cells[job.slot as usize].word;
        let mut w = cell.load(Ordering::Relaxed);
        loop {
            let empty = w.with_state(EMPTY).without_origin();
            // Release: the failed flag is set before the slot can be seen free.
            match cell.compare_exchange(w, empty, Ordering::Release, Ordering::Relaxed) {
                Ok(_) => break,
                Err(now) => w = now,
            }
        }
        let _ = self.map[job.id as usize].compare_exchange(
            ticket(job.slot, job.generation),
            NONE,
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
    }
}

// Claim and release.
impl SlotTable {
    /// Claims `id` if its data is in the ring; otherwise makes sure a demand
    /// read is queued and answers Pending. Never waits for a read; a claim
    /// of a SHARED slot that an evictor is seizing waits (spins, then
    /// yields) for the few loads of the seize.
    pub(crate) fn claim(&self, id: u32) -> Claimed {
        self.claim_or(id, true)
    }

    /// [`SlotTable::claim`] that queues nothing: [`Claimed::Absent`] when
    /// `id` is neither resident nor in flight. A read in flight is still
    /// marked demand (the caller is waiting for it). The first pass of a
    /// working-set claim ([`SlotTable::claim_set`]), which takes a resident
    /// member before it queues any other.
    pub(crate) fn claim_present(&self, id: u32) -> Claimed {
        self.claim_or(id, false)
    }

    /// A claim; `queue`: when `id` is absent, queue its demand read.
    #[inline(always)]
    fn claim_or(&self, id: u32, queue: bool) -> Claimed {
        let entry = &self.map[id as usize];
        let backoff = Backoff::new();
        loop {
            // Set when a compare-exchange on the load's word lost to another
            // claim or release of it: the slot is shared.
            let mut contended = false;
            // Set when a SHARED slot cannot be pinned at once: this claim
            // raises the word's refcount instead.
            let mut refcounted = false;
            // Acquire: pairs with the Release store of the slot index.
            let m = entry.load(Ordering::Acquire);
            if m == RESERVED {
                return Claimed::Pending { queued: false };
            }
            if m == NONE {
                // AcqRel: take the error (and see the message stored before
                // the flag was set); forget it so a later prefetch retries.
                if self.failed[id as usize].swap(0, Ordering::AcqRel) != 0 {
                    return Claimed::Failed;
                }
                if !queue {
                    return Claimed::Absent;
                }
                return match self.prefetch(id, Origin::Demand) {
                    Prefetched::Queued { .. } => Claimed::Pending { queued: true },
                    Prefetched::Present => Claimed::Pending { queued: false },
                    Prefetched::ErrorPending => continue,
                    Prefetched::RingFull => Claimed::RingFull,
                };
            }
            let (slot, generation) = split_ticket(m);
            let cell = &self.cells[slot as usize].word;
            // Acquire: if READY/CONSUMED, the slot's bytes are visible.
            let mut w = cell.load(Ordering::Acquire);
            loop {
                if !w.holds(generation) {
                    let _ = entry.compare_exchange(m, NONE, Ordering::AcqRel, Ordering::Relaxed);
                    break; // re-read the map
                }
                match w.state() {
                    QUEUED | READING => {
                        if w.demand() {
                            return Claimed::Pending { queued: false };
                        }
                        // The caller is waiting: mark the read demand and, if
                        // no worker has it yet, put it at the head of the line.
                        let marked = w.with_demand();
                        match cell.compare_exchange(w, marked, Ordering::AcqRel, Ordering::Acquire)
                        {
                            Ok(_) => {
                                // No wake-up needed: the read is still in a
                                // queue whose push woke a worker.
                                if w.state() == QUEUED {
                                    let _ = self.demand.push(ticket(slot, w.generation()));
                                }
                                return Claimed::Pending { queued: false };
                            }
                            Err(now) => w = now,
                        }
                    }
                    CONSUMED if w.shared() && !refcounted => {
                        match self.claim_pinned(slot, generation) {
                            Pinned::Claimed(claimed) => return claimed,
                            // Being seized (the EVICTING arm waits), or
                            // reloaded (the loop's top sees it).
                            Pinned::WordChanged => w = cell.load(Ordering::Acquire),
                            // A claim of the slot's last load is taking its
                            // pin back from our shard's counter: count this
                            // claim in the word instead of waiting for it.
                            Pinned::CounterBusy => refcounted = true,
                        }
                    }
                    CONSUMED if contended && !w.shared() => {
                        // Threads are claiming this load at once: from now
                        // on they pin it instead of writing its word.
                        let shared = w.with_shared();
                        // Acquire on failure: we may retry with it.
                        w = match cell.compare_exchange(
                            w,
                            shared,
                            Ordering::Relaxed,
                            Ordering::Acquire,
                        ) {
                            Ok(_) => shared,
                            Err(now) => now,
                        };
                    }
                    READY | CONSUMED => {
                        if w.refs() == MAX_REFS {
                            return Claimed::TooManyClaims;
                        }
                        let claimed = w.with_state(CONSUMED).plus_ref().without_origin();
                        // Acquire: the worker's Release of READY published the
                        // bytes; Relaxed is not enough for the failure load
                        // either, since we may retry with it.
                        match cell.compare_exchange(
                            w,
                            claimed,
                            Ordering::Acquire,
                            Ordering::Acquire,
                        ) {
                            Ok(_) => {
                                // Recency and the claim count are hints: a
                                // claim of a slot other claims hold (which
                                // no eviction can take) leaves them to the
                                // first, so threads sharing one expert write
                                // its line once per claim, not three times.
                                if w.refs() == 0 {
                                    self.touch_claimed(slot);
                                }
                                if w.state() == READY && w.origin() == Origin::Speculative {
                                    // The first claim of a bet that came
                                    // true (its bytes were stored before
                                    // the READY we acquired).
                                    let bytes =
                                        self.cells[slot as usize].bytes.load(Ordering::Relaxed);
                                    self.speculative_claimed_bytes
                                        .fetch_add(bytes, Ordering::Relaxed);
                                }
                                let hit = !(w.state() == READY && w.demand());
                                return Claimed::Ready {
                                    slot,
                                    ticket: m,
                                    hit,
                                };
                            }
                            Err(now) => {
                                w = now;
                                // Another claim or release of this load won
                                // (not an eviction, nor the worker).
                                contended = w.holds(generation) && w.state() == CONSUMED;
                            }
                        }
                    }
                    EVICTING => {
                        // An evictor is counting the pins of this SHARED
                        // slot (a few loads): it puts the word back if
                        // another claim holds the slot. Spin, then yield
                        // (should the evictor have lost its core).
                        backoff.snooze();
                        w = cell.load(Ordering::Acquire);
                    }
                    _ => {
                        let _ =
                            entry.compare_exchange(m, NONE, Ordering::AcqRel, Ordering::Relaxed);
                        break;
                    }
                }
            }
        }
    }

    /// One pass of a working-set claim (`Streamer::claim_any`)
    /// over the `n` members whose dense ids `id(k)` gives (every one checked
    /// by the caller before the pass: an error found after a member was
    /// claimed would lose that claim): the first resident member, claimed; then,
    /// if the pass went past members that are not resident (or found none),
    /// the absent members' demand reads queued in order, sparing the set's
    /// own loads (`spare()`), until the ring takes no more. A ring of
    /// `active` slots whose every one is held, with no member resident or
    /// in flight and nothing loading, is [`SetClaim::Full`]: only a
    /// release frees a slot.
    #[inline]
    pub(crate) fn claim_set<'s>(
        &self,
        n: usize,
        id: impl Fn(usize) -> u32,
        spare: impl FnOnce() -> Spare<'s>,
        active: u32,
    ) -> SetPass {
        let mut pass = SetPass {
            found: SetClaim::Wait,
            queued: 0,
            ring_full: false,
        };
        let mut in_flight = false;
        let mut absent = false;
        // The first member whose slot already counts the most claims it
        // can: passed over, so that another member can be claimed, and
        // reported only when none can.
        let mut too_many = None;
        let mut passed = 0;
        for k in 0..n {
            match self.claim_present(id(k)) {
                Claimed::Absent => absent = true,
                Claimed::Pending { .. } => in_flight = true,
                Claimed::TooManyClaims => {
                    too_many.get_or_insert(k);
                }
                claimed => {
                    pass.found = SetClaim::Member { member: k, claimed };
                    break;
                }
            }
            passed += 1;
        }
        if passed == 0 {
            // The set's head was resident: nothing to queue, and no pass
            // over the rest, so a set of residents costs one claim.
            return pass;
        }
        let too_many = too_many.map(|member| SetClaim::Member {
            member,
            claimed: Claimed::TooManyClaims,
        });
        if !absent && pass.found == SetClaim::Wait {
            // Every member is in flight (a waiting claim polls at the cost
            // of the first pass alone), or held as often as it can be.
            if !in_flight {
                pass.found = too_many.unwrap_or(SetClaim::Wait);
            }
            return pass;
        }
        let spare = spare();
        let mut error_pending = false;
        // The expert found (claimed, or its failure reported just now), by
        // id: a duplicate of it in the set is passed over too, so a new
        // read of a member whose read failed waits for a later prefetch.
        let found = match pass.found {
            SetClaim::Member { member, .. } => Some(id(member)),
            _ => None,
        };
        for k in 0..n {
            if Some(id(k)) == found {
                continue;
            }
            match self.prefetch_sparing(id(k), Origin::Demand, spare) {
                Prefetched::Queued { .. } => {
                    pass.queued += 1;
                    in_flight = true;
                }
                Prefetched::Present => {}
                // The next pass's claim reports the member's error.
                Prefetched::ErrorPending => error_pending = true,
                Prefetched::RingFull => {
                    pass.ring_full = true;
                    break;
                }
            }
        }
        let nothing_of_the_set = !in_flight && !error_pending && pass.ring_full;
        if matches!(pass.found, SetClaim::Wait) && nothing_of_the_set {
            // Nothing of the set is resident or in flight and the ring took
            // nothing: a load of another expert frees a slot when it lands
            // (wait for it), but a ring whose every active slot is held
            // frees none until a release.
            let o = self.occupancy();
            if o.loading == 0 && o.held >= active {
                // A member held as often as it can be is the better
                // answer: the ring is full of claims, one of them its.
                pass.found = too_many.unwrap_or(SetClaim::Full);
            }
        }
        pass
    }

    /// Releases one claim of `ticket`. Stale when the ticket's slot has since
    /// been taken for another load, or holds no claim.
    pub(crate) fn release(&self, t: u64) -> Result<u32, Stale> {
        let (slot, generation) = split_ticket(t);
        let cell = &self.cells.get(slot as usize).ok_or(Stale)?.word;
        if let Some(shard) = pin_shard_of(t) {
            return self.release_pinned(cell, slot, generation, shard);
        }
        let mut w = cell.load(Ordering::Relaxed);
        let backoff = Backoff::new();
        loop {
            if generation == 0
                || w.generation() != generation
                || w.state() != CONSUMED
                || w.refs() == 0
            {
                return Err(Stale);
            }
            // Release: the claimant's reads of the slot happen before any
            // later take of the slot (which Acquires this word).
            match cell.compare_exchange(w, w.minus_ref(), Ordering::Release, Ordering::Relaxed) {
                Ok(_) => return Ok(slot),
                Err(now) => {
                    backoff.spin();
                    w = now;
                }
            }
        }
    }
}

// Retire and restore: the elastic ring (module doc, "Retirement").
impl SlotTable {
    /// Takes one idle slot out of use for the elastic ring: the victim the
    /// eviction would choose next (so, EMPTY slots first, then the policy's
    /// order), moved to OFFLINE by a compare-exchange exactly like a take.
    /// The caller (the streamer, which owns the ring) then releases its
    /// pages; nobody reads or writes an OFFLINE slot. `None` when no slot is
    /// idle (every one is claimed or loading) after as many tries as a take
    /// makes. Never waits.
    pub(crate) fn retire_idle_slot(&self) -> Option<u32> {
        // The adaptive policy ranks by the layer being loaded: take the last
        // load's, as the next load is likely of that layer or the next.
        let layer = self.last_layer.load(Ordering::Relaxed);
        let id = if layer < self.shape.layers {
            layer * self.shape.experts_per_layer
        } else {
            0
        };
        let mut skip = Skip::default();
        for _ in 0..self.slots().max(Skip::ROUNDS) {
            // As a demand take chooses: memory pressure may take even an
            // unclaimed demand load.
            let (i, seen) = self.victim(id, Origin::Demand, Spare::Nothing, &skip)?;
            if !seen.is_idle() {
                continue;
            }
            let seen = match self.seize(i, seen) {
                Seized::Idle(w) => w,
                Seized::Pinned => {
                    skip.push(i);
                    continue;
                }
                Seized::Changed => continue,
            };
            let generation = next_generation(seen.generation());
            let offline = Word::offline(generation);
            // AcqRel: Acquire orders the last claimant's reads of the slot
            // (its Release in `release`) and the worker's writes (its Release
            // of READY) before the caller releases the pages; Release
            // publishes OFFLINE to every later scan.
            let cell = &self.cells[i as usize];
            if cell
                .word
                .compare_exchange(seen, offline, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
            {
                continue;
            }
            if seen.state() != EMPTY {
                self.retired.fetch_add(1, Ordering::Relaxed);
                // As in `try_take`: the old load's map entry may still name
                // this slot; the ticket is unique to that load. Its claim
                // count is saved for the adaptive policy.
                let old_id = cell.id.load(Ordering::Relaxed);
                if let Some(old) = self.claims.get(old_id as usize) {
                    old.store(cell.count.load(Ordering::Relaxed), Ordering::Relaxed);
                }
                let _ = self.map[old_id as usize].compare_exchange(
                    ticket(i, seen.generation()),
                    NONE,
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                );
            }
            return Some(i);
        }
        None
    }

    /// Gives back a slot [`SlotTable::retire_idle_slot`] took: OFFLINE →
    /// EMPTY, so the next take may use it. False (and nothing changes) when
    /// the slot is not OFFLINE.
    pub(crate) fn restore_slot(&self, slot: u32) -> bool {
        let Some(cell) = self.cells.get(slot as usize).map(|c| &c.word) else {
            return false;
        };
        let w = cell.load(Ordering::Relaxed);
        if w.state() != OFFLINE {
            return false;
        }
        // Release: the caller's release of the slot's pages happens before
        // any take that Acquires the EMPTY word (and then writes the slot).
        cell.compare_exchange(w, w.with_state(EMPTY), Ordering::Release, Ordering::Relaxed)
            .is_ok()
    }
}
