//! Apple (macOS, iOS): the raw calls behind `sys`, mirroring `linux.rs`.
//!
//! Owns: turning each call's return value into an `io::Result`. Must never:
//! decide anything with the results (ring size, fallback warnings) or retry;
//! that is the caller's. This file cannot be tested on the Linux CI; it is
//! checked with `cargo check --target aarch64-apple-darwin`, so keep it to the
//! calls themselves.
//!
//! Apple's manual pages are cited from the developer.apple.com man-page
//! archive (`ManPages_iPhoneOS`, the same BSD pages macOS ships).

use std::ffi::CStr;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use super::{DirectOpenError, MemoryPressure, MemorySnapshot};

/// How the refused call is named in an `Unsupported` error.
pub(super) const DIRECT_IO_CALL: &str = "fcntl F_NOCACHE";

/// `open(2)` with `O_RDONLY | O_CLOEXEC` (std's flags), then
/// `fcntl(fd, F_NOCACHE, 1)`: "Turns data caching off/on. A non-zero value
/// in arg turns data caching off."
/// open(2): <https://developer.apple.com/library/archive/documentation/System/Conceptual/ManPages_iPhoneOS/man2/open.2.html>
/// fcntl(2): <https://developer.apple.com/library/archive/documentation/System/Conceptual/ManPages_iPhoneOS/man2/fcntl.2.html>
pub(super) fn open_direct(path: &Path) -> Result<File, DirectOpenError> {
    let file = File::open(path).map_err(DirectOpenError::Other)?;
    // SAFETY: `file` owns a valid descriptor for the whole call; F_NOCACHE
    // takes an int argument and touches no memory of ours.
    let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_NOCACHE, 1) };
    if rc == -1 {
        return Err(DirectOpenError::Refused(io::Error::last_os_error()));
    }
    Ok(file)
}

/// One `pread(2)` (documented on the read(2) page): bytes read (0 at end of
/// file) or the errno.
/// <https://developer.apple.com/library/archive/documentation/System/Conceptual/ManPages_iPhoneOS/man2/read.2.html>
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
/// open(2): "O_NONBLOCK  do not block on open or for data to become
/// available"; "If the O_NONBLOCK flag is specified, do not wait for the
/// device or file to be ready or available."
/// <https://developer.apple.com/library/archive/documentation/System/Conceptual/ManPages_iPhoneOS/man2/open.2.html>
pub(super) fn open_nonblocking(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
}

/// Turns direct I/O on for an open descriptor as [`open_direct`] does:
/// fcntl(2) `F_NOCACHE` "Turns data caching off/on. A non-zero value in arg
/// turns data caching off."
/// <https://developer.apple.com/library/archive/documentation/System/Conceptual/ManPages_iPhoneOS/man2/fcntl.2.html>
pub(super) fn set_direct(fd: RawFd) -> Result<(), DirectOpenError> {
    // SAFETY: plain syscall on an integer descriptor; F_NOCACHE takes an
    // int argument and touches no memory of ours.
    let rc = unsafe { libc::fcntl(fd, libc::F_NOCACHE, 1) };
    if rc == -1 {
        return Err(DirectOpenError::Refused(io::Error::last_os_error()));
    }
    Ok(())
}

/// Clears `O_NONBLOCK` on `fd`, leaving its other status flags as they are.
/// fcntl(2) `F_GETFL`/`F_SETFL`: "Get descriptor status flags"/"Set
/// descriptor status flags to arg" (O_NONBLOCK among them).
/// <https://developer.apple.com/library/archive/documentation/System/Conceptual/ManPages_iPhoneOS/man2/fcntl.2.html>
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

