//! GGUF (v3) read the way the packer and an in-place open need: the
//! header, every key/value kept as its raw bytes (so the packer's scout
//! copies them unchanged), and the tensor infos; tensor data is never read
//! here, only located. Also the parts of a split model ([`gguf_parts`]).
//!
//! Layout of a GGUF file, all little-endian:
//! `"GGUF"`, u32 version, u64 tensor count, u64 key/value count; the
//! key/values (u64-length string key, u32 value type, value); the tensor
//! infos (string name, u32 n_dims ≤ 4, u64 `ne[n_dims]`, u32 GGML type, u64
//! offset relative to the data section); padding to `general.alignment`
//! (32 when absent); the data section.
//!
//! Every count and length is checked against the bytes the file has before
//! anything is allocated for it, and lists grow with the entries really
//! read, so what the reader allocates follows the file, not the header's
//! claims. The counts are capped too ([`MAX_KEY_VALUES`],
//! [`super::MAX_TENSORS`]), since an entry costs far more in memory than
//! in the file, and what grows is allocated fallibly: a process short of
//! memory gets an error, not an abort. The header itself (everything before the data section) may not
//! pass [`MAX_HEADER_BYTES`]: a length field of a sparse or huge file could
//! otherwise ask for as much memory as the file is long. Keys and tensor
//! names keep to the GGUF specification's limits ([`MAX_KEY_BYTES`],
//! [`MAX_NAME_BYTES`]), and a key may appear once (as in llama.cpp's
//! reader).

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use super::{first_duplicate, interrupted, open_input, Cancel};
use crate::error::{Error, ErrorKind, Result};
use crate::sys::{self, OpenRegularError};
use crate::try_alloc;

/// The four bytes every GGUF file starts with.
pub const MAGIC: [u8; 4] = *b"GGUF";
/// Alignment of the data section when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Largest `general.alignment` this reader accepts (writers use 32).
pub const MAX_ALIGNMENT: u64 = 1 << 20;
/// Largest header (magic to the end of the tensor infos) this reader
/// accepts. A real model's is a few MB to a few tens of MB, most of it the
/// tokenizer's vocabulary and merges; what the reader keeps in memory
/// follows the bytes it reads, so this bounds it too.
pub const MAX_HEADER_BYTES: u64 = 256 << 20;
/// Longest key: the GGUF specification's 65,535 bytes.
pub const MAX_KEY_BYTES: u64 = 65_535;
/// Longest tensor name: the GGUF specification's 64 bytes.
pub const MAX_NAME_BYTES: u64 = 64;
/// Most key/values a header may hold. Each costs tens of bytes in memory
/// however few it takes in the file (13 bytes: an empty key and a u8), so
/// the header's byte cap alone let a sparse file claim 20 million; a real
/// model has a few dozen (its vocabulary is one array).
pub const MAX_KEY_VALUES: u64 = 1 << 16;

/// One GGML element type: its name, elements per block and bytes per block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GgmlType {
    /// The type's number in GGUF tensor infos.
    pub id: u32,
    /// ggml's name for it (`Q8_0`, `BF16`, ...).
    pub name: &'static str,
    /// Elements per block (1 for plain types).
    pub block: u64,
    /// Bytes per block.
    pub block_bytes: u64,
}

const QK_K: u64 = 256;

