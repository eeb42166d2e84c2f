//! Every platform call the library makes: opening a file for direct I/O,
//! opening a file without ever blocking on a FIFO or device, positional reads,
//! dropping a file's cached pages, asking whether a process exists, and the
//! memory probe the ring's auto-sizing starts from (docs/c-api.md, "Ring sizing").
//!
//! This module owns the types the rest of the crate sees ([`DirectIo`],
//! [`OpenedFile`], [`FileKind`], [`OpenRegularError`], [`ReadError`],
//! [`AlignedBuffer`], [`MemorySnapshot`]) and the few lines that
//! are the same on every POSIX system (the `pread` retry loop, the direct-I/O
//! fallback rule); `linux.rs` and `apple.rs` each hold the raw calls for one
//! platform behind the same private names, so everything above `sys` compiles
//! unchanged on both.
//!
//! It must never hold policy: it does not size the ring, decide whether a
//! buffered fallback deserves a warning, or retry a failed read later. It
//! reports what the OS said, with the errno intact, and the caller decides.
//!
//! Errors: where the caller passed the path (open, read), an `io::Error` is
//! returned unchanged so its errno survives; the caller adds the path with
//! `Error::io`, as the rest of the crate does. Where `sys` chose the path
//! itself (`/proc/meminfo`, cgroup files), the message names it.

use std::fmt;
use std::fs::{File, FileType, Metadata};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

#[cfg(target_vendor = "apple")]
mod apple;
#[cfg(target_vendor = "apple")]
use apple as imp;

#[cfg(target_os = "linux")]
mod linux;
#[cfg(target_os = "linux")]
use linux as imp;

#[cfg(not(any(target_os = "linux", target_vendor = "apple")))]
compile_error!("smoe supports Linux and Apple platforms only");

/// The huge-page size a ring that asks for huge pages is aligned to.
pub(crate) use imp::HUGE_PAGE_BYTES;

/// How to open the vault for the I/O workers (C `smoe_config.direct_io`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum DirectIo {
    /// Ask for direct I/O; if the filesystem refuses it, open buffered.
    #[default]
    Auto,
    /// Ask for direct I/O; if the filesystem refuses it, fail with
    /// [`io::ErrorKind::Unsupported`].
    Require,
    /// Open buffered, through the page cache.
    Off,
}

/// A file opened by [`open_for_streaming`].
#[derive(Debug)]
pub struct OpenedFile {
    /// The open, read-only, close-on-exec file.
    pub file: File,
    /// True if reads bypass the page cache (`O_DIRECT` on Linux,
    /// `F_NOCACHE` on Apple). On Linux a `true` here can still meet a
    /// filesystem that rejects the reads themselves: see [`probe_direct_read`].
    pub direct: bool,
}

/// Opens `path` read-only for the I/O workers.
///
/// Linux: `open(O_RDONLY | O_CLOEXEC | O_DIRECT)`; a filesystem without
/// direct I/O refuses with `EINVAL` (procfs, tmpfs before Linux 6.6, some
/// FUSE and network filesystems).
/// Apple: `open(O_RDONLY | O_CLOEXEC)` then `fcntl(F_NOCACHE, 1)`; refusal is
/// the `fcntl` failing.
///
/// On refusal, [`DirectIo::Auto`] opens the file again buffered and returns
/// `direct: false`; [`DirectIo::Require`] returns an error of kind
/// [`io::ErrorKind::Unsupported`] naming the call and the errno. Any other
/// failure (no such file, permission) is returned unchanged, errno intact.
pub fn open_for_streaming(path: &Path, mode: DirectIo) -> io::Result<OpenedFile> {
    if mode == DirectIo::Off {
        return open_buffered(path);
    }
    match imp::open_direct(path) {
        Ok(file) => Ok(OpenedFile { file, direct: true }),
        Err(DirectOpenError::Other(err)) => Err(err),
        Err(DirectOpenError::Refused(err)) => match mode {
            DirectIo::Require => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "the filesystem refused direct I/O ({}): {err}",
                    imp::DIRECT_IO_CALL
                ),
            )),
            DirectIo::Auto | DirectIo::Off => open_buffered(path),
        },
    }
}

fn open_buffered(path: &Path) -> io::Result<OpenedFile> {
    // std opens with O_RDONLY | O_CLOEXEC on both platforms.
    let file = File::open(path)?;
    Ok(OpenedFile {
        file,
        direct: false,
    })
}

/// Why a direct-I/O open failed, as the platform file classifies it.
pub(crate) enum DirectOpenError {
    /// The filesystem does not do direct I/O; a buffered open may work.
    Refused(io::Error),
    /// The open itself failed (no such file, permission, ...).
    Other(io::Error),
}

