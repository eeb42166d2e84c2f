//! The histogram file (docs/format.md §4): round trip, accumulation across sessions,
//! every kind of bad file ignored with a reason (a damaged one of this vault
//! replaced, a foreign one protected), persistence off and read-only, and
//! crash safety of the atomic replace under SIGKILL.
//!
//! Two tests re-execute this test binary as a child (selected by an
//! environment variable) instead of adding a helper binary: the crash writer
//! and, when running as root, the read-only check as uid 65534.
//!
//! `cargo test --release --test library --lib popularity` runs these with
//! the library's unit tests of the histogram.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use smoe::internals::files::is_temp_file_name;
use smoe::internals::popularity::{
    encode, file_bytes, load, save, Histogram, LoadOutcome, Persistence,
};

const VAULT_ID: [u8; 16] = *b"0123456789abcdef";
const OTHER_ID: [u8; 16] = *b"fedcba9876543210";
const FREQ: &str = "expert_freq.bin";

fn freq_path(dir: &Path) -> PathBuf {
    dir.join(FREQ)
}

/// Opens the histogram of a 4 × 8 vault in `dir` with the default path.
fn open4x8(dir: &Path) -> (Histogram, Vec<String>) {
    Histogram::open(dir, VAULT_ID, 4, 8, None)
}

fn assert_ignored(outcome: &LoadOutcome, path: &Path, needle: &str) {
    match outcome {
        LoadOutcome::Ignored(reason) => {
            assert!(
                reason.contains(&path.display().to_string()),
                "reason does not name the file: {reason}"
            );
            assert!(reason.contains(needle), "reason lacks {needle:?}: {reason}");
        }
        other => panic!("expected Ignored({needle}), got {other:?}"),
    }
}

#[test]
fn round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let path = freq_path(dir.path());
    let counts: Vec<u64> = (0..32u64).map(|i| i * 1_000_003 + (i << 40)).collect();
    save(&path, &VAULT_ID, 4, 8, &counts).unwrap();
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        file_bytes(4, 8).unwrap()
    );
    assert_eq!(
        std::fs::read(&path).unwrap(),
        encode(&VAULT_ID, 4, 8, &counts).unwrap()
    );
    assert_eq!(load(&path, &VAULT_ID, 4, 8), LoadOutcome::Loaded(counts));
    // No temporary file is left behind by a successful save.
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, vec![FREQ.to_string()]);
}

#[test]
fn save_into_a_missing_directory_carries_the_path_and_errno() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("gone");
    let err = save(&freq_path(&missing), &VAULT_ID, 4, 8, &[0; 32]).unwrap_err();
    assert_eq!(err.kind(), smoe::ErrorKind::Io, "{err}");
    assert_eq!(err.os_error(), Some(libc::ENOENT));
    // The temporary file next to the target is the one that failed.
    let tmp = err.path().expect("an I/O error names its file");
    assert_eq!(tmp.parent(), Some(missing.as_path()));
    let name = tmp.file_name().unwrap().to_str().unwrap();
    assert!(is_temp_file_name(name, FREQ), "{name}");
}

#[test]
fn counts_accumulate_across_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let (h, warnings) = open4x8(dir.path());
    assert_eq!(h.freq_ignored(), 0, "a missing file is not an ignored file");
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("no histogram yet"), "{warnings:?}");
    assert_eq!(
        h.persistence(),
        &Persistence::Enabled(freq_path(dir.path()))
    );
    h.bump(3);
    h.bump(3);
    h.bump(31);
    h.persist().unwrap();
    drop(h);

    let (h, warnings) = open4x8(dir.path());
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!((h.get(3), h.get(31), h.get(0)), (2, 1, 0));
    h.bump(3);
    h.bump(0);
    h.bump(0);
    h.bump(0);
    h.persist().unwrap();
    // A second persist in the same session saves the same sum, not double.
    h.persist().unwrap();
    drop(h);

    let (h, _) = open4x8(dir.path());
    assert_eq!((h.get(3), h.get(31), h.get(0)), (3, 1, 3));
    assert_eq!(h.hottest_first(), vec![0, 3, 31]);
    assert_eq!(h.snapshot().iter().sum::<u64>(), 7);
}

/// Writes `bytes` as the histogram file of a fresh vault directory and
/// checks that `load` ignores it, naming the file and `needle`.
fn ignored_file(bytes: &[u8], needle: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = freq_path(dir.path());
    std::fs::write(&path, bytes).unwrap();
    assert_ignored(&load(&path, &VAULT_ID, 4, 8), &path, needle);
    (dir, path)
}

