//! Working sets (docs/c-api.md "Working sets") through the Rust
//! API: `prefetch_set` hands a layer's set over once, `claim_any` claims
//! whatever member is ready first. Every claimed byte is checked against
//! the synthetic generator.

use smoe_test_support as common;

use std::collections::BTreeSet;
use std::fs::File;
use std::ops::Range;
use std::time::{Duration, Instant};

use smoe::internals::sys::ReadError;
use smoe::streamer::{BlobReader, FileReader};
use smoe::vault::Vault;
use smoe::{Config, ErrorKind, Priority, Streamer};

const WAIT: Duration = Duration::from_secs(10);
const MIB: u64 = 1 << 20;

/// A disk that takes `delay` for every read of a blob in `slow` (file
/// offsets), and fails with EIO every read overlapping `bad`.
struct Disk {
    slow: Range<u64>,
    delay: Duration,
    bad: Range<u64>,
}

impl BlobReader for Disk {
    fn read_exact_at(&self, file: &File, buf: &mut [u8], offset: u64) -> Result<(), ReadError> {
        let end = offset + buf.len() as u64;
        if self.slow.start < end && offset < self.slow.end {
            std::thread::sleep(self.delay);
        }
        if self.bad.start < end && offset < self.bad.end {
            return Err(ReadError {
                done: 0,
                wanted: buf.len(),
                offset,
                error: std::io::Error::from_raw_os_error(libc::EIO),
            });
        }
        FileReader.read_exact_at(file, buf, offset)
    }
}

/// A streamer over `v` whose disk is `disk`.
fn with_disk(v: &common::TestVault, config: Config, disk: Disk) -> Streamer {
    Streamer::with_reader(Vault::open(v.dir.path()).unwrap(), config, disk).unwrap()
}

/// The file range of (layer, expert)'s blob.
fn blob(s: &Streamer, layer: u32, expert: u32) -> Range<u64> {
    let e = s.expert_info(layer, expert).unwrap();
    e.offset..e.offset + e.padded_size
}

/// A streamer over `v` (8 slots, 2 workers) whose disk fails every read
/// of (layer, expert)'s blob, once that read was tried and failed: its
/// error waits for the next claim.
fn with_a_failed_read(v: &common::TestVault, layer: u32, expert: u32) -> Streamer {
    let probe = Streamer::open(v.dir.path(), common::quiet_config(8, 2)).unwrap();
    let bad = blob(&probe, layer, expert);
    drop(probe);
    let s = with_disk(
        v,
        common::quiet_config(8, 2),
        Disk {
            slow: 0..0,
            delay: Duration::ZERO,
            bad,
        },
    );
    s.prefetch(layer, expert, Priority::Demand).unwrap();
    let deadline = Instant::now() + WAIT;
    while s.stats().io_errors == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(
        s.stats().io_errors,
        1,
        "the read of ({layer}, {expert}) did not fail"
    );
    s
}

/// Claims every member of `set` with `claim_any`, checking each one's
/// bytes and releasing it before the next: the claimed experts, in order.
fn drain(v: &common::TestVault, s: &Streamer, layer: u32, set: &[u32]) -> Vec<u32> {
    let mut left = set.to_vec();
    let mut order = Vec::new();
    while !left.is_empty() {
        let c = s.claim_any(layer, &left, WAIT).unwrap().expect("in time");
        let e = c.info().expert;
        assert!(left.contains(&e), "claimed {e}, not in the set {left:?}");
        v.check(layer, e, &c);
        order.push(e);
        left.retain(|&m| m != e);
    }
    order
}

