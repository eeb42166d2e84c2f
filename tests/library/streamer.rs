//! The streamer through its Rust API: retention, LRU, RING_FULL, stale
//! tickets, NOT_FOUND, I/O faults, checksums, direct-I/O policy.

use smoe_test_support as common;

use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use smoe::internals::sys::ReadError;
use smoe::streamer::{BlobReader, FileReader};
use smoe::vault::Vault;
use smoe::{Config, DirectIo, ErrorKind, Priority, Streamer};

const WAIT: Duration = Duration::from_secs(10);

/// A drive with a bad region: every read overlapping it fails with EIO,
/// having read nothing; reads elsewhere go to the file.
struct FailingRegion(Range<u64>);

impl BlobReader for FailingRegion {
    fn read_exact_at(&self, file: &File, buf: &mut [u8], offset: u64) -> Result<(), ReadError> {
        let end = offset + buf.len() as u64;
        if self.0.start < end && offset < self.0.end {
            return Err(ReadError {
                done: 0,
                wanted: buf.len(),
                offset,
                error: io::Error::from_raw_os_error(libc::EIO),
            });
        }
        FileReader.read_exact_at(file, buf, offset)
    }
}

/// A read path with a bug: every read panics inside its worker.
struct PanickingReader;

impl BlobReader for PanickingReader {
    fn read_exact_at(&self, _: &File, _: &mut [u8], _: u64) -> Result<(), ReadError> {
        panic!("injected panic in an I/O worker's read (test reader)");
    }
}

fn config(slots: u32) -> Config {
    Config {
        ring_slots: slots,
        workers: 4,
        ..Config::default()
    }
}

#[test]
fn claim_reads_then_retains() {
    let v = common::vault(3, 8, 20_000, &[0]);
    let s = Streamer::open(v.dir.path(), config(8)).unwrap();
    let c = s.claim_wait(1, 3, WAIT).unwrap().expect("read within 10 s");
    v.check(1, 3, &c);
    assert!(!c.hit(), "first claim needed a demand read");
    assert_eq!(c.as_ptr() as usize % 16384, 0, "slot data is 16 KB aligned");
    drop(c);
    let read = s.stats().bytes_read;
    assert_eq!(read, 32768, "one padded blob");
    for _ in 0..100 {
        let c = s.claim(1, 3).unwrap().expect("retained");
        assert!(c.hit());
        v.check(1, 3, &c);
    }
    let st = s.stats();
    assert_eq!(st.bytes_read, read, "re-claims read nothing");
    assert_eq!(st.claims, 101);
    assert_eq!(st.hits, 100);
    assert_eq!(st.reads_demand, 1);
    assert_eq!(st.resident, 1);
    assert_eq!(st.pending, 0, "polls inside claim_wait are not counted");
}

#[test]
fn speculative_prefetch_makes_a_hit() {
    let v = common::vault(2, 8, 20_000, &[]);
    let s = Streamer::open(&v.file, config(8)).unwrap();
    s.prefetch(0, 5, Priority::Speculative).unwrap();
    let deadline = Instant::now() + WAIT;
    while !s.is_resident(0, 5) {
        assert!(Instant::now() < deadline, "speculative read never landed");
        std::thread::sleep(Duration::from_millis(1));
    }
    let c = s.claim(0, 5).unwrap().unwrap();
    assert!(c.hit(), "brought in by speculation");
    v.check(0, 5, &c);
    assert_eq!(s.stats().reads_speculative, 1);
    assert_eq!(s.stats().reads_demand, 0);
}

#[test]
fn concurrent_prefetch_of_one_expert_reads_it_once() {
    let v = common::vault(2, 8, 20_000, &[]);
    let s = Streamer::open(&v.file, config(8)).unwrap();
    std::thread::scope(|scope| {
        for t in 0..8 {
            let s = &s;
            scope.spawn(move || {
                for _ in 0..1000 {
                    let p = if t % 2 == 0 {
                        Priority::Demand
                    } else {
                        Priority::Speculative
                    };
                    s.prefetch(1, 7, p).unwrap();
                }
            });
        }
    });
    let c = s.claim_wait(1, 7, WAIT).unwrap().unwrap();
    v.check(1, 7, &c);
    let st = s.stats();
    assert_eq!(st.bytes_read, 32768, "read once");
    assert_eq!(st.resident, 1, "one slot");
}

