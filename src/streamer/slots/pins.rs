//! Shared mode: claims of a contended slot count themselves in per-thread
//! pin counters instead of the slot's state word, and the seize that an
//! eviction or a retire makes of such a slot reads those counters.
//!
//! # Shared mode
//!
//! A refcount in the word makes every claim and release of a slot a
//! compare-exchange on its one cache line: threads claiming the same expert
//! at once take turns owning that line, and together run slower than one
//! thread alone. So when a claim's compare-exchange on a CONSUMED word
//! loses to another claim or release of the same load, it sets `S`, and
//! from then on, until the slot is taken for another load, claims *pin* the
//! slot instead:
//!
//! - `pins` holds one counter per (shard, slot); a thread's shard is its
//!   [`thread_index`] modulo the table's shards (one per core, at most 16,
//!   fewer for a huge ring), and each shard's row starts on its own cache
//!   line. A counter is `tag << 25 | count`, the tag being the low 39 bits
//!   of the generation of the load its pins hold. A pinned claim adds 1 to
//!   its shard's counter of the slot (setting the tag when the count was
//!   0), fences (SeqCst), and reads the word: CONSUMED, `S`, same
//!   generation, and the claim holds; anything else, and it takes the pin
//!   back (never below 0: a stray second release may have taken it) and
//!   looks again. When its shard's counter still holds a pin of the
//!   slot's last load (a claimer that lost the race with the reload, about
//!   to take its pin back), the claim raises the word's refcount instead
//!   of waiting.
//!   It writes only its own shard's line (and the slot's recency stamp once
//!   per tick of the load clock, not once per claim).
//! - Its ticket is `1 << 63 | shard << 59 | (generation mod 2^39) << 20 |
//!   slot`, so its release (on any thread) takes 1 from that same counter,
//!   and is stale when the count is 0, the tag is another load's, or the
//!   word holds another load: a ticket released twice never takes a pin of
//!   the slot's next load.
//! - The scan ranks an idle SHARED slot like any other (the word says
//!   nothing of its pins). To take one, `seize` moves the word to
//!   EVICTING (claims that see it wait: the evictor is only counting),
//!   fences (SeqCst), and reads the slot's counters in every shard. Both
//!   sides write, fence, then read, so at least one sees the other: a claim
//!   that missed EVICTING is seen in the counters, and the slot goes back
//!   to CONSUMED (marked recently used, and left out of this take's next
//!   scans) while this take looks elsewhere; a claim that saw EVICTING took
//!   its pin back, and waits (spins, then yields its core) until the word
//!   leaves EVICTING. With every count 0 the EVICTING word is the
//!   evictor's alone, and it moves on to QUEUED (or OFFLINE) as from any
//!   idle word. After eight pinned slots in one take, its scans also read
//!   the counters of SHARED slots (a hint, without a fence) and pass over
//!   those that look pinned, so a ring of mostly pinned slots costs a take
//!   a few scans, not one per slot.
//! - Claims that were refcounted before `S` was set stay so: the word's
//!   refcount keeps the slot from the scan until they are released.

use super::word::{pin_tag, pinned_ticket, AtomicWord, Word, CONSUMED, EVICTING, MAX_PIN_SHARDS};
use super::{Claimed, SlotTable, Stale};
use crate::sync::{fence, thread_index, AtomicU64, Ordering};

/// Most pinned claims one slot can hold at once in one pin shard.
pub(crate) const MAX_PINS: u64 = (1 << 24) - 1;
/// A pin counter is `tag << PIN_TAG_SHIFT | count`: the count of pinned
/// claims, and the low 39 bits of the generation of the load they hold.
const PIN_TAG_SHIFT: u32 = 25;
const PIN_COUNT_MASK: u64 = (1 << PIN_TAG_SHIFT) - 1;
/// The pin counters of a table take at most this much memory: fewer shards
/// for a ring of very many slots.
const PIN_BUDGET_BYTES: usize = 4 << 20;
/// Pin counters per line pair.
const PINS_PER_LINE: usize = 16;

