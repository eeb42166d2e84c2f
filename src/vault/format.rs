//! The bytes of `experts.smoe` (docs/format.md §2): the header, the table entries,
//! their encoding and every rule a reader checks.
//!
//! Everything here is pure: it turns bytes into validated values or values
//! into bytes. It never touches a file and never allocates from a field it has
//! not checked.

use std::ffi::CString;

use crate::error::{Error, Result};
use xxhash_rust::xxh3::xxh3_64;

/// `experts.smoe`'s magic, ASCII.
pub const MAGIC: [u8; 8] = *b"SMOEVALT";
/// The only version this library reads and writes.
pub const VERSION: u32 = 1;
/// Bytes of the header proper; the rest of page 0 is zero.
pub const HEADER_BYTES: usize = 128;
/// Bytes of one table entry.
pub const ENTRY_BYTES: usize = 48;
/// 16384, the crate's one alignment: what every v1 writer aligns blobs to,
/// and the alignment of the streamer's ring, of every slot and of every
/// slot size. It is Apple silicon's page size (a host can wrap the ring in
/// one `MTLBuffer`) and a multiple of every direct-I/O block size. Other
/// modules use this constant rather than a name of their own.
pub const DEFAULT_ALIGNMENT: u32 = 16384;
/// Smallest alignment a reader accepts.
pub const MIN_ALIGNMENT: u32 = 4096;
/// Largest alignment a reader accepts.
pub const MAX_ALIGNMENT: u32 = 1 << 20;
/// Header flag bit 0: entries carry payload checksums.
pub const FLAG_CHECKSUMS: u32 = 1;
pub use crate::limits::{MAX_EXPERT_IDS, MAX_META_BYTES};

/// The validated header of a vault.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    /// Format version (1).
    pub version: u32,
    /// Page size: every offset and padded size is a multiple of it.
    pub alignment: u32,
    /// Layer ids are `0..n_layers`.
    pub n_layers: u32,
    /// Expert ids are `0..n_experts` within each layer.
    pub n_experts: u32,
    /// Number of table entries (blobs).
    pub n_entries: u32,
    /// Bit 0: entries carry payload checksums.
    pub flags: u32,
    /// Offset of the table.
    pub table_offset: u64,
    /// `n_entries × 48`.
    pub table_bytes: u64,
    /// Offset of the metadata JSON, 0 when there is none.
    pub meta_offset: u64,
    /// Bytes of metadata JSON.
    pub meta_bytes: u64,
    /// Offset of the first blob.
    pub data_offset: u64,
    /// Exact length of the file.
    pub file_bytes: u64,
    /// Identifies this vault; binds the histogram file to it.
    pub vault_id: [u8; 16],
    /// xxh3 of the table bytes.
    pub table_xxh3: u64,
    /// xxh3 of the metadata bytes, 0 when there are none.
    pub meta_xxh3: u64,
}

/// One validated table entry: where one expert's blob lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Layer id.
    pub layer: u32,
    /// Expert id within the layer.
    pub expert: u32,
    /// Offset of the blob, a multiple of the alignment.
    pub offset: u64,
    /// Payload bytes.
    pub size: u64,
    /// `size` rounded up to the alignment: the bytes a read covers.
    pub padded_size: u64,
    /// xxh3 of the payload, 0 when the vault carries no checksums.
    pub xxh3: u64,
}

impl Header {
    /// Whether entries carry payload checksums.
    pub fn has_checksums(&self) -> bool {
        self.flags & FLAG_CHECKSUMS != 0
    }

    /// `vault_id` as 32 lowercase hex digits.
    pub fn vault_id_hex(&self) -> String {
        hex(&self.vault_id)
    }

    /// Number of dense expert ids, `n_layers × n_experts` (validated to be at
    /// most [`MAX_EXPERT_IDS`]).
    pub fn expert_ids(&self) -> u64 {
        u64::from(self.n_layers) * u64::from(self.n_experts)
    }

