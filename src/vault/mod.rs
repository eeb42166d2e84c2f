//! The vault (docs/format.md §1): a directory holding `experts.smoe` (the expert blobs
//! and their table), optional `scout.*` files and the histogram.
//!
//! [`Vault::open`] validates every rule of docs/format.md §2 before it hands out a
//! single entry; after that, [`Vault::entry`] maps (layer, expert) to its blob
//! in O(1) through a dense index (`layer × n_experts + expert`), without
//! hashing. [`VaultWriter`] writes vaults; [`synth`] makes synthetic ones.

mod format;
mod in_place;
pub mod synth;
mod writer;

use std::ffi::{CStr, CString};
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use format::{
    hex, Entry, Header, DEFAULT_ALIGNMENT, ENTRY_BYTES, FLAG_CHECKSUMS, HEADER_BYTES,
    MAX_ALIGNMENT, MAX_EXPERT_IDS, MAX_META_BYTES, MIN_ALIGNMENT, VERSION,
};
pub use in_place::{InPlace, Loaded, ModelFile, Scratch};
pub use writer::{random_id, VaultWriter, WriterOptions};

use crate::error::{Error, ErrorKind, Result};
use crate::sys::{self, FileKind, OpenRegularError};

/// The file name of the blob container inside a vault directory.
pub const EXPERTS_FILE: &str = "experts.smoe";
/// The file name of the persisted claim histogram inside a vault directory.
pub const FREQ_FILE: &str = "expert_freq.bin";

/// Marks a dense id with no entry in [`Vault`]'s index.
const NO_ENTRY: u32 = u32::MAX;

/// A validated vault: its header, its entries and its metadata, in memory.
/// Blob bytes stay on disk; the streamer reads them.
#[derive(Debug, Clone)]
pub struct Vault {
    path: PathBuf,
    dir: PathBuf,
    header: Header,
    entries: Vec<Entry>,
    /// Dense id (`layer × n_experts + expert`) → index into `entries`, or
    /// `NO_ENTRY`. Length `n_layers × n_experts`.
    index: Vec<u32>,
    /// The metadata, the only copy: UTF-8 without a NUL byte (checked by
    /// `format::parse_meta`), NUL-terminated so the C API hands out a
    /// pointer into it. Empty when the vault has none.
    meta: CString,
    /// A model opened in place (SPEC §6): where its experts' slices are.
    /// `None` for a packed vault, whose blobs are in `experts.smoe`.
    model: Option<Arc<InPlace>>,
}

/// Where the bytes of a vault come from: a file, or memory (for the fuzzer).
trait Source {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
}

impl Source for File {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        FileExt::read_exact_at(self, buf, offset)
    }
}

impl Source for [u8] {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let start = usize::try_from(offset).map_err(|_| io::ErrorKind::UnexpectedEof)?;
        let end = start
            .checked_add(buf.len())
            .filter(|&e| e <= self.len())
            .ok_or(io::ErrorKind::UnexpectedEof)?;
        buf.copy_from_slice(&self[start..end]);
        Ok(())
    }
}

impl Vault {
    /// Opens and validates a vault. `path` is the vault directory or the path
    /// of its `experts.smoe`.
    ///
    /// Errors name the file and, for a broken rule, the field and both values.
    /// `path` may also be a model, opened in place (SPEC §6): a GGUF file
    /// (the first part of a split one), a safetensors file, a directory
    /// holding `model.safetensors` or `model.safetensors.index.json`, or
    /// that index. Its table is built from the model's headers; no tensor
    /// data is read.
    pub fn open(path: impl AsRef<Path>) -> Result<Vault> {
        let path = path.as_ref();
        if is_model(path)? {
            return Self::open_model(path);
        }
        let (file_path, dir) = resolve(path)?;
        // Never `File::open` first: on a FIFO that waits for a writer forever.
        let (file, meta) = sys::open_regular(&file_path).map_err(|e| match e {
            OpenRegularError::Os(e) => Error::io("cannot open", &file_path, &e),
            OpenRegularError::NotRegular(FileKind::Directory) => Error::path_is(
                ErrorKind::Argument,
                &file_path,
                format!("is a directory without {EXPERTS_FILE}"),
            ),
            OpenRegularError::NotRegular(kind) => {
                Error::argument(format!("is {kind}, not a vault or model file"))
                    .with_path(&file_path)
            }
        })?;
        let len = meta.len();
        Self::parse(&file, len, &file_path)
            .map(|(header, entries, index, meta)| Vault {
                path: file_path.clone(),
                dir,
                header,
                entries,
                index,
                meta,
                model: None,
            })
            .map_err(|e| match e.path() {
                // A read error names the file in its sentence; it is named
                // in front as well, as every error of `open` is.
                Some(_) => e.context(file_path.display()),
                None => e.with_path(&file_path),
            })
    }

