//! Files the library finds where it expects its own (docs/format.md §4):
//!
//! - `freq_path` (or `expert_freq.bin`) naming a file that is not a histogram
//!   of this vault, a device, a FIFO, a socket, a directory, the vault file or
//!   a link to it: nothing is written there, not at close and not at
//!   `flush_stats`; a corrupt histogram of this vault is still replaced;
//! - a file placed at the histogram's path after open is not clobbered;
//! - a FIFO where the vault file, the histogram or a scout file is expected
//!   never blocks `open` (each check fails after 5 s instead of hanging; the
//!   tool's subcommands are checked the same way in
//!   `cli/tests/tool/hardening_files_cli.rs`);
//! - leftover temporary files of a killed writer are removed at open, and
//!   nothing else is.

use smoe_test_support as common;

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, SystemTime};

use smoe::internals::popularity::{encode, load, LoadOutcome};
use smoe::vault::Vault;
use smoe::{Config, ErrorKind, Streamer};

const TIMEOUT: Duration = Duration::from_secs(5);
const FREQ: &str = "expert_freq.bin";
const LAYERS: u32 = 2;
const EXPERTS: u32 = 4;

fn small_vault() -> common::TestVault {
    common::vault(LAYERS, EXPERTS, 5000, &[])
}

fn config(freq_path: Option<&Path>) -> Config {
    Config {
        ring_slots: 4,
        workers: 2,
        prewarm: false,
        freq_path: freq_path.map(Path::to_path_buf),
        ..Config::default()
    }
}

fn vault_id(vault: &Path) -> [u8; 16] {
    Vault::open(vault).unwrap().header().vault_id
}

/// What one session (open, one claim, `flush_stats`, close) reported.
#[derive(Debug)]
struct Session {
    warnings: Vec<String>,
    freq_ignored: u64,
    flush: smoe::Result<()>,
}

/// Opens a streamer on `vault`, claims one expert (so there is a count to
/// save), calls `flush_stats`, then closes it (drop persists again).
fn session(vault: &Path, freq_path: Option<&Path>) -> Session {
    let s = Streamer::open(vault, config(freq_path)).unwrap();
    let claim = s.claim_wait(1, 2, Duration::from_secs(5)).unwrap();
    assert!(claim.is_some(), "the claim timed out");
    drop(claim);
    let flush = s.flush_stats();
    let session = Session {
        warnings: s.warnings().to_vec(),
        freq_ignored: s.stats().freq_ignored,
        flush,
    };
    drop(s);
    session
}

/// Runs `f` on its own thread and fails if it has not returned within 5 s.
/// On a timeout `fifo` is opened for writing, which releases a thread
/// blocked opening it for reading, so the stuck thread can end.
fn within_timeout<T: Send + 'static>(
    what: &str,
    fifo: &Path,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = mpsc::channel();
    let handle = std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(TIMEOUT) {
        Ok(value) => {
            handle.join().unwrap();
            value
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => match handle.join() {
            Err(panic) => std::panic::resume_unwind(panic),
            Ok(()) => unreachable!("the thread neither sent nor panicked"),
        },
        Err(mpsc::RecvTimeoutError::Timeout) => {
            let _ = std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(fifo);
            panic!("{what} did not finish within {TIMEOUT:?}: it blocked");
        }
    }
}

/// Makes a character device node with /dev/null's numbers (1, 3); `false`
/// when this process may not (not root, or no CAP_MKNOD), after saying so
/// (a failure when SMOE_ROOT_TESTS is set).
fn mknod_null(path: &Path) -> bool {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: `c` is a valid NUL-terminated path for the duration of the call;
    // makedev only combines two integers.
    let rc = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) };
    if rc != 0 {
        smoe_test_support::skip_or_fail_root(&format!(
            "the device-node check: mknod {}: {} (it needs root with CAP_MKNOD; \
             SMOE_ROOT_TESTS=1 requires it)",
            path.display(),
            std::io::Error::last_os_error()
        ));
        return false;
    }
    true
}

