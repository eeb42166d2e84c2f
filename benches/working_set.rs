//! Working sets (docs/c-api.md "Working sets"): wake-up, cost, and the prefill pattern.
//! (run: `cargo bench --bench working_set`; one part: `-- wake`, `-- cost`,
//! `-- prefill`)
//!
//! - **wake**: the setup of `benches/claim_wait.rs` (2 MiB blobs on tmpfs,
//!   8 slots, 2 workers, 320 pairs a round): prefetch an expert that is not
//!   resident and time until its claim returns, by a busy poll of `claim`,
//!   by `claim_wait`, and by `claim_any` over the set of that one member;
//!   then over a set of 4 members prefetched together, until the first
//!   claim returns (`claim_any` against `claim_wait` on the set's head).
//!   The ways take turns pair by pair, so a machine's drift over a round
//!   weighs on each alike. Target: `claim_any` adds no more than
//!   `claim_wait` (median added over the busy poll ≤ 10 µs).
//! - **cost**: 64 resident experts. `prefetch_set` of the 64 against 64
//!   `prefetch`; claiming all 64 by `claim_any` (the set shrinking by the
//!   member claimed) against 64 `claim`s. Targets: ≤ 1× and ≤ 1.5×.
//! - **prefill**: a layer loop where every layer's set is all its experts
//!   (8 layers × 64 experts of 1 MiB, ring of a quarter of them, direct
//!   I/O from a vault in `SMOE_BENCH_DIR`, default /var/tmp, so the reads
//!   are the disk's), compute simulated by a busy loop: the time a pass of
//!   reads alone takes, divided by its experts. Three ways, in turn in each
//!   of three rounds: claim-all-then-compute (wait for every expert of the layer,
//!   then compute them); per-expert `claim_any` (compute each as it lands,
//!   release it, so its slot takes the next read); and the same with the
//!   next layer's set queued as speculation while a layer computes
//!   (layer-ahead). Target: `claim_any` ≤ 0.6× the claim-all time.

use std::hint::black_box;
use std::time::{Duration, Instant};

use smoe::{Config, DirectIo, Priority, Streamer};

