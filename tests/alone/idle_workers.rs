//! Idle workers sleep: 16 workers with nothing to read, and the elastic
//! ring's memory monitor (on by default, sampling every 200 ms), use almost
//! no CPU.
//! In the `alone` binary, so no other test's threads share the process's
//! CPU accounting.

use smoe_test_support as common;

use std::time::{Duration, Instant};

use smoe::{Config, Priority, Streamer};

#[test]
fn sixteen_idle_workers_use_under_one_percent_of_a_core() {
    let _alone = crate::alone();
    let v = common::vault(2, 16, 20_000, &[]);
    let s = Streamer::open(
        &v.file,
        Config {
            ring_slots: 16,
            workers: 16,
            ..Config::default()
        },
    )
    .unwrap();
    // Give them work first, so they have been woken and gone back to sleep.
    for e in 0..16 {
        s.prefetch(1, e, Priority::Demand).unwrap();
    }
    for e in 0..16 {
        drop(
            s.claim_wait(1, e, Duration::from_secs(10))
                .unwrap()
                .unwrap(),
        );
    }
    std::thread::sleep(Duration::from_millis(100));
    // The memory monitor is among the threads measured.
    let threads: Vec<String> = std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .collect();
    assert!(
        threads.iter().any(|c| c.trim() == "smoe-memory"),
        "{threads:?}"
    );
    // The least of three 1-second windows: a worker that spins uses a core
    // in every window, while a machine busy with other work (a build
    // beside the tests) can slow the monitor's samples in one of them.
    let shares: Vec<f64> = (0..3)
        .map(|_| {
            let (cpu0, t0) = (common::process_cpu(), Instant::now());
            std::thread::sleep(Duration::from_secs(1));
            let (cpu, wall) = (common::process_cpu() - cpu0, t0.elapsed());
            eprintln!("16 idle workers and the memory monitor: {cpu:?} CPU over {wall:?}");
            cpu.as_secs_f64() / wall.as_secs_f64()
        })
        .collect();
    let share = shares.iter().copied().fold(f64::INFINITY, f64::min);
    assert!(
        share < 0.01,
        "idle workers used at least {:.2}% of a core in each of three seconds ({shares:?})",
        share * 100.0
    );
    // And they still wake up.
    let c = s
        .claim_wait(0, 3, Duration::from_secs(10))
        .unwrap()
        .unwrap();
    v.check(0, 3, &c);
}
