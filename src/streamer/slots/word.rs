//! The state word and the tickets: the bit layout of a slot's one atomic,
//! the typed view of it that the other rooms use ([`Word`],
//! [`AtomicWord`]), and the ticket encoding. Nothing outside this file reads
//! or writes the word's bits.
//!
//! # The state word
//!
//! Each slot has one `AtomicU64`; every transition is a compare-exchange of
//! the whole word, so a reader sees state, identity, generation and refcount
//! from the same instant:
//!
//! ```text
//!  63  60 59 58                     16 15      5  4   3   2  0
//! +------+--+------------------------+---------+---+---+-----+
//! |  0   |S |       generation       | refcount| P | D |state|
//! +------+--+------------------------+---------+---+---+-----+
//! ```
//!
//! - `state` (3 bits): EMPTY, QUEUED, READING, READY, CONSUMED, OFFLINE,
//!   EVICTING.
//! - `D` (1 bit): a demand read was needed for this load (it was queued as
//!   demand, promoted by a demand prefetch, or a claim waited for it). The
//!   first claim of the load reads it to set `hit`, and clears it.
//! - `P` (1 bit): the load was queued by the pre-warm thread (it counts in
//!   `reads_prewarm` unless `D` was set by then). Cleared with `D`.
//! - `refcount` (11 bits): claims not yet released, except pinned ones
//!   (see "Shared mode" in `pins.rs`). Only READY/CONSUMED slots have a
//!   nonzero refcount.
//! - `generation` (43 bits): bumped each time the slot is taken for a new
//!   load, running through `1..=GEN_MAX` and then back to 1. A ticket is
//!   `generation << 20 | slot`, so a ticket from an earlier load is stale
//!   until the slot has been reloaded `GEN_MAX` = 2^43 − 2 times: 8.8
//!   trillion loads, over two centuries at a thousand reloads of that one
//!   slot per second. Never 0 for a loaded slot and never all ones, so no
//!   ticket is 0 and none collides with the map's NONE/RESERVED markers.
//! - `S` (1 bit): the load is SHARED (see "Shared mode" in `pins.rs`).
//!
//! The expert a slot holds is not in the word: the generation identifies
//! the load, and the identity map's entry for an expert names the
//! (slot, generation) that was taken for it, so "the slot's word has the
//! generation the map entry names" means "the slot holds that expert".
//! `ids[slot]` keeps the id for the worker (which reads it) and for
//! eviction (which clears the old id's map entry).
//!
//! Legal transitions (anything else is a bug):
//!
//! ```text
//! EMPTY/READY/CONSUMED (refcount 0) --take (prefetch)---------> QUEUED   gen+1, new id
//! QUEUED   --promote (demand prefetch or waiting claim)-------> QUEUED   D set
//! QUEUED   --begin (a worker popped it, gen matches)----------> READING
//! READING  --claim finds it loading---------------------------> READING  D set
//! READING  --finish ok (Release: publishes the slot's bytes)--> READY
//! READING  --finish failed------------------------------------> EMPTY    id kept
//! READY    --claim (refcount+1, D cleared)--------------------> CONSUMED
//! CONSUMED --claim (refcount+1) / release (refcount−1)--------> CONSUMED
//! CONSUMED --claim that lost a compare-exchange to another----> CONSUMED S set
//! CONSUMED, S, refcount 0 --seize (eviction or retire)--------> EVICTING
//! EVICTING --seize finds pins---------------------------------> CONSUMED S set
//! EVICTING --take or retire, no pins--------------------------> QUEUED / OFFLINE
//! EMPTY/READY/CONSUMED (refcount 0) --retire (elastic)--------> OFFLINE  gen+1
//! OFFLINE  --restore (elastic)--------------------------------> EMPTY
//! ```
//!
//! A slot with refcount > 0 is never taken, so its bytes never change while a
//! claim holds them. CONSUMED with refcount 0 means *retained*: its identity
//! stays in the map and a later claim is a hit with no read.
//!
//! # Tickets
//!
//! A claim's ticket names the load it holds: `generation << 20 | slot` for a
//! refcounted claim ([`ticket`]), `1 << 63 | shard << 59 | (generation mod
//! 2^39) << 20 | slot` for a pinned one ([`pinned_ticket`]; "Shared mode" in
//! `pins.rs`). A map entry is the ticket of the load taken for its id.

use crate::sync::{AtomicU64, Ordering};

pub(crate) const EMPTY: u64 = 0;
pub(crate) const QUEUED: u64 = 1;
pub(crate) const READING: u64 = 2;
pub(crate) const READY: u64 = 3;
pub(crate) const CONSUMED: u64 = 4;
/// Taken out of use by the elastic ring (the table's module doc,
/// "Retirement").
pub(crate) const OFFLINE: u64 = 5;
/// A SHARED slot whose evictor is counting its pins ("Shared mode" in
/// `pins.rs`). Only that evictor writes the word until it leaves this state.
pub(crate) const EVICTING: u64 = 6;

