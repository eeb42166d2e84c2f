//! The claim histogram and its file, `expert_freq.bin` (docs/format.md §4).
//!
//! This module owns:
//! - [`Histogram`]: one claim counter per dense expert id
//!   (`id = layer × n_experts + expert`), bumped on every OK claim, ranked by
//!   [`Histogram::hottest_first`] for the pre-warm thread;
//! - the file format: [`encode`], [`load`] and the atomic [`save`];
//! - the persistence policy ([`Persistence`]): where the file lives, or why
//!   it is not written;
//! - the rule for which file it may replace: a missing file, or a regular
//!   file whose header (as far as the file goes) is a histogram of this
//!   vault, damaged or not. Anything else found at the path (another file, a
//!   histogram of another vault, a device, FIFO, socket or directory, the
//!   vault file or a link to it) is protected: persistence is off until
//!   close, with a warning naming the path and what it is. The check is
//!   repeated just before each rename, so a file placed there after open is
//!   not clobbered either;
//! - removing the temporary files a killed writer left next to the file
//!   ([`Histogram::open`]).
//!
//! The judging of a path, the atomic save and the cleanup are
//! [`crate::fs_safe`]'s, shared with trace capture and the packer; this
//! module supplies the histogram's own rule (its header) to them.
//!
//! What it must never do:
//! - put a lock or a shared counter on the claim path: [`Histogram::bump`] is
//!   one `Relaxed` `fetch_add` on that expert's own counter;
//! - fail `smoe_open`: a missing, damaged or foreign file, or a read-only
//!   directory, becomes a warning and counts that start at zero;
//! - replace, or even open, a file that is not its own: a FIFO would block
//!   the open forever, a device may act on being opened, and anything else
//!   is someone's data;
//! - trust the file: its expected length is known from the vault's shape and
//!   is compared before anything is read or allocated, and every field is
//!   checked against the vault's;
//! - leave a mix of two files: [`save`] writes a temporary file in the same
//!   directory, fsyncs it, renames it over the target and fsyncs the
//!   directory, so a crash at any moment leaves the old file or the new one.
//!
//! Counters (one per vault entry) are packed, eight to a cache line, not
//! padded one to a line: padding would cost 64 bytes per entry (0.8 MB for
//! 94 × 128, 64 MiB at the vault's limit of 2^20 ids), and a claim already does a compare-exchange
//! on its slot's state word, so two threads bumping neighbouring experts add
//! little to a line that is contended anyway.

use std::io::{ErrorKind as IoErrorKind, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use xxhash_rust::xxh3::xxh3_64;

use crate::error::{Error, ErrorKind, Result};
use crate::fs_safe::{
    examine_file, file_id, judge_target, remove_leftover_temp_files, save_checked, vault_file_key,
    FileId, Found, Target,
};
use crate::sys::{self, OpenRegularError};
use crate::vault::{hex, Vault, EXPERTS_FILE, FREQ_FILE, MAX_EXPERT_IDS};

/// The file's magic bytes.
pub const FREQ_MAGIC: [u8; 8] = *b"SMOEFREQ";
/// The only file version this library reads and writes.
pub const FREQ_VERSION: u32 = 1;
/// Bytes before the counts: magic, version, n_layers, n_experts, reserved,
/// vault_id.
pub const FREQ_HEADER_BYTES: usize = 40;

/// The exact length of a histogram file for `n_layers × n_experts` ids, or
/// `None` when it would not fit in a `u64`.
pub fn file_bytes(n_layers: u32, n_experts: u32) -> Option<u64> {
    let ids = u64::from(n_layers) * u64::from(n_experts);
    ids.checked_mul(8)?
        .checked_add(FREQ_HEADER_BYTES as u64 + 8)
}

/// The bytes of a histogram file (docs/format.md §4). `counts` must hold
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
    let (mut file, metadata) = match sys::open_regular(path) {
        Ok(opened) => opened,
        Err(OpenRegularError::Os(e)) if e.kind() == IoErrorKind::NotFound => {
            return LoadOutcome::Missing(format!(
                "{}: no histogram yet; counts start at zero",
                path.display()
            ))
        }
        Err(OpenRegularError::Os(e)) => return ignored(format!("cannot open it: {e}")),
        Err(OpenRegularError::NotRegular(kind)) => {
            return ignored(format!("is {kind}, not a histogram file"))
        }
    };
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
///
/// This replaces whatever is at `path`; [`Histogram::persist`] first checks
/// that it is the histogram's own file.
pub fn save(
    path: &Path,
    vault_id: &[u8; 16],
    n_layers: u32,
    n_experts: u32,
    counts: &[u64],
) -> Result<()> {
    let bytes = encode(vault_id, n_layers, n_experts, counts)?;
    save_checked(path, |file| file.write_all(&bytes), || Ok(())).map(|_| ())
}

/// Where the histogram is kept, or why it is not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Persistence {
    /// Loaded from and saved to this file. A symbolic link at the configured
    /// path is followed: this is the file it named at open (the link stays).
    Enabled(PathBuf),
    /// The host asked for no file (`freq_path = ""`): nothing is read or
    /// written.
    Off,
    /// The file is read if present but never written: its directory is not
    /// writable. The string is the warning.
    ReadOnly(PathBuf, String),
    /// Something that is not this vault's histogram is at the path (another
    /// file, a histogram of another vault, a device, FIFO, socket or
    /// directory, the vault file or a link to it). It is neither read nor
    /// written until close. The path is the configured one; the string is
    /// the warning, naming the path and what is there.
    Protected(PathBuf, String),
}

