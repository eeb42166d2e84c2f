//! The reproducer of a ticket-generation wrap (hardening issue, item 3): a
//! 1-slot ring alternating two experts reloads its one slot on every claim.
//! A ticket from the first load must stay stale however many reloads
//! follow. With a 24-bit generation, load 2^24 reused the first load's
//! generation, so the old ticket released the live claim of that load.
//!
//! It takes 2^24 + 2 reads (a minute or more), so it is `#[ignore]`d; the
//! wrap itself is tested without the reads by the slot table's unit tests,
//! which start a slot's generation just below its wrap point. Run it with
//! `cargo test --release --test library -- --ignored generation_wrap::`.

use smoe_test_support as common;

use std::time::Duration;

use smoe::{ErrorKind, Streamer};

#[test]
#[ignore = "2^24 reloads of one slot; run by name"]
fn a_released_ticket_stays_stale_past_2_pow_24_reloads() {
    let v = common::vault(1, 2, 100, &[]);
    let s = Streamer::open(v.dir.path(), common::quiet_config(1, 1)).unwrap();
    let wait = Duration::from_secs(10);
    let first = s.claim_wait(0, 0, wait).unwrap().unwrap().into_ticket();
    s.release_ticket(first.ticket).unwrap();
    let loads: u64 = (1 << 24) + 2;
    for load in 2..=loads {
        let expert = (load % 2) as u32 ^ 1;
        let held = s
            .claim_wait(0, expert, wait)
            .unwrap()
            .unwrap_or_else(|| panic!("load {load}: no read within 10 s"));
        assert!(!held.hit(), "load {load}: the one slot was reloaded");
        let stale = s.release_ticket(first.ticket);
        assert!(
            matches!(&stale, Err(e) if e.kind() == ErrorKind::Stale),
            "load {load}: the first load's ticket {:#x} released a live claim ({stale:?})",
            first.ticket
        );
        v.check(0, expert, &held);
    }
    assert_eq!(s.stats().reads_demand, loads);
}
