//! File safety: replacing only the library's own files, durably, and
//! cleaning up after killed writers. One home for the rules the histogram
//! (`popularity`), trace capture (`trace`) and the packer (`smoe-pack`)
//! share.
//!
//! This module owns:
//! - judging a path before anything is written there ([`judge_target`],
//!   [`examine_file`]): a symbolic link is followed, whatever is there must
//!   be a regular file the caller recognises as its own (never the vault
//!   file), and the directory must let a temporary file be created;
//! - the atomic save ([`save_checked`]): a temporary file in the same
//!   directory, fsync, a last check, rename over the target, fsync the
//!   directory ([`sync_dir`]), so a crash at any moment leaves the old file
//!   or the new one;
//! - the temporary files' names, `.<target>.tmp-<pid>-<n>`
//!   ([`is_temp_file_name`]), and removing those a killed writer left
//!   ([`remove_leftover_temp_files`]);
//! - a file's identity ([`file_id`], [`same_file`]) and its state, to
//!   tell a file changed under a reader ([`FileState`]);
//! - naming a symbolic link that leads nowhere ([`dangling_link`]), which
//!   a model's cache leaves when its blob is removed;
//! - refusing, before a byte is written, a vault that its filesystem has
//!   no room for ([`check_free_space`]: the packer's and the synthetic
//!   vaults').
//!
//! What it must never do: open anything but a regular file (a FIFO would
//! block the open forever, a device may act on being opened: files are
//! told apart by `lstat` first and opened through [`sys::open_regular`]),
//! or remove a file that another live writer may still rename.

use std::fs::{File, OpenOptions};
use std::io::{ErrorKind as IoErrorKind, Read};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use crate::error::{Error, ErrorKind, Result};
use crate::sys::{self, FileKind, OpenRegularError};

/// Prefix of the temporary files [`save_checked`] writes next to the target:
/// `.<file name>.tmp-<pid>-<n>`.
const TMP_MARKER: &str = ".tmp-";

/// A leftover temporary file is removed only once it has not been modified
/// for this long. See `remove_leftover_temp_files`.
const LEFTOVER_MIN_AGE: Duration = Duration::from_secs(60);

/// A file's identity: `(st_dev, st_ino)`.
pub type FileId = (u64, u64);

/// The identity of the file `metadata` describes.
pub fn file_id(metadata: &std::fs::Metadata) -> FileId {
    (metadata.dev(), metadata.ino())
}

/// What a reader of a file it does not own checks to know the file is
/// still the one it read: which file (device and inode), its length, its
/// modification time, and its status-change time (`st_ctime`), which the
/// kernel moves on every write and on every change of the file's times,
/// and which no call sets back: a rewrite that restores the length and
/// the modification time still shows there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileState {
    /// Device and inode.
    pub id: FileId,
    /// Length in bytes.
    pub len: u64,
    /// Modification time, where the filesystem keeps one.
    pub modified: Option<SystemTime>,
    /// Status-change time: seconds and nanoseconds.
    pub changed: (i64, i64),
}

impl FileState {
    /// The state `metadata` (an `fstat` or `stat`) describes.
    pub fn of(metadata: &std::fs::Metadata) -> FileState {
        FileState {
            id: file_id(metadata),
            len: metadata.len(),
            modified: metadata.modified().ok(),
            changed: (metadata.ctime(), metadata.ctime_nsec()),
        }
    }

    /// How `now` differs from this state, as a clause ("it was 10 bytes,
    /// it is 20"); `None` when it is the same file, unchanged. The length
    /// and the identity are exact; the times are the kernel's, moved at
    /// its clock's resolution (a write through a shared mapping may not
    /// move them at once).
    pub fn differs(&self, now: &FileState) -> Option<String> {
        if now.id != self.id {
            Some("the path names another file (replaced by a rename?)".to_owned())
        } else if now.len != self.len {
            Some(format!("it was {} bytes, it is {}", self.len, now.len))
        } else if now.modified != self.modified {
            Some("its modification time moved".to_owned())
        } else if now.changed != self.changed {
            Some(
                "its status-change time (ctime) moved: it was written, or its times or permissions were set"
                    .to_owned(),
            )
        } else {
            None
        }
    }
}

