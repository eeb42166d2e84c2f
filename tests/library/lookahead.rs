//! Lookahead (docs/c-api.md "Predictions"): an engine bets on a layer's
//! experts with speculative prefetches before its router has run; the
//! layer's demand `prefetch_set` settles the bet. The counters are checked
//! exactly on routings the test chooses, and a stale bet, dropped when the
//! real set arrives, never takes the drive from a demand read.

use smoe_test_support as common;

use std::fs::File;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use smoe::internals::sys::ReadError;
use smoe::streamer::{BlobReader, FileReader};
use smoe::vault::Vault;
use smoe::{Priority, Stats, Streamer};

const WAIT: Duration = Duration::from_secs(10);

/// A disk whose every read first says which file offset it reads (on
/// `began`), then takes `delay`.
struct Disk {
    began: Mutex<Sender<u64>>,
    delay: Duration,
}

impl BlobReader for Disk {
    fn read_exact_at(&self, file: &File, buf: &mut [u8], offset: u64) -> Result<(), ReadError> {
        let _ = self.began.lock().unwrap().send(offset);
        std::thread::sleep(self.delay);
        FileReader.read_exact_at(file, buf, offset)
    }
}

/// A streamer over `v` with `workers` workers, `slots` slots, no pre-warm,
/// whose reads take `delay` each and are announced on the receiver.
fn streamer(
    v: &common::TestVault,
    slots: u32,
    workers: u32,
    delay: Duration,
) -> (Streamer, Receiver<u64>) {
    let (tx, rx) = channel();
    let disk = Disk {
        began: Mutex::new(tx),
        delay,
    };
    let s = Streamer::with_reader(
        Vault::open(v.dir.path()).unwrap(),
        common::quiet_config(slots, workers),
        disk,
    )
    .unwrap();
    (s, rx)
}

