//! safetensors files, single or sharded, read the way the packer and an
//! in-place open need: the header's tensor table (names, dtypes, shapes,
//! byte ranges) and `__metadata__`; tensor data is never read here, only
//! located.
//!
//! A file is a u64 header length `n`, `n` bytes of JSON (an object of
//! tensor name → `{"dtype", "shape", "data_offsets": [begin, end]}` plus an
//! optional `"__metadata__"` object of strings), then the data; offsets are
//! relative to the data. A sharded checkpoint adds
//! `model.safetensors.index.json`, whose `weight_map` names the shard of
//! every tensor.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use super::json::{self, read_json, MembersError, Value};
use super::{first_duplicate, interrupted, names, open_input, Cancel, Tensor};
use crate::error::{Error, Result};
use crate::fs_safe::{self as files, FileId};
use crate::sys::{self, OpenRegularError};

/// Largest header this reader accepts (the format's own writers cap it at
/// 100 MB).
pub const MAX_HEADER_BYTES: u64 = 100_000_000;

/// Most values one member of a header may hold (a tensor's takes about
/// ten; `__metadata__` one a key): what a member costs before it is
/// checked is bounded by this, not by the header's 100 MB.
pub const MAX_MEMBER_VALUES: u64 = 1 << 16;

/// Most dimensions a tensor's shape may have: real ones have at most five
/// or six; each costs memory for as long as the model is open.
pub const MAX_DIMS: usize = 16;

/// Bytes per element of a safetensors dtype, or None for a dtype this
/// packer does not know (sub-byte types among them).
pub fn dtype_bytes(dtype: &str) -> Option<u64> {
    Some(match dtype {
        "BOOL" | "U8" | "I8" | "F8_E5M2" | "F8_E4M3" | "F8_E8M0" => 1,
        "U16" | "I16" | "F16" | "BF16" => 2,
        "U32" | "I32" | "F32" => 4,
        "U64" | "I64" | "F64" => 8,
        _ => return None,
    })
}

/// One safetensors file's header.
#[derive(Clone, Debug)]
pub struct FileHeader {
    /// The file.
    pub path: PathBuf,
    /// `__metadata__`, as (key, value) strings in file order.
    pub metadata: Vec<(String, String)>,
    /// Tensors, in file order: (name, dtype, shape, absolute offset,
    /// bytes). [`Checkpoint::open`] moves them into its own list.
    pub tensors: Vec<(String, String, Vec<u64>, u64, u64)>,
}

