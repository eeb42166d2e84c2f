//! Linux: the raw calls behind `sys` (`open(O_DIRECT)`, `open(O_NONBLOCK)`,
//! `fcntl(F_SETFL)`, `pread`, `posix_fadvise`, `kill(pid, 0)`) and the memory
//! probe, which reads `/proc/meminfo` and the process's memory cgroup (v1 or
//! v2).
//!
//! Owns: turning each call's return value into an `io::Result`, and turning
//! kernel text into numbers. Must never: decide anything with those numbers
//! (ring size, fallback warnings) or retry; that is the caller's.
//!
//! Malformed kernel text never panics. `/proc/meminfo` without a readable
//! `MemTotal`/`MemAvailable` is an error (the probe has nothing to stand on);
//! a cgroup file that is missing or unparseable counts as "no limit" at that
//! level, because a container's view of cgroupfs is often partial.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::RawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use super::{DirectOpenError, MemoryPressure, MemorySnapshot};

/// How the refused call is named in an `Unsupported` error.
pub(super) const DIRECT_IO_CALL: &str = "O_DIRECT";

/// `open(path, O_RDONLY | O_CLOEXEC | O_DIRECT)`; `EINVAL` means the
/// filesystem does not support `O_DIRECT` (open(2), "EINVAL ... O_DIRECT").
pub(super) fn open_direct(path: &Path) -> Result<File, DirectOpenError> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT | libc::O_CLOEXEC)
        .open(path)
        .map_err(|err| {
            if err.raw_os_error() == Some(libc::EINVAL) {
                DirectOpenError::Refused(err)
            } else {
                DirectOpenError::Other(err)
            }
        })
}

/// One `pread(2)`: bytes read (0 at end of file) or the errno.
pub(super) fn pread(fd: RawFd, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let offset = libc::off_t::try_from(offset).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("offset {offset} does not fit off_t"),
        )
    })?;
    // SAFETY: `buf` is a live, exclusively borrowed region of `buf.len()`
    // bytes; the kernel writes at most that many. A bad `fd` is an errno.
    let n = unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), buf.len(), offset) };
    // A negative return is -1 with errno set; anything else is a byte count.
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

/// `open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK)`: never waits, not even for
/// a FIFO's writer (std adds `O_CLOEXEC`).
/// open(2): "O_NONBLOCK ... When possible, the file is opened in nonblocking
/// mode. Neither the open() nor any subsequent I/O operations on the file
/// descriptor which is returned will cause the calling process to wait";
/// fifo(7): "opening for read-only succeeds even if no one has opened on the
/// write side yet".
pub(super) fn open_nonblocking(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
}

/// Clears `O_NONBLOCK` on `fd`, leaving its other status flags as they are.
/// fcntl(2) `F_GETFL`/`F_SETFL`: "On Linux, this command can change only the
/// O_APPEND, O_ASYNC, O_DIRECT, O_NOATIME, and O_NONBLOCK flags".
pub(super) fn clear_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: plain syscall on an integer descriptor; F_GETFL takes no
    // argument and touches no memory of ours.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags == -1 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above; F_SETFL takes an int argument.
    let rc = unsafe { libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) };
    if rc == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Turns direct I/O on for an open descriptor: `O_DIRECT` added to its
/// status flags with fcntl(2) `F_SETFL` (one of the flags Linux lets it
/// change, quoted above). A filesystem without direct I/O refuses with
/// `EINVAL`, as `open(O_DIRECT)` does.
pub(super) fn set_direct(fd: RawFd) -> Result<(), DirectOpenError> {
    // SAFETY: plain syscall on an integer descriptor; F_GETFL takes no
    // argument and touches no memory of ours.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags == -1 {
        return Err(DirectOpenError::Other(io::Error::last_os_error()));
    }
    // SAFETY: as above; F_SETFL takes an int argument.
    let rc = unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_DIRECT) };
    if rc == -1 {
        let err = io::Error::last_os_error();
        return Err(if err.raw_os_error() == Some(libc::EINVAL) {
            DirectOpenError::Refused(err)
        } else {
            DirectOpenError::Other(err)
        });
    }
    Ok(())
}