/// Waits until `done(stats)` holds.
fn until(s: &Streamer, what: &str, done: impl Fn(&Stats) -> bool) {
    let deadline = Instant::now() + WAIT;
    while !done(&s.stats()) {
        assert!(Instant::now() < deadline, "{what}: {:?}", s.stats());
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Claims each expert of `set` (layer `layer`) and checks its bytes.
fn claim_all(v: &common::TestVault, s: &Streamer, layer: u32, set: &[u32]) {
    let mut left = set.to_vec();
    while !left.is_empty() {
        let c = s.claim_any(layer, &left, WAIT).unwrap().expect("in time");
        let e = c.info().expert;
        v.check(layer, e, &c);
        left.retain(|&m| m != e);
    }
}

/// On a routing the test knows, every counter is exact: the recall's
/// numerator and denominator, the speculative bytes read and those never
/// claimed, and the bets dropped before they were read.
#[test]
fn the_prediction_counters_are_exact_on_a_known_routing() {
    let v = common::vault(3, 16, 20_000, &[]);
    let (s, began) = streamer(&v, 32, 1, Duration::ZERO);
    let padded = s.expert_info(1, 0).unwrap().padded_size;

    // Token 1, layer 1: a bet on {0, 1, 2, 3}, all read before the router;
    // the router picks {1, 2, 5}: 2 of its 3 experts predicted.
    assert_eq!(
        s.prefetch_set(1, &[0, 1, 2, 3], Priority::Speculative)
            .unwrap(),
        4
    );
    until(&s, "the bet is read", |st| st.reads_speculative == 4);
    s.prefetch_set(1, &[1, 2, 5], Priority::Demand).unwrap();
    claim_all(&v, &s, 1, &[1, 2, 5]);
    let st = s.stats();
    assert_eq!((st.prediction_routed, st.prediction_hits), (3, 2), "{st:?}");
    assert_eq!(st.speculative_dropped, 0, "{st:?}");
    assert_eq!(st.bytes_speculative, 4 * padded, "{st:?}");
    assert_eq!(
        st.bytes_speculative_unclaimed,
        2 * padded,
        "0 and 3 were read and never claimed: {st:?}"
    );
    assert_eq!((st.reads_demand, st.hits, st.claims), (1, 2, 3), "{st:?}");

    // A later claim of a bet that came in late still counts: 3 is claimed.
    claim_all(&v, &s, 1, &[3]);
    assert_eq!(s.stats().bytes_speculative_unclaimed, padded);

    // Token 1, layer 2, with one worker held by a slow read: the bet's
    // first read begins, its other two wait in the queue; the router's set
    // {0, 9} drops them (1 of 2 routed experts predicted) and its claim of
    // 0 waits for the read in progress, which then counts as demand.
    drop(s);
    while began.try_recv().is_ok() {}
    let (s, began) = streamer(&v, 32, 1, Duration::from_millis(300));
    s.prefetch_set(2, &[0, 4, 7], Priority::Speculative)
        .unwrap();
    let first = began
        .recv_timeout(WAIT)
        .expect("the bet's first read begins");
    assert_eq!(first, s.expert_info(2, 0).unwrap().offset);
    s.prefetch_set(2, &[0, 9], Priority::Demand).unwrap();
    claim_all(&v, &s, 2, &[0, 9]);
    let st = s.stats();
    assert_eq!((st.prediction_routed, st.prediction_hits), (2, 1), "{st:?}");
    assert_eq!(st.speculative_dropped, 2, "4 and 7 never began: {st:?}");
    assert_eq!(
        (st.reads_demand, st.reads_speculative, st.bytes_speculative),
        (2, 0, 0),
        "the bet on 0 became demand when its claim waited: {st:?}"
    );
    let mut reads = vec![first];
    reads.extend(began.try_iter());
    assert_eq!(reads.len(), 2, "only 0 and 9 were read: {reads:?}");
    for e in [4, 7] {
        assert!(
            !s.is_resident(2, e),
            "the dropped bet on {e} is not in the ring"
        );
    }
    // A layer with no bet outstanding counts nothing.
    s.prefetch_set(0, &[1], Priority::Demand).unwrap();
    assert_eq!(s.stats().prediction_routed, 2);
}

/// A stale bet never delays a demand read. One worker on a slow disk (200
/// ms a read): layer 1's bet on 8 experts is queued, its first read begins;
/// the router's set, {12}, arrives and drops the other 7. The demand read
/// of 12 then begins as soon as the worker is free, and a demand read asked
/// for once 12 has landed (layer 2's) begins at once: without the drop,
/// the worker would have taken a stale bet in between and the second
/// demand read would have waited for it.
#[test]
fn a_stale_bet_never_delays_a_demand_read() {
    let v = common::vault(3, 16, 20_000, &[]);
    let read = Duration::from_millis(200);
    let (s, began) = streamer(&v, 32, 1, read);
    let offset = |layer, expert| s.expert_info(layer, expert).unwrap().offset;
    s.prefetch_set(1, &[0, 1, 2, 3, 4, 5, 6, 7], Priority::Speculative)
        .unwrap();
    assert_eq!(began.recv_timeout(WAIT).unwrap(), offset(1, 0));
    s.prefetch_set(1, &[12], Priority::Demand).unwrap();
    claim_all(&v, &s, 1, &[12]);
    assert_eq!(
        began.recv_timeout(WAIT).unwrap(),
        offset(1, 12),
        "the demand read came next"
    );
    let asked = Instant::now();
    s.prefetch_set(2, &[3], Priority::Demand).unwrap();
    claim_all(&v, &s, 2, &[3]);
    let waited = asked.elapsed();
    assert_eq!(
        began.recv_timeout(WAIT).unwrap(),
        offset(2, 3),
        "no stale bet was read before it"
    );
    assert!(began.try_recv().is_err(), "nothing else was read");
    // One read's time, never two (a stale bet's read before it): generous
    // for a loaded machine, below the 400 ms two reads take.
    assert!(
        waited < read * 2,
        "layer 2's demand read took {waited:?}: it waited for another read"
    );
    let st = s.stats();
    assert_eq!(st.speculative_dropped, 7, "{st:?}");
    assert_eq!((st.reads_speculative, st.reads_demand), (1, 2), "{st:?}");
}

/// A bet begins only while no demand read is in progress: with 4 workers
/// and a slow disk, a layer's two demand reads begin, and the bets queued
/// behind them wait (two workers idle) until both have ended, so the demand
/// reads have the drive to themselves; then the bets begin at once.
#[test]
fn bets_wait_while_a_demand_read_is_in_progress() {
    let v = common::vault(3, 16, 20_000, &[]);
    let read = Duration::from_millis(300);
    let (s, began) = streamer(&v, 32, 4, read);
    let offset = |layer, expert| s.expert_info(layer, expert).unwrap().offset;
    let t0 = Instant::now();
    s.prefetch_set(1, &[3, 4], Priority::Demand).unwrap();
    s.prefetch_set(2, &[5, 6], Priority::Speculative).unwrap();
    let mut first = vec![
        began.recv_timeout(WAIT).unwrap(),
        began.recv_timeout(WAIT).unwrap(),
    ];
    first.sort_unstable();
    assert_eq!(
        first,
        vec![offset(1, 3), offset(1, 4)],
        "the demand reads first"
    );
    assert!(
        began.recv_timeout(read / 2).is_err(),
        "a bet began while the demand reads were in progress"
    );
    let mut bets = vec![
        began.recv_timeout(WAIT).unwrap(),
        began.recv_timeout(WAIT).unwrap(),
    ];
    let after = t0.elapsed();
    bets.sort_unstable();
    assert_eq!(bets, vec![offset(2, 5), offset(2, 6)]);
    assert!(
        after >= read,
        "the bets began {after:?} after the demand reads"
    );
    claim_all(&v, &s, 1, &[3, 4]);
    until(&s, "the bets are read", |st| st.reads_speculative == 2);
}

/// A bet its layer's set did not name, whose read had already landed, is
/// the first slot to evict: it stays in the ring for a later token, but it
/// no longer keeps a slot from the experts the engine uses. (An unclaimed
/// load is otherwise spared for 4 turns of the ring, as the head of a burst
/// about to be claimed: in a decode whose ring barely holds a token's
/// experts, the wrong guesses of a few tokens then took a third of the
/// slots, and every claim after them missed.) A ring of 8: layer 0's
/// experts 0-5 computed, a bet on layer 1's {0, 7}, read; the router picks
/// {7, 3}. The read of 3 takes the wrong bet's slot, not an expert the
/// engine claimed.
#[test]
fn a_wrong_bet_that_was_read_is_the_first_to_go() {
    let v = common::vault(3, 16, 20_000, &[]);
    let (s, _began) = streamer(&v, 8, 1, Duration::ZERO);
    s.prefetch_set(0, &[0, 1, 2, 3, 4, 5], Priority::Demand)
        .unwrap();
    claim_all(&v, &s, 0, &[0, 1, 2, 3, 4, 5]);
    s.prefetch_set(1, &[0, 7], Priority::Speculative).unwrap();
    until(&s, "the bet is read", |st| st.reads_speculative == 2);
    s.prefetch_set(1, &[7, 3], Priority::Demand).unwrap();
    claim_all(&v, &s, 1, &[7, 3]);
    let st = s.stats();
    assert_eq!((st.prediction_routed, st.prediction_hits), (2, 1), "{st:?}");
    assert_eq!(st.evicted_unclaimed, 1, "the wrong bet was evicted: {st:?}");
    assert!(!s.is_resident(1, 0), "the wrong bet's slot went to 3");
    for e in 0..6 {
        assert!(s.is_resident(0, e), "layer 0's expert {e} stays: {st:?}");
    }
    assert!(s.is_resident(1, 7) && s.is_resident(1, 3));
}
