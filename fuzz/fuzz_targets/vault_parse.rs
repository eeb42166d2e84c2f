//! Every byte of a vault is untrusted (SPEC §1.1): parsing arbitrary bytes
//! must return Ok or Err, never panic, overflow or allocate without bound.
//! When it accepts, the vault's accessors must agree with what was parsed.
//!
//! The header, table and metadata carry xxh3 checksums, which random
//! mutations almost never get right; so each input is parsed twice: as it
//! is, and "resealed" (its three checksums recomputed over whatever the
//! mutated fields point at), which lets the fuzzer reach every later rule.

#![no_main]

use libfuzzer_sys::fuzz_target;
use xxhash_rust::xxh3::xxh3_64;

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

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

/// `data` with table_xxh3, meta_xxh3 and header_xxh3 recomputed, or None
/// when it is too short to have a header.
fn reseal(data: &[u8]) -> Option<Vec<u8>> {
    if data.len() < 128 {
        return None;
    }
    let mut b = data.to_vec();
    let region = |offset: u64, len: u64| -> Option<&[u8]> {
        let start = usize::try_from(offset).ok()?;
        let end = start.checked_add(usize::try_from(len).ok()?)?;
        data.get(start..end)
    };
    if let Some(table) = region(u64_at(data, 32), u64_at(data, 40)) {
        b[96..104].copy_from_slice(&xxh3_64(table).to_le_bytes());
    }
    let meta_bytes = u64_at(data, 56);
    if meta_bytes != 0 {
        if let Some(meta) = region(u64_at(data, 48), meta_bytes) {
            b[104..112].copy_from_slice(&xxh3_64(meta).to_le_bytes());
        }
    }
    let sum = xxh3_64(&b[..120]);
    b[120..128].copy_from_slice(&sum.to_le_bytes());
    Some(b)
}
