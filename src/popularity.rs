//! The claim histogram and its file, `expert_freq.bin` (SPEC §1.3, §2).
//!
//! This module owns:
//! - [`Histogram`]: one claim counter per dense expert id
//!   (`id = layer × n_experts + expert`), bumped on every OK claim, ranked by
//!   [`Histogram::hottest_first`] for the pre-warm thread;
//! - the file format: [`encode`], [`load`] and the atomic [`save`];
//! - the persistence policy ([`Persistence`]): where the file lives, or why
//!   it is not written.
//!
//! What it must never do:
//! - put a lock or a shared counter on the claim path: [`Histogram::bump`] is
//!   one `Relaxed` `fetch_add` on that expert's own counter;
//! - fail `smoe_open`: a missing, damaged or foreign file, or a read-only
//!   directory, becomes a warning and counts that start at zero;
//! - trust the file: its expected length is known from the vault's shape and
//!   is compared before anything is read or allocated, and every field is
//!   checked against the vault's;
//! - leave a mix of two files: [`save`] writes a temporary file in the same
//!   directory, fsyncs it, renames it over the target and fsyncs the
//!   directory, so a crash at any moment leaves the old file or the new one.
//!
//! Counters are dense, eight to a cache line, not padded one to a line:
//! padding would cost 64 bytes per expert id (0.8 MB for 94 × 128, 1 GiB at
//! the vault's limit of 2^24 ids), and a claim already does a compare-exchange
//! on its slot's state word, so two threads bumping neighbouring experts add
//! little to a line that is contended anyway.

use std::fs::{File, OpenOptions};
use std::io::{ErrorKind as IoErrorKind, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use xxhash_rust::xxh3::xxh3_64;

use crate::error::{Error, Result};
use crate::vault::{hex, FREQ_FILE, MAX_EXPERT_IDS};

/// The file's magic bytes.
pub const FREQ_MAGIC: [u8; 8] = *b"SMOEFREQ";
/// The only file version this library reads and writes.
pub const FREQ_VERSION: u32 = 1;
/// Bytes before the counts: magic, version, n_layers, n_experts, reserved,
/// vault_id.
pub const FREQ_HEADER_BYTES: usize = 40;

/// Prefix of the temporary files [`save`] writes next to the target:
/// `.<file name>.tmp-<pid>-<n>`.
const TMP_MARKER: &str = ".tmp-";

/// The exact length of a histogram file for `n_layers × n_experts` ids, or
/// `None` when it would not fit in a `u64`.
pub fn file_bytes(n_layers: u32, n_experts: u32) -> Option<u64> {
    let ids = u64::from(n_layers) * u64::from(n_experts);
    ids.checked_mul(8)?
        .checked_add(FREQ_HEADER_BYTES as u64 + 8)
}

/// The bytes of a histogram file (SPEC §1.3). `counts` must hold
/// `n_layers × n_experts` values.
pub fn encode(
    vault_id: &[u8; 16],
    n_layers: u32,
    n_experts: u32,
    counts: &[u64],
) -> Result<Vec<u8>> {
    let expected = u64::from(n_layers) * u64::from(n_experts);
    if counts.len() as u64 != expected {
        return Err(Error::argument(format!(
            "histogram of {} counts does not match the shape {n_layers} layers × {n_experts} experts",
            counts.len()
        )));
    }
    let total = file_bytes(n_layers, n_experts)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| Error::argument("histogram shape too large"))?;
    let mut bytes = Vec::with_capacity(total);
    bytes.extend_from_slice(&FREQ_MAGIC);
    bytes.extend_from_slice(&FREQ_VERSION.to_le_bytes());
    bytes.extend_from_slice(&n_layers.to_le_bytes());
    bytes.extend_from_slice(&n_experts.to_le_bytes());
    bytes.extend_from_slice(&0u32.to_le_bytes());
    bytes.extend_from_slice(vault_id);
    for count in counts {
        bytes.extend_from_slice(&count.to_le_bytes());
    }
    let checksum = xxh3_64(&bytes);
    bytes.extend_from_slice(&checksum.to_le_bytes());
    debug_assert_eq!(bytes.len(), total);
    Ok(bytes)
}

