//! Victim choice: which idle slot a take evicts, or the elastic ring
//! retires, and the recency and claim hints that choice reads. The scan and
//! the adaptive rank are written over [`CellFields`], so they run on the
//! live cells and, in the tests, on fixed snapshots of them.
//!
//! The recency stamp of a slot is refreshed when its load completes, when
//! it is claimed, and when a prefetch finds it already loaded (so a layer's
//! prefetch of a missing expert does not evict a resident one the layer is
//! about to claim). Every hint here is only a hint: a stale read changes
//! which slot is chosen, never whether the take is safe (the take's
//! compare-exchange on the word it saw decides that).

use super::pins::Skip;
use super::word::{Word, CONSUMED, EMPTY, READY};
use super::{Cell, Origin, SlotTable};
use crate::config::Policy;
use crate::sync::{AtomicU64, Ordering};

/// The shape the adaptive policy needs: dense ids are
/// `layer × experts_per_layer + expert`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Shape {
    pub(crate) policy: Policy,
    pub(crate) experts_per_layer: u32,
    pub(crate) layers: u32,
}

/// Slots a take must not evict, by the id they hold: the pre-warm
/// thread's warm set, or the members of one working set, so that loading a
/// set's later members never evicts its earlier ones while they wait
/// unclaimed (a burst keeps its head: docs/c-api.md "Working sets").
#[derive(Clone, Copy, Debug)]
pub(crate) enum Spare<'a> {
    /// Every idle slot may be taken.
    Nothing,
    /// The ids whose bit `id − base` is set in `bits`.
    Bits { base: u32, bits: &'a [u64] },
    /// The ids `base + e` for each `e` in `experts` (a layer's set too
    /// wide for a bitmap on the stack).
    Experts { base: u32, experts: &'a [u32] },
}

impl Spare<'_> {
    /// Whether a slot holding `id` is spared.
    #[inline]
    pub(super) fn spares(&self, id: u32) -> bool {
        match *self {
            Spare::Nothing => false,
            Spare::Bits { base, bits } => id.checked_sub(base).is_some_and(|i| {
                bits.get(i as usize / 64)
                    .is_some_and(|b| b & (1 << (i % 64)) != 0)
            }),
            Spare::Experts { base, experts } => {
                id.checked_sub(base).is_some_and(|e| experts.contains(&e))
            }
        }
    }
}

/// A loaded slot that no claim has touched is kept from eviction (while a
/// claimed idle slot is left) for this many turns of the ring: `slots ×
/// UNCLAIMED_TURNOVERS` ticks of the LRU clock, which advances on every load,
/// claim and resident prefetch.
const UNCLAIMED_TURNOVERS: u64 = 4;

/// The stamp of a bet that came to nothing (`SlotTable::demote_unclaimed`):
/// the oldest there is, and stale at once. No load or touch gives it (the
/// load clock starts at 1).
pub(super) const DEMOTED: u64 = 0;

/// Low bits of a stamp: the order of touches within one tick of the load
/// clock.
const SEQ_BITS: u32 = 24;

/// Adaptive policy: the group of slots not used in the latest visit of
/// their layer (evicted first).
const STALE_GROUP: u32 = 2;

/// The stamp of a touch at load-clock `tick`: `tick << SEQ_BITS | seq`,
/// where `seq` counts this thread's touches since the clock last moved
/// (saturating). Exact recency order for a thread that claims alone (an
/// engine's decode loop); between threads touching slots in the same tick,
/// an arbitrary but harmless order. No shared write, no timestamp read.
#[inline]
fn next_stamp(tick: u64) -> u64 {
    thread_local! {
        static LAST: std::cell::Cell<(u64, u64)> = const { std::cell::Cell::new((0, 0)) };
    }
    let seq = LAST.with(|last| {
        let (t, n) = last.get();
        let seq = if t == tick {
            (n + 1).min((1 << SEQ_BITS) - 1)
        } else {
            1
        };
        last.set((tick, seq));
        seq
    });
    tick << SEQ_BITS | seq
}