impl Persistence {
    /// Decides from the config's `freq_path` (`None` = `<vault_dir>/expert_freq.bin`,
    /// empty = off) what the histogram's file is and whether it may be
    /// written, and returns the identity of the file found there if it is
    /// ours. A symbolic link is followed (a dangling one is protected: saving
    /// would replace the link). Whatever exists at the path must be ours
    /// ([`VaultKey::examine`]) or it is protected. The directory is then
    /// probed by creating and removing one of [`save`]'s temporary files:
    /// that is the operation `save` needs, and, unlike `access(W_OK)`, it
    /// gives the true answer for root, read-only mounts and network
    /// filesystems.
    fn decide(
        key: &VaultKey,
        vault_dir: &Path,
        freq_path: Option<&Path>,
    ) -> (Persistence, Option<FileId>) {
        let requested = match freq_path {
            Some(p) if p.as_os_str().is_empty() => return (Persistence::Off, None),
            Some(p) => p.to_path_buf(),
            None => vault_dir.join(FREQ_FILE),
        };
        let protected = |what: &str| {
            let warning = format!(
                "{}: {what}; the library replaces only its own histogram file, so the histogram \
                 is neither read nor saved until close",
                requested.display()
            );
            (Persistence::Protected(requested.clone(), warning), None)
        };
        match judge_target(&requested, |path| key.examine(path)) {
            Target::Foreign(what) => protected(&what),
            Target::Writable { path, seen } => (Persistence::Enabled(path), seen),
            Target::ReadOnly { path, seen, error } => {
                let warning = format!(
                    "{}: directory is not writable ({error}); the histogram will not be saved",
                    path.display()
                );
                (Persistence::ReadOnly(path, warning), seen)
            }
        }
    }

    /// The file the histogram lives at, or would if it were not protected
    /// (`None` when off): a path no other file of the library may take.
    pub fn path(&self) -> Option<&Path> {
        match self {
            Persistence::Enabled(p)
            | Persistence::ReadOnly(p, _)
            | Persistence::Protected(p, _) => Some(p),
            Persistence::Off => None,
        }
    }

    /// The file that is read at open, if any.
    pub fn read_path(&self) -> Option<&Path> {
        match self {
            Persistence::Enabled(p) | Persistence::ReadOnly(p, _) => Some(p),
            Persistence::Off | Persistence::Protected(..) => None,
        }
    }

    /// The file that [`Histogram::persist`] writes, if any.
    pub fn write_path(&self) -> Option<&Path> {
        match self {
            Persistence::Enabled(p) => Some(p),
            Persistence::Off | Persistence::ReadOnly(..) | Persistence::Protected(..) => None,
        }
    }

