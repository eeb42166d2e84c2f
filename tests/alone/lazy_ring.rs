//! The ring is reserved, not committed (issue 13, lazy ring): opening a
//! ring of 8 GiB takes neither time nor memory, and memory grows with the
//! slots actually loaded. In the `alone` binary, since it measures the
//! process's RSS.

use smoe_test_support as common;

use std::time::{Duration, Instant};

use smoe::{Config, Streamer};

#[test]
fn an_8_gib_ring_opens_at_once_and_costs_what_it_holds() {
    let _alone = crate::alone();
    // 64 experts of ~100 KB in slots of 128 MiB: a ring of 8 GiB.
    let v = common::vault(1, 64, 100_000, &[]);
    let rss0 = common::rss_bytes();
    let t0 = Instant::now();
    let s = Streamer::open(
        v.dir.path(),
        Config {
            slot_mb: 128,
            ..common::quiet_config(64, 2)
        },
    )
    .unwrap();
    let open = t0.elapsed();
    let ring = s.ring_region().1;
    assert_eq!(ring, 8 << 30);
    let after_open = common::rss_bytes().saturating_sub(rss0);
    v.stream(&s, 0, 0..8, Duration::from_secs(10));
    let after_loads = common::rss_bytes().saturating_sub(rss0);
    let t0 = Instant::now();
    drop(s);
    let close = t0.elapsed();
    eprintln!(
        "8 GiB ring: open {open:?}, RSS +{:.1} MiB after open, +{:.1} MiB after 8 loads of ~100 KB, close {close:?}",
        after_open as f64 / (1 << 20) as f64,
        after_loads as f64 / (1 << 20) as f64,
    );
    assert!(after_open <= 64 << 20, "open committed {after_open} bytes");
    // Eight slots were written (about 112 KiB each): memory follows them.
    assert!(
        after_loads >= after_open + 8 * 100_000 && after_loads <= after_open + (16 << 20),
        "{after_open} then {after_loads} bytes"
    );
    // Hang guards, not benchmarks: committing 8 GiB took seconds.
    assert!(open < Duration::from_secs(1), "open took {open:?}");
    assert!(close < Duration::from_secs(1), "close took {close:?}");
}

/// The automatic ring opens whatever the slot size: with slots of a quarter
/// of the available memory, 64 of them would be 16 times that, which open
/// refuses; the ring takes the slots that fit, and warns.
#[test]
fn an_automatic_ring_of_huge_slots_opens_with_what_fits() {
    let _alone = crate::alone();
    let v = common::vault(1, 64, 100_000, &[]);
    let avail = smoe::internals::sys::memory_snapshot().unwrap().avail_bytes;
    let slot_mb = u32::try_from((avail / 4) >> 20).unwrap().max(1);
    let s = Streamer::open(
        v.dir.path(),
        Config {
            slot_mb,
            ring_slots: 0,
            ..common::quiet_config(4, 1)
        },
    )
    .unwrap();
    let slots = s.stats().ring_slots;
    assert!((1..64).contains(&slots), "{slots} slots of {slot_mb} MiB");
    assert!(
        s.warnings()
            .iter()
            .any(|w| w.contains("fewer than the automatic minimum of 64")),
        "{:?}",
        s.warnings()
    );
    v.stream(&s, 0, 0..slots as u32, Duration::from_secs(10));
}

/// A ring larger than the machine is refused at open: reserved, the OS
/// would accept it, and its reads would exhaust memory later.
#[test]
fn a_ring_larger_than_memory_is_refused_at_open() {
    let _alone = crate::alone();
    let v = common::vault(1, 4, 100_000, &[]);
    let err = Streamer::open(
        v.dir.path(),
        Config {
            // 4 slots of 1 TiB.
            slot_mb: 1 << 20,
            ..common::quiet_config(4, 1)
        },
    )
    .unwrap_err();
    assert_eq!(err.kind(), smoe::ErrorKind::NoMemory, "{err}");
    assert!(
        err.to_string()
            .contains("larger than this machine's memory"),
        "{err}"
    );
}