/// The stamp of a load taken at load-clock `now`: sequence 0, older than
/// this thread's later touches in the same tick, newer than anything
/// touched before the load.
#[inline]
pub(super) fn load_stamp(now: u64) -> u64 {
    now << SEQ_BITS
}

/// What the victim choice reads of one slot's cell, each field when it
/// needs it: the live [`Cell`] loads its atomics (Relaxed: all hints),
/// a test's snapshot gives fixed values.
pub(super) trait CellFields {
    /// The state word.
    fn word(&self) -> Word;
    /// The recency stamp ([`next_stamp`]).
    fn stamp(&self) -> u64;
    /// The dense id of the current or last load.
    fn id(&self) -> u32;
    /// The layer of that id.
    fn layer(&self) -> u32;
    /// The claims of that id so far (adaptive policy).
    fn count(&self) -> u32;
}

impl CellFields for Cell {
    #[inline(always)]
    fn word(&self) -> Word {
        self.word.load(Ordering::Relaxed)
    }
    #[inline(always)]
    fn stamp(&self) -> u64 {
        self.stamp.load(Ordering::Relaxed)
    }
    #[inline(always)]
    fn id(&self) -> u32 {
        self.id.load(Ordering::Relaxed)
    }
    #[inline(always)]
    fn layer(&self) -> u32 {
        self.layer.load(Ordering::Relaxed)
    }
    #[inline(always)]
    fn count(&self) -> u32 {
        self.count.load(Ordering::Relaxed)
    }
}

/// The scan of [`SlotTable::victim`] over `cells`: the idle slot with the
/// biggest `rank(cell, tick)`, the least recently used among equals, from
/// the claimed (or stale unclaimed: READY and last used before load-clock
/// `stale_before`) slots if any, else from the unclaimed; an EMPTY slot at
/// once. Leaves out the slots `spare` names, with `spares_demand` the
/// unclaimed demand loads (READY with `D`), and, with `SKIPS`, the SHARED
/// slots `passes_over` names. One pass over the cells, one cache line each.
#[inline(always)]
pub(super) fn scan<C: CellFields, const SKIPS: bool>(
    cells: &[C],
    spare: Spare<'_>,
    spares_demand: bool,
    stale_before: u64,
    passes_over: impl Fn(u32) -> bool,
    rank: impl Fn(&C, u64) -> u64,
) -> Option<(u32, Word)> {
    let unclaimed_demand = |w: Word| w.state() == READY && w.demand();
    // One loop for each kind of exclusion, so the common ones (nothing
    // spared; a speculative take sparing demand loads) test no more than
    // they need and keep the loop's locals in registers.
    match (spare, spares_demand) {
        (Spare::Nothing, false) => {
            scan_leaving::<C, SKIPS>(cells, |_, _| false, stale_before, passes_over, rank)
        }
        (Spare::Nothing, true) => scan_leaving::<C, SKIPS>(
            cells,
            |_, w| unclaimed_demand(w),
            stale_before,
            passes_over,
            rank,
        ),
        (spare, sd) => scan_leaving::<C, SKIPS>(
            cells,
            // The id of an idle slot is read after its word; a stale id (a
            // take racing the scan) only affects this choice, and the
            // take's compare-exchange on the word seen here fails if the
            // slot changed.
            move |cell, w| (sd && unclaimed_demand(w)) || spare.spares(cell.id()),
            stale_before,
            passes_over,
            rank,
        ),
    }
}

