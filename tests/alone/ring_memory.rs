//! The ring's `populate` and `lock` settings (issue 13): pre-faulting in
//! the background, locking at open, and a lock the OS refuses. In the
//! `alone` binary, since it measures the process's RSS: no other test runs
//! while one of these does, so they never measure each other.

use smoe_test_support as common;

use std::process::Command;
use std::time::{Duration, Instant};

use smoe::{Config, ErrorKind, Populate, Streamer};

const MIB: u64 = 1 << 20;

/// 64 experts of ~100 KB in slots of 4 MiB: a ring of 256 MiB.
fn config() -> Config {
    Config {
        slot_mb: 4,
        ..common::quiet_config(64, 2)
    }
}

/// The process's locked memory (`VmLck` of /proc/self/status), in bytes.
fn locked_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmLck:")).unwrap();
    let kb: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kb * 1024
}

#[test]
fn populate_commits_the_ring_in_the_background_and_loads_stay_right() {
    let _alone = crate::alone();
    let v = common::vault(1, 64, 100_000, &[]);

    // Off (the default): the ring stays uncommitted.
    assert_eq!(Config::default().populate, Populate::Off);
    let rss0 = common::rss_bytes();
    let s = Streamer::open(v.dir.path(), config()).unwrap();
    assert_eq!(s.ring_region().1, 256 * MIB);
    std::thread::sleep(Duration::from_millis(500));
    let off = common::rss_bytes().saturating_sub(rss0);
    drop(s);

    // On: open returns at once, then the pages are committed.
    let rss0 = common::rss_bytes();
    let t0 = Instant::now();
    let s = Streamer::open(
        v.dir.path(),
        Config {
            populate: Populate::Background,
            ..config()
        },
    )
    .unwrap();
    let open = t0.elapsed();
    // Loads during the populate are read right: it never changes bytes.
    v.stream(&s, 0, 0..64, Duration::from_secs(10));
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut on = 0;
    while Instant::now() < deadline {
        on = common::rss_bytes().saturating_sub(rss0);
        if on >= 250 * MIB {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let committed = t0.elapsed();
    eprintln!(
        "256 MiB ring: populate off: RSS +{:.1} MiB after 0.5 s; populate on: open {open:?}, \
         RSS +{:.1} MiB after {committed:?}",
        off as f64 / MIB as f64,
        on as f64 / MIB as f64
    );
    assert!(off < 32 * MIB, "populate off committed {off} bytes");
    assert!(on >= 250 * MIB, "populate on committed only {on} bytes");
    // Still right after the populate pass.
    for e in (0..64).step_by(7) {
        let c = s.claim(0, e).unwrap().expect("retained");
        v.check(0, e, &c);
    }
}

#[test]
fn populate_at_open_commits_the_ring_before_open_returns() {
    let _alone = crate::alone();
    let v = common::vault(1, 64, 100_000, &[]);
    let rss0 = common::rss_bytes();
    let s = Streamer::open(
        v.dir.path(),
        Config {
            populate: Populate::Open,
            ..config()
        },
    )
    .unwrap();
    // No thread runs after open to commit more: what open left is all.
    let at_open = common::rss_bytes().saturating_sub(rss0);
    assert!(
        at_open >= 250 * MIB,
        "populate at open: only {} MiB of the 256 MiB ring committed when open returned",
        at_open / MIB
    );
    // Contents unchanged, loads right, and nothing committed twice.
    v.stream(&s, 0, 0..64, Duration::from_secs(10));
    for e in (0..64).step_by(7) {
        let c = s.claim(0, e).unwrap().expect("retained");
        v.check(0, e, &c);
    }
    let after = common::rss_bytes().saturating_sub(rss0);
    assert!(
        after < at_open + 32 * MIB,
        "loads into a populated ring committed {} MiB more",
        (after - at_open) / MIB
    );
}

#[test]
fn lock_commits_and_locks_the_ring_at_open() {
    let _alone = crate::alone();
    // Unprivileged, a 256 MiB lock needs a raised RLIMIT_MEMLOCK; the
    // refusal is tested below.
    if !smoe_test_support::root_or_skip("locking 256 MiB (CAP_IPC_LOCK)") {
        return;
    }
    let v = common::vault(1, 64, 100_000, &[]);
    let lck0 = locked_bytes();
    let rss0 = common::rss_bytes();
    let s = Streamer::open(
        v.dir.path(),
        Config {
            lock: true,
            ..config()
        },
    )
    .unwrap();
    let locked = locked_bytes() - lck0;
    let rss = common::rss_bytes().saturating_sub(rss0);
    eprintln!(
        "lock: VmLck +{} MiB, RSS +{} MiB right after open",
        locked / MIB,
        rss / MIB
    );
    assert!(locked >= 256 * MIB, "locked {locked} bytes");
    assert!(rss >= 250 * MIB, "RSS grew {rss} bytes");
    let st = s.stats();
    assert_eq!((st.slots_active, st.shrinks, st.grows), (64, 0, 0));
    let c = s
        .claim_wait(0, 5, Duration::from_secs(10))
        .unwrap()
        .unwrap();
    v.check(0, 5, &c);
    drop(c);
    drop(s);
    assert_eq!(locked_bytes(), lck0, "close unlocked the ring");
}

/// The child half of `lock_refused_under_a_small_memlock_limit`: lowers
/// RLIMIT_MEMLOCK to 64 KiB, drops root (which bypasses the limit with
/// CAP_IPC_LOCK) to nobody, then opens with `lock`. Prints the outcome.
/// Does nothing unless the parent set `SMOE_LOCK_CHILD`.
#[test]
fn lock_child() {
    let _alone = crate::alone();
    let Some(vault) = std::env::var_os("SMOE_LOCK_CHILD") else {
        return;
    };
    let limit = libc::rlimit {
        rlim_cur: 64 * 1024,
        rlim_max: 64 * 1024,
    };
    // SAFETY: setrlimit reads one rlimit we own.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &limit) } != 0 {
        println!(
            "SKIP cannot lower RLIMIT_MEMLOCK: {}",
            std::io::Error::last_os_error()
        );
        return;
    }
    // SAFETY: plain syscalls; group first, while still privileged.
    unsafe {
        if libc::getuid() == 0 {
            assert_eq!(libc::setgroups(0, std::ptr::null()), 0);
            assert_eq!(libc::setgid(65534), 0, "setgid");
            assert_eq!(libc::setuid(65534), 0, "setuid");
        }
    }
    match Streamer::open(
        &vault,
        Config {
            lock: true,
            ..config()
        },
    ) {
        Ok(_) => println!("OPENED"),
        Err(e) => println!("REFUSED {:?} {e}", e.kind()),
    }
}

#[test]
fn lock_refused_under_a_small_memlock_limit() {
    use std::os::unix::fs::PermissionsExt;
    let _alone = crate::alone();
    let v = common::vault(1, 64, 100_000, &[]);
    // Readable by the unprivileged child (nobody).
    for p in [v.dir.path().to_path_buf(), v.file.clone()] {
        let mode = if p.is_dir() { 0o755 } else { 0o644 };
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "ring_memory::lock_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("SMOE_LOCK_CHILD", &v.file)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find_map(|l| {
            ["REFUSED", "OPENED", "SKIP"]
                .iter()
                .find_map(|m| l.find(m).map(|at| &l[at..]))
        })
        .unwrap_or_else(|| {
            panic!(
                "child said nothing: {}\n{stdout}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )
        });
    eprintln!("child: {line}");
    if line.starts_with("SKIP") {
        // SAFETY: getuid has no preconditions.
        assert_ne!(unsafe { libc::getuid() }, 0, "root can always lower it");
        smoe_test_support::skip_or_fail_root(&format!("the child could not: {line}"));
        return;
    }
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(line.starts_with("REFUSED"), "{line}");
    let kind_ok = line.starts_with(&format!("REFUSED {:?}", ErrorKind::NoMemory))
        || line.starts_with(&format!("REFUSED {:?}", ErrorKind::Unsupported));
    assert!(kind_ok, "{line}");
    assert!(
        line.contains("mlock") && line.contains("os error"),
        "{line}"
    );
}

/// The figures of docs/performance.md: open time and RSS of an 8 GiB ring
/// with populate off and on. Ignored (it commits 8 GiB): `cargo test
/// --release --test alone -- --ignored ring_memory:: --nocapture`.
#[test]
#[ignore]
fn populate_figures_8_gib() {
    let _alone = crate::alone();
    let v = common::vault(1, 64, 100_000, &[]);
    for populate in [Populate::Off, Populate::Background, Populate::Open] {
        let rss0 = common::rss_bytes();
        let t0 = Instant::now();
        let s = Streamer::open(
            v.dir.path(),
            Config {
                slot_mb: 128,
                populate,
                ..common::quiet_config(64, 2)
            },
        )
        .unwrap();
        let open = t0.elapsed();
        let after_open = common::rss_bytes().saturating_sub(rss0);
        let mut full = None;
        while t0.elapsed() < Duration::from_secs(30) {
            if common::rss_bytes().saturating_sub(rss0) >= (8 << 30) - (64 << 20) {
                full = Some(t0.elapsed());
                break;
            }
            let off = populate == Populate::Off;
            std::thread::sleep(Duration::from_millis(if off { 500 } else { 10 }));
            if off && t0.elapsed() > Duration::from_secs(2) {
                break;
            }
        }
        let later = common::rss_bytes().saturating_sub(rss0);
        let t1 = Instant::now();
        drop(s);
        let close = t1.elapsed();
        eprintln!(
            "8 GiB ring, populate {populate:?}: open {open:?}, RSS +{} MiB after open, \
             +{} MiB at the end, all committed after {full:?}, close {close:?}",
            after_open / MIB,
            later / MIB
        );
    }
}

/// Writes a fake `/proc/meminfo` under `root` (atomically: the monitor may
/// be reading it).
fn fake_meminfo(root: &std::path::Path, total: u64, available: u64) {
    let text = format!(
        "MemTotal: {} kB\nMemFree: {} kB\nMemAvailable: {} kB\n",
        total / 1024,
        available / 1024,
        available / 1024
    );
    let tmp = root.join("proc/meminfo.tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, root.join("proc/meminfo")).unwrap();
}

/// Polls until `done(stats)` or 10 s.
fn wait_for(s: &Streamer, done: impl Fn(&smoe::Stats) -> bool) -> smoe::Stats {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let st = s.stats();
        if done(&st) || Instant::now() > deadline {
            return st;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The elastic ring through the whole streamer, without root: the monitor
/// reads a fake `/proc/meminfo` (the hidden `pressure_root` hook) whose
/// `MemAvailable` the test lowers and raises. Shrinking releases the
/// offline slots' pages (RSS falls), claims stay right throughout, a ring
/// shrunk to its floor answers RING_FULL as a ring of that size would, and
/// growing gives every slot back.
#[test]
fn elastic_ring_shrinks_and_grows_with_fake_pressure() {
    let _alone = crate::alone();
    const GIB: u64 = 1 << 30;
    let v = common::vault(1, 64, 4 * MIB - 16384, &[]);
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("proc")).unwrap();
    // 4 GiB "machine": low watermark 256 MiB, high 512 MiB.
    fake_meminfo(root.path(), 4 * GIB, 3 * GIB);
    let s = Streamer::open(
        v.dir.path(),
        Config {
            pressure_root: Some(root.path().to_path_buf()),
            ..config()
        },
    )
    .unwrap();
    assert!(s.warnings().is_empty(), "{:?}", s.warnings());
    v.stream(&s, 0, 0..64, Duration::from_secs(10));
    let full = common::rss_bytes();
    assert_eq!(s.stats().resident, 64);

    // Pressure: 100 MiB available. The monitor shrinks to the floor of 8
    // slots (it would take 103) and releases 56 × 4 MiB.
    fake_meminfo(root.path(), 4 * GIB, 100 * MIB);
    let st = wait_for(&s, |st| st.slots_active == 8);
    let shrunk = common::rss_bytes();
    eprintln!(
        "fake pressure: slots_active {} (shrinks {}), resident {}, RSS {} -> {} MiB",
        st.slots_active,
        st.shrinks,
        st.resident,
        full / MIB,
        shrunk / MIB
    );
    assert_eq!((st.slots_active, st.resident), (8, 8), "{st:?}");
    assert!(st.shrinks >= 1 && st.grows == 0, "{st:?}");
    assert!(
        full.saturating_sub(shrunk) >= 50 * 4 * MIB,
        "RSS fell only from {full} to {shrunk}"
    );
    // Every expert is still claimable, right, through the 8 active slots.
    for e in (0..64).rev() {
        let c = s
            .claim_wait(0, e, Duration::from_secs(10))
            .unwrap()
            .unwrap();
        v.check(0, e, &c);
    }
    // Hold 8 claims: a ninth is RING_FULL, as with a ring of 8 slots.
    let held: Vec<_> = (0..8)
        .map(|e| {
            s.claim_wait(0, e, Duration::from_secs(10))
                .unwrap()
                .unwrap()
        })
        .collect();
    let err = s.claim_wait(0, 40, Duration::from_secs(10)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::RingFull, "{err}");
    assert!(
        err.to_string()
            .contains("8 active slots (56 of the ring's 64 are offline"),
        "{err}"
    );
    drop(held);

    // Pressure ends: every slot comes back and is used again.
    fake_meminfo(root.path(), 4 * GIB, 3 * GIB);
    let st = wait_for(&s, |st| st.slots_active == 64);
    assert_eq!(st.slots_active, 64, "{st:?}");
    assert!(st.grows >= 1, "{st:?}");
    v.stream(&s, 0, 0..64, Duration::from_secs(10));
    assert_eq!(s.stats().resident, 64);

    // With elastic off there is no monitor: the same pressure changes nothing.
    drop(s);
    fake_meminfo(root.path(), 4 * GIB, 100 * MIB);
    let fixed = Streamer::open(
        v.dir.path(),
        Config {
            pressure_root: Some(root.path().to_path_buf()),
            elastic: false,
            ..config()
        },
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(600));
    let st = fixed.stats();
    assert_eq!((st.slots_active, st.shrinks), (64, 0), "{st:?}");
}

/// `pinned` (a CUDA host's `cudaHostRegister`, docs/c-api.md "CUDA hosts"):
/// under the pressure that takes an elastic ring down to its floor, a
/// pinned ring (elastic left at its default, on) keeps every slot, and its
/// pages are committed in the background as with `populate`.
#[test]
fn pinned_ring_is_populated_and_never_elastic() {
    let _alone = crate::alone();
    const GIB: u64 = 1 << 30;
    assert!(!Config::default().pinned);
    let v = common::vault(1, 64, 100_000, &[]);
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("proc")).unwrap();
    // A 4 GiB "machine" with 100 MiB available: under the low watermark.
    fake_meminfo(root.path(), 4 * GIB, 100 * MIB);
    let rss0 = common::rss_bytes();
    let s = Streamer::open(
        v.dir.path(),
        Config {
            pressure_root: Some(root.path().to_path_buf()),
            pinned: true,
            ..config()
        },
    )
    .unwrap();
    assert!(Config::default().elastic, "elastic stays at its default");
    v.stream(&s, 0, 0..64, Duration::from_secs(10));
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut committed = 0;
    while Instant::now() < deadline && committed < 250 * MIB {
        committed = common::rss_bytes().saturating_sub(rss0);
        std::thread::sleep(Duration::from_millis(20));
    }
    // Three of the elastic monitor's samples under pressure (50 ms apart).
    std::thread::sleep(Duration::from_millis(600));
    let st = s.stats();
    eprintln!(
        "pinned 256 MiB ring under fake pressure: slots_active {}, shrinks {}, RSS +{:.1} MiB",
        st.slots_active,
        st.shrinks,
        committed as f64 / MIB as f64
    );
    assert_eq!((st.slots_active, st.shrinks), (64, 0), "{st:?}");
    assert!(
        committed >= 250 * MIB,
        "pinned committed only {committed} bytes"
    );
    v.stream(&s, 0, 0..64, Duration::from_secs(10));
    drop(s);

    // The same pressure on the same ring unpinned takes it down (the test
    // above checks the details): the difference is `pinned`.
    let s = Streamer::open(
        v.dir.path(),
        Config {
            pressure_root: Some(root.path().to_path_buf()),
            ..config()
        },
    )
    .unwrap();
    let st = wait_for(&s, |st| st.slots_active == 8);
    assert_eq!(st.slots_active, 8, "{st:?}");
}
