//! Reads blobs (`padded_size` bytes at their aligned offset) in pieces of at
//! most [`CHUNK_BYTES`] through one 16384-aligned buffer, with direct I/O
//! where the filesystem allows it. Memory stays at one chunk whatever a blob's
//! size: a vault may hold a blob far larger than this machine's memory.
//!
//! The file is opened, probed and read exactly as the streamer's workers do
//! it, with the library's platform calls (`smoe::internals::sys`): direct I/O
//! (`O_DIRECT` on Linux, `F_NOCACHE` on Apple), so reads measure the device,
//! not the page cache; a filesystem that refuses it at open, or accepts the
//! open and then refuses the reads (the probe finds out), is read buffered,
//! and [`BlobReader::mode`] says so. Every read the vault format allows is
//! alignment-sized at an aligned offset, and a chunk is a multiple of every
//! alignment the format allows, so each piece is too: that is what makes
//! direct I/O possible without bounce buffers.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use smoe::internals::model::window::IO_ALIGN;
use smoe::internals::sys::{open_for_streaming, probe_direct_read, read_at_exact, AlignedBuffer};
use smoe::vault::{Entry, InPlace, Loaded, Scratch, Vault};
use smoe::{DirectIo, Error, ErrorKind, Result};

/// Alignment of the read buffer: the library's one alignment (the ring's
/// slots, every v1 vault), a multiple of every logical block size direct I/O
/// asks for.
pub const BUFFER_ALIGNMENT: usize = smoe::vault::DEFAULT_ALIGNMENT as usize;

/// Bytes of the largest read: 8 MiB, a multiple of every vault alignment
/// (at most 1 MiB) and of [`BUFFER_ALIGNMENT`], large enough that reads run
/// at the drive's speed.
pub const CHUNK_BYTES: usize = 8 << 20;

/// How blobs are being read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoMode {
    /// Direct I/O: the page cache is bypassed.
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

/// A zeroed buffer of `len` bytes aligned to [`BUFFER_ALIGNMENT`], or an
/// error of the NoMemory kind.
fn read_buffer(len: usize) -> Result<AlignedBuffer> {
    AlignedBuffer::zeroed(len, BUFFER_ALIGNMENT).map_err(|e| {
        let kind = if e.kind() == io::ErrorKind::OutOfMemory {
            ErrorKind::NoMemory
        } else {
            ErrorKind::Internal
        };
        Error::new(kind, format!("read buffer: {e}"))
    })
}

/// Reads blobs of one vault file. See the module doc.
pub struct BlobReader {
    file: File,
    path: PathBuf,
    mode: IoMode,
    buffer: AlignedBuffer,
    /// Seconds spent inside reads so far.
    read_seconds: f64,
}

impl BlobReader {
    /// Opens `path`, with a buffer of [`CHUNK_BYTES`].
    pub fn open(path: &Path) -> Result<BlobReader> {
        let buffer = read_buffer(CHUNK_BYTES)?;
        let open =
            |mode| open_for_streaming(path, mode).map_err(|e| Error::io("cannot open", path, &e));
        let mut opened = open(DirectIo::Auto)?;
        // Some filesystems accept O_DIRECT at open and refuse every read.
        if opened.direct && probe_direct_read(&opened.file, BUFFER_ALIGNMENT).is_err() {
            opened = open(DirectIo::Off)?;
        }
        Ok(BlobReader {
            file: opened.file,
            path: path.to_path_buf(),
            mode: if opened.direct {
                IoMode::Direct
            } else {
                IoMode::Buffered
            },
            buffer,
            read_seconds: 0.0,
        })
    }

    /// Whether reads are direct or buffered.
    pub fn mode(&self) -> IoMode {
        self.mode
    }

    /// Seconds spent inside reads so far.
    pub fn read_seconds(&self) -> f64 {
        self.read_seconds
    }