/// [`scan`] with its exclusions as one test: `leave_out(cell, word)` for an
/// idle READY or CONSUMED slot that must not be taken. Never inlined: each
/// kind of exclusion gets a loop of its own, whose locals stay in
/// registers (inlined into one function, they spilled).
#[inline(never)]
fn scan_leaving<C: CellFields, const SKIPS: bool>(
    cells: &[C],
    leave_out: impl Fn(&C, Word) -> bool,
    stale_before: u64,
    passes_over: impl Fn(u32) -> bool,
    rank: impl Fn(&C, u64) -> u64,
) -> Option<(u32, Word)> {
    // Bigger (rank, !stamp), better victim; slot u32::MAX = none yet (its
    // word a placeholder). Plain locals, one set per class, so the loop
    // keeps them in registers.
    let none = Word::empty(0);
    let (mut c_rank, mut c_age, mut c_slot, mut c_word) = (0u64, 0u64, u32::MAX, none);
    let (mut u_rank, mut u_age, mut u_slot, mut u_word) = (0u64, 0u64, u32::MAX, none);
    for (i, cell) in cells.iter().enumerate() {
        let w = cell.word();
        if w.is_held() || (SKIPS && w.shared() && passes_over(i as u32)) {
            continue;
        }
        let state = w.state();
        if state == EMPTY {
            return Some((i as u32, w));
        }
        if (state != READY && state != CONSUMED) || leave_out(cell, w) {
            continue;
        }
        let stamp = cell.stamp();
        let tick = stamp >> SEQ_BITS;
        let r = rank(cell, tick);
        let age = !stamp;
        // (a demoted bet counts as stale at once: `DEMOTED`)
        if state == READY && stamp != DEMOTED && tick >= stale_before {
            if u_slot == u32::MAX || (r, age) > (u_rank, u_age) {
                (u_rank, u_age, u_slot, u_word) = (r, age, i as u32, w);
            }
        } else if c_slot == u32::MAX || (r, age) > (c_rank, c_age) {
            (c_rank, c_age, c_slot, c_word) = (r, age, i as u32, w);
        }
    }
    if c_slot != u32::MAX {
        Some((c_slot, c_word))
    } else if u_slot != u32::MAX {
        Some((u_slot, u_word))
    } else {
        None
    }
}

/// Under the adaptive policy, how good a victim the idle slot `cell` is
/// when a slot is needed for an expert of layer `loading` of `layers`:
/// (group, rank within the group), bigger first; ties go to the least
/// recently used. The slot was last used at load-clock `tick`;
/// `visit_start[layer]` is the load clock when the latest visit of that
/// layer began ([`SlotTable::visit_start`]).
///
/// A decode step walks the layers in order, so an expert of layer
/// `held` is needed next when the step reaches `held` again, `held −
/// loading` layers ahead, going round the loop; and routing persists
/// from token to token, so an expert used in the latest visit of its
/// layer is the likelier to be used at the next. The groups, evicted
/// first to last:
///
/// 2. ([`STALE_GROUP`]) Experts not used in the latest visit of their
///    layer, the least often claimed first (their count of claims, this
///    load's and earlier loads': [`SlotTable::claims`]). Routing is skewed:
///    some experts are chosen far more often than others.
/// 1. Experts used in the latest visit of their layer, and those of the
///    layer being loaded (used in an earlier visit), the layer that
///    comes last in the loop first: the layer being loaded (its next use
///    is a whole loop away), then the layer just finished, and so on.
///    This is what LRU gets wrong when the ring is smaller than a step's
///    working set: the layer just finished is its most recent.
/// 0. Experts of the layer being loaded used in this visit: asked for in
///    this very step, about to be claimed.
#[inline]
pub(super) fn adaptive_rank(
    cell: &impl CellFields,
    loading: u32,
    tick: u64,
    visit_start: &[AtomicU64],
    layers: u32,
) -> (u32, u32) {
    let held = cell.layer();
    let used_in_latest_visit = visit_start
        .get(held as usize)
        .is_some_and(|v| tick >= v.load(Ordering::Relaxed));
    if held == loading {
        // Used since this visit of the layer began: this step's.
        return if used_in_latest_visit {
            (0, 0)
        } else {
            (1, layers)
        };
    }
    if !used_in_latest_visit {
        return (STALE_GROUP, u32::MAX - cell.count());
    }
    let distance = if held > loading {
        // held, loading < layers, so this is (held − loading) mod
        // layers, without a division.
        held - loading
    } else {
        held + layers - loading
    };
    (1, distance)
}