/// Two cache lines of pin counters: 128 bytes, so that rows of different
/// shards never share the pair of lines that x86's adjacent-line
/// prefetcher fetches together (crossbeam's `CachePadded` pads to 128 bytes
/// for the same reason).
#[repr(align(128))]
struct PinLine([AtomicU64; PINS_PER_LINE]);

/// The pin counters of a table: `shards` rows of `stride` (one per slot,
/// each row whole cache lines), one row per shard of threads
/// ([`thread_index`]): claims of one slot on threads of different shards
/// write different lines.
pub(super) struct Pins {
    lines: Box<[PinLine]>,
    stride: usize,
    shards: usize,
}

impl Pins {
    /// The counters of `slots` slots, all 0: one shard per core, up to 16,
    /// within PIN_BUDGET_BYTES.
    pub(super) fn new(slots: u32) -> Pins {
        let stride = (slots as usize).next_multiple_of(PINS_PER_LINE);
        let cores = if cfg!(loom) {
            2
        } else {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        };
        let shards = cores
            .min(MAX_PIN_SHARDS)
            .min(PIN_BUDGET_BYTES / 8 / stride)
            .max(1);
        Pins {
            stride,
            shards,
            lines: (0..stride * shards / PINS_PER_LINE)
                .map(|_| PinLine(std::array::from_fn(|_| AtomicU64::new(0))))
                .collect(),
        }
    }

    /// How many shards of threads the counters have.
    #[inline]
    pub(super) fn shards(&self) -> usize {
        self.shards
    }

    /// The counter of `shard`'s pins of `slot`.
    #[inline]
    pub(super) fn pin(&self, shard: usize, slot: u32) -> &AtomicU64 {
        let i = shard * self.stride + slot as usize;
        &self.lines[i / PINS_PER_LINE].0[i % PINS_PER_LINE]
    }

    /// Whether any thread pins `slot`, read with `order`: Acquire in
    /// `seize` (after its fence), pairing with the Release of the last
    /// pinned claim's release, so that claim's reads of the slot happen
    /// before the take; Relaxed for the scan's hint.
    #[inline]
    pub(super) fn pinned(&self, slot: u32, order: Ordering) -> bool {
        (0..self.shards).any(|s| self.pin(s, slot).load(order) & PIN_COUNT_MASK != 0)
    }

    /// Pinned claims not yet released, over all slots and shards (for
    /// tests).
    #[cfg(any(test, loom))]
    fn held(&self) -> u64 {
        self.lines
            .iter()
            .flat_map(|line| &line.0)
            .map(|p| p.load(Ordering::Relaxed) & PIN_COUNT_MASK)
            .sum()
    }
}

/// Takes back a pin that [`SlotTable::claim_pinned`] raised with `tag`,
/// unless a stray second release of an earlier pinned ticket of that load
/// has taken it already: never below 0, never another load's pin. Relaxed:
/// nothing was read under this pin, so there is nothing to publish to an
/// evictor that sees it gone.
fn unpin(pin: &AtomicU64, tag: u64) {
    let mut p = pin.load(Ordering::Relaxed);
    while p & PIN_COUNT_MASK != 0 && p >> PIN_TAG_SHIFT == tag {
        match pin.compare_exchange_weak(p, p - 1, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => break,
            Err(now) => p = now,
        }
    }
}

/// What [`SlotTable::claim_pinned`] did.
pub(super) enum Pinned {
    /// The claim (or TooManyClaims).
    Claimed(Claimed),
    /// The word no longer holds the load CONSUMED (an eviction has begun,
    /// or it was reloaded); the pin was taken back.
    WordChanged,
    /// This shard's counter holds a pin of the slot's last load, about to
    /// be taken back; nothing was done.
    CounterBusy,
}

/// The SHARED slots one take found pinned: its later scans leave out the
/// last four, and after eight, every SHARED slot whose pin counters read
/// nonzero (a hint; the seize checks). So a ring whose idle-looking slots
/// are mostly pinned costs a take a few scans, not one per pinned slot.
#[derive(Default)]
pub(super) struct Skip {
    slots: [u32; 4],
    len: usize,
}

/// What [`SlotTable::seize`] found.
pub(super) enum Seized {
    /// The word to take the slot from (EVICTING for a SHARED slot).
    Idle(Word),
    /// A SHARED slot held by pinned claims (put back).
    Pinned,
    /// The word changed before the seize: scan again.
    Changed,
}

