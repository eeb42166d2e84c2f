//! One damaged vault per rule of docs/format.md §2, each rejected with a message that
//! names the field and both values; plus the writer/reader round trip.

use std::path::Path;

use smoe::vault::{Vault, VaultWriter, WriterOptions, ENTRY_BYTES};
use smoe::ErrorKind;
use xxhash_rust::xxh3::xxh3_64;

const A: u64 = 4096;

/// A small valid vault: 3 layers × 4 experts, layer 0 dense, blobs of 1 to 3
/// pages, checksums and metadata on. Returns its bytes.
fn sample() -> Vec<u8> {
    sample_with(true, Some("{\"arch\":\"test\"}"))
}

fn sample_with(checksums: bool, meta: Option<&str>) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let opts = WriterOptions {
        alignment: A as u32,
        checksums,
        meta: meta.map(str::to_owned),
        vault_id: Some([7; 16]),
    };
    let mut w = VaultWriter::create(dir.path(), 3, 4, opts).unwrap();
    // Added out of order on purpose.
    for &(l, e) in &[(2, 3), (1, 0), (2, 0), (1, 1), (1, 3), (2, 1)] {
        let size = 1000 + (l as usize * 4 + e as usize) * 1500;
        let blob: Vec<u8> = (0..size).map(|i| (i as u8) ^ (l * 16 + e) as u8).collect();
        w.add_blob(l, e, &blob).unwrap();
    }
    let path = w.finish().unwrap();
    std::fs::read(path).unwrap()
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}
fn set_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
fn set_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// Byte offset of table entry `i`.
fn entry(b: &[u8], i: usize) -> usize {
    u64_at(b, 32) as usize + i * ENTRY_BYTES
}

/// Recomputes the table and header checksums, so the damage under test is
/// the only thing wrong.
fn reseal(b: &mut [u8]) {
    let t0 = u64_at(b, 32) as usize;
    let tn = u64_at(b, 40) as usize;
    if t0.checked_add(tn).is_some_and(|end| end <= b.len()) {
        let sum = xxh3_64(&b[t0..t0 + tn]);
        set_u64(b, 96, sum);
    }
    let sum = xxh3_64(&b[..120]);
    set_u64(b, 120, sum);
}

/// Asserts the vault is rejected as a format error about `field` (`None`:
/// a rule about no one field), with a one-line message containing every
/// needle (the values). Returns the error.
#[track_caller]
fn rejects(bytes: &[u8], field: Option<&str>, needles: &[&str]) -> smoe::Error {
    let err = Vault::from_bytes(bytes).expect_err("damaged vault was accepted");
    assert_eq!(err.kind(), ErrorKind::Format, "{err}");
    assert_eq!(err.field(), field, "{err}");
    let msg = err.to_string();
    for n in needles {
        assert!(msg.contains(n), "message {msg:?} does not mention {n:?}");
    }
    assert!(
        !msg.contains('\n'),
        "message is more than one line: {msg:?}"
    );
    err
}

#[track_caller]
fn damage_header(
    f: impl FnOnce(&mut Vec<u8>),
    field: Option<&str>,
    needles: &[&str],
) -> smoe::Error {
    let mut b = sample();
    f(&mut b);
    reseal(&mut b);
    rejects(&b, field, needles)
}

#[test]
fn sample_is_valid() {
    let b = sample();
    let v = Vault::from_bytes(&b).unwrap();
    assert_eq!(v.entries().len(), 6);
    assert_eq!(v.meta(), "{\"arch\":\"test\"}");
    assert!(v.entry(0, 0).is_none(), "layer 0 is dense");
    let e = v.entry(2, 3).unwrap();
    assert_eq!(e.size, 1000 + 11 * 1500);
    assert_eq!(e.padded_size, e.size.next_multiple_of(A));
    assert!(v.entry(3, 0).is_none() && v.entry(0, 4).is_none());
}

#[test]
fn empty_file() {
    rejects(&[], None, &["empty", "not a smoe vault"]);
}

#[test]
fn truncated_header() {
    rejects(
        &sample()[..60],
        None,
        &["truncated", "60 bytes", "128-byte header"],
    );
    rejects(&sample()[..5], None, &["truncated", "5 bytes"]);
}

