//! Every byte of a vault is untrusted (docs/format.md §2): parsing arbitrary bytes
//! must return Ok or Err, never panic, overflow or allocate without bound.
//! When it accepts, the vault's accessors must agree with what was parsed.
//!
//! The header, table and metadata carry xxh3 checksums, which random
//! mutations almost never get right; so each input is parsed twice: as it
//! is, and "resealed" (its three checksums recomputed over whatever the
//! mutated fields point at), which lets the fuzzer reach every later rule.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    check(data);
    if let Some(resealed) = reseal(data) {
        check(&resealed);
    }
});

fn check(data: &[u8]) {
    if let Ok(vault) = smoe::vault::Vault::from_bytes(data) {
        let header = vault.header();
        assert_eq!(vault.entries().len(), header.n_entries as usize);
        assert_eq!(header.file_bytes, data.len() as u64);
        for e in vault.entries() {
            assert_eq!(vault.entry(e.layer, e.expert), Some(e));
            assert!(e.offset + e.padded_size <= data.len() as u64);
        }
        assert!(vault.max_padded_size() <= data.len() as u64);
    }
}

// `reseal` and `u64_at`, shared with tests/library/fuzz_corpus.rs (which
// replays the corpus the same way).
include!("../reseal.rs");