#[test]
fn lru_evicts_least_recently_claimed() {
    let v = common::vault(1, 8, 20_000, &[]);
    let s = Streamer::open(&v.file, config(4)).unwrap();
    for e in 0..4 {
        drop(s.claim_wait(0, e, WAIT).unwrap().unwrap());
    }
    // Touch 0 and 2: now 1 is the least recently used, then 3.
    drop(s.claim(0, 0).unwrap().unwrap());
    drop(s.claim(0, 2).unwrap().unwrap());
    assert_eq!(s.lru_order(), vec![(0, 1), (0, 3), (0, 0), (0, 2)]);
    drop(s.claim_wait(0, 4, WAIT).unwrap().unwrap());
    assert!(!s.is_resident(0, 1), "LRU victim");
    drop(s.claim_wait(0, 5, WAIT).unwrap().unwrap());
    assert!(!s.is_resident(0, 3), "next LRU victim");
    for e in [0, 2, 4, 5] {
        assert!(s.is_resident(0, e), "expert {e} kept");
    }
    assert_eq!(s.stats().evictions, 2);
    assert_eq!(s.stats().resident, 4, "nothing prunes the ring");
}

#[test]
fn ring_full_then_recovers_after_a_release() {
    let v = common::vault(1, 8, 20_000, &[]);
    let s = Streamer::open(&v.file, config(3)).unwrap();
    let held: Vec<_> = (0..3)
        .map(|e| s.claim_wait(0, e, WAIT).unwrap().unwrap())
        .collect();
    let err = s.prefetch(0, 5, Priority::Demand).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::RingFull, "{err}");
    assert_eq!(err.layer_expert(), Some((0, 5)));
    assert!(err.to_string().contains("3 slots"), "{err}");
    let err = s.claim(0, 5).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::RingFull);
    assert_eq!(err.layer_expert(), Some((0, 5)));
    let mut held = held.into_iter();
    drop(held.next());
    s.prefetch(0, 5, Priority::Demand).unwrap();
    let c = s.claim_wait(0, 5, WAIT).unwrap().unwrap();
    v.check(0, 5, &c);
    for c in held {
        v.check(c.info().layer, c.info().expert, &c);
    }
}

#[test]
fn stale_tickets_change_nothing() {
    let v = common::vault(1, 8, 20_000, &[]);
    let s = Streamer::open(&v.file, config(2)).unwrap();
    let a = s.claim_wait(0, 0, WAIT).unwrap().unwrap().into_ticket();
    s.release_ticket(a.ticket).unwrap();
    let err = s.release_ticket(a.ticket).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Stale, "released twice");
    assert_eq!(err.ticket(), Some(a.ticket));
    for ticket in [0, u64::MAX] {
        let err = s.release_ticket(ticket).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Stale);
        assert_eq!(err.ticket(), Some(ticket));
    }
    // Evict and reload slot `a`: its old ticket must not release the new claim.
    drop(s.claim_wait(0, 1, WAIT).unwrap().unwrap());
    drop(s.claim_wait(0, 2, WAIT).unwrap().unwrap());
    drop(s.claim_wait(0, 3, WAIT).unwrap().unwrap());
    let b = s.claim_wait(0, 0, WAIT).unwrap().unwrap();
    assert_eq!(
        b.info().slot_index,
        a.slot_index,
        "same slot, new generation"
    );
    assert_ne!(b.info().ticket, a.ticket);
    assert_eq!(
        s.release_ticket(a.ticket).unwrap_err().kind(),
        ErrorKind::Stale
    );
    // b still holds its slot: a prefetch of a third expert must not take it.
    drop(s.claim_wait(0, 6, WAIT).unwrap().unwrap());
    v.check(0, 0, &b);
}

