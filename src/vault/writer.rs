//! [`VaultWriter`]: writes `experts.smoe` from blobs given in any order.
//!
//! Blob bytes stream straight to disk, each at the next aligned offset, so
//! memory use does not grow with the vault's size (only 48 bytes of table per
//! blob are kept). The table's region is reserved up front for the vault's
//! largest possible entry count, which is what lets data start before the
//! table is known; the unused tail of that region is a hole in the file. The
//! file is written under a temporary name and renamed into place on
//! [`VaultWriter::finish`], so a crash never leaves a half-written vault
//! under the real name.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use xxhash_rust::xxh3::{xxh3_64, Xxh3};

use super::format::{
    check_meta_text, Entry, Header, DEFAULT_ALIGNMENT, ENTRY_BYTES, FLAG_CHECKSUMS, MAX_ALIGNMENT,
    MAX_EXPERT_IDS, MAX_META_BYTES, MIN_ALIGNMENT, VERSION,
};
use super::EXPERTS_FILE;
use crate::error::{Error, ErrorKind, Result};

/// Options for [`VaultWriter::create`].
#[derive(Clone, Debug)]
pub struct WriterOptions {
    /// Page size of the vault; 16384 for every v1 writer.
    pub alignment: u32,
    /// Store each payload's xxh3 (header flag bit 0).
    pub checksums: bool,
    /// Metadata JSON object (docs/format.md §3), or None. At most
    /// [`MAX_META_BYTES`] bytes and no NUL byte, as
    /// every reader requires; [`VaultWriter::create`] refuses other text.
    pub meta: Option<String>,
    /// The vault id; None draws a random one.
    pub vault_id: Option<[u8; 16]>,
}

impl Default for WriterOptions {
    fn default() -> Self {
        WriterOptions {
            alignment: DEFAULT_ALIGNMENT,
            checksums: true,
            meta: None,
            vault_id: None,
        }
    }
}

/// Writes a vault file. See the module doc.
pub struct VaultWriter {
    out: BufWriter<File>,
    tmp_path: PathBuf,
    final_path: PathBuf,
    n_layers: u32,
    n_experts: u32,
    opts: WriterOptions,
    table_offset: u64,
    data_offset: u64,
    /// Where the next blob starts; always a multiple of the alignment.
    next_offset: u64,
    entries: Vec<Entry>,
    /// One bit per dense id: set once that (layer, expert) has a blob.
    seen: Vec<u64>,
    zeros: Vec<u8>,
    finished: bool,
    /// Bytes written since the file was last synced.
    unsynced: u64,
}

/// The writer syncs the file every this many bytes, so the sync at
/// `finish` (and a cancelled writer's cleanup after a signal) waits for at
/// most this much data, not a whole model's worth of page cache.
const SYNC_EVERY_BYTES: u64 = 64 << 20;