const STATE_MASK: u64 = 0b111;
const DEMAND: u64 = 1 << 3;
const PREWARM: u64 = 1 << 4;
const ORIGIN_BITS: u64 = DEMAND | PREWARM;
const REF_SHIFT: u32 = 5;
const REF_BITS: u32 = 11;
const REF_ONE: u64 = 1 << REF_SHIFT;
const REF_MASK: u64 = ((1 << REF_BITS) - 1) << REF_SHIFT;
/// Most refcounted claims one slot can hold at once.
pub(crate) const MAX_REFS: u64 = (1 << REF_BITS) - 1;
const GEN_SHIFT: u32 = 16;
const GEN_BITS: u32 = 43;
const GEN_MASK: u64 = ((1 << GEN_BITS) - 1) << GEN_SHIFT;
/// The last generation before the count starts again at 1 (all ones is
/// never used, see the module doc).
pub(crate) const GEN_MAX: u64 = (1 << GEN_BITS) - 2;
/// Shared mode: claims of this load pin the slot in per-thread counters
/// instead of raising the word's refcount ("Shared mode" in `pins.rs`).
const SHARED: u64 = 1 << (GEN_SHIFT + GEN_BITS);
/// Ticket bit: a pinned claim (shared mode). Never set in a map entry or in
/// the ticket of a refcounted claim, whose generation is below 2^43.
pub(super) const PINNED: u64 = 1 << 63;
/// Bits of a pinned ticket that hold the pin shard, above its generation.
pub(super) const PIN_SHARD_SHIFT: u32 = 59;
/// Most pin shards a table has (4 ticket bits).
pub(super) const MAX_PIN_SHARDS: usize = 16;
/// Bits of a pinned ticket's generation: the low 39 bits of the slot's.
pub(super) const PIN_GEN_MASK: u64 = (1 << (PIN_SHARD_SHIFT - TICKET_SLOT_BITS)) - 1;
/// Bits of a ticket that hold the slot index.
const TICKET_SLOT_BITS: u32 = 20;
/// Most slots a table may have: ticket slot fields are 20 bits. The vault
/// format's limit on expert ids (`MAX_EXPERT_IDS`) is the same, and a ring
/// never has more slots than the vault has entries.
pub(crate) const MAX_SLOTS: u64 = 1 << TICKET_SLOT_BITS;

/// Who asked for a load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Origin {
    /// The engine needs it now (a demand prefetch, or a claim).
    Demand,
    /// A bet on a later layer or token.
    Speculative,
    /// The pre-warm thread.
    Prewarm,
}

/// The fields of a state word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Word(u64);