/// ggml's type traits (block size, bytes per block), by type number, as
/// `ggml/src/ggml.c` and gguf-py's `GGML_QUANT_SIZES` define them. Numbers
/// 4, 5 and 31–33, 36–38 are retired in ggml. Where the two disagree,
/// ggml wins, since it is what loads the file: Q8_1's block is two halves
/// and 32 quants, 36 bytes, in `ggml-common.h` (gguf-py still says 40,
/// from when they were floats).
const GGML_TYPES: &[(u32, &str, u64, u64)] = &[
    (0, "F32", 1, 4),
    (1, "F16", 1, 2),
    (2, "Q4_0", 32, 2 + 16),
    (3, "Q4_1", 32, 2 + 2 + 16),
    (6, "Q5_0", 32, 2 + 4 + 16),
    (7, "Q5_1", 32, 2 + 2 + 4 + 16),
    (8, "Q8_0", 32, 2 + 32),
    (9, "Q8_1", 32, 2 + 2 + 32),
    (10, "Q2_K", QK_K, 2 + 2 + QK_K / 16 + QK_K / 4),
    (11, "Q3_K", QK_K, 2 + QK_K / 4 + QK_K / 8 + 12),
    (12, "Q4_K", QK_K, 2 + 2 + QK_K / 2 + 12),
    (13, "Q5_K", QK_K, 2 + 2 + QK_K / 2 + QK_K / 8 + 12),
    (14, "Q6_K", QK_K, 2 + QK_K / 2 + QK_K / 4 + QK_K / 16),
    (15, "Q8_K", QK_K, 4 + QK_K + QK_K / 8),
    (16, "IQ2_XXS", QK_K, 2 + QK_K / 4),
    (17, "IQ2_XS", QK_K, 2 + QK_K / 4 + QK_K / 32),
    (18, "IQ3_XXS", QK_K, 2 + QK_K / 4 + QK_K / 8),
    (19, "IQ1_S", QK_K, 2 + QK_K / 8 + QK_K / 16),
    (20, "IQ4_NL", 32, 2 + 16),
    (21, "IQ3_S", QK_K, 2 + QK_K / 4 + QK_K / 8 + QK_K / 32 + 4),
    (22, "IQ2_S", QK_K, 2 + QK_K / 4 + QK_K / 16),
    (23, "IQ4_XS", QK_K, 2 + 2 + QK_K / 2 + QK_K / 64),
    (24, "I8", 1, 1),
    (25, "I16", 1, 2),
    (26, "I32", 1, 4),
    (27, "I64", 1, 8),
    (28, "F64", 1, 8),
    (29, "IQ1_M", QK_K, QK_K / 8 + QK_K / 16 + QK_K / 32),
    (30, "BF16", 1, 2),
    (34, "TQ1_0", QK_K, 2 + 4 * 13),
    (35, "TQ2_0", QK_K, 2 + 64),
    (39, "MXFP4", 32, 1 + 16),
];

impl GgmlType {
    /// The type numbered `id`, if ggml defines it (as of the types above).
    pub fn from_id(id: u32) -> Option<GgmlType> {
        GGML_TYPES
            .iter()
            .find(|t| t.0 == id)
            .map(|&(id, name, block, block_bytes)| GgmlType {
                id,
                name,
                block,
                block_bytes,
            })
    }

    /// The type named `name` (`Q8_0`, ...).
    #[cfg(test)]
    pub fn from_name(name: &str) -> Option<GgmlType> {
        GGML_TYPES
            .iter()
            .find(|t| t.1 == name)
            .and_then(|t| Self::from_id(t.0))
    }

    /// Bytes of a row of `ne0` elements, or None when `ne0` is not a whole
    /// number of blocks or the product overflows.
    pub fn row_bytes(&self, ne0: u64) -> Option<u64> {
        if ne0 % self.block != 0 {
            return None;
        }
        (ne0 / self.block).checked_mul(self.block_bytes)
    }
}

/// GGUF value types (the u32 before each value): 0 u8, 1 i8, 2 u16, 3 i16,
/// 4 u32, 5 i32, 6 f32, 7 bool, 8 string, 9 array, 10 u64, 11 i64, 12 f64.
mod value_type {
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    /// The byte size of a fixed-size type, None for strings, arrays and
    /// unknown types.
    pub fn fixed_size(t: u32) -> Option<usize> {
        match t {
            0 | 1 | 7 => Some(1),
            2 | 3 => Some(2),
            4..=6 => Some(4),
            10..=12 => Some(8),
            _ => None,
        }
    }
}

/// One key/value of a GGUF file.
#[derive(Clone, Debug, PartialEq)]
pub struct KeyValue {
    /// The key.
    pub key: String,
    /// The value type (0–12).
    pub value_type: u32,
    /// The value's bytes exactly as in the file (after the type word).
    pub raw: Vec<u8>,
}

impl KeyValue {
    /// The value as an unsigned integer, for the integer types.
    pub fn as_u64(&self) -> Option<u64> {
        let b = &self.raw;
        Some(match self.value_type {
            0 => u64::from(*b.first()?),
            2 => u64::from(u16::from_le_bytes(b.get(..2)?.try_into().ok()?)),
            4 => u64::from(u32::from_le_bytes(b.get(..4)?.try_into().ok()?)),
            10 => u64::from_le_bytes(b.get(..8)?.try_into().ok()?),
            1 => u64::try_from(*b.first()? as i8).ok()?,
            3 => u64::try_from(i16::from_le_bytes(b.get(..2)?.try_into().ok()?)).ok()?,
            5 => u64::try_from(i32::from_le_bytes(b.get(..4)?.try_into().ok()?)).ok()?,
            11 => u64::try_from(i64::from_le_bytes(b.get(..8)?.try_into().ok()?)).ok()?,
            _ => return None,
        })
    }