/// Reads and checks the header of the safetensors `file` (opened from
/// `path`): every tensor's range lies in the data section and matches its
/// dtype and shape. `cancel` is asked now and then whether to stop.
pub fn read_header(mut file: &File, path: &Path, cancel: Cancel<'_>) -> Result<FileHeader> {
    let bad = |what: String| Error::format(format!("{}: {what}", path.display()));
    let file_bytes = file
        .metadata()
        .map_err(|e| Error::io("cannot stat", path, &e))?
        .len();
    let mut len = [0u8; 8];
    if file_bytes < 8 {
        return Err(bad(format!(
            "not a safetensors file: {file_bytes} bytes, too short for a header"
        )));
    }
    file.read_exact(&mut len)
        .map_err(|e| Error::io("cannot read", path, &e))?;
    let n = u64::from_le_bytes(len);
    if n > MAX_HEADER_BYTES || n > file_bytes - 8 {
        return Err(bad(format!(
            "not a safetensors file: header length {n} {} (file {file_bytes} bytes)",
            if n > MAX_HEADER_BYTES {
                format!("is above {MAX_HEADER_BYTES}")
            } else {
                "runs past the end".to_owned()
            }
        )));
    }
    let no_memory =
        |what: &str| crate::try_alloc::no_memory(format_args!("{what} of {}", path.display()));
    let mut text =
        crate::try_alloc::zeroed(n as usize, || no_memory(&format!("the {n}-byte header")))?;
    file.read_exact(&mut text)
        .map_err(|e| Error::io("cannot read", path, &e))?;
    let text = String::from_utf8(text)
        .map_err(|_| bad("not a safetensors file: the header is not UTF-8".into()))?;
    let data_offset = 8 + n;
    let data_bytes = file_bytes - data_offset;
    let mut metadata = Vec::new();
    let mut tensors = Vec::new();
    // Member by member: a million-tensor header is never held as a tree.
    let mut each = |name: String, v: Value| -> Result<()> {
        if tensors.len() % 4096 == 4095 && cancel() {
            return Err(interrupted());
        }
        if name == "__metadata__" {
            let m = v
                .as_object()
                .ok_or_else(|| bad("__metadata__ is not an object".into()))?;
            for (k, v) in m {
                let s = v
                    .as_str()
                    .ok_or_else(|| bad(format!("__metadata__ key {k:?} is not a string")))?;
                let s = crate::try_alloc::string(s).ok_or_else(|| no_memory("__metadata__"))?;
                let k = crate::try_alloc::string(k).ok_or_else(|| no_memory("__metadata__"))?;
                crate::try_alloc::push(&mut metadata, (k, s), || no_memory("__metadata__"))?;
            }
            return Ok(());
        }
        if tensors.len() == super::MAX_TENSORS {
            return Err(bad(format!(
                "the header holds more than {} tensors, this reader's cap",
                super::MAX_TENSORS
            )));
        }
        let field = |key: &str| {
            v.get(key)
                .ok_or_else(|| bad(format!("tensor {name} has no {key:?}")))
        };
        let dtype = field("dtype")?
            .as_str()
            .ok_or_else(|| bad(format!("tensor {name}: dtype is not a string")))?;
        let dtype = crate::try_alloc::string(dtype).ok_or_else(|| no_memory("the tensors"))?;
        let dims = field("shape")?
            .as_array()
            .ok_or_else(|| bad(format!("tensor {name}: shape is not an array")))?;
        if dims.len() > MAX_DIMS {
            return Err(bad(format!(
                "tensor {name}: a shape of {} dimensions, above this reader's cap of {MAX_DIMS}",
                dims.len()
            )));
        }
        let mut shape = Vec::new();
        crate::try_alloc::reserve(&mut shape, dims.len(), || no_memory("the tensors"))?;
        for d in dims {
            shape.push(
                d.as_u64()
                    .ok_or_else(|| bad(format!("tensor {name}: shape holds a non-integer")))?,
            );
        }
        let offsets = field("data_offsets")?
            .as_array()
            .and_then(|a| match a {
                [b, e] => Some((b.as_u64()?, e.as_u64()?)),
                _ => None,
            })
            .ok_or_else(|| bad(format!("tensor {name}: data_offsets is not [begin, end]")))?;
        let (begin, end) = offsets;
        if begin > end || end > data_bytes {
            return Err(bad(format!(
                "tensor {name}: data_offsets [{begin}, {end}] lie outside the {data_bytes}-byte data section (truncated?)"
            )));
        }
        let element = dtype_bytes(&dtype).ok_or_else(|| {
            bad(format!(
                "tensor {name} has dtype {dtype}, which this reader does not know"
            ))
        })?;
        let expected = shape
            .iter()
            .try_fold(element, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| bad(format!("tensor {name}: shape {shape:?} overflows")))?;
        if expected != end - begin {
            return Err(bad(format!(
                "tensor {name}: {dtype} {shape:?} needs {expected} bytes, data_offsets give {}",
                end - begin
            )));
        }
        let tensor = (name, dtype, shape, data_offset + begin, end - begin);
        crate::try_alloc::push(&mut tensors, tensor, || no_memory("the tensors"))
    };
    json::parse_members(&text, cancel, MAX_MEMBER_VALUES, &mut each).map_err(|e| match e {
        MembersError::Json(e) if e.cause == json::Cause::NoMemory => no_memory(&format!(
            "the header's values (read up to byte {})",
            e.offset
        )),
        MembersError::Json(e) if e.cause == json::Cause::TooManyValues => {
            bad(format!("header: {e}"))
        }
        MembersError::Json(e) => bad(format!("not a safetensors file: header {e}")),
        MembersError::NotObject(kind) => bad(format!("header is {kind}, expected an object")),
        MembersError::Member(e) => e,
    })?;
    Ok(FileHeader {
        path: path.to_path_buf(),
        metadata,
        tensors,
    })
}

/// A checkpoint: one safetensors file, or the shards of an index.
#[derive(Debug)]
pub struct Checkpoint {
    /// The files, in the order they were read.
    pub files: Vec<FileHeader>,
    /// Every tensor, in file order, file after file.
    pub tensors: Vec<Tensor>,
    /// `config.json` beside the files, if present (for `model_type`,
    /// `num_hidden_layers`, `num_experts_per_tok`, ...).
    pub config: Option<Value>,
    /// Where `config.json` is (or would be).
    pub config_path: PathBuf,
    /// The first file's `__metadata__`.
    pub metadata: Vec<(String, String)>,
    /// The files' handles, in the order of `files`.
    pub handles: Vec<File>,
    /// The identity of every file read: the index, the shards,
    /// `config.json`.
    pub inputs: Vec<FileId>,
    /// Each of `files` as it was before its header was read.
    pub opened_as: Vec<std::fs::Metadata>,
}

/// Where a checkpoint's list of files comes from.
enum Start {
    /// `model.safetensors.index.json`: its `weight_map` names the shards.
    Index(PathBuf),
    /// One `.safetensors` file.
    Single(PathBuf),
}