impl SlotTable {
    /// The idle slot to evict for a load of `id`, by a scan of the cells (an
    /// EMPTY slot at once). Under [`Policy::Lru`], the least recently used;
    /// under [`Policy::Adaptive`], see [`adaptive_rank`]. A load that is not
    /// for demand never takes a demand load nobody has claimed yet (READY
    /// with `D`): speculation never evicts what the engine is about to
    /// claim.
    #[inline]
    pub(super) fn victim(
        &self,
        id: u32,
        origin: Origin,
        spare: Spare<'_>,
        skip: &Skip,
    ) -> Option<(u32, Word)> {
        let now = self.clock.load(Ordering::Relaxed);
        // A slot loaded but never claimed (READY) is the head of a prefetch
        // burst the engine is about to claim: it is taken only when no idle
        // claimed slot (CONSUMED) is left, or when it has waited unclaimed
        // longer than UNCLAIMED_TURNOVERS turns of the ring (loads), so that
        // speculation that never came true does not pin the ring.
        // (A demoted bet, `DEMOTED`, is stale from the first turn on: the
        // scan tells it apart.)
        let stale_before = now.saturating_sub(UNCLAIMED_TURNOVERS * u64::from(self.slots()));
        let layer = id / self.shape.experts_per_layer;
        let adaptive = |cell: &Cell, tick| {
            let (group, rank) =
                adaptive_rank(cell, layer, tick, &self.visit_start, self.shape.layers);
            u64::from(group) << 32 | u64::from(rank)
        };
        let passes_over = |slot| self.passes_over(slot, skip);
        let cells = &self.cells[..];
        let sd = origin != Origin::Demand;
        // A take's first scan (nearly every scan) has nothing to pass over:
        // its loop has no SHARED test at all.
        match (self.shape.policy, skip.is_empty()) {
            (Policy::Lru, true) => {
                scan::<_, false>(cells, spare, sd, stale_before, passes_over, |_, _| 0)
            }
            (Policy::Lru, false) => {
                scan::<_, true>(cells, spare, sd, stale_before, passes_over, |_, _| 0)
            }
            (Policy::Adaptive, true) => {
                scan::<_, false>(cells, spare, sd, stale_before, passes_over, adaptive)
            }
            (Policy::Adaptive, false) => {
                scan::<_, true>(cells, spare, sd, stale_before, passes_over, adaptive)
            }
        }
    }

    /// Marks `slot` as used now. The stamp lives on the slot's own cache
    /// line (which a claim's compare-exchange owns already) and the clock is
    /// only read, so hits on resident experts write no shared line.
    #[inline]
    pub(super) fn touch(&self, slot: u32) {
        let now = self.clock.load(Ordering::Relaxed);
        self.cells[slot as usize]
            .stamp
            .store(next_stamp(now), Ordering::Relaxed);
    }

    /// Marks `slot` as used now by a claim: [`SlotTable::touch`], and under
    /// the adaptive policy one more claim in its count. The count is
    /// written with a plain load and store (a lost increment only blurs a
    /// hint).
    #[inline]
    pub(super) fn touch_claimed(&self, slot: u32) {
        self.touch(slot);
        if self.shape.policy == Policy::Adaptive {
            let count = &self.cells[slot as usize].count;
            count.store(
                count.load(Ordering::Relaxed).saturating_add(1),
                Ordering::Relaxed,
            );
        }
    }

    /// Whether `slot` was last touched in the load clock's current tick.
    #[inline]
    pub(super) fn stamp_is_current(&self, slot: u32) -> bool {
        let now = self.clock.load(Ordering::Relaxed);
        self.cells[slot as usize].stamp.load(Ordering::Relaxed) >> SEQ_BITS == now
    }