/// `kill(pid, 0)`: whether the process exists (`EPERM`: it does, owned by
/// someone else). `pid` is positive (the caller checks).
/// kill(2): "A value of 0 ... will cause error checking to be performed (with
/// no signal being sent). This can be used to check the validity of pid";
/// `ESRCH`: "No process or process group can be found corresponding to that
/// specified by pid".
/// <https://developer.apple.com/library/archive/documentation/System/Conceptual/ManPages_iPhoneOS/man2/kill.2.html>
pub(super) fn process_exists(pid: libc::pid_t) -> bool {
    // SAFETY: signal 0 sends nothing; the call only checks `pid` and touches
    // no memory of ours. `pid > 0`, so it never addresses a process group.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// No-op: Darwin has no `posix_fadvise` and no per-file cache purge, and a
/// descriptor with `F_NOCACHE` does not fill the cache to begin with.
pub(super) fn drop_file_cache(_fd: RawFd) -> io::Result<()> {
    Ok(())
}

/// Darwin has no system-wide "page cache bytes" figure like Linux's `Cached:`.
pub(super) fn page_cache_bytes() -> Option<u64> {
    None
}

/// `$HOME/Library/Caches`: the user's caches directory, which
/// FileManager's `.cachesDirectory` in the `.userDomainMask` names
/// (<https://developer.apple.com/documentation/foundation/filemanager/searchpathdirectory/cachesdirectory>;
/// "Library/Caches" in the File System Programming Guide,
/// <https://developer.apple.com/library/archive/documentation/FileManagement/Conceptual/FileSystemProgrammingGuide/FileSystemOverview/FileSystemOverview.html>).
/// A relative or empty `HOME` counts as unset.
pub(super) fn user_cache_home(
    env: &dyn Fn(&str) -> Option<std::ffi::OsString>,
) -> Option<std::path::PathBuf> {
    env("HOME")
        .map(std::path::PathBuf::from)
        .filter(|p| p.is_absolute())
        .map(|home| home.join("Library/Caches"))
}

/// `hw.memsize` (physical bytes, a 64-bit integer, sysctl(3)) and
/// `kern.memorystatus_level` (percent of memory available before the
/// memory-status (jetsam) thresholds; an int `SYSCTL_INT` in XNU's
/// `bsd/kern/kern_memorystatus.c`, not in Apple's man pages).
/// sysctlbyname(3): <https://developer.apple.com/library/archive/documentation/System/Conceptual/ManPages_iPhoneOS/man3/sysctlbyname.3.html>
/// sysctl(3) `hw.memsize`: <https://developer.apple.com/library/archive/documentation/System/Conceptual/ManPages_iPhoneOS/man3/sysctl.3.html>
/// XNU: <https://github.com/apple-oss-distributions/xnu/blob/main/bsd/kern/kern_memorystatus.c>
pub(super) fn memory_snapshot() -> io::Result<MemorySnapshot> {
    let ram_bytes = sysctl_uint(c"hw.memsize")?;
    let level = sysctl_uint(c"kern.memorystatus_level")?.min(100);
    // ram × level fits u128 and the quotient is at most ram, so it fits u64.
    let avail_bytes = (u128::from(ram_bytes) * u128::from(level) / 100) as u64;
    Ok(MemorySnapshot {
        avail_bytes,
        ram_bytes,
        avail_source: "sysctl hw.memsize × kern.memorystatus_level / 100".to_owned(),
        ram_source: "sysctl hw.memsize".to_owned(),
        cgroup_limited: false,
        // No cgroup: the memory-status level already counts what is
        // reclaimable.
        committable_bytes: avail_bytes,
        committable_source: "sysctl hw.memsize × kern.memorystatus_level / 100".to_owned(),
    })
}

/// `sysctlbyname(name)` for an unsigned integer of 4 or 8 bytes.
fn sysctl_uint(name: &CStr) -> io::Result<u64> {
    let mut value = [0u8; 8];
    let mut len: libc::size_t = value.len();
    // SAFETY: `name` is NUL-terminated; `value` is writable for `len` bytes
    // and `len` is a valid in/out pointer; no new value is set (NULL, 0).
    let rc = unsafe {
        libc::sysctlbyname(
            name.as_ptr(),
            value.as_mut_ptr().cast(),
            &mut len,
            std::ptr::null_mut(),
            0,
        )
    };
    let name = name.to_string_lossy();
    if rc == -1 {
        let err = io::Error::last_os_error();
        return Err(io::Error::new(err.kind(), format!("sysctl {name}: {err}")));
    }
    match len {
        4 => Ok(u64::from(u32::from_ne_bytes([
            value[0], value[1], value[2], value[3],
        ]))),
        8 => Ok(u64::from_ne_bytes(value)),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("sysctl {name}: {len}-byte value, expected 4 or 8"),
        )),
    }
}

/// Extra `mmap` flags for the ring's reservation. mmap(2) on macOS: anonymous private pages are committed when first
/// touched (https://developer.apple.com/library/archive/documentation/Performance/Conceptual/ManagingMemory/Articles/AboutMemory.html).
pub(super) const MAP_RESERVE_ONLY: libc::c_int = 0;

/// The page size (sysconf(3) `_SC_PAGESIZE`).
pub(super) fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(n).unwrap_or(4096).max(4096)
}