/// `kill(pid, 0)`: whether the process exists (`EPERM`: it does, owned by
/// someone else). `pid` is positive (the caller checks).
/// kill(2): "If sig is 0, then no signal is sent, but existence and
/// permission checks are still performed"; `ESRCH`: "The target process or
/// process group does not exist".
pub(super) fn process_exists(pid: libc::pid_t) -> bool {
    // SAFETY: signal 0 sends nothing; the call only checks `pid` and touches
    // no memory of ours. `pid > 0`, so it never addresses a process group.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// `posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED)`: the whole file.
pub(super) fn drop_file_cache(fd: RawFd) -> io::Result<()> {
    // SAFETY: plain syscall on an integer descriptor; no memory is passed.
    let rc = unsafe { libc::posix_fadvise(fd, 0, 0, libc::POSIX_FADV_DONTNEED) };
    // posix_fadvise returns the error number instead of setting errno.
    match rc {
        0 => Ok(()),
        errno => Err(io::Error::from_raw_os_error(errno)),
    }
}

/// `Cached:` from `/proc/meminfo`, in bytes.
pub(super) fn page_cache_bytes() -> Option<u64> {
    let text = fs::read_to_string("/proc/meminfo").ok()?;
    parse_meminfo(&text).ok()?.cached_bytes
}

pub(super) fn memory_snapshot() -> io::Result<MemorySnapshot> {
    memory_snapshot_from(Path::new("/"))
}

/// [`memory_snapshot`](super::memory_snapshot) with every file read under
/// `root` (`root/proc/meminfo`, `root/proc/self/cgroup`,
/// `root/sys/fs/cgroup/...`), so fixtures can stand in for the kernel.
///
/// The cgroup is the one `proc/self/cgroup` names: the v1 `memory`
/// controller's if there is one (then memory is not on the v2 hierarchy),
/// else the v2 (`0::`) one. Its directory and every parent up to the mount
/// root are read; when the named directory does not exist under the mount
/// (a container that sees its own cgroup as the root), only the mount root
/// is. At each level with a limit, `ram` is lowered to the limit and `avail`
/// to `limit − usage`. A limit at or above `MemTotal` (v1 writes 2^63 − 4096
/// for "none", v2 writes `max`) is no limit; an unreadable usage counts as 0.
pub(super) fn memory_snapshot_from(root: &Path) -> io::Result<MemorySnapshot> {
    let meminfo_path = root.join("proc/meminfo");
    let text = read_text(&meminfo_path)?;
    let meminfo = parse_meminfo(&text).map_err(|what| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: {what}", meminfo_path.display()),
        )
    })?;
    let mut snapshot = MemorySnapshot {
        avail_bytes: meminfo.available_bytes,
        ram_bytes: meminfo.total_bytes,
        avail_source: "/proc/meminfo MemAvailable".to_owned(),
        ram_source: "/proc/meminfo MemTotal".to_owned(),
        cgroup_limited: false,
        // MemAvailable counts the reclaimable page cache already.
        committable_bytes: meminfo.available_bytes,
        committable_source: "/proc/meminfo MemAvailable".to_owned(),
    };
    // No /proc/self/cgroup (no cgroup support, a sandbox hiding it): no limit.
    let Ok(cgroup_text) = fs::read_to_string(root.join("proc/self/cgroup")) else {
        return Ok(snapshot);
    };
    let paths = parse_proc_self_cgroup(&cgroup_text);
    let (hierarchy, cgroup_path) = match (paths.v1_memory, paths.v2) {
        (Some(path), _) => (&V1, path),
        (None, Some(path)) => (&V2, path),
        (None, None) => return Ok(snapshot),
    };
    for level in cgroup_levels(root, hierarchy, &cgroup_path) {
        let Some(limit) = read_limit(&level.dir, hierarchy.limit_file) else {
            continue;
        };
        if limit >= meminfo.total_bytes || limit >= hierarchy.no_limit_at {
            continue;
        }
        if limit < snapshot.ram_bytes {
            snapshot.ram_bytes = limit;
            snapshot.cgroup_limited = true;
            snapshot.ram_source = level.source(hierarchy, "{limit}");
        }
        let usage = read_limit(&level.dir, hierarchy.usage_file);
        let headroom = limit.saturating_sub(usage.unwrap_or(0));
        if headroom < snapshot.avail_bytes {
            snapshot.avail_bytes = headroom;
            snapshot.avail_source = match usage {
                Some(_) => level.source(hierarchy, "{limit} - {usage}"),
                None => level.source(hierarchy, "{limit} ({usage} unreadable)"),
            };
        }
        // The usage counts the file cache, which the kernel reclaims before
        // it kills: committable is what the elastic ring's probe measures.
        let file = level.file_cache(hierarchy);
        let committable = committable_bytes(limit, usage.unwrap_or(0), file.unwrap_or(0));
        if committable < snapshot.committable_bytes {
            snapshot.committable_bytes = committable;
            snapshot.committable_source = match (usage, file) {
                (None, _) => level.source(hierarchy, "{limit} ({usage} unreadable)"),
                (Some(_), Some(_)) => level.source(hierarchy, "{limit} - ({usage} - file cache)"),
                (Some(_), None) => level.source(
                    hierarchy,
                    "{limit} - ({usage} - file cache: memory.stat unreadable, 0)",
                ),
            };
        }
    }
    Ok(snapshot)
}

