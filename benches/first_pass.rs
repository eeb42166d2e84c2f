//! The ring's first pass against its steady state (docs/c-api.md, "The
//! ring's memory"). (run: `cargo bench --bench first_pass`;
//! `SMOE_BENCH_DIR` picks the vault's directory, default /dev/shm, so the
//! reads run at memory speed and what is measured is the software path)
//!
//! A vault of 768 experts of 5 MiB − 16 KiB (3.75 GiB), read by 16 workers
//! through a ring of 384 slots: the first pass reads experts 0..384 into
//! the fresh ring (every page faulted on first touch), the steady pass
//! reads 384..768 into slots already faulted (each evicts one of the
//! first). Both with the ring on transparent huge pages (the default) and
//! without. For scale, a plain loop of 16 threads `pread`ing the same
//! blobs (direct I/O where the filesystem allows) into a rotating ring of
//! 64 slots, once pre-faulted and once fresh. Target: the first pass at
//! least 0.8× the steady state.
//!
//! The kernel zeroes every fresh page before a read may fill it, so a first
//! pass writes each byte twice. What that costs on its own: 16 threads
//! touching every page of a fresh ring-sized mapping (huge pages advised),
//! the zeroing rate Z. With the steady rate S, zeroing then copying each
//! byte, one after the other, runs at 1 / (1/S + 1/Z): what a first pass
//! from memory (tmpfs) costs when nothing overlaps. From a drive slower
//! than Z, the zeroing hides behind the reads.

use std::fs::File;
use std::time::{Duration, Instant};

use smoe::internals::sys::{open_for_streaming, read_at_exact, Reservation};
use smoe::{Config, DirectIo, Populate, Priority, Streamer};

use smoe_test_support as common;

const EXPERTS: u32 = 768;
const BLOB: u64 = (5 << 20) - 16384;
const THREADS: u32 = 16;

fn gbps(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / 1e9
}

/// Streams experts `range` of layer 0, 64 at a time as a working set,
/// claiming each as it lands: the bytes read and the time.
fn pass(s: &Streamer, range: std::ops::Range<u32>) -> (u64, Duration) {
    let read0 = s.stats().bytes_read;
    let t = Instant::now();
    let all: Vec<u32> = range.collect();
    for window in all.chunks(64) {
        s.prefetch_set(0, window, Priority::Demand).unwrap();
        let mut left = window.to_vec();
        while !left.is_empty() {
            let c = s
                .claim_any(0, &left, Duration::from_secs(60))
                .unwrap()
                .unwrap();
            let e = c.info().expert;
            std::hint::black_box(c[0]);
            left.retain(|&m| m != e);
        }
    }
    (s.stats().bytes_read - read0, t.elapsed())
}

/// 16 threads pread every blob into a rotating ring of 64 slots:
/// pre-faulted (`touch`) or fresh.
fn pread_loop(v: &common::TestVault, s: &Streamer, touch: bool) -> (f64, bool) {
    let slot = BLOB.next_multiple_of(16384) as usize;
    let direct = open_for_streaming(&v.file, DirectIo::Auto).unwrap().direct;
    let ring = fresh(64 * slot);
    let base = ring.as_ptr() as usize;
    if touch {
        // SAFETY: the 64 slots lie inside the mapping `ring` owns.
        unsafe { std::ptr::write_bytes(base as *mut u8, 1, 64 * slot) };
    }
    let offsets: Vec<u64> = (0..EXPERTS)
        .map(|e| s.expert_info(0, e).unwrap().offset)
        .collect();
    let t = Instant::now();
    std::thread::scope(|scope| {
        for k in 0..THREADS {
            let offsets = &offsets;
            let path = v.file.clone();
            scope.spawn(move || {
                let file: File = open_for_streaming(&path, DirectIo::Auto).unwrap().file;
                for e in (k..EXPERTS).step_by(THREADS as usize) {
                    let i = (e % 64) as usize;
                    // SAFETY: each thread writes only the slots e % 64 of its
                    // own experts; two threads may share a slot, and only
                    // the bytes' arrival is timed, never their contents.
                    let buf = unsafe {
                        std::slice::from_raw_parts_mut((base + i * slot) as *mut u8, slot)
                    };
                    read_at_exact(&file, buf, offsets[e as usize]).unwrap();
                }
            });
        }
    });
    (gbps(u64::from(EXPERTS) * slot as u64, t.elapsed()), direct)
}

