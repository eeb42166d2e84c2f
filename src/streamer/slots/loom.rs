//! Two or three threads racing prefetch, claim, release, eviction and a
//! worker over a tiny table; loom explores every interleaving. Slot bytes
//! are modelled by a loom `UnsafeCell` per slot, so a worker writing a
//! slot while a claimant reads it is reported as a data race.
//!
//! `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test --release
//! -p smoe --lib loom` runs them (with the queue's).

use super::word::{split_ticket, Origin, GEN_MAX, OFFLINE, PINNED};
use super::{Claimed, Policy, Prefetched, Shape, SlotTable, Stale};
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

/// The adaptive policy's hints (claim counts, visit starts) race a claim's
/// hit and an evicting prefetch: whatever the victim, a claimed slot is
/// never rewritten and every claim sees its own expert's bytes.
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

/// One pass of a working-set claim over `set` (dense ids), sparing
/// nothing, in a ring of `active` slots.
fn claim_set(m: &Model, set: &[u32], active: u32) -> super::SetPass {
    m.table
        .claim_set(set.len(), |k| set[k], || super::Spare::Nothing, active)
}

/// A working-set claim races an eviction of its one resident member: it
/// claims the member with the member's bytes, or finds it gone and queues
/// its read (or waits for the evicting load to land); it never claims a
/// slot being rewritten, and never answers Full while a load is in flight.
#[test]
fn claim_set_races_an_eviction() {
    loom::model(|| {
        let m = Model::new(1, 3);
        m.table.prefetch(0, Origin::Demand);
        assert!(m.work());
        assert!(m.claim_check_release(0));
        let m2 = m.clone();
        let evictor = thread::spawn(move || {
            let p = m2.table.prefetch(2, Origin::Demand);
            m2.work();
            p
        });
        let pass = claim_set(&m, &[1, 0], 1);
        match pass.found {
            super::SetClaim::Member {
                member: 1,
                claimed: Claimed::Ready { slot, ticket, .. },
            } => {
                // SAFETY: the claim's refcount keeps the worker out.
                let got = m.data[slot as usize].with(|p| unsafe { *p });
                assert_eq!(got, 0, "the member's slot held another expert");
                m.table.release(ticket).unwrap();
            }
            super::SetClaim::Member { .. } => panic!("{pass:?}"),
            super::SetClaim::Wait => {}
            super::SetClaim::Full => panic!("Full while the evicting load was in flight"),
        }
        evictor.join().unwrap();
        while m.work() {}
    });
}

/// A working-set claim while a worker finishes the read of another member:
/// the pass claims that member with its bytes, or waits; once the read has
/// landed, the next pass claims it.
#[test]
fn claim_set_sees_a_load_that_completes_for_another_member() {
    loom::model(|| {
        let m = Model::new(2, 3);
        assert!(matches!(
            m.table.prefetch(1, Origin::Demand),
            Prefetched::Queued { .. }
        ));
        let m2 = m.clone();
        let worker = thread::spawn(move || assert!(m2.work()));
        let check = |pass: super::SetPass| match pass.found {
            super::SetClaim::Member {
                member: 1,
                claimed: Claimed::Ready { slot, ticket, hit },
            } => {
                assert!(!hit, "the read was for demand");
                // SAFETY: the claim's refcount keeps the worker out.
                let got = m.data[slot as usize].with(|p| unsafe { *p });
                assert_eq!(got, 1);
                m.table.release(ticket).unwrap();
                true
            }
            super::SetClaim::Wait => false,
            other => panic!("{other:?}"),
        };
        // Member 0 (id 0) is absent: the pass queues its read too.
        let first = claim_set(&m, &[0, 1], 2);
        let claimed = check(first);
        worker.join().unwrap();
        while m.work() {}
        if !claimed {
            let again = claim_set(&m, &[0, 1], 2);
            assert!(
                matches!(again.found, super::SetClaim::Member { member: 0 | 1, .. }),
                "{again:?}"
            );
            if let super::SetClaim::Member {
                claimed: Claimed::Ready { ticket, .. },
                ..
            } = again.found
            {
                m.table.release(ticket).unwrap();
            }
        }
    });
}

/// A working-set claim races the release that frees the one slot it
/// needs: Full only if it looked before the release (and then it queued
/// nothing); otherwise its member's read is queued. Either way no slot is
/// taken from under the claim that held it.
#[test]
fn claim_set_races_a_release_that_frees_its_slot() {
    loom::model(|| {
        let m = Model::new(1, 2);
        m.table.prefetch(0, Origin::Demand);
        assert!(m.work());
        let Claimed::Ready { slot, ticket, .. } = m.table.claim(0) else {
            panic!("not ready");
        };
        let m2 = m.clone();
        let releaser = thread::spawn(move || {
            // SAFETY: held: no worker writes the slot until the release.
            let got = m2.data[slot as usize].with(|p| unsafe { *p });
            assert_eq!(got, 0);
            m2.table.release(ticket).unwrap();
        });
        let pass = claim_set(&m, &[1], 1);
        releaser.join().unwrap();
        match pass.found {
            super::SetClaim::Full => {
                assert_eq!(pass.queued, 0);
                assert!(!m.table.present(1), "Full, but a read was queued");
            }
            super::SetClaim::Wait => {
                assert_eq!(pass.queued, 1, "{pass:?}");
                assert!(m.work());
                assert!(m.claim_check_release(1));
            }
            other => panic!("{other:?}"),
        }
    });
}

/// A stale bet dropped (`drop_speculative`) while a worker may begin its
/// read and a claim may wait for it: either the drop wins (the read never
/// starts; the claim, or the one after, queues its own) or the read goes
/// on. Either way the expert is read exactly once, and a claim sees its own
/// bytes.
#[test]
fn dropping_a_bet_races_a_worker_and_a_claim() {
    loom::model(|| {
        let m = Model::new(2, 3);
        assert!(matches!(
            m.table.prefetch(1, Origin::Speculative),
            Prefetched::Queued { .. }
        ));
        let m2 = m.clone();
        let worker = thread::spawn(move || m2.work());
        let m3 = m.clone();
        let claimant = thread::spawn(move || m3.table.claim(1));
        let dropped = m.table.drop_speculative(1);
        let mut reads = usize::from(worker.join().unwrap());
        let claimed = claimant.join().unwrap();
        if let Claimed::Ready { ticket, .. } = claimed {
            m.table.release(ticket).unwrap();
        }
        // A claim now queues a demand read if the drop left none.
        if let Claimed::Ready { ticket, .. } = m.table.claim(1) {
            m.table.release(ticket).unwrap();
        }
        while m.work() {
            reads += 1;
        }
        assert_eq!(reads, 1, "dropped {dropped}, claim {claimed:?}");
        assert!(m.claim_check_release(1), "expert 1 is resident in the end");
    });
}

/// A demand prefetch promoting a bet races its drop: the read is either
/// promoted (and never dropped) or dropped and queued again as demand; the
/// expert is loaded exactly once either way.
#[test]
fn dropping_a_bet_races_its_promotion() {
    loom::model(|| {
        let m = Model::new(2, 3);
        m.table.prefetch(1, Origin::Speculative);
        let m2 = m.clone();
        let promoter = thread::spawn(move || m2.table.prefetch(1, Origin::Demand));
        let dropped = m.table.drop_speculative(1);
        let promoted = promoter.join().unwrap();
        let mut reads = 0;
        while m.work() {
            reads += 1;
        }
        assert_eq!(reads, 1, "dropped {dropped}, promoted {promoted:?}");
        assert!(m.claim_check_release(1));
    });
}