/// `$XDG_CACHE_HOME` if absolute, else `$HOME/.cache` (the XDG base
/// directory specification: "If $XDG_CACHE_HOME is either not set or
/// empty, a default equal to $HOME/.cache should be used"; a relative path
/// is invalid and ignored).
pub(super) fn user_cache_home(env: &dyn Fn(&str) -> Option<std::ffi::OsString>) -> Option<PathBuf> {
    let absolute = |name: &str| env(name).map(PathBuf::from).filter(|p| p.is_absolute());
    absolute("XDG_CACHE_HOME").or_else(|| absolute("HOME").map(|home| home.join(".cache")))
}

fn read_text(path: &Path) -> io::Result<String> {
    fs::read_to_string(path)
        .map_err(|err| io::Error::new(err.kind(), format!("{}: {err}", path.display())))
}

/// Where one cgroup hierarchy keeps its memory files.
struct Hierarchy {
    name: &'static str,
    /// The mount point, relative to `/`.
    mount: &'static str,
    limit_file: &'static str,
    usage_file: &'static str,
    /// Limits at or above this mean "none".
    no_limit_at: u64,
}

const V1: Hierarchy = Hierarchy {
    name: "v1",
    mount: "sys/fs/cgroup/memory",
    limit_file: "memory.limit_in_bytes",
    usage_file: "memory.usage_in_bytes",
    // The kernel's "unlimited" is PAGE_COUNTER_MAX pages: 2^63 − page size.
    no_limit_at: 1 << 62,
};

const V2: Hierarchy = Hierarchy {
    name: "v2",
    mount: "sys/fs/cgroup",
    limit_file: "memory.max",
    usage_file: "memory.current",
    no_limit_at: u64::MAX,
};

/// One cgroup directory to read: its place under `root`, and its path as the
/// process would see it (for the snapshot's source strings).
struct Level {
    dir: PathBuf,
    shown: PathBuf,
}

impl Level {
    /// The file cache this level's usage counts (`memory.stat`), `None`
    /// when it cannot be read.
    fn file_cache(&self, h: &Hierarchy) -> Option<u64> {
        fs::read_to_string(self.dir.join("memory.stat"))
            .ok()
            .map(|text| file_cache_bytes(&text, h.name == "v1"))
    }

    /// Where a figure of this level came from, in words: `cgroup v2 WHAT in
    /// /sys/fs/cgroup/app`, `{limit}` and `{usage}` in `what` naming the
    /// hierarchy's files.
    fn source(&self, h: &Hierarchy, what: &str) -> String {
        let what = what
            .replace("{limit}", h.limit_file)
            .replace("{usage}", h.usage_file);
        format!("cgroup {} {what} in {}", h.name, self.shown.display())
    }
}

/// The process's cgroup directory and each parent up to the mount root,
/// deepest first. A path that climbs (`..`, as a cgroup namespace shows a
/// cgroup outside it) or does not exist under the mount yields the mount
/// root alone.
fn cgroup_levels(root: &Path, hierarchy: &Hierarchy, cgroup_path: &str) -> Vec<Level> {
    let mount = root.join(hierarchy.mount);
    let shown_mount = Path::new("/").join(hierarchy.mount);
    if !mount.is_dir() {
        return Vec::new();
    }
    let mut parts: Vec<&str> = cgroup_path
        .split('/')
        .filter(|part| !part.is_empty() && *part != ".")
        .collect();
    if parts.contains(&"..") || !parts.iter().fold(mount.clone(), |p, c| p.join(c)).is_dir() {
        parts.clear();
    }
    (0..=parts.len())
        .rev()
        .map(|depth| {
            // Joined one part at a time: `join("")` would add a trailing '/'.
            let under = |base: &Path| {
                parts[..depth]
                    .iter()
                    .fold(base.to_path_buf(), |p, c| p.join(c))
            };
            Level {
                dir: under(&mount),
                shown: under(&shown_mount),
            }
        })
        .collect()
}

