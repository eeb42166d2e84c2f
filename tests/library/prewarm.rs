//! The histogram through the streamer, and the pre-warm thread: budget,
//! order, pause/resume, close in the middle.

use smoe_test_support as common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use smoe::{Config, Streamer};

const WAIT: Duration = Duration::from_secs(10);

fn config(slots: u32, prewarm_slots: u32) -> Config {
    Config {
        ring_slots: slots,
        workers: 4,
        prewarm: prewarm_slots > 0,
        prewarm_slots,
        ..Config::default()
    }
}

/// Claims expert `e` of layer `l` `n` times, releasing each.
fn claim_n(s: &Streamer, l: u32, e: u32, n: u32) {
    for _ in 0..n {
        drop(s.claim_wait(l, e, WAIT).unwrap().unwrap());
    }
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A vault of 4 × 64 small experts whose histogram holds, for expert
/// (l, e), a count given by `count(l, e)`.
fn vault_with_history(count: impl Fn(u32, u32) -> u32) -> common::TestVault {
    let v = common::vault(4, 64, 3000, &[]);
    let s = Streamer::open(&v.file, config(256, 0)).unwrap();
    for l in 0..4 {
        for e in 0..64 {
            claim_n(&s, l, e, count(l, e));
        }
    }
    s.flush_stats().unwrap();
    drop(s);
    v
}

#[test]
fn histogram_accumulates_across_sessions() {
    let v = common::vault(2, 8, 3000, &[]);
    let freq = v.dir.path().join("expert_freq.bin");
    {
        let s = Streamer::open(&v.file, config(16, 0)).unwrap();
        assert!(
            s.warnings().iter().any(|w| w.contains("expert_freq.bin")),
            "a missing histogram is noted: {:?}",
            s.warnings()
        );
        claim_n(&s, 1, 3, 5);
        claim_n(&s, 0, 0, 2);
    } // persisted at close
    assert!(freq.exists(), "histogram written at close");
    {
        let s = Streamer::open(&v.file, config(16, 0)).unwrap();
        let h = s.histogram();
        assert_eq!(h[8 + 3], 5);
        assert_eq!(h[0], 2);
        assert_eq!(s.stats().freq_ignored, 0);
        claim_n(&s, 1, 3, 1);
        s.flush_stats().unwrap();
        claim_n(&s, 1, 3, 1);
    }
    let s = Streamer::open(&v.file, config(16, 0)).unwrap();
    assert_eq!(s.histogram()[8 + 3], 7, "5 + 1 + 1, each counted once");
}

#[test]
fn bad_histogram_is_ignored_and_replaced() {
    let v = common::vault(2, 8, 3000, &[]);
    let freq = v.dir.path().join("expert_freq.bin");
    // This vault's histogram, damaged: its checksum no longer matches. (A
    // file whose header names another vault, or is no histogram at all, is
    // protected instead: tests/library/hardening_files.rs.)
    let vault_id = smoe::vault::Vault::open(&v.file).unwrap().header().vault_id;
    let mut bytes = smoe::internals::popularity::encode(&vault_id, 2, 8, &[9; 16]).unwrap();
    bytes[40 + 8] ^= 0x55;
    std::fs::write(&freq, &bytes).unwrap();
    let s = Streamer::open(&v.file, config(16, 0)).unwrap();
    assert_eq!(s.stats().freq_ignored, 1);
    assert!(
        s.warnings().iter().any(|w| w.contains("expert_freq.bin")),
        "{:?}",
        s.warnings()
    );
    assert!(s.histogram().iter().all(|&c| c == 0));
    claim_n(&s, 0, 1, 1);
    drop(s);
    let s = Streamer::open(&v.file, config(16, 0)).unwrap();
    assert_eq!(s.stats().freq_ignored, 0);
    assert_eq!(s.histogram()[1], 1);
}

#[test]
fn empty_freq_path_disables_persistence() {
    let v = common::vault(2, 8, 3000, &[]);
    let s = Streamer::open(
        &v.file,
        Config {
            freq_path: Some(PathBuf::new()),
            ..config(16, 0)
        },
    )
    .unwrap();
    claim_n(&s, 0, 1, 3);
    s.flush_stats().unwrap();
    drop(s);
    assert!(!v.dir.path().join("expert_freq.bin").exists());
}

/// The hottest `n` dense ids of a count function, ties by ascending id.
fn hottest(n: usize, count: impl Fn(u32, u32) -> u32) -> Vec<u32> {
    let mut ids: Vec<(u32, u32)> = (0..256u32)
        .map(|id| (count(id / 64, id % 64), id))
        .filter(|&(c, _)| c > 0)
        .collect();
    ids.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    ids.into_iter().take(n).map(|(_, id)| id).collect()
}

fn resident_ids(s: &Streamer) -> Vec<u32> {
    (0..256u32)
        .filter(|&id| s.is_resident(id / 64, id % 64))
        .collect()
}

#[test]
fn prewarm_fills_exactly_its_budget_with_the_hottest() {
    // Counts with many ties: expert e of layer l has (e % 7) + (l == 2) claims.
    let count = |l: u32, e: u32| e % 7 + u32::from(l == 2);
    let v = vault_with_history(count);
    let s = Streamer::open(&v.file, config(200, 30)).unwrap();
    assert_eq!(s.stats().prewarm_slots, 30);
    wait_until("30 pre-warm reads", || s.stats().reads_prewarm >= 30);
    std::thread::sleep(Duration::from_millis(200));
    let st = s.stats();
    assert_eq!(st.reads_prewarm, 30, "stops at its budget");
    assert_eq!(st.reads_demand + st.reads_speculative, 0);
    let mut want = hottest(30, count);
    want.sort_unstable();
    assert_eq!(
        resident_ids(&s),
        want,
        "the 30 hottest, ties by (layer, expert)"
    );
    // And they are hits.
    let id = want[0];
    let c = s.claim(id / 64, id % 64).unwrap().expect("pre-warmed");
    assert!(c.hit());
}

#[test]
fn default_budget_is_slots_minus_max_128_or_a_quarter() {
    let v = common::vault(4, 64, 3000, &[]);
    for (slots, budget) in [(100, 0), (128, 0), (200, 72), (256, 128)] {
        let s = Streamer::open(
            &v.file,
            Config {
                ring_slots: slots,
                workers: 2,
                ..Config::default()
            },
        )
        .unwrap();
        assert_eq!(s.stats().prewarm_slots, budget, "{slots} slots");
    }
}

#[test]
fn pause_holds_then_resume_rewarms() {
    let count = |_l: u32, e: u32| 64 - e; // 256 experts with counts > 0
    let v = vault_with_history(count);
    let s = Streamer::open(&v.file, config(200, 120)).unwrap();
    wait_until("a few pre-warm reads", || s.stats().reads_prewarm >= 3);
    s.prewarm_pause(true);
    let r0 = s.stats().reads_prewarm;
    std::thread::sleep(Duration::from_millis(500));
    let r1 = s.stats().reads_prewarm;
    assert!(r1 <= r0 + 1, "{} reads started while paused", r1 - r0);
    assert!(
        r1 < 120,
        "pre-warm finished before the pause; test too fast"
    );
    s.prewarm_pause(false);
    wait_until("the whole budget", || s.stats().reads_prewarm >= 120);
    let warmed: Vec<u32> = hottest(120, count);
    assert!(warmed.iter().all(|&id| s.is_resident(id / 64, id % 64)));

    // Evict some warm experts with demand traffic while paused, then resume:
    // it re-warms them, within the same budget.
    s.prewarm_pause(true);
    let cold: Vec<u32> = (0..256)
        .filter(|id| !warmed.contains(id))
        .take(136)
        .collect();
    for &id in &cold {
        claim_n(&s, id / 64, id % 64, 1);
    }
    // The claims counted too: the warm set is now the hottest 120 of the
    // updated histogram.
    let counts = s.histogram();
    let targets = hottest(120, |l, e| counts[(l * 64 + e) as usize] as u32);
    let evicted = targets
        .iter()
        .filter(|&&id| !s.is_resident(id / 64, id % 64))
        .count();
    assert!(evicted > 0, "demand traffic evicted nothing");
    let before = s.stats().reads_prewarm;
    s.prewarm_pause(false);
    wait_until("re-warm", || {
        targets.iter().all(|&id| s.is_resident(id / 64, id % 64))
    });
    std::thread::sleep(Duration::from_millis(300));
    let rewarmed = s.stats().reads_prewarm - before;
    assert_eq!(
        rewarmed as usize, evicted,
        "re-warms exactly what was evicted"
    );
}

#[test]
fn resume_with_nothing_evicted_makes_no_pass() {
    // An engine resumes the thread after every token; with its budget warm
    // and nothing evicted since, a resume must cost no pass over the
    // targets. One that follows an eviction re-warms.
    let count = |_l: u32, e: u32| 64 - e;
    let v = vault_with_history(count);
    // A fixed ring: memory pressure on the machine must not retire slots
    // (which is a reason for a pass) during the test.
    let config = Config {
        elastic: false,
        ..config(200, 120)
    };
    let s = Streamer::open(&v.file, config).unwrap();
    wait_until("the whole budget", || s.stats().reads_prewarm >= 120);
    let warmed = hottest(120, count);
    wait_until("the budget resident", || {
        warmed.iter().all(|&id| s.is_resident(id / 64, id % 64))
    });
    // Its own reads evicted nothing here (a fresh ring of 200 slots), but
    // let a pass that saw the last one land finish.
    std::thread::sleep(Duration::from_millis(300));
    let before = s.prewarm_passes();
    for _ in 0..50 {
        s.prewarm_pause(true);
        // a token's all-hit claims
        claim_n(&s, warmed[0] / 64, warmed[0] % 64, 1);
        s.prewarm_pause(false);
        std::thread::sleep(Duration::from_millis(2));
    }
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        s.prewarm_passes() <= before + 1,
        "{} passes over a warm ring in 50 resumes",
        s.prewarm_passes() - before
    );
    assert_eq!(s.stats().evictions, 0);

    // Demand traffic evicts warm experts while paused: the next resume
    // passes, and re-warms them.
    s.prewarm_pause(true);
    let cold: Vec<u32> = (0..256).filter(|id| !warmed.contains(id)).collect();
    for &id in &cold {
        claim_n(&s, id / 64, id % 64, 1);
    }
    assert!(s.stats().evictions > 0, "demand traffic evicted nothing");
    let counts = s.histogram();
    let targets = hottest(120, |l, e| counts[(l * 64 + e) as usize] as u32);
    let passes = s.prewarm_passes();
    s.prewarm_pause(false);
    wait_until("re-warm after evictions", || {
        targets.iter().all(|&id| s.is_resident(id / 64, id % 64))
    });
    assert!(s.prewarm_passes() > passes);
}

