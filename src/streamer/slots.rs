//! The slot table: every slot's state word, the identity map (dense expert id
//! → slot), the LRU ticks and the two read queues. This is the lock-free heart
//! of the streamer; it owns no memory and does no I/O, so loom can check it
//! whole (see `loom_tests` below).
//!
//! It must never block, allocate or take a lock on the prefetch, claim and
//! release paths, and never hand out a slot whose refcount it has not raised.
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
//!   (see "Shared mode"). Only READY/CONSUMED slots have a nonzero
//!   refcount.
//! - `generation` (43 bits): bumped each time the slot is taken for a new
//!   load, running through `1..=GEN_MAX` and then back to 1. A ticket is
//!   `generation << 20 | slot`, so a ticket from an earlier load is stale
//!   until the slot has been reloaded `GEN_MAX` = 2^43 − 2 times: 8.8
//!   trillion loads, over two centuries at a thousand reloads of that one
//!   slot per second. (The generation was 24 bits until the hardening pass;
//!   a 1-slot ring wrapped it in a minute, after which a released ticket
//!   could drop the refcount of a live claim. It was 44 bits until shared
//!   mode took the ticket's top bit.) Never 0 for a loaded slot and never
//!   all ones, so no ticket is 0 and none collides with the map's
//!   NONE/RESERVED markers.
//! - `S` (1 bit): the load is SHARED (see "Shared mode").
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
//! OFFLINE is the elastic ring's: the memory monitor retires an idle slot
//! (chosen by the same victim function as eviction) when memory is short,
//! releases its pages, and restores it when the pressure ends. Retiring is a
//! take with no new load: the generation is bumped (outstanding tickets and
//! map entries of the old load become stale) and the old id's map entry is
//! cleared. No path but `restore_slot` leaves OFFLINE: the eviction scan
//! and the fresh-slot path take only EMPTY/READY/CONSUMED words, so an
//! OFFLINE slot is invisible to prefetch and claim, exactly as if the ring
//! were smaller.
//!
//! The LRU tick of a slot is refreshed when its load completes, when it is
//! claimed, and when a prefetch finds it already loaded (see the README's
//! changelog for why the last one was added to docs/c-api.md).
//!
//! A slot with refcount > 0 is never taken, so its bytes never change while a
//! claim holds them. CONSUMED with refcount 0 means *retained*: its identity
//! stays in the map and a later claim is a hit with no read.
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
//!   refcount keeps the slot from the scan until they are released, as
//!   before.
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

use crossbeam_utils::CachePadded;

use crate::queue::Queue;
use crate::sync::{fence, thread_index, AtomicU32, AtomicU64, AtomicU8, Backoff, Ordering};

pub(crate) const EMPTY: u64 = 0;
pub(crate) const QUEUED: u64 = 1;
pub(crate) const READING: u64 = 2;
pub(crate) const READY: u64 = 3;
pub(crate) const CONSUMED: u64 = 4;
/// Taken out of use by the elastic ring (module doc).
pub(crate) const OFFLINE: u64 = 5;
/// A SHARED slot whose evictor is counting its pins (module doc, "Shared
/// mode"). Only that evictor writes the word until it leaves this state.
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
/// Most pinned claims one slot can hold at once in one pin shard.
pub(crate) const MAX_PINS: u64 = (1 << 24) - 1;
/// A pin counter is `tag << PIN_TAG_SHIFT | count`: the count of pinned
/// claims, and the low 39 bits of the generation of the load they hold.
const PIN_TAG_SHIFT: u32 = 25;
const PIN_COUNT_MASK: u64 = (1 << PIN_TAG_SHIFT) - 1;
const GEN_SHIFT: u32 = 16;
const GEN_BITS: u32 = 43;
const GEN_MASK: u64 = ((1 << GEN_BITS) - 1) << GEN_SHIFT;
/// The last generation before the count starts again at 1 (all ones is
/// never used, see the module doc).
pub(crate) const GEN_MAX: u64 = (1 << GEN_BITS) - 2;
/// Shared mode: claims of this load pin the slot in per-thread counters
/// instead of raising the word's refcount (module doc, "Shared mode").
const SHARED: u64 = 1 << (GEN_SHIFT + GEN_BITS);
/// Ticket bit: a pinned claim (shared mode). Never set in a map entry or in
/// the ticket of a refcounted claim, whose generation is below 2^43.
const PINNED: u64 = 1 << 63;
/// Bits of a pinned ticket that hold the pin shard, above its generation.
const PIN_SHARD_SHIFT: u32 = 59;
/// Most pin shards a table has (4 ticket bits).
const MAX_PIN_SHARDS: usize = 16;
/// Bits of a pinned ticket's generation: the low 39 bits of the slot's.
const PIN_GEN_MASK: u64 = (1 << (PIN_SHARD_SHIFT - TICKET_SLOT_BITS)) - 1;
/// The pin counters of a table take at most this much memory: fewer shards
/// for a ring of very many slots.
const PIN_BUDGET_BYTES: usize = 4 << 20;
/// Bits of a ticket that hold the slot index.
const TICKET_SLOT_BITS: u32 = 20;
/// Most slots a table may have: ticket slot fields are 20 bits. The vault
/// format's limit on expert ids (`MAX_EXPERT_IDS`) is the same, and a ring
/// never has more slots than the vault has entries.
pub(crate) const MAX_SLOTS: u64 = 1 << TICKET_SLOT_BITS;

/// A loaded slot that no claim has touched is kept from eviction (while a
/// claimed idle slot is left) for this many turns of the ring: `slots ×
/// UNCLAIMED_TURNOVERS` ticks of the LRU clock, which advances on every load,
/// claim and resident prefetch.
const UNCLAIMED_TURNOVERS: u64 = 4;

/// `map` entry: no slot.
const NONE: u64 = u64::MAX;
/// `map` entry: a prefetch is choosing a slot for this id.
const RESERVED: u64 = u64::MAX - 1;

/// The fields of a state word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Word(pub(crate) u64);

impl Word {
    fn new(state: u64, generation: u64, origin: Origin) -> Word {
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
    pub(crate) fn state(self) -> u64 {
        self.0 & STATE_MASK
    }
    pub(crate) fn demand(self) -> bool {
        self.0 & DEMAND != 0
    }
    /// Who the load is for: demand wins over pre-warm.
    pub(crate) fn origin(self) -> Origin {
        if self.0 & DEMAND != 0 {
            Origin::Demand
        } else if self.0 & PREWARM != 0 {
            Origin::Prewarm
        } else {
            Origin::Speculative
        }
    }
    pub(crate) fn refs(self) -> u64 {
        (self.0 & REF_MASK) >> REF_SHIFT
    }
    pub(crate) fn generation(self) -> u64 {
        (self.0 & GEN_MASK) >> GEN_SHIFT
    }
    fn with_state(self, state: u64) -> Word {
        Word((self.0 & !STATE_MASK) | state)
    }
    /// In shared mode: claims pin it (module doc).
    pub(crate) fn shared(self) -> bool {
        self.0 & SHARED != 0
    }
    /// Holds the load of this generation (loading or loaded). A map entry
    /// naming (slot, generation) was stored for one id only, so this is
    /// "holds that id".
    fn holds(self, generation: u64) -> bool {
        self.state() != EMPTY && self.generation() == generation
    }
}

fn next_generation(g: u64) -> u64 {
    if g >= GEN_MAX {
        1
    } else {
        g + 1
    }
}

/// A ticket: `generation << 20 | slot`. Identifies one claimable load.
pub(crate) fn ticket(slot: u32, generation: u64) -> u64 {
    debug_assert!(u64::from(slot) < MAX_SLOTS && generation <= GEN_MAX);
    (generation << TICKET_SLOT_BITS) | u64::from(slot)
}

/// The (slot, generation) of a ticket; for a pinned ticket, the low 39
/// bits of the generation.
pub(crate) fn split_ticket(t: u64) -> (u32, u64) {
    let generation = if t & PINNED != 0 {
        (t >> TICKET_SLOT_BITS) & PIN_GEN_MASK
    } else {
        t >> TICKET_SLOT_BITS
    };
    ((t & (MAX_SLOTS - 1)) as u32, generation)
}

/// The ticket of a pinned claim of `slot` in pin shard `shard`:
/// `PINNED | shard << 59 | (generation mod 2^39) << 20 | slot`.
fn pinned_ticket(slot: u32, generation: u64, shard: usize) -> u64 {
    debug_assert!(shard < MAX_PIN_SHARDS);
    PINNED
        | (shard as u64) << PIN_SHARD_SHIFT
        | (generation & PIN_GEN_MASK) << TICKET_SLOT_BITS
        | u64::from(slot)
}

/// The pin shard of a pinned ticket; None for a refcounted one.
fn pin_shard_of(t: u64) -> Option<usize> {
    (t & PINNED != 0).then_some(((t & !PINNED) >> PIN_SHARD_SHIFT) as usize)
}

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

/// Slots a take must not evict, by the id they hold: the pre-warm
/// thread's warm set, or the members of one working set, so that loading a
/// set's later members never evicts its earlier ones while they wait
/// unclaimed (SPEC §3.2: a burst keeps its head).
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
    fn spares(&self, id: u32) -> bool {
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
    /// The state word; layout in the module doc.
    word: AtomicU64,
    /// When the slot was last taken, loaded, claimed or asked for again: the
    /// recency order, `tick << SEQ_BITS | seq` ([`next_stamp`]), where
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
}

impl Cell {
    fn new(generation: u64) -> Cell {
        Cell {
            word: AtomicU64::new(EMPTY | (generation << GEN_SHIFT)),
            stamp: AtomicU64::new(0),
            id: AtomicU32::new(0),
            layer: AtomicU32::new(0),
            count: AtomicU32::new(0),
        }
    }
}

/// How eviction chooses among idle slots (C `smoe_config.policy`; the
/// discriminants are the C values).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Policy {
    /// Least recently used first (the default).
    #[default]
    Lru = 0,
    /// Layer-aware: experts not used in their layer's latest visit first,
    /// the least claimed first; then the one whose layer the decode loop
    /// reaches last. See docs/c-api.md, "The adaptive policy".
    Adaptive = 1,
}

