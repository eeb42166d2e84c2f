//! Trace capture (`trace_path`, docs/format.md §5.3), through the C API:
//!
//! - claims driven by the shared Mixtral trace come back as exactly that
//!   trace, byte for byte;
//! - a file at `trace_path` that is not a trace (a text file, the vault
//!   file, the histogram file, a directory) is left intact, with a warning
//!   naming it; a FIFO there does not block `smoe_open`;
//! - `""` and NULL are off: nothing is written;
//! - an earlier trace is replaced;
//! - the claim path allocates nothing, recording or full (a counting
//!   global allocator), and a full trace counts what it drops.

use smoe_test_support as common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::ffi::{CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use smoe::ffi::{
    smoe_claim, smoe_claim_wait, smoe_close, smoe_config, smoe_config_init_sized, smoe_get_stats,
    smoe_open, smoe_release, smoe_slot, smoe_stats, smoe_status, smoe_streamer, smoe_warnings,
};
use smoe::internals::router::parse_trace;
use smoe::{Config, Streamer};

/// Counts allocations made by the thread that set `COUNTING`.
struct CountingAllocator;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: forwards every call to `System` unchanged; the counters are
// const-initialised thread locals, which never allocate.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

fn count() {
    let _ = COUNTING.try_with(|on| {
        if on.get() {
            let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        }
    });
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// Allocations `f` makes on this thread.
fn allocations_in(f: impl FnOnce()) -> u64 {
    ALLOCATIONS.with(|n| n.set(0));
    COUNTING.with(|on| on.set(true));
    f();
    COUNTING.with(|on| on.set(false));
    ALLOCATIONS.with(Cell::get)
}

const WAIT_NS: u64 = 10_000_000_000;

fn c_path(path: &Path) -> CString {
    CString::new(path.as_os_str().as_bytes()).unwrap()
}

/// A streamer opened through the C API; closed on drop.
struct CStreamer(*mut smoe_streamer);

impl CStreamer {
    /// Opens `vault` with small settings, no histogram, and `trace_path`
    /// (NULL when `None`).
    fn open(vault: &Path, trace_path: Option<&CStr>) -> CStreamer {
        let mut cfg = std::mem::MaybeUninit::<smoe_config>::uninit();
        let size = std::mem::size_of::<smoe_config>() as u32;
        // SAFETY: `cfg` is valid for writing one smoe_config, `size` bytes.
        let status = unsafe { smoe_config_init_sized(cfg.as_mut_ptr(), size) };
        assert_eq!(status, smoe_status::SMOE_OK);
        // SAFETY: smoe_config_init_sized wrote every field.
        let mut cfg = unsafe { cfg.assume_init() };
        assert!(cfg.trace_path.is_null(), "off by default");
        cfg.ring_slots = 64;
        cfg.workers = 2;
        cfg.prewarm = 0;
        cfg.freq_path = c"".as_ptr();
        cfg.trace_path = trace_path.map_or(std::ptr::null(), CStr::as_ptr);
        let vault = c_path(vault);
        let mut s: *mut smoe_streamer = std::ptr::null_mut();
        // SAFETY: the strings are NUL-terminated and outlive the call; `cfg`
        // and `s` are valid for reading and writing.
        let status = unsafe { smoe_open(vault.as_ptr(), &cfg, &mut s) };
        assert_eq!(status, smoe_status::SMOE_OK);
        CStreamer(s)
    }

    fn warnings(&self) -> String {
        // SAFETY: `self.0` is live; the string lives until close.
        unsafe { CStr::from_ptr(smoe_warnings(self.0)) }
            .to_string_lossy()
            .into_owned()
    }

    /// Claims (waiting for the read) and releases (layer, expert).
    fn claim_release(&self, layer: u32, expert: u32) {
        let mut slot = std::mem::MaybeUninit::<smoe_slot>::uninit();
        // SAFETY: `self.0` is live; `slot` is writable.
        let status = unsafe { smoe_claim_wait(self.0, layer, expert, WAIT_NS, slot.as_mut_ptr()) };
        assert_eq!(
            status,
            smoe_status::SMOE_OK,
            "layer {layer} expert {expert}"
        );
        // SAFETY: SMOE_OK wrote the slot; it is released once.
        assert_eq!(
            unsafe { smoe_release(self.0, slot.as_ptr()) },
            smoe_status::SMOE_OK
        );
    }

    fn stats(&self) -> smoe_stats {
        // SAFETY: all-zero bytes are a valid smoe_stats (integers only).
        let mut st: smoe_stats = unsafe { std::mem::zeroed() };
        st.struct_size = std::mem::size_of::<smoe_stats>() as u32;
        // SAFETY: `self.0` is live; `st` is a whole smoe_stats.
        assert_eq!(
            unsafe { smoe_get_stats(self.0, &mut st) },
            smoe_status::SMOE_OK
        );
        st
    }
}

impl Drop for CStreamer {
    fn drop(&mut self) {
        // SAFETY: `self.0` came from smoe_open and is closed once, here.
        unsafe { smoe_close(self.0) };
    }
}

/// The shared Mixtral trace, read where the repository's checkout sits next
/// to `shared/` (never copied into the repository).
fn mixtral_trace() -> Option<PathBuf> {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/traces/mixtral-8x7b-decode.csv");
    path.is_file().then_some(path)
}

#[test]
fn mixtral_trace_through_the_c_api_comes_back_exactly() {
    let Some(input) = mixtral_trace() else {
        smoe_test_support::skip::skip(
            "../shared/traces/mixtral-8x7b-decode.csv is not beside this checkout (the shared \
             traces are never copied into the repository)",
        );
        return;
    };
    let text = std::fs::read_to_string(&input).unwrap();
    let rows = parse_trace(&text).unwrap();
    assert_eq!(rows.len(), 18_668);
    let v = common::vault(32, 8, 3000, &[]);
    let out_dir = tempfile::tempdir().unwrap();
    let out = out_dir.path().join("captured.csv");
    let s = CStreamer::open(v.dir.path(), Some(&c_path(&out)));
    assert_eq!(s.warnings(), "");
    for row in &rows {
        assert_eq!(row.experts.len(), 2, "top-2");
        for &expert in &row.experts {
            s.claim_release(row.layer, expert);
        }
    }
    let st = s.stats();
    assert_eq!((st.trace_events, st.trace_dropped), (2 * 18_668, 0));
    assert!(!out.exists(), "written at close, not before");
    drop(s);
    let written = std::fs::read_to_string(&out).unwrap();
    // The token numbers come back too: the trace's 4 sequences are numbered
    // one after another, and no missing row leaves a token whose layers
    // continue the previous token's ascending run.
    let captured = parse_trace(&written).unwrap();
    assert_eq!(captured, rows);
    assert_eq!(written, text, "byte for byte");
}

/// Opens with `trace_path` = `target`, claims two experts, closes; returns
/// the open-time warnings and stats.
fn session(vault: &Path, target: &Path) -> (String, smoe_stats) {
    let s = CStreamer::open(vault, Some(&c_path(target)));
    s.claim_release(0, 1);
    s.claim_release(1, 3);
    (s.warnings(), s.stats())
}

#[track_caller]
fn assert_off(warnings: &str, st: &smoe_stats, target: &Path, what: &str) {
    assert!(
        warnings.contains(&format!("{}: {what}", target.display()))
            && warnings.contains("no trace is recorded"),
        "{warnings:?}"
    );
    assert_eq!((st.trace_events, st.trace_dropped), (0, 0));
}

#[test]
fn a_foreign_file_at_trace_path_is_left_intact_with_a_warning() {
    let v = common::vault(2, 4, 3000, &[]);
    let text = v.dir.path().join("notes.csv");
    std::fs::write(&text, "token,layer,expert\n0,0,1\n").unwrap();
    let (warnings, st) = session(v.dir.path(), &text);
    assert_off(&warnings, &st, &text, "is not a routing trace");
    assert_eq!(
        std::fs::read_to_string(&text).unwrap(),
        "token,layer,expert\n0,0,1\n"
    );

    let vault_bytes = std::fs::read(&v.file).unwrap();
    let (warnings, st) = session(v.dir.path(), &v.file);
    assert_off(&warnings, &st, &v.file, "is the vault file");
    let link = v.dir.path().join("link.csv");
    std::os::unix::fs::symlink(&v.file, &link).unwrap();
    let (warnings, st) = session(v.dir.path(), &link);
    assert_off(&warnings, &st, &link, "is a symbolic link to");
    assert_eq!(std::fs::read(&v.file).unwrap(), vault_bytes);

    let dir = v.dir.path().join("a-directory");
    std::fs::create_dir(&dir).unwrap();
    let (warnings, st) = session(v.dir.path(), &dir);
    assert_off(&warnings, &st, &dir, "is a directory");
    assert!(dir.is_dir());
}

#[test]
fn the_histogram_file_is_never_the_trace() {
    let v = common::vault(2, 4, 3000, &[]);
    let freq = v.dir.path().join("expert_freq.bin");
    let config = Config {
        ring_slots: 4,
        workers: 2,
        prewarm: false,
        trace_path: Some(freq.clone()),
        ..Config::default()
    };
    let s = Streamer::open(v.dir.path(), config).unwrap();
    let warnings = s.warnings().join("\n");
    assert!(warnings.contains("is the histogram file"), "{warnings:?}");
    drop(s.claim_wait(0, 1, Duration::from_secs(10)).unwrap());
    drop(s);
    let saved = std::fs::read(&freq).unwrap();
    assert_eq!(&saved[..8], b"SMOEFREQ", "the histogram, not a trace");
}

#[test]
fn a_fifo_at_trace_path_does_not_block_open() {
    let v = common::vault(2, 4, 3000, &[]);
    let other = tempfile::tempdir().unwrap();
    let fifo = other.path().join("trace.fifo");
    let c = c_path(&fifo);
    // SAFETY: `c` is a valid NUL-terminated path for the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let (tx, rx) = mpsc::channel();
    let (dir, target) = (v.dir.path().to_path_buf(), fifo.clone());
    let handle = std::thread::spawn(move || {
        let _ = tx.send(session(&dir, &target));
    });
    let Ok((warnings, st)) = rx.recv_timeout(Duration::from_secs(5)) else {
        // Release a thread blocked opening it for reading, then fail.
        let _ = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags_nonblock()
            .open(&fifo);
        panic!("smoe_open with a FIFO trace_path blocked");
    };
    handle.join().unwrap();
    assert_off(&warnings, &st, &fifo, "is a FIFO");
    assert!(std::fs::symlink_metadata(&fifo)
        .unwrap()
        .file_type()
        .is_fifo());
}

trait NonBlock {
    fn custom_flags_nonblock(&mut self) -> &mut Self;
}

impl NonBlock for std::fs::OpenOptions {
    fn custom_flags_nonblock(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.custom_flags(libc::O_NONBLOCK)
    }
}

#[test]
fn empty_or_null_trace_path_is_off() {
    let v = common::vault(2, 4, 3000, &[]);
    let before: Vec<_> = std::fs::read_dir(v.dir.path()).unwrap().collect();
    for path in [Some(c""), None] {
        let s = CStreamer::open(v.dir.path(), path);
        s.claim_release(0, 1);
        assert_eq!(s.warnings(), "");
        let st = s.stats();
        assert_eq!((st.trace_events, st.trace_dropped), (0, 0));
    }
    let after: Vec<_> = std::fs::read_dir(v.dir.path()).unwrap().collect();
    assert_eq!(before.len(), after.len(), "nothing written");
}

#[test]
fn an_earlier_trace_is_replaced_and_repeats_are_recorded_once() {
    let v = common::vault(2, 4, 3000, &[]);
    let out = v.dir.path().join("t.csv");
    std::fs::write(&out, "token,layer,r0,r1,r2\n0,0,1,2,3\n").unwrap();
    let s = CStreamer::open(v.dir.path(), Some(&c_path(&out)));
    assert_eq!(s.warnings(), "");
    for (layer, expert) in [(0, 2), (0, 2), (0, 3), (1, 0), (0, 3), (1, 1), (1, 2)] {
        s.claim_release(layer, expert);
    }
    drop(s);
    assert_eq!(
        std::fs::read_to_string(&out).unwrap(),
        "token,layer,r0,r1\n0,0,2,3\n0,1,0,\n1,0,3,\n1,1,1,2\n"
    );
    let leftovers: Vec<_> = std::fs::read_dir(v.dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(".tmp-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn the_claim_path_allocates_nothing_and_a_full_trace_counts_drops() {
    let v = common::vault(2, 4, 3000, &[]);
    let out = v.dir.path().join("t.csv");
    // A recorder of 20 claims (a Rust-only test hook): recording, then full.
    let config = Config {
        trace_path: Some(out.clone()),
        trace_capacity: 20,
        ..common::quiet_config(8, 2)
    };
    let s = Streamer::open(v.dir.path(), config).unwrap();
    for layer in 0..2 {
        for expert in 0..4 {
            drop(
                s.claim_wait(layer, expert, Duration::from_secs(10))
                    .unwrap(),
            );
        }
    }
    let counted = allocations_in(|| drop(std::hint::black_box(vec![1u8; 10])));
    assert_eq!(counted, 1, "the counter sees an allocation");
    let allocations = allocations_in(|| {
        for _ in 0..1000 {
            for layer in 0..2 {
                for expert in 0..4 {
                    let info = s.claim_ticket(layer, expert).unwrap().expect("resident");
                    s.release_ticket(info.ticket).unwrap();
                }
            }
        }
    });
    assert_eq!(allocations, 0, "claims and releases allocated");
    let st = s.stats();
    assert_eq!((st.trace_events, st.trace_dropped), (20, 8 + 8000 - 20));
    drop(s);
    let row = "0,1,2,3";
    assert_eq!(
        std::fs::read_to_string(&out).unwrap(),
        format!("token,layer,r0,r1,r2,r3\n0,0,{row}\n0,1,{row}\n1,0,{row}\n1,1,{row}\n2,0,{row}\n"),
        "the first 20 claims"
    );

    // The C API's claim and release, recording into the default capacity.
    let s = CStreamer::open(v.dir.path(), Some(&c_path(&out)));
    for layer in 0..2 {
        for expert in 0..4 {
            s.claim_release(layer, expert);
        }
    }
    let mut slot = std::mem::MaybeUninit::<smoe_slot>::uninit();
    let allocations = allocations_in(|| {
        for _ in 0..1000 {
            for layer in 0..2 {
                for expert in 0..4 {
                    // SAFETY: `s.0` is live; `slot` is writable and, after
                    // SMOE_OK, released once.
                    unsafe {
                        assert_eq!(
                            smoe_claim(s.0, layer, expert, slot.as_mut_ptr()),
                            smoe_status::SMOE_OK
                        );
                        assert_eq!(smoe_release(s.0, slot.as_ptr()), smoe_status::SMOE_OK);
                    }
                }
            }
        }
    });
    assert_eq!(allocations, 0, "smoe_claim and smoe_release allocated");
    let st = s.stats();
    assert_eq!((st.trace_events, st.trace_dropped), (8 + 8000, 0));
}