    /// Validates a whole vault held in memory (used by the fuzzer and tests).
    pub fn from_bytes(bytes: &[u8]) -> Result<Vault> {
        let name = Path::new("<memory>");
        let (header, entries, index, meta) = Self::parse(bytes, bytes.len() as u64, name)?;
        Ok(Vault {
            path: name.to_path_buf(),
            dir: PathBuf::new(),
            header,
            entries,
            index,
            meta,
            model: None,
        })
    }

    /// Opens the model at `path` in place (SPEC §6).
    fn open_model(path: &Path) -> Result<Vault> {
        Self::open_model_observed(path, &|| {})
    }

    /// [`Vault::open`] of the model at `path`, calling `after_headers`
    /// once its headers are read and planned, before its files are
    /// recorded: a test's seam (`smoe::internals::model`), to change a
    /// file where a writer racing the open would.
    pub(crate) fn open_model_observed(path: &Path, after_headers: &dyn Fn()) -> Result<Vault> {
        let opened = in_place::open(path, after_headers)?;
        let mut header = opened.header;
        header.meta_bytes = opened.meta.len() as u64;
        header.meta_xxh3 = xxhash_rust::xxh3::xxh3_64(opened.meta.as_bytes());
        // At most MAX_EXPERT_IDS ids (`plan` checked), 4 bytes each.
        let ids = header.expert_ids() as usize;
        let mut index = Vec::new();
        crate::try_alloc::reserve(&mut index, ids, || {
            crate::try_alloc::no_memory(format_args!(
                "the index of {ids} expert ids of {}",
                path.display()
            ))
        })?;
        index.resize(ids, NO_ENTRY);
        for (i, e) in opened.entries.iter().enumerate() {
            index[dense(&header, e.layer, e.expert)] = i as u32;
        }
        // The metadata is written here, from names a header gave: checked
        // as a vault's is, so the C string holds no NUL.
        let meta =
            format::parse_meta(&header, opened.meta.into_bytes()).map_err(|e| e.with_path(path))?;
        let first = opened.source.files()[0].path.clone();
        let dir = match first.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        Ok(Vault {
            path: first,
            dir,
            header,
            entries: opened.entries,
            index,
            meta,
            model: Some(Arc::new(opened.source)),
        })
    }

    /// The model this vault reads in place, or `None` for a packed vault.
    pub fn model(&self) -> Option<&InPlace> {
        self.model.as_deref()
    }

    /// The files the I/O workers read: `experts.smoe`, or the model's.
    pub fn data_files(&self) -> Vec<PathBuf> {
        match &self.model {
            None => vec![self.path.clone()],
            Some(m) => m.files().iter().map(|f| f.path.clone()).collect(),
        }
    }

    /// The directory of this vault's histogram when the config names
    /// none: the vault directory, or a model's cache directory (SPEC §6:
    /// nothing is written beside a model), with a note when the
    /// environment held something that was passed over (a relative
    /// `SMOE_CACHE_DIR`); an error saying why when a model has none (no
    /// absolute home directory).
    pub fn histogram_dir(&self) -> std::result::Result<(PathBuf, Option<String>), String> {
        match &self.model {
            None => Ok((self.dir.clone(), None)),
            Some(_) => {
                crate::model::identity::cache_dir(&self.header.vault_id, |k| std::env::var_os(k))
            }
        }
    }