/// Writes the file at `path` atomically: a temporary file in the same
/// directory, filled by `write`, fsync; then `check`, called once that file
/// is durable, just before the rename over `path`; then an fsync of the
/// directory. An error from either callback removes the temporary file and
/// leaves `path` alone. Returns the identity of the file now at `path`.
///
/// This replaces whatever is at `path`: the caller first decides, with
/// [`judge_target`], that it may, and `check` repeats that decision.
pub fn save_checked(
    path: &Path,
    write: impl FnOnce(&mut File) -> std::io::Result<()>,
    check: impl FnOnce() -> Result<()>,
) -> Result<FileId> {
    let (tmp_path, mut file) = create_temp(path)?;
    let written = write(&mut file)
        .and_then(|()| file.sync_all())
        .and_then(|()| file.metadata())
        .map_err(|e| Error::io("cannot write", &tmp_path, &e));
    drop(file);
    let renamed = written.and_then(|metadata| {
        check()?;
        std::fs::rename(&tmp_path, path).map_err(|e| {
            Error::io(
                format_args!("cannot rename {} to", tmp_path.display()),
                path,
                &e,
            )
        })?;
        // A rename keeps the inode: this is the file now at `path`.
        Ok(file_id(&metadata))
    });
    match renamed {
        Ok(id) => {
            sync_dir(&parent_dir(path))?;
            Ok(id)
        }
        Err(e) => {
            let _ = std::fs::remove_file(&tmp_path);
            Err(e)
        }
    }
}

/// Creates a fresh temporary file next to `path` with `O_EXCL`, retrying
/// past stale names (a dead process whose pid was reused).
fn create_temp(path: &Path) -> Result<(PathBuf, File)> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let name = target_name(path);
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

/// Whether `file_name` is one of [`save_checked`]'s temporary files for `target`:
/// exactly `.<target>.tmp-<pid>-<n>`, both numbers decimal.
pub fn is_temp_file_name(file_name: &str, target: &str) -> bool {
    temp_file_pid(file_name, target).is_some()
}

/// The pid in the name of one of [`save_checked`]'s temporary files for
/// `target`; `None` for any other name (a pid beyond `u32` is not one it
/// writes).
fn temp_file_pid(file_name: &str, target: &str) -> Option<u32> {
    let rest = file_name
        .strip_prefix('.')?
        .strip_prefix(target)?
        .strip_prefix(TMP_MARKER)?;
    let (pid, n) = rest.split_once('-')?;
    let decimal = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !decimal(pid) || !decimal(n) {
        return None;
    }
    pid.parse().ok()
}

/// The file name [`create_temp`] builds temporary names from (`file` for
/// a path without one, such as `..`: nothing is ever renamed there, since
/// [`judge_target`] finds a directory).
fn target_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "file".to_owned())
}

/// Removes the temporary files that writers killed mid-[`save_checked`]
/// left next to `path` (the rename never ran, so nothing else ever removes them).
/// Best effort: whatever cannot be removed stays for a later open. A file is
/// removed only if all of these hold:
/// - its name is exactly `.<target>.tmp-<pid>-<n>` for this target;
/// - it is a regular file (`lstat`: a link or directory is left alone);
/// - `pid` is not this process (another thread may be saving right now);
/// - no process `pid` exists (`kill(pid, 0)`): a live writer elsewhere is
///   between its create and its rename. A pid reused by an unrelated
///   process only delays the removal until that process ends;
/// - it has not been modified for a minute (`LEFTOVER_MIN_AGE`): a writer
///   in another pid namespace (a container sharing the directory) is
///   invisible to `kill`, and a save writes, fsyncs and renames its file
///   within seconds, so a temporary file a minute old has no writer left.
///
/// `O_EXCL` keeps a new writer from ever reusing a leftover's name, so a
/// file that passed these checks cannot become someone's file meanwhile.
pub fn remove_leftover_temp_files(path: &Path) {
    let target = target_name(path);
    let Ok(entries) = std::fs::read_dir(parent_dir(path)) else {
        return;
    };
    let own_pid = std::process::id();
    let now = SystemTime::now();
    for entry in entries.filter_map(|e| e.ok()) {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| temp_file_pid(n, &target)) else {
            continue;
        };
        if pid == own_pid || sys::process_exists(pid) {
            continue;
        }
        // `DirEntry::metadata` does not follow a symbolic link.
        let Ok(metadata) = entry.metadata() else {
            continue;
        };
        // A modification time in the future or unknown counts as recent.
        let old_enough = metadata
            .modified()
            .ok()
            .and_then(|modified| now.duration_since(modified).ok())
            .is_some_and(|age| age >= LEFTOVER_MIN_AGE);
        if metadata.is_file() && old_enough {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Makes a rename in `dir` durable. Filesystems that cannot fsync a
/// directory (EINVAL) are not an error: there is nothing more to do there.
pub fn sync_dir(dir: &Path) -> Result<()> {
    let synced = File::open(dir).and_then(|d| d.sync_all());
    match synced {
        Ok(()) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(()),
        Err(e) => Err(Error::io("cannot fsync directory", dir, &e)),
    }
}

/// Refuses, before a byte is written, a vault of up to `needed` bytes that
/// the filesystem meant to hold `dir` has no room for: the writes would
/// fail only after filling the disk. `dir` may not exist yet (its nearest
/// existing ancestor's filesystem is asked). When the free space cannot be
/// known, nothing is refused: the writes will say.
pub fn check_free_space(dir: &Path, needed: u128) -> Result<()> {
    let Some(free) = sys::free_bytes(dir) else {
        return Ok(());
    };
    if needed <= u128::from(free) {
        return Ok(());
    }
    let needed = u64::try_from(needed).unwrap_or(u64::MAX);
    Err(Error::new(
        ErrorKind::Io,
        format!(
            "the vault needs {needed} bytes ({}) but its filesystem has {free} bytes ({}) free",
            human_bytes(needed),
            human_bytes(free)
        ),
    )
    .with_path(dir))
}

/// `n` bytes for a person: "1.50 GiB".
fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["bytes", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} bytes")
    } else {
        format!("{v:.2} {}", UNITS[unit])
    }
}