    /// The 128 header bytes, with `header_xxh3` computed.
    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut b = [0u8; HEADER_BYTES];
        b[0..8].copy_from_slice(&MAGIC);
        put_u32(&mut b, 8, self.version);
        put_u32(&mut b, 12, self.alignment);
        put_u32(&mut b, 16, self.n_layers);
        put_u32(&mut b, 20, self.n_experts);
        put_u32(&mut b, 24, self.n_entries);
        put_u32(&mut b, 28, self.flags);
        put_u64(&mut b, 32, self.table_offset);
        put_u64(&mut b, 40, self.table_bytes);
        put_u64(&mut b, 48, self.meta_offset);
        put_u64(&mut b, 56, self.meta_bytes);
        put_u64(&mut b, 64, self.data_offset);
        put_u64(&mut b, 72, self.file_bytes);
        b[80..96].copy_from_slice(&self.vault_id);
        put_u64(&mut b, 96, self.table_xxh3);
        put_u64(&mut b, 104, self.meta_xxh3);
        put_u64(&mut b, 112, 0);
        let sum = xxh3_64(&b[..120]);
        put_u64(&mut b, 120, sum);
        b
    }

    /// Parses and validates the header against every rule of docs/format.md §2 that
    /// the header alone decides, given the real length of the file.
    ///
    /// `bytes` is the start of the file (at most its first 128 bytes are
    /// looked at). Each error names the field and both values.
    pub fn parse(bytes: &[u8], actual_file_bytes: u64) -> Result<Header> {
        if actual_file_bytes == 0 || bytes.is_empty() {
            return Err(Error::format(
                "file is empty: not a smoe vault (expected a 128-byte header starting with \"SMOEVALT\")",
            ));
        }
        if bytes.len() >= 8 && bytes[0..8] != MAGIC {
            return Err(Error::format(format!(
                "magic is {}, expected \"SMOEVALT\": not a smoe vault",
                printable(&bytes[0..8])
            ))
            .with_field("magic"));
        }
        if bytes.len() < HEADER_BYTES {
            if bytes.len() < 8 && !MAGIC.starts_with(bytes) {
                return Err(Error::format(format!(
                    "file is {} bytes and does not start with \"SMOEVALT\": not a smoe vault",
                    bytes.len()
                ))
                .with_field("magic"));
            }
            return Err(Error::format(format!(
                "file is truncated: {} bytes, shorter than the {HEADER_BYTES}-byte header",
                bytes.len()
            )));
        }
        let version = get_u32(bytes, 8);
        if version != VERSION {
            return Err(Error::format(format!(
                "header field version is {version}, expected {VERSION} (this library reads version {VERSION} only)"
            ))
            .with_field("version"));
        }
        let stored_sum = get_u64(bytes, 120);
        let actual_sum = xxh3_64(&bytes[..120]);
        if stored_sum != actual_sum {
            return Err(Error::format(format!(
                "header_xxh3 is {stored_sum:016x} but header bytes 0..120 hash to {actual_sum:016x}: the header is corrupt"
            ))
            .with_field("header_xxh3"));
        }
        let mut vault_id = [0u8; 16];
        vault_id.copy_from_slice(&bytes[80..96]);
        let h = Header {
            version,
            alignment: get_u32(bytes, 12),
            n_layers: get_u32(bytes, 16),
            n_experts: get_u32(bytes, 20),
            n_entries: get_u32(bytes, 24),
            flags: get_u32(bytes, 28),
            table_offset: get_u64(bytes, 32),
            table_bytes: get_u64(bytes, 40),
            meta_offset: get_u64(bytes, 48),
            meta_bytes: get_u64(bytes, 56),
            data_offset: get_u64(bytes, 64),
            file_bytes: get_u64(bytes, 72),
            vault_id,
            table_xxh3: get_u64(bytes, 96),
            meta_xxh3: get_u64(bytes, 104),
        };
        let reserved = get_u64(bytes, 112);
        if reserved != 0 {
            return Err(Error::format(format!(
                "header field reserved (offset 112) is {reserved}, expected 0"
            ))
            .with_field("reserved"));
        }
        h.validate(actual_file_bytes)?;
        Ok(h)
    }

    fn validate(&self, actual_file_bytes: u64) -> Result<()> {
        let a = self.alignment;
        if !a.is_power_of_two() || !(MIN_ALIGNMENT..=MAX_ALIGNMENT).contains(&a) {
            return Err(Error::format(format!(
                "header field alignment is {a}, expected a power of two from {MIN_ALIGNMENT} to {MAX_ALIGNMENT}"
            ))
            .with_field("alignment"));
        }
        let a = u64::from(a);
        if self.file_bytes != actual_file_bytes {
            return Err(Error::format(format!(
                "header field file_bytes is {}, but the file is {actual_file_bytes} bytes{}",
                self.file_bytes,
                if actual_file_bytes < self.file_bytes {
                    " (truncated)"
                } else {
                    ""
                }
            ))
            .with_field("file_bytes"));
        }
        if self.n_layers == 0 {
            return Err(
                Error::format("header field n_layers is 0, expected at least 1")
                    .with_field("n_layers"),
            );
        }
        if self.n_experts == 0 {
            return Err(
                Error::format("header field n_experts is 0, expected at least 1")
                    .with_field("n_experts"),
            );
        }
        let ids = self.expert_ids();
        if ids > MAX_EXPERT_IDS {
            return Err(Error::format(format!(
                "n_layers × n_experts is {} × {} = {ids}, above this reader's limit of {MAX_EXPERT_IDS} expert ids",
                self.n_layers, self.n_experts
            )));
        }
        if self.n_entries == 0 || u64::from(self.n_entries) > ids {
            return Err(Error::format(format!(
                "header field n_entries is {}, expected 1..={ids} (n_layers × n_experts)",
                self.n_entries
            ))
            .with_field("n_entries"));
        }
        if self.flags & !FLAG_CHECKSUMS != 0 {
            return Err(Error::format(format!(
                "header field flags is {:#x}, expected only bit 0 (0x1) to be used",
                self.flags
            ))
            .with_field("flags"));
        }
        if self.table_offset < a || self.table_offset % a != 0 {
            return Err(Error::format(format!(
                "header field table_offset is {}, expected a multiple of alignment {a} that is at least {a}",
                self.table_offset
            ))
            .with_field("table_offset"));
        }
        let want_table = u64::from(self.n_entries) * ENTRY_BYTES as u64;
        if self.table_bytes != want_table {
            return Err(Error::format(format!(
                "header field table_bytes is {}, expected n_entries × {ENTRY_BYTES} = {want_table}",
                self.table_bytes
            ))
            .with_field("table_bytes"));
        }
        let table_end = self
            .table_offset
            .checked_add(self.table_bytes)
            .ok_or_else(|| {
                Error::format(format!(
                    "table_offset {} + table_bytes {} overflows",
                    self.table_offset, self.table_bytes
                ))
                .with_field("table_offset")
            })?;
        if table_end > self.file_bytes {
            return Err(Error::format(format!(
                "table ends at {table_end} (table_offset {} + table_bytes {}), past file_bytes {}",
                self.table_offset, self.table_bytes, self.file_bytes
            ))
            .with_field("table_offset"));
        }
        let mut used_end = table_end;
        if self.meta_bytes == 0 {
            if self.meta_offset != 0 {
                return Err(Error::format(format!(
                    "header field meta_offset is {}, expected 0 because meta_bytes is 0",
                    self.meta_offset
                ))
                .with_field("meta_offset"));
            }
            if self.meta_xxh3 != 0 {
                return Err(Error::format(format!(
                    "header field meta_xxh3 is {:016x}, expected 0 because meta_bytes is 0",
                    self.meta_xxh3
                ))
                .with_field("meta_xxh3"));
            }
        } else {
            if self.meta_offset < table_end {
                return Err(Error::format(format!(
                    "header field meta_offset is {}, expected at least {table_end} (after the table)",
                    self.meta_offset
                ))
            .with_field("meta_offset"));
            }
            let meta_end = self
                .meta_offset
                .checked_add(self.meta_bytes)
                .ok_or_else(|| {
                    Error::format(format!(
                        "meta_offset {} + meta_bytes {} overflows",
                        self.meta_offset, self.meta_bytes
                    ))
                    .with_field("meta_bytes")
                })?;
            if meta_end > self.file_bytes {
                return Err(Error::format(format!(
                    "metadata ends at {meta_end} (meta_offset {} + meta_bytes {}), past file_bytes {}",
                    self.meta_offset, self.meta_bytes, self.file_bytes
                ))
            .with_field("meta_bytes"));
            }
            if self.meta_bytes > MAX_META_BYTES {
                return Err(Error::format(format!(
                    "header field meta_bytes is {}, expected at most {MAX_META_BYTES} (64 MiB, this reader's limit on metadata)",
                    self.meta_bytes
                ))
            .with_field("meta_bytes"));
            }
            used_end = meta_end;
        }
        if self.data_offset % a != 0 || self.data_offset < used_end {
            return Err(Error::format(format!(
                "header field data_offset is {}, expected a multiple of alignment {a} at or after {used_end} (end of table and metadata)",
                self.data_offset
            ))
            .with_field("data_offset"));
        }
        if self.data_offset > self.file_bytes {
            return Err(Error::format(format!(
                "header field data_offset is {}, past file_bytes {}",
                self.data_offset, self.file_bytes
            ))
            .with_field("data_offset"));
        }
        Ok(())
    }
}