impl Skip {
    /// After this many pinned slots, scans read the pins of SHARED slots.
    const READ_PINS_AFTER: usize = 8;
    /// Fewest rounds a take makes: enough to reach the scans that read
    /// pins, whatever the ring's size.
    pub(super) const ROUNDS: u32 = Self::READ_PINS_AFTER as u32 + 2;

    #[inline]
    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }
    fn skips(&self, slot: u32) -> bool {
        self.slots[..self.len.min(4)].contains(&slot)
    }
    fn reads_pins(&self) -> bool {
        self.len >= Self::READ_PINS_AFTER
    }
    #[inline]
    pub(super) fn push(&mut self, slot: u32) {
        self.slots[self.len % 4] = slot;
        self.len += 1;
    }
}

impl SlotTable {
    /// Whether the scan of a take passes over the idle SHARED `slot`: this
    /// take found it pinned, or (after eight such) its counters look pinned
    /// (plain reads, a hint: only `seize` decides). Out of line: SHARED
    /// slots are few, and the scan's loop stays small.
    #[cold]
    #[inline(never)]
    pub(super) fn passes_over(&self, slot: u32, skip: &Skip) -> bool {
        skip.skips(slot) || (skip.reads_pins() && self.pins.pinned(slot, Ordering::Relaxed))
    }

    /// Readies the idle word `seen` of slot `i` for a take: itself, unless
    /// the slot is SHARED. A SHARED slot's claims are counted in the pin
    /// shards, not the word, so it is moved to EVICTING (which stops new
    /// pins) and its pins are counted; with none, the EVICTING word is
    /// returned, and only this thread may change it (to the take's word).
    /// With pins, Pinned: the slot is held, and is marked recently used.
    #[inline]
    pub(super) fn seize(&self, i: u32, seen: Word) -> Seized {
        if !seen.shared() {
            return Seized::Idle(seen);
        }
        let cell = &self.cells[i as usize];
        let evicting = seen.with_state(EVICTING);
        // Acquire: the last refcounted claim's release (before the slot
        // turned SHARED) happens before our take.
        if cell
            .word
            .compare_exchange(seen, evicting, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return Seized::Changed;
        }
        // SeqCst fence, paired with the one in `claim_pinned` (a
        // store-buffering pair): either that claim's word load sees EVICTING
        // (and it unpins), or our pin loads below see its pin.
        fence(Ordering::SeqCst);
        if !self.pins.pinned(i, Ordering::Acquire) {
            return Seized::Idle(evicting);
        }
        // Relaxed: this publishes nothing (claims spinning on EVICTING see
        // the slot's bytes through the worker's Release of READY, whose
        // release sequence this read-modify-write continues).
        let back = cell
            .word
            .compare_exchange(evicting, seen, Ordering::Relaxed, Ordering::Relaxed);
        debug_assert!(back.is_ok(), "only the evictor writes EVICTING");
        self.touch(i);
        Seized::Pinned
    }