/// What [`load`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LoadOutcome {
    /// The file is valid for this vault: its `n_layers × n_experts` counts.
    Loaded(Vec<u64>),
    /// There is no file (the vault's first session, or it was deleted).
    /// Counts start at zero; the string is the warning to record.
    Missing(String),
    /// The file exists but cannot be used (truncated, foreign, another
    /// shape, bad checksum, unreadable, ...). Counts start at zero; the
    /// string names the file and what was wrong.
    Ignored(String),
}

impl LoadOutcome {
    /// The warning to record, unless the file was loaded.
    pub fn reason(&self) -> Option<&str> {
        match self {
            LoadOutcome::Loaded(_) => None,
            LoadOutcome::Missing(reason) | LoadOutcome::Ignored(reason) => Some(reason),
        }
    }
}

/// Reads the histogram at `path` for a vault with this id and shape. Never
/// fails and never panics: anything wrong with the file is an
/// [`LoadOutcome::Ignored`] whose reason names the file and the problem.
pub fn load(path: &Path, vault_id: &[u8; 16], n_layers: u32, n_experts: u32) -> LoadOutcome {
    let ignored = |what: String| {
        LoadOutcome::Ignored(format!(
            "{}: {what}; ignoring it (counts start at zero)",
            path.display()
        ))
    };
    let Some(expected_bytes) = file_bytes(n_layers, n_experts) else {
        return ignored(format!(
            "the vault's shape {n_layers} × {n_experts} is too large for a histogram"
        ));
    };
    let mut file = match File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == IoErrorKind::NotFound => {
            return LoadOutcome::Missing(format!(
                "{}: no histogram yet; counts start at zero",
                path.display()
            ))
        }
        Err(e) => return ignored(format!("cannot open it: {e}")),
    };
    let metadata = match file.metadata() {
        Ok(m) => m,
        Err(e) => return ignored(format!("cannot stat it: {e}")),
    };
    if metadata.is_dir() {
        return ignored("is a directory, not a histogram file".into());
    }
    if !metadata.is_file() {
        return ignored("is not a regular file".into());
    }
    let actual_bytes = metadata.len();
    if actual_bytes == 0 {
        return ignored("is empty".into());
    }

    // The header is at most 40 bytes whatever the file's length, so it can
    // be read to say *why* a file of the wrong length is wrong.
    let head_len = actual_bytes.min(FREQ_HEADER_BYTES as u64) as usize;
    let mut head = [0u8; FREQ_HEADER_BYTES];
    if let Err(e) = file.read_exact(&mut head[..head_len]) {
        return ignored(format!("cannot read its header: {e}"));
    }
    let head = &head[..head_len];
    let magic_len = head_len.min(FREQ_MAGIC.len());
    if head[..magic_len] != FREQ_MAGIC[..magic_len] {
        return ignored(format!(
            "not a histogram file (magic {:?}, expected \"SMOEFREQ\")",
            String::from_utf8_lossy(&head[..magic_len])
        ));
    }
    if head_len < FREQ_HEADER_BYTES {
        return ignored(format!(
            "truncated: {actual_bytes} bytes, shorter than the {FREQ_HEADER_BYTES}-byte header"
        ));
    }
    let version = le_u32(head, 8);
    if version != FREQ_VERSION {
        return ignored(format!(
            "version {version}, this library reads {FREQ_VERSION}"
        ));
    }
    let file_layers = le_u32(head, 12);
    let file_experts = le_u32(head, 16);
    let reserved = le_u32(head, 20);
    let mut file_id = [0u8; 16];
    file_id.copy_from_slice(&head[24..40]);

    if actual_bytes != expected_bytes {
        // Nothing past the header is trusted or read; say the most specific
        // thing the header allows.
        if file_id != *vault_id {
            return ignored(foreign(&file_id, vault_id));
        }
        if (file_layers, file_experts) != (n_layers, n_experts) {
            return ignored(other_shape(file_layers, file_experts, n_layers, n_experts));
        }
        let what = if actual_bytes < expected_bytes {
            "truncated"
        } else {
            "too long"
        };
        return ignored(format!(
            "{what}: {actual_bytes} bytes, expected {expected_bytes} for {n_layers} × {n_experts}"
        ));
    }

    // The length is the one the vault's shape gives, so this allocation is
    // bounded by the vault, not by the file.
    let Ok(len) = usize::try_from(expected_bytes) else {
        return ignored("too large to read on this platform".into());
    };
    let mut bytes = vec![0u8; len];
    bytes[..FREQ_HEADER_BYTES].copy_from_slice(head);
    if let Err(e) = file.read_exact(&mut bytes[FREQ_HEADER_BYTES..]) {
        return ignored(format!("cannot read it: {e}"));
    }
    let (body, tail) = bytes.split_at(len - 8);
    let stored = u64::from_le_bytes(tail.try_into().expect("8-byte tail"));
    let computed = xxh3_64(body);
    if stored != computed {
        return ignored(format!(
            "checksum mismatch (stored xxh3 {stored:016x}, computed {computed:016x})"
        ));
    }
    if file_id != *vault_id {
        return ignored(foreign(&file_id, vault_id));
    }
    if (file_layers, file_experts) != (n_layers, n_experts) {
        return ignored(other_shape(file_layers, file_experts, n_layers, n_experts));
    }
    if reserved != 0 {
        return ignored(format!("reserved field is {reserved}, expected 0"));
    }
    let counts = body[FREQ_HEADER_BYTES..]
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8-byte chunk")))
        .collect();
    LoadOutcome::Loaded(counts)
}