/// The shape the adaptive policy needs: dense ids are
/// `layer × experts_per_layer + expert`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Shape {
    pub(crate) policy: Policy,
    pub(crate) experts_per_layer: u32,
    pub(crate) layers: u32,
}

/// Low bits of a stamp: the order of touches within one tick of the load
/// clock.
const SEQ_BITS: u32 = 24;

/// The stamp of a touch at load-clock `tick`: `tick << SEQ_BITS | seq`,
/// where `seq` counts this thread's touches since the clock last moved
/// (saturating). Exact recency order for a thread that claims alone (an
/// engine's decode loop); between threads touching slots in the same tick,
/// an arbitrary but harmless order. No shared write, no timestamp read.
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

/// Pin counters per line pair.
const PINS_PER_LINE: usize = 16;

/// Two cache lines of pin counters: 128 bytes, so that rows of different
/// shards never share the pair of lines that x86's adjacent-line
/// prefetcher fetches together (crossbeam's `CachePadded` pads to 128 bytes
/// for the same reason).
#[repr(align(128))]
struct PinLine([AtomicU64; PINS_PER_LINE]);

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
enum Pinned {
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
struct Skip {
    slots: [u32; 4],
    len: usize,
}

/// What [`SlotTable::seize`] found.
enum Seized {
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
    const ROUNDS: u32 = Self::READ_PINS_AFTER as u32 + 2;