impl Word {
    /// The word of a load just taken: `state` (QUEUED), for `origin`,
    /// refcount 0, not SHARED.
    #[inline]
    pub(super) fn new(state: u64, generation: u64, origin: Origin) -> Word {
        debug_assert!((1..=GEN_MAX).contains(&generation));
        Word(
            state
                | match origin {
                    Origin::Demand => DEMAND,
                    Origin::Speculative => 0,
                    Origin::Prewarm => PREWARM,
                }
                | (generation << GEN_SHIFT),
        )
    }
    /// An EMPTY word at `generation` (0 before the slot's first load).
    #[inline]
    pub(super) fn empty(generation: u64) -> Word {
        Word(EMPTY | (generation << GEN_SHIFT))
    }
    /// The OFFLINE word of a slot retired at `generation`.
    #[inline]
    pub(super) fn offline(generation: u64) -> Word {
        Word(OFFLINE | (generation << GEN_SHIFT))
    }
    #[inline]
    pub(crate) fn state(self) -> u64 {
        self.0 & STATE_MASK
    }
    #[inline]
    pub(crate) fn demand(self) -> bool {
        self.0 & DEMAND != 0
    }
    /// Who the load is for: demand wins over pre-warm.
    #[inline]
    pub(crate) fn origin(self) -> Origin {
        if self.0 & DEMAND != 0 {
            Origin::Demand
        } else if self.0 & PREWARM != 0 {
            Origin::Prewarm
        } else {
            Origin::Speculative
        }
    }
    #[inline]
    pub(crate) fn refs(self) -> u64 {
        (self.0 & REF_MASK) >> REF_SHIFT
    }
    /// Some refcounted claim holds the slot (refcount > 0).
    #[inline]
    pub(super) fn is_held(self) -> bool {
        self.0 & REF_MASK != 0
    }
    /// Takable: EMPTY, READY or CONSUMED with refcount 0 (a SHARED one may
    /// still be pinned: only a seize can tell).
    #[inline]
    pub(super) fn is_idle(self) -> bool {
        matches!(self.state(), EMPTY | READY | CONSUMED) && !self.is_held()
    }
    /// Holds loaded data: READY or CONSUMED.
    #[inline]
    pub(super) fn is_loaded(self) -> bool {
        matches!(self.state(), READY | CONSUMED)
    }
    #[inline]
    pub(crate) fn generation(self) -> u64 {
        (self.0 & GEN_MASK) >> GEN_SHIFT
    }
    #[inline]
    pub(super) fn with_state(self, state: u64) -> Word {
        Word((self.0 & !STATE_MASK) | state)
    }
    /// `D` set: a demand read is needed for this load.
    #[inline]
    pub(super) fn with_demand(self) -> Word {
        Word(self.0 | DEMAND)
    }
    /// `D` and `P` cleared.
    #[inline]
    pub(super) fn without_origin(self) -> Word {
        Word(self.0 & !ORIGIN_BITS)
    }
    /// `S` set: claims of this load pin the slot from now on.
    #[inline]
    pub(super) fn with_shared(self) -> Word {
        Word(self.0 | SHARED)
    }
    /// One more refcounted claim. The caller has checked that the refcount
    /// is below [`MAX_REFS`].
    #[inline]
    pub(super) fn plus_ref(self) -> Word {
        debug_assert!(self.refs() < MAX_REFS);
        Word(self.0 + REF_ONE)
    }
    /// One refcounted claim fewer. The caller has checked that the
    /// refcount is above 0.
    #[inline]
    pub(super) fn minus_ref(self) -> Word {
        debug_assert!(self.is_held());
        Word(self.0 - REF_ONE)
    }
    /// In shared mode: claims pin it ("Shared mode" in `pins.rs`).
    #[inline]
    pub(crate) fn shared(self) -> bool {
        self.0 & SHARED != 0
    }
    /// Holds the load of this generation (loading or loaded). A map entry
    /// naming (slot, generation) was stored for one id only, so this is
    /// "holds that id".
    #[inline]
    pub(super) fn holds(self, generation: u64) -> bool {
        self.state() != EMPTY && self.generation() == generation
    }
}

/// A slot's state word as an atomic that takes and gives [`Word`]s. Each
/// call site says why its orderings are what they are.
pub(super) struct AtomicWord(AtomicU64);

impl AtomicWord {
    pub(super) fn new(w: Word) -> AtomicWord {
        AtomicWord(AtomicU64::new(w.0))
    }
    #[inline]
    pub(super) fn load(&self, order: Ordering) -> Word {
        Word(self.0.load(order))
    }
    /// For tests: a store where no other thread runs.
    #[cfg(any(test, loom))]
    pub(super) fn store(&self, w: Word, order: Ordering) {
        self.0.store(w.0, order);
    }
    #[inline]
    pub(super) fn compare_exchange(
        &self,
        current: Word,
        new: Word,
        success: Ordering,
        failure: Ordering,
    ) -> Result<Word, Word> {
        self.0
            .compare_exchange(current.0, new.0, success, failure)
            .map(Word)
            .map_err(Word)
    }
}

/// The generation after `g`: 1 after [`GEN_MAX`].
#[inline]
pub(super) fn next_generation(g: u64) -> u64 {
    if g >= GEN_MAX {
        1
    } else {
        g + 1
    }
}

/// A ticket: `generation << 20 | slot`. Identifies one claimable load.
#[inline]
pub(crate) fn ticket(slot: u32, generation: u64) -> u64 {
    debug_assert!(u64::from(slot) < MAX_SLOTS && generation <= GEN_MAX);
    (generation << TICKET_SLOT_BITS) | u64::from(slot)
}

/// The (slot, generation) of a ticket; for a pinned ticket, the low 39
/// bits of the generation.
#[inline]
pub(crate) fn split_ticket(t: u64) -> (u32, u64) {
    let generation = if t & PINNED != 0 {
        (t >> TICKET_SLOT_BITS) & PIN_GEN_MASK
    } else {
        t >> TICKET_SLOT_BITS
    };
    ((t & (MAX_SLOTS - 1)) as u32, generation)
}

/// The part of a generation that a pinned ticket carries, and that tags the
/// pin counters holding that load: its low 39 bits.
#[inline]
pub(super) fn pin_tag(generation: u64) -> u64 {
    generation & PIN_GEN_MASK
}

