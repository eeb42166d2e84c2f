//! Reads blobs (`padded_size` bytes at their aligned offset) in pieces of at
//! most [`CHUNK_BYTES`] through one 16384-aligned buffer, with direct I/O
//! where the filesystem allows it. Memory stays at one chunk whatever a blob's
//! size: a vault may hold a blob far larger than this machine's memory.
//!
//! On Linux the file is opened with `O_DIRECT`, so reads measure the device,
//! not the page cache; if the open or the first read fails with `EINVAL`
//! (tmpfs on older kernels, some network filesystems) the reader falls back to
//! buffered I/O and says so. Elsewhere it reads buffered. Every read the vault
//! format allows is alignment-sized at an aligned offset, and a chunk is a
//! multiple of every alignment the format allows, so each piece is too: that
//! is what makes direct I/O possible without bounce buffers.

use std::fs::File;
#[cfg(target_os = "linux")]
use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use smoe::vault::Entry;
use smoe::{Error, ErrorKind, Result};

/// Alignment of the read buffer: the ring's slot alignment, and a multiple of
/// every logical block size direct I/O asks for.
pub const BUFFER_ALIGNMENT: usize = 16384;

/// Bytes of the largest read: 8 MiB, a multiple of every vault alignment
/// (at most 1 MiB) and of [`BUFFER_ALIGNMENT`], large enough that reads run
/// at the drive's speed.
pub const CHUNK_BYTES: usize = 8 << 20;

/// A heap buffer whose usable part starts at a multiple of
/// [`BUFFER_ALIGNMENT`], made by over-allocating a `Vec` and skipping to the
/// first aligned byte (no `unsafe` needed).
struct AlignedBuffer {
    storage: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuffer {
    fn new(len: usize) -> Result<AlignedBuffer> {
        let no_memory = || {
            Error::new(
                ErrorKind::NoMemory,
                format!("cannot allocate a {len}-byte read buffer"),
            )
        };
        let total = len.checked_add(BUFFER_ALIGNMENT).ok_or_else(no_memory)?;
        let mut storage = Vec::new();
        storage.try_reserve_exact(total).map_err(|_| no_memory())?;
        storage.resize(total, 0);
        let start = storage.as_ptr().align_offset(BUFFER_ALIGNMENT);
        if start >= BUFFER_ALIGNMENT {
            return Err(Error::new(
                ErrorKind::Internal,
                "cannot align the read buffer to 16384 bytes",
            ));
        }
        Ok(AlignedBuffer {
            storage,
            start,
            len,
        })
    }

    fn slice_mut(&mut self, len: usize) -> &mut [u8] {
        &mut self.storage[self.start..self.start + len.min(self.len)]
    }

    fn slice(&self, len: usize) -> &[u8] {
        &self.storage[self.start..self.start + len.min(self.len)]
    }
}

/// How blobs are being read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoMode {
    /// `O_DIRECT`: the page cache is bypassed.
    Direct,
    /// Ordinary reads through the page cache.
    Buffered,
}

impl IoMode {
    /// "direct I/O" or "buffered I/O".
    pub fn describe(self) -> &'static str {
        match self {
            IoMode::Direct => "direct I/O",
            IoMode::Buffered => "buffered I/O",
        }
    }
}

/// Reads blobs of one vault file. See the module doc.
pub struct BlobReader {
    file: File,
    path: PathBuf,
    mode: IoMode,
    /// No read has succeeded yet: an `EINVAL` now means "no direct I/O here".
    untested: bool,
    buffer: AlignedBuffer,
    /// Seconds spent inside reads so far.
    read_seconds: f64,
}

impl BlobReader {
    /// Opens `path`, with a buffer of [`CHUNK_BYTES`].
    pub fn open(path: &Path) -> Result<BlobReader> {
        let buffer = AlignedBuffer::new(CHUNK_BYTES)?;
        let (file, mode) = match open_direct(path) {
            Ok(Some(file)) => (file, IoMode::Direct),
            Ok(None) => (open_buffered(path)?, IoMode::Buffered),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                (open_buffered(path)?, IoMode::Buffered)
            }
            Err(e) => return Err(Error::io("cannot open", path, &e)),
        };
        Ok(BlobReader {
            file,
            path: path.to_path_buf(),
            untested: mode == IoMode::Direct,
            mode,
            buffer,
            read_seconds: 0.0,
        })
    }

    /// Whether reads are direct or buffered (known for sure after the first read).
    pub fn mode(&self) -> IoMode {
        self.mode
    }

    /// Seconds spent inside reads so far.
    pub fn read_seconds(&self) -> f64 {
        self.read_seconds
    }

    /// Reads the `padded_size` bytes of `entry`'s blob in order, in pieces of
    /// at most [`CHUNK_BYTES`], and hands each to `piece` with its offset in
    /// the blob. A failed read ends the blob with an error naming it.
    pub fn read_blob(&mut self, entry: &Entry, piece: &mut dyn FnMut(u64, &[u8])) -> Result<()> {
        let mut at = 0u64;
        while at < entry.padded_size {
            // At most CHUNK_BYTES, so it fits a usize.
            let len = (entry.padded_size - at).min(CHUNK_BYTES as u64) as usize;
            let offset = entry.offset + at;
            let start = std::time::Instant::now();
            let result = read_full(&self.file, self.buffer.slice_mut(len), offset);
            let result = match result {
                Err(e) if self.untested && e.raw_os_error() == Some(libc::EINVAL) => {
                    // The filesystem accepted O_DIRECT at open but refuses the
                    // reads: fall back to the page cache for the whole run.
                    self.file = open_buffered(&self.path)?;
                    self.mode = IoMode::Buffered;
                    read_full(&self.file, self.buffer.slice_mut(len), offset)
                }
                other => other,
            };
            self.read_seconds += start.elapsed().as_secs_f64();
            result.map_err(|e| {
                Error::io(
                    format_args!(
                        "layer {} expert {}: cannot read {len} bytes at offset {offset} of",
                        entry.layer, entry.expert
                    ),
                    &self.path,
                    &e,
                )
            })?;
            self.untested = false;
            piece(at, self.buffer.slice(len));
            at += len as u64;
        }
        Ok(())
    }
}

fn open_buffered(path: &Path) -> Result<File> {
    File::open(path).map_err(|e| Error::io("cannot open", path, &e))
}

/// Opens `path` with `O_DIRECT`; `Ok(None)` where this platform has no
/// such flag.
#[cfg(target_os = "linux")]
fn open_direct(path: &Path) -> io::Result<Option<File>> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .map(Some)
}

/// Other Unixes read buffered (macOS's `F_NOCACHE` is the library's
/// business, in its `sys` module).
#[cfg(not(target_os = "linux"))]
fn open_direct(_path: &Path) -> io::Result<Option<File>> {
    Ok(None)
}

/// Fills `buf` from `offset`, retrying on `EINTR` and short reads; an early
/// end of file is an error.
fn read_full(file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("end of file after {done} bytes"),
                ))
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