/// Writes `bytes` as the histogram file, opens the vault's histogram and
/// checks that the file was ignored for the expected reason with counts at
/// 0. The file is this vault's, damaged, so persisting replaces it.
fn check_bad_file(bytes: &[u8], needle: &str) {
    let (dir, path) = ignored_file(bytes, needle);
    let (h, warnings) = open4x8(dir.path());
    assert_eq!(h.freq_ignored(), 1);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains(needle), "{warnings:?}");
    assert_eq!(h.warnings(), &warnings[..]);
    assert!(h.snapshot().iter().all(|&c| c == 0));
    assert!(h.hottest_first().is_empty());
    // Persisting replaces the bad file with a good one.
    h.bump(5);
    h.persist().unwrap();
    let LoadOutcome::Loaded(counts) = load(&path, &VAULT_ID, 4, 8) else {
        panic!("the persisted file does not load");
    };
    assert_eq!(counts.iter().sum::<u64>(), 1);
}

/// Writes `bytes` as the histogram file and checks that it is not taken
/// for this vault's histogram: `load` ignores it for the expected reason,
/// and `open` protects it (counted as ignored, one warning naming the
/// reason), so persisting writes nothing and leaves it as it was.
fn check_foreign_file(bytes: &[u8], needle: &str) {
    let (dir, path) = ignored_file(bytes, needle);
    let (h, warnings) = open4x8(dir.path());
    assert!(
        matches!(h.persistence(), Persistence::Protected(p, _) if *p == path),
        "{:?}",
        h.persistence()
    );
    assert_eq!(h.freq_ignored(), 1);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains(needle), "{warnings:?}");
    assert!(
        warnings[0].contains(&path.display().to_string()),
        "{warnings:?}"
    );
    assert!(h.snapshot().iter().all(|&c| c == 0));
    h.bump(5);
    h.persist().unwrap();
    assert!(
        std::fs::read(&path).unwrap() == bytes,
        "the file was replaced"
    );
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

fn good_bytes() -> Vec<u8> {
    encode(&VAULT_ID, 4, 8, &(1..=32).collect::<Vec<u64>>()).unwrap()
}

#[test]
fn flipped_count_byte_fails_the_checksum() {
    let mut bytes = good_bytes();
    bytes[40 + 8 * 17 + 2] ^= 0x10;
    check_bad_file(&bytes, "checksum mismatch");
}

#[test]
fn flipped_checksum_byte_fails_the_checksum() {
    let mut bytes = good_bytes();
    let n = bytes.len();
    bytes[n - 1] ^= 1;
    check_bad_file(&bytes, "checksum mismatch");
}

#[test]
fn truncated_file_is_ignored() {
    let bytes = good_bytes();
    check_bad_file(&bytes[..bytes.len() - 1], "truncated");
    check_bad_file(&bytes[..100], "truncated");
    check_bad_file(&bytes[..20], "truncated");
    check_bad_file(&bytes[..3], "truncated");
}

#[test]
fn trailing_bytes_are_ignored() {
    let mut bytes = good_bytes();
    bytes.push(0);
    check_bad_file(&bytes, "too long");
}

#[test]
fn foreign_vault_id_is_protected() {
    let bytes = encode(&OTHER_ID, 4, 8, &[9; 32]).unwrap();
    let needle = format!(
        "vault_id is {}, this vault is {}",
        smoe::vault::hex(&OTHER_ID),
        smoe::vault::hex(&VAULT_ID)
    );
    check_foreign_file(&bytes, &needle);
}

#[test]
fn other_shape_is_protected() {
    // Another length: the header says why.
    let bytes = encode(&VAULT_ID, 4, 9, &[1; 36]).unwrap();
    check_foreign_file(&bytes, "shape is 4 layers × 9 experts, this vault is 4 × 8");
    // The same length (8 × 4 = 4 × 8 ids), another shape.
    let bytes = encode(&VAULT_ID, 8, 4, &[1; 32]).unwrap();
    check_foreign_file(&bytes, "shape is 8 layers × 4 experts, this vault is 4 × 8");
}

#[test]
fn wrong_magic_is_protected() {
    let mut bytes = good_bytes();
    bytes[0..8].copy_from_slice(b"SMOEVALT");
    check_foreign_file(&bytes, "not a histogram file");
}

#[test]
fn wrong_version_is_protected() {
    let mut bytes = good_bytes();
    bytes[8] = 2;
    check_foreign_file(&bytes, "version 2");
}

#[test]
fn nonzero_reserved_is_ignored() {
    let mut bytes = good_bytes();
    bytes[20] = 1;
    // Recompute the checksum so only the reserved rule is broken.
    let n = bytes.len();
    let sum = xxhash_rust::xxh3::xxh3_64(&bytes[..n - 8]);
    bytes[n - 8..].copy_from_slice(&sum.to_le_bytes());
    check_bad_file(&bytes, "reserved field is 1");
}