/// `madvise(addr, len, MADV_WILLNEED)`: "Indicates that the application
/// expects to access this address range soon" (advice only; contents
/// unchanged). Darwin has no populate advice like Linux's.
/// madvise(2): <https://developer.apple.com/library/archive/documentation/System/Conceptual/ManPages_iPhoneOS/man2/madvise.2.html>
pub(super) fn populate(addr: *mut libc::c_void, len: usize) -> io::Result<bool> {
    // SAFETY: `addr..addr + len` is inside a mapping the caller owns;
    // WILLNEED is advice only.
    if unsafe { libc::madvise(addr, len, libc::MADV_WILLNEED) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // Advice: nothing is known to be committed.
    Ok(false)
}

/// The huge-page size the ring's base is aligned to, as on Linux (macOS
/// itself picks page sizes: 16 KiB pages on Apple silicon).
pub(crate) const HUGE_PAGE_BYTES: usize = 2 << 20;

/// Nothing to ask: Darwin's madvise(2) has no huge-page advice (its list:
/// <https://developer.apple.com/library/archive/documentation/System/Conceptual/ManPages_iPhoneOS/man2/madvise.2.html>),
/// and superpages exist only through `mach_vm_allocate`'s
/// `VM_FLAGS_SUPERPAGE_SIZE_*` flags at allocation, which pin the memory
/// (no lazy ring). `Ok(false)`.
pub(super) fn advise_huge_pages(_addr: *mut libc::c_void, _len: usize) -> io::Result<bool> {
    Ok(false)
}

/// `madvise(addr, len, MADV_FREE_REUSABLE)`: the pages may be reclaimed at
/// once and stop counting in the process's footprint (the advice
/// libmalloc gives freed memory); their contents are unspecified until
/// written again. Documented in `<sys/mman.h>` and XNU's `bsd/kern/kern_mman.c`
/// (not in Apple's madvise(2) page):
/// <https://github.com/apple-oss-distributions/xnu/blob/main/bsd/sys/mman.h>
pub(super) fn discard(addr: *mut libc::c_void, len: usize) -> io::Result<()> {
    // SAFETY: `addr..addr + len` is inside a mapping the caller owns, and
    // the caller makes sure nobody uses those bytes meanwhile.
    if unsafe { libc::madvise(addr, len, libc::MADV_FREE_REUSABLE) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The elastic ring's probe on Apple: `kern.memorystatus_level` (percent of
/// memory available, as in [`memory_snapshot`]) and
/// `kern.memorystatus_vm_pressure_level`, the level behind the dispatch
/// memory-pressure source (`DISPATCH_MEMORYPRESSURE_NORMAL` 1, `_WARN` 2,
/// `_CRITICAL` 4: "The system memory pressure condition has changed to
/// critical ... Applications should free as much memory as possible").
/// DISPATCH_SOURCE_TYPE_MEMORYPRESSURE: <https://developer.apple.com/documentation/dispatch/dispatch_source_type_memorypressure>
/// The level values: <https://developer.apple.com/documentation/dispatch/dispatch_source_memorypressure_flags_t>
/// The sysctl: XNU `bsd/kern/kern_memorystatus_notify.c`,
/// <https://github.com/apple-oss-distributions/xnu/blob/main/bsd/kern/kern_memorystatus_notify.c>
pub(super) struct PressureProbe {
    ram_bytes: u64,
}

impl PressureProbe {
    pub(super) fn new() -> io::Result<PressureProbe> {
        Ok(PressureProbe {
            ram_bytes: sysctl_uint(c"hw.memsize")?,
        })
    }

    /// No files to read on Apple: the probe is sysctls.
    pub(super) fn from_root(_root: &std::path::Path) -> io::Result<PressureProbe> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "the memory-pressure probe reads sysctls here, not files",
        ))
    }

    pub(super) fn sample(&self) -> io::Result<MemoryPressure> {
        let level = sysctl_uint(c"kern.memorystatus_level")?.min(100);
        // Unreadable (a sandbox): the available share alone decides.
        let vm_level = sysctl_uint(c"kern.memorystatus_vm_pressure_level").unwrap_or(1);
        Ok(MemoryPressure {
            // ram × level fits u128 and the quotient is at most ram.
            headroom_bytes: (u128::from(self.ram_bytes) * u128::from(level) / 100) as u64,
            limit_bytes: self.ram_bytes,
            stall_percent: None,
            critical: vm_level >= 4,
            source: "sysctl kern.memorystatus_level, kern.memorystatus_vm_pressure_level"
                .to_owned(),
        })
    }
}