/// The ticket of a pinned claim of `slot` in pin shard `shard`:
/// `PINNED | shard << 59 | (generation mod 2^39) << 20 | slot`.
#[inline]
pub(super) fn pinned_ticket(slot: u32, generation: u64, shard: usize) -> u64 {
    debug_assert!(shard < MAX_PIN_SHARDS);
    PINNED
        | (shard as u64) << PIN_SHARD_SHIFT
        | pin_tag(generation) << TICKET_SLOT_BITS
        | u64::from(slot)
}

/// The pin shard of a pinned ticket; None for a refcounted one.
#[inline]
pub(super) fn pin_shard_of(t: u64) -> Option<usize> {
    (t & PINNED != 0).then_some(((t & !PINNED) >> PIN_SHARD_SHIFT) as usize)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::super::RESERVED;
    use super::*;

    #[test]
    fn word_fields_round_trip() {
        let w = Word::new(READY, GEN_MAX, Origin::Demand);
        assert_eq!(w.state(), READY);
        assert_eq!(w.generation(), GEN_MAX);
        assert!(w.demand());
        assert_eq!(w.refs(), 0);
        assert_eq!(w.0 >> 60, 0, "the top four bits stay clear");
        let claimed = Word(w.with_state(CONSUMED).0 + REF_ONE * MAX_REFS);
        assert_eq!(claimed.refs(), MAX_REFS);
        assert_eq!(
            claimed.generation(),
            GEN_MAX,
            "a full refcount spills nowhere"
        );
        assert_eq!(next_generation(GEN_MAX), 1);
        assert_eq!(
            next_generation((1 << 24) - 1),
            1 << 24,
            "24 bits no longer wrap"
        );
        let last = MAX_SLOTS as u32 - 1;
        assert_eq!(split_ticket(ticket(last, GEN_MAX)), (last, GEN_MAX));
        assert!(
            ticket(last, GEN_MAX) < RESERVED,
            "no ticket is a map marker"
        );
        assert_eq!(split_ticket(ticket(0, 1)), (0, 1));
    }

    /// Each typed transition changes its own field and nothing else, the
    /// way the raw masks did.
    #[test]
    fn typed_transitions_change_only_their_field() {
        let queued = Word::new(QUEUED, 7, Origin::Prewarm);
        assert_eq!(queued.origin(), Origin::Prewarm);
        let promoted = queued.with_demand();
        assert_eq!(promoted.origin(), Origin::Demand, "demand wins");
        assert_eq!(promoted.0, queued.0 | DEMAND);
        let loaded = promoted.with_state(READY);
        assert!(loaded.is_loaded() && loaded.is_idle() && !loaded.is_held());
        let claimed = loaded.with_state(CONSUMED).plus_ref().without_origin();
        assert_eq!(
            claimed.0,
            (loaded.with_state(CONSUMED).0 + REF_ONE) & !ORIGIN_BITS
        );
        assert_eq!((claimed.state(), claimed.refs()), (CONSUMED, 1));
        assert_eq!(claimed.origin(), Origin::Speculative, "D and P cleared");
        assert!(claimed.is_held() && !claimed.is_idle());
        let shared = claimed.with_shared();
        assert!(shared.shared() && !claimed.shared());
        assert_eq!(shared.0, claimed.0 | SHARED);
        assert_eq!(shared.generation(), 7);
        assert_eq!(shared.minus_ref().0, shared.0 - REF_ONE);
        assert_eq!(shared.minus_ref().refs(), 0);
        assert_eq!(Word::empty(0).0, 0);
        assert_eq!(Word::empty(9).generation(), 9);
        let offline = Word::offline(GEN_MAX);
        assert_eq!((offline.state(), offline.generation()), (OFFLINE, GEN_MAX));
        assert!(!offline.is_idle() && !offline.is_loaded());
        assert!(queued.holds(7) && !queued.holds(8) && !Word::empty(7).holds(7));
        for state in [QUEUED, READING, OFFLINE, EVICTING] {
            assert!(!Word::empty(1).with_state(state).is_idle(), "{state}");
        }
    }

    /// Pinned tickets keep the slot, the shard and the generation's low 39
    /// bits apart, and a refcounted ticket has no shard.
    #[test]
    fn pinned_tickets_round_trip() {
        let last = MAX_SLOTS as u32 - 1;
        let t = pinned_ticket(last, GEN_MAX, MAX_PIN_SHARDS - 1);
        assert!(t & PINNED != 0);
        assert_eq!(pin_shard_of(t), Some(MAX_PIN_SHARDS - 1));
        assert_eq!(split_ticket(t), (last, pin_tag(GEN_MAX)));
        assert_eq!(pin_tag(PIN_GEN_MASK + 2), 1);
        assert_eq!(pin_shard_of(ticket(last, GEN_MAX)), None);
    }
}
