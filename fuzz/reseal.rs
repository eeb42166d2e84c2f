// Included (with `include!`) by fuzz/fuzz_targets/vault_parse.rs and
// tests/library/fuzz_corpus.rs, so the fuzzer and the corpus replay in
// `cargo test` reseal inputs identically. Needs `xxhash_rust` as a dependency.

/// The little-endian u64 at byte `at` of `b` (`b` is at least 128 bytes
/// wherever this is called).
fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

/// `data` with table_xxh3, meta_xxh3 and header_xxh3 recomputed over
/// whatever the (possibly damaged) fields point at, or None when it is too
/// short to have a header. Random mutations almost never get past the
/// header checksum; resealed, they reach the rules behind it.
fn reseal(data: &[u8]) -> Option<Vec<u8>> {
    use xxhash_rust::xxh3::xxh3_64;
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
