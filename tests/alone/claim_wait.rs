//! `claim_wait` sleeps until its read lands and wakes at once (issue 12,
//! defect 3): it used to poll with sleeps growing to 640 µs, oversleeping
//! reads that had finished. In the `alone` binary, since it measures the
//! process's CPU time.

use smoe_test_support as common;

use std::fs::File;
use std::time::{Duration, Instant};

use smoe::internals::sys::ReadError;
use smoe::streamer::{BlobReader, FileReader};
use smoe::vault::Vault;
use smoe::{ErrorKind, Streamer};

/// A disk that takes `delay` for every read.
struct SlowReader {
    delay: Duration,
    fail: bool,
}

impl BlobReader for SlowReader {
    fn read_exact_at(&self, file: &File, buf: &mut [u8], offset: u64) -> Result<(), ReadError> {
        std::thread::sleep(self.delay);
        if self.fail {
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

fn streamer(v: &common::TestVault, fail: bool) -> Streamer {
    let vault = Vault::open(v.dir.path()).unwrap();
    let config = common::quiet_config(4, 1);
    let reader = SlowReader {
        delay: Duration::from_millis(400),
        fail,
    };
    Streamer::with_reader(vault, config, reader).unwrap()
}

/// One test, alone, so no other test's threads share the CPU accounting.
#[test]
fn a_waiting_claim_sleeps_wakes_on_success_and_failure_and_times_out() {
    let _alone = crate::alone();
    // Sleeps, and wakes when its read lands.
    let v = common::vault(1, 4, 20_000, &[]);
    let s = streamer(&v, false);
    let (cpu0, t0) = (common::process_cpu(), Instant::now());
    let claim = s
        .claim_wait(0, 1, Duration::from_secs(10))
        .unwrap()
        .expect("the read lands in 400 ms");
    let (cpu, waited) = (common::process_cpu() - cpu0, t0.elapsed());
    v.check(0, 1, &claim);
    drop(claim);
    eprintln!("waited {waited:?} for a 400 ms read, using {cpu:?} of CPU");
    assert!(waited >= Duration::from_millis(400));
    assert!(
        waited < Duration::from_millis(600),
        "woke {waited:?} after a 400 ms read"
    );
    // The worker sleeps in its read and the waiter, after polling for its
    // first 500 µs (about 1 ms of CPU here), on the condition variable: a
    // waiter that polled throughout (spinning, yielding, sleeping in short
    // steps, as before) burned about 11 ms of CPU here.
    assert!(
        cpu < Duration::from_millis(5),
        "{cpu:?} of CPU while waiting"
    );

    // Times out as pending.
    let t0 = Instant::now();
    let claimed = s.claim_wait(0, 3, Duration::from_millis(100)).unwrap();
    assert!(claimed.is_none(), "pending at the timeout");
    drop(claimed);
    let waited = t0.elapsed();
    assert!(
        waited >= Duration::from_millis(100) && waited < Duration::from_millis(300),
        "{waited:?}"
    );
    assert_eq!(s.stats().pending, 1);
    drop(s);

    // Wakes when its read fails, with the error.
    let s = streamer(&v, true);
    let t0 = Instant::now();
    let err = s.claim_wait(0, 2, Duration::from_secs(10)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Io);
    assert_eq!(err.layer_expert(), Some((0, 2)));
    assert!(
        t0.elapsed() < Duration::from_millis(600),
        "{:?}",
        t0.elapsed()
    );
}

/// `claim_any` over a set larger than the ring sleeps while the reads run,
/// as `claim_wait` does (issue 33: each of its passes found the ring full,
/// woke the waiters itself, and so never slept: 59–75% of a core).
#[test]
fn a_set_larger_than_the_ring_sleeps_while_it_waits() {
    let _alone = crate::alone();
    let v = common::vault(1, 12, 20_000, &[]);
    let vault = Vault::open(v.dir.path()).unwrap();
    let reader = SlowReader {
        delay: Duration::from_millis(100),
        fail: false,
    };
    let s = Streamer::with_reader(vault, common::quiet_config(4, 2), reader).unwrap();
    let mut left: Vec<u32> = (0..12).collect();
    assert_eq!(s.prefetch_set(0, &left, smoe::Priority::Demand).unwrap(), 4);
    let (cpu0, t0) = (common::process_cpu(), Instant::now());
    while !left.is_empty() {
        let c = s
            .claim_any(0, &left, Duration::from_secs(10))
            .unwrap()
            .expect("read in time");
        let e = c.info().expert;
        v.check(0, e, &c);
        left.retain(|&m| m != e);
    }
    let (cpu, waited) = (common::process_cpu() - cpu0, t0.elapsed());
    eprintln!("12 claims over {waited:?} of 100 ms reads used {cpu:?} of CPU");
    // Six rounds of two 100 ms reads: about 600 ms of waiting. Sleeping,
    // the claims cost about 1 ms of CPU each; spinning they took ~60%.
    assert!(waited >= Duration::from_millis(500), "{waited:?}");
    assert!(
        cpu < waited / 10,
        "{cpu:?} of CPU over {waited:?} of waiting"
    );
}