#[track_caller]
fn assert_warned(session: &Session, path: &Path, needle: &str) {
    let shown = path.display().to_string();
    assert!(
        session
            .warnings
            .iter()
            .any(|w| w.contains(&shown) && w.contains(needle)),
        "no warning naming {shown} with {needle:?}: {:?}",
        session.warnings
    );
}

/// A protected file: the session warned naming it, counted it as ignored,
/// `flush_stats` wrote nothing and returned OK.
#[track_caller]
fn assert_protected(session: &Session, path: &Path, needle: &str) {
    assert_warned(session, path, needle);
    assert_eq!(session.freq_ignored, 1, "{session:?}");
    assert!(session.flush.is_ok(), "{session:?}");
}

/// `path` still holds exactly `before` (compared without printing megabytes).
#[track_caller]
fn assert_unchanged(path: &Path, before: &[u8], what: &str) {
    let now = std::fs::read(path).unwrap();
    assert!(
        now == before,
        "{what} was overwritten: {} now holds {} bytes starting {:?}",
        path.display(),
        now.len(),
        String::from_utf8_lossy(&now[..now.len().min(8)])
    );
}

/// The directory holds no temporary file of the histogram.
#[track_caller]
fn assert_no_temp_files(dir: &Path) {
    let names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp-"))
        .collect();
    assert!(names.is_empty(), "temporary files left: {names:?}");
}

// ---- 1. freq_path never replaces a file that is not ours ----------------------

#[test]
fn freq_path_at_the_vault_file_leaves_the_vault_intact() {
    let v = small_vault();
    let before = std::fs::read(&v.file).unwrap();
    let s = session(v.dir.path(), Some(&v.file));
    assert_unchanged(&v.file, &before, "the vault");
    assert_protected(&s, &v.file, "is the vault file");
    // Still a valid vault whose blobs are intact.
    let reopened = Streamer::open(v.dir.path(), config(Some(Path::new("")))).unwrap();
    let claim = reopened
        .claim_wait(1, 3, Duration::from_secs(5))
        .unwrap()
        .unwrap();
    v.check(1, 3, &claim);
    assert_no_temp_files(v.dir.path());
}

#[test]
fn freq_path_at_a_hard_link_or_symlink_to_the_vault_is_protected() {
    let v = small_vault();
    let before = std::fs::read(&v.file).unwrap();
    let ino = std::fs::metadata(&v.file).unwrap().ino();
    let hard = v.dir.path().join("hard-link.bin");
    std::fs::hard_link(&v.file, &hard).unwrap();
    let soft = v.dir.path().join("soft-link.bin");
    std::os::unix::fs::symlink(&v.file, &soft).unwrap();

    let s = session(v.dir.path(), Some(&hard));
    assert_eq!(
        std::fs::metadata(&hard).unwrap().ino(),
        ino,
        "the hard link was replaced"
    );
    assert_protected(&s, &hard, "is the vault file");

    let s = session(v.dir.path(), Some(&soft));
    assert!(
        std::fs::symlink_metadata(&soft)
            .unwrap()
            .file_type()
            .is_symlink(),
        "the symbolic link was replaced"
    );
    assert_protected(&s, &soft, "is the vault file");
    assert_unchanged(&v.file, &before, "the vault");
    assert_no_temp_files(v.dir.path());
}

#[test]
fn freq_path_at_a_text_file_leaves_it_unchanged() {
    let v = small_vault();
    let other = tempfile::tempdir().unwrap();
    let notes = other.path().join("notes.txt");
    let text = b"my precious notes, not a histogram\n".repeat(3);
    std::fs::write(&notes, &text).unwrap();
    let s = session(v.dir.path(), Some(&notes));
    assert_unchanged(&notes, &text, "the text file");
    assert_protected(&s, &notes, "not a histogram file");
    assert_no_temp_files(other.path());
}

#[test]
fn freq_path_at_a_device_node_stays_a_device() {
    let dir = tempfile::tempdir().unwrap();
    let node = dir.path().join("null-node");
    if !mknod_null(&node) {
        return;
    }
    let v = small_vault();
    let s = session(v.dir.path(), Some(&node));
    let meta = std::fs::symlink_metadata(&node).unwrap();
    assert!(
        meta.file_type().is_char_device(),
        "the node became {:?}",
        meta.file_type()
    );
    assert_eq!(meta.rdev(), libc::makedev(1, 3));
    assert_protected(&s, &node, "is a character device");
    assert_no_temp_files(dir.path());
}