/// What [`judge_target`] decided about a file the library means to replace
/// at close (the histogram, the trace).
#[derive(Debug)]
pub enum Target {
    /// May be written.
    Writable {
        /// The file to write: a symbolic link at the configured path
        /// followed.
        path: PathBuf,
        /// The identity of the file found there, if any.
        seen: Option<FileId>,
    },
    /// The file is ours or missing, but its directory does not allow
    /// creating the temporary file.
    ReadOnly {
        /// As in `Writable`.
        path: PathBuf,
        /// As in `Writable`.
        seen: Option<FileId>,
        /// Why the temporary file could not be created.
        error: Error,
    },
    /// Something that is not ours is there: what it is, to follow the
    /// configured path in a warning.
    Foreign(String),
}

/// Decides whether the file at `requested` may be replaced at close: a
/// symbolic link is followed (a dangling one is foreign: saving would replace
/// the link); whatever exists there must be ours by `examine`; then the
/// directory is probed by creating and removing one of [`save_checked`]'s
/// temporary files: that is the operation a save needs, and, unlike `access(W_OK)`, it
/// gives the true answer for root, read-only mounts and network
/// filesystems. Never opens anything but a regular file, non-blocking.
pub fn judge_target(requested: &Path, examine: impl Fn(&Path) -> Found) -> Target {
    let path = match std::fs::symlink_metadata(requested) {
        Ok(m) if m.file_type().is_symlink() => match std::fs::canonicalize(requested) {
            Ok(target) => target,
            Err(e) if e.kind() == IoErrorKind::NotFound => {
                return Target::Foreign("is a symbolic link to a missing file".into())
            }
            Err(e) => {
                return Target::Foreign(format!("is a symbolic link that cannot be followed ({e})"))
            }
        },
        _ => requested.to_path_buf(),
    };
    let seen = match examine(&path) {
        Found::Nothing => None,
        Found::Ours(id) => Some(id),
        Found::Foreign(what) if path != requested => {
            return Target::Foreign(format!(
                "is a symbolic link to {}, which {what}",
                path.display()
            ))
        }
        Found::Foreign(what) => return Target::Foreign(what),
    };
    match create_temp(&path) {
        Ok((tmp_path, file)) => {
            drop(file);
            let _ = std::fs::remove_file(&tmp_path);
            Target::Writable { path, seen }
        }
        Err(error) => Target::ReadOnly { path, seen, error },
    }
}

/// Says whether the file at `path` (not following a final symbolic link)
/// is one the library may replace: nothing there, or a regular file that is
/// not `vault_file` and whose first `head_len` bytes (fewer if the file is
/// shorter) `foreign_head` accepts (`None`; else it says what the file is).
/// Never blocks: a FIFO or device is recognised by `lstat` and never opened,
/// and the regular file is read through [`sys::open_regular`].
pub fn examine_file(
    path: &Path,
    vault_file: Option<&(PathBuf, FileId)>,
    head_len: usize,
    foreign_head: impl FnOnce(&[u8]) -> Option<String>,
) -> Found {
    let metadata = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == IoErrorKind::NotFound => return Found::Nothing,
        Err(e) => return Found::Foreign(format!("cannot be examined ({e})")),
    };
    let kind = FileKind::of(metadata.file_type());
    if kind != FileKind::Regular {
        return Found::Foreign(format!("is {kind}"));
    }
    if let Some(what) = vault_file_match(vault_file, &metadata) {
        return Found::Foreign(what);
    }
    let (file, metadata) = match sys::open_regular(path) {
        Ok(opened) => opened,
        Err(OpenRegularError::Os(e)) if e.kind() == IoErrorKind::NotFound => return Found::Nothing,
        Err(OpenRegularError::Os(e)) => return Found::Foreign(format!("cannot be read ({e})")),
        Err(OpenRegularError::NotRegular(kind)) => return Found::Foreign(format!("is {kind}")),
    };
    // Checked again on the descriptor: the path may have changed since.
    if let Some(what) = vault_file_match(vault_file, &metadata) {
        return Found::Foreign(what);
    }
    let mut head = Vec::with_capacity(head_len.min(1 << 16));
    if let Err(e) = file.take(head_len as u64).read_to_end(&mut head) {
        return Found::Foreign(format!("cannot be read ({e})"));
    }
    match foreign_head(&head) {
        Some(what) => Found::Foreign(what),
        None => Found::Ours(file_id(&metadata)),
    }
}