#[test]
fn two_claims_share_a_slot_and_each_releases_once() {
    let v = common::vault(1, 8, 20_000, &[]);
    let s = Streamer::open(&v.file, config(2)).unwrap();
    let a = s.claim_wait(0, 0, WAIT).unwrap().unwrap().into_ticket();
    let b = s.claim(0, 0).unwrap().unwrap().into_ticket();
    assert_eq!(a.slot_index, b.slot_index);
    s.release_ticket(a.ticket).unwrap();
    s.release_ticket(b.ticket).unwrap();
    assert_eq!(
        s.release_ticket(b.ticket).unwrap_err().kind(),
        ErrorKind::Stale
    );
}

#[test]
fn not_found() {
    let v = common::vault(3, 4, 20_000, &[0]);
    let s = Streamer::open(&v.file, config(4)).unwrap();
    for (l, e) in [(0, 0), (3, 0), (1, 4), (u32::MAX, u32::MAX)] {
        let err = s.claim(l, e).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotFound, "({l}, {e})");
        assert_eq!(err.layer_expert(), Some((l, e)));
        let err = s.prefetch(l, e, Priority::Demand).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotFound);
        assert_eq!(err.layer_expert(), Some((l, e)));
    }
}

#[test]
fn slot_override_too_small_names_the_blob() {
    let v = common::vault(1, 2, 2 << 20, &[]);
    let err = Streamer::open(
        &v.file,
        Config {
            slot_mb: 1,
            ..config(2)
        },
    )
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Argument);
    assert!(err.to_string().contains("layer 0 expert 0"), "{err}");
}

#[test]
fn truncated_while_open_reports_io_and_rest_stays_readable() {
    let v = common::vault(2, 8, 40_000, &[]);
    let s = Streamer::open(&v.file, config(8)).unwrap();
    let vault = s.vault().clone();
    let last = *vault.entries().last().unwrap();
    // Cut the file in the middle of the last blob.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&v.file)
        .unwrap();
    f.set_len(last.offset + 16384).unwrap();
    let start = Instant::now();
    let err = s
        .claim_wait(last.layer, last.expert, WAIT)
        .expect_err("read of a truncated blob succeeded");
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "took {:?}",
        start.elapsed()
    );
    assert_eq!(err.kind(), ErrorKind::Io);
    assert_eq!(err.layer_expert(), Some((last.layer, last.expert)));
    assert_eq!(err.path(), Some(v.file.as_path()));
    assert_eq!(err.offset(), Some(last.offset));
    assert_eq!(err.length(), Some(last.padded_size));
    assert_eq!(err.os_error(), None, "end of file is not an OS error");
    assert!(
        err.to_string().ends_with(": unexpected end of file"),
        "{err}"
    );
    assert_eq!(s.stats().io_errors, 1);
    // Everything before the cut still reads.
    for e in 0..8 {
        let c = s.claim_wait(0, e, WAIT).unwrap().unwrap();
        v.check(0, e, &c);
    }
    // The error was reported once; the next claim retries (and fails again).
    let err = s.claim_wait(last.layer, last.expert, WAIT).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Io);
    assert_eq!(s.stats().io_errors, 2);
}

#[test]
fn failing_region_reports_io_once_and_the_rest_stays_readable() {
    let v = common::vault(2, 8, 40_000, &[]);
    let vault = Vault::open(&v.file).unwrap();
    let bad = *vault.entry(1, 2).unwrap();
    let region = FailingRegion(bad.offset + 100..bad.offset + 200);
    let s = Streamer::with_reader(vault, config(8), region).unwrap();
    let start = Instant::now();
    let err = s.claim_wait(1, 2, WAIT).unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(1));
    assert_eq!(err.kind(), ErrorKind::Io);
    assert_eq!(err.layer_expert(), Some((1, 2)));
    assert_eq!(err.os_error(), Some(libc::EIO));
    assert_eq!(err.path(), Some(v.file.as_path()));
    assert_eq!(err.offset(), Some(bad.offset));
    assert_eq!(err.length(), Some(bad.padded_size));
    for (l, e) in [(1, 1), (1, 3), (0, 2)] {
        let c = s.claim_wait(l, e, WAIT).unwrap().unwrap();
        v.check(l, e, &c);
    }
    assert_eq!(s.stats().io_errors, 1);
    assert_eq!(s.stats().resident, 3, "the failed slot was freed");
}