fn foreign(file_id: &[u8; 16], vault_id: &[u8; 16]) -> String {
    format!(
        "vault_id is {}, this vault is {}",
        hex(file_id),
        hex(vault_id)
    )
}

fn other_shape(file_layers: u32, file_experts: u32, n_layers: u32, n_experts: u32) -> String {
    format!(
        "shape is {file_layers} layers × {file_experts} experts, this vault is {n_layers} × {n_experts}"
    )
}

fn le_u32(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

/// Writes the histogram to `path` atomically: a temporary file in the same
/// directory, fsync, rename over `path`, fsync the directory. On failure the
/// temporary file is removed and `path` is left as it was.
pub fn save(
    path: &Path,
    vault_id: &[u8; 16],
    n_layers: u32,
    n_experts: u32,
    counts: &[u64],
) -> Result<()> {
    let bytes = encode(vault_id, n_layers, n_experts, counts)?;
    let (tmp_path, mut file) = create_temp(path)?;
    let written = file
        .write_all(&bytes)
        .and_then(|()| file.sync_all())
        .map_err(|e| Error::io("cannot write", &tmp_path, &e));
    drop(file);
    let renamed = written.and_then(|()| {
        std::fs::rename(&tmp_path, path).map_err(|e| {
            Error::io(
                format_args!("cannot rename {} to", tmp_path.display()),
                path,
                &e,
            )
        })
    });
    if let Err(e) = renamed {
        let _ = std::fs::remove_file(&tmp_path);
        return Err(e);
    }
    sync_dir(&parent_dir(path))
}

/// Creates a fresh temporary file next to `path` with `O_EXCL`, retrying
/// past stale names (a dead process whose pid was reused).
fn create_temp(path: &Path) -> Result<(PathBuf, File)> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| FREQ_FILE.to_string());
    let dir = parent_dir(path);
    let pid = std::process::id();
    let mut last_error = None;
    for _ in 0..16 {
        // Relaxed: the counter only has to hand out distinct numbers.
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let tmp_path = dir.join(format!(".{name}{TMP_MARKER}{pid}-{n}"));
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp_path)
        {
            Ok(file) => return Ok((tmp_path, file)),
            Err(e) if e.kind() == IoErrorKind::AlreadyExists => last_error = Some((tmp_path, e)),
            Err(e) => return Err(Error::io("cannot create temporary file", &tmp_path, &e)),
        }
    }
    let (tmp_path, e) = last_error.expect("the loop ran");
    Err(Error::io("cannot create temporary file", &tmp_path, &e))
}

/// Whether `file_name` is one of [`save`]'s temporary files for `target`.
pub fn is_temp_file_name(file_name: &str, target: &str) -> bool {
    file_name
        .strip_prefix('.')
        .and_then(|rest| rest.strip_prefix(target))
        .is_some_and(|rest| rest.starts_with(TMP_MARKER))
}

fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Makes a rename in `dir` durable. Filesystems that cannot fsync a
/// directory (EINVAL) are not an error: there is nothing more to do there.
fn sync_dir(dir: &Path) -> Result<()> {
    let synced = File::open(dir).and_then(|d| d.sync_all());
    match synced {
        Ok(()) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(()),
        Err(e) => Err(Error::io("cannot fsync directory", dir, &e)),
    }
}

/// Where the histogram is kept, or why it is not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Persistence {
    /// Loaded from and saved to this file.
    Enabled(PathBuf),
    /// The host asked for no file (`freq_path = ""`): nothing is read or
    /// written.
    Off,
    /// The file is read if present but never written: its directory is not
    /// writable. The string is the warning.
    ReadOnly(PathBuf, String),
}

impl Persistence {
    /// Decides from the config's `freq_path` (`None` = `<vault_dir>/expert_freq.bin`,
    /// empty = off) and probes the directory by creating and removing one of
    /// [`save`]'s temporary files: that is the operation `save` needs, and,
    /// unlike `access(W_OK)`, it gives the true answer for root, read-only
    /// mounts and network filesystems.
    pub fn decide(vault_dir: &Path, freq_path: Option<&Path>) -> Persistence {
        let path = match freq_path {
            Some(p) if p.as_os_str().is_empty() => return Persistence::Off,
            Some(p) => p.to_path_buf(),
            None => vault_dir.join(FREQ_FILE),
        };
        match create_temp(&path) {
            Ok((tmp_path, file)) => {
                drop(file);
                let _ = std::fs::remove_file(&tmp_path);
                Persistence::Enabled(path)
            }
            Err(e) => {
                let warning = format!(
                    "{}: directory is not writable ({e}); the histogram will not be saved",
                    path.display()
                );
                Persistence::ReadOnly(path, warning)
            }
        }
    }

    /// The file that is read at open, if any.
    pub fn read_path(&self) -> Option<&Path> {
        match self {
            Persistence::Enabled(p) | Persistence::ReadOnly(p, _) => Some(p),
            Persistence::Off => None,
        }
    }

    /// The file that [`Histogram::persist`] writes, if any.
    pub fn write_path(&self) -> Option<&Path> {
        match self {
            Persistence::Enabled(p) => Some(p),
            Persistence::Off | Persistence::ReadOnly(..) => None,
        }
    }
}

/// Per-(layer, expert) claim counts: the counts loaded from earlier sessions
/// plus this session's claims.
#[derive(Debug)]
pub struct Histogram {
    n_layers: u32,
    n_experts: u32,
    vault_id: [u8; 16],
    /// One counter per dense id; only ever increased (by `bump`) after open.
    counts: Box<[AtomicU64]>,
    persistence: Persistence,
    /// Histogram files that existed but were ignored (0 or 1).
    freq_ignored: u64,
    /// Warnings recorded at open, in order.
    warnings: Vec<String>,
    /// Serialises `persist` so a later snapshot is never overwritten by an
    /// earlier one. Never taken on the claim path.
    persist_lock: Mutex<()>,
}

impl Histogram {
    /// An in-memory histogram of zeros that is never saved. A shape of more
    /// than [`MAX_EXPERT_IDS`] ids counts nothing.
    pub fn in_memory(vault_id: [u8; 16], n_layers: u32, n_experts: u32) -> Histogram {
        Self::with_counts(vault_id, n_layers, n_experts, None, Persistence::Off)
    }

    fn with_counts(
        vault_id: [u8; 16],
        n_layers: u32,
        n_experts: u32,
        initial: Option<Vec<u64>>,
        persistence: Persistence,
    ) -> Histogram {
        // A shape beyond the vault format's limit counts nothing rather than
        // allocating for it (`open` has already warned).
        let ids = u64::from(n_layers) * u64::from(n_experts);
        let ids = if ids > MAX_EXPERT_IDS {
            0
        } else {
            ids as usize
        };
        let counts = match initial {
            Some(c) if c.len() == ids => c.into_iter().map(AtomicU64::new).collect(),
            _ => (0..ids).map(|_| AtomicU64::new(0)).collect(),
        };
        Histogram {
            n_layers,
            n_experts,
            vault_id,
            counts,
            persistence,
            freq_ignored: 0,
            warnings: Vec::new(),
            persist_lock: Mutex::new(()),
        }
    }