/// A resident member is claimed before any other, in the set's order, while
/// the others' reads (slow here) are still on their way.
#[test]
fn resident_members_come_first_in_the_sets_order() {
    let v = common::vault(2, 16, 20_000, &[]);
    let probe = Streamer::open(v.dir.path(), common::quiet_config(16, 2)).unwrap();
    // Every blob of layer 1 after expert 0 is slow: 300 ms a read.
    let slow = blob(&probe, 1, 0).start..u64::MAX;
    drop(probe);
    let s = with_disk(
        &v,
        common::quiet_config(16, 4),
        Disk {
            slow,
            delay: Duration::from_millis(300),
            bad: 0..0,
        },
    );
    // Experts 3, 9 and 12 resident (claimed and released: retained).
    for e in [3, 9, 12] {
        drop(s.claim_wait(1, e, WAIT).unwrap().unwrap());
    }
    let set = [0, 1, 3, 4, 9, 5, 12, 6];
    let mut left = set.to_vec();
    let mut held = Vec::new();
    let t0 = Instant::now();
    for want in [3, 9, 12] {
        let c = s.claim_any(1, &left, WAIT).unwrap().unwrap();
        assert_eq!((c.info().expert, c.hit()), (want, true), "after {held:?}");
        v.check(1, want, &c);
        left.retain(|&e| e != want);
        held.push(c);
    }
    assert!(
        t0.elapsed() < Duration::from_millis(250),
        "the residents took {:?}: claim_any waited for a read",
        t0.elapsed()
    );
    // The first call queued the others' reads (demand): they land with no
    // further call.
    let deadline = Instant::now() + WAIT;
    while s.stats().resident < 8 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(s.stats().resident, 8, "{:?}", s.stats());
    let mut rest = BTreeSet::new();
    while !left.is_empty() {
        let c = s.claim_any(1, &left, WAIT).unwrap().unwrap();
        let e = c.info().expert;
        assert!(!c.hit(), "expert {e} needed a read");
        v.check(1, e, &c);
        left.retain(|&m| m != e);
        rest.insert(e);
        held.push(c);
    }
    assert_eq!(rest, BTreeSet::from([0, 1, 4, 5, 6]));
    assert_eq!(s.stats().slots_held, 8);
    drop(held);
    assert_eq!(s.stats().slots_held, 0);
}

/// A 16-expert set through an 8-slot ring, claim_any / check / release until
/// empty: each member claimed exactly once and read exactly once.
#[test]
fn a_set_twice_the_ring_is_claimed_once_each_and_read_once() {
    let v = common::vault(3, 16, 40_000, &[0]);
    let s = Streamer::open(v.dir.path(), common::quiet_config(8, 4)).unwrap();
    let set: Vec<u32> = (0..16).rev().collect();
    let present = s.prefetch_set(2, &set, Priority::Demand).unwrap();
    assert_eq!(present, 8, "the ring takes 8 of 16");
    let order = drain(&v, &s, 2, &set);
    let mut sorted = order.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..16).collect::<Vec<_>>(), "order {order:?}");
    let st = s.stats();
    assert_eq!((st.claims, st.reads_demand), (16, 16), "{st:?}");
    assert_eq!(st.slots_held, 0);
}

/// RING_FULL at once, not a wait that cannot end, when the caller holds
/// every slot and no member is resident or in flight; a release makes room.
#[test]
fn ring_full_at_once_when_the_caller_holds_every_slot() {
    let v = common::vault(1, 16, 20_000, &[]);
    let s = Streamer::open(v.dir.path(), common::quiet_config(4, 2)).unwrap();
    let mut held: Vec<_> = (0..4)
        .map(|e| s.claim_wait(0, e, WAIT).unwrap().unwrap())
        .collect();
    assert_eq!(s.stats().slots_held, 4);
    for timeout in [Duration::ZERO, WAIT] {
        let t0 = Instant::now();
        let err = s.claim_any(0, &[9, 10], timeout).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::RingFull, "{err}");
        assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    }
    assert_eq!(s.prefetch_set(0, &[9, 10, 2], Priority::Demand).unwrap(), 1);
    // A member that is held counts as resident: it is claimed again.
    let again = s.claim_any(0, &[9, 2], Duration::ZERO).unwrap().unwrap();
    assert_eq!(again.info().expert, 2);
    drop(again);
    held.pop();
    let c = s.claim_any(0, &[9, 10], WAIT).unwrap().unwrap();
    v.check(0, c.info().expert, &c);
}