#[test]
fn checksum_mismatch_with_verify() {
    let v = common::vault(2, 4, 20_000, &[]);
    let vault = smoe::vault::Vault::open(&v.file).unwrap();
    let bad = *vault.entry(1, 1).unwrap();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&v.file)
        .unwrap();
    f.write_all_at(&[0xAB], bad.offset + 777).unwrap();
    drop(f);
    let verified = Streamer::open(
        &v.file,
        Config {
            verify: true,
            ..config(4)
        },
    )
    .unwrap();
    let err = verified.claim_wait(1, 1, WAIT).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Format);
    assert_eq!(err.layer_expert(), Some((1, 1)));
    assert_eq!(err.path(), Some(v.file.as_path()));
    assert_eq!(err.offset(), Some(bad.offset));
    assert_eq!(
        err.length(),
        Some(bad.size),
        "the payload the checksum covers"
    );
    assert_eq!(err.os_error(), None);
    // The expected checksum is in the words, next to the one the bytes have.
    assert!(
        err.to_string()
            .contains(&format!("expected xxh3 {:016x}", bad.xxh3)),
        "{err}"
    );
    assert_eq!(verified.stats().checksum_errors, 1);
    let good = verified.claim_wait(1, 0, WAIT).unwrap().unwrap();
    v.check(1, 0, &good);
    // Without verify the damaged bytes are handed over as they are.
    let unverified = Streamer::open(&v.file, config(4)).unwrap();
    let c = unverified.claim_wait(1, 1, WAIT).unwrap().unwrap();
    assert_eq!(c[777], 0xAB);
}

#[test]
fn claim_wait_answers_pending_at_the_timeout() {
    let v = common::vault(1, 4, 20_000, &[]);
    // The first claim can only queue the read, so a zero timeout is pending.
    let s = Streamer::open(&v.file, config(4)).unwrap();
    let r = s.claim_wait(0, 1, Duration::ZERO).unwrap();
    assert!(r.is_none(), "zero timeout answers pending");
    assert_eq!(s.stats().pending, 1, "one claim answered pending");
    assert!(s.claim(0, 2).unwrap().is_none());
    assert_eq!(s.stats().pending, 2);
}

#[test]
fn many_workers_idle_then_serve() {
    let v = common::vault(2, 16, 20_000, &[]);
    let s = Streamer::open(
        &v.file,
        Config {
            workers: 16,
            ..config(32)
        },
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(50));
    for e in 0..16 {
        s.prefetch(1, e, Priority::Demand).unwrap();
    }
    for e in 0..16 {
        let c = s.claim_wait(1, e, WAIT).unwrap().unwrap();
        v.check(1, e, &c);
    }
    assert_eq!(s.stats().workers, 16);
}

#[test]
fn workers_out_of_range() {
    let v = common::vault(1, 2, 20_000, &[]);
    let err = Streamer::open(
        &v.file,
        Config {
            workers: 65,
            ..config(2)
        },
    )
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Argument);
    assert!(err.to_string().contains("workers is 65"), "{err}");
}