    /// Opens the histogram of a vault: decides where it lives
    /// ([`Persistence::decide`]), loads the earlier sessions' counts, and
    /// returns it with the warnings to surface (also kept in
    /// [`warnings`](Self::warnings)). Never fails.
    pub fn open(
        vault_dir: &Path,
        vault_id: [u8; 16],
        n_layers: u32,
        n_experts: u32,
        freq_path: Option<&Path>,
    ) -> (Histogram, Vec<String>) {
        let mut warnings = Vec::new();
        let ids = u64::from(n_layers) * u64::from(n_experts);
        let persistence = if ids > MAX_EXPERT_IDS {
            warnings.push(format!(
                "histogram disabled: {n_layers} × {n_experts} exceeds {MAX_EXPERT_IDS} expert ids"
            ));
            Persistence::Off
        } else {
            Persistence::decide(vault_dir, freq_path)
        };
        if let Persistence::ReadOnly(_, warning) = &persistence {
            warnings.push(warning.clone());
        }
        let mut freq_ignored = 0;
        let initial = match persistence.read_path() {
            None => None,
            Some(path) => match load(path, &vault_id, n_layers, n_experts) {
                LoadOutcome::Loaded(counts) => Some(counts),
                LoadOutcome::Missing(reason) => {
                    warnings.push(reason);
                    None
                }
                LoadOutcome::Ignored(reason) => {
                    freq_ignored += 1;
                    warnings.push(reason);
                    None
                }
            },
        };
        let mut histogram = Self::with_counts(vault_id, n_layers, n_experts, initial, persistence);
        histogram.freq_ignored = freq_ignored;
        histogram.warnings = warnings.clone();
        (histogram, warnings)
    }