    /// The warning this decision records at open, if any.
    fn warning(&self) -> Option<&str> {
        match self {
            Persistence::ReadOnly(_, w) | Persistence::Protected(_, w) => Some(w),
            Persistence::Enabled(_) | Persistence::Off => None,
        }
    }
}

/// What identifies the vault a histogram counts: what a file must show to
/// be its histogram, and the vault file it must never be.
#[derive(Clone, Debug)]
struct VaultKey {
    vault_id: [u8; 16],
    n_layers: u32,
    n_experts: u32,
    /// The vault's `experts.smoe` and its identity (followed through links),
    /// when it could be stat'ed.
    vault_file: Option<(PathBuf, FileId)>,
}

impl VaultKey {
    fn new(vault_id: [u8; 16], n_layers: u32, n_experts: u32, vault_file: &Path) -> VaultKey {
        let vault_file = vault_file_key(vault_file);
        VaultKey {
            vault_id,
            n_layers,
            n_experts,
            vault_file,
        }
    }

    /// Says whether the file at `path` (not following a final symbolic link)
    /// is one the library may replace: [`examine_file`] with this vault's
    /// histogram header as the judge.
    fn examine(&self, path: &Path) -> Found {
        examine_file(path, self.vault_file.as_ref(), FREQ_HEADER_BYTES, |head| {
            self.foreign_header(head)
        })
    }

    /// Why the first bytes of a file (at most [`FREQ_HEADER_BYTES`]) show it
    /// is not a histogram of this vault; `None` when, as far as they go, it
    /// is one. Each field is judged on the bytes of it the file has, so a
    /// file cut short inside the vault_id is still told apart by the part it
    /// keeps. Only the header is judged: a bad length or checksum is damage
    /// to our own file, which [`load`] ignores and [`save`] replaces (docs/format.md
    /// §4). An empty file holds nothing to lose and is ours too.
    fn foreign_header(&self, head: &[u8]) -> Option<String> {
        // Whether the bytes of `head` in `at..at + expected.len()` differ
        // from `expected` (false when the file ends before `at`).
        let differs = |at: usize, expected: &[u8]| {
            let end = head.len().min(at + expected.len());
            at < end && head[at..end] != expected[..end - at]
        };
        let whole = |at: usize, len: usize| head.len() >= at + len;
        if differs(0, &FREQ_MAGIC) {
            let shown = &head[..head.len().min(FREQ_MAGIC.len())];
            return Some(format!(
                "not a histogram file (magic {:?}, expected \"SMOEFREQ\")",
                String::from_utf8_lossy(shown)
            ));
        }
        if differs(8, &FREQ_VERSION.to_le_bytes()) {
            let version = if whole(8, 4) {
                le_u32(head, 8).to_string()
            } else {
                "other than 1".to_owned()
            };
            return Some(format!(
                "a histogram of version {version}; this library writes only version {FREQ_VERSION}"
            ));
        }
        if differs(24, &self.vault_id) {
            let what = if whole(24, 16) {
                let mut file_vault_id = [0u8; 16];
                file_vault_id.copy_from_slice(&head[24..40]);
                foreign(&file_vault_id, &self.vault_id)
            } else {
                format!(
                    "vault_id begins {}, this vault is {}",
                    hex(&head[24..]),
                    hex(&self.vault_id)
                )
            };
            return Some(format!("a histogram of another vault ({what})"));
        }
        if differs(12, &self.n_layers.to_le_bytes()) || differs(16, &self.n_experts.to_le_bytes()) {
            let what = if whole(12, 8) {
                other_shape(
                    le_u32(head, 12),
                    le_u32(head, 16),
                    self.n_layers,
                    self.n_experts,
                )
            } else {
                format!(
                    "another shape, this vault is {} × {}",
                    self.n_layers, self.n_experts
                )
            };
            return Some(format!("a histogram of another vault ({what})"));
        }
        None
    }

