//! Real-thread stress: many threads prefetch, claim, hold and release through
//! a ring smaller than the working set, and every byte of every claim is
//! checked against the deterministic payload. Counts come from
//! SMOE_STRESS_OPS (per thread) so the sanitizer script can scale them down.
//! In the `alone` binary: its eight threads keep every core busy, which the
//! time bounds of other tests would feel.

use smoe_test_support as common;

use std::time::Duration;

use smoe::{Config, DirectIo, ErrorKind, Policy, Priority, Streamer};

fn ops_per_thread(default: u64) -> u64 {
    std::env::var("SMOE_STRESS_OPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Runs `threads` threads of `ops` operations each; returns the number of
/// claims whose bytes were verified.
fn run(threads: u64, ops: u64, slots: u32, direct: DirectIo, policy: Policy) -> u64 {
    let (layers, experts) = (4u32, 64u32);
    let v = common::vault(layers, experts, 3000, &[]);
    let s = Streamer::open(
        &v.file,
        Config {
            ring_slots: slots,
            workers: 6,
            direct_io: direct,
            policy,
            ..Config::default()
        },
    )
    .unwrap();
    assert!(
        u64::from(slots) < u64::from(layers * experts),
        "the ring must be smaller than the working set"
    );
    let verified: u64 = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (s, v) = (&s, &v);
                scope.spawn(move || {
                    let mut rng = Rng(0x9e37_79b9 ^ ((t + 1) * 0x1234_5678_9abc));
                    let mut held = Vec::new();
                    let mut verified = 0u64;
                    for _ in 0..ops {
                        // Skewed popularity: a hot quarter gets most traffic.
                        let id = if rng.below(4) != 0 {
                            rng.below(64)
                        } else {
                            rng.below(256)
                        } as u32;
                        let (l, e) = (id / experts, id % experts);
                        match rng.below(10) {
                            0..=2 => {
                                let p = if rng.below(2) == 0 {
                                    Priority::Demand
                                } else {
                                    Priority::Speculative
                                };
                                match s.prefetch(l, e, p) {
                                    Ok(()) => {}
                                    Err(err) if err.kind() == ErrorKind::RingFull => {}
                                    Err(err) => panic!("prefetch: {err}"),
                                }
                            }
                            3..=4 => match s.claim(l, e) {
                                Ok(Some(c)) => {
                                    v.check(l, e, &c);
                                    verified += 1;
                                }
                                Ok(None) => {}
                                Err(err) if err.kind() == ErrorKind::RingFull => {}
                                Err(err) => panic!("claim: {err}"),
                            },
                            _ => match s.claim_wait_ticket(l, e, Duration::from_secs(10)) {
                                Ok(Some(info)) => {
                                    // SAFETY: the ticket is held until released below.
                                    let data = unsafe {
                                        std::slice::from_raw_parts(info.data, info.size as usize)
                                    };
                                    v.check(l, e, data);
                                    verified += 1;
                                    held.push(info);
                                    // Hold up to 3 claims, release in random order.
                                    if held.len() > 2 || rng.below(3) == 0 {
                                        let i = rng.below(held.len() as u64) as usize;
                                        let h = held.swap_remove(i);
                                        // SAFETY: still held.
                                        let data = unsafe {
                                            std::slice::from_raw_parts(h.data, h.size as usize)
                                        };
                                        v.check(h.layer, h.expert, data);
                                        s.release_ticket(h.ticket).unwrap();
                                    }
                                }
                                Ok(None) => panic!("layer {l} expert {e}: no data in 10 s"),
                                Err(err) if err.kind() == ErrorKind::RingFull => {}
                                Err(err) => panic!("claim_wait: {err}"),
                            },
                        }
                    }
                    for h in held {
                        // SAFETY: still held.
                        let data = unsafe { std::slice::from_raw_parts(h.data, h.size as usize) };
                        v.check(h.layer, h.expert, data);
                        s.release_ticket(h.ticket).unwrap();
                    }
                    verified
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    let st = s.stats();
    assert_eq!(st.io_errors, 0);
    assert!(st.evictions > 0, "the ring never turned over");
    assert!(st.resident <= u64::from(slots));
    assert_eq!(st.claims, verified);
    // Every claim was released: all slots can be held at once again. (A slot
    // may still be loading for the pre-warm thread, which reads while the
    // ring is idle: RING_FULL until it lands, which a leaked claim never does.)
    let all: Vec<_> = (0..slots)
        .map(|id| {
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            loop {
                match s.claim_wait(id / experts, id % experts, Duration::from_secs(10)) {
                    Ok(claim) => break claim.expect("read within 10 s"),
                    Err(e)
                        if e.kind() == ErrorKind::RingFull
                            && std::time::Instant::now() < deadline =>
                    {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    Err(e) => panic!("a slot leaked a claim: {e}"),
                }
            }
        })
        .collect();
    assert_eq!(all.len() as u32, slots);
    verified
}

#[test]
fn eight_threads_buffered_through_a_small_ring() {
    let _alone = crate::alone();
    let ops = ops_per_thread(200_000);
    let verified = run(8, ops, 48, DirectIo::Off, Policy::Lru);
    assert!(verified > ops, "only {verified} claims verified");
    eprintln!("8 threads × {ops} ops: {verified} claims verified byte for byte");
}

/// The adaptive policy ranks victims by layer, visit and claim count, all
/// hints written without synchronisation: the same stress, every byte
/// checked, must hold under it.
#[test]
fn eight_threads_adaptive_policy_through_a_small_ring() {
    let _alone = crate::alone();
    let ops = ops_per_thread(200_000) / 2;
    let verified = run(8, ops, 48, DirectIo::Off, Policy::Adaptive);
    assert!(verified > ops, "only {verified} claims verified");
    eprintln!("8 threads × {ops} ops, adaptive: {verified} claims verified byte for byte");
}

#[test]
fn eight_threads_direct_through_a_tiny_ring() {
    let _alone = crate::alone();
    let ops = ops_per_thread(150_000) / 4;
    let verified = run(8, ops, 32, DirectIo::Auto, Policy::Lru);
    assert!(verified > ops, "only {verified} claims verified");
    eprintln!("8 threads × {ops} ops (direct I/O where available): {verified} claims verified");
}

/// Working sets under contention: 8 threads each hand over sets of 2 to 12
/// experts of one layer (drawn from a hot pool, so threads share members),
/// then claim them with `claim_any`, whichever is ready first, holding up
/// to 2 claims at once, through a ring of 24 slots. Every claimed byte is
/// checked; every member of every set is claimed exactly once; with at most
/// 16 slots held, RING_FULL never happens.
#[test]
fn eight_threads_working_sets_through_a_tiny_ring() {
    let _alone = crate::alone();
    let rounds = ops_per_thread(200_000) / 100;
    let (layers, experts) = (4u32, 64u32);
    let v = common::vault(layers, experts, 3000, &[]);
    let s = Streamer::open(
        &v.file,
        Config {
            ring_slots: 24,
            workers: 6,
            direct_io: DirectIo::Off,
            ..Config::default()
        },
    )
    .unwrap();
    let claimed: u64 = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..8u64)
            .map(|t| {
                let (s, v) = (&s, &v);
                scope.spawn(move || {
                    let mut rng = Rng(0x51ed_2701 ^ ((t + 1) * 0x9e37_79b9_7f4a));
                    let mut held = Vec::new();
                    let mut claimed = 0u64;
                    for _ in 0..rounds {
                        let layer = rng.below(u64::from(layers)) as u32;
                        let n = 2 + rng.below(11) as usize;
                        let mut set: Vec<u32> = Vec::with_capacity(n);
                        while set.len() < n {
                            // A hot pool of 16 experts per layer, and the rest.
                            let e = if rng.below(3) != 0 {
                                rng.below(16)
                            } else {
                                rng.below(u64::from(experts))
                            } as u32;
                            if !set.contains(&e) {
                                set.push(e);
                            }
                        }
                        let priority = if rng.below(4) == 0 {
                            Priority::Speculative
                        } else {
                            Priority::Demand
                        };
                        let present = s.prefetch_set(layer, &set, priority).unwrap();
                        assert!(present as usize <= set.len());
                        let mut left = set.clone();
                        while !left.is_empty() {
                            let c = match s.claim_any_ticket(layer, &left, Duration::from_secs(10))
                            {
                                Ok(Some(c)) => c,
                                Ok(None) => panic!("layer {layer} set {left:?}: nothing in 10 s"),
                                Err(err) => panic!("claim_any {left:?}: {err}"),
                            };
                            let k = left.iter().position(|&e| e == c.expert).unwrap_or_else(|| {
                                panic!("claimed {} outside the set {left:?}", c.expert)
                            });
                            left.swap_remove(k);
                            // SAFETY: the ticket is held until released below.
                            let data =
                                unsafe { std::slice::from_raw_parts(c.data, c.size as usize) };
                            v.check(c.layer, c.expert, data);
                            claimed += 1;
                            held.push(c);
                            if held.len() > 2 {
                                let h = held.swap_remove(rng.below(held.len() as u64) as usize);
                                // SAFETY: still held.
                                let data =
                                    unsafe { std::slice::from_raw_parts(h.data, h.size as usize) };
                                v.check(h.layer, h.expert, data);
                                s.release_ticket(h.ticket).unwrap();
                            }
                        }
                    }
                    for h in held {
                        // SAFETY: still held.
                        let data = unsafe { std::slice::from_raw_parts(h.data, h.size as usize) };
                        v.check(h.layer, h.expert, data);
                        s.release_ticket(h.ticket).unwrap();
                    }
                    claimed
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    let st = s.stats();
    assert_eq!((st.io_errors, st.slots_held), (0, 0), "{st:?}");
    assert_eq!(st.claims, claimed);
    assert!(st.evictions > 0, "the ring never turned over");
    eprintln!("8 threads × {rounds} working sets: {claimed} claims verified byte for byte");
}