    /// A claim of the SHARED slot `slot`, load `generation`: raises this
    /// thread's pin count of the slot, then checks that the word still holds
    /// that load, CONSUMED (so no eviction has begun): Ready with a pinned
    /// ticket, or WordChanged (pin undone), or CounterBusy (nothing done)
    /// when this shard's counter still holds a transient pin of the slot's
    /// last load. Writes only this thread's pin line (and the slot's stamp
    /// once per tick of the load clock).
    #[inline]
    pub(super) fn claim_pinned(&self, slot: u32, generation: u64) -> Pinned {
        let shard = thread_index() % self.pins.shards();
        let pin = self.pins.pin(shard, slot);
        let tag = pin_tag(generation);
        let mut p = pin.load(Ordering::Relaxed);
        loop {
            let n = p & PIN_COUNT_MASK;
            let raised = if n == 0 {
                tag << PIN_TAG_SHIFT | 1
            } else if p >> PIN_TAG_SHIFT == tag {
                if n >= MAX_PINS {
                    return Pinned::Claimed(Claimed::TooManyClaims);
                }
                p + 1
            } else {
                // A claim of the slot's last load pinned it, saw the word
                // change, and is taking its pin back.
                return Pinned::CounterBusy;
            };
            // Relaxed: ordered before the word load by the fence.
            match pin.compare_exchange_weak(p, raised, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => break,
                Err(now) => p = now,
            }
        }
        // SeqCst fence, paired with the one in `seize`: either our word load
        // sees its EVICTING, or its loads of the pins see ours.
        fence(Ordering::SeqCst);
        let cell = &self.cells[slot as usize];
        // Acquire: the worker's Release of READY published the slot's bytes
        // (the claims and the SHARED mark since are read-modify-writes, so
        // this word is in that release sequence).
        let w = cell.word.load(Ordering::Acquire);
        if w.state() == CONSUMED && w.shared() && w.generation() == generation {
            // Recency to the tick only: threads sharing a slot then write
            // its line once per load of the ring, not once per claim.
            if !self.stamp_is_current(slot) {
                self.touch_claimed(slot);
            }
            return Pinned::Claimed(Claimed::Ready {
                slot,
                ticket: pinned_ticket(slot, generation, shard),
                hit: true,
            });
        }
        unpin(pin, tag);
        Pinned::WordChanged
    }

    /// Releases a pinned claim of `slot` (whose word is `cell`), load
    /// `generation` (the ticket's 39 bits), pinned in `shard`. Stale when
    /// the word holds another load, or the counter no pin of this one.
    #[inline]
    pub(super) fn release_pinned(
        &self,
        cell: &AtomicWord,
        slot: u32,
        generation: u64,
        shard: usize,
    ) -> Result<u32, Stale> {
        if shard >= self.pins.shards() {
            return Err(Stale);
        }
        // Relaxed: a check that the ticket names this load; the pin
        // count is what keeps the slot.
        let w = cell.load(Ordering::Relaxed);
        if !(w.shared()
            && matches!(w.state(), CONSUMED | EVICTING)
            && pin_tag(w.generation()) == generation)
        {
            return Err(Stale);
        }
        // The counter's tag names the load its pins hold, so a ticket
        // released twice finds a count of 0, or (once the slot has been
        // reloaded and pinned again) another load's tag.
        let pin = self.pins.pin(shard, slot);
        let mut p = pin.load(Ordering::Relaxed);
        loop {
            if p & PIN_COUNT_MASK == 0 || p >> PIN_TAG_SHIFT != generation {
                return Err(Stale);
            }
            // Release: the claimant's reads of the slot happen before
            // the take of an evictor that Acquires the pins.
            match pin.compare_exchange_weak(p, p - 1, Ordering::Release, Ordering::Relaxed) {
                Ok(_) => return Ok(slot),
                Err(now) => p = now,
            }
        }
    }

    /// Puts the loaded, claimed `slot` in shared mode, as contention would
    /// (for tests).
    #[cfg(any(test, loom))]
    pub(super) fn share(&self, slot: u32) {
        let cell = &self.cells[slot as usize].word;
        let w = cell.load(Ordering::Relaxed);
        assert_eq!(w.state(), CONSUMED, "share a claimed load");
        cell.store(w.with_shared(), Ordering::Relaxed);
    }