/// What a path names, as `stat` sees it: for messages ("is a FIFO") and for
/// refusing anything but a regular file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FileKind {
    /// A regular file.
    Regular,
    /// A directory.
    Directory,
    /// A symbolic link (only `lstat` reports one).
    Symlink,
    /// A FIFO (named pipe): opening it for reading waits for a writer.
    Fifo,
    /// A Unix-domain socket.
    Socket,
    /// A character device (`/dev/null`, a tty).
    CharDevice,
    /// A block device (a disk).
    BlockDevice,
    /// Anything else the platform may have (e.g. a whiteout).
    Other,
}

impl FileKind {
    /// The kind of `file_type`.
    pub fn of(file_type: FileType) -> FileKind {
        if file_type.is_file() {
            FileKind::Regular
        } else if file_type.is_dir() {
            FileKind::Directory
        } else if file_type.is_symlink() {
            FileKind::Symlink
        } else if file_type.is_fifo() {
            FileKind::Fifo
        } else if file_type.is_socket() {
            FileKind::Socket
        } else if file_type.is_char_device() {
            FileKind::CharDevice
        } else if file_type.is_block_device() {
            FileKind::BlockDevice
        } else {
            FileKind::Other
        }
    }

    /// The kind with its article, to follow "is": "a FIFO", "a directory".
    pub fn describe(self) -> &'static str {
        match self {
            FileKind::Regular => "a regular file",
            FileKind::Directory => "a directory",
            FileKind::Symlink => "a symbolic link",
            FileKind::Fifo => "a FIFO",
            FileKind::Socket => "a socket",
            FileKind::CharDevice => "a character device",
            FileKind::BlockDevice => "a block device",
            FileKind::Other => "not a regular file",
        }
    }
}

impl fmt::Display for FileKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.describe())
    }
}

/// Why [`open_regular`] returned no file.
#[derive(Debug)]
pub enum OpenRegularError {
    /// The OS refused (no such file, permission, ...), errno intact.
    Os(io::Error),
    /// The path (symbolic links followed) names something other than a
    /// regular file; it was not opened, or was closed again at once.
    NotRegular(FileKind),
}

/// Opens `path` read-only and close-on-exec if, and only if, it is a regular
/// file (symbolic links followed), and never blocks doing so.
///
/// `open(2)` of a FIFO for reading waits until a writer opens it, forever if
/// none does; opening a device can have side effects. So: `stat` first, and
/// refuse anything that is not a regular file without opening it. The open
/// itself passes `O_NONBLOCK`, so a path swapped for a FIFO between the
/// `stat` and the `open` still returns at once; `fstat` of the descriptor
/// then decides, and a regular file gets `O_NONBLOCK` cleared again, so it
/// reads like any other. Returns the file and its `fstat` metadata.
pub fn open_regular(path: &Path) -> Result<(File, Metadata), OpenRegularError> {
    let before = std::fs::metadata(path).map_err(OpenRegularError::Os)?;
    let kind = FileKind::of(before.file_type());
    if kind != FileKind::Regular {
        return Err(OpenRegularError::NotRegular(kind));
    }
    let file = imp::open_nonblocking(path).map_err(OpenRegularError::Os)?;
    let metadata = file.metadata().map_err(OpenRegularError::Os)?;
    let kind = FileKind::of(metadata.file_type());
    if kind != FileKind::Regular {
        return Err(OpenRegularError::NotRegular(kind));
    }
    imp::clear_nonblocking(file.as_raw_fd()).map_err(OpenRegularError::Os)?;
    Ok((file, metadata))
}

/// Opens the regular file at `path` for the I/O workers as
/// [`open_regular`] does (never waiting on a FIFO, refusing anything but a
/// regular file), then, unless `mode` is [`DirectIo::Off`], turns direct
/// I/O on for it (Linux `O_DIRECT` through `fcntl(F_SETFL)`, Apple
/// `F_NOCACHE`). Returns the file, its metadata (taken from the open
/// descriptor: the file read, whatever the path names later) and whether
/// reads bypass the page cache. A refusal of direct I/O is as in
/// [`open_for_streaming`]: `Auto` keeps the file buffered, `Require` is an
/// error of kind [`io::ErrorKind::Unsupported`].
pub fn open_regular_for_streaming(
    path: &Path,
    mode: DirectIo,
) -> Result<(OpenedFile, Metadata), OpenRegularError> {
    let (file, metadata) = open_regular(path)?;
    if mode == DirectIo::Off {
        return Ok((
            OpenedFile {
                file,
                direct: false,
            },
            metadata,
        ));
    }
    match imp::set_direct(file.as_raw_fd()) {
        Ok(()) => Ok((OpenedFile { file, direct: true }, metadata)),
        Err(DirectOpenError::Other(err)) => Err(OpenRegularError::Os(err)),
        Err(DirectOpenError::Refused(err)) => match mode {
            DirectIo::Require => Err(OpenRegularError::Os(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "the filesystem refused direct I/O ({}): {err}",
                    imp::DIRECT_IO_CALL
                ),
            ))),
            DirectIo::Auto | DirectIo::Off => Ok((
                OpenedFile {
                    file,
                    direct: false,
                },
                metadata,
            )),
        },
    }
}