#[test]
fn direct_io_on_a_filesystem_that_supports_it() {
    // The test's temporary directory is on the project's disk.
    let v = common::vault(1, 2, 20_000, &[]);
    let s = Streamer::open(&v.file, config(2)).unwrap();
    let st = s.stats();
    let direct_warnings = || {
        s.warnings()
            .iter()
            .filter(|w| w.contains("direct I/O"))
            .count()
    };
    if st.direct_io == 0 {
        // tmpfs and others; then Auto must have warned.
        assert_eq!(direct_warnings(), 1, "{:?}", s.warnings());
    } else {
        assert_eq!(direct_warnings(), 0, "{:?}", s.warnings());
    }
    let off = Streamer::open(
        &v.file,
        Config {
            direct_io: DirectIo::Off,
            ..config(2)
        },
    )
    .unwrap();
    assert_eq!(off.stats().direct_io, 0);
    assert!(
        !off.warnings().iter().any(|w| w.contains("direct I/O")),
        "off is not a fallback"
    );
}

/// ramfs refuses O_DIRECT. Mounting it needs root; CI runs as root and sets
/// SMOE_ROOT_TESTS=1 so this test cannot pass by skipping there
/// ([`smoe_test_support::skip_or_fail_root`]).
#[test]
fn direct_io_refused_auto_falls_back_require_fails() {
    let mnt = tempfile::tempdir().unwrap();
    let ok = std::process::Command::new("mount")
        .args(["-t", "ramfs", "ramfs"])
        .arg(mnt.path())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        smoe_test_support::skip_or_fail_root(&format!(
            "mounting ramfs on {} failed: it needs root (run as root; SMOE_ROOT_TESTS=1 \
             requires it)",
            mnt.path().display()
        ));
        return;
    }
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
        }
    }
    let _guard = Unmount(mnt.path().to_path_buf());
    let spec = smoe::vault::synth::SynthSpec {
        n_layers: 1,
        n_experts: 2,
        blob_bytes: 20_000,
        dense_layers: vec![],
        seed: 1,
        top_k: 1,
    };
    let file = spec.write(mnt.path(), &mut |_| {}).unwrap();
    let s = Streamer::open(&file, config(2)).unwrap();
    assert_eq!(s.stats().direct_io, 0);
    assert!(
        s.warnings().iter().any(|w| w.contains("direct I/O")),
        "{:?}",
        s.warnings()
    );
    let c = s.claim_wait(0, 1, WAIT).unwrap().unwrap();
    assert!(smoe::vault::synth::first_mismatch(1, 0, 1, &c).is_none());
    drop(c);
    drop(s);
    let err = Streamer::open(
        &file,
        Config {
            direct_io: DirectIo::Require,
            ..config(2)
        },
    )
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    assert!(err.to_string().contains("experts.smoe"), "{err}");
}

#[test]
fn close_with_reads_in_flight_joins_cleanly() {
    let v = common::vault(4, 16, 200_000, &[]);
    for _ in 0..5 {
        let s = Streamer::open(&v.file, config(64)).unwrap();
        for l in 0..4 {
            for e in 0..16 {
                s.prefetch(l, e, Priority::Speculative).unwrap();
            }
        }
        drop(s); // joins every worker, mid-read or parked
    }
}