#[test]
fn not_a_vault() {
    rejects(b"GGUF\x03\0\0\0 this is some other file format entirely, long enough to hold a header ........................................................", Some("magic"), &["magic is 0x4747554603000000", "not a smoe vault"]);
    rejects(b"hello", Some("magic"), &["not a smoe vault"]);
}

#[test]
fn other_version() {
    damage_header(
        |b| set_u32(b, 8, 2),
        Some("version"),
        &["version is 2", "expected 1"],
    );
}

#[test]
fn header_checksum() {
    let mut b = sample();
    b[20] ^= 1; // n_experts, without resealing
    rejects(&b, Some("header_xxh3"), &["header_xxh3 is", "hash to"]);
}

#[test]
fn alignment_not_power_of_two() {
    damage_header(
        |b| set_u32(b, 12, 5000),
        Some("alignment"),
        &["alignment is 5000", "power of two"],
    );
    damage_header(
        |b| set_u32(b, 12, 2048),
        Some("alignment"),
        &["alignment is 2048", "4096 to 1048576"],
    );
    damage_header(
        |b| set_u32(b, 12, 1 << 21),
        Some("alignment"),
        &["alignment is 2097152"],
    );
}

#[test]
fn shape_fields() {
    damage_header(|b| set_u32(b, 16, 0), Some("n_layers"), &["n_layers is 0"]);
    damage_header(
        |b| set_u32(b, 20, 0),
        Some("n_experts"),
        &["n_experts is 0"],
    );
    damage_header(
        |b| set_u32(b, 24, 0),
        Some("n_entries"),
        &["n_entries is 0", "1..=12"],
    );
    damage_header(
        |b| set_u32(b, 24, 13),
        Some("n_entries"),
        &["n_entries is 13", "1..=12"],
    );
    damage_header(
        |b| {
            set_u32(b, 16, u32::MAX);
            set_u32(b, 20, u32::MAX);
        },
        None,
        &["4294967295 × 4294967295", "limit"],
    );
}

#[test]
fn unknown_flags() {
    damage_header(
        |b| set_u32(b, 28, 0b11),
        Some("flags"),
        &["flags is 0x3", "bit 0"],
    );
}

#[test]
fn table_offset_and_size() {
    damage_header(
        |b| set_u64(b, 32, A + 8),
        Some("table_offset"),
        &["table_offset is 4104", "multiple of alignment 4096"],
    );
    damage_header(
        |b| set_u64(b, 32, 0),
        Some("table_offset"),
        &["table_offset is 0"],
    );
    damage_header(
        |b| set_u64(b, 40, 5 * 48),
        Some("table_bytes"),
        &["table_bytes is 240", "288"],
    );
}

#[test]
fn table_past_end_of_file() {
    damage_header(
        |b| set_u64(b, 32, 1 << 40),
        Some("table_offset"),
        &["table ends at", "past file_bytes"],
    );
}

#[test]
fn table_offset_near_u64_max() {
    // The largest aligned offset: table_offset + table_bytes must not wrap.
    damage_header(
        |b| set_u64(b, 32, u64::MAX - (A - 1)),
        Some("table_offset"),
        &["table ends at 18446744073709547808", "past file_bytes"],
    );
}

#[test]
fn metadata_fields() {
    // meta_offset inside the table.
    damage_header(
        |b| set_u64(b, 48, A + 10),
        Some("meta_offset"),
        &["meta_offset is 4106", "after the table"],
    );
    // meta past the end.
    damage_header(
        |b| set_u64(b, 56, 1 << 40),
        Some("meta_bytes"),
        &["metadata ends at", "past file_bytes"],
    );
    // meta overflow.
    damage_header(
        |b| set_u64(b, 56, u64::MAX),
        Some("meta_bytes"),
        &["overflows", "meta_bytes 18446744073709551615"],
    );
    // meta_offset set while meta_bytes is 0.
    let mut b = sample_with(true, None);
    set_u64(&mut b, 48, 9000);
    reseal(&mut b);
    rejects(
        &b,
        Some("meta_offset"),
        &["meta_offset is 9000", "meta_bytes is 0"],
    );
    let mut b = sample_with(true, None);
    set_u64(&mut b, 104, 1);
    reseal(&mut b);
    rejects(
        &b,
        Some("meta_xxh3"),
        &["meta_xxh3 is 0000000000000001", "meta_bytes is 0"],
    );
}