/// Whether a process with this id exists (`kill(pid, 0)`): `true` also when
/// it exists but belongs to another user (`EPERM`), and for any answer other
/// than "no such process" (`ESRCH`). An id that no process can have (0,
/// above `pid_t`'s range) is `false`: `kill` would read 0 as "my process
/// group". A process in another pid namespace is invisible here.
pub fn process_exists(pid: u32) -> bool {
    match i32::try_from(pid) {
        Ok(pid) if pid > 0 => imp::process_exists(pid),
        _ => false,
    }
}

/// Reads `align` bytes at offset 0 of `file` into an `align`-aligned buffer,
/// once (retrying only `EINTR`), so a caller that got `direct: true` learns
/// whether the filesystem accepts direct reads as well as direct opens (on
/// Linux some accept `O_DIRECT` at open and fail every read with `EINVAL`).
///
/// A short read (file smaller than `align`) is success: the read was
/// accepted. `align` must be a power of two, else `InvalidInput`.
pub fn probe_direct_read(file: &File, align: usize) -> io::Result<()> {
    let mut buffer = AlignedBuffer::zeroed(align, align)?;
    loop {
        match imp::pread(file.as_raw_fd(), buffer.as_mut_slice(), 0) {
            Ok(_) => return Ok(()),
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            Err(err) => return Err(err),
        }
    }
}

/// A heap buffer of zero bytes whose start is aligned to a power of two, for
/// direct reads outside the ring (which has its own allocation): the probe
/// of [`probe_direct_read`] and the tool's `smoe verify`.
pub struct AlignedBuffer {
    ptr: std::ptr::NonNull<u8>,
    layout: std::alloc::Layout,
}

impl AlignedBuffer {
    /// `len` zero bytes starting at a multiple of `align`.
    ///
    /// `InvalidInput` when `align` is not a power of two, `len` is 0 or the
    /// rounded size overflows; `OutOfMemory` when the allocation fails (a
    /// size the machine cannot give is an error, never an abort).
    pub fn zeroed(len: usize, align: usize) -> io::Result<Self> {
        let layout = std::alloc::Layout::from_size_align(len, align)
            .ok()
            .filter(|layout| layout.size() > 0)
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "cannot lay out an aligned buffer of {len} bytes at alignment {align} \
                         (the alignment must be a power of two, the size nonzero)"
                    ),
                )
            })?;
        // SAFETY: `layout` has a non-zero size (checked above).
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = std::ptr::NonNull::new(ptr).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::OutOfMemory,
                format!("cannot allocate an aligned buffer of {len} bytes"),
            )
        })?;
        Ok(AlignedBuffer { ptr, layout })
    }

    /// The whole buffer.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` points to `layout.size()` initialised (zeroed at
        // allocation) bytes owned by `self`; `&self` excludes any `&mut`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.layout.size()) }
    }

    /// The whole buffer, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` points to `layout.size()` initialised (zeroed) bytes
        // owned by `self`, and `&mut self` makes this the only borrow.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.layout.size()) }
    }
}