#[test]
fn a_panicking_worker_fails_the_streamer_not_the_process() {
    let v = common::vault(1, 4, 20_000, &[]);
    let vault = Vault::open(&v.file).unwrap();
    let s = Streamer::with_reader(vault, config(4), PanickingReader).unwrap();
    // The read's worker panics; once the panic is caught (unwinding can be
    // slow, e.g. under a sanitizer), claims report the broken streamer.
    let deadline = Instant::now() + WAIT;
    let err = loop {
        match s.claim(0, 1) {
            Err(e) => break e,
            Ok(c) => {
                assert!(c.is_none(), "the read cannot have completed");
                assert!(Instant::now() < deadline, "the panic was never reported");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    };
    assert_eq!(err.kind(), ErrorKind::Internal, "{err}");
    assert!(err.to_string().contains("panicked"), "{err}");
    assert_eq!(
        s.prefetch(0, 2, Priority::Demand).unwrap_err().kind(),
        ErrorKind::Internal
    );
    drop(s); // joins the surviving workers
}

/// The layer loop through a ring smaller than one step's working set: 8
/// layers, one expert each per step, alternating between two experts from
/// token to token, through 6 slots. LRU always evicts the expert needed
/// next and never hits; the adaptive policy evicts the layer just finished
/// and keeps hitting. Every claimed byte is checked under both.
#[test]
fn adaptive_policy_survives_the_layer_loop() {
    let v = common::vault(8, 4, 3000, &[]);
    let mut hits = Vec::new();
    for policy in [smoe::Policy::Lru, smoe::Policy::Adaptive] {
        let s = Streamer::open(
            &v.file,
            Config {
                policy,
                ..common::quiet_config(6, 2)
            },
        )
        .unwrap();
        assert_eq!(s.stats().policy, policy as u64);
        for token in 0..40u32 {
            for layer in 0..8 {
                let expert = (token / 2) % 2;
                s.prefetch(layer, expert, Priority::Demand).unwrap();
                let c = s.claim_wait(layer, expert, WAIT).unwrap().unwrap();
                v.check(layer, expert, &c);
            }
        }
        let st = s.stats();
        assert_eq!(st.claims, 320);
        hits.push(st.hits);
    }
    assert!(hits[0] <= 8, "LRU hit the loop {} times", hits[0]);
    assert!(
        hits[1] >= 100,
        "adaptive hit {} of 320 claims (LRU {})",
        hits[1],
        hits[0]
    );
}

/// A drive that answers nothing until it is opened: every read waits for
/// the flag.
struct GatedReader(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl BlobReader for GatedReader {
    fn read_exact_at(&self, file: &File, buf: &mut [u8], offset: u64) -> Result<(), ReadError> {
        while !self.0.load(std::sync::atomic::Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(5));
        }
        FileReader.read_exact_at(file, buf, offset)
    }
}

/// A wait a host can stop: asked every `every`, it gives up when told to,
/// counts one pending claim (not one per question), and claims the expert
/// once its read lands.
#[test]
fn a_wait_asks_its_host_and_stops_when_told() {
    let v = common::vault(2, 4, 20_000, &[]);
    let gate = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let s = Streamer::with_reader(
        Vault::open(v.dir.path()).unwrap(),
        common::quiet_config(4, 2),
        GatedReader(gate.clone()),
    )
    .unwrap();
    let mut asked = 0;
    let start = Instant::now();
    let got = s
        .claim_wait_ticket_until(1, 2, WAIT, Duration::from_millis(20), &mut || {
            asked += 1;
            asked < 5
        })
        .unwrap();
    let waited = start.elapsed();
    assert!(got.is_none());
    assert_eq!(asked, 5, "asked until it said stop");
    assert!(
        waited >= Duration::from_millis(80) && waited < Duration::from_secs(2),
        "{waited:?} for five questions 20 ms apart"
    );
    assert_eq!(s.stats().pending, 1, "one wait, one pending claim");
    // The same for a working set; then the reads land and the waits claim.
    let mut asked = 0;
    let got = s
        .claim_any_ticket_until(1, &[2, 3], WAIT, Duration::from_millis(20), &mut || {
            asked += 1;
            asked < 3
        })
        .unwrap();
    assert!(got.is_none() && asked == 3);
    assert_eq!(s.stats().pending, 2);
    gate.store(true, std::sync::atomic::Ordering::Release);
    let info = s
        .claim_any_ticket_until(1, &[2, 3], WAIT, Duration::from_millis(20), &mut || true)
        .unwrap()
        .expect("claimed once the reads land");
    s.release_ticket(info.ticket).unwrap();
    let info = s
        .claim_wait_ticket_until(1, 2, WAIT, Duration::from_millis(20), &mut || true)
        .unwrap()
        .expect("claimed");
    // SAFETY: the ticket holds the slot until released below; `size`
    // bytes from `data` are the expert's.
    let bytes = unsafe { std::slice::from_raw_parts(info.data, info.size as usize) };
    v.check(1, 2, bytes);
    s.release_ticket(info.ticket).unwrap();
}