    /// The value as a string, for the string type.
    pub fn as_str(&self) -> Option<&str> {
        if self.value_type != value_type::STRING {
            return None;
        }
        std::str::from_utf8(self.raw.get(8..)?).ok()
    }

    /// A string key/value.
    pub fn string(key: &str, value: &str) -> KeyValue {
        let mut raw = (value.len() as u64).to_le_bytes().to_vec();
        raw.extend_from_slice(value.as_bytes());
        KeyValue {
            key: key.to_owned(),
            value_type: value_type::STRING,
            raw,
        }
    }
}

/// One tensor info of a GGUF file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// The tensor's name.
    pub name: String,
    /// Its dimensions, innermost first (ggml's `ne`).
    pub ne: Vec<u64>,
    /// Its element type.
    pub ggml_type: GgmlType,
    /// Offset of its data from the start of the data section.
    pub offset: u64,
    /// Bytes of its data.
    pub bytes: u64,
}

/// A parsed GGUF file: everything but the tensor data.
#[derive(Clone, Debug)]
pub struct Gguf {
    /// Key/values in file order.
    pub kvs: Vec<KeyValue>,
    /// Tensor infos in file order.
    pub tensors: Vec<TensorInfo>,
    /// The data section's alignment.
    pub alignment: u64,
    /// Absolute offset of the data section.
    pub data_offset: u64,
}

impl Gguf {
    /// The key/value named `key`.
    pub fn kv(&self, key: &str) -> Option<&KeyValue> {
        self.kvs.iter().find(|kv| kv.key == key)
    }

    /// `general.architecture`.
    pub fn architecture(&self) -> Option<&str> {
        self.kv("general.architecture").and_then(KeyValue::as_str)
    }

