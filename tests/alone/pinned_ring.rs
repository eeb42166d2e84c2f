//! A ring whose pages are all committed at open (pinned, locked, or
//! populated and not elastic) in a memory cgroup the host already half uses
//! (issue 33): a 512 MiB cgroup, a host of 256 MiB, a ring of 40 × 8 MiB.
//! Such a ring opened, then the library's own populate thread (or `mlock`)
//! committed all 320 MiB and the kernel killed the host. Now `smoe_open`
//! refuses it, saying how much fits, and the automatic size of a pinned ring
//! leaves the host room. Two pinned rings that each fit alone, opened one
//! right after the other, are not both accepted.
//!
//! The host is a child process (this binary again, `SMOE_PINNED_CHILD`)
//! that moves itself into the cgroup, so a kill takes only it. Root only,
//! like `elastic`.

use smoe_test_support as common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use smoe::{Config, ErrorKind, Populate, Streamer};

use crate::elastic::Cgroup;

const MIB: u64 = 1 << 20;

/// The host: enters the cgroup `SMOE_PINNED_CHILD` names, takes 256 MiB of
/// its own, then opens the rings and says what happened, a line each. Runs
/// only as the child of `a_committed_ring_that_does_not_fit_is_refused`.
#[test]
fn pinned_child() {
    let _alone = crate::alone();
    let (Some(cgroup), Some(vault)) = (
        std::env::var_os("SMOE_PINNED_CHILD"),
        std::env::var_os("SMOE_PINNED_VAULT"),
    ) else {
        return;
    };
    std::fs::write(
        Path::new(&cgroup).join("cgroup.procs"),
        std::process::id().to_string(),
    )
    .unwrap();
    // Every page written, so all of it is the cgroup's.
    let host = vec![1u8; 256 * MIB as usize];
    for name in ["pinned", "locked", "populated"] {
        match Streamer::open(&vault, with(&eager_config(name), 40)) {
            Err(e) if e.kind() == ErrorKind::NoMemory => println!("REFUSED {name}: {e}"),
            Err(e) => println!("ERROR {name}: {e}"),
            Ok(s) => {
                // The populate thread (or mlock) commits the ring now.
                std::thread::sleep(Duration::from_secs(2));
                println!("OPENED {name}: {} bytes", s.ring_region().1);
            }
        }
    }
    // Two pinned rings of 160 MiB, one right after the other: each fits
    // alone, not both. The second open must count the first ring's pages,
    // which its populate thread may not have committed yet.
    let first = Streamer::open(&vault, with(&eager_config("pinned"), 20)).unwrap();
    match Streamer::open(&vault, with(&eager_config("pinned"), 20)) {
        Err(e) if e.kind() == ErrorKind::NoMemory => println!("REFUSED second: {e}"),
        Err(e) => println!("ERROR second: {e}"),
        Ok(_) => println!("OPENED second"),
    }
    drop(first);
    // Sized automatically, a pinned ring leaves the host room: it opens,
    // is populated, and serves claims.
    let s = Streamer::open(&vault, with(&eager_config("pinned"), 0)).unwrap();
    let ring = s.ring_region().1;
    let slots = s.stats().ring_slots as u32;
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline && rss() < 256 * MIB + ring {
        std::thread::sleep(Duration::from_millis(50));
    }
    for e in 0..slots {
        let c = s
            .claim_wait(0, e, Duration::from_secs(10))
            .unwrap()
            .unwrap();
        assert!(!c.is_empty());
    }
    println!(
        "AUTO pinned: {slots} slots, {ring} bytes, rss {} MiB, warnings {:?}",
        rss() / MIB,
        s.warnings()
    );
    std::hint::black_box(&host);
}

/// The config each ring of the child opens with, by name.
fn eager_config(name: &str) -> Config {
    let quiet = common::quiet_config(0, 2);
    match name {
        "pinned" => Config {
            pinned: true,
            ..quiet
        },
        "locked" => Config {
            lock: true,
            ..quiet
        },
        _ => Config {
            populate: Populate::Background,
            elastic: false,
            ..quiet
        },
    }
}

/// `config` with `ring_slots` slots of 8 MiB.
fn with(config: &Config, ring_slots: u32) -> Config {
    Config {
        ring_slots,
        slot_mb: 8,
        ..config.clone()
    }
}

/// This process's resident set, from /proc/self/statm.
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

#[test]
fn a_committed_ring_that_does_not_fit_is_refused() {
    let _alone = crate::alone();
    if !common::root_or_skip("a memory cgroup") {
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("smoe-pinned-")
        .tempdir_in("/var/tmp")
        .unwrap();
    // 48 small experts: the 8 MiB slots come from slot_mb.
    let v = common::vault_in(dir, 1, 48, 20_000, &[]);
    let cg = match Cgroup::create(512 * MIB) {
        Ok(cg) => cg,
        Err(e) => {
            common::skip_or_fail_root(&format!("cannot make a memory cgroup: {e}"));
            return;
        }
    };
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "pinned_ring::pinned_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("SMOE_PINNED_CHILD", &cg.dir)
        .env("SMOE_PINNED_VAULT", &v.file)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}");
    assert!(
        out.status.success(),
        "the host {} (OOM kills in its cgroup: {}):\n{stdout}\n{}",
        out.status,
        cg.oom_kills(),
        String::from_utf8_lossy(&out.stderr)
    );
    for name in ["pinned", "locked", "populated"] {
        // libtest's own "test ... " may stand before the child's first line.
        let refused = format!("REFUSED {name}: ");
        let line = stdout
            .lines()
            .find_map(|l| l.split_once(&refused).map(|(_, why)| why))
            .unwrap_or_else(|| panic!("the {name} ring was not refused:\n{stdout}"));
        assert!(
            line.contains("slots of 8388608 bytes") && line.contains("fit"),
            "{line}"
        );
    }
    // Refused whether the first ring's populate thread had committed its
    // pages by then (the probe sees them) or not (its promise counts).
    assert!(stdout.contains("REFUSED second: "), "{stdout}");
    assert!(stdout.contains("AUTO pinned: "), "{stdout}");
    assert_eq!(cg.oom_kills(), 0);
}