impl VaultWriter {
    /// Starts a vault of `n_layers × n_experts` expert ids at `path` (a
    /// directory, which gets `experts.smoe`, or a file path).
    pub fn create(
        path: impl AsRef<Path>,
        n_layers: u32,
        n_experts: u32,
        opts: WriterOptions,
    ) -> Result<VaultWriter> {
        let path = path.as_ref();
        let final_path = if path.is_dir() {
            path.join(EXPERTS_FILE)
        } else {
            path.to_path_buf()
        };
        let a = opts.alignment;
        if !a.is_power_of_two() || !(MIN_ALIGNMENT..=MAX_ALIGNMENT).contains(&a) {
            return Err(Error::argument(format!(
                "alignment is {a}, expected a power of two from {MIN_ALIGNMENT} to {MAX_ALIGNMENT}"
            )));
        }
        let ids = u64::from(n_layers) * u64::from(n_experts);
        if ids == 0 || ids > MAX_EXPERT_IDS {
            return Err(Error::argument(format!(
                "n_layers × n_experts is {n_layers} × {n_experts} = {ids}, expected 1..={MAX_EXPERT_IDS}"
            )));
        }
        let meta_len = opts.meta.as_ref().map_or(0, |m| m.len() as u64);
        if meta_len > MAX_META_BYTES {
            return Err(Error::argument(format!(
                "meta is {meta_len} bytes, expected at most {MAX_META_BYTES} (64 MiB, the readers' limit on metadata)"
            )));
        }
        if let Some(Err(bad)) = opts.meta.as_deref().map(|m| check_meta_text(m.as_bytes())) {
            return Err(Error::argument(format!(
                "meta: {}",
                bad.describe(meta_len as usize, None)
            )));
        }
        let a64 = u64::from(a);
        let table_offset = a64;
        let reserved = ids * ENTRY_BYTES as u64 + meta_len;
        let data_offset = (table_offset + reserved).next_multiple_of(a64);

        let file_name = final_path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| EXPERTS_FILE.to_owned());
        let tmp_path =
            final_path.with_file_name(format!(".{file_name}.tmp-{}", std::process::id()));
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp_path)
            .map_err(|e| Error::io("cannot create", &tmp_path, &e))?;
        let mut out = BufWriter::with_capacity(1 << 20, file);
        out.seek(SeekFrom::Start(data_offset))
            .map_err(|e| Error::io("cannot seek in", &tmp_path, &e))?;
        Ok(VaultWriter {
            out,
            tmp_path,
            final_path,
            n_layers,
            n_experts,
            table_offset,
            data_offset,
            next_offset: data_offset,
            entries: Vec::new(),
            seen: vec![0; ids.div_ceil(64) as usize],
            zeros: vec![0; a as usize],
            opts,
            finished: false,
            unsynced: 0,
        })
    }

    /// Adds the blob of (layer, expert) from memory.
    pub fn add_blob(&mut self, layer: u32, expert: u32, data: &[u8]) -> Result<()> {
        self.add_blob_from(layer, expert, data.len() as u64, &mut &data[..])
    }

    /// Adds the blob of (layer, expert), `size` bytes read from `reader`,
    /// streamed to disk without holding it in memory.
    pub fn add_blob_from(
        &mut self,
        layer: u32,
        expert: u32,
        size: u64,
        reader: &mut dyn Read,
    ) -> Result<()> {
        if layer >= self.n_layers || expert >= self.n_experts {
            return Err(Error::argument(format!(
                "layer {layer} expert {expert} is outside the vault's shape ({} layers × {} experts)",
                self.n_layers, self.n_experts
            )));
        }
        if size == 0 {
            return Err(Error::argument(format!(
                "layer {layer} expert {expert}: a blob needs at least 1 byte"
            )));
        }
        let id = layer as usize * self.n_experts as usize + expert as usize;
        let (word, bit) = (id / 64, 1u64 << (id % 64));
        if self.seen[word] & bit != 0 {
            return Err(Error::argument(format!(
                "layer {layer} expert {expert} was added twice"
            )));
        }
        let a = u64::from(self.opts.alignment);
        let mut hasher = Xxh3::new();
        let mut buf = [0u8; 64 * 1024];
        let mut left = size;
        while left > 0 {
            let n = left.min(buf.len() as u64) as usize;
            reader.read_exact(&mut buf[..n]).map_err(|e| {
                Error::new(
                    ErrorKind::Io,
                    format!(
                        "reading the blob's {size} bytes failed after {}: {e}",
                        size - left
                    ),
                )
                .with_expert(layer, expert)
                .with_length(size)
                .with_os_error(e.raw_os_error())
            })?;
            if self.opts.checksums {
                hasher.update(&buf[..n]);
            }
            self.write(&buf[..n])?;
            left -= n as u64;
        }
        let padded_size = size.next_multiple_of(a);
        let pad = (padded_size - size) as usize;
        if pad > 0 {
            let zeros = std::mem::take(&mut self.zeros);
            let r = self.write(&zeros[..pad]);
            self.zeros = zeros;
            r?;
        }
        self.seen[word] |= bit;
        self.entries.push(Entry {
            layer,
            expert,
            offset: self.next_offset,
            size,
            padded_size,
            xxh3: if self.opts.checksums {
                hasher.digest()
            } else {
                0
            },
        });
        self.next_offset += padded_size;
        Ok(())
    }

    /// Writes the table, metadata and header, syncs the file and moves it to
    /// its final name. Returns the final path.
    pub fn finish(mut self) -> Result<PathBuf> {
        if self.entries.is_empty() {
            return Err(Error::argument(
                "a vault needs at least one blob; none was added",
            ));
        }
        self.entries.sort_unstable_by_key(|e| (e.layer, e.expert));
        let mut table = Vec::with_capacity(self.entries.len() * ENTRY_BYTES);
        for e in &self.entries {
            table.extend_from_slice(&e.encode());
        }
        let meta = self.opts.meta.clone().unwrap_or_default();
        let table_bytes = table.len() as u64;
        let meta_bytes = meta.len() as u64;
        let header = Header {
            version: VERSION,
            alignment: self.opts.alignment,
            n_layers: self.n_layers,
            n_experts: self.n_experts,
            n_entries: self.entries.len() as u32,
            flags: if self.opts.checksums {
                FLAG_CHECKSUMS
            } else {
                0
            },
            table_offset: self.table_offset,
            table_bytes,
            meta_offset: if meta_bytes == 0 {
                0
            } else {
                self.table_offset + table_bytes
            },
            meta_bytes,
            data_offset: self.data_offset,
            file_bytes: self.next_offset,
            vault_id: self.opts.vault_id.unwrap_or_else(random_id),
            table_xxh3: xxh3_64(&table),
            meta_xxh3: if meta_bytes == 0 {
                0
            } else {
                xxh3_64(meta.as_bytes())
            },
        };
        self.flush_seek(0)?;
        let mut page = vec![0u8; self.opts.alignment as usize];
        page[..128].copy_from_slice(&header.encode());
        self.write(&page)?;
        self.write(&table)?;
        self.write(meta.as_bytes())?;
        self.out
            .flush()
            .map_err(|e| Error::io("cannot write", &self.tmp_path, &e))?;
        let file = self.out.get_ref();
        // The data region ended at next_offset; make the length exact even if
        // the last write was the header (it always is, so this is a no-op
        // unless the file was extended by someone else).
        file.set_len(header.file_bytes)
            .and_then(|()| file.sync_all())
            .map_err(|e| Error::io("cannot sync", &self.tmp_path, &e))?;
        std::fs::rename(&self.tmp_path, &self.final_path).map_err(|e| {
            Error::io(
                format_args!("cannot rename {} to", self.tmp_path.display()),
                &self.final_path,
                &e,
            )
        })?;
        if let Some(dir) = self.final_path.parent() {
            let dir = if dir.as_os_str().is_empty() {
                Path::new(".")
            } else {
                dir
            };
            // A directory fsync makes the rename durable; failure to open the
            // directory (some filesystems) is not an error worth failing on.
            if let Ok(d) = File::open(dir) {
                let _ = d.sync_all();
            }
        }
        self.finished = true;
        Ok(self.final_path.clone())
    }

    fn write(&mut self, bytes: &[u8]) -> Result<()> {
        self.out
            .write_all(bytes)
            .map_err(|e| Error::io("cannot write", &self.tmp_path, &e))?;
        self.unsynced += bytes.len() as u64;
        if self.unsynced >= SYNC_EVERY_BYTES {
            self.unsynced = 0;
            self.out
                .flush()
                .and_then(|()| self.out.get_ref().sync_data())
                .map_err(|e| Error::io("cannot sync", &self.tmp_path, &e))?;
        }
        Ok(())
    }

    fn flush_seek(&mut self, to: u64) -> Result<()> {
        self.out
            .seek(SeekFrom::Start(to))
            .map(|_| ())
            .map_err(|e| Error::io("cannot seek in", &self.tmp_path, &e))
    }
}

impl Drop for VaultWriter {
    fn drop(&mut self) {
        if !self.finished {
            let _ = std::fs::remove_file(&self.tmp_path);
        }
    }
}

/// 16 random bytes from the OS, for a vault id: what [`VaultWriter`] uses
/// when [`WriterOptions::vault_id`] is `None`. A writer that must know the
/// id before the vault is finished (to put it in the scout, as the packer
/// does) draws one here and passes it in.
pub fn random_id() -> [u8; 16] {
    let mut id = [0u8; 16];
    let from_os = File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut id));
    if from_os.is_err() {
        // std's hasher keys come from the OS's randomness too; use two.
        use std::hash::{BuildHasher, Hasher};
        for half in id.chunks_mut(8) {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u128(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos()),
            );
            half.copy_from_slice(&h.finish().to_le_bytes());
        }
    }
    id
}

impl std::fmt::Debug for VaultWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VaultWriter")
            .field("path", &self.final_path)
            .field("entries", &self.entries.len())
            .finish()
    }
}