    /// Parses `file` (opened from `path`, a regular file), checking every
    /// tensor's data lies inside it. Errors name the file and what is
    /// wrong; `cancel` is asked every few thousand entries whether to stop.
    pub fn read(file: &File, path: &Path, cancel: Cancel<'_>) -> Result<Gguf> {
        let file_bytes = file
            .metadata()
            .map_err(|e| Error::io("cannot stat", path, &e))?
            .len();
        let mut r = Reader {
            inner: BufReader::with_capacity(1 << 16, file),
            at: 0,
            len: file_bytes,
            path,
            cancel,
            countdown: CANCEL_EVERY,
        };
        let bad = |what: String| Error::format(format!("{}: {what}", path.display()));
        let mut magic = [0u8; 4];
        r.bytes(&mut magic).map_err(|_| {
            bad(format!(
                "not a GGUF file: {file_bytes} bytes, too short for a header"
            ))
        })?;
        if magic != MAGIC {
            let shown = if magic.iter().all(|b| b.is_ascii_graphic()) {
                format!("{:?}", String::from_utf8_lossy(&magic))
            } else {
                format!(
                    "{:02x} {:02x} {:02x} {:02x}",
                    magic[0], magic[1], magic[2], magic[3]
                )
            };
            return Err(bad(format!(
                "not a GGUF file (magic {shown}, expected \"GGUF\")"
            )));
        }
        let version = r.u32()?;
        if version != 3 {
            return Err(bad(format!(
                "GGUF version {version}, this reader reads version 3"
            )));
        }
        let n_tensors = r.u64()?;
        let n_kvs = r.u64()?;
        // Entries cost far more in memory than in the file: their number
        // is capped, not only their bytes, before one is read.
        let max_tensors = super::MAX_TENSORS as u64;
        if n_kvs > MAX_KEY_VALUES || n_tensors > max_tensors {
            return Err(bad(format!(
                "header claims {n_tensors} tensors and {n_kvs} key/values, above this reader's caps of {max_tensors} tensors and {MAX_KEY_VALUES} key/values (a real model has a few thousand tensors and a few dozen key/values)"
            )));
        }
        // Each key/value takes at least 8 + 4 + 1 bytes, each tensor info
        // 8 + 4 + 8 + 4 + 8: counts beyond what the file, or a header
        // within MAX_HEADER_BYTES, could hold are lies.
        let least = 24 + 13 * n_kvs + 32 * n_tensors;
        if least > file_bytes.min(MAX_HEADER_BYTES) {
            return Err(bad(format!(
                "header claims {n_tensors} tensors and {n_kvs} key/values, at least {least} bytes, more than a {file_bytes}-byte file{} can hold (truncated?)",
                if file_bytes > MAX_HEADER_BYTES {
                    format!("'s header of at most {MAX_HEADER_BYTES} bytes")
                } else {
                    String::new()
                }
            )));
        }
        // Capacity grows with what is really read, not with the header's
        // claims (each entry is far larger in memory than on disk).
        let mut kvs = Vec::with_capacity(n_kvs.min(4096) as usize);
        for i in 0..n_kvs {
            r.tick()?;
            let key = r.string_of("key/value", i, MAX_KEY_BYTES)?;
            let value_type = r.u32()?;
            let mut raw = Vec::new();
            r.value(value_type, &mut raw, 0)
                .map_err(|e| e.context(format!("key/value {key:?}")))?;
            let kv = KeyValue {
                key,
                value_type,
                raw,
            };
            try_alloc::push(&mut kvs, kv, || r.no_memory("the key/values"))?;
        }
        if let Some(key) = first_duplicate(kvs.iter().map(|kv| kv.key.as_str())) {
            return Err(bad(format!("key {key} appears twice")));
        }
        let alignment = match kvs.iter().find(|kv| kv.key == "general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(kv) => match kv.as_u64() {
                Some(a) if a.is_power_of_two() && a <= MAX_ALIGNMENT => a,
                _ => {
                    return Err(bad(format!(
                        "general.alignment is not a power of two up to {MAX_ALIGNMENT}"
                    )))
                }
            },
        };
        let mut tensors = Vec::with_capacity(n_tensors.min(4096) as usize);
        for i in 0..n_tensors {
            r.tick()?;
            let name = r.string_of("tensor info", i, MAX_NAME_BYTES)?;
            let n_dims = r.u32()?;
            if !(1..=4).contains(&n_dims) {
                return Err(bad(format!(
                    "tensor {name}: {n_dims} dimensions, expected 1 to 4"
                )));
            }
            let mut ne = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                ne.push(r.u64()?);
            }
            let type_id = r.u32()?;
            let ggml_type = GgmlType::from_id(type_id).ok_or_else(|| {
                bad(format!(
                    "tensor {name} has GGML type {type_id}, which this reader does not know"
                ))
            })?;
            let offset = r.u64()?;
            let bytes = tensor_bytes(&ne, ggml_type).ok_or_else(|| {
                bad(format!(
                    "tensor {name}: dimensions {ne:?} are not whole {} blocks of {} elements, or overflow",
                    ggml_type.name, ggml_type.block
                ))
            })?;
            let info = TensorInfo {
                name,
                ne,
                ggml_type,
                offset,
                bytes,
            };
            try_alloc::push(&mut tensors, info, || r.no_memory("the tensor infos"))?;
        }
        let data_offset = r.at.next_multiple_of(alignment);
        for t in &tensors {
            let end = data_offset
                .checked_add(t.offset)
                .and_then(|s| s.checked_add(t.bytes));
            if t.offset % alignment != 0 || end.is_none_or(|e| e > file_bytes) {
                return Err(bad(format!(
                    "tensor {}: data at offset {} ({} bytes) is {} (data section at {data_offset}, file {file_bytes} bytes)",
                    t.name,
                    t.offset,
                    t.bytes,
                    if t.offset % alignment != 0 {
                        "not aligned"
                    } else {
                        "outside the file (truncated?)"
                    }
                )));
            }
        }
        if let Some(name) = first_duplicate(tensors.iter().map(|t| t.name.as_str())) {
            return Err(bad(format!("tensor {name} appears twice")));
        }
        Ok(Gguf {
            kvs,
            tensors,
            alignment,
            data_offset,
        })
    }
}

/// Bytes of a tensor of dimensions `ne` and type `t`: rows of `ne[0]`
/// elements in whole blocks.
fn tensor_bytes(ne: &[u64], t: GgmlType) -> Option<u64> {
    let row = t.row_bytes(*ne.first()?)?;
    ne[1..].iter().try_fold(row, |acc, &n| acc.checked_mul(n))
}