#[test]
fn empty_file_is_ignored() {
    check_bad_file(&[], "is empty");
}

#[test]
fn directory_in_place_of_the_file_is_protected() {
    let dir = tempfile::tempdir().unwrap();
    let path = freq_path(dir.path());
    std::fs::create_dir(&path).unwrap();
    assert_ignored(&load(&path, &VAULT_ID, 4, 8), &path, "is a directory");
    let (h, warnings) = open4x8(dir.path());
    assert_eq!(h.freq_ignored(), 1);
    assert!(warnings[0].contains("is a directory"), "{warnings:?}");
    assert!(matches!(h.persistence(), Persistence::Protected(..)));
    // Nothing is written: no temporary file, the directory stays.
    h.persist().unwrap();
    assert!(path.is_dir());
    let leftovers = std::fs::read_dir(dir.path()).unwrap().count();
    assert_eq!(leftovers, 1, "only the directory remains");
}

#[test]
fn empty_freq_path_disables_persistence() {
    let dir = tempfile::tempdir().unwrap();
    // Even a valid file is not read when the host asked for no file.
    save(&freq_path(dir.path()), &VAULT_ID, 4, 8, &[5; 32]).unwrap();
    let before = std::fs::read(freq_path(dir.path())).unwrap();
    let (h, warnings) = Histogram::open(dir.path(), VAULT_ID, 4, 8, Some(Path::new("")));
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(h.persistence(), &Persistence::Off);
    assert_eq!(h.get(0), 0);
    h.bump(0);
    h.persist().unwrap();
    assert_eq!(std::fs::read(freq_path(dir.path())).unwrap(), before);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

#[test]
fn explicit_freq_path_is_used() {
    let vault = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let path = elsewhere.path().join("counts.bin");
    let (h, _) = Histogram::open(vault.path(), VAULT_ID, 4, 8, Some(&path));
    h.bump(7);
    h.persist().unwrap();
    assert!(matches!(load(&path, &VAULT_ID, 4, 8), LoadOutcome::Loaded(c) if c[7] == 1));
    assert_eq!(std::fs::read_dir(vault.path()).unwrap().count(), 0);
}

/// The read-only check, run in whichever process cannot write `dir`.
fn check_read_only(dir: &Path) {
    let path = freq_path(dir);
    let before = std::fs::read(&path).unwrap();
    let (h, warnings) = open4x8(dir);
    assert!(
        matches!(h.persistence(), Persistence::ReadOnly(p, _) if *p == path),
        "{:?}",
        h.persistence()
    );
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("not writable"), "{warnings:?}");
    assert!(
        warnings[0].contains(&path.display().to_string()),
        "{warnings:?}"
    );
    // The existing file is still read.
    assert_eq!(h.get(2), 42);
    h.bump(2);
    h.persist().unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), before);
    assert_eq!(std::fs::read_dir(dir).unwrap().count(), 1);
}

const RO_CHILD_ENV: &str = "SMOE_TEST_FREQ_READONLY_DIR";
const RO_CHILD_OK: &str = "SMOE_READONLY_CHILD_OK";

/// Child mode of `read_only_directory_disables_persistence`: does nothing
/// unless the parent set the environment variable.
#[test]
fn read_only_child() {
    if let Some(dir) = std::env::var_os(RO_CHILD_ENV) {
        check_read_only(Path::new(&dir));
        println!("{RO_CHILD_OK}");
    }
}