/// A failed read of a member is reported for that member, once; the rest of
/// the set is claimed with its bytes right.
#[test]
fn a_failed_read_is_reported_for_its_member() {
    let v = common::vault(2, 8, 20_000, &[]);
    let probe = Streamer::open(v.dir.path(), common::quiet_config(8, 2)).unwrap();
    let bad = blob(&probe, 1, 5);
    drop(probe);
    let s = with_disk(
        &v,
        common::quiet_config(8, 2),
        Disk {
            slow: 0..0,
            delay: Duration::ZERO,
            bad,
        },
    );
    let mut left = vec![4, 5, 6, 7];
    s.prefetch_set(1, &left, Priority::Demand).unwrap();
    let mut failed = Vec::new();
    while !left.is_empty() {
        match s.claim_any(1, &left, WAIT) {
            Ok(Some(c)) => {
                let e = c.info().expert;
                v.check(1, e, &c);
                left.retain(|&m| m != e);
            }
            Ok(None) => panic!("timed out with {left:?} left"),
            Err(err) => {
                assert_eq!(err.kind(), ErrorKind::Io, "{err}");
                let (layer, expert) = err.layer_expert().expect("the member is named");
                assert_eq!(layer, 1);
                failed.push(expert);
                left.retain(|&m| m != expert);
            }
        }
    }
    assert_eq!(failed, [5]);
    assert_eq!(s.stats().io_errors, 1);
}

/// prefetch_set checks every member before it queues any; duplicates count
/// once per occurrence; an empty set is fine; an empty claim_any is not.
#[test]
fn prefetch_set_checks_first_and_counts_members() {
    let v = common::vault(2, 8, 20_000, &[0]);
    let s = Streamer::open(v.dir.path(), common::quiet_config(8, 2)).unwrap();
    let err = s.prefetch_set(1, &[1, 2, 8], Priority::Demand).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    assert_eq!(err.layer_expert(), Some((1, 8)), "{err}");
    let err = s.prefetch_set(0, &[1], Priority::Demand).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "dense layer 0: {err}");
    std::thread::sleep(Duration::from_millis(50));
    let st = s.stats();
    assert_eq!((st.reads_demand, st.resident), (0, 0), "queued: {st:?}");
    assert_eq!(s.prefetch_set(1, &[], Priority::Demand).unwrap(), 0);
    assert_eq!(
        s.prefetch_set(1, &[3, 3, 4, 3], Priority::Demand).unwrap(),
        4
    );
    let order = drain(&v, &s, 1, &[3, 3, 4, 3]);
    assert_eq!(order.len(), 2, "each distinct member once: {order:?}");
    assert_eq!(s.stats().reads_demand, 2);
    let err = s.claim_any(1, &[], WAIT).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Argument, "{err}");
}

/// A set larger than the ring keeps its head: the loads queued for its
/// first members are not evicted for its later ones while they wait
/// unclaimed, however often the set is handed over again.
#[test]
fn a_set_larger_than_the_ring_keeps_its_head() {
    let v = common::vault(1, 16, 20_000, &[]);
    let s = Streamer::open(v.dir.path(), common::quiet_config(8, 2)).unwrap();
    let set: Vec<u32> = (0..16).collect();
    assert_eq!(s.prefetch_set(0, &set, Priority::Demand).unwrap(), 8);
    let deadline = Instant::now() + WAIT;
    while s.stats().resident < 8 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    for _ in 0..3 {
        assert_eq!(s.prefetch_set(0, &set, Priority::Demand).unwrap(), 8);
    }
    for e in 0..8 {
        assert!(s.is_resident(0, e), "the head's expert {e} was evicted");
    }
    assert_eq!(s.stats().reads_demand, 8);
    assert_eq!(drain(&v, &s, 0, &set).len(), 16);
}

/// Speculation never evicts what the engine is about to claim: a
/// speculative set finds a ring of unclaimed demand loads full.
#[test]
fn speculation_never_evicts_unclaimed_demand_loads() {
    let v = common::vault(2, 8, 20_000, &[]);
    let s = Streamer::open(v.dir.path(), common::quiet_config(4, 2)).unwrap();
    assert_eq!(
        s.prefetch_set(0, &[0, 1, 2, 3], Priority::Demand).unwrap(),
        4
    );
    let deadline = Instant::now() + WAIT;
    while s.stats().resident < 4 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        s.prefetch_set(1, &[0, 1], Priority::Speculative).unwrap(),
        0
    );
    assert_eq!(s.stats().reads_speculative, 0);
    for e in 0..4 {
        assert!(
            s.is_resident(0, e),
            "demand load {e} evicted by speculation"
        );
    }
    // Once claimed (and released), they are fair game for speculation.
    assert_eq!(drain(&v, &s, 0, &[0, 1, 2, 3]).len(), 4);
    assert_eq!(
        s.prefetch_set(1, &[0, 1], Priority::Speculative).unwrap(),
        2
    );
    let deadline = Instant::now() + WAIT;
    while s.stats().reads_speculative < 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    // Speculation that does not come true: evicted unclaimed, counted.
    assert_eq!(s.stats().evicted_unclaimed, 0);
    assert_eq!(drain(&v, &s, 1, &[4, 5, 6, 7]).len(), 4);
    assert_eq!(s.stats().evicted_unclaimed, 2, "{:?}", s.stats());
}