    /// The check [`Histogram::persist`] makes just before its rename: the
    /// file at `path` is still the one seen at open or saved last (`seen`;
    /// one `lstat`), or missing, or (another session's save renamed a new
    /// file there) still ours. Anything else put there since open is kept,
    /// and the save fails saying why. Running after the temporary file is
    /// written and synced, it leaves only the instant between this check and
    /// the `rename` open to a swap, instead of the whole session.
    fn check_before_replacing(&self, path: &Path, seen: Option<FileId>) -> Result<()> {
        if let (Some(seen), Ok(m)) = (seen, std::fs::symlink_metadata(path)) {
            if m.file_type().is_file() && file_id(&m) == seen {
                return Ok(());
            }
        }
        match self.examine(path) {
            Found::Nothing | Found::Ours(_) => Ok(()),
            Found::Foreign(what) => Err(Error::new(
                ErrorKind::Io,
                format!(
                    "{what} (put there after the histogram was opened); the library replaces \
                     only its own histogram file, so the histogram was not saved"
                ),
            )
            .with_path(path)),
        }
    }
}

/// Most memory the extra shards of one histogram may take; a vault with
/// more entries gets fewer shards (one, the base array, from 256 Ki entries
/// on).
const SHARD_BUDGET_BYTES: usize = 2 << 20;
/// Most shards (counting the base array): enough for 16 cores to claim
/// without sharing a counter line.
const MAX_SHARDS: usize = 16;

/// Shards for `n` counters: as many as fit [`SHARD_BUDGET_BYTES`], 1 to
/// [`MAX_SHARDS`].
fn shard_count(n: usize) -> usize {
    (SHARD_BUDGET_BYTES / (8 * n.max(1))).clamp(1, MAX_SHARDS)
}

/// Per-(layer, expert) claim counts: the counts loaded from earlier sessions
/// plus this session's claims.
#[derive(Debug)]
pub struct Histogram {
    /// The vault counted: its id and shape, and its file.
    key: VaultKey,
    /// The dense ids that have a counter, ascending: a vault's entries (the
    /// only experts a claim can name), or `None` for every id of the shape.
    /// Counting entries, not the id space, keeps memory and every walk over
    /// the counters (stats, pre-warm) proportional to the vault's experts;
    /// only the file (docs/format.md §4) is dense.
    counted: Option<Box<[u32]>>,
    /// Ids in the shape (0 above [`MAX_EXPERT_IDS`]).
    n_ids: usize,
    /// One counter per counted id; only ever increased (by `bump`) after
    /// open. It holds the earlier sessions' counts and the claims of the
    /// threads assigned to shard 0.
    counts: Box<[AtomicU64]>,
    /// More shards of this session's counts, laid out like `counts`, each
    /// bumped by the threads assigned to it (`crate::sync::thread_index`): claims of
    /// neighbouring experts on different threads then write different cache
    /// lines. A count is the sum over `counts` and every shard. Few or none
    /// for a large vault ([`SHARD_BUDGET_BYTES`]).
    shards: Box<[Box<[AtomicU64]>]>,
    persistence: Persistence,
    /// Histogram files that existed but were ignored or protected (0 or 1).
    freq_ignored: u64,
    /// Warnings recorded at open, in order.
    warnings: Vec<String>,
    /// The identity of the file at the write path when it was last seen to
    /// be ours (at open, or renamed there by the last save); `None` when it
    /// was missing. The mutex also serialises `persist`, so a later snapshot
    /// is never overwritten by an earlier one. Never taken on the claim path.
    persist_lock: Mutex<Option<FileId>>,
}

impl Histogram {
    /// An in-memory histogram of zeros that is never saved. A shape of more
    /// than [`MAX_EXPERT_IDS`] ids counts nothing.
    pub fn in_memory(vault_id: [u8; 16], n_layers: u32, n_experts: u32) -> Histogram {
        let key = VaultKey {
            vault_id,
            n_layers,
            n_experts,
            vault_file: None,
        };
        Self::with_counts(key, None, None, Persistence::Off, None)
    }