#[test]
fn metadata_content() {
    let mut b = sample();
    let at = u64_at(&b, 48) as usize;
    b[at + 2] = b'X';
    rejects(
        &b,
        Some("meta_xxh3"),
        &["meta_xxh3 is", "metadata hashes to"],
    );

    for (bad, needle) in [
        (&b"\xff\xfe"[..], "not UTF-8"),
        (&b"[1]"[..], "not a JSON object"),
    ] {
        let mut b = sample_with(true, Some(std::str::from_utf8(&[b'x'; 2][..]).unwrap()));
        let at = u64_at(&b, 48) as usize;
        b[at..at + 2].copy_from_slice(&bad[..2]);
        if bad.len() > 2 {
            // "[1]" needs 3 bytes: use a 3-byte meta instead.
            b = sample_with(true, Some("abc"));
            let at = u64_at(&b, 48) as usize;
            b[at..at + 3].copy_from_slice(bad);
        }
        let sum = xxh3_64(bad);
        set_u64(&mut b, 104, sum);
        reseal(&mut b);
        rejects(&b, Some("meta"), &[needle]);
    }
}

#[test]
fn data_offset_rules() {
    damage_header(
        |b| {
            let d = u64_at(b, 64);
            set_u64(b, 64, d + 100)
        },
        Some("data_offset"),
        &["data_offset is", "multiple of alignment"],
    );
    damage_header(
        |b| set_u64(b, 64, A),
        Some("data_offset"),
        &["data_offset is 4096", "at or after"],
    );
    damage_header(
        |b| set_u64(b, 64, 1 << 40),
        Some("data_offset"),
        &["data_offset is 1099511627776", "past file_bytes"],
    );
}

#[test]
fn file_bytes_must_match() {
    let b = sample();
    let n = b.len();
    rejects(
        &b[..n - 100],
        Some("file_bytes"),
        &[
            "file_bytes is",
            &format!("file is {} bytes", n - 100),
            "truncated",
        ],
    );
    let mut longer = b.clone();
    longer.extend_from_slice(&[0; 10]);
    rejects(
        &longer,
        Some("file_bytes"),
        &[
            &format!("file_bytes is {n}"),
            &format!("file is {} bytes", n + 10),
        ],
    );
}

#[test]
fn header_reserved() {
    damage_header(
        |b| set_u64(b, 112, 5),
        Some("reserved"),
        &["reserved", "is 5, expected 0"],
    );
}

#[test]
fn page_zero_tail() {
    let err = damage_header(|b| b[300] = 9, None, &["byte 300 of page 0 is 0x09"]);
    assert_eq!(err.offset(), Some(300));
}

#[test]
fn table_checksum() {
    let mut b = sample();
    let at = entry(&b, 0);
    b[at + 16] ^= 1;
    rejects(
        &b,
        Some("table_xxh3"),
        &["table_xxh3 is", "table hashes to"],
    );
}

#[track_caller]
fn damage_entry(
    i: usize,
    f: impl FnOnce(&mut [u8], usize),
    field: Option<&str>,
    needles: &[&str],
) -> smoe::Error {
    let mut b = sample();
    let at = entry(&b, i);
    f(&mut b, at);
    reseal(&mut b);
    rejects(&b, field, needles)
}

#[test]
fn entries_unsorted() {
    damage_entry(
        0,
        |b, at| {
            let (x, y) = (b[at..at + 48].to_vec(), b[at + 48..at + 96].to_vec());
            b[at..at + 48].copy_from_slice(&y);
            b[at + 48..at + 96].copy_from_slice(&x);
        },
        None,
        &["unsorted", "(1, 0) follows (1, 1)"],
    );
}

#[test]
fn entries_duplicated() {
    damage_entry(
        1,
        |b, at| set_u32(b, at + 4, 0),
        None,
        &["duplicate", "(1, 0)"],
    );
}

#[test]
fn entry_out_of_shape() {
    let err = damage_entry(
        5,
        |b, at| set_u32(b, at, 3),
        Some("layer"),
        &["layer is 3", "n_layers 3"],
    );
    assert_eq!(err.layer_expert(), Some((3, 3)), "the entry as it reads");
    let err = damage_entry(
        5,
        |b, at| set_u32(b, at + 4, 4),
        Some("expert"),
        &["expert is 4", "n_experts 4"],
    );
    assert_eq!(err.layer_expert(), Some((2, 4)));
}

