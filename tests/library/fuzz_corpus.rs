//! Replays the fuzzer's seed corpus (`tests/fixtures/fuzz/vault_parse/`)
//! through `Vault::from_bytes` in the ordinary `cargo test`: no input may
//! panic, and every `valid-*` seed must be accepted. Each input is also
//! replayed "resealed" (checksums recomputed), as the fuzz target does.
//!
//! The deliberate seeds are made by `regenerate_seeds`, an ignored test:
//! `cargo test --test library -- --ignored fuzz_corpus::regenerate_seeds`.

use std::path::{Path, PathBuf};

use smoe::vault::{Vault, VaultWriter, WriterOptions};

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fuzz/vault_parse")
}

// `reseal` and `u64_at`, the fuzz target's own (one copy for both).
include!("../../fuzz/reseal.rs");

fn corpus_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(corpus_dir())
        .expect("the seed corpus directory exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

#[test]
fn every_corpus_file_parses_without_panic() {
    let files = corpus_files();
    assert!(
        files.len() >= 10,
        "expected the seed corpus, found {} files",
        files.len()
    );
    let mut total = 0u64;
    for path in &files {
        let bytes = std::fs::read(path).unwrap();
        total += bytes.len() as u64;
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let result = std::panic::catch_unwind(|| {
            let plain = Vault::from_bytes(&bytes).map(|v| v.entries().len());
            let resealed = reseal(&bytes).map(|b| Vault::from_bytes(&b).is_ok());
            (plain, resealed)
        });
        let (plain, _) = result.unwrap_or_else(|_| panic!("{name}: parsing panicked"));
        if name.starts_with("valid-") {
            let n = plain.unwrap_or_else(|e| panic!("{name}: a valid seed was rejected: {e}"));
            assert!(n >= 1, "{name}");
        } else if let Err(e) = plain {
            // A rejection is a single line a person can act on.
            assert!(!e.message().contains('\n'), "{name}: {e}");
        }
    }
    assert!(
        total < 1 << 20,
        "the corpus is {total} bytes; keep it under 1 MB"
    );
}

#[test]
fn damaged_seeds_are_rejected() {
    for path in corpus_files() {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with("damaged-") {
            let bytes = std::fs::read(&path).unwrap();
            assert!(Vault::from_bytes(&bytes).is_err(), "{name} was accepted");
        }
    }
}

/// A tiny vault (alignment 4096) in memory.
fn tiny_vault(
    n_layers: u32,
    n_experts: u32,
    blobs: &[(u32, u32, usize)],
    checksums: bool,
    meta: Option<&str>,
) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let opts = WriterOptions {
        alignment: 4096,
        checksums,
        meta: meta.map(str::to_owned),
        vault_id: Some(*b"fuzz-seed-vault!"),
    };
    let mut w = VaultWriter::create(dir.path(), n_layers, n_experts, opts).unwrap();
    for &(layer, expert, size) in blobs {
        let data: Vec<u8> = (0..size)
            .map(|i| (i as u32 ^ (layer * 31) ^ (expert * 7)) as u8)
            .collect();
        w.add_blob(layer, expert, &data).unwrap();
    }
    std::fs::read(w.finish().unwrap()).unwrap()
}

#[test]
#[ignore = "rewrites the committed seed corpus"]
fn regenerate_seeds() {
    let dir = corpus_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let meta = r#"{"format":"smoe-vault","writer":"seed","top_k":2}"#;
    let mut seeds: Vec<(&str, Vec<u8>)> = vec![
        (
            "valid-1x1-plain",
            tiny_vault(1, 1, &[(0, 0, 100)], false, None),
        ),
        (
            "valid-2x3-meta",
            tiny_vault(
                2,
                3,
                &[(1, 2, 10), (0, 0, 4096), (0, 1, 1), (1, 0, 300)],
                true,
                Some(meta),
            ),
        ),
        (
            "valid-3x4-dense0",
            tiny_vault(3, 4, &[(2, 3, 77), (1, 0, 5000), (2, 0, 9)], true, None),
        ),
        (
            "valid-1x2-multipage",
            tiny_vault(1, 2, &[(0, 1, 9000), (0, 0, 1)], false, Some("{}")),
        ),
    ];
    let base = seeds[1].1.clone();
    let mut damaged = |name: &'static str, f: &dyn Fn(&mut Vec<u8>)| {
        let mut b = base.clone();
        f(&mut b);
        seeds.push((name, b));
    };
    damaged("damaged-empty", &|b| b.clear());
    damaged("damaged-truncated-7", &|b| b.truncate(7));
    damaged("damaged-truncated-100", &|b| b.truncate(100));
    damaged("damaged-truncated-page0", &|b| b.truncate(4096));
    damaged("damaged-truncated-last-byte", &|b| {
        b.pop();
    });
    damaged("damaged-magic", &|b| b[0] = b'X');
    damaged("damaged-header-flip", &|b| b[20] ^= 1);
    damaged("damaged-table-flip", &|b| b[4096 + 8] ^= 0x40);
    damaged("damaged-page0-tail", &|b| b[2000] = 1);
    damaged("damaged-extra-byte", &|b| b.push(0));
    // Resealed variants: the checksums hold, a later rule breaks.
    let resealed = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut b = base.clone();
        f(&mut b);
        reseal(&b).unwrap()
    };
    let set_u32 =
        |b: &mut Vec<u8>, at: usize, v: u32| b[at..at + 4].copy_from_slice(&v.to_le_bytes());
    let set_u64 =
        |b: &mut Vec<u8>, at: usize, v: u64| b[at..at + 8].copy_from_slice(&v.to_le_bytes());
    seeds.push((
        "damaged-sealed-alignment",
        resealed(&|b| set_u32(b, 12, 3000)),
    ));
    seeds.push(("damaged-sealed-n-entries", resealed(&|b| set_u32(b, 24, 7))));
    seeds.push(("damaged-sealed-flags", resealed(&|b| set_u32(b, 28, 6))));
    seeds.push((
        "damaged-sealed-table-offset-huge",
        resealed(&|b| set_u64(b, 32, u64::MAX - 4095)),
    ));
    seeds.push((
        "damaged-sealed-meta-bytes",
        resealed(&|b| set_u64(b, 56, 1 << 40)),
    ));
    seeds.push((
        "damaged-sealed-entry-order",
        resealed(&|b| {
            // Swap the first two entries' (layer, expert).
            let (a, c) = (4096, 4096 + 48);
            let first: Vec<u8> = b[a..a + 8].to_vec();
            let second: Vec<u8> = b[c..c + 8].to_vec();
            b[a..a + 8].copy_from_slice(&second);
            b[c..c + 8].copy_from_slice(&first);
        }),
    ));
    seeds.push((
        "damaged-sealed-entry-size-zero",
        resealed(&|b| set_u64(b, 4096 + 16, 0)),
    ));
    seeds.push((
        "damaged-sealed-entry-offset-overflow",
        resealed(&|b| set_u64(b, 4096 + 8, u64::MAX - 4095)),
    ));
    seeds.push((
        "damaged-sealed-meta-not-object",
        resealed(&|b| {
            let at = u64_at(b, 48) as usize;
            b[at] = b'[';
        }),
    ));
    for (name, bytes) in &seeds {
        assert!(bytes.len() < 40_000, "{name} is {} bytes", bytes.len());
        std::fs::write(dir.join(name), bytes).unwrap();
    }
}