    fn with_counts(
        key: VaultKey,
        counted: Option<Box<[u32]>>,
        initial: Option<Vec<u64>>,
        persistence: Persistence,
        seen: Option<FileId>,
    ) -> Histogram {
        // A shape beyond the vault format's limit counts nothing rather than
        // allocating for it (`open` has already warned).
        let ids = u64::from(key.n_layers) * u64::from(key.n_experts);
        let n_ids = if ids > MAX_EXPERT_IDS {
            0
        } else {
            ids as usize
        };
        let counted = counted.map(|c| {
            let mut c = c.into_vec();
            c.retain(|&id| (id as usize) < n_ids);
            c.sort_unstable();
            c.dedup();
            c.into_boxed_slice()
        });
        // `initial` is by dense id (the file's order): keep the counted ids'.
        let initial_of = |id: usize| {
            initial
                .as_ref()
                .filter(|c| c.len() == n_ids)
                .map_or(0, |c| c[id])
        };
        let counts: Box<[AtomicU64]> = match &counted {
            Some(ids) => ids
                .iter()
                .map(|&id| AtomicU64::new(initial_of(id as usize)))
                .collect(),
            None => (0..n_ids)
                .map(|id| AtomicU64::new(initial_of(id)))
                .collect(),
        };
        let extra = shard_count(counts.len()) - 1;
        let shards = (0..extra)
            .map(|_| (0..counts.len()).map(|_| AtomicU64::new(0)).collect())
            .collect();
        Histogram {
            key,
            counted,
            n_ids,
            counts,
            shards,
            persistence,
            freq_ignored: 0,
            warnings: Vec::new(),
            persist_lock: Mutex::new(seen),
        }
    }

    /// Opens the histogram of the vault in `vault_dir`, whose file is
    /// `<vault_dir>/experts.smoe`: see [`Histogram::open_for_vault`].
    pub fn open(
        vault_dir: &Path,
        vault_id: [u8; 16],
        n_layers: u32,
        n_experts: u32,
        freq_path: Option<&Path>,
    ) -> (Histogram, Vec<String>) {
        let key = VaultKey::new(vault_id, n_layers, n_experts, &vault_dir.join(EXPERTS_FILE));
        Self::open_with_key(key, None, vault_dir, freq_path)
    }

    /// Opens the histogram of an opened vault: decides where it lives and
    /// whether the file there may be replaced ([`Persistence`]), removes the
    /// temporary files killed writers left next to it, loads the earlier
    /// sessions' counts, and returns it with the warnings to surface (also
    /// kept in [`warnings`](Self::warnings)). Never fails.
    pub fn open_for_vault(vault: &Vault, freq_path: Option<&Path>) -> (Histogram, Vec<String>) {
        let header = vault.header();
        let key = VaultKey::new(
            header.vault_id,
            header.n_layers,
            header.n_experts,
            vault.path(),
        );
        let counted = vault
            .entries()
            .iter()
            .filter_map(|e| vault.dense_id(e.layer, e.expert))
            .collect();
        if freq_path.is_some() || vault.model().is_none() {
            return Self::open_with_key(key, Some(counted), vault.dir(), freq_path);
        }
        // A model opened in place: nothing is written beside it (SPEC §6);
        // its histogram lives in its cache directory, made here.
        let dir = vault.histogram_dir();
        // A variable passed over on the way (a relative SMOE_CACHE_DIR).
        let note = dir.as_ref().ok().and_then(|(_, note)| note.clone());
        let dir = dir.and_then(|(d, _)| match std::fs::create_dir_all(&d) {
            Ok(()) => Ok(d),
            Err(e) => Err(format!("cannot create {}: {e}", d.display())),
        });
        let (mut h, mut warnings) = match dir {
            Ok(d) => Self::open_with_key(key, Some(counted), &d, None),
            Err(why) => {
                let (h, mut warnings) =
                    Self::open_with_key(key, Some(counted), vault.dir(), Some(Path::new("")));
                warnings.push(format!(
                    "the histogram of {} will not be kept: {why}",
                    vault.path().display()
                ));
                (h, warnings)
            }
        };
        if let Some(note) = note {
            warnings.insert(0, note);
        }
        h.warnings = warnings.clone();
        (h, warnings)
    }