/// Entries (key/values, tensor infos, array items) read between two looks
/// at the cancel flag.
const CANCEL_EVERY: u32 = 4096;

struct Reader<'p> {
    inner: BufReader<&'p File>,
    at: u64,
    len: u64,
    path: &'p Path,
    cancel: Cancel<'p>,
    /// Entries left before the next look at `cancel`.
    countdown: u32,
}

impl Reader<'_> {
    /// Counts one entry; every [`CANCEL_EVERY`] asks `cancel`.
    fn tick(&mut self) -> Result<()> {
        self.countdown -= 1;
        if self.countdown == 0 {
            self.countdown = CANCEL_EVERY;
            if (self.cancel)() {
                return Err(interrupted());
            }
        }
        Ok(())
    }

    /// Whether `n` more header bytes are in the file and within
    /// [`MAX_HEADER_BYTES`]; asked before anything is allocated for them.
    fn room_for(&self, n: u64) -> Result<()> {
        if n > self.len - self.at {
            return Err(self.truncated(n));
        }
        if n > MAX_HEADER_BYTES - self.at {
            return Err(Error::format(format!(
                "{}: {n} more header bytes at offset {}, past this reader's limit of {MAX_HEADER_BYTES} bytes for a GGUF header (key/values and tensor infos); a real model's is a few MB",
                self.path.display(),
                self.at
            )));
        }
        Ok(())
    }

    /// The error of an allocation for `what` that failed, at this
    /// reader's offset in its file.
    fn no_memory(&self, what: &str) -> Error {
        try_alloc::no_memory(format_args!(
            "{what} of {} (at offset {} of its header)",
            self.path.display(),
            self.at
        ))
    }

    fn truncated(&self, want: u64) -> Error {
        Error::format(format!(
            "{}: truncated: needs {want} more bytes at offset {}, the file has {}",
            self.path.display(),
            self.at,
            self.len
        ))
    }

    fn bytes(&mut self, buf: &mut [u8]) -> Result<()> {
        self.room_for(buf.len() as u64)?;
        self.inner
            .read_exact(buf)
            .map_err(|e| Error::io("cannot read", self.path, &e))?;
        self.at += buf.len() as u64;
        Ok(())
    }

    fn u32(&mut self) -> Result<u32> {
        let mut b = [0u8; 4];
        self.bytes(&mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    fn u64(&mut self) -> Result<u64> {
        let mut b = [0u8; 8];
        self.bytes(&mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    /// The string that names item `i` of a section (`what`), at most `max`
    /// bytes long.
    fn string_of(&mut self, what: &str, i: u64, max: u64) -> Result<String> {
        self.string(max)
            .map_err(|e| e.context(format!("{what} {i}")))
    }

    fn string(&mut self, max: u64) -> Result<String> {
        let n = self.u64()?;
        if n > max {
            return Err(Error::format(format!(
                "{}: a {n}-byte name at offset {}, above the GGUF limit of {max} bytes",
                self.path.display(),
                self.at - 8
            )));
        }
        self.room_for(n)?;
        let mut b = try_alloc::zeroed(n as usize, || self.no_memory(&format!("a {n}-byte name")))?;
        self.bytes(&mut b)?;
        String::from_utf8(b).map_err(|_| {
            Error::format(format!(
                "{}: a string at offset {} is not UTF-8",
                self.path.display(),
                self.at - n
            ))
        })
    }

    /// Reads one value of type `t`, appending its raw bytes to `out`.
    fn value(&mut self, t: u32, out: &mut Vec<u8>, depth: u32) -> Result<()> {
        let fixed = match t {
            t if value_type::fixed_size(t).is_some() => value_type::fixed_size(t).unwrap_or(0),
            value_type::STRING => {
                let n = self.u64()?;
                self.room_for(n)?;
                // Within MAX_HEADER_BYTES, so it fits a usize.
                try_alloc::reserve(out, 8 + n as usize, || {
                    self.no_memory(&format!("a {n}-byte string"))
                })?;
                out.extend_from_slice(&n.to_le_bytes());
                let start = out.len();
                out.resize(start + n as usize, 0);
                return self.bytes(&mut out[start..]);
            }
            value_type::ARRAY => {
                if depth > 0 {
                    return Err(Error::format(format!(
                        "{}: nested array at offset {}",
                        self.path.display(),
                        self.at
                    )));
                }
                let item_type = self.u32()?;
                let n = self.u64()?;
                // Every item takes at least one byte.
                self.room_for(n)?;
                try_alloc::reserve(out, 12, || self.no_memory("an array"))?;
                out.extend_from_slice(&item_type.to_le_bytes());
                out.extend_from_slice(&n.to_le_bytes());
                for _ in 0..n {
                    self.tick()?;
                    self.value(item_type, out, depth + 1)?;
                }
                return Ok(());
            }
            other => {
                return Err(Error::format(format!(
                    "{}: unknown value type {other} at offset {}",
                    self.path.display(),
                    self.at - 4
                )))
            }
        };
        try_alloc::reserve(out, fixed, || self.no_memory("a value"))?;
        let start = out.len();
        out.resize(start + fixed, 0);
        self.bytes(&mut out[start..])
    }
}

/// The bytes of a GGUF v3 file before its data section, the one writer of
/// that layout (the packer's scout and the benchmark model generator call
/// it): the header, `kvs` as given (raw bytes, in order), the tensor infos
/// of `tensors` with each one's offset set to the next multiple of
/// `alignment` after the previous one's end, and zeros up to the data
/// section, which starts at the returned bytes' length. The tensors' data
/// follows in that order, each padded with zeros to the next offset (and
/// the last one to a multiple of `alignment`). `alignment` is what the
/// reader will take: 32 unless `kvs` set `general.alignment`.
pub fn header_bytes(kvs: &[KeyValue], tensors: &mut [TensorInfo], alignment: u64) -> Vec<u8> {
    let mut head = Vec::new();
    head.extend_from_slice(&MAGIC);
    head.extend_from_slice(&3u32.to_le_bytes());
    head.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    head.extend_from_slice(&(kvs.len() as u64).to_le_bytes());
    let put_str = |head: &mut Vec<u8>, s: &str| {
        head.extend_from_slice(&(s.len() as u64).to_le_bytes());
        head.extend_from_slice(s.as_bytes());
    };
    for kv in kvs {
        put_str(&mut head, &kv.key);
        head.extend_from_slice(&kv.value_type.to_le_bytes());
        head.extend_from_slice(&kv.raw);
    }
    let mut offset = 0u64;
    for t in tensors.iter_mut() {
        t.offset = offset;
        put_str(&mut head, &t.name);
        head.extend_from_slice(&(t.ne.len() as u32).to_le_bytes());
        for &n in &t.ne {
            head.extend_from_slice(&n.to_le_bytes());
        }
        head.extend_from_slice(&t.ggml_type.id.to_le_bytes());
        head.extend_from_slice(&offset.to_le_bytes());
        offset = (offset + t.bytes).next_multiple_of(alignment);
    }
    let data_start = (head.len() as u64).next_multiple_of(alignment);
    head.resize(data_start as usize, 0);
    head
}

/// The parts of a split GGUF (`name-00001-of-0000N.gguf`), or just `path`,
/// each opened (without blocking: it must be a regular file).
pub fn gguf_parts(path: &Path) -> Result<Vec<(PathBuf, File)>> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let single = || open_input(path).map(|(file, _)| vec![(path.to_path_buf(), file)]);
    let Some(stem) = name.strip_suffix(".gguf") else {
        return single();
    };
    // ...-00001-of-00003
    let split = stem.rsplit_once("-of-").and_then(|(head, count)| {
        let (base, index) = head.rsplit_once('-')?;
        let n: u32 = count.parse().ok()?;
        let i: u32 = index.parse().ok()?;
        (count.len() == 5 && index.len() == 5).then_some((base.to_owned(), i, n))
    });
    let Some((base, index, count)) = split else {
        return single();
    };
    if count == 0 || index > count {
        return Err(Error::format(format!(
            "{}: a split part {index} of {count} is not a valid name",
            path.display()
        )));
    }
    if index != 1 {
        return Err(Error::argument(format!(
            "{}: is part {index} of a split model; give the first part, {base}-00001-of-{count:05}.gguf",
            path.display()
        )));
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    (1..=count)
        .map(|i| {
            let p = dir.join(format!("{base}-{i:05}-of-{count:05}.gguf"));
            match sys::open_regular(&p) {
                Ok((file, _)) => Ok((p, file)),
                Err(OpenRegularError::Os(e)) if e.kind() == std::io::ErrorKind::NotFound => {
                    Err(match crate::fs_safe::dangling_link(&p) {
                        Some(e) => e.context(format!("part {i} of {count} of the split model")),
                        None => Error::new(
                            ErrorKind::NotFound,
                            format!(
                                "{}: part {i} of {count} of the split model is missing",
                                p.display()
                            ),
                        ),
                    })
                }
                Err(OpenRegularError::Os(e)) => Err(Error::io("cannot open", &p, &e)),
                Err(OpenRegularError::NotRegular(kind)) => Err(Error::path_is(
                    ErrorKind::Argument,
                    &p,
                    format!(
                        "(part {i} of {count} of the split model) is {kind}, not a regular file"
                    ),
                )),
            }
        })
        .collect()
}

/// Whether `file` starts with the GGUF magic, or `path` is named `.gguf`.
pub fn looks_like_gguf(path: &Path, mut file: &File) -> bool {
    if path.extension().is_some_and(|e| e == "gguf") {
        return true;
    }
    let mut magic = [0u8; 4];
    file.read_exact(&mut magic).is_ok_and(|()| magic == MAGIC)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_table_matches_ggml() {
        let t = |n| GgmlType::from_name(n).unwrap();
        assert_eq!((t("Q8_0").block, t("Q8_0").block_bytes), (32, 34));
        assert_eq!((t("Q4_0").block, t("Q4_0").block_bytes), (32, 18));
        assert_eq!((t("Q4_K").block, t("Q4_K").block_bytes), (256, 144));
        assert_eq!((t("Q5_K").block, t("Q5_K").block_bytes), (256, 176));
        assert_eq!((t("Q6_K").block, t("Q6_K").block_bytes), (256, 210));
        assert_eq!((t("Q2_K").block, t("Q2_K").block_bytes), (256, 84));
        assert_eq!((t("Q3_K").block, t("Q3_K").block_bytes), (256, 110));
        assert_eq!((t("IQ2_XXS").block, t("IQ2_XXS").block_bytes), (256, 66));
        assert_eq!((t("MXFP4").block, t("MXFP4").block_bytes), (32, 17));
        // ggml's size, not gguf-py's 40.
        assert_eq!((t("Q8_1").block, t("Q8_1").block_bytes), (32, 36));
        assert_eq!(GgmlType::from_id(30).unwrap().name, "BF16");
        assert!(GgmlType::from_id(4).is_none(), "retired");
        assert!(GgmlType::from_id(99).is_none());
        assert_eq!(t("Q8_0").row_bytes(64), Some(68));
        assert_eq!(t("Q8_0").row_bytes(48), None);
    }

    /// The start of a GGUF v3 header: magic, version, counts.
    fn head(n_tensors: u64, n_kvs: u64) -> Vec<u8> {
        let mut b = MAGIC.to_vec();
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&n_tensors.to_le_bytes());
        b.extend_from_slice(&n_kvs.to_le_bytes());
        b
    }

    /// Parses `bytes` written to a file of `len` bytes (sparse past them).
    fn read_err(bytes: &[u8], len: u64) -> String {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        std::fs::write(&path, bytes).unwrap();
        let file = File::options().write(true).open(&path).unwrap();
        file.set_len(len.max(bytes.len() as u64)).unwrap();
        let file = File::open(&path).unwrap();
        match Gguf::read(&file, &path, &|| false) {
            Ok(g) => panic!("parsed: {g:?}"),
            Err(e) => e.to_string(),
        }
    }

    /// A length field of a huge (here sparse) file is refused before
    /// anything is allocated for it, naming the limit: without the limit,
    /// the first key would ask for 512 GiB and abort the process.
    #[test]
    fn a_length_beyond_the_header_limit_allocates_nothing() {
        let huge = 1u64 << 40;
        let mut key = head(0, 1);
        key.extend_from_slice(&(1u64 << 39).to_le_bytes());
        let e = read_err(&key, huge);
        assert!(e.contains("above the GGUF limit of 65535 bytes"), "{e}");
        assert!(e.contains("m.gguf") && e.contains("key/value 0"), "{e}");

        let mut value = head(0, 1);
        value.extend_from_slice(&4u64.to_le_bytes());
        value.extend_from_slice(b"a.bc");
        value.extend_from_slice(&value_type::STRING.to_le_bytes());
        value.extend_from_slice(&(1u64 << 39).to_le_bytes());
        let e = read_err(&value, huge);
        assert!(
            e.contains("past this reader's limit of 268435456 bytes"),
            "{e}"
        );
        assert!(e.contains("\"a.bc\""), "{e}");

        let mut array = head(0, 1);
        array.extend_from_slice(&3u64.to_le_bytes());
        array.extend_from_slice(b"a.b");
        array.extend_from_slice(&value_type::ARRAY.to_le_bytes());
        array.extend_from_slice(&0u32.to_le_bytes());
        array.extend_from_slice(&(MAX_HEADER_BYTES + 1).to_le_bytes());
        let e = read_err(&array, huge);
        assert!(e.contains("past this reader's limit"), "{e}");

        let mut name = head(1, 0);
        name.extend_from_slice(&65u64.to_le_bytes());
        name.extend_from_slice(&[b'x'; 65]);
        let e = read_err(&name, 4096);
        assert!(
            e.contains("a 65-byte name") && e.contains("tensor info 0"),
            "{e}"
        );
    }

    /// Counts a header claims beyond this reader's caps on entries are
    /// refused before a single entry is read, naming the count and the
    /// cap: a sparse 256 MiB file of 20.6 million empty keys (13 zero
    /// bytes each) was parsed whole, 2.1 GB and seconds, and then refused
    /// for a repeated key.
    #[test]
    fn counts_beyond_the_entry_caps_are_refused_at_once() {
        let start = std::time::Instant::now();
        let n = (MAX_HEADER_BYTES - 24) / 13;
        let e = read_err(&head(0, n), 24 + 13 * n);
        assert!(
            e.contains(&format!("{n} key/values")) && e.contains("65536"),
            "{e}"
        );
        let took = start.elapsed();
        assert!(took < std::time::Duration::from_secs(1), "took {took:?}");
        let n = (1 << 20) + 1;
        let e = read_err(&head(n, 0), 24 + 32 * n);
        assert!(
            e.contains(&format!("{n} tensors")) && e.contains("1048576"),
            "{e}"
        );
    }

    /// A key that appears twice is refused, as llama.cpp's reader does,
    /// rather than one of the two being taken.
    #[test]
    fn a_repeated_key_is_refused() {
        let kvs = [
            KeyValue::string("general.architecture", "llama"),
            KeyValue::string("general.name", "a"),
            KeyValue::string("general.architecture", "qwen3moe"),
        ];
        let bytes = header_bytes(&kvs, &mut [], DEFAULT_ALIGNMENT);
        let e = read_err(&bytes, 0);
        assert!(e.contains("key general.architecture appears twice"), "{e}");
        let bytes = header_bytes(&kvs[..2], &mut [], DEFAULT_ALIGNMENT);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ok.gguf");
        std::fs::write(&path, &bytes).unwrap();
        let g = Gguf::read(&File::open(&path).unwrap(), &path, &|| false).unwrap();
        assert_eq!(g.architecture(), Some("llama"));
    }

    #[test]
    fn split_names() {
        let dir = tempfile::tempdir().unwrap();
        let p = |n: &str| dir.path().join(n);
        std::fs::write(p("m-00001-of-00002.gguf"), b"x").unwrap();
        let e = gguf_parts(&p("m-00001-of-00002.gguf")).unwrap_err();
        assert!(e.to_string().contains("part 2 of 2"), "{e}");
        std::fs::write(p("m-00002-of-00002.gguf"), b"x").unwrap();
        let paths = |path: &Path| {
            gguf_parts(path).map(|parts| parts.into_iter().map(|(p, _)| p).collect::<Vec<_>>())
        };
        assert_eq!(
            paths(&p("m-00001-of-00002.gguf")).unwrap(),
            vec![p("m-00001-of-00002.gguf"), p("m-00002-of-00002.gguf")]
        );
        assert!(gguf_parts(&p("m-00002-of-00002.gguf")).is_err());
        std::fs::write(p("plain.gguf"), b"x").unwrap();
        assert_eq!(paths(&p("plain.gguf")).unwrap(), vec![p("plain.gguf")]);
        std::fs::write(p("z-00001-of-00000.gguf"), b"x").unwrap();
        let e = gguf_parts(&p("z-00001-of-00000.gguf")).unwrap_err();
        assert!(e.to_string().contains("not a valid name"), "{e}");
        assert!(gguf_parts(&p("m-00003-of-00002.gguf")).is_err());
    }
}