#[test]
fn freq_path_at_a_directory_is_protected() {
    let v = small_vault();
    let dir = tempfile::tempdir().unwrap();
    let sub = dir.path().join("counts");
    std::fs::create_dir(&sub).unwrap();
    let s = session(v.dir.path(), Some(&sub));
    assert!(std::fs::metadata(&sub).unwrap().is_dir());
    assert_protected(&s, &sub, "is a directory");
    assert_no_temp_files(dir.path());
}

#[test]
fn freq_path_at_a_socket_is_protected() {
    let v = small_vault();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sock");
    let _listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let s = session(v.dir.path(), Some(&path));
    let kind = std::fs::symlink_metadata(&path).unwrap().file_type();
    assert!(kind.is_socket(), "the socket became {kind:?}");
    assert_protected(&s, &path, "is a socket");
}

#[test]
fn histogram_of_another_vault_is_kept() {
    let v = small_vault();
    let path = v.dir.path().join(FREQ);
    let other_id = *b"another vault id";
    assert_ne!(other_id, vault_id(&v.file));
    let bytes = encode(&other_id, LAYERS, EXPERTS, &[7; 8]).unwrap();
    std::fs::write(&path, &bytes).unwrap();
    let s = session(v.dir.path(), None);
    assert_unchanged(&path, &bytes, "the other vault's histogram");
    assert_protected(&s, &path, "a histogram of another vault");
}

#[test]
fn histogram_of_another_shape_is_kept() {
    let v = small_vault();
    let path = v.dir.path().join(FREQ);
    let id = vault_id(&v.file);
    // Same vault_id, another shape: the header does not describe this vault.
    let bytes = encode(&id, LAYERS + 1, EXPERTS, &[3; 12]).unwrap();
    std::fs::write(&path, &bytes).unwrap();
    let s = session(v.dir.path(), None);
    assert_unchanged(&path, &bytes, "the other vault's histogram");
    assert_protected(&s, &path, "a histogram of another vault");
}

#[test]
fn corrupt_histogram_of_this_vault_is_replaced() {
    let v = small_vault();
    let path = v.dir.path().join(FREQ);
    let id = vault_id(&v.file);
    let mut bytes = encode(&id, LAYERS, EXPERTS, &[5; 8]).unwrap();
    bytes[40 + 3 * 8] ^= 0x40; // a count: the checksum no longer matches
    std::fs::write(&path, &bytes).unwrap();
    let s = session(v.dir.path(), None);
    assert_warned(&s, &path, "checksum mismatch");
    assert_eq!(s.freq_ignored, 1);
    s.flush.unwrap();
    let LoadOutcome::Loaded(counts) = load(&path, &id, LAYERS, EXPERTS) else {
        panic!("the corrupt file was not replaced by a valid one");
    };
    // The bad counts were dropped; this session's one claim was saved.
    assert_eq!(counts.iter().sum::<u64>(), 1, "{counts:?}");
    assert_eq!(counts[(EXPERTS + 2) as usize], 1);
}

#[test]
fn truncated_histogram_of_this_vault_is_replaced() {
    let v = small_vault();
    let path = v.dir.path().join(FREQ);
    let id = vault_id(&v.file);
    let bytes = encode(&id, LAYERS, EXPERTS, &[5; 8]).unwrap();
    for keep in [bytes.len() - 9, 41, 20, 0] {
        std::fs::write(&path, &bytes[..keep]).unwrap();
        let s = session(v.dir.path(), None);
        assert!(s.flush.is_ok(), "{s:?}");
        assert!(
            matches!(load(&path, &id, LAYERS, EXPERTS), LoadOutcome::Loaded(_)),
            "a {keep}-byte truncation was not replaced"
        );
    }
}

