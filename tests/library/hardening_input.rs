//! Hostile input, from the review that hardened the input paths: metadata
//! is handed over whole or rejected. A NUL byte or invalid UTF-8 fails the
//! open (naming the file, the field `meta` and the byte), a `meta_bytes`
//! above the cap fails from the header alone, before anything is allocated
//! or read, and the writer refuses what the reader would; a routing trace
//! with a huge row is checked in little time.
//!
//! The other half of that review, "the CLI never aborts" (`smoe verify` and
//! `smoe synth` in bounded memory, every numeric flag range-checked), runs
//! the tool as a process: `cli/tests/tool/hardening_input_cli.rs`.

use smoe_test_support as common;

use std::ffi::{CStr, CString};
use std::time::{Duration, Instant};

use common::forge::{u64_at, vault_claiming_meta_bytes, vault_with_meta_bytes, write_vault};
use smoe::vault::{Vault, VaultWriter, WriterOptions, MAX_META_BYTES};
use smoe::ErrorKind;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

// ------------------------------------------------------------- metadata

/// Opens a vault whose metadata is `bad` and checks the refusal: a format
/// error naming the file, field `meta`, the bad byte's offset in the
/// metadata (`at`) and in the file, and `what`.
fn assert_meta_refused(bad: &[u8], at: u64, what: &str) {
    let dir = tempfile::tempdir().unwrap();
    let path = vault_with_meta_bytes(dir.path(), bad);
    let meta_offset = u64_at(&std::fs::read(&path).unwrap(), 48);
    let err = Vault::open(&path).expect_err("bad metadata was accepted");
    assert_eq!(err.kind(), ErrorKind::Format, "{err}");
    assert_eq!(err.path(), Some(path.as_path()));
    assert_eq!(err.field(), Some("meta"));
    assert_eq!(err.offset(), Some(meta_offset + at));
    let msg = err.to_string();
    for needle in [
        "field meta".to_owned(),
        format!("byte {at} "),
        format!("file offset {}", meta_offset + at),
        what.to_owned(),
    ] {
        assert!(msg.contains(&needle), "{needle:?} not in {msg:?}");
    }
}

#[test]
fn metadata_with_a_nul_is_rejected_at_open() {
    // A host would see `{"a":1,"b":"x`, which is not JSON.
    assert_meta_refused(b"{\"a\":1,\"b\":\"x\0y\"}", 13, "NUL");
}

#[test]
fn metadata_with_invalid_utf8_is_rejected_naming_field_and_byte() {
    assert_meta_refused(b"{\"a\":\"\xc3\x28\"}", 6, "not UTF-8");
    // The first bad byte wins: invalid UTF-8 before a NUL names the UTF-8.
    let dir = tempfile::tempdir().unwrap();
    let path = vault_with_meta_bytes(dir.path(), b"{\"\xff\":\"\0\"}");
    let msg = Vault::open(&path).unwrap_err().to_string();
    assert!(
        msg.contains("byte 2 ") && msg.contains("not UTF-8"),
        "{msg}"
    );
    let dir = tempfile::tempdir().unwrap();
    let path = vault_with_meta_bytes(dir.path(), b"{\"\0\":\"\xff\"}");
    let msg = Vault::open(&path).unwrap_err().to_string();
    assert!(msg.contains("byte 2 ") && msg.contains("NUL"), "{msg}");
}

#[test]
fn meta_bytes_above_the_cap_is_rejected_from_the_header() {
    assert_eq!(MAX_META_BYTES, 64 * MIB);
    let dir = tempfile::tempdir().unwrap();
    let path = vault_claiming_meta_bytes(dir.path(), GIB);
    let start = Instant::now();
    let err = Vault::open(&path).expect_err("1 GiB of metadata was accepted");
    let took = start.elapsed();
    assert_eq!(err.kind(), ErrorKind::Format, "{err}");
    assert_eq!(err.path(), Some(path.as_path()));
    assert_eq!(err.field(), Some("meta_bytes"));
    let msg = err.to_string();
    for needle in [
        "meta_bytes is 1073741824".to_owned(),
        "67108864".to_owned(),
        "64 MiB".to_owned(),
    ] {
        assert!(msg.contains(&needle), "{needle:?} not in {msg:?}");
    }
    // Reading 1 GiB (even of a hole) took seconds; the header alone decides.
    assert!(took < Duration::from_millis(500), "took {took:?}");
    // (`smoe inspect` on a vault one byte over the cap:
    // cli/tests/tool/hardening_input_cli.rs.)
}