/// A fresh mapping of `len` bytes, as the ring's own: reserved, nothing
/// committed until touched, huge pages advised where the OS has them
/// (`AlignedBuffer` commits and zeroes its bytes when made, so it cannot
/// stand for a fresh ring).
fn fresh(len: usize) -> Reservation {
    let r = Reservation::new(len, 1 << 21).unwrap();
    r.advise_huge_pages().unwrap();
    r
}

/// 16 threads touch every 4 KiB page of a fresh mapping of `bytes`: the
/// rate the kernel hands out zeroed pages, in GB/s.
fn zeroing_rate(bytes: usize) -> f64 {
    let fresh = fresh(bytes);
    let base = fresh.as_ptr() as usize;
    let share = bytes / THREADS as usize;
    let t = Instant::now();
    std::thread::scope(|scope| {
        for k in 0..THREADS as usize {
            scope.spawn(move || {
                for at in (k * share..(k + 1) * share).step_by(4096) {
                    // SAFETY: `at < bytes`, inside the mapping; each thread
                    // writes only its own share.
                    unsafe { ((base + at) as *mut u8).write_volatile(1) };
                }
            });
        }
    });
    bytes as f64 / t.elapsed().as_secs_f64() / 1e9
}

fn main() {
    let dir = std::env::var_os("SMOE_BENCH_DIR")
        .map_or_else(|| "/dev/shm".into(), std::path::PathBuf::from);
    let v = common::vault_in(tempfile::tempdir_in(dir).unwrap(), 1, EXPERTS, BLOB, &[]);
    let thp =
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    println!(
        "first pass: {EXPERTS} experts of {} KiB in {}, {THREADS} workers, ring of 384 slots; THP {}",
        BLOB >> 10,
        v.dir.path().display(),
        thp.trim()
    );
    let open = |huge_pages, populate| {
        Streamer::open(
            v.dir.path(),
            Config {
                huge_pages,
                populate,
                ..common::quiet_config(EXPERTS / 2, THREADS)
            },
        )
        .unwrap()
    };
    // Alternating: a way that runs first in one round runs last in the next.
    let ways = [
        ("huge pages (default)", true, Populate::Off),
        ("small pages", false, Populate::Off),
        ("huge pages, populate thread", true, Populate::Background),
        ("huge pages, populated at open", true, Populate::Open),
    ];
    for round in 0..4 {
        let order: Vec<_> = if round % 2 == 0 {
            ways.iter().collect()
        } else {
            ways.iter().rev().collect()
        };
        for &(name, huge, populate) in order {
            let s = open(huge, populate);
            let (b1, t1) = pass(&s, 0..EXPERTS / 2);
            let (b2, t2) = pass(&s, EXPERTS / 2..EXPERTS);
            let direct = s.stats().direct_io == 1;
            println!(
                "  round {round}, {name}: first pass {:.2} GB/s, steady {:.2} GB/s: {:.2}x ({})",
                gbps(b1, t1),
                gbps(b2, t2),
                gbps(b1, t1) / gbps(b2, t2),
                if direct { "direct I/O" } else { "buffered" },
            );
            if huge && populate == Populate::Off {
                let zero = zeroing_rate(384 * BLOB.next_multiple_of(16384) as usize);
                let serial = 1.0 / (1.0 / gbps(b2, t2) + 1.0 / zero);
                println!(
                    "    fresh pages zeroed at {zero:.2} GB/s; zeroing then copying each byte \
                     runs at {serial:.2} GB/s ({:.2}x the steady state); this pass ran at {:.2}x that",
                    serial / gbps(b2, t2),
                    gbps(b1, t1) / serial
                );
            }
        }
        let s = open(false, Populate::Off);
        let (warm, direct) = pread_loop(&v, &s, true);
        let (fresh, _) = pread_loop(&v, &s, false);
        println!(
            "  round {round}, plain pread loop ({}): pre-faulted {warm:.2} GB/s, fresh {fresh:.2} GB/s",
            if direct { "direct I/O" } else { "buffered" }
        );
    }
}