fn read_limit(dir: &Path, file: &str) -> Option<u64> {
    parse_limit(&fs::read_to_string(dir.join(file)).ok()?)
}

/// What the probe needs from `/proc/meminfo`, in bytes.
#[derive(Debug, PartialEq, Eq)]
struct Meminfo {
    total_bytes: u64,
    available_bytes: u64,
    cached_bytes: Option<u64>,
}

/// Parses `/proc/meminfo` text ("MemTotal:  24731708 kB" lines). Missing or
/// malformed `MemTotal` or `MemAvailable` (kernels before 3.14 lack it) is an
/// error; other lines are not looked at.
fn parse_meminfo(text: &str) -> Result<Meminfo, String> {
    let field = |key: &str| -> Result<Option<u64>, String> {
        let Some(value) = text.lines().find_map(|line| {
            let (name, value) = line.split_once(':')?;
            (name.trim() == key).then_some(value.trim())
        }) else {
            return Ok(None);
        };
        let (number, scale) = match value.strip_suffix("kB") {
            Some(number) => (number.trim_end(), 1024),
            None => (value, 1),
        };
        number
            .parse::<u64>()
            .ok()
            .and_then(|n| n.checked_mul(scale))
            .map(Some)
            .ok_or_else(|| format!("{key} value {value:?} is not a byte count"))
    };
    let required = |key: &str| field(key)?.ok_or_else(|| format!("no {key} line"));
    Ok(Meminfo {
        total_bytes: required("MemTotal")?,
        available_bytes: required("MemAvailable")?,
        cached_bytes: field("Cached").ok().flatten(),
    })
}

/// The process's memory cgroup paths from `/proc/self/cgroup`.
#[derive(Debug, Default, PartialEq, Eq)]
struct CgroupPaths {
    /// The path of the v1 hierarchy that has the `memory` controller.
    v1_memory: Option<String>,
    /// The path on the v2 (unified) hierarchy, the `0::` line.
    v2: Option<String>,
}

/// Parses `/proc/self/cgroup` ("hierarchy-id:controllers:path" lines, see
/// cgroups(7)). Malformed lines are skipped.
fn parse_proc_self_cgroup(text: &str) -> CgroupPaths {
    let mut paths = CgroupPaths::default();
    for line in text.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        if id == "0" && controllers.is_empty() {
            paths.v2.get_or_insert_with(|| path.to_owned());
        } else if controllers.split(',').any(|c| c == "memory") {
            paths.v1_memory.get_or_insert_with(|| path.to_owned());
        }
    }
    paths
}

/// Parses a cgroup limit or usage file: a decimal byte count, or `max`
/// (v2's "no limit"). Unparseable text is `None` too: treated as no limit.
fn parse_limit(text: &str) -> Option<u64> {
    match text.trim() {
        "max" => None,
        number => number.parse().ok(),
    }
}

/// Extra `mmap` flags for the ring's reservation: none. Anonymous private
/// pages are committed when first touched either way (mmap(2)); without
/// `MAP_NORESERVE` the kernel's overcommit heuristic still refuses a ring
/// larger than the machine's memory and swap at open (`ENOMEM`, reported as
/// `SMOE_ERR_NO_MEMORY`), instead of letting its reads exhaust memory later.
pub(super) const MAP_RESERVE_ONLY: libc::c_int = 0;

