//! Hot-path latencies of the streamer (run: `cargo bench --bench streamer`).
//!
//! - `claim_resident`: claim of an expert already in the ring, plus the
//!   release when the guard drops;
//! - `prefetch_resident`: prefetch of an expert already in the ring;
//! - `prefetch_evict_4096`: prefetch that must evict, on a 4096-slot ring
//!   (the read it queues runs on the workers, not in the measured thread);
//!   `prefetch_evict_4096_adaptive`: the same under the adaptive policy.

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use smoe::vault::synth::SynthSpec;
use smoe::{Config, DirectIo, Policy, Priority, Streamer};

fn synth(dir: &std::path::Path, layers: u32, experts: u32) {
    SynthSpec {
        n_layers: layers,
        n_experts: experts,
        blob_bytes: 3000,
        dense_layers: vec![],
        seed: 9,
        top_k: 8,
    }
    .write(dir, &mut |_| {})
    .unwrap();
}

fn hot_paths(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    synth(dir.path(), 4, 16);
    let s = Streamer::open(
        dir.path(),
        Config {
            ring_slots: 64,
            workers: 2,
            direct_io: DirectIo::Off,
            ..Config::default()
        },
    )
    .unwrap();
    drop(
        s.claim_wait(2, 5, Duration::from_secs(10))
            .unwrap()
            .unwrap(),
    );
    c.bench_function("claim_resident", |b| {
        b.iter(|| {
            let claim = s.claim(2, 5).unwrap().unwrap();
            std::hint::black_box(claim.as_ptr());
        })
    });
    c.bench_function("prefetch_resident", |b| {
        b.iter(|| s.prefetch(2, 5, Priority::Demand).unwrap())
    });
    // The same claim without counting it in the histogram: what counting costs.
    let uncounted = Streamer::open(
        dir.path(),
        Config {
            ring_slots: 64,
            workers: 2,
            direct_io: DirectIo::Off,
            freq_path: Some(std::path::PathBuf::new()),
            count_claims: false,
            ..Config::default()
        },
    )
    .unwrap();
    drop(
        uncounted
            .claim_wait(2, 5, Duration::from_secs(10))
            .unwrap()
            .unwrap(),
    );
    c.bench_function("claim_resident_histogram_off", |b| {
        b.iter(|| {
            let claim = uncounted.claim(2, 5).unwrap().unwrap();
            std::hint::black_box(claim.as_ptr());
        })
    });
}

fn evicting_prefetch(c: &mut Criterion) {
    for (name, policy) in [
        ("prefetch_evict_4096", Policy::Lru),
        ("prefetch_evict_4096_adaptive", Policy::Adaptive),
    ] {
        evicting_prefetch_with(c, name, policy);
    }
}

fn evicting_prefetch_with(c: &mut Criterion, name: &str, policy: Policy) {
    let dir = tempfile::tempdir().unwrap();
    // 32768 experts (256 layers × 128) through 4096 slots, cycling through
    // them in order: a prefetch almost always finds its expert gone and
    // evicts (the policy's victim). One worker, so on a 2-core machine the
    // measured thread and the worker reading the queued blobs each have a
    // core (with two workers, three busy threads share two cores and the
    // figure measures preemption).
    const EXPERTS: u32 = 32768;
    synth(dir.path(), EXPERTS / 128, 128);
    let s = Streamer::open(
        dir.path(),
        Config {
            ring_slots: 4096,
            workers: 1,
            direct_io: DirectIo::Off,
            prewarm: false,
            policy,
            ..Config::default()
        },
    )
    .unwrap();
    let mut next = 0u32;
    let mut issued = 0u64;
    let mut prefetch_next = || {
        let (l, e) = (next / 128, next % 128);
        next = (next + 1) % EXPERTS;
        s.prefetch(l, e, Priority::Speculative).unwrap();
    };
    // Reads land far slower than prefetches are issued, so time batches of
    // 512 prefetches and, untimed, let the workers finish each batch's reads
    // (every slot loaded again) before the next: every timed prefetch finds
    // idle slots to evict.
    let settle = |issued: u64| {
        while s.stats().resident < issued.min(4096) {
            std::thread::sleep(Duration::from_micros(200));
        }
    };
    for _ in 0..16 {
        for _ in 0..512 {
            prefetch_next();
        }
        issued += 512;
        settle(issued);
    }
    let warm = issued;
    let before = s.stats().evictions;
    c.bench_function(name, |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut left = iters;
            while left > 0 {
                let n = left.min(512);
                let t = Instant::now();
                for _ in 0..n {
                    prefetch_next();
                }
                total += t.elapsed();
                issued += n;
                left -= n;
                settle(issued);
            }
            total
        })
    });
    let evicted = s.stats().evictions - before;
    let timed = issued - warm;
    if timed == 0 {
        // Filtered out (`cargo bench -- NAME` naming another benchmark).
        return;
    }
    assert!(evicted > 0, "the benchmark did not evict");
    println!(
        "{name}: {:.1}% of the timed prefetches evicted ({evicted} of {timed})",
        100.0 * evicted as f64 / timed.max(1) as f64
    );
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(4)).warm_up_time(Duration::from_secs(3));
    targets = hot_paths, evicting_prefetch
}
criterion_main!(benches);