impl Checkpoint {
    /// Opens `source`: a `.safetensors` file, a directory holding
    /// `model.safetensors` or `model.safetensors.index.json`, or that index.
    /// Every file is opened without blocking and must be a regular file.
    pub fn open(source: &Path, cancel: Cancel<'_>) -> Result<Checkpoint> {
        let (dir, start) = if source.is_dir() {
            let index = source.join("model.safetensors.index.json");
            let single = source.join("model.safetensors");
            // lstat: a link there counts (and is then opened, or refused).
            let present = |p: &Path| std::fs::symlink_metadata(p).is_ok();
            if present(&index) {
                (source.to_path_buf(), Start::Index(index))
            } else if present(&single) {
                (source.to_path_buf(), Start::Single(single))
            } else {
                return Err(Error::argument(format!(
                    "{}: no model.safetensors or model.safetensors.index.json in this directory",
                    source.display()
                )));
            }
        } else {
            let dir = match source.parent() {
                Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
                _ => PathBuf::from("."),
            };
            if source.to_string_lossy().ends_with(".index.json") {
                (dir, Start::Index(source.to_path_buf()))
            } else {
                (dir, Start::Single(source.to_path_buf()))
            }
        };
        let mut inputs = Vec::new();
        let (shards, mapped, index) = match start {
            Start::Index(index) => {
                let (v, meta) = read_json(&index, cancel)?;
                inputs.push(files::file_id(&meta));
                let (shards, mapped) = shard_files(&v, &index, &dir)?;
                (shards, mapped, Some(index))
            }
            Start::Single(single) => {
                let (file, _) = open_input(&single)?;
                (vec![(single, file)], Vec::new(), None)
            }
        };
        let mut files = Vec::new();
        let mut handles = Vec::new();
        let mut tensors = Vec::new();
        let mut opened_as = Vec::new();
        for (i, (path, file)) in shards.into_iter().enumerate() {
            if cancel() {
                return Err(interrupted());
            }
            // Before the header is read: what the file must still be after.
            let before = file
                .metadata()
                .map_err(|e| Error::io("cannot stat", &path, &e))?;
            let mut h = read_header(&file, &path, cancel)?;
            inputs.push(files::file_id(&before));
            opened_as.push(before);
            // Moved, not copied: the checkpoint keeps only each file's path
            // and metadata.
            let list = std::mem::take(&mut h.tensors);
            if tensors.len() + list.len() > super::MAX_TENSORS {
                return Err(Error::format(format!(
                    "{}: its files hold more than {} tensors, this reader's cap",
                    source.display(),
                    super::MAX_TENSORS
                )));
            }
            crate::try_alloc::reserve(&mut tensors, list.len(), || {
                crate::try_alloc::no_memory(format_args!("the tensors of {}", path.display()))
            })?;
            for (entry, (name, dtype, shape, offset, bytes)) in list.into_iter().enumerate() {
                tensors.push(Tensor {
                    name,
                    dtype,
                    shape,
                    file: i,
                    entry,
                    offset,
                    bytes,
                });
            }
            files.push(h);
            handles.push(file);
        }
        // Within a file the JSON reader refused a repeated name already.
        let duplicate = match files.len() {
            1 => None,
            _ => first_duplicate(tensors.iter().map(|t| t.name.as_str())),
        };
        if let Some(name) = duplicate {
            return Err(Error::format(format!(
                "{}: tensor {name} appears in two files",
                source.display()
            )));
        }
        // Every expert tensor the index places is in the shard it names: a
        // stale or mixed-up shard would otherwise lose a layer's experts,
        // which then read as dense. Other names are not checked: converters
        // list tied weights (`lm_head` sharing the embedding) in the map
        // while dropping them from the shards.
        if let Some(index) = &index {
            let placed: HashSet<(&str, usize)> =
                tensors.iter().map(|t| (t.name.as_str(), t.file)).collect();
            if let Some((name, shard)) = mapped.iter().find(|(name, shard)| {
                names::safetensors_expert(name).is_some()
                    && !placed.contains(&(name.as_str(), *shard))
            }) {
                return Err(Error::format(format!(
                    "{}: weight_map puts tensor {name} in {}, which does not hold it (a stale or mixed-up shard?)",
                    index.display(),
                    files[*shard].path.display()
                )));
            }
        }
        let config_path = dir.join("config.json");
        // Missing is fine (the counts then come from the tensors); anything
        // there that cannot be read as a JSON object is an error.
        let config = match std::fs::symlink_metadata(&config_path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            _ => {
                let (v, meta) = read_json(&config_path, cancel)?;
                if v.as_object().is_none() {
                    return Err(Error::format(format!(
                        "{}: holds {}, expected a JSON object",
                        config_path.display(),
                        v.kind()
                    )));
                }
                inputs.push(files::file_id(&meta));
                Some(v)
            }
        };
        let metadata = files
            .first()
            .map(|f| f.metadata.clone())
            .unwrap_or_default();
        Ok(Checkpoint {
            files,
            tensors,
            config,
            config_path,
            metadata,
            handles,
            inputs,
            opened_as,
        })
    }
}