#[test]
fn file_placed_after_open_is_not_clobbered() {
    let v = small_vault();
    let path = v.dir.path().join(FREQ);
    let s = Streamer::open(v.dir.path(), config(None)).unwrap();
    drop(s.claim_wait(0, 1, Duration::from_secs(5)).unwrap().unwrap());
    // Missing at open; someone puts their own file there while it runs.
    std::fs::write(&path, b"placed after open\n").unwrap();
    let flushed = s.flush_stats();
    assert_unchanged(&path, b"placed after open\n", "the file placed after open");
    let err = flushed.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Io);
    assert_eq!(err.path(), Some(path.as_path()));
    assert!(err.message().contains("not a histogram"), "{err}");
    drop(s);
    assert_unchanged(&path, b"placed after open\n", "the file placed after open");
    assert_no_temp_files(v.dir.path());

    // Ours at open, replaced by a FIFO meanwhile: refused, and no hang.
    std::fs::remove_file(&path).unwrap();
    let vault_dir = v.dir.path().to_path_buf();
    let s = Streamer::open(&vault_dir, config(None)).unwrap();
    s.flush_stats().unwrap();
    std::fs::remove_file(&path).unwrap();
    common::mkfifo(&path);
    let err = within_timeout("flush_stats over a FIFO", &path, move || {
        let r = s.flush_stats();
        drop(s);
        r
    })
    .unwrap_err();
    assert_eq!(err.path(), Some(path.as_path()));
    assert!(err.message().contains("is a FIFO"), "{err}");
    assert!(std::fs::symlink_metadata(&path)
        .unwrap()
        .file_type()
        .is_fifo());
}

#[test]
fn histogram_replaced_by_another_session_is_still_ours() {
    // Two streamers on one vault: each save renames a new file into place,
    // so the inode changes under the other; both keep persisting.
    let v = small_vault();
    let path = v.dir.path().join(FREQ);
    let a = Streamer::open(v.dir.path(), config(None)).unwrap();
    let b = Streamer::open(v.dir.path(), config(None)).unwrap();
    drop(a.claim_wait(0, 0, Duration::from_secs(5)).unwrap().unwrap());
    drop(b.claim_wait(0, 1, Duration::from_secs(5)).unwrap().unwrap());
    a.flush_stats().unwrap();
    b.flush_stats().unwrap();
    a.flush_stats().unwrap();
    drop((a, b));
    assert!(matches!(
        load(&path, &vault_id(&v.file), LAYERS, EXPERTS),
        LoadOutcome::Loaded(_)
    ));
}

#[test]
fn c_api_freq_path_at_the_vault_file_leaves_the_vault_intact() {
    use smoe::ffi::{
        smoe_close, smoe_config, smoe_config_init_sized, smoe_flush_stats, smoe_open, smoe_status,
        smoe_streamer,
    };
    let v = small_vault();
    let before = std::fs::read(&v.file).unwrap();
    let vault_path = CString::new(v.dir.path().as_os_str().as_bytes()).unwrap();
    let freq_path = CString::new(v.file.as_os_str().as_bytes()).unwrap();
    let mut cfg = std::mem::MaybeUninit::<smoe_config>::uninit();
    let size = std::mem::size_of::<smoe_config>() as u32;
    // SAFETY: `cfg` is valid for writing one smoe_config, `size` bytes.
    let status = unsafe { smoe_config_init_sized(cfg.as_mut_ptr(), size) };
    assert_eq!(status, smoe_status::SMOE_OK);
    // SAFETY: smoe_config_init_sized wrote every field.
    let mut cfg = unsafe { cfg.assume_init() };
    cfg.ring_slots = 4;
    cfg.workers = 2;
    cfg.prewarm = 0;
    cfg.freq_path = freq_path.as_ptr();
    let mut s: *mut smoe_streamer = std::ptr::null_mut();
    // SAFETY: both strings are NUL-terminated and outlive the call; `cfg`
    // and `s` are valid for reading and writing.
    let status = unsafe { smoe_open(vault_path.as_ptr(), &cfg, &mut s) };
    assert_eq!(status, smoe_status::SMOE_OK);
    // SAFETY: `s` is the live streamer smoe_open returned; closed once.
    unsafe {
        assert_eq!(smoe_flush_stats(s), smoe_status::SMOE_OK);
        smoe_close(s);
    }
    assert_unchanged(&v.file, &before, "the vault");
    Vault::open(&v.file).unwrap();
}