use smoe_test_support as common;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort_unstable();
    v[v.len() / 2]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn tmpfs() -> std::path::PathBuf {
    if std::path::Path::new("/dev/shm").is_dir() {
        std::path::PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Way {
    Poll,
    Wait,
    Any,
}

/// Time from the prefetch of `width` experts not resident, from `first`
/// on, to the first claim's return.
fn first_claim(s: &Streamer, experts: u32, first: u32, way: Way, width: u32) -> Duration {
    let set: Vec<u32> = (0..width).map(|k| (first + k) % experts).collect();
    let t = Instant::now();
    s.prefetch_set(0, &set, Priority::Demand).unwrap();
    let claim = match way {
        Way::Poll => loop {
            if let Some(c) = s.claim(0, set[0]).unwrap() {
                break c;
            }
            std::hint::spin_loop();
        },
        Way::Wait => s
            .claim_wait(0, set[0], Duration::from_secs(10))
            .unwrap()
            .unwrap(),
        Way::Any => s
            .claim_any(0, &set, Duration::from_secs(10))
            .unwrap()
            .unwrap(),
    };
    let took = t.elapsed();
    drop(claim);
    // Let the other members land, so the next pair starts quiet.
    for &e in &set[1..] {
        drop(s.claim_wait(0, e, Duration::from_secs(10)).unwrap());
    }
    took
}

fn wake() {
    const PAIRS: usize = 320;
    let experts = 24;
    let v = common::vault_in(
        tempfile::tempdir_in(tmpfs()).unwrap(),
        1,
        experts,
        2 << 20,
        &[],
    );
    let s = Streamer::open(v.dir.path(), common::quiet_config(8, 2)).unwrap();
    println!(
        "wake: first claim after a prefetch of 2 MiB experts (tmpfs, 8 slots, 2 workers), \
         the ways interleaved pair by pair, median of {PAIRS}:"
    );
    let ways = [
        (Way::Poll, 1),
        (Way::Wait, 1),
        (Way::Any, 1),
        (Way::Wait, 4),
        (Way::Any, 4),
    ];
    let mut next = 0u32;
    for round in 0..3 {
        let mut times = vec![Vec::with_capacity(PAIRS); ways.len()];
        for i in 0..PAIRS {
            // Each pair runs every way once, in an order that rotates, so
            // no way always follows the same one.
            for k in 0..ways.len() {
                let w = (i + k) % ways.len();
                let (way, width) = ways[w];
                // Cycle through more experts than slots, so each prefetch
                // reads.
                times[w].push(first_claim(&s, experts, next, way, width));
                next = (next + width) % experts;
            }
        }
        let m: Vec<f64> = times.into_iter().map(|t| us(median(t))).collect();
        println!(
            "  round {round}: one member: poll {:.1} µs, claim_wait {:+.1} µs, claim_any {:+.1} µs \
             over it (claim_any {:+.1} µs over claim_wait); 4 members: claim_wait(head) {:.1} µs, \
             claim_any {:.1} µs",
            m[0],
            m[1] - m[0],
            m[2] - m[0],
            m[2] - m[1],
            m[3],
            m[4],
        );
    }
}

fn cost() {
    const N: u32 = 64;
    const REPS: usize = 2000;
    let v = common::vault(1, N, 20_000, &[]);
    let s = Streamer::open(v.dir.path(), common::quiet_config(N, 2)).unwrap();
    let set: Vec<u32> = (0..N).collect();
    for &e in &set {
        drop(s.claim_wait(0, e, Duration::from_secs(10)).unwrap());
    }
    let time = |f: &mut dyn FnMut()| {
        let batches: Vec<Duration> = (0..15)
            .map(|_| {
                let t = Instant::now();
                for _ in 0..REPS {
                    f();
                }
                t.elapsed() / REPS as u32
            })
            .collect();
        median(batches)
    };
    println!("cost: 64 resident experts, median of 15 batches of {REPS}:");
    for round in 0..3 {
        let singles = time(&mut || {
            for &e in &set {
                s.prefetch(0, black_box(e), Priority::Demand).unwrap();
            }
        });
        let as_set = time(&mut || {
            black_box(
                s.prefetch_set(0, black_box(&set), Priority::Demand)
                    .unwrap(),
            );
        });
        let mut held = Vec::with_capacity(N as usize);
        let claims = time(&mut || {
            for &e in &set {
                held.push(s.claim_ticket(0, black_box(e)).unwrap().unwrap());
            }
            for h in held.drain(..) {
                s.release_ticket(h.ticket).unwrap();
            }
        });
        let mut left = set.clone();
        let any = time(&mut || {
            left.clone_from(&set);
            while !left.is_empty() {
                let c = s
                    .claim_any_ticket(0, &left, Duration::ZERO)
                    .unwrap()
                    .unwrap();
                let k = left.iter().position(|&e| e == c.expert).unwrap();
                left.remove(k);
                held.push(c);
            }
            for h in held.drain(..) {
                s.release_ticket(h.ticket).unwrap();
            }
        });
        println!(
            "  round {round}: 64 prefetch {:.2} µs, prefetch_set {:.2} µs ({:.2}x); \
             64 claim+release {:.2} µs, claim_any+release {:.2} µs ({:.2}x)",
            us(singles),
            us(as_set),
            as_set.as_secs_f64() / singles.as_secs_f64(),
            us(claims),
            us(any),
            any.as_secs_f64() / claims.as_secs_f64(),
        );
    }
}

/// Busy work for `d` (an expert's simulated compute).
fn compute(d: Duration, data: &[u8]) -> u64 {
    let t = Instant::now();
    let mut sum = 0u64;
    while t.elapsed() < d {
        for &b in data.iter().step_by(4096) {
            sum = sum.wrapping_add(u64::from(b));
        }
    }
    sum
}

/// How a layer loop waits for its experts.
#[derive(Clone, Copy, PartialEq)]
enum Loop {
    /// Wait for every expert of the layer, then compute them (the way
    /// before working sets).
    ClaimAll,
    /// `claim_any`: compute each expert as it lands, release it.
    Any,
    /// `claim_any`, with the next layer's set queued as speculation while
    /// this one computes (layer-ahead, as in the llama.cpp glue's prefill).
    AnyAhead,
}

/// One pass over every layer, all experts each: (wall time, bytes read).
fn layer_loop(
    s: &Streamer,
    layers: u32,
    experts: u32,
    per_expert: Duration,
    way: Loop,
) -> (Duration, u64) {
    let read0 = s.stats().bytes_read;
    let set: Vec<u32> = (0..experts).collect();
    let t = Instant::now();
    let mut sum = 0u64;
    for layer in 0..layers {
        let _ = s.prefetch_set(layer, &set, Priority::Demand).unwrap();
        if way == Loop::AnyAhead && layer + 1 < layers {
            let _ = s
                .prefetch_set(layer + 1, &set, Priority::Speculative)
                .unwrap();
        }
        if way == Loop::ClaimAll {
            let mut held = Vec::with_capacity(set.len());
            for &e in &set {
                held.push(
                    s.claim_wait(layer, e, Duration::from_secs(60))
                        .unwrap()
                        .unwrap(),
                );
            }
            for c in &held {
                sum = sum.wrapping_add(compute(per_expert, c));
            }
        } else {
            let mut left = set.clone();
            while !left.is_empty() {
                let c = s
                    .claim_any(layer, &left, Duration::from_secs(60))
                    .unwrap()
                    .unwrap();
                let e = c.info().expert;
                sum = sum.wrapping_add(compute(per_expert, &c));
                left.retain(|&m| m != e);
            }
        }
    }
    black_box(sum);
    (t.elapsed(), s.stats().bytes_read - read0)
}

fn prefill() {
    let (layers, experts) = (8u32, 64u32);
    let dir = std::env::var_os("SMOE_BENCH_DIR")
        .map_or_else(|| "/var/tmp".into(), std::path::PathBuf::from);
    let v = common::vault_in(
        tempfile::tempdir_in(dir).unwrap(),
        layers,
        experts,
        (1 << 20) - 16384,
        &[],
    );
    let ring = layers * experts / 4;
    let s = Streamer::open(
        v.dir.path(),
        Config {
            direct_io: DirectIo::Auto,
            ..common::quiet_config(ring, 16)
        },
    )
    .unwrap();
    // The disk's pace: a pass with no compute.
    let (io, bytes) = layer_loop(&s, layers, experts, Duration::ZERO, Loop::ClaimAll);
    let per_expert = io / (layers * experts);
    println!(
        "prefill: {layers} layers x {experts} experts of 1 MiB, ring {ring} slots, 16 workers, {}; \
         reads alone {:.1} ms a layer ({:.2} GB/s), compute {:.0} µs an expert:",
        if s.stats().direct_io == 1 { "direct I/O" } else { "buffered" },
        io.as_secs_f64() * 1e3 / f64::from(layers),
        bytes as f64 / io.as_secs_f64() / 1e9,
        us(per_expert)
    );
    let ms = |d: Duration| d.as_secs_f64() * 1e3 / f64::from(layers);
    for round in 0..3 {
        let (all, all_bytes) = layer_loop(&s, layers, experts, per_expert, Loop::ClaimAll);
        let (any, any_bytes) = layer_loop(&s, layers, experts, per_expert, Loop::Any);
        let (spec0, lost0) = (s.stats().reads_speculative, s.stats().evicted_unclaimed);
        let (ahead, ahead_bytes) = layer_loop(&s, layers, experts, per_expert, Loop::AnyAhead);
        let spec = s.stats().reads_speculative - spec0;
        let lost = s.stats().evicted_unclaimed - lost0;
        println!(
            "  round {round}: claim-all-then-compute {:.1} ms a layer ({} MiB read); \
             claim_any per expert {:.1} ms ({} MiB): {:.2}x; \
             with the next layer queued ahead {:.1} ms ({} MiB, {spec} speculative reads, {lost} evicted unclaimed): {:.2}x",
            ms(all),
            all_bytes >> 20,
            ms(any),
            any_bytes >> 20,
            any.as_secs_f64() / all.as_secs_f64(),
            ms(ahead),
            ahead_bytes >> 20,
            ahead.as_secs_f64() / all.as_secs_f64()
        );
    }
}

fn main() {
    // `cargo bench` passes `--bench`; a part's name picks that part.
    let parts: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let run = |name: &str| parts.is_empty() || parts.iter().any(|p| p == name);
    if run("wake") {
        wake();
    }
    if run("cost") {
        cost();
    }
    if run("prefill") {
        prefill();
    }
}