/// The elastic ring shrinking in the middle of a set (fake memory pressure
/// through the hidden `pressure_root` hook): the set is still claimed,
/// every byte right, with no hang and no RING_FULL.
#[test]
fn the_elastic_ring_shrinking_mid_set() {
    const GIB: u64 = 1 << 30;
    let v = common::vault(1, 64, 4 * MIB - 16384, &[]);
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("proc")).unwrap();
    let meminfo = |available: u64| {
        let text = format!(
            "MemTotal: {} kB\nMemFree: {} kB\nMemAvailable: {} kB\n",
            4 * GIB / 1024,
            available / 1024,
            available / 1024
        );
        let tmp = root.path().join("proc/meminfo.tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, root.path().join("proc/meminfo")).unwrap();
    };
    meminfo(3 * GIB);
    let s = Streamer::open(
        v.dir.path(),
        Config {
            slot_mb: 4,
            pressure_root: Some(root.path().to_path_buf()),
            ..common::quiet_config(64, 2)
        },
    )
    .unwrap();
    let set: Vec<u32> = (0..48).collect();
    assert_eq!(s.prefetch_set(0, &set, Priority::Demand).unwrap(), 48);
    let mut left = set.clone();
    let mut claimed = 0;
    while !left.is_empty() {
        if claimed == 12 {
            // Pressure: the monitor shrinks the ring to its floor of 8.
            meminfo(100 * MIB);
            let deadline = Instant::now() + WAIT;
            while s.stats().slots_active > 8 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            assert_eq!(s.stats().slots_active, 8, "{:?}", s.stats());
        }
        let c = s.claim_any(0, &left, WAIT).unwrap().expect("in time");
        let e = c.info().expert;
        v.check(0, e, &c);
        left.retain(|&m| m != e);
        claimed += 1;
    }
    assert_eq!(claimed, 48);
}

/// A set that names an expert not in the vault is refused whole, before
/// anything is claimed (issue 33): {absent, resident, not in the vault}
/// once claimed the resident member, returned NOT_FOUND and never released
/// it, so each such call pinned one more slot until the ring was full.
#[test]
fn a_set_with_a_missing_member_claims_nothing() {
    let v = common::vault(2, 8, 20_000, &[]);
    let s = Streamer::open(v.dir.path(), common::quiet_config(4, 2)).unwrap();
    drop(s.claim_wait(1, 2, WAIT).unwrap().expect("read in time"));
    for timeout in [Duration::ZERO, WAIT] {
        for _ in 0..6 {
            let err = s.claim_any(1, &[5, 2, 8], timeout).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
            assert_eq!(err.layer_expert(), Some((1, 8)), "{err}");
            assert_eq!(s.stats().slots_held, 0, "a claim leaked: {:?}", s.stats());
        }
    }
    // Nothing was queued for the set either.
    assert!(!s.is_resident(1, 5), "a refused set queued a read");
    // The ring still serves the whole layer.
    assert_eq!(drain(&v, &s, 1, &[0, 1, 3, 4, 5, 6, 7]).len(), 7);
}

/// A member's failed read is not swallowed by a set refused for another
/// member (issue 33): the failure waits for the member's next claim, which
/// reports it (it answered PENDING: the error was consumed and lost).
#[test]
fn a_refused_set_keeps_a_members_read_error() {
    let v = common::vault(2, 8, 20_000, &[]);
    let s = with_a_failed_read(&v, 1, 5);
    assert_eq!(s.stats().io_errors, 1);
    let err = s.claim_any(1, &[3, 5, 8], Duration::ZERO).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    let err = s.claim(1, 5).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Io, "{err}");
    assert_eq!(err.layer_expert(), Some((1, 5)), "{err}");
    assert_eq!(s.stats().slots_held, 0);
}

