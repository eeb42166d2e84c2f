//! How long does `claim_wait` take over a busy poll of `claim`?
//! (run: `cargo bench --bench claim_wait`)
//!
//! The setup: 2 MiB blobs in a vault on tmpfs
//! (`/dev/shm`, so reads run at memory speed and the wake-up is what is
//! measured), an 8-slot ring, 2 workers, 320 prefetch-then-claim pairs per
//! way, alternating rounds. For each pair we prefetch an expert that is not
//! resident and time until its claim returns: once by `claim_wait`, once by
//! polling `claim` in a loop. The claim: the median of `claim_wait` is
//! within 10 µs of the busy poll's.

use std::time::{Duration, Instant};

use smoe::{Priority, Streamer};

use smoe_test_support as common;

const PAIRS: usize = 320;
const ROUNDS: usize = 3;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort_unstable();
    v[v.len() / 2]
}

fn run(s: &Streamer, experts: u32, round: usize, wait: bool) -> Duration {
    let mut times = Vec::with_capacity(PAIRS);
    for i in 0..PAIRS {
        // Cycle through more experts than slots, so each prefetch reads.
        let e = ((i + round * 7) as u32) % experts;
        let t = Instant::now();
        s.prefetch(0, e, Priority::Demand).unwrap();
        let claim = if wait {
            s.claim_wait(0, e, Duration::from_secs(10))
                .unwrap()
                .unwrap()
        } else {
            loop {
                if let Some(c) = s.claim(0, e).unwrap() {
                    break c;
                }
                std::hint::spin_loop();
            }
        };
        times.push(t.elapsed());
        drop(claim);
    }
    median(times)
}

fn main() {
    let base = if std::path::Path::new("/dev/shm").is_dir() {
        std::path::PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let experts = 24;
    let v = common::vault_in(
        tempfile::tempdir_in(base).unwrap(),
        1,
        experts,
        2 << 20,
        &[],
    );
    let s = Streamer::open(v.dir.path(), common::quiet_config(8, 2)).unwrap();
    println!("claim of a just-prefetched 2 MiB expert (tmpfs, 8 slots, 2 workers), median of {PAIRS} per round:");
    for round in 0..ROUNDS {
        let poll = run(&s, experts, round, false);
        let wait = run(&s, experts, round, true);
        let added = wait.as_secs_f64() - poll.as_secs_f64();
        println!(
            "round {round}: busy poll {:.1} µs, claim_wait {:.1} µs, added {:+.1} µs",
            poll.as_secs_f64() * 1e6,
            wait.as_secs_f64() * 1e6,
            added * 1e6
        );
    }
}