    /// Adaptive policy: a load of `id`, of another layer than the last
    /// load's, starts a visit of its layer: its experts used before now are
    /// stale (the victim scan sees that).
    #[inline]
    pub(super) fn start_visit(&self, id: u32) {
        if self.shape.policy == Policy::Adaptive {
            let layer = id / self.shape.experts_per_layer;
            if self.last_layer.swap(layer, Ordering::Relaxed) != layer {
                if let Some(v) = self.visit_start.get(layer as usize) {
                    v.store(self.clock.load(Ordering::Relaxed), Ordering::Relaxed);
                }
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::super::tests::{adaptive, decode, load_all};
    use super::super::word::{Origin, QUEUED, READING};
    use super::super::{Claimed, Prefetched};
    use super::*;

    /// A cell as the scan saw it.
    #[derive(Clone, Copy)]
    struct Seen {
        word: Word,
        stamp: u64,
        id: u32,
        layer: u32,
        count: u32,
    }

    impl CellFields for Seen {
        fn word(&self) -> Word {
            self.word
        }
        fn stamp(&self) -> u64 {
            self.stamp
        }
        fn id(&self) -> u32 {
            self.id
        }
        fn layer(&self) -> u32 {
            self.layer
        }
        fn count(&self) -> u32 {
            self.count
        }
    }

    /// A slot of `id` (layer `id / 4`) in `state`, last used at `tick`.
    fn seen(state: u64, id: u32, tick: u64) -> Seen {
        let loaded = Word::new(QUEUED, 1, Origin::Demand).with_state(state);
        Seen {
            word: loaded,
            stamp: load_stamp(tick),
            id,
            layer: id / 4,
            count: 0,
        }
    }

    fn held(mut s: Seen) -> Seen {
        s.word = s.word.plus_ref();
        s
    }

    fn lru(cells: &[Seen], stale_before: u64) -> Option<u32> {
        scan::<_, false>(
            cells,
            Spare::Nothing,
            false,
            stale_before,
            |_| false,
            |_, _| 0,
        )
        .map(|(i, _)| i)
    }

    #[test]
    fn an_empty_slot_is_taken_at_once() {
        let mut cells = vec![seen(CONSUMED, 0, 1), seen(CONSUMED, 1, 9)];
        cells.push(Seen {
            word: Word::empty(3),
            ..seen(EMPTY, 2, 50)
        });
        cells.push(seen(CONSUMED, 3, 0));
        let found = scan::<_, false>(&cells, Spare::Nothing, false, 0, |_| false, |_, _| 0);
        assert_eq!(found, Some((2, Word::empty(3))), "the word seen comes back");
    }

    #[test]
    fn lru_takes_the_oldest_idle_claimed_slot() {
        let cells = [
            seen(CONSUMED, 0, 5),
            held(seen(CONSUMED, 1, 1)),
            seen(QUEUED, 2, 0),
            seen(READING, 3, 0),
            seen(CONSUMED, 4, 3),
            seen(READY, 5, 2),
        ];
        // 1 is held, 2 and 3 are loading, 5 is unclaimed and fresh.
        assert_eq!(lru(&cells, 0), Some(4));
        // Within one tick, the lower sequence is the older.
        let mut same_tick = [seen(CONSUMED, 0, 3), seen(CONSUMED, 1, 3)];
        same_tick[0].stamp += 2;
        same_tick[1].stamp += 1;
        assert_eq!(lru(&same_tick, 0), Some(1));
    }

    #[test]
    fn unclaimed_loads_go_last_until_stale() {
        let cells = [seen(READY, 0, 2), seen(CONSUMED, 1, 8)];
        assert_eq!(lru(&cells, 0), Some(1), "the burst's head is spared");
        assert_eq!(lru(&cells, 3), Some(0), "stale: ranked with the claimed");
        assert_eq!(lru(&cells[..1], 0), Some(0), "no claimed slot left");
        assert_eq!(lru(&[held(seen(CONSUMED, 0, 0))], 0), None);
    }

    #[test]
    fn spared_ids_and_passed_over_shared_slots_are_left_out() {
        let mut cells = [
            seen(CONSUMED, 0, 1),
            seen(CONSUMED, 65, 2),
            seen(CONSUMED, 2, 3),
        ];
        let spare = [1u64, 1 << 1];
        let found = scan::<_, false>(
            &cells,
            Spare::Bits {
                base: 0,
                bits: &spare,
            },
            false,
            0,
            |_| false,
            |_, _| 0,
        );
        assert_eq!(found.map(|(i, _)| i), Some(2), "ids 0 and 65 spared");
        cells[0].word = cells[0].word.with_shared();
        let asked = std::cell::Cell::new(Vec::new());
        let pass = |slot| {
            let mut v = asked.take();
            v.push(slot);
            asked.set(v);
            true
        };
        let found = scan::<_, true>(&cells, Spare::Nothing, false, 0, pass, |_, _| 0);
        assert_eq!(found.map(|(i, _)| i), Some(1));
        assert_eq!(asked.take(), [0], "only SHARED slots are asked about");
        let found = scan::<_, false>(&cells, Spare::Nothing, false, 0, |_| true, |_, _| 0);
        assert_eq!(found.map(|(i, _)| i), Some(0), "a first scan skips none");
    }

    /// A working set's members are spared by bitmap or by list (relative to
    /// the layer's first id); a take that is not for demand passes over an
    /// unclaimed demand load, a demand take does not.
    #[test]
    fn set_members_and_unclaimed_demand_loads_are_spared() {
        let cells = [seen(READY, 8, 1), seen(READY, 9, 2), seen(CONSUMED, 10, 3)];
        let bits = [0b011u64];
        let by_bits = Spare::Bits {
            base: 8,
            bits: &bits,
        };
        let by_list = Spare::Experts {
            base: 8,
            experts: &[1, 0],
        };
        for spare in [by_bits, by_list] {
            let found = scan::<_, false>(&cells, spare, false, 0, |_| false, |_, _| 0);
            assert_eq!(found.map(|(i, _)| i), Some(2), "{spare:?}");
            assert!(!spare.spares(7) && !spare.spares(10) && spare.spares(9));
        }
        // Slot 0 is a demand load nobody claimed; slot 1 a speculative one.
        let mut cells = [seen(READY, 0, 1), seen(READY, 1, 2)];
        cells[1].word = cells[1].word.without_origin();
        assert!(cells[0].word.demand() && !cells[1].word.demand());
        let take = |cells: &[Seen], spares_demand| {
            scan::<_, false>(cells, Spare::Nothing, spares_demand, 0, |_| false, |_, _| 0)
                .map(|(i, _)| i)
        };
        assert_eq!(
            take(&cells, false),
            Some(0),
            "demand takes the least recent"
        );
        assert_eq!(
            take(&cells, true),
            Some(1),
            "speculation spares the demand load"
        );
        cells[1].word = cells[1].word.with_demand();
        assert_eq!(
            take(&cells, true),
            None,
            "only unclaimed demand loads are left"
        );
    }

    #[test]
    fn a_bigger_rank_wins_over_age() {
        let cells = [seen(CONSUMED, 0, 1), seen(CONSUMED, 1, 9)];
        let by_id = |c: &Seen, _| u64::from(c.id);
        let found = scan::<_, false>(&cells, Spare::Nothing, false, 0, |_| false, by_id);
        assert_eq!(found.map(|(i, _)| i), Some(1));
    }

    /// The adaptive groups on fixed cells: 4 layers, loading layer 1 whose
    /// visit began at tick 10 (layer 0's at 6, layer 3's at 8, layer 2's
    /// at 20).
    #[test]
    fn adaptive_rank_groups_and_distances() {
        let visits: Vec<AtomicU64> = [6, 10, 20, 8].map(AtomicU64::new).into();
        let rank = |layer, tick, count| {
            let cell = Seen {
                layer,
                count,
                ..seen(CONSUMED, 0, tick)
            };
            adaptive_rank(&cell, 1, tick, &visits, 4)
        };
        assert_eq!(rank(1, 12, 0), (0, 0), "this step's");
        assert_eq!(rank(1, 9, 0), (1, 4), "the layer being loaded, earlier");
        assert_eq!(
            rank(2, 12, 7),
            (STALE_GROUP, u32::MAX - 7),
            "not in its visit"
        );
        assert_eq!(rank(2, 25, 0), (1, 1), "next layer: needed soonest");
        assert_eq!(rank(3, 8, 0), (1, 2));
        assert_eq!(rank(0, 7, 0), (1, 3), "just finished: needed last");
        assert!(rank(2, 12, 3) > rank(2, 12, 7), "the rarely claimed first");
        assert_eq!(
            rank(9, 30, 5),
            (STALE_GROUP, u32::MAX - 5),
            "a layer with no visit is stale"
        );
    }

    #[test]
    fn prefetching_a_resident_expert_makes_it_recent() {
        let t = SlotTable::new(2, 10);
        t.prefetch(0, Origin::Demand);
        t.prefetch(1, Origin::Demand);
        load_all(&t);
        // 0 is the older; a layer's prefetch asks for 0 (resident) and 2.
        assert_eq!(t.prefetch(0, Origin::Demand), Prefetched::Present);
        assert!(matches!(
            t.prefetch(2, Origin::Demand),
            Prefetched::Queued { evicted: true, .. }
        ));
        assert!(t.present(0), "the expert just asked for was kept");
        assert!(!t.present(1), "the least recently used was evicted");
    }

    #[test]
    fn lru_evicts_the_oldest_idle_slot() {
        let t = SlotTable::new(3, 10);
        for id in 0..3 {
            t.prefetch(id, Origin::Speculative);
        }
        load_all(&t);
        // Claim 1, then 0 and 2 (refreshing them) and release; 1 is now the
        // least recently used. (A slot never claimed would be spared while a
        // claimed one is idle: see a_prefetch_burst_does_not_evict_its_own_head.)
        for id in [1, 0, 2] {
            let Claimed::Ready { ticket, .. } = t.claim(id) else {
                panic!()
            };
            t.release(ticket).unwrap();
        }
        assert!(matches!(
            t.prefetch(5, Origin::Speculative),
            Prefetched::Queued { evicted: true, .. }
        ));
        assert!(!t.present(1), "least recently used was evicted");
        assert!(t.present(0) && t.present(2) && t.present(5));
    }

    /// A prefetch burst fills the ring; the engine claims and releases its
    /// first expert; the next prefetch must evict that claimed slot, not
    /// the loaded-but-unclaimed head of the burst.
    #[test]
    fn a_prefetch_burst_does_not_evict_its_own_head() {
        let t = SlotTable::new(4, 10);
        for id in 0..4 {
            t.prefetch(id, Origin::Demand);
        }
        load_all(&t);
        let Claimed::Ready { ticket, .. } = t.claim(0) else {
            panic!()
        };
        t.release(ticket).unwrap();
        assert!(matches!(
            t.prefetch(4, Origin::Demand),
            Prefetched::Queued { evicted: true, .. }
        ));
        load_all(&t);
        assert!(
            matches!(t.claim(1), Claimed::Ready { .. }),
            "B was evicted before it was ever claimed"
        );
        assert!(t.next_job().is_none(), "claiming B read nothing");
        assert!(!t.present(0), "the claimed, released A made room");
    }

    /// Speculation that never came true does not pin the ring: an unclaimed
    /// slot is spared only for UNCLAIMED_TURNOVERS turns of the ring (loads);
    /// after that it is evicted before a recent claimed one.
    #[test]
    fn stale_unclaimed_loads_are_evicted() {
        let t = SlotTable::new(2, 100);
        t.prefetch(0, Origin::Speculative);
        load_all(&t);
        // Stream experts 1, 2, ... through the other slot, claiming each:
        // while 0 is fresh, each load evicts the claimed one, not 0.
        let turnover = UNCLAIMED_TURNOVERS * 2 + 1;
        for id in 1..=turnover {
            assert!(matches!(
                t.prefetch(id as u32, Origin::Demand),
                Prefetched::Queued { .. }
            ));
            load_all(&t);
            assert!(t.present(0), "load {id}: the unclaimed 0 was spared");
            let Claimed::Ready { ticket, .. } = t.claim(id as u32) else {
                panic!()
            };
            t.release(ticket).unwrap();
        }
        // Now 0 has waited more than a turnover of loads: it goes first.
        let last = turnover as u32;
        t.prefetch(last + 1, Origin::Demand);
        assert!(!t.present(0), "the stale, never-claimed 0 was evicted");
        assert!(t.present(last), "the recently claimed expert was kept");
    }

    /// The layer loop: with 3 slots and 4 layers (2 experts each, ids
    /// `layer × 2 + expert`), loading layer 3 after layers 0, 1 and 2 evicts
    /// layer 2's expert (needed again last) under the adaptive policy, and
    /// layer 0's (the oldest, needed again first) under LRU.
    #[test]
    fn adaptive_evicts_the_layer_just_finished_first() {
        for (policy, evicted) in [(Policy::Adaptive, 4), (Policy::Lru, 0)] {
            let t = SlotTable::with_shape(
                3,
                8,
                Shape {
                    policy,
                    experts_per_layer: 2,
                    layers: 4,
                },
            );
            decode(&t, &[0, 2, 4, 6]);
            assert_eq!(t.policy(), policy);
            for id in [0, 2, 4, 6] {
                assert_eq!(t.present(id), id != evicted, "{policy:?}: id {id}");
            }
        }
    }

    /// Whatever the policy ranks first, a claimed slot is never taken: with
    /// layer 2's expert claimed, loading layer 3 takes the next best.
    #[test]
    fn adaptive_never_evicts_a_claimed_slot() {
        let t = adaptive(3, 4, 2);
        decode(&t, &[0, 2, 4]);
        let Claimed::Ready { ticket, .. } = t.claim(4) else {
            panic!()
        };
        t.prefetch(6, Origin::Demand);
        load_all(&t);
        assert!(t.present(4), "the claimed expert stayed");
        assert!(t.present(0) && !t.present(2), "layer 1 (next best) went");
        t.release(ticket).unwrap();
        let t = adaptive(1, 2, 2);
        decode(&t, &[0]);
        let Claimed::Ready { .. } = t.claim(0) else {
            panic!()
        };
        assert_eq!(t.prefetch(2, Origin::Demand), Prefetched::RingFull);
    }

    /// Among experts not used in their layer's latest visit, the least often
    /// claimed goes first (LRU would take the least recently used).
    #[test]
    fn adaptive_evicts_the_rarely_claimed_first() {
        for (policy, evicted) in [(Policy::Adaptive, 5), (Policy::Lru, 4)] {
            let t = SlotTable::with_shape(
                4,
                12,
                Shape {
                    policy,
                    experts_per_layer: 4,
                    layers: 3,
                },
            );
            // Layer 1: 4 claimed six times, 5 twice (5 the more recent).
            decode(&t, &[4, 5]);
            for id in [4, 4, 4, 4, 4, 5] {
                let Claimed::Ready { ticket, .. } = t.claim(id) else {
                    panic!()
                };
                t.release(ticket).unwrap();
            }
            // Layer 2, then a visit of layer 1 without 4 and 5, then layer 0.
            decode(&t, &[8, 6, 0]);
            for id in [0, 4, 5, 6, 8] {
                assert_eq!(t.present(id), id != evicted, "{policy:?}: id {id}");
            }
        }
    }

    /// A layer's experts asked for in the same step are kept while its
    /// other experts load: prefetching layer 0's experts 0 (resident) and 1
    /// evicts layer 1's expert, not 0, though 0's layer is the one being
    /// loaded.
    #[test]
    fn adaptive_keeps_the_experts_of_the_current_step() {
        let t = adaptive(2, 2, 2);
        decode(&t, &[0, 2]);
        assert_eq!(t.prefetch(0, Origin::Demand), Prefetched::Present);
        assert!(matches!(
            t.prefetch(1, Origin::Demand),
            Prefetched::Queued { evicted: true, .. }
        ));
        assert!(t.present(0) && !t.present(2));
    }

    /// The adaptive policy keeps the never-claimed rule: a prefetch burst
    /// does not evict its own head.
    #[test]
    fn adaptive_spares_a_prefetch_burst() {
        let t = adaptive(4, 1, 10);
        for id in 0..4 {
            t.prefetch(id, Origin::Demand);
        }
        load_all(&t);
        let Claimed::Ready { ticket, .. } = t.claim(0) else {
            panic!()
        };
        t.release(ticket).unwrap();
        t.prefetch(4, Origin::Demand);
        load_all(&t);
        assert!(!t.present(0), "the claimed, released 0 made room");
        for id in 1..5 {
            assert!(t.present(id), "{id} kept");
        }
    }
}