/// A directory mode 0555. Root ignores directory permissions, so when the
/// tests run as root (CI) the check runs in a child process re-executed as
/// uid/gid 65534 (nobody), for which the mode is real; otherwise it runs
/// here. Either way the probe meets a genuine EACCES, not a simulated one.
#[test]
fn read_only_directory_disables_persistence() {
    let dir = tempfile::tempdir().unwrap();
    let mut counts = vec![0u64; 32];
    counts[2] = 42;
    save(&freq_path(dir.path()), &VAULT_ID, 4, 8, &counts).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o555)).unwrap();
    let restore =
        || std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();

    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        check_read_only(dir.path());
        restore();
        return;
    }
    let output = Command::new(std::env::current_exe().unwrap())
        .args([
            "popularity::read_only_child",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(RO_CHILD_ENV, dir.path())
        .uid(65534)
        .gid(65534)
        .output()
        .expect("re-executing the test binary as uid 65534");
    restore();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.contains(RO_CHILD_OK),
        "child as uid 65534 failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
}

// ---- crash safety ----------------------------------------------------------

const CRASH_CHILD_ENV: &str = "SMOE_TEST_FREQ_CRASH_FILE";
/// 256 × 512 ids: a 1 MiB file, so a save (write + fsync) takes a while.
const CRASH_LAYERS: u32 = 256;
const CRASH_EXPERTS: u32 = 512;

/// Pattern `which` (0 = A, 1 = B): distinct at every index, so a file mixing
/// the two (or either with zeros) is recognised even if it had a valid
/// checksum.
fn crash_pattern(which: u64) -> Vec<u64> {
    let ids = u64::from(CRASH_LAYERS) * u64::from(CRASH_EXPERTS);
    (0..ids)
        .map(|i| (0xA000_0000_0000_0000 + (which << 56)) | i)
        .collect()
}

/// Child mode of `crash_leaves_old_or_new_file`: saves patterns A and B in
/// turn until it is killed. Does nothing unless the parent set the variable.
#[test]
fn crash_writer_child() {
    let Some(path) = std::env::var_os(CRASH_CHILD_ENV) else {
        return;
    };
    let path = PathBuf::from(path);
    let patterns = [crash_pattern(0), crash_pattern(1)];
    println!("writing");
    for n in 0usize.. {
        save(
            &path,
            &VAULT_ID,
            CRASH_LAYERS,
            CRASH_EXPERTS,
            &patterns[n % 2],
        )
        .unwrap();
    }
}

/// Small, seedable, good enough for delays.
fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

#[test]
fn crash_leaves_old_or_new_file() {
    const ITERATIONS: usize = 120;
    let dir = tempfile::tempdir().unwrap();
    let path = freq_path(dir.path());
    let patterns = [crash_pattern(0), crash_pattern(1)];
    save(&path, &VAULT_ID, CRASH_LAYERS, CRASH_EXPERTS, &patterns[0]).unwrap();

    // Measure one save so the kill delays span a few of them.
    let start = Instant::now();
    save(&path, &VAULT_ID, CRASH_LAYERS, CRASH_EXPERTS, &patterns[0]).unwrap();
    let save_time = start.elapsed().max(Duration::from_micros(200));
    let mut max_delay_us = (save_time.as_micros() as u64 * 3).clamp(1_000, 200_000);

    let mut seed = 0x9E37_79B9_7F4A_7C15u64
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut seen = [0usize; 2];
    let mut iterations = 0;
    let mut last = 0usize;
    let mut changes = 0;
    while iterations < ITERATIONS && Instant::now() < deadline {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "popularity::crash_writer_child",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CRASH_CHILD_ENV, &path)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // Wait until the child is in its write loop, then kill it at a
        // random point of it.
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        loop {
            match lines.next() {
                Some(Ok(line)) if line.contains("writing") => break,
                Some(Ok(_)) => {}
                other => panic!("writer child ended before writing: {other:?}"),
            }
        }
        // A save in the child can take far longer than the one timed here (its
        // fsync on a busy machine): while no save has completed, every tenth
        // kill doubles the delays' range, up to half a second.
        if changes == 0 && iterations > 0 && iterations % 10 == 0 {
            max_delay_us = (max_delay_us * 2).min(500_000);
        }
        std::thread::sleep(Duration::from_micros(xorshift(&mut seed) % max_delay_us));
        child.kill().unwrap(); // SIGKILL on Unix
        child.wait().unwrap();
        iterations += 1;

        match load(&path, &VAULT_ID, CRASH_LAYERS, CRASH_EXPERTS) {
            LoadOutcome::Loaded(counts) => {
                let which = patterns
                    .iter()
                    .position(|p| *p == counts)
                    .unwrap_or_else(|| panic!("iteration {iterations}: a mix of A and B"));
                seen[which] += 1;
                if which != last {
                    changes += 1;
                    last = which;
                }
            }
            other => panic!("iteration {iterations}: the file does not load: {other:?}"),
        }
    }

    let entries: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    let temps = entries
        .iter()
        .filter(|n| is_temp_file_name(n, FREQ))
        .count();
    assert_eq!(
        temps + 1,
        entries.len(),
        "only the file and temporary files: {entries:?}"
    );
    // The test is not vacuous: the writer got through saves, and kills
    // landed while a temporary file existed (between create and rename).
    assert!(iterations >= 20, "only {iterations} iterations in time");
    assert!(changes > 0, "the writer never completed a save: {seen:?}");
    assert!(temps > 0, "no kill landed inside a save");
    // The leftovers do not disturb the next open.
    let (h, warnings) = Histogram::open(dir.path(), VAULT_ID, CRASH_LAYERS, CRASH_EXPERTS, None);
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(h.freq_ignored(), 0);
    eprintln!(
        "crash test: {iterations} kills, A {} B {}, {changes} changes, {temps} temp files left, \
     save ≈ {save_time:?}, delays < {max_delay_us} us",
        seen[0], seen[1]
    );
}