/// The shard files the index `v` (read from `index`) names, each once, in
/// order of first mention, each opened (without blocking: it must be a
/// regular file); and every tensor the index places, with the number of
/// its shard in that list.
type Shards = (Vec<(PathBuf, File)>, Vec<(String, usize)>);
fn shard_files(v: &Value, index: &Path, dir: &Path) -> Result<Shards> {
    let bad = |what: String| Error::format(format!("{}: {what}", index.display()));
    let map = v
        .get("weight_map")
        .and_then(Value::as_object)
        .ok_or_else(|| bad("no weight_map object".into()))?;
    let mut names: Vec<&str> = Vec::new();
    let mut seen: HashMap<&str, usize> = HashMap::new();
    let mut mapped = Vec::with_capacity(map.len());
    for (tensor, file) in map {
        let file = file
            .as_str()
            .ok_or_else(|| bad(format!("weight_map[{tensor:?}] is not a file name")))?;
        if file.contains('/') || file.contains('\\') || file == ".." {
            return Err(bad(format!(
                "weight_map names {file:?}, which is not a file beside the index"
            )));
        }
        let shard = *seen.entry(file).or_insert_with(|| {
            names.push(file);
            names.len() - 1
        });
        mapped.push((tensor.clone(), shard));
    }
    if names.is_empty() {
        return Err(bad("weight_map is empty".into()));
    }
    let shards = names
        .into_iter()
        .map(|n| {
            let p = dir.join(n);
            match sys::open_regular(&p) {
                Ok((file, _)) => Ok((p, file)),
                Err(OpenRegularError::Os(e)) if e.kind() == std::io::ErrorKind::NotFound => {
                    Err(match files::dangling_link(&p) {
                        Some(e) => e.context(format!("{}: shard {n}", index.display())),
                        None => bad(format!(
                            "shard {n} is missing (expected at {})",
                            p.display()
                        )),
                    })
                }
                Err(OpenRegularError::Os(e)) => Err(Error::io("cannot open", &p, &e)),
                Err(OpenRegularError::NotRegular(kind)) => Err(bad(format!(
                    "shard {n} ({}) is {kind}, not a regular file",
                    p.display()
                ))),
            }
        })
        .collect::<Result<_>>()?;
    Ok((shards, mapped))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads the header of a file of `header` (its length in front) and
    /// `data` bytes of data, a hole.
    fn header_err(header: &str, data: u64) -> String {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.safetensors");
        let mut b = (header.len() as u64).to_le_bytes().to_vec();
        b.extend_from_slice(header.as_bytes());
        std::fs::write(&path, &b).unwrap();
        let f = File::options().write(true).open(&path).unwrap();
        f.set_len(b.len() as u64 + data).unwrap();
        match read_header(&File::open(&path).unwrap(), &path, &|| false) {
            Ok(h) => format!(
                "read: {} tensors, {} metadata keys",
                h.tensors.len(),
                h.metadata.len()
            ),
            Err(e) => e.to_string(),
        }
    }

    /// A header's entries are bounded in number, not only in bytes: more
    /// tensors than the cap, a shape of more dimensions than any tensor
    /// has, a `__metadata__` of more values than a member may hold are
    /// refused, naming the count and the cap.
    #[test]
    fn a_header_of_too_many_entries_is_refused() {
        let mut wrong = Vec::new();
        let n = (1usize << 20) + 1;
        let mut many = String::from("{");
        for i in 0..n {
            many.push_str(&format!(
                "\"t.{i}\":{{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}},"
            ));
        }
        many.pop();
        many.push('}');
        let e = header_err(&many, 0);
        if !(e.contains("1048576 tensors") && e.contains("m.safetensors")) {
            wrong.push(e);
        }
        let dims = vec!["1"; 100].join(",");
        let e = header_err(
            &format!("{{\"t\":{{\"dtype\":\"F32\",\"shape\":[{dims}],\"data_offsets\":[0,4]}}}}"),
            4,
        );
        if !(e.contains("tensor t") && e.contains("100 dimensions") && e.contains("16")) {
            wrong.push(e);
        }
        let keys: Vec<String> = (0..100_000).map(|i| format!("\"k{i}\":\"v\"")).collect();
        let e = header_err(&format!("{{\"__metadata__\":{{{}}}}}", keys.join(",")), 0);
        if !(e.contains("__metadata__") && e.contains("65536")) {
            wrong.push(e);
        }
        assert!(wrong.is_empty(), "{wrong:#?}");
    }
}