#[test]
fn metadata_at_the_cap_is_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let cap = MAX_META_BYTES as usize;
    let mut meta = String::with_capacity(cap);
    meta.push_str("{\"pad\":\"");
    meta.push_str(&"p".repeat(cap - meta.len() - 2));
    meta.push_str("\"}");
    assert_eq!(meta.len(), cap);
    let path = write_vault(dir.path(), Some(&meta), false, b"z");
    let v = Vault::open(&path).unwrap();
    assert_eq!(v.meta().len(), cap);
    assert!(v.meta() == meta);
}

#[test]
fn writer_refuses_metadata_a_reader_would_reject() {
    let dir = tempfile::tempdir().unwrap();
    let create = |meta: String| {
        VaultWriter::create(
            dir.path(),
            1,
            1,
            WriterOptions {
                meta: Some(meta),
                ..WriterOptions::default()
            },
        )
    };
    let err = create("{\"a\":\"x\0y\"}".to_owned()).expect_err("NUL accepted");
    assert_eq!(err.kind(), ErrorKind::Argument, "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("meta") && msg.contains("byte 7 ") && msg.contains("NUL"),
        "{msg}"
    );
    let big = format!("{{\"p\":\"{}\"}}", "q".repeat(MAX_META_BYTES as usize));
    let err = create(big.clone()).expect_err("oversized metadata accepted");
    assert_eq!(err.kind(), ErrorKind::Argument, "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("meta") && msg.contains(&big.len().to_string()) && msg.contains("67108864"),
        "{msg}"
    );
    // Nothing was left behind under any name.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn metadata_round_trips_byte_identical_through_the_c_api() {
    let dir = tempfile::tempdir().unwrap();
    let meta = "{\"arch\":\"qwen3moe\",\"name\":\"Grüße, 世界 🚀\",\"esc\":\"tab\\t\\u0001 quote\\\" \",\n \"n\": [1, 2.5e-3, null]}  ";
    let path = write_vault(dir.path(), Some(meta), true, b"payload");
    let c_path = CString::new(path.to_str().unwrap()).unwrap();
    let mut s: *mut smoe::ffi::smoe_streamer = std::ptr::null_mut();
    // SAFETY: a valid C string, NULL config (defaults) and a writable out.
    let st = unsafe { smoe::ffi::smoe_open(c_path.as_ptr(), std::ptr::null(), &mut s) };
    assert_eq!(st, smoe::ffi::smoe_status::SMOE_OK);
    // SAFETY: `s` is open; the string lives until smoe_close.
    let (first, second) = unsafe {
        (
            smoe::ffi::smoe_vault_metadata(s) as *const std::ffi::c_char,
            smoe::ffi::smoe_vault_metadata(s) as *const std::ffi::c_char,
        )
    };
    assert_eq!(first, second, "the same string every call, not a copy");
    // SAFETY: NUL-terminated and alive until smoe_close below.
    let got = unsafe { CStr::from_ptr(first) }.to_bytes().to_vec();
    // SAFETY: `s` came from smoe_open and nothing else uses it.
    unsafe { smoe::ffi::smoe_close(s) };
    assert_eq!(got, meta.as_bytes());
}

// ---------------------------------------------------------------- traces

#[test]
fn a_trace_row_with_a_million_ranks_is_checked_in_little_time() {
    // `bench --trace` reads the file before anything else: a pairwise
    // duplicate check of a row with a million ranks ran for minutes.
    let ranks = 1_000_000u32;
    let mut trace = String::from("token,layer");
    for r in 0..ranks {
        trace.push_str(&format!(",r{r}"));
    }
    trace.push_str("\n0,1");
    for e in 0..ranks - 1 {
        trace.push_str(&format!(",{e}"));
    }
    trace.push_str(",7\n"); // the one duplicate, last
    let start = Instant::now();
    let err = smoe::internals::router::parse_trace(&trace).expect_err("a duplicate expert");
    assert!(
        err.to_string().contains("line 2: expert 7 appears twice"),
        "{err}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
}