    fn is_empty(&self) -> bool {
        self.len == 0
    }
    fn skips(&self, slot: u32) -> bool {
        self.slots[..self.len.min(4)].contains(&slot)
    }
    fn reads_pins(&self) -> bool {
        self.len >= Self::READ_PINS_AFTER
    }
    fn push(&mut self, slot: u32) {
        self.slots[self.len % 4] = slot;
        self.len += 1;
    }
}

/// Adaptive policy: the group of slots not used in the latest visit of
/// their layer (evicted first).
const STALE_GROUP: u32 = 2;

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
    /// Loads that replaced another expert (a statistic).
    evictions: CachePadded<AtomicU64>,
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
    /// Shared mode: pin counters, `pin_shards` rows of `pin_stride` (one per
    /// slot, each row whole cache lines), one row per shard of threads
    /// ([`thread_index`]): claims of one slot on threads of different
    /// shards write different lines.
    pins: Box<[PinLine]>,
    pin_stride: usize,
    pin_shards: usize,
}

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
    /// reach the generation's wrap point without 2^44 loads.
    pub(crate) fn with_first_generation(slots: u32, ids: u32, generation: u64) -> SlotTable {
        assert!(slots > 0 && u64::from(slots) <= MAX_SLOTS && generation <= GEN_MAX);
        // Each (slot, generation) is pushed at most once per queue, and a
        // slot's stale entries are skipped when popped; 4 × slots leaves room
        // for stale entries of earlier generations.
        let cap = (slots as usize * 4).next_power_of_two().max(64);
        // One pin shard per core, up to 16, within PIN_BUDGET_BYTES.
        let pin_stride = (slots as usize).next_multiple_of(PINS_PER_LINE);
        let cores = if cfg!(loom) {
            2
        } else {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        };
        let pin_shards = cores
            .min(MAX_PIN_SHARDS)
            .min(PIN_BUDGET_BYTES / 8 / pin_stride)
            .max(1);
        SlotTable {
            cells: (0..slots).map(|_| Cell::new(generation)).collect(),
            map: (0..ids).map(|_| AtomicU64::new(NONE)).collect(),
            failed: (0..ids).map(|_| AtomicU8::new(0)).collect(),
            clock: CachePadded::new(AtomicU64::new(1)),
            fresh: CachePadded::new(AtomicU32::new(0)),
            demand: Queue::with_capacity(cap),
            speculative: Queue::with_capacity(cap),
            evictions: CachePadded::new(AtomicU64::new(0)),
            shape: Shape {
                policy: Policy::Lru,
                experts_per_layer: ids.max(1),
                layers: 1,
            },
            visit_start: Box::new([AtomicU64::new(0)]),
            last_layer: CachePadded::new(AtomicU32::new(u32::MAX)),
            claims: Box::new([]),
            pin_stride,
            pin_shards,
            pins: (0..pin_stride * pin_shards / PINS_PER_LINE)
                .map(|_| PinLine(std::array::from_fn(|_| AtomicU64::new(0))))
                .collect(),
        }
    }

    /// The counter of `shard`'s pins of `slot`.
    fn pin(&self, shard: usize, slot: u32) -> &AtomicU64 {
        let i = shard * self.pin_stride + slot as usize;
        &self.pins[i / PINS_PER_LINE].0[i % PINS_PER_LINE]
    }

    /// Whether any thread pins `slot`, read with `order`: Acquire in
    /// `seize` (after its fence), pairing with the Release of the last
    /// pinned claim's release, so that claim's reads of the slot happen
    /// before the take; Relaxed for the scan's hint.
    fn pinned(&self, slot: u32, order: Ordering) -> bool {
        (0..self.pin_shards).any(|s| self.pin(s, slot).load(order) & PIN_COUNT_MASK != 0)
    }

    /// Whether the scan of a take passes over the idle SHARED `slot`: this
    /// take found it pinned, or (after eight such) its counters look pinned
    /// (plain reads, a hint: only `seize` decides). Out of line: SHARED
    /// slots are few, and the scan's loop stays small.
    #[cold]
    #[inline(never)]
    fn passes_over(&self, slot: u32, skip: &Skip) -> bool {
        skip.skips(slot) || (skip.reads_pins() && self.pinned(slot, Ordering::Relaxed))
    }

    /// The eviction policy.
    pub(crate) fn policy(&self) -> Policy {
        self.shape.policy
    }

    pub(crate) fn slots(&self) -> u32 {
        self.cells.len() as u32
    }

    /// The current state word of `slot` (for stats and tests).
    pub(crate) fn word(&self, slot: u32) -> Word {
        Word(self.cells[slot as usize].word.load(Ordering::Acquire))
    }

    /// The dense id of `slot`'s current or last load (for diagnostics).
    pub(crate) fn slot_id(&self, slot: u32) -> u32 {
        self.cells[slot as usize].id.load(Ordering::Relaxed)
    }

    /// When `slot` was last used ([`next_stamp`]).
    pub(crate) fn stamp(&self, slot: u32) -> u64 {
        self.cells[slot as usize].stamp.load(Ordering::Relaxed)
    }

    /// Marks `slot` as used now. The stamp lives on the slot's own cache
    /// line (which a claim's compare-exchange owns already) and the clock is
    /// only read, so hits on resident experts write no shared line.
    fn touch(&self, slot: u32) {
        let now = self.clock.load(Ordering::Relaxed);
        self.cells[slot as usize]
            .stamp
            .store(next_stamp(now), Ordering::Relaxed);
    }

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
        let mut w = Word(cell.load(Ordering::Acquire));
        loop {
            if !w.holds(generation) {
                return false;
            }
            if matches!(w.state(), READY | CONSUMED) {
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
            let promoted = Word(w.0 | DEMAND);
            match cell.compare_exchange(w.0, promoted.0, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    // A full demand queue only delays the read: it is still
                    // in the speculative queue.
                    let _ = self.demand.push(ticket(slot, w.generation()));
                    return true;
                }
                Err(now) => w = Word(now),
            }
        }
    }

    /// Undo a take whose queue push failed: the slot goes back to EMPTY.
    fn abandon(&self, slot: u32, generation: u64, id: u32) {
        let cell = &self.cells[slot as usize].word;
        let w = Word(cell.load(Ordering::Acquire));
        // Release: the slot is free again. If a worker took the read
        // meanwhile (it was pushed to no queue, so only via a promotion),
        // the load goes on and its map entry stays.
        let freed = w.state() == QUEUED
            && w.generation() == generation
            && cell
                .compare_exchange(
                    w.0,
                    w.with_state(EMPTY).0 & !ORIGIN_BITS,
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

    /// Takes a slot for `id`: a fresh one if any is left, else the least
    /// recently used idle one. Returns (slot, new generation, evicted).
    fn take_slot(&self, id: u32, origin: Origin, spare: Spare<'_>) -> Option<(u32, u64, bool)> {
        let n = self.slots();
        if self.shape.policy == Policy::Adaptive {
            // A load of another layer than the last load's starts a visit
            // of this layer: its experts used before now are stale (the
            // victim scan below already sees that).
            let layer = id / self.shape.experts_per_layer;
            if self.last_layer.swap(layer, Ordering::Relaxed) != layer {
                if let Some(v) = self.visit_start.get(layer as usize) {
                    v.store(self.clock.load(Ordering::Relaxed), Ordering::Relaxed);
                }
            }
        }
        if self.fresh.load(Ordering::Relaxed) < n {
            let i = self.fresh.fetch_add(1, Ordering::Relaxed);
            if i < n {
                // Untouched unless a scan took it first (EMPTY looks oldest
                // to the scan); the take's compare-exchange checks the word.
                let seen = Word(self.cells[i as usize].word.load(Ordering::Relaxed));
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

    /// Readies the idle word `seen` of slot `i` for a take: itself, unless
    /// the slot is SHARED. A SHARED slot's claims are counted in the pin
    /// shards, not the word, so it is moved to EVICTING (which stops new
    /// pins) and its pins are counted; with none, the EVICTING word is
    /// returned, and only this thread may change it (to the take's word).
    /// With pins, Pinned: the slot is held, and is marked recently used.
    fn seize(&self, i: u32, seen: Word) -> Seized {
        if !seen.shared() {
            return Seized::Idle(seen);
        }
        let cell = &self.cells[i as usize];
        let evicting = seen.with_state(EVICTING);
        // Acquire: the last refcounted claim's release (before the slot
        // turned SHARED) happens before our take.
        if cell
            .word
            .compare_exchange(seen.0, evicting.0, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return Seized::Changed;
        }
        // SeqCst fence, paired with the one in `claim_pinned` (a
        // store-buffering pair): either that claim's word load sees EVICTING
        // (and it unpins), or our pin loads below see its pin.
        fence(Ordering::SeqCst);
        if !self.pinned(i, Ordering::Acquire) {
            return Seized::Idle(evicting);
        }
        // Relaxed: this publishes nothing (claims spinning on EVICTING see
        // the slot's bytes through the worker's Release of READY, whose
        // release sequence this read-modify-write continues).
        let back =
            cell.word
                .compare_exchange(evicting.0, seen.0, Ordering::Relaxed, Ordering::Relaxed);
        debug_assert!(back.is_ok(), "only the evictor writes EVICTING");
        self.touch(i);
        Seized::Pinned
    }

    /// The idle slot to evict for a load of `id`, by a scan of the cells (an
    /// EMPTY slot at once). Under [`Policy::Lru`], the least recently used;
    /// under [`Policy::Adaptive`], see [`SlotTable::adaptive_rank`]. A load
    /// that is not for demand never takes a demand load nobody has claimed
    /// yet (READY with `D`): speculation never evicts what the engine is
    /// about to claim.
    fn victim(
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
        let stale_before = now.saturating_sub(UNCLAIMED_TURNOVERS * u64::from(self.slots()));
        let layer = id / self.shape.experts_per_layer;
        let adaptive = |cell: &Cell, tick| {
            let (group, rank) = self.adaptive_rank(cell, layer, tick);
            u64::from(group) << 32 | u64::from(rank)
        };
        let spares_demand = origin != Origin::Demand;
        // A take's first scan (nearly every scan) has nothing to pass over:
        // its loop has no SHARED test at all.
        match (self.shape.policy, skip.is_empty()) {
            (Policy::Lru, true) => {
                self.scan::<false>(spare, spares_demand, stale_before, skip, |_, _| 0)
            }
            (Policy::Lru, false) => {
                self.scan::<true>(spare, spares_demand, stale_before, skip, |_, _| 0)
            }
            (Policy::Adaptive, true) => {
                self.scan::<false>(spare, spares_demand, stale_before, skip, adaptive)
            }
            (Policy::Adaptive, false) => {
                self.scan::<true>(spare, spares_demand, stale_before, skip, adaptive)
            }
        }
    }

    /// The scan of [`SlotTable::victim`]: the idle slot with the biggest
    /// `rank(cell, tick)`, the least recently used among equals, from the
    /// claimed (or stale unclaimed) slots if any, else from the unclaimed,
    /// leaving out the slots `spare` names, unclaimed demand loads when
    /// `spares_demand`, and the SHARED slots `skip` says this take found
    /// pinned. One pass over the cells, one cache line each.
    #[inline(always)]
    fn scan<const SKIPS: bool>(
        &self,
        spare: Spare<'_>,
        spares_demand: bool,
        stale_before: u64,
        skip: &Skip,
        rank: impl Fn(&Cell, u64) -> u64,
    ) -> Option<(u32, Word)> {
        // The id of an idle slot is read after its word; a stale id (a take
        // racing the scan) only affects this choice, and the take's
        // compare-exchange on the word seen here fails if the slot changed.
        let spared = |cell: &Cell| {
            !matches!(spare, Spare::Nothing) && spare.spares(cell.id.load(Ordering::Relaxed))
        };
        // Bigger (rank, !stamp), better victim; slot u32::MAX = none yet.
        // Plain locals, one set per class, so the loop keeps them in
        // registers.
        let (mut c_rank, mut c_age, mut c_slot, mut c_word) = (0u64, 0u64, u32::MAX, 0u64);
        let (mut u_rank, mut u_age, mut u_slot, mut u_word) = (0u64, 0u64, u32::MAX, 0u64);
        for (i, cell) in self.cells.iter().enumerate() {
            let w = cell.word.load(Ordering::Relaxed);
            if w & REF_MASK != 0 || (SKIPS && w & SHARED != 0 && self.passes_over(i as u32, skip)) {
                continue;
            }
            let state = w & STATE_MASK;
            if state == EMPTY {
                return Some((i as u32, Word(w)));
            }
            if (state != READY && state != CONSUMED)
                || (spares_demand && state == READY && w & DEMAND != 0)
                || spared(cell)
            {
                continue;
            }
            let stamp = cell.stamp.load(Ordering::Relaxed);
            let tick = stamp >> SEQ_BITS;
            let r = rank(cell, tick);
            let age = !stamp;
            if state == READY && tick >= stale_before {
                if u_slot == u32::MAX || (r, age) > (u_rank, u_age) {
                    (u_rank, u_age, u_slot, u_word) = (r, age, i as u32, w);
                }
            } else if c_slot == u32::MAX || (r, age) > (c_rank, c_age) {
                (c_rank, c_age, c_slot, c_word) = (r, age, i as u32, w);
            }
        }
        if c_slot != u32::MAX {
            Some((c_slot, Word(c_word)))
        } else if u_slot != u32::MAX {
            Some((u_slot, Word(u_word)))
        } else {
            None
        }
    }

    /// Under the adaptive policy, how good a victim the idle slot `cell` is
    /// when a slot is needed for an expert of layer `loading`: (group, rank
    /// within the group), bigger first; ties go to the least recently used.
    /// The slot was last used at load-clock `tick`.
    ///
    /// A decode step walks the layers in order, so an expert of layer
    /// `held` is needed next when the step reaches `held` again, `held −
    /// loading` layers ahead, going round the loop; and routing persists
    /// from token to token, so an expert used in the latest visit of its
    /// layer is the likelier to be used at the next. The groups, evicted
    /// first to last:
    ///
    /// 2. ([`STALE_GROUP`]) Experts not used in the latest visit of their
    ///    layer (since its [`SlotTable::visit_start`]), the least often
    ///    claimed first (their count of claims, this load's and earlier
    ///    loads': [`SlotTable::claims`]). Routing is skewed: some experts
    ///    are chosen far more often than others.
    /// 1. Experts used in the latest visit of their layer, and those of the
    ///    layer being loaded (used in an earlier visit), the layer that
    ///    comes last in the loop first: the layer being loaded (its next use
    ///    is a whole loop away), then the layer just finished, and so on.
    ///    This is what LRU gets wrong when the ring is smaller than a step's
    ///    working set: the layer just finished is its most recent.
    /// 0. Experts of the layer being loaded used in this visit: asked for in
    ///    this very step, about to be claimed.
    fn adaptive_rank(&self, cell: &Cell, loading: u32, tick: u64) -> (u32, u32) {
        let held = cell.layer.load(Ordering::Relaxed);
        let used_in_latest_visit = self
            .visit_start
            .get(held as usize)
            .is_some_and(|v| tick >= v.load(Ordering::Relaxed));
        let layers = self.shape.layers;
        if held == loading {
            // Used since this visit of the layer began: this step's.
            return if used_in_latest_visit {
                (0, 0)
            } else {
                (1, layers)
            };
        }
        if !used_in_latest_visit {
            return (STALE_GROUP, u32::MAX - cell.count.load(Ordering::Relaxed));
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

    /// Moves slot `i` from the idle word `seen` to QUEUED for `id`.
    fn try_take(&self, i: u32, seen: Word, id: u32, origin: Origin) -> Option<(u32, u64, bool)> {
        let generation = next_generation(seen.generation());
        let new = Word::new(QUEUED, generation, origin);
        // AcqRel: Acquire orders the last claimant's reads of the slot (its
        // Release in `release`) before the worker's writes; Release publishes
        // the new identity to whoever reads the word next.
        let cell = &self.cells[i as usize];
        cell.word
            .compare_exchange(seen.0, new.0, Ordering::AcqRel, Ordering::Relaxed)
            .ok()?;
        // A load is the one event that advances the clock.
        let now = self.clock.fetch_add(1, Ordering::Relaxed) + 1;
        // Sequence 0: older than this thread's later touches in the same
        // tick, newer than anything touched before the load.
        cell.stamp.store(now << SEQ_BITS, Ordering::Relaxed);
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
            if !matches!(seen.state(), EMPTY | READY | CONSUMED) || seen.refs() != 0 {
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
            let offline = Word(OFFLINE | (generation << GEN_SHIFT));
            // AcqRel: Acquire orders the last claimant's reads of the slot
            // (its Release in `release`) and the worker's writes (its Release
            // of READY) before the caller releases the pages; Release
            // publishes OFFLINE to every later scan.
            let cell = &self.cells[i as usize];
            if cell
                .word
                .compare_exchange(seen.0, offline.0, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
            {
                continue;
            }
            if seen.state() != EMPTY {
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
        let w = Word(cell.load(Ordering::Relaxed));
        if w.state() != OFFLINE {
            return false;
        }
        // Release: the caller's release of the slot's pages happens before
        // any take that Acquires the EMPTY word (and then writes the slot).
        cell.compare_exchange(
            w.0,
            w.with_state(EMPTY).0,
            Ordering::Release,
            Ordering::Relaxed,
        )
        .is_ok()
    }

    /// Puts the loaded, claimed `slot` in shared mode, as contention would
    /// (for tests).
    #[cfg(any(test, loom))]
    fn share(&self, slot: u32) {
        let cell = &self.cells[slot as usize].word;
        let w = Word(cell.load(Ordering::Relaxed));
        assert_eq!(w.state(), CONSUMED, "share a claimed load");
        cell.store(w.0 | SHARED, Ordering::Relaxed);
    }

    /// Pinned claims not yet released, over all slots and shards (for
    /// tests).
    #[cfg(any(test, loom))]
    fn pins_held(&self) -> u64 {
        self.pins
            .iter()
            .flat_map(|line| &line.0)
            .map(|p| p.load(Ordering::Relaxed) & PIN_COUNT_MASK)
            .sum()
    }

    /// Number of OFFLINE slots (for tests; the streamer counts its own).
    #[cfg(test)]
    pub(crate) fn offline(&self) -> u32 {
        (0..self.slots())
            .filter(|&i| self.word(i).state() == OFFLINE)
            .count() as u32
    }

    /// The next read for a worker, demand first. None when both queues are
    /// empty. Entries made stale by a promotion or a newer generation are
    /// skipped.
    pub(crate) fn next_job(&self) -> Option<ReadJob> {
        loop {
            let item = self.demand.pop().or_else(|| self.speculative.pop())?;
            let (slot, generation) = split_ticket(item);
            let cell = &self.cells[slot as usize].word;
            // Acquire: the word written by the prefetch that queued the item.
            let mut w = Word(cell.load(Ordering::Acquire));
            loop {
                if w.state() != QUEUED || w.generation() != generation {
                    break; // stale: taken by another worker, or abandoned
                }
                // Acquire: the slot's previous readers are done (see try_take),
                // so the worker may now overwrite its bytes.
                match cell.compare_exchange(
                    w.0,
                    w.with_state(READING).0,
                    Ordering::Acquire,
                    Ordering::Acquire,
                ) {
                    Ok(_) => {
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
                    Err(now) => w = Word(now),
                }
            }
        }
    }

    /// Whether either queue holds an item (possibly a stale one).
    pub(crate) fn has_work(&self) -> bool {
        !self.demand.is_empty() || !self.speculative.is_empty()
    }

    /// Publishes a finished read: READY, with a fresh tick.
    pub(crate) fn finish_ok(&self, job: ReadJob) {
        self.touch(job.slot);
        let cell = &self.cells[job.slot as usize].word;
        let mut w = Word(cell.load(Ordering::Relaxed));
        loop {
            debug_assert!(w.state() == READING && w.generation() == job.generation);
            // Release: publishes the bytes the worker wrote into the slot to
            // every claim that Acquires this word.
            match cell.compare_exchange(
                w.0,
                w.with_state(READY).0,
                Ordering::Release,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(now) => w = Word(now), // a claim set D meanwhile
            }
        }
    }

    /// Records a failed read: the error waits for the next claim of the id,
    /// and the slot goes back to EMPTY.
    pub(crate) fn finish_failed(&self, job: ReadJob) {
        // Release: the error (stored by the caller before this call) is
        // visible to the claim that Acquires the flag.
        self.failed[job.id as usize].store(1, Ordering::Release);
        let cell = &self.cells[job.slot as usize].word;
        let mut w = Word(cell.load(Ordering::Relaxed));
        loop {
            let empty = Word(w.with_state(EMPTY).0 & !ORIGIN_BITS);
            // Release: the failed flag is set before the slot can be seen free.
            match cell.compare_exchange(w.0, empty.0, Ordering::Release, Ordering::Relaxed) {
                Ok(_) => break,
                Err(now) => w = Word(now),
            }
        }
        let _ = self.map[job.id as usize].compare_exchange(
            ticket(job.slot, job.generation),
            NONE,
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
    }

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
    /// working-set claim (`Streamer::claim_any`), which takes a resident
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
            // raises the word's refcount, as before shared mode.
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
            let mut w = Word(cell.load(Ordering::Acquire));
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
                        let marked = Word(w.0 | DEMAND);
                        match cell.compare_exchange(
                            w.0,
                            marked.0,
                            Ordering::AcqRel,
                            Ordering::Acquire,
                        ) {
                            Ok(_) => {
                                // No wake-up needed: the read is still in a
                                // queue whose push woke a worker.
                                if w.state() == QUEUED {
                                    let _ = self.demand.push(ticket(slot, w.generation()));
                                }
                                return Claimed::Pending { queued: false };
                            }
                            Err(now) => w = Word(now),
                        }
                    }
                    CONSUMED if w.shared() && !refcounted => {
                        match self.claim_pinned(slot, generation) {
                            Pinned::Claimed(claimed) => return claimed,
                            // Being seized (the EVICTING arm waits), or
                            // reloaded (the loop's top sees it).
                            Pinned::WordChanged => w = Word(cell.load(Ordering::Acquire)),
                            // A claim of the slot's last load is taking its
                            // pin back from our shard's counter: count this
                            // claim in the word instead of waiting for it.
                            Pinned::CounterBusy => refcounted = true,
                        }
                    }
                    CONSUMED if contended && !w.shared() => {
                        // Threads are claiming this load at once: from now
                        // on they pin it instead of writing its word.
                        let shared = Word(w.0 | SHARED);
                        // Acquire on failure: we may retry with it.
                        w = match cell.compare_exchange(
                            w.0,
                            shared.0,
                            Ordering::Relaxed,
                            Ordering::Acquire,
                        ) {
                            Ok(_) => shared,
                            Err(now) => Word(now),
                        };
                    }
                    READY | CONSUMED => {
                        if w.refs() == MAX_REFS {
                            return Claimed::TooManyClaims;
                        }
                        let claimed = Word((w.with_state(CONSUMED).0 + REF_ONE) & !ORIGIN_BITS);
                        // Acquire: the worker's Release of READY published the
                        // bytes; Relaxed is not enough for the failure load
                        // either, since we may retry with it.
                        match cell.compare_exchange(
                            w.0,
                            claimed.0,
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
                                    self.touch(slot);
                                    if self.shape.policy == Policy::Adaptive {
                                        let count = &self.cells[slot as usize].count;
                                        count.store(
                                            count.load(Ordering::Relaxed).saturating_add(1),
                                            Ordering::Relaxed,
                                        );
                                    }
                                }
                                let hit = !(w.state() == READY && w.demand());
                                return Claimed::Ready {
                                    slot,
                                    ticket: m,
                                    hit,
                                };
                            }
                            Err(now) => {
                                w = Word(now);
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
                        w = Word(cell.load(Ordering::Acquire));
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

    /// A claim of the SHARED slot `slot`, load `generation`: raises this
    /// thread's pin count of the slot, then checks that the word still holds
    /// that load, CONSUMED (so no eviction has begun): Ready with a pinned
    /// ticket, or WordChanged (pin undone), or CounterBusy (nothing done)
    /// when this shard's counter still holds a transient pin of the slot's
    /// last load. Writes only this thread's pin line (and the slot's stamp
    /// once per tick of the load clock).
    fn claim_pinned(&self, slot: u32, generation: u64) -> Pinned {
        let shard = thread_index() % self.pin_shards;
        let pin = self.pin(shard, slot);
        let tag = generation & PIN_GEN_MASK;
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
        let w = Word(cell.word.load(Ordering::Acquire));
        if w.state() == CONSUMED && w.shared() && w.generation() == generation {
            // Recency to the tick only: threads sharing a slot then write
            // its line once per load of the ring, not once per claim.
            let now = self.clock.load(Ordering::Relaxed);
            if cell.stamp.load(Ordering::Relaxed) >> SEQ_BITS != now {
                self.touch(slot);
                if self.shape.policy == Policy::Adaptive {
                    cell.count.store(
                        cell.count.load(Ordering::Relaxed).saturating_add(1),
                        Ordering::Relaxed,
                    );
                }
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

    /// Releases one claim of `ticket`. Stale when the ticket's slot has since
    /// been taken for another load, or holds no claim.
    pub(crate) fn release(&self, t: u64) -> Result<u32, Stale> {
        let (slot, generation) = split_ticket(t);
        let cell = &self.cells.get(slot as usize).ok_or(Stale)?.word;
        if let Some(shard) = pin_shard_of(t) {
            if shard >= self.pin_shards {
                return Err(Stale);
            }
            // Relaxed: a check that the ticket names this load; the pin
            // count is what keeps the slot.
            let w = Word(cell.load(Ordering::Relaxed));
            if !(w.shared()
                && matches!(w.state(), CONSUMED | EVICTING)
                && w.generation() & PIN_GEN_MASK == generation)
            {
                return Err(Stale);
            }
            // The counter's tag names the load its pins hold, so a ticket
            // released twice finds a count of 0, or (once the slot has been
            // reloaded and pinned again) another load's tag.
            let pin = self.pin(shard, slot);
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
        let mut w = Word(cell.load(Ordering::Relaxed));
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
            match cell.compare_exchange(w.0, w.0 - REF_ONE, Ordering::Release, Ordering::Relaxed) {
                Ok(_) => return Ok(slot),
                Err(now) => {
                    backoff.spin();
                    w = Word(now);
                }
            }
        }
    }

    /// Loads so far that replaced another expert.
    pub(crate) fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }

    /// One pass of a working-set claim (SPEC §3.2, `Streamer::claim_any`)
    /// over the `n` members whose dense ids `id(k)` gives (checked lazily,
    /// as the pass reaches each): the first resident member, claimed; then,
    /// if the pass went past members that are not resident (or found none),
    /// the absent members' demand reads queued in order, sparing the set's
    /// own loads (`spare()`), until the ring takes no more. A ring of
    /// `active` slots whose every one is held, with no member resident or
    /// in flight and nothing loading, is [`SetClaim::Full`]: only a
    /// release frees a slot.
    pub(crate) fn claim_set<'s, E>(
        &self,
        n: usize,
        id: impl Fn(usize) -> Result<u32, E>,
        spare: impl FnOnce() -> Result<Spare<'s>, E>,
        active: u32,
    ) -> Result<SetPass, E> {
        let mut pass = SetPass {
            found: SetClaim::Wait,
            queued: 0,
            ring_full: false,
        };
        let mut in_flight = false;
        let mut passed = 0;
        for k in 0..n {
            match self.claim_present(id(k)?) {
                Claimed::Absent => {}
                Claimed::Pending { .. } => in_flight = true,
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
            return Ok(pass);
        }
        let spare = spare()?;
        let mut error_pending = false;
        let found = match pass.found {
            SetClaim::Member { member, .. } => member,
            _ => n,
        };
        for k in 0..n {
            if k == found {
                // Claimed, or its failure reported just now: a new read of
                // a member whose read failed waits for a later prefetch.
                continue;
            }
            match self.prefetch_sparing(id(k)?, Origin::Demand, spare) {
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
                pass.found = SetClaim::Full;
            }
        }
        Ok(pass)
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
                    if w.refs() > 0 || (w.shared() && self.pinned(i, Ordering::Relaxed)) =>
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
            .filter(|&i| matches!(self.word(i).state(), READY | CONSUMED))
            .count() as u32
    }

    /// The slot holding `id`'s data, if it is loaded (READY or CONSUMED).
    pub(crate) fn resident_slot(&self, id: u32) -> Option<u32> {
        let (slot, w) = self.current(id)?;
        matches!(w.state(), READY | CONSUMED).then_some(slot)
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

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn load_all(t: &SlotTable) -> Vec<ReadJob> {
        let mut jobs = Vec::new();
        while let Some(j) = t.next_job() {
            t.finish_ok(j);
            jobs.push(j);
        }
        jobs
    }

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

    /// Loads `id` into a 1-slot table (evicting whatever it held), claims
    /// it and returns the ticket, still held.
    fn reload_and_claim(t: &SlotTable, id: u32) -> u64 {
        assert!(matches!(
            t.prefetch(id, Origin::Demand),
            Prefetched::Queued { .. }
        ));
        assert_eq!(load_all(t).len(), 1);
        let Claimed::Ready { ticket, hit, .. } = t.claim(id) else {
            panic!("{id} not ready after its read")
        };
        assert!(!hit);
        ticket
    }

    /// The hardening reproducer without its 2^24 reads: the first load's
    /// ticket, released, must not release the claim of load 2^24 + 1 (the
    /// load that reused its generation when the generation was 24 bits).
    #[test]
    fn a_released_ticket_stays_stale_across_the_old_24_bit_wrap() {
        // The slot's first load had generation 1; its ticket was released
        // long ago. Fast-forward: the slot's last load had generation
        // 2^24 − 2, so the next loads are 2^24 − 1, 2^24, ... (with 24 bits:
        // 2^24 − 1, then 1 again, where `first` became valid).
        let first = ticket(0, 1);
        let t = SlotTable::with_first_generation(1, 2, (1 << 24) - 2);
        for load in 0..4u32 {
            let held = reload_and_claim(&t, load % 2);
            assert_ne!(held, first);
            assert_eq!(t.release(first), Err(Stale), "load {load}");
            assert_eq!(t.word(0).refs(), 1, "the live claim kept its reference");
            t.release(held).unwrap();
        }
        assert_eq!(t.word(0).generation(), (1 << 24) + 2);
    }

    /// At the real wrap point (2^44 − 2 reloads away) the generation starts
    /// again at 1, skipping 0 (no ticket is 0) and all ones (no ticket is a
    /// map marker); tickets of neighbouring loads stay distinct and stale.
    #[test]
    fn generation_wraps_to_one_after_gen_max() {
        let t = SlotTable::with_first_generation(1, 3, GEN_MAX - 2);
        let mut previous = Vec::new();
        for load in 0..5u32 {
            let held = reload_and_claim(&t, load % 3);
            let generation = split_ticket(held).1;
            assert!((1..=GEN_MAX).contains(&generation), "{generation}");
            assert!(held != 0 && held < RESERVED);
            for &old in &previous {
                assert_eq!(t.release(old), Err(Stale), "load {load}");
            }
            assert_eq!(t.word(0).refs(), 1);
            t.release(held).unwrap();
            previous.push(held);
        }
        let generations: Vec<u64> = previous.iter().map(|&p| split_ticket(p).1).collect();
        assert_eq!(generations, [GEN_MAX - 1, GEN_MAX, 1, 2, 3]);
    }

    #[test]
    fn prefetch_then_claim_then_retain() {
        let t = SlotTable::new(2, 10);
        assert_eq!(
            t.claim(3),
            Claimed::Pending { queued: true },
            "claim queues a demand read"
        );
        assert_eq!(
            t.prefetch(3, Origin::Demand),
            Prefetched::Present,
            "no second read"
        );
        let jobs = load_all(&t);
        assert_eq!(jobs.len(), 1);
        assert_eq!(jobs[0].origin, Origin::Demand);
        let Claimed::Ready { ticket, hit, slot } = t.claim(3) else {
            panic!("not ready")
        };
        assert!(!hit, "a demand read was needed");
        assert_eq!(t.release(ticket), Ok(slot));
        assert_eq!(t.release(ticket), Err(Stale), "released twice");
        let Claimed::Ready { hit, ticket, .. } = t.claim(3) else {
            panic!("retained slot was lost")
        };
        assert!(hit, "retained data is a hit");
        t.release(ticket).unwrap();
        assert!(t.next_job().is_none(), "a re-claim reads nothing");
    }

    #[test]
    fn speculative_load_is_a_hit_and_promotion_is_not() {
        let t = SlotTable::new(4, 10);
        t.prefetch(1, Origin::Speculative);
        t.prefetch(2, Origin::Speculative);
        // A claim of 2 while it waits in the speculative queue promotes it.
        assert_eq!(
            t.claim(2),
            Claimed::Pending { queued: false },
            "promoted, not queued"
        );
        let first = t.next_job().unwrap();
        assert_eq!(first.id, 2, "promoted read goes first");
        t.finish_ok(first);
        load_all(&t);
        assert!(matches!(t.claim(1), Claimed::Ready { hit: true, .. }));
        assert!(matches!(t.claim(2), Claimed::Ready { hit: false, .. }));
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

    /// The issue's case: a prefetch burst fills the ring; the engine claims
    /// and releases its first expert; the next prefetch must evict that
    /// claimed slot, not the loaded-but-unclaimed head of the burst.
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

    fn adaptive(slots: u32, layers: u32, experts: u32) -> SlotTable {
        SlotTable::with_shape(
            slots,
            layers * experts,
            Shape {
                policy: Policy::Adaptive,
                experts_per_layer: experts,
                layers,
            },
        )
    }

    /// Loads and claims (then releases) `ids` in order, as a decode does.
    fn decode(t: &SlotTable, ids: &[u32]) {
        for &id in ids {
            t.prefetch(id, Origin::Demand);
            load_all(t);
            let Claimed::Ready { ticket, .. } = t.claim(id) else {
                panic!("{id} not ready")
            };
            t.release(ticket).unwrap();
        }
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
    fn ring_full_and_recovery() {
        let t = SlotTable::new(2, 10);
        t.prefetch(0, Origin::Demand);
        t.prefetch(1, Origin::Demand);
        load_all(&t);
        let Claimed::Ready { ticket: t0, .. } = t.claim(0) else {
            panic!()
        };
        let Claimed::Ready { ticket: _t1, .. } = t.claim(1) else {
            panic!()
        };
        assert_eq!(t.prefetch(2, Origin::Demand), Prefetched::RingFull);
        assert_eq!(t.claim(2), Claimed::RingFull);
        assert!(!t.present(2), "a refused prefetch leaves no trace");
        t.release(t0).unwrap();
        assert!(matches!(
            t.prefetch(2, Origin::Demand),
            Prefetched::Queued { evicted: true, .. }
        ));
        assert_eq!(t.release(t0), Err(Stale), "slot was evicted and reloaded");
    }

    #[test]
    fn failed_read_is_reported_once_then_retried() {
        let t = SlotTable::new(2, 10);
        t.prefetch(4, Origin::Demand);
        let j = t.next_job().unwrap();
        t.finish_failed(j);
        assert_eq!(t.prefetch(4, Origin::Demand), Prefetched::ErrorPending);
        assert_eq!(t.claim(4), Claimed::Failed);
        assert_eq!(
            t.claim(4),
            Claimed::Pending { queued: true },
            "error forgotten, read retried"
        );
        assert_eq!(load_all(&t).len(), 1);
        assert!(matches!(t.claim(4), Claimed::Ready { .. }));
    }

    #[test]
    fn retire_takes_idle_slots_in_victim_order_and_never_a_claimed_one() {
        let t = SlotTable::new(3, 10);
        for id in 0..3 {
            t.prefetch(id, Origin::Demand);
        }
        load_all(&t);
        let Claimed::Ready { ticket: held, .. } = t.claim(0) else {
            panic!()
        };
        for id in [2, 1] {
            let Claimed::Ready { ticket, .. } = t.claim(id) else {
                panic!()
            };
            t.release(ticket).unwrap();
        }
        // 2 was claimed before 1, so it is the least recently used idle one.
        let first = t.retire_idle_slot().unwrap();
        assert!(!t.present(2), "the LRU idle slot went first");
        assert_eq!(t.word(first).state(), OFFLINE);
        let second = t.retire_idle_slot().unwrap();
        assert!(!t.present(1));
        assert_eq!(t.retire_idle_slot(), None, "0 is claimed: never retired");
        assert_eq!(t.offline(), 2);
        assert_eq!(t.resident(), 1);
        // The claim still holds 0's bytes and releases normally.
        assert!(t.present(0));
        t.release(held).unwrap();
        // A one-slot ring now: loading 1 evicts 0, and while 1 is claimed
        // another load is RING_FULL, exactly as with a ring of one slot.
        assert!(matches!(
            t.prefetch(1, Origin::Demand),
            Prefetched::Queued { evicted: true, .. }
        ));
        load_all(&t);
        let Claimed::Ready { ticket: one, .. } = t.claim(1) else {
            panic!()
        };
        assert_eq!(t.claim(2), Claimed::RingFull);
        // Growing back: the restored slots take the next loads.
        assert!(t.restore_slot(first) && t.restore_slot(second));
        assert!(!t.restore_slot(first), "restored once");
        assert!(!t.restore_slot(99), "no such slot");
        assert_eq!(t.offline(), 0);
        assert!(matches!(t.claim(2), Claimed::Pending { queued: true }));
        load_all(&t);
        assert!(matches!(t.claim(2), Claimed::Ready { .. }));
        t.release(one).unwrap();
    }

    #[test]
    fn retired_tickets_are_stale_and_fresh_slots_are_not_taken_offline() {
        let t = SlotTable::new(2, 10);
        // Retire a fresh slot (EMPTY goes first): the fresh path skips it.
        let gone = t.retire_idle_slot().unwrap();
        for id in 0..3 {
            t.prefetch(id, Origin::Demand);
            load_all(&t);
        }
        assert_eq!(t.word(gone).state(), OFFLINE, "no take used it");
        assert_eq!(t.resident(), 1);
        let Claimed::Ready { ticket, slot, .. } = t.claim(2) else {
            panic!()
        };
        assert_ne!(slot, gone);
        t.release(ticket).unwrap();
        // Retiring the loaded slot makes its ticket stale.
        assert_eq!(t.retire_idle_slot(), Some(slot));
        assert_eq!(t.release(ticket), Err(Stale));
        assert_eq!(t.prefetch(3, Origin::Demand), Prefetched::RingFull);
        assert_eq!(t.claim(2), Claimed::RingFull, "no slot: as a full ring");
        assert!(t.restore_slot(slot));
        assert!(matches!(t.claim(2), Claimed::Pending { queued: true }));
    }

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
        let pin = t.pin(shard, 0);
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
        t.pin(shard, 0)
            .store((generation - 1) << PIN_TAG_SHIFT | 1, Ordering::Relaxed);
        let Claimed::Ready { ticket, .. } = t.claim(0) else {
            panic!("resident")
        };
        assert_eq!(ticket & PINNED, 0, "refcounted: {ticket:#x}");
        assert_eq!(t.word(0).refs(), 1);
        assert_eq!(t.prefetch(1, Origin::Demand), Prefetched::RingFull, "held");
        t.release(ticket).unwrap();
        t.pin(shard, 0).store(0, Ordering::Relaxed);
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

    #[test]
    fn stale_and_foreign_tickets() {
        let t = SlotTable::new(2, 10);
        assert_eq!(t.release(0), Err(Stale));
        assert_eq!(t.release(ticket(1, 1)), Err(Stale), "never claimed");
        assert_eq!(t.release(ticket(99, 1)), Err(Stale), "no such slot");
        t.prefetch(0, Origin::Demand);
        load_all(&t);
        assert_eq!(t.release(ticket(0, 1)), Err(Stale), "loaded, not claimed");
    }
}

#[cfg(loom)]
mod loom_tests {
    //! Two or three threads racing prefetch, claim, release, eviction and a
    //! worker over a tiny table; loom explores every interleaving. Slot bytes
    //! are modelled by a loom `UnsafeCell` per slot, so a worker writing a
    //! slot while a claimant reads it is reported as a data race.
    use super::*;
    use crate::sync::{thread, Arc, UnsafeCell};

    /// Preemption bound of the three-thread models.
    const PREEMPTIONS: usize = 3;

    struct Model {
        table: SlotTable,
        data: Vec<UnsafeCell<u32>>,
    }

    impl Model {
        fn new(slots: u32, ids: u32) -> Arc<Model> {
            Self::with_table(SlotTable::new(slots, ids))
        }
        fn with_table(table: SlotTable) -> Arc<Model> {
            let slots = table.slots();
            Arc::new(Model {
                table,
                data: (0..slots).map(|_| UnsafeCell::new(u32::MAX)).collect(),
            })
        }
        /// One slot, two experts: 0 loaded, claimed, released and SHARED,
        /// as after threads contended for it.
        fn shared_resident() -> Arc<Model> {
            let m = Model::new(1, 2);
            m.table.prefetch(0, Origin::Demand);
            assert!(m.work());
            assert!(m.claim_check_release(0));
            m.table.share(0);
            m
        }
        /// One worker step: read the next job's "bytes" (its id) into the slot.
        fn work(&self) -> bool {
            match self.table.next_job() {
                Some(j) => {
                    // SAFETY: READING gives the worker the slot exclusively.
                    self.data[j.slot as usize].with_mut(|p| unsafe { *p = j.id });
                    self.table.finish_ok(j);
                    true
                }
                None => false,
            }
        }
        /// Claims `id` if ready, checks its bytes, releases it.
        fn claim_check_release(&self, id: u32) -> bool {
            if let Claimed::Ready { slot, ticket, .. } = self.table.claim(id) {
                // SAFETY: a raised refcount keeps the slot from being rewritten.
                let got = self.data[slot as usize].with(|p| unsafe { *p });
                assert_eq!(got, id, "claim of {id} saw another expert's bytes");
                self.table.release(ticket).unwrap();
                true
            } else {
                false
            }
        }
    }

    #[test]
    fn concurrent_prefetch_of_one_expert_reads_once() {
        loom::model(|| {
            let m = Model::new(2, 4);
            let m2 = m.clone();
            let h = thread::spawn(move || m2.table.prefetch(1, Origin::Speculative));
            let a = m.table.prefetch(1, Origin::Demand);
            let b = h.join().unwrap();
            let queued = [a, b]
                .iter()
                .filter(|p| matches!(p, Prefetched::Queued { .. }))
                .count();
            assert_eq!(queued, 1, "{a:?} {b:?}");
            let mut reads = 0;
            while m.work() {
                reads += 1;
            }
            assert_eq!(reads, 1);
        });
    }

    /// The adaptive policy's hints (claim counts, visit starts) race a claim's hit and an evicting prefetch: whatever the
    /// victim, a claimed slot is never rewritten and every claim sees its
    /// own expert's bytes.
    #[test]
    fn adaptive_eviction_races_claims() {
        loom::model(|| {
            // Two slots, two layers of two experts (ids 0..4): 0 and 1 are
            // loaded and claimed once; loading 2 (layer 1) must evict one.
            let shape = Shape {
                policy: Policy::Adaptive,
                experts_per_layer: 2,
                layers: 2,
            };
            let m = Model::with_table(SlotTable::with_shape(2, 4, shape));
            for id in [0, 1] {
                m.table.prefetch(id, Origin::Demand);
                assert!(m.work());
                assert!(m.claim_check_release(id));
            }
            let m2 = m.clone();
            let loader = thread::spawn(move || {
                let _ = m2.table.prefetch(2, Origin::Demand);
                m2.work();
            });
            m.claim_check_release(1);
            loader.join().unwrap();
            while m.work() {}
            for id in 0..3 {
                m.claim_check_release(id);
            }
        });
    }

    #[test]
    fn claim_races_worker_and_eviction() {
        loom::model(|| {
            // One slot, two experts: loading 1 must evict 0, and only when
            // no claim holds 0.
            let m = Model::new(1, 2);
            m.table.prefetch(0, Origin::Demand);
            assert!(m.work());
            let m2 = m.clone();
            let claimer = thread::spawn(move || {
                m2.claim_check_release(0);
            });
            let m3 = m.clone();
            let worker = thread::spawn(move || {
                m3.work();
            });
            let _ = m.table.prefetch(1, Origin::Demand);
            claimer.join().unwrap();
            worker.join().unwrap();
            while m.work() {}
            // Whatever interleaving happened, each resident id is right.
            for id in 0..2 {
                m.claim_check_release(id);
            }
        });
    }

    #[test]
    fn promotion_races_the_worker_and_reads_once() {
        loom::model(|| {
            let m = Model::new(2, 2);
            assert!(matches!(
                m.table.prefetch(1, Origin::Speculative),
                Prefetched::Queued { .. }
            ));
            let m2 = m.clone();
            // A waiting claim promotes the speculative read to demand...
            let claimer = thread::spawn(move || m2.table.claim(1));
            // ...while a worker may already be taking it.
            let m3 = m.clone();
            let worker = thread::spawn(move || m3.work());
            let first = claimer.join().unwrap();
            let mut reads = usize::from(worker.join().unwrap());
            while m.work() {
                reads += 1;
            }
            assert_eq!(reads, 1, "one read, whichever queue it came from");
            if let Claimed::Ready { ticket, .. } = first {
                m.table.release(ticket).unwrap();
            }
            assert!(m.claim_check_release(1));
        });
    }

    #[test]
    fn failed_read_is_reported_exactly_once() {
        loom::model(|| {
            let m = Model::new(1, 2);
            m.table.prefetch(0, Origin::Demand);
            let job = m.table.next_job().unwrap();
            let m2 = m.clone();
            let claimer = thread::spawn(move || [m2.table.claim(0), m2.table.claim(0)]);
            m.table.finish_failed(job);
            let answers = claimer.join().unwrap();
            let third = m.table.claim(0);
            let failed = answers
                .iter()
                .chain(std::iter::once(&third))
                .filter(|c| **c == Claimed::Failed)
                .count();
            assert_eq!(failed, 1, "{answers:?} then {third:?}");
        });
    }

    #[test]
    fn release_and_reload_across_the_generation_wrap() {
        loom::model(|| {
            // The slot's generation is one below its wrap point: loading 0
            // takes GEN_MAX, and reloading it after 1 wraps round to 1.
            let m = Arc::new(Model {
                table: SlotTable::with_first_generation(1, 2, GEN_MAX - 1),
                data: vec![UnsafeCell::new(u32::MAX)],
            });
            m.table.prefetch(0, Origin::Demand);
            assert!(m.work());
            let Claimed::Ready { ticket: old, .. } = m.table.claim(0) else {
                panic!()
            };
            assert_eq!(split_ticket(old).1, GEN_MAX);
            let m2 = m.clone();
            let h = thread::spawn(move || {
                let _ = m2.table.prefetch(1, Origin::Demand);
                while m2.work() {}
                m2.claim_check_release(1);
            });
            m.table.release(old).unwrap();
            h.join().unwrap();
            let _ = m.table.prefetch(0, Origin::Demand);
            while m.work() {}
            // Whatever ran first, the old ticket is stale now and every
            // resident expert's bytes are its own.
            assert_eq!(m.table.release(old), Err(Stale));
            m.claim_check_release(0);
            m.claim_check_release(1);
        });
    }

    /// Claims (checks, releases) expert 0 on another thread while this one
    /// retires an idle slot and releases its pages (modelled as a write to
    /// the slot's cell): (the retired slot, whether the claim got it).
    fn race_retire_with_a_claim_of_0(m: &Arc<Model>) -> (Option<u32>, bool) {
        let m2 = m.clone();
        let claimer = thread::spawn(move || m2.claim_check_release(0));
        let retired = m.table.retire_idle_slot();
        if let Some(slot) = retired {
            // SAFETY: an OFFLINE slot is no one else's.
            m.data[slot as usize].with_mut(|p| unsafe { *p = u32::MAX });
        }
        (retired, claimer.join().unwrap())
    }

    /// The elastic ring's retire racing a claim: a claimed slot is never
    /// retired (the monitor's page release is modelled as a write to the
    /// slot's cell, so retiring a slot a claimant still reads is a reported
    /// data race), and a retired slot comes back through restore.
    #[test]
    fn retire_races_a_claim() {
        loom::model(|| {
            let m = Model::new(1, 2);
            m.table.prefetch(0, Origin::Demand);
            assert!(m.work());
            let (retired, claimed) = race_retire_with_a_claim_of_0(&m);
            match retired {
                Some(slot) => {
                    assert_eq!(m.table.word(slot).state(), OFFLINE);
                    assert_eq!(m.table.claim(0), Claimed::RingFull, "no slot left");
                    assert!(m.table.restore_slot(slot));
                }
                None => assert!(claimed, "retire found no idle slot: the claim held it"),
            }
            let _ = m.table.prefetch(1, Origin::Demand);
            while m.work() {}
            m.claim_check_release(1);
        });
    }

    /// Retire racing a prefetch that evicts: exactly one of them gets the
    /// one idle slot's old load, a slot is never both loading and offline,
    /// and after a restore every expert loads right.
    #[test]
    fn retire_races_a_prefetch() {
        loom::model(|| {
            let m = Model::new(2, 3);
            m.table.prefetch(0, Origin::Demand);
            m.table.prefetch(1, Origin::Demand);
            while m.work() {}
            let m2 = m.clone();
            let prefetcher = thread::spawn(move || m2.table.prefetch(2, Origin::Demand));
            let retired = m.table.retire_idle_slot();
            let queued = prefetcher.join().unwrap();
            if let (Some(r), Prefetched::Queued { slot, .. }) = (retired, queued) {
                assert_ne!(r, slot, "a slot both retired and loading");
            }
            while m.work() {}
            if let Some(slot) = retired {
                assert_eq!(m.table.word(slot).state(), OFFLINE);
                assert!(m.table.restore_slot(slot));
            }
            for id in 0..3 {
                let _ = m.table.prefetch(id, Origin::Demand);
                while m.work() {}
                assert!(m.claim_check_release(id));
            }
        });
    }

    /// A pinned claim of a SHARED slot racing the eviction that would
    /// reuse it (the store-buffering pair of `claim_pinned` and `seize`):
    /// the claim either sees EVICTING and backs off, or its pin is seen and
    /// the slot is put back; never both missed.
    #[test]
    fn pinned_claim_races_eviction() {
        loom::model(|| {
            let m = Model::shared_resident();
            let m2 = m.clone();
            let claimer = thread::spawn(move || m2.claim_check_release(0));
            let m3 = m.clone();
            let loader = thread::spawn(move || {
                let _ = m3.table.prefetch(1, Origin::Demand);
                m3.work();
            });
            claimer.join().unwrap();
            loader.join().unwrap();
            while m.work() {}
            assert_eq!(m.table.pins_held(), 0, "a pin leaked");
            for id in 0..2 {
                m.claim_check_release(id);
            }
        });
    }

    /// Retire racing a pinned claim of a SHARED slot: the page release
    /// (modelled as a write) never overlaps the claim's read.
    #[test]
    fn retire_races_a_pinned_claim() {
        loom::model(|| {
            let m = Model::shared_resident();
            let (retired, claimed) = race_retire_with_a_claim_of_0(&m);
            match retired {
                Some(slot) => assert!(m.table.restore_slot(slot)),
                None => assert!(claimed, "retire found no idle slot: the claim held it"),
            }
            assert_eq!(m.table.pins_held(), 0, "a pin leaked");
        });
    }

    /// A pinned ticket released a second time, racing the slot's reload and
    /// a pinned claim of the new load in the same shard: the stale release
    /// never takes the new load's pin.
    #[test]
    fn double_release_of_a_pinned_ticket_races_a_reload() {
        loom::model(|| {
            let m = Model::shared_resident();
            let Claimed::Ready { ticket, .. } = m.table.claim(0) else {
                panic!("resident")
            };
            m.table.release(ticket).unwrap();
            let m2 = m.clone();
            let again = thread::spawn(move || m2.table.release(ticket));
            let _ = m.table.prefetch(1, Origin::Demand);
            let mut held = None;
            if m.work() {
                if let Claimed::Ready { ticket: a, .. } = m.table.claim(1) {
                    m.table.release(a).unwrap();
                    m.table.share(0);
                    if let Claimed::Ready { ticket: b, .. } = m.table.claim(1) {
                        held = Some(b);
                    }
                }
            }
            assert_eq!(again.join().unwrap(), Err(Stale), "released twice");
            if let Some(b) = held {
                assert_eq!(m.table.release(b), Ok(0), "the new load's pin was kept");
            }
        });
    }

    /// A pinned claim released on another thread (its ticket names the pin
    /// shard) while a third thread evicts: the slot is rewritten only after
    /// the release, and the ticket is stale afterwards.
    #[test]
    fn pinned_claim_released_on_another_thread() {
        loom::model(|| {
            let m = Model::shared_resident();
            let Claimed::Ready { slot, ticket, .. } = m.table.claim(0) else {
                panic!("resident")
            };
            assert!(ticket & PINNED != 0);
            let m2 = m.clone();
            let releaser = thread::spawn(move || {
                // SAFETY: the pinned claim keeps the slot from being rewritten.
                let got = m2.data[slot as usize].with(|p| unsafe { *p });
                assert_eq!(got, 0);
                m2.table.release(ticket).unwrap();
            });
            let _ = m.table.prefetch(1, Origin::Demand);
            m.work();
            releaser.join().unwrap();
            let _ = m.table.prefetch(1, Origin::Demand);
            while m.work() {}
            assert_eq!(m.table.release(ticket), Err(Stale));
            assert!(m.claim_check_release(1));
        });
    }

    /// Two claims of one slot racing each other (the loser of a word
    /// compare-exchange turns the slot SHARED and pins it) and an evicting
    /// prefetch: whichever mode each claim ends in, no claim sees another
    /// expert's bytes and nothing stays held.
    #[test]
    fn contended_claims_race_eviction() {
        // Three threads: bounded preemptions keep the model in CI's time.
        let mut model = loom::model::Builder::new();
        model.preemption_bound = Some(PREEMPTIONS);
        model.check(|| {
            let m = Model::new(1, 2);
            m.table.prefetch(0, Origin::Demand);
            assert!(m.work());
            assert!(m.claim_check_release(0));
            let m2 = m.clone();
            let a = thread::spawn(move || m2.claim_check_release(0));
            let m3 = m.clone();
            let b = thread::spawn(move || m3.claim_check_release(0));
            let _ = m.table.prefetch(1, Origin::Demand);
            a.join().unwrap();
            b.join().unwrap();
            while m.work() {}
            let _ = m.table.prefetch(1, Origin::Demand);
            while m.work() {}
            assert!(m.claim_check_release(1), "the slot was free again");
        });
    }

    #[test]
    fn release_races_claim_of_the_same_slot() {
        loom::model(|| {
            let m = Model::new(1, 2);
            m.table.prefetch(0, Origin::Demand);
            assert!(m.work());
            let Claimed::Ready { ticket, .. } = m.table.claim(0) else {
                panic!()
            };
            let m2 = m.clone();
            let h = thread::spawn(move || m2.claim_check_release(0));
            m.table.release(ticket).unwrap();
            let _ = m.table.prefetch(1, Origin::Speculative);
            let _ = h.join().unwrap();
            while m.work() {}
            assert_eq!(m.table.release(ticket), Err(Stale));
        });
    }
}