impl Drop for AlignedBuffer {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `alloc_zeroed(self.layout)` and is freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// An anonymous private mapping, reserved but not committed: the ring's
/// memory. Pages are zero and cost nothing until first touched (a worker
/// reading into a slot), and the address range stays fixed for the
/// mapping's life, so a host that wrapped it once stays valid.
pub struct Reservation {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; who touches which
// bytes when is decided by its owner (the ring's slot table).
unsafe impl Send for Reservation {}
// SAFETY: as above.
unsafe impl Sync for Reservation {}

impl Reservation {
    /// Reserves `len` bytes starting at a multiple of `align` (a power of
    /// two, at least the page size). `OutOfMemory` when the address space
    /// or the OS's overcommit policy refuses.
    pub fn new(len: usize, align: usize) -> io::Result<Reservation> {
        let page = imp::page_size();
        if len == 0 || !align.is_power_of_two() || align < page {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("cannot reserve {len} bytes at alignment {align} (page size {page})"),
            ));
        }
        // mmap aligns to a page; reserve `align` more and trim both ends.
        let total = len.checked_add(align).ok_or(io::ErrorKind::OutOfMemory)?;
        // SAFETY: a fresh anonymous private mapping at an address the kernel
        // chooses; no existing memory is affected (mmap(2)).
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                total,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANON | imp::MAP_RESERVE_ONLY,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(
                io::ErrorKind::OutOfMemory,
                format!("cannot reserve {total} bytes of address space: {e}"),
            ));
        }
        let start = raw as usize;
        let aligned = start.next_multiple_of(align);
        let head = aligned - start;
        let tail = total - head - len;
        // SAFETY: both ranges lie inside the mapping made above, are page
        // multiples (`start`, `align` and `len` are page aligned: `len` is
        // a whole number of slots, each a multiple of the alignment) and
        // are not used by anything; unmapping them is munmap(2)'s contract.
        unsafe {
            if head > 0 {
                libc::munmap(raw, head);
            }
            if tail > 0 {
                libc::munmap((aligned + len) as *mut libc::c_void, tail);
            }
        }
        let ptr = std::ptr::NonNull::new(aligned as *mut u8).ok_or(io::ErrorKind::OutOfMemory)?;
        Ok(Reservation { ptr, len })
    }

    /// The first byte.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// `[offset, offset + len)` as a raw range of the mapping, or
    /// `InvalidInput` when it is not inside it or not page aligned.
    fn range(&self, offset: usize, len: usize) -> io::Result<*mut libc::c_void> {
        let page = imp::page_size();
        let inside = offset
            .checked_add(len)
            .is_some_and(|end| end <= self.len && len > 0);
        if !inside || offset % page != 0 || len % page != 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "range of {len} bytes at offset {offset} is not a page-aligned part of the \
                     {} reserved bytes",
                    self.len
                ),
            ));
        }
        // SAFETY: `offset < len` of the mapping (checked above).
        Ok(unsafe { self.ptr.as_ptr().add(offset) }.cast())
    }

    /// Asks the OS to back the whole mapping with transparent huge pages
    /// where it can (one fault and one page-table entry per huge page
    /// instead of per 4 KiB page). Advice: contents never change. Linux:
    /// `madvise(MADV_HUGEPAGE)`; `Ok(false)` where the kernel has no
    /// transparent huge pages (`EINVAL`). Apple: nothing to ask, `Ok(false)`.
    pub fn advise_huge_pages(&self) -> io::Result<bool> {
        imp::advise_huge_pages(self.ptr.as_ptr().cast(), self.len)
    }

    /// Asks the OS to commit the pages of `[offset, offset + len)` now,
    /// without changing their contents, so it is safe while other threads
    /// read or write them. Linux: `madvise(MADV_POPULATE_WRITE)` (5.14+),
    /// falling back to `MADV_WILLNEED` where the kernel does not know it;
    /// Apple: `madvise(MADV_WILLNEED)`.
    /// `Ok(true)` when the pages are committed now, `Ok(false)` when the
    /// call was only advice (the fallback, Apple).
    pub(crate) fn populate(&self, offset: usize, len: usize) -> io::Result<bool> {
        let at = self.range(offset, len)?;
        imp::populate(at, len)
    }

    /// Releases the pages of `[offset, offset + len)`: they cost no memory
    /// until touched again, and read as zero (Linux) or as unspecified bytes
    /// (Apple) afterwards. Linux: `madvise(MADV_DONTNEED)`; Apple:
    /// `madvise(MADV_FREE_REUSABLE)`. The caller makes sure no one reads or
    /// writes the range meanwhile.
    pub(crate) fn discard(&self, offset: usize, len: usize) -> io::Result<()> {
        let at = self.range(offset, len)?;
        imp::discard(at, len)
    }

    /// Locks the whole mapping in memory (`mlock(2)`): every page is
    /// committed now and never paged out. The error is the OS's, errno
    /// intact (`ENOMEM`: over `RLIMIT_MEMLOCK`; `EPERM`: no privilege;
    /// `EAGAIN`: some pages could not be locked).
    pub(crate) fn lock(&self) -> io::Result<()> {
        // SAFETY: the range is the mapping this value owns; mlock only
        // faults its pages in and pins them, their contents are unchanged.
        let rc = unsafe { libc::mlock(self.ptr.as_ptr().cast(), self.len) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

/// What the elastic ring's monitor sees of memory, one sample.
#[derive(Clone, Debug, PartialEq)]
pub struct MemoryPressure {
    /// Bytes that may still be committed before pressure: the smallest of
    /// the system's available memory and, at each level of the process's
    /// memory cgroup with a limit, `limit − (usage − file cache)` (page
    /// cache is reclaimable, so it does not count as use).
    pub headroom_bytes: u64,
    /// The tightest limit seen (the cgroup's, else physical memory).
    pub limit_bytes: u64,
    /// Share of the last 10 s some task of the cgroup stalled on memory
    /// (cgroup v2 `memory.pressure` `some avg10`, percent); `None` where
    /// there is no such figure (cgroup v1, Apple).
    pub stall_percent: Option<f64>,
    /// The OS says memory is critically short (Apple's memory-pressure
    /// level "critical"); always false on Linux, where the headroom says it.
    pub critical: bool,
    /// Where the headroom came from, e.g. "cgroup v2 memory.max in
    /// /sys/fs/cgroup/app".
    pub source: String,
}

/// Reads [`MemoryPressure`] samples; set up once (it finds the process's
/// cgroup), then sampled by the monitor thread every few hundred
/// milliseconds. Each sample reads a few small kernel files (Linux) or two
/// sysctls (Apple).
pub struct PressureProbe(imp::PressureProbe);

impl PressureProbe {
    /// Finds what to read. Errors name the file or sysctl that failed.
    pub fn new() -> io::Result<PressureProbe> {
        imp::PressureProbe::new().map(PressureProbe)
    }

    /// [`PressureProbe::new`] reading every file under `root` instead of
    /// `/` (tests); `Unsupported` on Apple, whose probe reads sysctls.
    pub fn from_root(root: &Path) -> io::Result<PressureProbe> {
        imp::PressureProbe::from_root(root).map(PressureProbe)
    }

    /// One sample.
    pub fn sample(&self) -> io::Result<MemoryPressure> {
        self.0.sample()
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        // SAFETY: `[ptr, ptr + len)` is the mapping `new` kept, unmapped
        // once, here.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

/// A positional read that did not fill its buffer.
#[derive(Debug)]
pub struct ReadError {
    /// Bytes read (into the front of the buffer) before the failure.
    pub done: usize,
    /// Bytes asked for: the buffer's length.
    pub wanted: usize,
    /// File offset the read started at.
    pub offset: u64,
    /// What stopped it: the OS error (errno intact), or
    /// [`io::ErrorKind::UnexpectedEof`] "unexpected end of file".
    pub error: io::Error,
}

impl ReadError {
    /// The sentence a person needs, naming the file:
    /// "read 12288 of 16384 bytes at offset 81920 in experts.smoe: unexpected
    /// end of file".
    pub fn message(&self, path: &Path) -> String {
        format!(
            "read {} of {} bytes at offset {} in {}: {}",
            self.done,
            self.wanted,
            self.offset,
            path.display(),
            self.error
        )
    }
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "read {} of {} bytes at offset {}: {}",
            self.done, self.wanted, self.offset, self.error
        )
    }
}

impl std::error::Error for ReadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// Fills `buf` from `file` starting at `offset` with `pread(2)`, retrying on
/// `EINTR` and continuing after short reads, without moving the file's
/// cursor (so many threads may share one descriptor).
///
/// Stops at end of file (`pread` returns 0) with an
/// [`io::ErrorKind::UnexpectedEof`] error, and at any other OS error with
/// that error; [`ReadError::done`] says how far it got. An `offset` past the
/// platform's `off_t` is `InvalidInput`. For direct I/O the caller keeps
/// `buf`, `offset` and the length aligned; this function does not check.
pub fn read_at_exact(file: &File, buf: &mut [u8], offset: u64) -> Result<(), ReadError> {
    let fd = file.as_raw_fd();
    read_exact_with(buf, offset, |chunk, at| imp::pread(fd, chunk, at))
}

/// One `pread` call asks for at most this much: macOS rejects a count above
/// `INT_MAX` with `EINVAL` and Linux caps one read at 2 GiB − 4 KiB anyway.
/// 1 GiB is a multiple of every alignment a vault may use, so each chunk
/// stays aligned for direct I/O.
const MAX_READ_CHUNK: usize = 1 << 30;

/// [`read_at_exact`]'s loop with the read call passed in, so the retry and
/// short-read handling can be tested with a scripted reader.
fn read_exact_with(
    buf: &mut [u8],
    offset: u64,
    mut read: impl FnMut(&mut [u8], u64) -> io::Result<usize>,
) -> Result<(), ReadError> {
    let wanted = buf.len();
    let mut done = 0usize;
    let fail = |done, error| ReadError {
        done,
        wanted,
        offset,
        error,
    };
    while done < wanted {
        // `done <= wanted <= isize::MAX`, so this cannot overflow a u64.
        let at = offset.checked_add(done as u64).ok_or_else(|| {
            fail(
                done,
                io::Error::new(io::ErrorKind::InvalidInput, "offset overflows u64"),
            )
        })?;
        let end = wanted.min(done.saturating_add(MAX_READ_CHUNK));
        match read(&mut buf[done..end], at) {
            Ok(0) => {
                return Err(fail(
                    done,
                    io::Error::new(io::ErrorKind::UnexpectedEof, "unexpected end of file"),
                ))
            }
            // `min` keeps a misbehaving reader from pushing `done` past `end`.
            Ok(n) => done += n.min(end - done),
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            Err(err) => return Err(fail(done, err)),
        }
    }
    Ok(())
}

/// Asks the kernel to drop `file`'s pages from the page cache.
///
/// Linux: `posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED)` (advisory; dirty or
/// mapped pages may stay). Apple: a no-op returning `Ok`: there is no
/// per-file equivalent, and a descriptor with `F_NOCACHE` does not fill the
/// cache in the first place.
pub fn drop_file_cache(file: &File) -> io::Result<()> {
    imp::drop_file_cache(file.as_raw_fd())
}

/// The user's cache directory, from the environment `env` reads: Linux
/// `$XDG_CACHE_HOME`, else `$HOME/.cache` (the XDG base directory
/// specification); Apple `$HOME/Library/Caches`. A relative or empty value
/// counts as unset; `None` without an absolute `HOME`.
pub fn user_cache_home(
    env: &dyn Fn(&str) -> Option<std::ffi::OsString>,
) -> Option<std::path::PathBuf> {
    imp::user_cache_home(env)
}

/// Bytes in the page cache system-wide (`Cached:` in `/proc/meminfo`), for
/// tests that check direct reads do not fill it. `None` where the platform
/// has no such figure (Apple) or it cannot be read.
pub fn page_cache_bytes() -> Option<u64> {
    imp::page_cache_bytes()
}

/// Bytes an unprivileged writer may still put on the filesystem holding
/// `path`, or on that of its nearest existing ancestor when `path` does not
/// exist yet (a directory about to be created): `statvfs`'s `f_bavail ×
/// f_frsize`, the same call on Linux and Apple. `None` when no ancestor can be
/// asked, or its filesystem keeps no count (no blocks at all: ramfs).
pub fn free_bytes(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let mut at = Some(path);
    while let Some(p) = at {
        let probe = if p.as_os_str().is_empty() {
            Path::new(".")
        } else {
            p
        };
        if probe.exists() {
            let c_path = std::ffi::CString::new(probe.as_os_str().as_bytes()).ok()?;
            // SAFETY: an all-zero `statvfs` is a valid value of the plain C
            // struct; the call overwrites it.
            let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
            // SAFETY: `c_path` is a NUL-terminated string and `st` is valid
            // for writing one `statvfs`; both outlive the call.
            if unsafe { libc::statvfs(c_path.as_ptr(), &mut st) } != 0 {
                return None;
            }
            // A filesystem of no blocks at all keeps no count (ramfs, some
            // pseudo filesystems report 0 of 0): its free space is unknown,
            // not zero.
            if st.f_blocks == 0 {
                return None;
            }
            #[allow(clippy::unnecessary_cast)] // the field types differ by platform
            return Some((st.f_bavail as u64).saturating_mul(st.f_frsize as u64));
        }
        at = p.parent();
    }
    None
}

/// What the OS says about memory, the input of the ring's auto-sizing
/// (docs/c-api.md, "Ring sizing"). The sizing itself is a pure function elsewhere.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemorySnapshot {
    /// Memory available before pressure, bounded by the process's cgroup.
    pub avail_bytes: u64,
    /// Physical memory, or the cgroup limit if lower.
    pub ram_bytes: u64,
    /// Where `avail_bytes` came from, e.g. "/proc/meminfo MemAvailable".
    pub avail_source: String,
    /// Where `ram_bytes` came from, e.g. "cgroup v2 memory.max in /sys/fs/cgroup/app".
    pub ram_source: String,
    /// `ram_bytes` is a cgroup's limit (lower than physical memory): the
    /// process lives in a container whose limit already protects the rest
    /// of the machine.
    pub cgroup_limited: bool,
    /// Memory that pages committed now would get before the OS must kill:
    /// `avail_bytes`, except inside a memory cgroup, whose usage counts its
    /// file cache, which the kernel reclaims first: there the limit less
    /// the usage without it (what the elastic ring's probe watches). A
    /// ring committed at open must fit in it (`budget::check_fits`).
    pub committable_bytes: u64,
    /// Where `committable_bytes` came from.
    pub committable_source: String,
}

/// Probes the OS for a [`MemorySnapshot`].
///
/// Linux: `/proc/meminfo` `MemAvailable` and `MemTotal`, each lowered to the
/// tightest limit of the process's memory cgroup (v1 or v2) and its parents.
/// Apple: `hw.memsize × kern.memorystatus_level / 100` and `hw.memsize`.
/// Errors name the file or sysctl that failed.
pub fn memory_snapshot() -> io::Result<MemorySnapshot> {
    imp::memory_snapshot()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn temp_file(bytes: &[u8]) -> tempfile::NamedTempFile {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        file.write_all(bytes).unwrap();
        file.flush().unwrap();
        file
    }

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    #[test]
    fn read_at_exact_reads_a_regular_file() {
        let data = pattern(5 * 16384);
        let tmp = temp_file(&data);
        let opened = open_for_streaming(tmp.path(), DirectIo::Off).unwrap();
        assert!(!opened.direct);
        let mut buf = vec![0u8; 2 * 16384];
        read_at_exact(&opened.file, &mut buf, 16384).unwrap();
        assert_eq!(buf, data[16384..3 * 16384]);
    }

    #[test]
    fn read_at_exact_reports_eof_with_bytes_done() {
        let data = pattern(81920 + 12288);
        let tmp = temp_file(&data);
        let file = File::open(tmp.path()).unwrap();
        let mut buf = vec![0u8; 16384];
        let err = read_at_exact(&file, &mut buf, 81920).unwrap_err();
        assert_eq!((err.done, err.wanted, err.offset), (12288, 16384, 81920));
        assert_eq!(err.error.kind(), io::ErrorKind::UnexpectedEof);
        assert_eq!(buf[..12288], data[81920..]);
        assert_eq!(
            err.message(Path::new("experts.smoe")),
            "read 12288 of 16384 bytes at offset 81920 in experts.smoe: unexpected end of file"
        );
    }

    #[test]
    fn read_at_exact_at_eof_reads_nothing() {
        let tmp = temp_file(&pattern(100));
        let file = File::open(tmp.path()).unwrap();
        let err = read_at_exact(&file, &mut [0u8; 10], 100).unwrap_err();
        assert_eq!((err.done, err.wanted), (0, 10));
        read_at_exact(&file, &mut [], 1000).unwrap();
    }

    #[test]
    fn read_at_exact_reports_the_os_error() {
        // A directory opens but `pread` on it fails with EISDIR.
        let dir = tempfile::tempdir().unwrap();
        let file = File::open(dir.path()).unwrap();
        let err = read_at_exact(&file, &mut [0u8; 16], 0).unwrap_err();
        assert_eq!(err.done, 0);
        assert_eq!(err.error.raw_os_error(), Some(libc::EISDIR));
    }

    // A regular file's `pread` cannot be made to return EINTR on demand (disk
    // reads sleep uninterruptibly, pipes refuse `pread`), so the loop is
    // tested with a scripted reader: EINTR, then short reads, then the rest.
    #[test]
    fn read_loop_retries_eintr_and_short_reads() {
        let data = pattern(1000);
        let mut script = vec![
            Err(io::Error::from_raw_os_error(libc::EINTR)),
            Ok(1),
            Err(io::Error::from_raw_os_error(libc::EINTR)),
            Ok(300),
            Ok(299),
        ]
        .into_iter();
        let mut calls = Vec::new();
        let mut buf = vec![0u8; 600];
        read_exact_with(&mut buf, 200, |chunk, at| {
            calls.push((at, chunk.len()));
            let n = script.next().unwrap()?.min(chunk.len());
            let at = at as usize;
            chunk[..n].copy_from_slice(&data[at..at + n]);
            Ok(n)
        })
        .unwrap();
        assert_eq!(buf, data[200..800]);
        assert_eq!(
            calls,
            [(200, 600), (200, 600), (201, 599), (201, 599), (501, 299)]
        );
    }

    #[test]
    fn read_loop_stops_on_error_with_progress() {
        let mut step = 0;
        let err = read_exact_with(&mut [0u8; 64], 7, |_, _| {
            step += 1;
            if step == 1 {
                Ok(16)
            } else {
                Err(io::Error::from_raw_os_error(libc::EIO))
            }
        })
        .unwrap_err();
        assert_eq!((err.done, err.wanted, err.offset), (16, 64, 7));
        assert_eq!(err.error.raw_os_error(), Some(libc::EIO));
        assert!(err
            .to_string()
            .starts_with("read 16 of 64 bytes at offset 7: "));
    }

    #[test]
    fn open_missing_file_keeps_errno() {
        for mode in [DirectIo::Auto, DirectIo::Require, DirectIo::Off] {
            let err =
                open_for_streaming(Path::new("/nonexistent/smoe/experts.smoe"), mode).unwrap_err();
            assert_eq!(err.raw_os_error(), Some(libc::ENOENT), "{mode:?}");
        }
    }

    #[test]
    fn open_direct_on_the_temp_filesystem() {
        // Whatever the temp filesystem does, the three modes must agree.
        let data = pattern(3 * 16384);
        let tmp = temp_file(&data);
        let auto = open_for_streaming(tmp.path(), DirectIo::Auto).unwrap();
        let require = open_for_streaming(tmp.path(), DirectIo::Require);
        eprintln!("temp filesystem: direct = {}", auto.direct);
        if auto.direct {
            let require = require.unwrap();
            assert!(require.direct);
            let probe = probe_direct_read(&require.file, 16384);
            eprintln!("temp filesystem: direct read probe = {probe:?}");
            if probe.is_ok() {
                let mut buf = AlignedBuffer::zeroed(16384, 16384).unwrap();
                read_at_exact(&require.file, buf.as_mut_slice(), 16384).unwrap();
                assert_eq!(buf.as_mut_slice(), &data[16384..2 * 16384]);
            }
        } else {
            assert_eq!(require.unwrap_err().kind(), io::ErrorKind::Unsupported);
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn procfs_refuses_o_direct() {
        // procfs answers O_DIRECT with EINVAL (tmpfs did too
        // before Linux 6.6, but no longer does), so it stands in for a
        // filesystem without direct I/O.
        let path = Path::new("/proc/meminfo");
        let auto = open_for_streaming(path, DirectIo::Auto).unwrap();
        assert!(!auto.direct);
        let mut head = [0u8; 9];
        assert!(read_at_exact(&auto.file, &mut head, 0).is_ok());
        assert_eq!(&head, b"MemTotal:");
        let err = open_for_streaming(path, DirectIo::Require).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::Unsupported);
        assert_eq!(
            err.to_string(),
            "the filesystem refused direct I/O (O_DIRECT): Invalid argument (os error 22)"
        );
        assert!(!open_for_streaming(path, DirectIo::Off).unwrap().direct);
    }

    #[test]
    fn probe_rejects_bad_alignment() {
        let tmp = temp_file(&pattern(10));
        let file = File::open(tmp.path()).unwrap();
        for align in [0, 3, 12288] {
            let err = probe_direct_read(&file, align).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        }
        // Shorter than one block is still an accepted read.
        probe_direct_read(&file, 4096).unwrap();
    }

    #[test]
    fn aligned_buffer_is_aligned_zeroed_and_refuses_bad_layouts() {
        let mut buf = AlignedBuffer::zeroed(3 * 16384 + 5, 16384).unwrap();
        assert_eq!(buf.as_slice().as_ptr() as usize % 16384, 0);
        assert_eq!(buf.as_slice().len(), 3 * 16384 + 5);
        assert!(buf.as_slice().iter().all(|&b| b == 0));
        buf.as_mut_slice()[7] = 1;
        assert_eq!(buf.as_slice()[7], 1);
        for (len, align) in [(0, 4096), (4096, 0), (4096, 3), (usize::MAX, 4096)] {
            let err = AlignedBuffer::zeroed(len, align).err().unwrap();
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{len} {align}");
        }
    }

    #[test]
    fn drop_file_cache_accepts_a_regular_file() {
        let tmp = temp_file(&pattern(4096));
        drop_file_cache(&File::open(tmp.path()).unwrap()).unwrap();
    }

    #[test]
    fn memory_snapshot_on_this_machine_is_plausible() {
        let snapshot = memory_snapshot().unwrap();
        eprintln!("{snapshot:?}");
        assert!(snapshot.ram_bytes > 0);
        assert!(snapshot.avail_bytes <= snapshot.ram_bytes, "{snapshot:?}");
        assert!(!snapshot.avail_source.is_empty() && !snapshot.ram_source.is_empty());
    }
}