/// `madvise(addr, len, MADV_POPULATE_WRITE)`: "Populate (prefault) page
/// tables writable, faulting-in all pages in the range just as if manually
/// writing to each page; however, avoid the actual memory access that would
/// have been performed" (madvise(2), Linux 5.14), so the contents stay as
/// they are. A kernel that does not know it answers `EINVAL`; then
/// `MADV_WILLNEED` ("expect access in the near future"), which changes
/// nothing either, and commits nothing of anonymous memory: `Ok(false)`.
pub(super) fn populate(addr: *mut libc::c_void, len: usize) -> io::Result<bool> {
    // SAFETY: `addr..addr + len` is inside a mapping the caller owns;
    // populating never changes the contents (see above).
    if unsafe { libc::madvise(addr, len, libc::MADV_POPULATE_WRITE) } == 0 {
        return Ok(true);
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() != Some(libc::EINVAL) {
        return Err(err);
    }
    // SAFETY: as above; WILLNEED is advice only.
    if unsafe { libc::madvise(addr, len, libc::MADV_WILLNEED) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(false)
}

/// The size of a transparent huge page on this machine: 2 MiB on x86-64
/// and on arm64 with 4 KiB pages.
pub(crate) const HUGE_PAGE_BYTES: usize = 2 << 20;

/// `madvise(addr, len, MADV_HUGEPAGE)`: "Enable Transparent Huge Pages
/// (THP) for pages in the range", faulted as huge pages where the range
/// covers whole aligned ones (madvise(2), Linux 2.6.38). `EINVAL` when the
/// kernel was built without THP: `Ok(false)`.
pub(super) fn advise_huge_pages(addr: *mut libc::c_void, len: usize) -> io::Result<bool> {
    // SAFETY: `addr..addr + len` is a mapping the caller owns; the advice
    // changes how pages are backed, never their contents.
    if unsafe { libc::madvise(addr, len, libc::MADV_HUGEPAGE) } == 0 {
        return Ok(true);
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EINVAL) {
        return Ok(false);
    }
    Err(err)
}

/// `madvise(addr, len, MADV_DONTNEED)`: on a private anonymous mapping
/// "subsequent accesses of pages in the range ... will result in
/// zero-fill-on-demand pages" (madvise(2)); the memory is freed at once
/// (and uncharged from the cgroup). Refused (`EINVAL`) on locked pages.
pub(super) fn discard(addr: *mut libc::c_void, len: usize) -> io::Result<()> {
    // SAFETY: `addr..addr + len` is inside a mapping the caller owns, and
    // the caller makes sure nobody uses those bytes meanwhile.
    if unsafe { libc::madvise(addr, len, libc::MADV_DONTNEED) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The elastic ring's probe (`super::PressureProbe`): `/proc/meminfo`
/// `MemAvailable`, and at each level of the process's memory cgroup that
/// has a limit, the limit, the usage and the file cache (`memory.stat`
/// `active_file + inactive_file`, v1 `total_active_file +
/// total_inactive_file`: the reclaimable part; tmpfs and shared memory are
/// not in it), and the deepest v2 level's `memory.pressure`.
pub(super) struct PressureProbe {
    root: PathBuf,
    hierarchy: Option<&'static Hierarchy>,
    levels: Vec<Level>,
}

impl PressureProbe {
    pub(super) fn new() -> io::Result<PressureProbe> {
        Self::from_root(Path::new("/"))
    }

    /// [`PressureProbe::new`] reading every file under `root` (fixtures).
    pub(super) fn from_root(root: &Path) -> io::Result<PressureProbe> {
        // The one required file: fail now rather than at every sample.
        read_text(&root.join("proc/meminfo"))?;
        let (hierarchy, levels) = match fs::read_to_string(root.join("proc/self/cgroup")) {
            Ok(text) => {
                let paths = parse_proc_self_cgroup(&text);
                match (paths.v1_memory, paths.v2) {
                    (Some(path), _) => (Some(&V1), cgroup_levels(root, &V1, &path)),
                    (None, Some(path)) => (Some(&V2), cgroup_levels(root, &V2, &path)),
                    (None, None) => (None, Vec::new()),
                }
            }
            Err(_) => (None, Vec::new()),
        };
        Ok(PressureProbe {
            root: root.to_path_buf(),
            hierarchy,
            levels,
        })
    }

    pub(super) fn sample(&self) -> io::Result<MemoryPressure> {
        let meminfo_path = self.root.join("proc/meminfo");
        let meminfo = parse_meminfo(&read_text(&meminfo_path)?).map_err(|what| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {what}", meminfo_path.display()),
            )
        })?;
        let mut sample = MemoryPressure {
            headroom_bytes: meminfo.available_bytes,
            limit_bytes: meminfo.total_bytes,
            stall_percent: None,
            critical: false,
            source: "/proc/meminfo MemAvailable".to_owned(),
        };
        let Some(h) = self.hierarchy else {
            return Ok(sample);
        };
        for (depth, level) in self.levels.iter().enumerate() {
            if depth == 0 && h.name == "v2" {
                sample.stall_percent = fs::read_to_string(level.dir.join("memory.pressure"))
                    .ok()
                    .and_then(|text| parse_stall(&text));
            }
            let Some(limit) = read_limit(&level.dir, h.limit_file) else {
                continue;
            };
            if limit >= meminfo.total_bytes || limit >= h.no_limit_at {
                continue;
            }
            let usage = read_limit(&level.dir, h.usage_file).unwrap_or(0);
            let file = level.file_cache(h).unwrap_or(0);
            let headroom = committable_bytes(limit, usage, file);
            sample.limit_bytes = sample.limit_bytes.min(limit);
            if headroom < sample.headroom_bytes {
                sample.headroom_bytes = headroom;
                sample.source = level.source(h, "{limit} - ({usage} - file cache)");
            }
        }
        Ok(sample)
    }
}

/// Memory a cgroup level with `limit` still lets its processes commit:
/// the limit less the usage without the file cache, which the kernel
/// reclaims before it kills. The one formula of the ring sizing's
/// committable memory and the elastic ring's headroom.
fn committable_bytes(limit: u64, usage: u64, file_cache: u64) -> u64 {
    limit.saturating_sub(usage.saturating_sub(file_cache))
}

/// The reclaimable file cache of a `memory.stat` text: `active_file +
/// inactive_file` (v1: the hierarchical `total_` lines, as the usage file
/// counts the children too). Missing lines count as 0.
fn file_cache_bytes(text: &str, v1: bool) -> u64 {
    let keys: [&str; 2] = if v1 {
        ["total_active_file", "total_inactive_file"]
    } else {
        ["active_file", "inactive_file"]
    };
    text.lines()
        .filter_map(|line| {
            let (key, value) = line.split_once(' ')?;
            keys.contains(&key)
                .then(|| value.trim().parse::<u64>().ok())?
        })
        .fold(0u64, u64::saturating_add)
}

/// `some avg10` of a PSI file ("some avg10=1.23 avg60=... total=...").
fn parse_stall(text: &str) -> Option<f64> {
    let line = text.lines().find(|l| l.starts_with("some "))?;
    let value = line
        .split_whitespace()
        .find_map(|f| f.strip_prefix("avg10="))?;
    value.parse::<f64>().ok().filter(|v| v.is_finite())
}

/// The page size (sysconf(3) `_SC_PAGESIZE`).
pub(super) fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(n).unwrap_or(4096).max(4096)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn fixture(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/cgroup")
            .join(name)
    }

    #[test]
    fn meminfo_parses_kb_lines() {
        let text = "MemTotal:       24731708 kB\nMemFree:        24097156 kB\n\
                    MemAvailable:   24443580 kB\nCached:           520848 kB\n\
                    HugePages_Total:       0\n";
        assert_eq!(
            parse_meminfo(text).unwrap(),
            Meminfo {
                total_bytes: 24731708 * 1024,
                available_bytes: 24443580 * 1024,
                cached_bytes: Some(520848 * 1024),
            }
        );
    }

    #[test]
    fn meminfo_errors_without_panicking() {
        assert_eq!(parse_meminfo("").unwrap_err(), "no MemTotal line");
        assert_eq!(
            parse_meminfo("MemTotal: 1 kB\n").unwrap_err(),
            "no MemAvailable line"
        );
        assert!(parse_meminfo("MemTotal: lots kB\nMemAvailable: 1 kB")
            .unwrap_err()
            .contains("MemTotal"));
        assert!(parse_meminfo("MemTotal: 18446744073709551615 kB\nMemAvailable: 1 kB").is_err());
        let info = parse_meminfo("MemTotal: 2 kB\nMemAvailable: 1 kB\nCached: x").unwrap();
        assert_eq!(info.cached_bytes, None);
        assert!(parse_meminfo("\u{0}:::\n\n:\nMemTotal").is_err());
    }

    #[test]
    fn proc_self_cgroup_v1_and_v2() {
        let hybrid = "9:name=systemd:/\n4:memory:/process_api/2d1d\n3:cpuset:/\n0::/\n";
        assert_eq!(
            parse_proc_self_cgroup(hybrid),
            CgroupPaths {
                v1_memory: Some("/process_api/2d1d".into()),
                v2: Some("/".into()),
            }
        );
        let combined = "5:cpu,memory,cpuacct:/docker/abc\n";
        assert_eq!(
            parse_proc_self_cgroup(combined).v1_memory.as_deref(),
            Some("/docker/abc")
        );
        let unified = "0::/user.slice/a:b.scope\n";
        assert_eq!(
            parse_proc_self_cgroup(unified),
            CgroupPaths {
                v1_memory: None,
                v2: Some("/user.slice/a:b.scope".into()),
            }
        );
        assert_eq!(
            parse_proc_self_cgroup("garbage\n4:memoryx:/a\n::\n:memory\n"),
            CgroupPaths::default()
        );
    }

    #[test]
    fn limit_text() {
        assert_eq!(parse_limit("max\n"), None);
        assert_eq!(parse_limit("8589934592\n"), Some(8 * GIB));
        assert_eq!(
            parse_limit("9223372036854771712"),
            Some(9223372036854771712)
        );
        assert_eq!(parse_limit(""), None);
        assert_eq!(parse_limit("-1"), None);
        assert_eq!(parse_limit("12 MB"), None);
    }

    fn snapshot(name: &str) -> MemorySnapshot {
        memory_snapshot_from(&fixture(name)).unwrap()
    }

    #[test]
    fn fixture_v1_limited() {
        let s = snapshot("v1_limited");
        assert_eq!((s.avail_bytes, s.ram_bytes), (5 * GIB, 8 * GIB));
        assert_eq!(
            s.ram_source,
            "cgroup v1 memory.limit_in_bytes in /sys/fs/cgroup/memory/docker/abc"
        );
        assert_eq!(
            s.avail_source,
            "cgroup v1 memory.limit_in_bytes - memory.usage_in_bytes in /sys/fs/cgroup/memory/docker/abc"
        );
        // 1 GiB of the 3 GiB used is file cache (memory.stat's
        // total_inactive_file): 6 GiB can still be committed.
        assert_eq!(s.committable_bytes, 6 * GIB);
        assert_eq!(
            s.committable_source,
            "cgroup v1 memory.limit_in_bytes - (memory.usage_in_bytes - file cache) in \
             /sys/fs/cgroup/memory/docker/abc"
        );
    }

    #[test]
    fn fixture_v1_unlimited() {
        let s = snapshot("v1_unlimited");
        assert_eq!((s.avail_bytes, s.ram_bytes), (50 * GIB, 64 * GIB));
        assert_eq!(s.avail_source, "/proc/meminfo MemAvailable");
        assert_eq!(s.ram_source, "/proc/meminfo MemTotal");
    }

    #[test]
    fn fixture_v1_namespaced_root() {
        // /proc/self/cgroup names /docker/abc, but the container's mount shows
        // its own cgroup as the root.
        let s = snapshot("v1_namespaced");
        assert_eq!((s.avail_bytes, s.ram_bytes), (3 * GIB, 4 * GIB));
        assert_eq!(
            s.ram_source,
            "cgroup v1 memory.limit_in_bytes in /sys/fs/cgroup/memory"
        );
    }

    #[test]
    fn fixture_v2_limited() {
        let s = snapshot("v2_limited");
        assert_eq!((s.avail_bytes, s.ram_bytes), (3 * GIB, 4 * GIB));
        assert!(s.cgroup_limited);
        assert_eq!(
            s.ram_source,
            "cgroup v2 memory.max in /sys/fs/cgroup/user.slice/app.scope"
        );
        assert_eq!(
            s.avail_source,
            "cgroup v2 memory.max - memory.current in /sys/fs/cgroup/user.slice/app.scope"
        );
        // Half of the 1 GiB used is file cache.
        assert_eq!(s.committable_bytes, 3 * GIB + GIB / 2);
    }

    #[test]
    fn fixture_v2_parent_is_tighter() {
        // app.scope allows 6 GiB, its parent user.slice 4 GiB with 3 GiB used.
        let s = snapshot("v2_nested");
        assert_eq!((s.avail_bytes, s.ram_bytes), (GIB, 4 * GIB));
        assert_eq!(
            s.avail_source,
            "cgroup v2 memory.max - memory.current in /sys/fs/cgroup/user.slice"
        );
    }

    #[test]
    fn fixture_v2_max() {
        let s = snapshot("v2_max");
        assert_eq!((s.avail_bytes, s.ram_bytes), (50 * GIB, 64 * GIB));
        assert_eq!(s.avail_source, "/proc/meminfo MemAvailable");
        assert_eq!(
            (s.committable_bytes, s.committable_source.as_str()),
            (50 * GIB, "/proc/meminfo MemAvailable")
        );
    }

    #[test]
    fn fixture_none() {
        let s = snapshot("none");
        assert_eq!((s.avail_bytes, s.ram_bytes), (50 * GIB, 64 * GIB));
        assert!(!s.cgroup_limited);
        assert_eq!(s.ram_source, "/proc/meminfo MemTotal");
    }

    #[test]
    fn missing_meminfo_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let err = memory_snapshot_from(dir.path()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        assert!(err.to_string().contains("proc/meminfo"), "{err}");
    }

    #[test]
    fn malformed_cgroup_files_are_no_limit() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fs::create_dir_all(root.join("proc/self")).unwrap();
        fs::create_dir_all(root.join("sys/fs/cgroup/memory/a")).unwrap();
        fs::write(
            root.join("proc/meminfo"),
            "MemTotal: 2097152 kB\nMemAvailable: 1048576 kB\n",
        )
        .unwrap();
        fs::write(root.join("proc/self/cgroup"), "4:memory:/a/../..\n").unwrap();
        fs::write(
            root.join("sys/fs/cgroup/memory/memory.limit_in_bytes"),
            "junk",
        )
        .unwrap();
        let s = memory_snapshot_from(root).unwrap();
        assert_eq!((s.avail_bytes, s.ram_bytes), (GIB, 2 * GIB));

        // A limit with an unreadable usage bounds avail by the limit alone.
        fs::write(
            root.join("sys/fs/cgroup/memory/memory.limit_in_bytes"),
            "536870912\n",
        )
        .unwrap();
        let s = memory_snapshot_from(root).unwrap();
        assert_eq!((s.avail_bytes, s.ram_bytes), (GIB / 2, GIB / 2));
        assert!(s.avail_source.contains("unreadable"), "{}", s.avail_source);
    }

    #[test]
    fn pressure_from_fixtures() {
        // v2: 4 GiB limit, 3 GiB used of which 1 GiB file cache (stat).
        let p = PressureProbe::from_root(&fixture("v2_limited"))
            .unwrap()
            .sample()
            .unwrap();
        eprintln!("{p:?}");
        // 1 GiB used, 512 MiB of it file cache (shmem is not reclaimable):
        // headroom 4 GiB − 512 MiB.
        assert_eq!(p.limit_bytes, 4 * GIB);
        assert_eq!(p.headroom_bytes, 4 * GIB - GIB / 2);
        assert_eq!(p.stall_percent, Some(2.5));
        assert_eq!(
            p.source,
            "cgroup v2 memory.max - (memory.current - file cache) in /sys/fs/cgroup/user.slice/app.scope"
        );
        let none = PressureProbe::from_root(&fixture("none"))
            .unwrap()
            .sample()
            .unwrap();
        assert_eq!(none.source, "/proc/meminfo MemAvailable");
        assert_eq!(
            (none.headroom_bytes, none.limit_bytes),
            (50 * GIB, 64 * GIB)
        );
        assert!(PressureProbe::from_root(Path::new("/nonexistent")).is_err());
    }

    #[test]
    fn stat_and_psi_text() {
        let v2 = "anon 100\nfile 900\nactive_file 300\ninactive_file 500\nshmem 100\n";
        assert_eq!(file_cache_bytes(v2, false), 800);
        let v1 = "cache 5\nactive_file 1\ntotal_active_file 40\ntotal_inactive_file 2\n";
        assert_eq!(file_cache_bytes(v1, true), 42);
        assert_eq!(file_cache_bytes("junk\nactive_file x\n", false), 0);
        let psi = "some avg10=12.50 avg60=1.00 avg300=0.00 total=5\nfull avg10=3.00 avg60=0 avg300=0 total=1\n";
        assert_eq!(parse_stall(psi), Some(12.5));
        assert_eq!(parse_stall("full avg10=1.0\n"), None);
        assert_eq!(parse_stall("some avg10=nan\n"), None);
    }

    #[test]
    fn pressure_on_this_machine() {
        let p = PressureProbe::new().unwrap().sample().unwrap();
        eprintln!("{p:?}");
        assert!(p.limit_bytes > 0 && p.headroom_bytes <= p.limit_bytes.max(p.headroom_bytes));
    }

    #[test]
    fn page_cache_is_reported() {
        assert!(page_cache_bytes().is_some());
    }
}