/// A member whose last read failed is not "the ring is full" (issue 33: on
/// an empty ring prefetch_set counted it as not taken, which the C API
/// reports as RING_FULL): like `prefetch`, prefetch_set counts it, and its
/// claim reports the failure.
#[test]
fn prefetch_set_counts_a_member_whose_read_failed() {
    let v = common::vault(2, 8, 20_000, &[]);
    let s = with_a_failed_read(&v, 1, 5);
    assert_eq!(s.prefetch_set(1, &[4, 5, 6], Priority::Demand).unwrap(), 3);
    let err = s.claim_any(1, &[5, 4, 6], WAIT).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Io, "{err}");
    assert_eq!(err.layer_expert(), Some((1, 5)), "{err}");
    assert_eq!(drain(&v, &s, 1, &[4, 6]).len(), 2);
}

/// A member at the most claims its slot counts does not stop the set
/// (issue 33: claim_any answered ARGUMENT though another member was
/// resident and free): the next resident member is claimed; the error
/// comes only when no other member can be.
#[test]
fn a_member_at_the_claim_limit_is_passed_over() {
    let v = common::vault(1, 8, 20_000, &[]);
    let s = Streamer::open(v.dir.path(), common::quiet_config(4, 2)).unwrap();
    drop(s.claim_wait(0, 3, WAIT).unwrap().expect("read in time"));
    let mut held = Vec::new();
    loop {
        match s.claim_ticket(0, 1) {
            Ok(Some(info)) => held.push(info.ticket),
            Ok(None) => std::thread::sleep(Duration::from_millis(1)),
            Err(err) => {
                assert_eq!(err.kind(), ErrorKind::Argument, "{err}");
                break;
            }
        }
        assert!(held.len() < 1 << 20, "no claim limit");
    }
    let c = s.claim_any(0, &[1, 3], Duration::ZERO).unwrap().unwrap();
    assert_eq!(c.info().expert, 3);
    drop(c);
    let err = s.claim_any(0, &[1], Duration::ZERO).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Argument, "{err}");
    for t in held {
        s.release_ticket(t).unwrap();
    }
    assert_eq!(s.stats().slots_held, 0);
}

/// A layer beyond the vault is NOT_FOUND for an empty set too (issue 33:
/// `layer × n_experts` overflowed; a debug build panicked, a release build
/// wrapped and answered OK).
#[test]
fn prefetch_set_of_a_layer_beyond_the_vault() {
    let v = common::vault(2, 8, 20_000, &[]);
    let s = Streamer::open(v.dir.path(), common::quiet_config(4, 2)).unwrap();
    for layer in [2, u32::MAX / 8 + 1, u32::MAX] {
        for priority in [Priority::Demand, Priority::Speculative] {
            let err = s.prefetch_set(layer, &[], priority).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::NotFound, "layer {layer}: {err}");
            assert!(err.to_string().contains(&format!("layer {layer}")), "{err}");
        }
    }
    assert_eq!(s.prefetch_set(1, &[], Priority::Demand).unwrap(), 0);
}

/// A member whose read failed, named twice in a set, is reported once and
/// not read again by the same pass through its duplicate (it was: a new
/// read was queued for the copy while the error was reported).
#[test]
fn a_failed_member_named_twice_is_not_read_again() {
    let v = common::vault(2, 8, 20_000, &[]);
    let s = with_a_failed_read(&v, 1, 5);
    let err = s.claim_any(1, &[3, 5, 5], Duration::ZERO).unwrap_err();
    assert_eq!(err.layer_expert(), Some((1, 5)), "{err}");
    // Expert 3's read lands; a read of 5 queued beside it would have
    // failed by then too (the same two workers, the same disk).
    drop(s.claim_wait(1, 3, WAIT).unwrap().expect("read in time"));
    std::thread::sleep(Duration::from_millis(50));
    let st = s.stats();
    // One read failed (5), one landed (3): none of 5 again.
    assert_eq!((st.io_errors, st.reads_demand), (1, 1), "{st:?}");
}