    /// Counts one claim of dense id `id`. One `Relaxed` add on that id's own
    /// counter: no lock, no shared counter. An id out of range is ignored
    /// (the streamer checks ids before claiming).
    #[inline]
    pub fn bump(&self, id: u32) {
        if let Some(counter) = self.counts.get(id as usize) {
            // Relaxed: a count publishes nothing; readers want a recent value.
            counter.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The count of dense id `id` (0 when out of range).
    pub fn get(&self, id: u32) -> u64 {
        self.counts
            .get(id as usize)
            .map_or(0, |c| c.load(Ordering::Relaxed))
    }

    /// Every count, by dense id. Each value is one the counter held during
    /// the call; counters bumped concurrently may be read at different times.
    pub fn snapshot(&self) -> Vec<u64> {
        self.counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect()
    }

    /// The sum of every count (earlier sessions' included).
    pub fn total(&self) -> u64 {
        self.counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .fold(0u64, u64::wrapping_add)
    }

    /// Dense ids with a count above zero, by count descending, ties by
    /// ascending id (that is, ascending (layer, expert)).
    pub fn hottest_first(&self) -> Vec<u32> {
        let mut hot: Vec<(u64, u32)> = self
            .snapshot()
            .into_iter()
            .enumerate()
            .filter(|&(_, count)| count > 0)
            .map(|(id, count)| (count, id as u32))
            .collect();
        hot.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        hot.into_iter().map(|(_, id)| id).collect()
    }

    /// Saves the counts (earlier sessions' plus this one's) if persistence is
    /// enabled; otherwise writes nothing and returns `Ok`. Called at close and
    /// by `smoe_flush_stats`; safe to call from several threads.
    pub fn persist(&self) -> Result<()> {
        let Some(path) = self.persistence.write_path() else {
            return Ok(());
        };
        let _guard = self
            .persist_lock
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        save(
            path,
            &self.vault_id,
            self.n_layers,
            self.n_experts,
            &self.snapshot(),
        )
    }

    /// Where the histogram is read and saved, or why it is not.
    pub fn persistence(&self) -> &Persistence {
        &self.persistence
    }

    /// Histogram files that existed but were ignored at open (0 or 1).
    pub fn freq_ignored(&self) -> u64 {
        self.freq_ignored
    }

    /// The warnings recorded at open.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Number of layers.
    pub fn n_layers(&self) -> u32 {
        self.n_layers
    }

    /// Experts per layer.
    pub fn n_experts(&self) -> u32 {
        self.n_experts
    }

    /// Number of dense ids counted.
    pub fn len(&self) -> usize {
        self.counts.len()
    }

    /// Whether the shape has no ids.
    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: [u8; 16] = [7; 16];

    #[test]
    fn encode_layout_matches_the_spec() {
        let bytes = encode(&ID, 2, 3, &[1, 2, 3, 4, 5, 6]).unwrap();
        assert_eq!(bytes.len() as u64, file_bytes(2, 3).unwrap());
        assert_eq!(&bytes[0..8], b"SMOEFREQ");
        assert_eq!(le_u32(&bytes, 8), 1);
        assert_eq!(le_u32(&bytes, 12), 2);
        assert_eq!(le_u32(&bytes, 16), 3);
        assert_eq!(le_u32(&bytes, 20), 0);
        assert_eq!(&bytes[24..40], &ID);
        assert_eq!(u64::from_le_bytes(bytes[40..48].try_into().unwrap()), 1);
        assert_eq!(u64::from_le_bytes(bytes[80..88].try_into().unwrap()), 6);
        let n = bytes.len();
        assert_eq!(
            u64::from_le_bytes(bytes[n - 8..].try_into().unwrap()),
            xxh3_64(&bytes[..n - 8])
        );
        assert!(encode(&ID, 2, 3, &[1]).is_err());
    }

    #[test]
    fn hottest_first_orders_by_count_then_id() {
        let h = Histogram::in_memory(ID, 2, 4);
        for (id, times) in [(5u32, 3), (1, 3), (6, 7), (2, 1)] {
            for _ in 0..times {
                h.bump(id);
            }
        }
        assert_eq!(h.hottest_first(), vec![6, 1, 5, 2]);
        assert_eq!(h.get(6), 7);
        assert_eq!(h.get(0), 0);
        h.bump(8); // out of range: ignored, no panic
        assert_eq!(h.get(8), 0);
        assert_eq!(h.snapshot().iter().sum::<u64>(), 14);
    }

    #[test]
    fn concurrent_bumps_all_count() {
        let h = Histogram::in_memory(ID, 4, 8);
        std::thread::scope(|s| {
            for t in 0..8u32 {
                let h = &h;
                s.spawn(move || {
                    for i in 0..10_000u32 {
                        h.bump((i + t) % 32);
                    }
                });
            }
        });
        assert_eq!(h.snapshot().iter().sum::<u64>(), 80_000);
    }

    #[test]
    fn temp_names_are_recognised() {
        assert!(is_temp_file_name(
            ".expert_freq.bin.tmp-12-0",
            "expert_freq.bin"
        ));
        assert!(!is_temp_file_name("expert_freq.bin", "expert_freq.bin"));
        assert!(!is_temp_file_name(
            ".expert_freq.binx.tmp-1",
            "expert_freq.bin"
        ));
    }

    #[test]
    fn oversize_shape_counts_nothing_and_never_fails() {
        let dir = tempfile::tempdir().unwrap();
        let (h, warnings) = Histogram::open(dir.path(), ID, 1 << 13, 1 << 12, None);
        assert_eq!(h.persistence(), &Persistence::Off);
        assert!(warnings[0].contains("exceeds"), "{warnings:?}");
        assert!(h.is_empty());
        h.bump(5);
        assert!(h.hottest_first().is_empty());
        h.persist().unwrap();
        let outcome = load(&dir.path().join(FREQ_FILE), &ID, u32::MAX, u32::MAX);
        assert!(
            outcome.reason().unwrap().contains("too large"),
            "{outcome:?}"
        );
    }

    #[test]
    fn off_reads_and_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (h, warnings) = Histogram::open(dir.path(), ID, 1, 2, Some(Path::new("")));
        assert!(warnings.is_empty());
        assert_eq!(h.persistence(), &Persistence::Off);
        h.bump(1);
        h.persist().unwrap();
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