    /// Pinned claims not yet released, over all slots and shards (for
    /// tests).
    #[cfg(any(test, loom))]
    pub(super) fn pins_held(&self) -> u64 {
        self.pins.held()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::super::tests::{adaptive, decode, load_all, reload_and_claim};
    use super::super::word::{
        pin_shard_of, split_ticket, Origin, OFFLINE, PINNED, PIN_GEN_MASK, PIN_SHARD_SHIFT,
    };
    use super::super::{Prefetched, Stale};
    use super::*;
    use crate::sync::AtomicU32;

    #[test]
    fn pinned_claims_keep_a_shared_slot_until_the_last_release() {
        let t = SlotTable::new(1, 2);
        let first = reload_and_claim(&t, 0);
        t.release(first).unwrap();
        t.share(0);
        let Claimed::Ready { ticket: a, hit, .. } = t.claim(0) else {
            panic!("a shared resident slot is claimed at once")
        };
        assert!(hit);
        assert!(a & PINNED != 0, "pinned: {a:#x}");
        assert_eq!(split_ticket(a), (0, split_ticket(first).1));
        assert_eq!(t.word(0).refs(), 0, "a pinned claim leaves the word alone");
        // A second claim from another thread pins in its own shard (or the
        // same, with one shard); released there, on a third thread.
        let b = std::thread::scope(|s| {
            s.spawn(|| match t.claim(0) {
                Claimed::Ready { ticket, .. } => ticket,
                other => panic!("{other:?}"),
            })
            .join()
            .unwrap()
        });
        assert_eq!(t.prefetch(1, Origin::Demand), Prefetched::RingFull, "held");
        assert_eq!(
            t.word(0).state(),
            CONSUMED,
            "put back after the pins were seen"
        );
        std::thread::scope(|s| s.spawn(|| t.release(b).unwrap()).join().unwrap());
        assert_eq!(
            t.prefetch(1, Origin::Demand),
            Prefetched::RingFull,
            "still held"
        );
        assert_eq!(t.release(a), Ok(0));
        assert_eq!(t.release(a), Err(Stale), "released twice");
        assert!(matches!(
            t.prefetch(1, Origin::Demand),
            Prefetched::Queued { evicted: true, .. }
        ));
        assert!(!t.word(0).shared(), "a new load starts refcounted");
        assert_eq!(t.release(b), Err(Stale), "the slot was reloaded");
        assert_eq!(
            t.release(a | 15 << PIN_SHARD_SHIFT),
            Err(Stale),
            "no such shard"
        );
    }

    /// Loads `id` into a 1-slot-per-id table, claims it, releases it, and
    /// shares the slot: the state after threads contended for it.
    fn shared_resident(t: &SlotTable, id: u32) -> u32 {
        let first = reload_and_claim(t, id);
        t.release(first).unwrap();
        let slot = t.resident_slot(id).unwrap();
        t.share(slot);
        slot
    }

    fn pinned_claim(t: &SlotTable, id: u32) -> u64 {
        match t.claim(id) {
            Claimed::Ready { ticket, .. } if ticket & PINNED != 0 => ticket,
            other => panic!("expected a pinned claim of {id}, got {other:?}"),
        }
    }

    /// A pinned ticket released twice never takes a pin of the slot's next
    /// load, even one in the same shard, also where the 39-bit generation
    /// tag wraps.
    #[test]
    fn a_pinned_ticket_released_twice_is_stale_after_a_reload() {
        for first in [0, PIN_GEN_MASK - 1] {
            let t = SlotTable::with_first_generation(1, 2, first);
            shared_resident(&t, 0);
            let a = pinned_claim(&t, 0);
            t.release(a).unwrap();
            shared_resident(&t, 1); // evicts 0
            let b = pinned_claim(&t, 1);
            assert_eq!(t.release(a), Err(Stale), "the old load's ticket, again");
            assert_eq!(
                t.prefetch(0, Origin::Demand),
                Prefetched::RingFull,
                "b holds"
            );
            t.release(b).unwrap();
            assert_eq!(t.release(b), Err(Stale));
            assert!(matches!(
                t.prefetch(0, Origin::Demand),
                Prefetched::Queued { .. }
            ));
        }
    }

    /// A stray second release that takes a pin a claim raised but is about
    /// to take back (it met an eviction): the claim's unpin then does
    /// nothing, the counter never goes below 0, and the slot is neither
    /// stuck nor its next load's claims blocked.
    #[test]
    fn a_stray_release_never_drives_a_pin_below_zero() {
        let t = SlotTable::new(1, 2);
        shared_resident(&t, 0);
        let stale = pinned_claim(&t, 0);
        t.release(stale).unwrap();
        let (_, generation) = split_ticket(stale);
        let shard = pin_shard_of(stale).unwrap();
        // A claim of this load pins (the first half of claim_pinned)...
        let pin = t.pins.pin(shard, 0);
        pin.store(generation << PIN_TAG_SHIFT | 1, Ordering::Relaxed);
        // ...the stray release takes that pin...
        assert_eq!(t.release(stale), Ok(0));
        // ...the claim meets an eviction and takes its pin back.
        unpin(pin, generation);
        assert_eq!(t.pins_held(), 0, "below zero, or left raised");
        shared_resident(&t, 1); // evicts 0: nothing holds the slot
        let b = pinned_claim(&t, 1);
        t.release(b).unwrap();
        // The same with the counter holding another load's tag: untouched.
        pin.store((generation + 1) << PIN_TAG_SHIFT | 1, Ordering::Relaxed);
        unpin(pin, generation);
        assert_eq!(pin.load(Ordering::Relaxed) & PIN_COUNT_MASK, 1);
        pin.store(0, Ordering::Relaxed);
    }

    /// A claim whose shard's counter still holds a pin of the slot's last
    /// load claims through the word's refcount instead of waiting.
    #[test]
    fn a_busy_counter_falls_back_to_the_refcount() {
        let t = SlotTable::new(1, 2);
        shared_resident(&t, 0);
        let a = pinned_claim(&t, 0);
        t.release(a).unwrap();
        let (_, generation) = split_ticket(a);
        let shard = pin_shard_of(a).unwrap();
        // A claimer of an earlier load, about to take its pin back.
        t.pins
            .pin(shard, 0)
            .store((generation - 1) << PIN_TAG_SHIFT | 1, Ordering::Relaxed);
        let Claimed::Ready { ticket, .. } = t.claim(0) else {
            panic!("resident")
        };
        assert_eq!(ticket & PINNED, 0, "refcounted: {ticket:#x}");
        assert_eq!(t.word(0).refs(), 1);
        assert_eq!(t.prefetch(1, Origin::Demand), Prefetched::RingFull, "held");
        t.release(ticket).unwrap();
        t.pins.pin(shard, 0).store(0, Ordering::Relaxed);
        assert!(matches!(
            t.prefetch(1, Origin::Demand),
            Prefetched::Queued { .. }
        ));
    }

    /// A small adaptive ring whose best-ranked victims are all pinned SHARED
    /// slots still finds its one idle slot (the take's rounds reach the
    /// scans that read pins), and a retire does too.
    #[test]
    fn pinned_slots_ranked_first_do_not_hide_the_idle_one() {
        let t = adaptive(8, 2, 8);
        // Seven experts of layer 1, claimed by threads at once and held.
        let held: Vec<u64> = (8..15)
            .map(|id| {
                shared_resident(&t, id);
                pinned_claim(&t, id)
            })
            .collect();
        // Then expert 0 of layer 0: used in this visit of layer 0, so the
        // policy would rather evict any of layer 1 to load expert 1.
        decode(&t, &[0]);
        assert!(matches!(
            t.prefetch(1, Origin::Demand),
            Prefetched::Queued { evicted: true, .. }
        ));
        assert!(!t.present(0), "the idle slot was taken");
        load_all(&t);
        // Expert 1 is loaded, never claimed: retire may take it.
        assert!(t.retire_idle_slot().is_some());
        for ticket in held {
            t.release(ticket).unwrap();
        }
    }

    /// SHARED slots rank like any idle slot: a prefetch burst still keeps
    /// its loaded, never-claimed head.
    #[test]
    fn shared_slots_do_not_make_a_burst_evict_its_head() {
        let t = SlotTable::new(3, 10);
        for id in 0..3 {
            shared_resident(&t, id);
        }
        assert!(matches!(
            t.prefetch(3, Origin::Speculative),
            Prefetched::Queued { evicted: true, .. }
        ));
        load_all(&t);
        assert!(matches!(
            t.prefetch(4, Origin::Speculative),
            Prefetched::Queued { evicted: true, .. }
        ));
        load_all(&t);
        assert!(
            t.resident_slot(3).is_some(),
            "the burst evicted its own head"
        );
        assert_eq!((0..3).filter(|&id| t.present(id)).count(), 1);
    }

    /// A ring whose every slot is SHARED and pinned is full (the scan sees
    /// nothing in their words), and the one slot released is found.
    #[test]
    fn a_ring_of_pinned_shared_slots_is_full_until_one_is_released() {
        let n = if cfg!(miri) { 64 } else { 4096 };
        let t = SlotTable::new(n, n + 1);
        for id in 0..n {
            t.prefetch(id, Origin::Demand);
        }
        load_all(&t);
        let held: Vec<u64> = (0..n)
            .map(|id| {
                let Claimed::Ready { ticket, slot, .. } = t.claim(id) else {
                    panic!("resident")
                };
                t.release(ticket).unwrap();
                t.share(slot);
                pinned_claim(&t, id)
            })
            .collect();
        let start = std::time::Instant::now();
        assert_eq!(t.prefetch(n, Origin::Demand), Prefetched::RingFull);
        eprintln!(
            "a full ring of {n} pinned slots: RingFull in {:?}",
            start.elapsed()
        );
        t.release(held[n as usize / 3]).unwrap();
        assert!(matches!(
            t.prefetch(n, Origin::Demand),
            Prefetched::Queued { slot, evicted: true } if slot == n / 3
        ));
        for (id, ticket) in held.into_iter().enumerate() {
            assert_eq!(t.release(ticket).is_ok(), id != n as usize / 3);
        }
    }

    #[test]
    fn retire_waits_for_the_pins_of_a_shared_slot() {
        let t = SlotTable::new(1, 2);
        let first = reload_and_claim(&t, 0);
        t.release(first).unwrap();
        t.share(0);
        let Claimed::Ready { ticket, .. } = t.claim(0) else {
            panic!("resident")
        };
        assert_eq!(t.retire_idle_slot(), None, "pinned");
        assert_eq!(t.word(0).state(), CONSUMED);
        t.release(ticket).unwrap();
        assert_eq!(t.retire_idle_slot(), Some(0));
        assert_eq!(t.word(0).state(), OFFLINE);
        assert_eq!(t.release(ticket), Err(Stale));
        assert!(t.restore_slot(0));
        assert!(!t.word(0).shared());
    }

    /// Threads claiming one expert at once turn its slot SHARED, every
    /// claim sees the expert's own bytes (modelled by the slot's id) while
    /// another thread keeps evicting, and no pin is leaked.
    #[test]
    fn contention_shares_a_slot_and_eviction_respects_its_pins() {
        use std::sync::atomic::AtomicBool;
        // Two slots: the evicting thread's loads take the claimed experts'
        // slots whenever no pin holds them.
        let t = SlotTable::new(2, 64);
        let bytes: Vec<AtomicU32> = (0..2).map(|_| AtomicU32::new(u32::MAX)).collect();
        let work = || {
            while let Some(j) = t.next_job() {
                bytes[j.slot as usize].store(j.id, Ordering::Relaxed);
                t.finish_ok(j);
            }
        };
        let stop = AtomicBool::new(false);
        let shared_seen = AtomicBool::new(false);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        std::thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(|| {
                    let mut claims = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let id = (claims % 2) as u32;
                        claims += 1;
                        match t.claim(id) {
                            Claimed::Ready { slot, ticket, .. } => {
                                if t.word(slot).shared() {
                                    shared_seen.store(true, Ordering::Relaxed);
                                }
                                // Hold it a while, checking it all along.
                                for _ in 0..64 {
                                    let got = bytes[slot as usize].load(Ordering::Relaxed);
                                    assert_eq!(got, id, "a held slot was rewritten");
                                    std::hint::spin_loop();
                                }
                                t.release(ticket).unwrap();
                            }
                            _ => work(),
                        }
                    }
                });
            }
            s.spawn(|| {
                // Cycle other experts through the ring: every slot but the
                // held ones is evicted again and again.
                let mut next = 2u32;
                while std::time::Instant::now() < deadline {
                    let _ = t.prefetch(next, Origin::Demand);
                    work();
                    next = if next == 63 { 2 } else { next + 1 };
                    let enough = if cfg!(miri) { 200 } else { 50_000 };
                    if shared_seen.load(Ordering::Relaxed) && t.evictions() > enough {
                        break;
                    }
                }
                stop.store(true, Ordering::Relaxed);
            });
        });
        assert!(
            shared_seen.load(Ordering::Relaxed),
            "3 threads never contended in 20 s"
        );
        assert!(t.pins_held() == 0, "a pin leaked");
        for slot in 0..2 {
            assert_eq!(t.word(slot).refs(), 0);
        }
    }
}