// ---- 2. a FIFO never blocks -----------------------------------------------------

#[test]
fn fifo_as_expert_freq_bin_does_not_block_open() {
    let v = small_vault();
    let fifo = v.dir.path().join(FREQ);
    common::mkfifo(&fifo);
    let dir = v.dir.path().to_path_buf();
    let s = within_timeout(
        "Streamer::open with a FIFO expert_freq.bin",
        &fifo,
        move || session(&dir, None),
    );
    assert_protected(&s, &fifo, "is a FIFO");
    assert!(std::fs::symlink_metadata(&fifo)
        .unwrap()
        .file_type()
        .is_fifo());
    assert_no_temp_files(v.dir.path());
}

#[test]
fn fifo_as_freq_path_does_not_block_open() {
    let v = small_vault();
    let other = tempfile::tempdir().unwrap();
    let fifo = other.path().join("counts.fifo");
    common::mkfifo(&fifo);
    let (dir, freq) = (v.dir.path().to_path_buf(), fifo.clone());
    let s = within_timeout("Streamer::open with a FIFO freq_path", &fifo, move || {
        session(&dir, Some(&freq))
    });
    assert_protected(&s, &fifo, "is a FIFO");
    assert!(std::fs::symlink_metadata(&fifo)
        .unwrap()
        .file_type()
        .is_fifo());
}

#[test]
fn load_of_a_fifo_does_not_block() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join(FREQ);
    common::mkfifo(&fifo);
    let path = fifo.clone();
    let outcome = within_timeout("popularity::load of a FIFO", &fifo, move || {
        load(&path, &[0; 16], 1, 1)
    });
    let reason = outcome.reason().unwrap().to_owned();
    assert!(reason.contains("is a FIFO"), "{reason}");
}

#[test]
fn fifo_vault_file_does_not_block_the_library() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("experts.smoe");
    common::mkfifo(&fifo);
    for path in [dir.path().to_path_buf(), fifo.clone()] {
        let p = path.clone();
        let err = within_timeout("Vault::open of a FIFO", &fifo, move || {
            Vault::open(&p).unwrap_err()
        });
        assert_eq!(err.kind(), ErrorKind::Argument);
        assert_eq!(err.path(), Some(fifo.as_path()));
        assert_eq!(
            err.message(),
            format!("{}: is a FIFO, not a vault or model file", fifo.display())
        );
        let p = path.clone();
        let err = within_timeout("Streamer::open of a FIFO", &fifo, move || {
            Streamer::open(&p, config(None)).unwrap_err()
        });
        assert!(err.message().contains("is a FIFO"), "{err}");
    }
}

#[test]
fn fifo_scout_does_not_block_open() {
    let v = small_vault();
    let scout = v.dir.path().join("scout.gguf");
    common::mkfifo(&scout);
    // (`smoe budget` with a FIFO scout: cli/tests/tool/hardening_files_cli.rs.)
    let dir = v.dir.path().to_path_buf();
    within_timeout("Streamer::open with a FIFO scout", &scout, move || {
        drop(Streamer::open(&dir, config(Some(Path::new("")))).unwrap())
    });
}

#[test]
fn symlinked_scout_counts_its_target() {
    let v = small_vault();
    let elsewhere = tempfile::tempdir().unwrap();
    let real = elsewhere.path().join("model.gguf");
    std::fs::write(&real, vec![1u8; 12345]).unwrap();
    std::os::unix::fs::symlink(&real, v.dir.path().join("scout.gguf")).unwrap();
    assert_eq!(Vault::open(&v.file).unwrap().scout_bytes(), 12345);
}

// ---- 3. leftover temporary files ----------------------------------------------

/// Sets `path`'s modification time `age` in the past.
fn age(path: &Path, age: Duration) {
    let file = std::fs::File::options().write(true).open(path).unwrap();
    file.set_modified(SystemTime::now() - age).unwrap();
}