impl Entry {
    /// The 48 bytes of this entry.
    pub fn encode(&self) -> [u8; ENTRY_BYTES] {
        let mut b = [0u8; ENTRY_BYTES];
        put_u32(&mut b, 0, self.layer);
        put_u32(&mut b, 4, self.expert);
        put_u64(&mut b, 8, self.offset);
        put_u64(&mut b, 16, self.size);
        put_u64(&mut b, 24, self.padded_size);
        put_u64(&mut b, 32, self.xxh3);
        b
    }

    /// `[offset, offset + padded_size)`, the bytes a read of this blob covers.
    /// Validated not to overflow.
    pub fn end(&self) -> u64 {
        self.offset + self.padded_size
    }
}

/// Parses and validates the table (docs/format.md §2): checksum, sort order, ranges,
/// sizes and overlaps. `table` is exactly `header.table_bytes` long.
pub fn parse_table(header: &Header, table: &[u8]) -> Result<Vec<Entry>> {
    debug_assert_eq!(table.len() as u64, header.table_bytes);
    let sum = xxh3_64(table);
    if sum != header.table_xxh3 {
        return Err(Error::format(format!(
            "header field table_xxh3 is {:016x} but the table hashes to {sum:016x}: the table is corrupt",
            header.table_xxh3
        ))
            .with_field("table_xxh3"));
    }
    let a = u64::from(header.alignment);
    let mut entries: Vec<Entry> = Vec::with_capacity(header.n_entries as usize);
    for (i, raw) in table.chunks_exact(ENTRY_BYTES).enumerate() {
        let e = Entry {
            layer: get_u32(raw, 0),
            expert: get_u32(raw, 4),
            offset: get_u64(raw, 8),
            size: get_u64(raw, 16),
            padded_size: get_u64(raw, 24),
            xxh3: get_u64(raw, 32),
        };
        let reserved = get_u64(raw, 40);
        let fail = |field: Option<&'static str>, msg: String| {
            Err(Error::table_entry(i as u32, e.layer, e.expert, field, msg))
        };
        if e.layer >= header.n_layers {
            return fail(
                Some("layer"),
                format!(
                    "layer is {}, expected less than n_layers {}",
                    e.layer, header.n_layers
                ),
            );
        }
        if e.expert >= header.n_experts {
            return fail(
                Some("expert"),
                format!(
                    "expert is {}, expected less than n_experts {}",
                    e.expert, header.n_experts
                ),
            );
        }
        if let Some(prev) = entries.last() {
            let (p, c) = ((prev.layer, prev.expert), (e.layer, e.expert));
            if c == p {
                return fail(
                    None,
                    format!(
                        "duplicate of entry {}: (layer, expert) ({}, {}) appears twice",
                        i - 1,
                        e.layer,
                        e.expert
                    ),
                );
            }
            if c < p {
                return fail(None, format!(
                    "entries are unsorted: (layer, expert) ({}, {}) follows ({}, {}), expected strictly ascending order",
                    e.layer, e.expert, prev.layer, prev.expert
                ));
            }
        }
        if e.offset % a != 0 {
            return fail(
                Some("offset"),
                format!(
                    "offset is {}, expected a multiple of alignment {a} (misaligned)",
                    e.offset
                ),
            );
        }
        if e.offset < header.data_offset {
            return fail(
                Some("offset"),
                format!(
                    "offset is {}, expected at least data_offset {}",
                    e.offset, header.data_offset
                ),
            );
        }
        if e.size == 0 {
            return fail(Some("size"), "size is 0, expected at least 1".into());
        }
        if e.size > e.padded_size {
            return fail(
                Some("size"),
                format!(
                    "size {} is greater than padded_size {}",
                    e.size, e.padded_size
                ),
            );
        }
        let want_padded = e.size.checked_next_multiple_of(a);
        if want_padded != Some(e.padded_size) {
            return fail(
                Some("padded_size"),
                match want_padded {
                    Some(w) => format!(
                        "padded_size is {}, expected size {} rounded up to alignment {a} = {w}",
                        e.padded_size, e.size
                    ),
                    None => format!("size {} rounded up to alignment {a} overflows", e.size),
                },
            );
        }
        let end = match e.offset.checked_add(e.padded_size) {
            Some(end) => end,
            None => {
                return fail(
                    Some("offset"),
                    format!(
                        "offset {} + padded_size {} overflows",
                        e.offset, e.padded_size
                    ),
                )
            }
        };
        if end > header.file_bytes {
            return fail(
                Some("offset"),
                format!(
                "blob ends at {end} (offset {} + padded_size {}), outside the file (file_bytes {})",
                e.offset, e.padded_size, header.file_bytes
            ),
            );
        }
        if !header.has_checksums() && e.xxh3 != 0 {
            return fail(
                Some("xxh3"),
                format!(
                    "xxh3 is {:016x}, expected 0 because header flags bit 0 (checksums) is clear",
                    e.xxh3
                ),
            );
        }
        if reserved != 0 {
            return fail(
                Some("reserved"),
                format!("reserved (offset 40) is {reserved}, expected 0"),
            );
        }
        entries.push(e);
    }
    check_overlaps(&entries)?;
    Ok(entries)
}