    #[allow(clippy::type_complexity)]
    fn parse<S: Source + ?Sized>(
        src: &S,
        len: u64,
        path: &Path,
    ) -> Result<(Header, Vec<Entry>, Vec<u32>, CString)> {
        let read = |buf: &mut [u8], offset: u64, what: &str| {
            src.read_exact_at(buf, offset).map_err(|e| {
                Error::io(
                    format_args!(
                        "cannot read {what} ({} bytes at offset {offset}) of",
                        buf.len()
                    ),
                    path,
                    &e,
                )
                .with_offset(offset)
                .with_length(buf.len() as u64)
            })
        };
        let mut head = [0u8; HEADER_BYTES];
        let head_len = len.min(HEADER_BYTES as u64) as usize;
        read(&mut head[..head_len], 0, "the header")?;
        let header = Header::parse(&head[..head_len], len)?;

        // The rest of page 0 must be zero. Read it in bounded pieces.
        let mut page = vec![0u8; 4096];
        let mut at = HEADER_BYTES as u64;
        let page_end = u64::from(header.alignment);
        while at < page_end {
            let n = (page_end - at).min(page.len() as u64) as usize;
            read(&mut page[..n], at, "page 0")?;
            if let Some(i) = page[..n].iter().position(|&b| b != 0) {
                return Err(Error::format(format!(
                    "byte {} of page 0 is {:#04x}, expected 0 (page 0 holds only the 128-byte header)",
                    at + i as u64,
                    page[i]
                ))
                .with_offset(at + i as u64));
            }
            at += n as u64;
        }

        // table_bytes = n_entries × 48 ≤ MAX_EXPERT_IDS × 48 (768 MiB) and
        // ≤ file_bytes == len were checked; still, a machine may lack it.
        let mut table = zeroed(header.table_bytes, 0, "the table")?;
        read(&mut table, header.table_offset, "the table")?;
        let entries = format::parse_table(&header, &table)?;
        drop(table);

        // meta_bytes ≤ MAX_META_BYTES was checked from the header. The
        // buffer has room for the NUL `parse_meta` appends, so the C string
        // it becomes is this allocation, not a copy.
        let meta = if header.meta_bytes == 0 {
            CString::default()
        } else {
            let mut bytes = zeroed(header.meta_bytes, 1, "the metadata")?;
            read(&mut bytes, header.meta_offset, "the metadata")?;
            format::parse_meta(&header, bytes)?
        };

        let mut index = vec![NO_ENTRY; header.expert_ids() as usize];
        for (i, e) in entries.iter().enumerate() {
            index[dense(&header, e.layer, e.expert)] = i as u32;
        }
        Ok((header, entries, index, meta))
    }

    /// The validated header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// Every entry, sorted by (layer, expert).
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The path of `experts.smoe`.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The vault directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The metadata JSON, "" when the vault has none.
    pub fn meta(&self) -> &str {
        // SAFETY: `meta` holds only bytes that `format::parse_meta` checked
        // to be UTF-8 (or none), and nothing changes them afterwards.
        unsafe { std::str::from_utf8_unchecked(self.meta.as_bytes()) }
    }

    /// The same metadata as a NUL-terminated C string: the bytes of
    /// [`Vault::meta`], not a copy (it has no interior NUL: a vault whose
    /// metadata holds one is rejected at open).
    pub fn meta_c(&self) -> &CStr {
        &self.meta
    }

    /// Number of layers.
    pub fn n_layers(&self) -> u32 {
        self.header.n_layers
    }

    /// Number of experts per layer.
    pub fn n_experts(&self) -> u32 {
        self.header.n_experts
    }

    /// The dense id of (layer, expert), `layer × n_experts + expert`, or None
    /// when either is out of range.
    pub fn dense_id(&self, layer: u32, expert: u32) -> Option<u32> {
        (layer < self.header.n_layers && expert < self.header.n_experts)
            .then(|| dense(&self.header, layer, expert) as u32)
    }

    /// The entry of a dense id, if the vault has that expert.
    pub fn entry_by_id(&self, id: u32) -> Option<&Entry> {
        match self.index.get(id as usize) {
            Some(&i) if i != NO_ENTRY => self.entries.get(i as usize),
            _ => None,
        }
    }

    /// The position in [`Vault::entries`] of a dense id's entry, if the
    /// vault has that expert. Entries are sorted by (layer, expert), that is
    /// by dense id.
    pub fn entry_index(&self, id: u32) -> Option<u32> {
        self.index
            .get(id as usize)
            .copied()
            .filter(|&i| i != NO_ENTRY)
    }

    /// The entry of (layer, expert), in O(1).
    pub fn entry(&self, layer: u32, expert: u32) -> Option<&Entry> {
        self.dense_id(layer, expert)
            .and_then(|id| self.entry_by_id(id))
    }

    /// The largest `padded_size` of any blob.
    pub fn max_padded_size(&self) -> u64 {
        self.entries
            .iter()
            .map(|e| e.padded_size)
            .max()
            .unwrap_or(0)
    }

    /// The sum of every blob's payload bytes.
    pub fn total_payload_bytes(&self) -> u64 {
        self.entries.iter().map(|e| e.size).sum()
    }