#[test]
fn leftover_temp_files_are_removed_at_open() {
    let v = small_vault();
    let dir = v.dir.path();
    let hour = Duration::from_secs(3600);
    // A pid above every pid_max (Linux caps it at 2^22): no such process.
    let dead = 999_999_999u32;
    let stale = [
        format!(".{FREQ}.tmp-{dead}-0"),
        format!(".{FREQ}.tmp-{dead}-17"),
        format!(".{FREQ}.tmp-{}-3", dead - 1),
    ];
    for name in &stale {
        std::fs::write(dir.join(name), b"half a histogram").unwrap();
        age(&dir.join(name), hour);
    }
    let kept = [
        // Not the exact pattern.
        format!(".{FREQ}.tmp-{dead}-0.keep"),
        format!(".{FREQ}.tmp-{dead}"),
        format!(".{FREQ}.tmp-x-1"),
        format!(".{FREQ}.tmp--1"),
        format!("{FREQ}.tmp-{dead}-0"),
        format!(".other.bin.tmp-{dead}-0"),
        format!(".{FREQ}x.tmp-{dead}-0"),
        // This process's own (a save in flight on another thread).
        format!(".{FREQ}.tmp-{}-999", std::process::id()),
        // A live process's (pid 1 always exists).
        format!(".{FREQ}.tmp-1-0"),
    ];
    for name in &kept {
        std::fs::write(dir.join(name), b"not ours to remove").unwrap();
        age(&dir.join(name), hour);
    }
    // A dead writer's file modified just now: a writer in another pid
    // namespace may be between its write and its rename; left for later.
    let recent = format!(".{FREQ}.tmp-{dead}-5");
    std::fs::write(dir.join(&recent), b"fresh").unwrap();
    // Matching names that are not regular files.
    let sub = format!(".{FREQ}.tmp-{dead}-6");
    std::fs::create_dir(dir.join(&sub)).unwrap();
    let link = format!(".{FREQ}.tmp-{dead}-7");
    std::os::unix::fs::symlink(dir.join(&kept[0]), dir.join(&link)).unwrap();

    let s = session(dir, None);
    s.flush.unwrap();

    for name in &stale {
        assert!(!dir.join(name).exists(), "{name} was not removed");
    }
    for name in kept.iter().chain([&recent, &sub]) {
        assert!(dir.join(name).exists(), "{name} was removed");
    }
    assert!(
        std::fs::symlink_metadata(dir.join(&link)).is_ok(),
        "{link} was removed"
    );
    assert!(dir.join(FREQ).is_file());
    assert_eq!(
        std::fs::read(&v.file).unwrap().len() as u64,
        Vault::open(&v.file).unwrap().header().file_bytes
    );
}

#[test]
fn leftover_temp_files_of_a_custom_freq_path_are_removed() {
    let v = small_vault();
    let other = tempfile::tempdir().unwrap();
    let target = other.path().join("counts.bin");
    let stale = other.path().join(".counts.bin.tmp-999999999-2");
    let unrelated = other.path().join(format!(".{FREQ}.tmp-999999999-2"));
    for p in [&stale, &unrelated] {
        std::fs::write(p, b"x").unwrap();
        age(p, Duration::from_secs(3600));
    }
    let s = session(v.dir.path(), Some(&target));
    s.flush.unwrap();
    assert!(!stale.exists(), "the stale temporary file was not removed");
    assert!(
        unrelated.exists(),
        "another target's temporary file was removed"
    );
    assert!(target.is_file());
}

#[test]
fn protected_or_disabled_persistence_removes_nothing() {
    let v = small_vault();
    let dir = v.dir.path();
    let stale = dir.join(format!(".{FREQ}.tmp-999999999-0"));
    std::fs::write(&stale, b"x").unwrap();
    age(&stale, Duration::from_secs(3600));
    std::fs::write(dir.join(FREQ), b"someone else's file").unwrap();
    session(dir, None);
    assert!(stale.exists(), "removed while the target is someone else's");
    std::fs::remove_file(dir.join(FREQ)).unwrap();
    session(dir, Some(Path::new("")));
    assert!(stale.exists(), "removed with persistence off");
}