    /// Reads the `padded_size` bytes of `entry`'s blob in order, in pieces of
    /// at most [`CHUNK_BYTES`], and hands each to `piece` with its offset in
    /// the blob. A failed read ends the blob with an error naming it, the
    /// bytes read and the OS error.
    pub fn read_blob(&mut self, entry: &Entry, piece: &mut dyn FnMut(u64, &[u8])) -> Result<()> {
        let mut at = 0u64;
        while at < entry.padded_size {
            // At most CHUNK_BYTES, so it fits a usize.
            let len = (entry.padded_size - at).min(CHUNK_BYTES as u64) as usize;
            let offset = entry.offset + at;
            let start = std::time::Instant::now();
            let chunk = &mut self.buffer.as_mut_slice()[..len];
            let result = read_at_exact(&self.file, chunk, offset);
            self.read_seconds += start.elapsed().as_secs_f64();
            result.map_err(|e| {
                Error::io(
                    format_args!(
                        "layer {} expert {}: read {} of {} bytes at offset {} of",
                        entry.layer, entry.expert, e.done, e.wanted, e.offset
                    ),
                    &self.path,
                    &e.error,
                )
            })?;
            piece(at, &self.buffer.as_slice()[..len]);
            at += len as u64;
        }
        Ok(())
    }
}

/// Loads the experts of a model opened in place, one at a time, through
/// [`InPlace::load`] into one buffer of the largest slot: the files opened
/// as the streamer's workers open them (direct I/O where every file allows
/// it, probed with one read; else all buffered). See the module doc.
pub struct ModelReader<'v> {
    model: &'v InPlace,
    files: Vec<File>,
    mode: IoMode,
    buffer: AlignedBuffer,
    scratch: Scratch,
    /// Seconds spent inside reads so far.
    read_seconds: f64,
}

impl<'v> ModelReader<'v> {
    /// Opens every file of `vault`'s model (`None` for a packed vault),
    /// with a buffer of its largest `padded_size`.
    pub fn open(vault: &'v Vault) -> Result<Option<ModelReader<'v>>> {
        let Some(model) = vault.model() else {
            return Ok(None);
        };
        let len = usize::try_from(vault.max_padded_size().max(IO_ALIGN)).map_err(|_| {
            Error::new(
                ErrorKind::NoMemory,
                format!(
                    "a slot of {} bytes does not fit this machine's memory",
                    vault.max_padded_size()
                ),
            )
        })?;
        let buffer = read_buffer(len)?;
        let paths = vault.data_files();
        let open_all = |mode| -> Result<Vec<smoe::internals::sys::OpenedFile>> {
            paths
                .iter()
                .map(|p| open_for_streaming(p, mode).map_err(|e| Error::io("cannot open", p, &e)))
                .collect()
        };
        let mut opened = open_all(DirectIo::Auto)?;
        // As the streamer does: a file that accepts O_DIRECT at open and
        // refuses the reads makes every file buffered.
        let refused = opened
            .iter()
            .any(|o| o.direct && probe_direct_read(&o.file, IO_ALIGN as usize).is_err());
        if refused {
            opened = open_all(DirectIo::Off)?;
        }
        let mode = if opened.iter().all(|o| o.direct) {
            IoMode::Direct
        } else {
            IoMode::Buffered
        };
        Ok(Some(ModelReader {
            model,
            files: opened.into_iter().map(|o| o.file).collect(),
            mode,
            buffer,
            scratch: Scratch::default(),
            read_seconds: 0.0,
        }))
    }

    /// Whether reads are direct or buffered.
    pub fn mode(&self) -> IoMode {
        self.mode
    }

    /// Seconds spent inside reads so far.
    pub fn read_seconds(&self) -> f64 {
        self.read_seconds
    }

    /// Loads `entry`'s expert through [`InPlace::load`] and returns what
    /// the load did and the slot it filled (`padded_size` bytes: the items
    /// at the layer's offsets). The error names the file: a failed or short
    /// read, or a file changed since the model was opened.
    pub fn load(&mut self, entry: &Entry) -> Result<(Loaded, &[u8])> {
        let len = usize::try_from(entry.padded_size)
            .ok()
            .filter(|&n| n <= self.buffer.as_slice().len())
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::Internal,
                    format!(
                        "layer {} expert {}: a slot of {} bytes passes the read buffer",
                        entry.layer, entry.expert, entry.padded_size
                    ),
                )
            })?;
        let seconds = &mut self.read_seconds;
        let loaded = self.model.load(
            &self.files,
            entry,
            &mut self.buffer.as_mut_slice()[..len],
            &mut self.scratch,
            |file, window, offset| {
                let start = std::time::Instant::now();
                let r = read_at_exact(file, window, offset);
                *seconds += start.elapsed().as_secs_f64();
                r
            },
        )?;
        Ok((loaded, &self.buffer.as_slice()[..len]))
    }
}