/// Blob ranges must not overlap. Sorted by offset, each range must end at or
/// before the next one starts.
fn check_overlaps(entries: &[Entry]) -> Result<()> {
    let mut by_offset: Vec<u32> = (0..entries.len() as u32).collect();
    by_offset.sort_unstable_by_key(|&i| entries[i as usize].offset);
    for pair in by_offset.windows(2) {
        let (a, b) = (&entries[pair[0] as usize], &entries[pair[1] as usize]);
        if a.end() > b.offset {
            return Err(Error::format(format!(
                "blobs overlap: layer {} expert {} covers [{}, {}) and layer {} expert {} starts at {}",
                a.layer,
                a.expert,
                a.offset,
                a.end(),
                b.layer,
                b.expert,
                b.offset
            ))
            .with_field("offset")
            .with_offset(b.offset));
        }
    }
    Ok(())
}

/// Validates the metadata bytes: checksum, text rules and the shape of a JSON
/// object (the library does not interpret it further; docs/format.md §3). Takes the
/// buffer and returns it as the one C string the vault keeps: its NUL is
/// appended in place (the caller reserves room for it), never a copy.
pub fn parse_meta(header: &Header, mut meta: Vec<u8>) -> Result<CString> {
    let sum = xxh3_64(&meta);
    if sum != header.meta_xxh3 {
        return Err(Error::format(format!(
            "header field meta_xxh3 is {:016x} but the metadata hashes to {sum:016x}: the metadata is corrupt",
            header.meta_xxh3
        ))
            .with_field("meta_xxh3"));
    }
    let text = check_meta_text(&meta).map_err(|bad| {
        Error::format(format!(
            "field meta: {}",
            bad.describe(meta.len(), Some(header.meta_offset))
        ))
        .with_field("meta")
        .with_offset(header.meta_offset.saturating_add(bad.at() as u64))
    })?;
    let trimmed = text.trim();
    if !(trimmed.starts_with('{') && trimmed.ends_with('}')) {
        return Err(Error::format(
            "metadata is not a JSON object (expected text starting with '{' and ending with '}')",
        )
        .with_field("meta"));
    }
    meta.push(0);
    // The text has no NUL (checked above), so this only takes the buffer.
    CString::from_vec_with_nul(meta)
        .map_err(|e| Error::format(format!("field meta: {e}")).with_field("meta"))
}