    /// The bytes the engine keeps resident besides the ring: a model's
    /// non-expert tensors ([`InPlace::dense_bytes`]), or a vault's scout
    /// files ([`Vault::scout_bytes`]); with where the figure comes from.
    pub fn dense_bytes(&self) -> (u64, String) {
        match &self.model {
            Some(m) => (
                m.dense_bytes(),
                format!("the non-expert tensors of {}", self.path.display()),
            ),
            None => (
                self.scout_bytes(),
                format!("scout.* files in {}", self.dir.display()),
            ),
        }
    }

    /// Total bytes of the vault directory's `scout.*` files (docs/format.md §1), 0 when
    /// there are none or the directory cannot be listed. A symbolic link
    /// counts its target (a scout is often a link to the model's file);
    /// anything but a regular file (a FIFO, a directory) counts 0. Only
    /// `stat` is called: no file is opened, so nothing here can block.
    pub fn scout_bytes(&self) -> u64 {
        let Ok(dir) = std::fs::read_dir(&self.dir) else {
            return 0;
        };
        dir.filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with("scout."))
            .filter_map(|e| std::fs::metadata(e.path()).ok())
            .filter(|m| m.is_file())
            .map(|m| m.len())
            .sum()
    }
}

/// A zeroed buffer of `len` bytes for `what`, with capacity for `spare`
/// more, or an error of the NoMemory kind (a failed allocation must not
/// abort the host).
fn zeroed(len: u64, spare: usize, what: &str) -> Result<Vec<u8>> {
    let no_memory = || {
        Error::new(
            ErrorKind::NoMemory,
            format!("cannot allocate {len} bytes for {what}"),
        )
    };
    let n = usize::try_from(len).map_err(|_| no_memory())?;
    let mut v = Vec::new();
    v.try_reserve_exact(n.checked_add(spare).ok_or_else(no_memory)?)
        .map_err(|_| no_memory())?;
    v.resize(n, 0);
    Ok(v)
}

fn dense(h: &Header, layer: u32, expert: u32) -> usize {
    layer as usize * h.n_experts as usize + expert as usize
}

/// Whether `path` names a model to open in place rather than a vault: a
/// directory without `experts.smoe` that holds `model.safetensors` or its
/// index, or a file that is not `experts.smoe` and does not start with a
/// vault's magic. Only `stat` and, for a regular file, an open without
/// blocking and an 8-byte read.
fn is_model(path: &Path) -> Result<bool> {
    let meta = std::fs::metadata(path).map_err(|e| {
        crate::fs_safe::dangling_link(path).unwrap_or_else(|| Error::io("cannot open", path, &e))
    })?;
    if meta.is_dir() {
        if path.join(EXPERTS_FILE).exists() {
            return Ok(false);
        }
        let names = ["model.safetensors", "model.safetensors.index.json"];
        if names.iter().any(|n| path.join(n).exists()) {
            return Ok(true);
        }
        // A link there whose target is gone: named, not "holds neither".
        if let Some(e) = [EXPERTS_FILE, names[0], names[1]]
            .iter()
            .find_map(|n| crate::fs_safe::dangling_link(&path.join(n)))
        {
            return Err(e);
        }
        return Err(Error::path_is(
            ErrorKind::Io,
            path,
            format!(
                "holds neither {EXPERTS_FILE} (a vault) nor model.safetensors or \
                 model.safetensors.index.json (a model)"
            ),
        ));
    }
    if !meta.is_file() || path.file_name().is_some_and(|n| n == EXPERTS_FILE) {
        // A vault's open names what is wrong with it.
        return Ok(false);
    }
    let Ok((file, _)) = sys::open_regular(path) else {
        return Ok(false);
    };
    let mut magic = [0u8; 8];
    Ok(match file.read_at(&mut magic, 0) {
        Ok(8) => magic != format::MAGIC,
        // Shorter than a vault's magic: not a vault; the model reader says
        // what it is not.
        Ok(_) => true,
        Err(_) => false,
    })
}

/// Splits a user path into (`experts.smoe` path, vault directory).
fn resolve(path: &Path) -> Result<(PathBuf, PathBuf)> {
    let meta = std::fs::metadata(path).map_err(|e| Error::io("cannot open vault", path, &e))?;
    if meta.is_dir() {
        let file = path.join(EXPERTS_FILE);
        Ok((file, path.to_path_buf()))
    } else {
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        Ok((path.to_path_buf(), dir))
    }
}