#[test]
fn entry_misaligned() {
    damage_entry(
        2,
        |b, at| {
            let o = u64_at(b, at + 8);
            set_u64(b, at + 8, o + 512)
        },
        Some("offset"),
        &["misaligned", "multiple of alignment 4096"],
    );
}

#[test]
fn entry_before_data() {
    damage_entry(
        2,
        |b, at| set_u64(b, at + 8, A),
        Some("offset"),
        &["offset is 4096", "data_offset"],
    );
}

#[test]
fn entry_outside_file() {
    damage_entry(
        2,
        |b, at| set_u64(b, at + 8, 1 << 40),
        Some("offset"),
        &["outside the file", "file_bytes"],
    );
}

#[test]
fn entry_offset_overflow() {
    damage_entry(
        2,
        |b, at| set_u64(b, at + 8, u64::MAX - (A - 1)),
        Some("offset"),
        &["overflows", "offset 18446744073709547520"],
    );
}

#[test]
fn entries_overlap() {
    // Point entry 1 at entry 0's blob.
    damage_entry(
        1,
        |b, at| {
            let off0 = u64_at(b, at - 48 + 8);
            set_u64(b, at + 8, off0);
        },
        Some("offset"),
        &["overlap", "layer 1 expert 0", "layer 1 expert 1"],
    );
}

#[test]
fn size_rules() {
    damage_entry(
        0,
        |b, at| set_u64(b, at + 16, 0),
        Some("size"),
        &["size is 0"],
    );
    damage_entry(
        0,
        |b, at| {
            let p = u64_at(b, at + 24);
            set_u64(b, at + 16, p + 1)
        },
        Some("size"),
        &["size 8193 is greater than padded_size 8192"],
    );
    damage_entry(
        3,
        |b, at| {
            let p = u64_at(b, at + 24);
            set_u64(b, at + 24, p + A)
        },
        Some("padded_size"),
        &["padded_size is", "rounded up to alignment 4096"],
    );
}

#[test]
fn size_overflow() {
    damage_entry(
        0,
        |b, at| {
            set_u64(b, at + 16, u64::MAX - 5);
            set_u64(b, at + 24, u64::MAX);
        },
        Some("padded_size"),
        &["rounded up to alignment 4096 overflows"],
    );
}

#[test]
fn checksum_without_flag() {
    let mut b = sample_with(false, None);
    let at = entry(&b, 0);
    set_u64(&mut b, at + 32, 42);
    reseal(&mut b);
    rejects(
        &b,
        Some("xxh3"),
        &["xxh3 is 000000000000002a", "flags bit 0"],
    );
}

#[test]
fn entry_reserved() {
    damage_entry(
        4,
        |b, at| set_u64(b, at + 40, 1),
        Some("reserved"),
        &["reserved (offset 40) is 1"],
    );
}

#[test]
fn every_entry_is_reachable_in_o1() {
    let b = sample();
    let v = Vault::from_bytes(&b).unwrap();
    for e in v.entries() {
        let id = v.dense_id(e.layer, e.expert).unwrap();
        assert_eq!(id, e.layer * 4 + e.expert);
        assert_eq!(v.entry_by_id(id), Some(e));
    }
    assert_eq!(u32_at(&b, 24), 6);
}

#[test]
fn open_names_missing_path_and_os_error() {
    let err = Vault::open("/nonexistent/dir/vault").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Io);
    assert_eq!(err.path(), Some(Path::new("/nonexistent/dir/vault")));
    assert_eq!(err.os_error(), Some(libc::ENOENT));
}

#[test]
fn open_error_names_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut b = sample();
    set_u32(&mut b, 8, 9);
    reseal(&mut b);
    let p = dir.path().join("experts.smoe");
    std::fs::write(&p, &b).unwrap();
    let err = Vault::open(dir.path()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Format);
    assert_eq!(err.path(), Some(p.as_path()));
    assert_eq!(err.field(), Some("version"));
    assert!(err.to_string().contains("version is 9"), "{err}");
}