#[test]
fn close_in_the_middle_of_prewarm() {
    let v = vault_with_history(|_, e| e + 1);
    for _ in 0..10 {
        let s = Streamer::open(&v.file, config(256, 200)).unwrap();
        std::thread::sleep(Duration::from_millis(7));
        let t = Instant::now();
        drop(s);
        assert!(
            t.elapsed() < Duration::from_secs(1),
            "close took {:?}",
            t.elapsed()
        );
    }
}

#[test]
fn histogram_counting_experts_the_vault_lacks_is_harmless() {
    // Layer 0 is dense: it has no blobs. A histogram file (untrusted input)
    // with a valid checksum may still count ids there; pre-warm must skip
    // them instead of failing the streamer.
    let v = common::vault(4, 64, 3000, &[0]);
    let vault = smoe::vault::Vault::open(&v.file).unwrap();
    let header = vault.header();
    let mut counts = vec![0u64; 4 * 64];
    for (id, count) in counts.iter_mut().enumerate() {
        *count = if id < 64 { 1000 } else { (id % 5) as u64 };
    }
    smoe::internals::popularity::save(
        &v.dir.path().join("expert_freq.bin"),
        &header.vault_id,
        4,
        64,
        &counts,
    )
    .unwrap();
    let s = Streamer::open(&v.file, config(200, 20)).unwrap();
    wait_until("20 pre-warm reads of real experts", || {
        s.stats().reads_prewarm >= 20
    });
    let c = s.claim_wait(1, 4, WAIT).unwrap().expect("still streaming");
    v.check(1, 4, &c);
    assert_eq!(s.stats().io_errors, 0);
}