/// "is the vault file ..." when `metadata` is the vault file's inode (the
/// file itself, a hard link, or a symbolic link's target).
fn vault_file_match(
    vault_file: Option<&(PathBuf, FileId)>,
    metadata: &std::fs::Metadata,
) -> Option<String> {
    let (vault_path, vault_id) = vault_file?;
    (file_id(metadata) == *vault_id).then(|| {
        format!(
            "is the vault file (the same inode as {})",
            vault_path.display()
        )
    })
}

/// The identity of the vault file at `path` (followed through links), when
/// it can be stat'ed: what [`examine_file`] refuses to replace.
pub fn vault_file_key(path: &Path) -> Option<(PathBuf, FileId)> {
    std::fs::metadata(path)
        .ok()
        .map(|m| (path.to_path_buf(), file_id(&m)))
}

/// What a judge of a path ([`examine_file`], and the callers' rules over
/// it) found there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Found {
    /// Nothing: the library may create the file.
    Nothing,
    /// A regular file the caller recognises as its own (for the histogram:
    /// one whose header is this vault's, damaged or not): the library may
    /// replace it.
    Ours(FileId),
    /// Anything else: never replaced. What it is, to follow the path.
    Foreign(String),
}

/// Whether `a` and `b` name the same file: the same inode when both exist
/// (links followed), else the same canonical directory and name.
pub fn same_file(a: &Path, b: &Path) -> bool {
    if let (Ok(ma), Ok(mb)) = (std::fs::metadata(a), std::fs::metadata(b)) {
        return file_id(&ma) == file_id(&mb);
    }
    let canonical = |p: &Path| {
        let dir = match p.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        Some(std::fs::canonicalize(dir).ok()?.join(p.file_name()?))
    };
    matches!((canonical(a), canonical(b)), (Some(x), Some(y)) if x == y)
}

/// When `path` is a symbolic link that leads nowhere (its target, or a
/// link on the way, does not exist), the error that says so, naming the
/// link and its target: a Hugging Face cache whose blob was removed
/// leaves `snapshots/<rev>/model.safetensors -> ../../blobs/<sha>`, and
/// "no such file" alone would name a file the user can see. `None` for
/// anything else (the caller's own error then stands).
pub fn dangling_link(path: &Path) -> Option<Error> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    if !meta.file_type().is_symlink() {
        return None;
    }
    match std::fs::metadata(path) {
        Err(e) if e.kind() == IoErrorKind::NotFound => {
            let target = std::fs::read_link(path).ok()?;
            Some(Error::path_is(
                ErrorKind::Io,
                path,
                format!(
                    "is a broken symbolic link: its target {} does not exist (a model cache whose blob was removed?)",
                    target.display()
                ),
            ))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        // Exactly `.<target>.tmp-<pid>-<n>`, both decimal.
        let pid = |name: &str| temp_file_pid(name, "expert_freq.bin");
        assert_eq!(pid(".expert_freq.bin.tmp-999999999-17"), Some(999_999_999));
        for not_ours in [
            ".expert_freq.bin.tmp-12",
            ".expert_freq.bin.tmp-12-",
            ".expert_freq.bin.tmp--3",
            ".expert_freq.bin.tmp-12-3.keep",
            ".expert_freq.bin.tmp-12-3-4",
            ".expert_freq.bin.tmp-x-3",
            ".expert_freq.bin.tmp-+12-3",
            ".expert_freq.bin.tmp-99999999999-3",
            "expert_freq.bin.tmp-12-3",
            ".expert_freq.bin.tmp-12-3 ",
        ] {
            assert_eq!(pid(not_ours), None, "{not_ours}");
        }
    }
}