    fn open_with_key(
        key: VaultKey,
        counted: Option<Box<[u32]>>,
        vault_dir: &Path,
        freq_path: Option<&Path>,
    ) -> (Histogram, Vec<String>) {
        let (n_layers, n_experts) = (key.n_layers, key.n_experts);
        let mut warnings = Vec::new();
        let ids = u64::from(n_layers) * u64::from(n_experts);
        let (persistence, seen) = if ids > MAX_EXPERT_IDS {
            warnings.push(format!(
                "histogram disabled: {n_layers} × {n_experts} exceeds {MAX_EXPERT_IDS} expert ids"
            ));
            (Persistence::Off, None)
        } else {
            Persistence::decide(&key, vault_dir, freq_path)
        };
        if let Some(warning) = persistence.warning() {
            warnings.push(warning.to_owned());
        }
        if let Persistence::Enabled(path) = &persistence {
            remove_leftover_temp_files(path);
        }
        // A protected file was found and not used: it counts as ignored.
        let mut freq_ignored = u64::from(matches!(persistence, Persistence::Protected(..)));
        let initial = match persistence.read_path() {
            None => None,
            Some(path) => match load(path, &key.vault_id, n_layers, n_experts) {
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
        let mut histogram = Self::with_counts(key, counted, initial, persistence, seen);
        histogram.freq_ignored = freq_ignored;
        histogram.warnings = warnings.clone();
        (histogram, warnings)
    }

    /// The position of dense id `id`'s counter: O(1) when every id is
    /// counted, a binary search over the entries otherwise.
    fn position_of(&self, id: u32) -> Option<usize> {
        let at = match &self.counted {
            None => id as usize,
            Some(ids) => ids.binary_search(&id).ok()?,
        };
        (at < self.counts.len()).then_some(at)
    }

    /// Counts one claim of dense id `id`. One `Relaxed` add on that id's own
    /// counter: no lock, no shared counter. An id without a counter is
    /// ignored. The streamer, which knows the entry's position, calls
    /// [`Histogram::bump_entry`] instead.
    #[inline]
    pub fn bump(&self, id: u32) {
        if let Some(at) = self.position_of(id) {
            self.bump_entry(at as u32);
        }
    }

    /// Counts one claim of the vault's entry number `index` (its position in
    /// [`Vault::entries`]) for a histogram opened with
    /// [`Histogram::open_for_vault`]; of dense id `index` otherwise.
    /// The add goes to the calling thread's shard.
    #[inline]
    pub fn bump_entry(&self, index: u32) {
        // Threads are numbered in the order they first ask, so up to
        // MAX_SHARDS threads each get their own shard.
        let shard = crate::sync::thread_index() % (self.shards.len() + 1);
        let counts = match shard {
            0 => &self.counts,
            n => &self.shards[n - 1],
        };
        if let Some(counter) = counts.get(index as usize) {
            // Relaxed: a count publishes nothing; readers want a recent value.
            counter.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The count at position `at` of `counts`: the sum over the shards.
    fn count_at(&self, at: usize) -> u64 {
        self.shards
            .iter()
            .fold(self.counts[at].load(Ordering::Relaxed), |sum, shard| {
                sum.wrapping_add(shard[at].load(Ordering::Relaxed))
            })
    }

    /// The count of dense id `id` (0 when it has no counter).
    pub fn get(&self, id: u32) -> u64 {
        self.position_of(id).map_or(0, |at| self.count_at(at))
    }

    /// (dense id, count) of every counter, ascending by id.
    fn counters(&self) -> impl Iterator<Item = (u32, u64)> + '_ {
        (0..self.counts.len()).map(|at| {
            let id = match &self.counted {
                None => at as u32,
                Some(ids) => ids[at],
            };
            (id, self.count_at(at))
        })
    }

    /// Every count, by dense id (ids without a counter are 0). Each value is
    /// one the counter held during the call; counters bumped concurrently
    /// may be read at different times.
    pub fn snapshot(&self) -> Vec<u64> {
        let mut dense = vec![0; self.n_ids];
        for (id, count) in self.counters() {
            dense[id as usize] = count;
        }
        dense
    }

    /// The sum of every count (earlier sessions' included).
    pub fn total(&self) -> u64 {
        self.counters()
            .fold(0u64, |sum, (_, count)| sum.wrapping_add(count))
    }

    /// Dense ids with a count above zero, by count descending, ties by
    /// ascending id (that is, ascending (layer, expert)).
    pub fn hottest_first(&self) -> Vec<u32> {
        let mut hot: Vec<(u64, u32)> = self
            .counters()
            .filter(|&(_, count)| count > 0)
            .map(|(id, count)| (count, id))
            .collect();
        hot.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        hot.into_iter().map(|(_, id)| id).collect()
    }

    /// Saves the counts (earlier sessions' plus this one's) if persistence is
    /// enabled; otherwise writes nothing and returns `Ok`. Just before the
    /// rename it checks the file at the path is still ours (or missing): one
    /// put there since open is kept, and this returns an error naming it. Called at close and
    /// by `smoe_flush_stats`; safe to call from several threads.
    pub fn persist(&self) -> Result<()> {
        let Some(path) = self.persistence.write_path() else {
            return Ok(());
        };
        let mut seen = self
            .persist_lock
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let key = &self.key;
        let bytes = encode(&key.vault_id, key.n_layers, key.n_experts, &self.snapshot())?;
        let saved = save_checked(
            path,
            |file| file.write_all(&bytes),
            || key.check_before_replacing(path, *seen),
        )?;
        *seen = Some(saved);
        Ok(())
    }

    /// Where the histogram is read and saved, or why it is not.
    pub fn persistence(&self) -> &Persistence {
        &self.persistence
    }

    /// Histogram files that existed but were ignored (damaged) or protected
    /// (not ours) at open (0 or 1).
    pub fn freq_ignored(&self) -> u64 {
        self.freq_ignored
    }

    /// The warnings recorded at open.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Number of layers.
    pub fn n_layers(&self) -> u32 {
        self.key.n_layers
    }

    /// Experts per layer.
    pub fn n_experts(&self) -> u32 {
        self.key.n_experts
    }

    /// Number of dense ids in the shape (0 above [`MAX_EXPERT_IDS`]).
    pub fn len(&self) -> usize {
        self.n_ids
    }

    /// Whether the shape has no ids.
    pub fn is_empty(&self) -> bool {
        self.n_ids == 0
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
    fn header_judgement() {
        let key = VaultKey {
            vault_id: ID,
            n_layers: 2,
            n_experts: 3,
            vault_file: None,
        };
        let ours = encode(&ID, 2, 3, &[1; 6]).unwrap();
        // Every prefix of our own file is ours (damaged, not foreign).
        for len in 0..=FREQ_HEADER_BYTES {
            assert_eq!(key.foreign_header(&ours[..len]), None, "{len} bytes");
        }
        let other_id = encode(&[8; 16], 2, 3, &[1; 6]).unwrap();
        let other_shape = encode(&ID, 3, 2, &[1; 6]).unwrap();
        let mut other_version = ours.clone();
        other_version[8] = 2;
        for (bytes, needle) in [
            (&other_id[..FREQ_HEADER_BYTES], "another vault (vault_id"),
            (&other_shape[..FREQ_HEADER_BYTES], "another vault (shape"),
            (&other_shape[..20], "another vault (shape"),
            (&other_version[..12], "version 2"),
            (&b"SMOEVALT"[..], "not a histogram file"),
            (&b"SMX"[..], "not a histogram file"),
        ] {
            let what = key.foreign_header(bytes).unwrap_or_default();
            assert!(what.contains(needle), "{needle}: {what:?}");
        }
        // A field cut short is judged on the bytes it keeps.
        let what = key.foreign_header(&other_id[..30]).unwrap();
        assert!(what.contains("vault_id begins 080808080808"), "{what}");
        let what = key.foreign_header(&other_shape[..14]).unwrap();
        assert!(
            what.contains("another shape, this vault is 2 × 3"),
            "{what}"
        );
        let what = key.foreign_header(&other_version[..9]).unwrap();
        assert!(what.contains("version other than 1"), "{what}");
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