/// The first byte of metadata that breaks the text rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BadMetaByte {
    /// Not UTF-8 from this byte on.
    NotUtf8 {
        /// Offset of the byte in the metadata.
        at: usize,
        /// The byte.
        byte: u8,
    },
    /// A NUL byte, which would cut the string a C host sees short.
    Nul {
        /// Offset of the byte in the metadata.
        at: usize,
    },
}

impl BadMetaByte {
    /// Offset of the byte in the metadata.
    pub fn at(self) -> usize {
        match self {
            BadMetaByte::NotUtf8 { at, .. } | BadMetaByte::Nul { at } => at,
        }
    }

    /// "byte 13 of 17 (file offset 4157) is NUL: ..." for metadata of `len`
    /// bytes stored at `file_offset`, when it is in a file.
    pub fn describe(self, len: usize, file_offset: Option<u64>) -> String {
        let at = self.at();
        let in_file = file_offset.map_or(String::new(), |o| {
            format!(" (file offset {})", o.saturating_add(at as u64))
        });
        match self {
            BadMetaByte::NotUtf8 { byte, .. } => format!(
                "byte {at} of {len}{in_file} is {byte:#04x}, which is not UTF-8: metadata must be UTF-8 text without NUL bytes"
            ),
            BadMetaByte::Nul { .. } => format!(
                "byte {at} of {len}{in_file} is NUL: metadata must be UTF-8 text without NUL bytes (a C host would see it cut short there)"
            ),
        }
    }
}

/// Metadata is UTF-8 text without a NUL byte (so `smoe_vault_metadata` hands
/// C all of it). Returns the text, or the first byte that breaks either rule.
pub fn check_meta_text(meta: &[u8]) -> std::result::Result<&str, BadMetaByte> {
    let nul = meta.iter().position(|&b| b == 0);
    match std::str::from_utf8(meta) {
        Ok(text) => match nul {
            Some(at) => Err(BadMetaByte::Nul { at }),
            None => Ok(text),
        },
        Err(e) => {
            let at = e.valid_up_to();
            match nul {
                Some(n) if n < at => Err(BadMetaByte::Nul { at: n }),
                _ => Err(BadMetaByte::NotUtf8 { at, byte: meta[at] }),
            }
        }
    }
}

pub use crate::printable::hex;

/// `bytes` as a quoted string when printable ASCII, else as hex.
fn printable(bytes: &[u8]) -> String {
    if bytes.iter().all(|b| b.is_ascii_graphic() || *b == b' ') {
        format!("{:?}", String::from_utf8_lossy(bytes))
    } else {
        format!("0x{}", hex(bytes))
    }
}

fn get_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn get_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}
