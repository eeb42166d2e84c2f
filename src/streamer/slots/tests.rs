//! Unit tests of the transitions in `mod.rs`, and the helpers the rooms'
//! tests share. Each room tests its own concept next to its code: the
//! word's bits in `word.rs`, victim choice in `victim.rs`, shared mode in
//! `pins.rs`.

use super::*;

/// Runs every queued read to READY, in queue order; returns the jobs.
pub(super) fn load_all(t: &SlotTable) -> Vec<ReadJob> {
    let mut jobs = Vec::new();
    while let Some(j) = t.next_job() {
        t.finish_ok(j);
        jobs.push(j);
    }
    jobs
}

/// Loads `id` into a 1-slot table (evicting whatever it held), claims
/// it and returns the ticket, still held.
pub(super) fn reload_and_claim(t: &SlotTable, id: u32) -> u64 {
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

/// A table under the adaptive policy: `layers` layers of `experts`.
pub(super) fn adaptive(slots: u32, layers: u32, experts: u32) -> SlotTable {
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
pub(super) fn decode(t: &SlotTable, ids: &[u32]) {
    for &id in ids {
        t.prefetch(id, Origin::Demand);
        load_all(t);
        let Claimed::Ready { ticket, .. } = t.claim(id) else {
            panic!("{id} not ready")
        };
        t.release(ticket).unwrap();
    }
}

/// `tests/library/generation_wrap.rs` without its 2^24 reads: the first load's
/// ticket, released, must not release the claim of load 2^24 + 1 (the
/// load that would reuse its generation, were the generation 24 bits).
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

/// At the real wrap point (`GEN_MAX` = 2^43 − 2 reloads away) the
/// generation starts again at 1, skipping 0 (no ticket is 0) and all ones
/// (no ticket is a map marker); tickets of neighbouring loads stay distinct
/// and stale.
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
fn stale_and_foreign_tickets() {
    let t = SlotTable::new(2, 10);
    assert_eq!(t.release(0), Err(Stale));
    assert_eq!(t.release(ticket(1, 1)), Err(Stale), "never claimed");
    assert_eq!(t.release(ticket(99, 1)), Err(Stale), "no such slot");
    t.prefetch(0, Origin::Demand);
    load_all(&t);
    assert_eq!(t.release(ticket(0, 1)), Err(Stale), "loaded, not claimed");
}

/// A bet is dropped only while it waits in a queue unclaimed: then its
/// read never starts and its slot is free; once a worker has begun it, or
/// a claim or a demand prefetch wants it, nothing is dropped.
#[test]
fn a_bet_is_dropped_only_while_queued_unwanted() {
    let t = SlotTable::new(8, 8);
    // Queued and unwanted: dropped; the worker skips the stale entry.
    assert!(matches!(
        t.prefetch(1, Origin::Speculative),
        Prefetched::Queued { .. }
    ));
    assert!(t.drop_speculative(1));
    assert!(!t.present(1), "the bet's map entry is gone");
    assert_eq!(t.next_job(), None, "the dropped read never starts");
    assert!(!t.drop_speculative(1), "nothing left to drop");
    // Being read: kept.
    assert!(matches!(
        t.prefetch(2, Origin::Speculative),
        Prefetched::Queued { .. }
    ));
    let job = t.next_job().unwrap();
    assert!(
        !t.drop_speculative(2),
        "a read in progress is never dropped"
    );
    t.finish_ok(job);
    assert!(
        !t.drop_speculative(2),
        "a loaded bet stays, for a later claim"
    );
    assert!(matches!(t.claim(2), Claimed::Ready { hit: true, .. }));
    // Wanted by a claim, by a demand prefetch, or queued as demand or
    // pre-warm: kept.
    assert!(matches!(
        t.prefetch(3, Origin::Speculative),
        Prefetched::Queued { .. }
    ));
    assert!(matches!(t.claim(3), Claimed::Pending { queued: false }));
    assert!(!t.drop_speculative(3), "a claim waits for it");
    assert!(matches!(
        t.prefetch(4, Origin::Speculative),
        Prefetched::Queued { .. }
    ));
    assert!(t.refresh(4, Origin::Demand));
    assert!(!t.drop_speculative(4), "a demand prefetch promoted it");
    t.prefetch(5, Origin::Demand);
    t.prefetch(6, Origin::Prewarm);
    assert!(!t.drop_speculative(5) && !t.drop_speculative(6));
    assert_eq!(load_all(&t).len(), 4, "3, 4, 5 and 6 are read");
}

/// A bet read and then settled against a set without it goes first: the
/// next take evicts it rather than an older claimed slot.
#[test]
fn a_demoted_bet_is_the_next_victim() {
    let t = SlotTable::new(3, 8);
    for id in [0, 1] {
        t.prefetch(id, Origin::Demand);
        load_all(&t);
        let Claimed::Ready { ticket, .. } = t.claim(id) else {
            panic!("{id} not ready")
        };
        t.release(ticket).unwrap();
    }
    t.prefetch(5, Origin::Speculative);
    load_all(&t);
    // Without the demotion the unclaimed bet is kept: 0, the oldest
    // claimed, would go. Demoted, the bet goes.
    t.demote_speculative(5);
    assert!(matches!(
        t.prefetch(6, Origin::Demand),
        Prefetched::Queued { evicted: true, .. }
    ));
    assert!(!t.present(5), "the demoted bet was evicted");
    assert!(t.present(0) && t.present(1));
}
