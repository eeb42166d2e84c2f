//! Claim-path scaling (run: `cargo bench --bench claim_scaling`).
//!
//! Each of N threads claims and releases resident experts in a loop for a
//! fixed time; the figure is the total claim + release pairs per second.
//!
//! - `distinct`: every thread has its own experts (thread t claims experts
//!   t, t + N, t + 2N, ... of one layer, so neighbouring experts, and the
//!   slots the ring gave them, belong to different threads);
//! - `same`: every thread claims the same expert. The first claims that
//!   collide turn its slot to shared mode (per-thread pin counts instead of
//!   the state word's refcount); the one-thread figure is measured before
//!   that, and `1 (shared)` measures one thread again after it.
//!
//! It prints one line per (case, policy, threads) and, per case, each
//! thread count's throughput as a multiple of one thread's, measured in the
//! same run. Thread counts: 1, 2, 4, 8, 16, up to the machine's cores
//! (`SMOE_BENCH_THREADS=1,2,...` to choose). On a machine with fewer cores
//! than threads the extra threads only share cores.
//!
//! Also: a scan whose prefetch window equals the ring reads each blob once
//! (`scan_window`: bytes read / payload, expected 1.00).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use smoe::vault::synth::SynthSpec;
use smoe::{Config, DirectIo, Policy, Priority, Streamer};

const LAYERS: u32 = 2;
const EXPERTS: u32 = 256;
const RUN: Duration = Duration::from_millis(700);

fn open(dir: &std::path::Path, policy: Policy) -> Streamer {
    Streamer::open(
        dir,
        Config {
            ring_slots: LAYERS * EXPERTS,
            workers: 4,
            direct_io: DirectIo::Off,
            prewarm: false,
            freq_path: Some(std::path::PathBuf::new()),
            policy,
            ..Config::default()
        },
    )
    .expect("open the streamer")
}

/// Claim + release pairs per second over `threads` threads.
fn pairs_per_second(s: &Streamer, threads: u32, same: bool) -> f64 {
    let stop = AtomicBool::new(false);
    let start = Barrier::new(threads as usize + 1);
    let total: u64 = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (stop, start) = (&stop, &start);
                scope.spawn(move || {
                    let mine: Vec<u32> = if same {
                        vec![7]
                    } else {
                        (t..EXPERTS).step_by(threads as usize).collect()
                    };
                    start.wait();
                    let mut n = 0u64;
                    let mut i = 0;
                    while !stop.load(Ordering::Relaxed) {
                        for _ in 0..256 {
                            let c = s.claim(1, mine[i]).unwrap().expect("resident");
                            std::hint::black_box(c.as_ptr());
                            drop(c);
                            i = if i + 1 == mine.len() { 0 } else { i + 1 };
                        }
                        n += 256;
                    }
                    n
                })
            })
            .collect();
        start.wait();
        let t0 = Instant::now();
        std::thread::sleep(RUN);
        stop.store(true, Ordering::Relaxed);
        let n: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
        let secs = t0.elapsed().as_secs_f64();
        (n as f64 / secs) as u64
    });
    total as f64
}

fn thread_counts() -> Vec<u32> {
    if let Ok(list) = std::env::var("SMOE_BENCH_THREADS") {
        return list
            .split(',')
            .filter_map(|x| x.trim().parse().ok())
            .filter(|&n| n > 0)
            .collect();
    }
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get() as u32);
    [1, 2, 4, 8, 16]
        .into_iter()
        .filter(|&n| n <= cores.max(2))
        .collect()
}

fn scan_window(dir: &std::path::Path) {
    // 64 blobs of 256 KiB through a 16-slot ring, 16 prefetches in flight.
    let s = Streamer::open(
        dir,
        Config {
            ring_slots: 16,
            workers: 4,
            direct_io: DirectIo::Off,
            prewarm: false,
            freq_path: Some(std::path::PathBuf::new()),
            ..Config::default()
        },
    )
    .expect("open");
    let entries: Vec<(u32, u32)> = s
        .vault()
        .entries()
        .iter()
        .map(|e| (e.layer, e.expert))
        .collect();
    let window = s.stats().ring_slots as usize;
    let payload: u64 = s.vault().entries().iter().map(|e| e.size).sum();
    let t0 = Instant::now();
    for &(l, e) in entries.iter().take(window) {
        s.prefetch(l, e, Priority::Demand).unwrap();
    }
    for (i, &(l, e)) in entries.iter().enumerate() {
        let c = s
            .claim_wait(l, e, Duration::from_secs(30))
            .unwrap()
            .expect("read within 30 s");
        std::hint::black_box(c.as_ptr());
        drop(c);
        if let Some(&(l2, e2)) = entries.get(i + window) {
            s.prefetch(l2, e2, Priority::Demand).unwrap();
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let st = s.stats();
    println!(
        "scan_window: {} blobs, window {window} = ring, read {:.2}x the payload ({} reads), {:.2} GB/s",
        entries.len(),
        st.bytes_read as f64 / payload as f64,
        st.reads_demand + st.reads_speculative,
        st.bytes_read as f64 / secs / 1e9
    );
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` passes nothing
    // and expects a quick run.
    let quick = !std::env::args().any(|a| a == "--bench");
    let dir = tempfile::tempdir().expect("temporary directory");
    SynthSpec {
        n_layers: LAYERS,
        n_experts: EXPERTS,
        blob_bytes: 4096,
        dense_layers: vec![],
        seed: 3,
        top_k: 8,
    }
    .write(dir.path(), &mut |_| {})
    .expect("write the vault");
    let threads = if quick { vec![1, 2] } else { thread_counts() };
    for same in [false, true] {
        for policy in [Policy::Lru, Policy::Adaptive] {
            let s = open(dir.path(), policy);
            for e in 0..EXPERTS {
                drop(
                    s.claim_wait(1, e, Duration::from_secs(10))
                        .unwrap()
                        .unwrap(),
                );
            }
            let mut one = 0.0;
            for &n in &threads {
                let r = pairs_per_second(&s, n, same);
                if n == 1 {
                    one = r;
                }
                println!(
                    "claim_release {} {:?} threads {n:>2}: {:>7.1} M pairs/s, {:>5.2}x one thread",
                    if same { "same    " } else { "distinct" },
                    policy,
                    r / 1e6,
                    r / one.max(1.0)
                );
            }
            if same && threads.len() > 1 {
                let r = pairs_per_second(&s, 1, same);
                println!(
                    "claim_release same     {policy:?} threads  1 (shared): {:>7.1} M pairs/s, {:>5.2}x one thread",
                    r / 1e6,
                    r / one.max(1.0)
                );
            }
        }
    }
    let scan_dir = tempfile::tempdir().expect("temporary directory");
    SynthSpec {
        n_layers: 1,
        n_experts: 64,
        blob_bytes: 256 << 10,
        dense_layers: vec![],
        seed: 5,
        top_k: 8,
    }
    .write(scan_dir.path(), &mut |_| {})
    .expect("write the scan vault");
    scan_window(scan_dir.path());
}
