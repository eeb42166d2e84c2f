//! Hand-made and hostile vaults: a writer's output edited byte by byte, with
//! the header and table checksums resealed so the edit under test is the
//! only thing wrong. Used by the library's tests and the tool's.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use smoe::vault::{Vault, VaultWriter, WriterOptions, MAX_EXPERT_IDS};
use xxhash_rust::xxh3::xxh3_64;

/// The alignment of the vaults [`write_vault`] makes.
pub const A: u64 = 4096;

/// The little-endian u64 at byte `at` of `b`.
pub fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// Writes `v` little-endian at byte `at` of `b`.
pub fn set_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// Recomputes the table and header checksums (docs/format.md §2: xxh3 of the table,
/// of header bytes 0..120), so the change under test is the only one.
pub fn reseal(b: &mut [u8]) {
    let t0 = u64_at(b, 32) as usize;
    let tn = u64_at(b, 40) as usize;
    let sum = xxh3_64(&b[t0..t0 + tn]);
    set_u64(b, 96, sum);
    let sum = xxh3_64(&b[..120]);
    set_u64(b, 120, sum);
}

/// A valid one-blob vault (alignment 4096) with `meta` as its metadata,
/// written into `dir`; returns the path of its `experts.smoe`.
pub fn write_vault(dir: &Path, meta: Option<&str>, checksums: bool, blob: &[u8]) -> PathBuf {
    let opts = WriterOptions {
        alignment: A as u32,
        checksums,
        meta: meta.map(str::to_owned),
        vault_id: Some([3; 16]),
    };
    let mut w = VaultWriter::create(dir, 1, 2, opts).unwrap();
    w.add_blob(0, 1, blob).unwrap();
    w.finish().unwrap()
}

/// A vault whose metadata bytes are `bad` (same length as a placeholder the
/// writer accepts), with a correct `meta_xxh3`: only the content is wrong.
pub fn vault_with_meta_bytes(dir: &Path, bad: &[u8]) -> PathBuf {
    let placeholder = "x".repeat(bad.len());
    let path = write_vault(dir, Some(&placeholder), true, b"blob");
    let mut b = std::fs::read(&path).unwrap();
    let at = u64_at(&b, 48) as usize;
    assert_eq!(u64_at(&b, 56) as usize, bad.len());
    b[at..at + bad.len()].copy_from_slice(bad);
    set_u64(&mut b, 104, xxh3_64(bad));
    reseal(&mut b);
    std::fs::write(&path, b).unwrap();
    path
}

/// A vault whose header claims `meta_bytes` of metadata, every other field
/// consistent with it: the metadata region and the data after it are a hole
/// in a sparse file, so nothing near that size is ever written.
pub fn vault_claiming_meta_bytes(dir: &Path, meta_bytes: u64) -> PathBuf {
    let path = write_vault(dir, None, true, &[5u8; 100]);
    let b = std::fs::read(&path).unwrap();
    let table_offset = u64_at(&b, 32) as usize;
    let table_bytes = u64_at(&b, 40) as usize;
    let old_data = u64_at(&b, 64);
    let meta_offset = (table_offset + table_bytes) as u64;
    let data_offset = (meta_offset + meta_bytes).next_multiple_of(A);
    let shift = data_offset - old_data;
    let mut head = b[..old_data as usize].to_vec();
    set_u64(&mut head, 48, meta_offset);
    set_u64(&mut head, 56, meta_bytes);
    set_u64(&mut head, 64, data_offset);
    set_u64(&mut head, 72, b.len() as u64 + shift);
    set_u64(&mut head, 104, 0x1234); // never reached: the cap comes first
    let e0 = table_offset;
    let off = u64_at(&head, e0 + 8);
    set_u64(&mut head, e0 + 8, off + shift);
    reseal(&mut head);
    let f = File::create(&path).unwrap();
    f.write_all_at(&head[..meta_offset as usize], 0).unwrap();
    f.write_all_at(&b[old_data as usize..], data_offset)
        .unwrap();
    f.set_len(b.len() as u64 + shift).unwrap();
    path
}

/// A valid vault of one blob of `size` payload bytes, all zero, that lives
/// in a hole of a sparse file (only the header and table are written).
/// `xxh3` is the entry's checksum; None writes a vault without checksums.
pub fn sparse_vault(dir: &Path, size: u64, xxh3: Option<u64>) -> PathBuf {
    let path = write_vault(dir, None, xxh3.is_some(), &[0u8]);
    let mut b = std::fs::read(&path).unwrap();
    let e0 = u64_at(&b, 32) as usize;
    let offset = u64_at(&b, e0 + 8);
    let padded = size.next_multiple_of(A);
    set_u64(&mut b, e0 + 16, size);
    set_u64(&mut b, e0 + 24, padded);
    set_u64(&mut b, e0 + 32, xxh3.unwrap_or(0));
    set_u64(&mut b, 72, offset + padded);
    reseal(&mut b);
    let f = File::create(&path).unwrap();
    f.write_all_at(&b[..offset as usize], 0).unwrap();
    f.set_len(offset + padded).unwrap();
    Vault::open(&path).expect("the sparse vault is valid");
    path
}

/// A vault with one 100-byte blob, (0, 0), and the shape `layers × experts`.
/// Shapes above the writer's limit are made by writing a 1 × 1 vault and
/// rewriting the header's shape (and its checksum), as a hostile file would.
pub fn one_entry_vault(dir: &Path, layers: u32, experts: u32) {
    let shape_ok = u64::from(layers) * u64::from(experts) <= MAX_EXPERT_IDS;
    let (l, e) = if shape_ok { (layers, experts) } else { (1, 1) };
    let mut w = VaultWriter::create(dir, l, e, WriterOptions::default()).unwrap();
    w.add_blob(0, 0, &[7u8; 100]).unwrap();
    let file = w.finish().unwrap();
    if !shape_ok {
        let mut bytes = std::fs::read(&file).unwrap();
        bytes[16..20].copy_from_slice(&layers.to_le_bytes());
        bytes[20..24].copy_from_slice(&experts.to_le_bytes());
        let sum = xxh3_64(&bytes[..120]);
        bytes[120..128].copy_from_slice(&sum.to_le_bytes());
        std::fs::write(&file, bytes).unwrap();
    }
}
