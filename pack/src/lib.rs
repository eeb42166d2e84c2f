//! The packer (`smoe pack`): turns a GGUF or safetensors model into a vault
//! (the format is in `docs/format.md`), and reads back the blob layouts it
//! writes ([`layout`]).
//!
//! A crate of its own, apart from the library (`smoe`), so that a host
//! linking the C library never compiles a model reader or a JSON parser.
//! It writes vaults with the library's [`VaultWriter`] and follows the
//! library's file-safety rules (`smoe::internals::files`).
//!
//! It finds the expert tensors by name, gives every layer one blob layout
//! (each expert's slices in the order gate, up or gate_up, down, then
//! biases, each at a multiple of 256 bytes), writes `experts.smoe` with a
//! checksum per blob and the layouts in its metadata, and writes the scout:
//! every other tensor and key/value, in the source's own format.
//!
//! What it must never do:
//! - hold the model, or a stacked tensor of all experts, in memory: blobs
//!   are copied slice by slice through a fixed buffer;
//! - leave a half-written vault: everything is built in a temporary
//!   directory beside the output and renamed into place at the end; an
//!   error or a cancel removes it, and a temporary directory a killed run
//!   left behind is removed by the next run;
//! - replace, even with `force`, a directory that holds anything but a
//!   valid vault's files, or any file the model is read from (by identity,
//!   whatever its name there).

#![warn(missing_docs)]

pub(crate) mod gguf;
mod json;
pub mod layout;
pub(crate) mod safetensors;

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use smoe::internals::files::{self, FileId, FileKind, OpenRegularError};
use smoe::vault::{hex, VaultWriter, WriterOptions, EXPERTS_FILE, FREQ_FILE};
use smoe::{Error, ErrorKind, Result};

use crate::json::Value;
use crate::layout::{BlobLayouts, LayoutItem, ITEM_ALIGNMENT};

/// The kind of model file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceKind {
    /// GGUF v3, single or split.
    Gguf,
    /// safetensors, single or sharded.
    Safetensors,
}

impl SourceKind {
    /// The name the metadata uses.
    pub fn name(self) -> &'static str {
        match self {
            SourceKind::Gguf => "gguf",
            SourceKind::Safetensors => "safetensors",
        }
    }
}

/// Options of [`pack`].
#[derive(Debug, Default)]
pub struct PackOptions<'a> {
    /// Replace an existing output directory that is empty or holds a valid
    /// vault and nothing but a vault's files (none of them the model's).
    pub force: bool,
    /// Set from another thread (a signal handler) to stop early; the
    /// output is then not created and the temporary directory is removed.
    pub cancel: Option<&'a AtomicBool>,
}

/// What [`pack`] wrote.
#[derive(Clone, Debug)]
pub struct PackSummary {
    /// The source's kind.
    pub kind: SourceKind,
    /// The source files read.
    pub files: Vec<PathBuf>,
    /// The model's architecture, where the source says.
    pub arch: Option<String>,
    /// Active experts per token, where the source says.
    pub top_k: Option<u64>,
    /// Layers (the source's block count).
    pub n_layers: u32,
    /// Experts per layer.
    pub n_experts: u32,
    /// Blobs written.
    pub n_entries: u32,
    /// Smallest and largest blob, in bytes.
    pub blob_bytes: (u64, u64),
    /// The dtypes of each role over all layers, roles in blob order.
    pub dtypes: Vec<(String, Vec<String>)>,
    /// Bytes of expert payload.
    pub expert_bytes: u64,
    /// The scout file and its size.
    pub scout: (String, u64),
    /// The layouts written to the metadata.
    pub layouts: BlobLayouts,
    /// The vault directory.
    pub out_dir: PathBuf,
    /// The vault's id, as hex.
    pub vault_id: String,
}

/// A tensor of a source model, wherever it lives: GGUF and safetensors
/// tensors alike, located by file and byte range.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Tensor {
    /// Its name in the source.
    pub name: String,
    /// Index into the source's files (a shard or a split part).
    pub file: usize,
    /// Its position in that file's list of tensors.
    pub entry: usize,
    /// Absolute offset of its data in that file.
    pub offset: u64,
    /// Bytes of its data.
    pub bytes: u64,
    /// Its element type as the source names it (`Q8_0`, `BF16`, ...).
    pub dtype: String,
    /// Its shape, outermost first.
    pub shape: Vec<u64>,
}

/// An expert tensor found by name.
#[derive(Clone, Debug)]
struct ExpertTensor {
    tensor: usize,
    layer: u32,
    role: String,
    /// `Some(e)` for a per-expert tensor, `None` for a stacked one.
    expert: Option<u32>,
}

/// The model as the packer sees it, whatever its format.
struct Model {
    kind: SourceKind,
    files: Vec<PathBuf>,
    /// `files`, opened.
    handles: Vec<File>,
    tensors: Vec<Tensor>,
    experts: Vec<ExpertTensor>,
    arch: Option<String>,
    top_k: Option<u64>,
    /// The source's block count, when it says.
    block_count: Option<u64>,
    /// The source's expert count, when it says.
    expert_count: Option<u64>,
    gguf: Vec<gguf::Gguf>,
    safetensors_metadata: Vec<(String, String)>,
    /// The identity of every file read: parts or shards, the index and
    /// `config.json`.
    inputs: Vec<FileId>,
}

/// A name that occurs more than once, if any.
pub(crate) fn first_duplicate<'a>(names: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    let mut names: Vec<&str> = names.collect();
    names.sort_unstable();
    names.windows(2).find(|w| w[0] == w[1]).map(|w| w[0])
}

/// Asked between steps whether to stop (the pack's cancel flag).
pub(crate) type Cancel<'a> = &'a dyn Fn() -> bool;

/// The error a cancelled pack returns.
pub(crate) fn interrupted() -> Error {
    Error::new(ErrorKind::Io, "interrupted; nothing was written")
}

/// Largest JSON file (`config.json`, `model.safetensors.index.json`) the
/// packer reads; DeepSeek-V3's index, about 92,000 entries, is 8.9 MB.
pub const MAX_JSON_BYTES: u64 = 64 << 20;

/// Opens an input file read-only without blocking (a FIFO does not wait
/// for a writer): it must be a regular file, else an error naming it.
pub(crate) fn open_input(path: &Path) -> Result<(File, std::fs::Metadata)> {
    files::open_regular(path).map_err(|e| match e {
        OpenRegularError::Os(e) => Error::io("cannot open", path, &e),
        OpenRegularError::NotRegular(kind) => Error::path_is(
            ErrorKind::Argument,
            path,
            format!("is {kind}, not a regular file"),
        ),
    })
}

/// Reads the JSON file at `path` ([`open_input`], at most
/// [`MAX_JSON_BYTES`], UTF-8) and parses it. Returns the value and the
/// file's metadata.
pub(crate) fn read_json(path: &Path, cancel: Cancel<'_>) -> Result<(Value, std::fs::Metadata)> {
    let (file, meta) = open_input(path)?;
    let too_big = |n: u64| {
        Error::format(format!(
            "{}: {n} bytes, above the {} MiB cap on JSON files",
            path.display(),
            MAX_JSON_BYTES >> 20
        ))
    };
    if meta.len() > MAX_JSON_BYTES {
        return Err(too_big(meta.len()));
    }
    // Bounded even if the file grows meanwhile.
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(MAX_JSON_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io("cannot read", path, &e))?;
    if bytes.len() as u64 > MAX_JSON_BYTES {
        return Err(too_big(bytes.len() as u64));
    }
    let text = String::from_utf8(bytes).map_err(|e| {
        Error::format(format!(
            "{}: not UTF-8 (invalid byte at offset {})",
            path.display(),
            e.utf8_error().valid_up_to()
        ))
    })?;
    let value = crate::json::parse_cancellable(&text, cancel)
        .map_err(|e| Error::format(format!("{}: {e}", path.display())))?;
    Ok((value, meta))
}

/// Bytes written to the scout between two `fdatasync`s: the final sync
/// (which a Ctrl-C has to wait for) then has at most this much to flush.
const SCOUT_SYNC_BYTES: u64 = 64 << 20;

/// The scout file being written: buffered, and synced every
/// [`SCOUT_SYNC_BYTES`].
pub(crate) struct ScoutFile<'p> {
    out: std::io::BufWriter<File>,
    path: &'p Path,
    unsynced: u64,
}

impl<'p> ScoutFile<'p> {
    /// Creates (or truncates) `path`.
    pub(crate) fn create(path: &'p Path) -> Result<ScoutFile<'p>> {
        let file = File::create(path).map_err(|e| Error::io("cannot create", path, &e))?;
        Ok(ScoutFile {
            out: std::io::BufWriter::with_capacity(1 << 20, file),
            path,
            unsynced: 0,
        })
    }

    /// Flushes and syncs the whole file.
    pub(crate) fn finish(self) -> Result<()> {
        let path = self.path;
        let file = self
            .out
            .into_inner()
            .map_err(|e| Error::io("cannot write", path, e.error()))?;
        file.sync_all()
            .map_err(|e| Error::io("cannot sync", path, &e))
    }
}

impl Write for ScoutFile<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.out.write(buf)?;
        self.unsynced += n as u64;
        if self.unsynced >= SCOUT_SYNC_BYTES {
            self.out.flush()?;
            self.out.get_ref().sync_data()?;
            self.unsynced = 0;
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

/// Role order inside a blob: gate, up, gate_up, down, then biases, then
/// any other role by name.
fn role_rank(role: &str) -> (u8, &str) {
    let rank = match role {
        "gate" => 0,
        "up" => 1,
        "gate_up" => 2,
        "down" => 3,
        "gate_bias" => 4,
        "up_bias" => 5,
        "gate_up_bias" => 6,
        "down_bias" => 7,
        _ => 8,
    };
    (rank, role)
}

/// Recognises `blk.N.ffn_{gate,up,down,gate_up}_exps.{weight,bias}`.
fn gguf_expert(name: &str) -> Option<(u32, String)> {
    let rest = name.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: u32 = layer.parse().ok()?;
    let (stem, suffix) = rest.split_once('.')?;
    let proj = stem.strip_prefix("ffn_")?.strip_suffix("_exps")?;
    if !matches!(proj, "gate" | "up" | "down" | "gate_up") {
        return None;
    }
    let role = match suffix {
        "weight" => proj.to_owned(),
        "bias" => format!("{proj}_bias"),
        _ => return None,
    };
    Some((layer, role))
}

/// Recognises `model.layers.N.<block>.experts.E.<proj>.{weight,bias}` and
/// stacked `model.layers.N.<block>.experts.<name>`.
fn safetensors_expert(name: &str) -> Option<(u32, String, Option<u32>)> {
    // Most tensors are not experts: skip them before splitting the name.
    if !name.starts_with("model.layers.") || !name.contains(".experts.") {
        return None;
    }
    let parts: Vec<&str> = name.split('.').collect();
    let ["model", "layers", layer, block, "experts", rest @ ..] = parts.as_slice() else {
        return None;
    };
    if !matches!(*block, "mlp" | "block_sparse_moe") {
        return None;
    }
    let layer: u32 = layer.parse().ok()?;
    match rest {
        [expert, proj, kind] => {
            let expert: u32 = expert.parse().ok()?;
            let proj = match *proj {
                "gate_proj" | "w1" => "gate",
                "up_proj" | "w3" => "up",
                "down_proj" | "w2" => "down",
                "gate_up_proj" => "gate_up",
                _ => return None,
            };
            let role = match *kind {
                "weight" => proj.to_owned(),
                "bias" => format!("{proj}_bias"),
                _ => return None,
            };
            Some((layer, role, Some(expert)))
        }
        [stacked] => {
            let role = match *stacked {
                "gate_proj" => "gate".to_owned(),
                "up_proj" => "up".to_owned(),
                "down_proj" => "down".to_owned(),
                "gate_up_proj" => "gate_up".to_owned(),
                s => match s.strip_suffix("_proj_bias") {
                    Some(p) => format!("{p}_bias"),
                    None => s.to_owned(),
                },
            };
            Some((layer, role, None))
        }
        _ => None,
    }
}

/// The parts of a split GGUF (`name-00001-of-0000N.gguf`), or just `path`,
/// each opened (without blocking: it must be a regular file).
fn gguf_parts(path: &Path) -> Result<Vec<(PathBuf, File)>> {
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
            match files::open_regular(&p) {
                Ok((file, _)) => Ok((p, file)),
                Err(OpenRegularError::Os(e)) if e.kind() == std::io::ErrorKind::NotFound => {
                    Err(Error::new(
                        ErrorKind::NotFound,
                        format!(
                            "{}: part {i} of {count} of the split model is missing",
                            p.display()
                        ),
                    ))
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
fn looks_like_gguf(path: &Path, mut file: &File) -> bool {
    if path.extension().is_some_and(|e| e == "gguf") {
        return true;
    }
    let mut magic = [0u8; 4];
    file.read_exact(&mut magic)
        .is_ok_and(|()| magic == gguf::MAGIC)
}

fn open_model(source: &Path, cancel: Cancel<'_>) -> Result<Model> {
    let meta = std::fs::metadata(source).map_err(|e| Error::io("cannot open", source, &e))?;
    if meta.is_dir() {
        return open_safetensors(source, cancel);
    }
    // Opened without blocking before a byte is read: a FIFO is refused.
    let (file, _) = open_input(source)?;
    if looks_like_gguf(source, &file) {
        open_gguf(source, cancel)
    } else if source
        .extension()
        .is_some_and(|e| e == "safetensors" || e == "json")
    {
        open_safetensors(source, cancel)
    } else {
        Err(Error::format(format!(
            "{}: not a GGUF or safetensors model (give a .gguf file, a .safetensors file, a model directory or its model.safetensors.index.json)",
            source.display()
        )))
    }
}

fn open_gguf(source: &Path, cancel: Cancel<'_>) -> Result<Model> {
    let (parts, handles): (Vec<PathBuf>, Vec<File>) = gguf_parts(source)?.into_iter().unzip();
    let mut files = Vec::with_capacity(parts.len());
    let mut inputs = Vec::with_capacity(parts.len());
    for (path, file) in parts.iter().zip(&handles) {
        if cancel() {
            return Err(interrupted());
        }
        files.push(gguf::Gguf::read(file, path, cancel)?);
        let meta = file
            .metadata()
            .map_err(|e| Error::io("cannot stat", path, &e))?;
        inputs.push(files::file_id(&meta));
    }
    let mut tensors = Vec::new();
    for (i, g) in files.iter().enumerate() {
        for (entry, t) in g.tensors.iter().enumerate() {
            tensors.push(Tensor {
                name: t.name.clone(),
                file: i,
                entry,
                offset: g.data_offset + t.offset,
                bytes: t.bytes,
                dtype: t.ggml_type.name.to_owned(),
                shape: t.ne.iter().rev().copied().collect(),
            });
        }
    }
    // Within a part, Gguf::read refused a repeated name already.
    let duplicate = match files.len() {
        1 => None,
        _ => first_duplicate(tensors.iter().map(|t| t.name.as_str())),
    };
    if let Some(name) = duplicate {
        return Err(Error::format(format!(
            "{}: tensor {name} appears in two parts of the split model",
            source.display()
        )));
    }
    let first = &files[0];
    let arch = first.architecture().map(str::to_owned);
    let arch_key = |k: &str| {
        arch.as_ref()
            .and_then(|a| first.kv(&format!("{a}.{k}")))
            .and_then(gguf::KeyValue::as_u64)
    };
    let (top_k, block_count, expert_count) = (
        arch_key("expert_used_count"),
        arch_key("block_count"),
        arch_key("expert_count"),
    );
    let experts = tensors
        .iter()
        .enumerate()
        .filter_map(|(i, t)| {
            gguf_expert(&t.name).map(|(layer, role)| ExpertTensor {
                tensor: i,
                layer,
                role,
                expert: None,
            })
        })
        .collect();
    Ok(Model {
        kind: SourceKind::Gguf,
        files: parts,
        handles,
        tensors,
        experts,
        arch,
        top_k,
        block_count,
        expert_count,
        inputs,
        gguf: files,
        safetensors_metadata: Vec::new(),
    })
}

fn open_safetensors(source: &Path, cancel: Cancel<'_>) -> Result<Model> {
    let ckpt = safetensors::Checkpoint::open(source, cancel)?;
    let tensors = ckpt.tensors;
    let config = ckpt.config.as_ref();
    let cfg_u64 = |keys: &[&str]| {
        keys.iter()
            .find_map(|k| config.and_then(|c| c.get(k)).and_then(Value::as_u64))
    };
    let experts = tensors
        .iter()
        .enumerate()
        .filter_map(|(i, t)| {
            safetensors_expert(&t.name).map(|(layer, role, expert)| ExpertTensor {
                tensor: i,
                layer,
                role,
                expert,
            })
        })
        .collect();
    Ok(Model {
        kind: SourceKind::Safetensors,
        files: ckpt.files.iter().map(|f| f.path.clone()).collect(),
        handles: ckpt.handles,
        tensors,
        experts,
        arch: config
            .and_then(|c| c.get("model_type"))
            .and_then(Value::as_str)
            .map(str::to_owned),
        top_k: cfg_u64(&["num_experts_per_tok", "moe_topk", "top_k"]),
        block_count: cfg_u64(&["num_hidden_layers"]),
        expert_count: cfg_u64(&["num_local_experts", "num_experts", "n_routed_experts"]),
        gguf: Vec::new(),
        inputs: ckpt.inputs,
        safetensors_metadata: ckpt.metadata,
    })
}

/// Refuses tensors whose data overlap in a file: each is copied whole, so
/// aliased ranges would let a small file stand for a huge model (a 411 KB
/// GGUF became a 501 MB vault). Empty tensors overlap nothing.
fn check_no_overlap(model: &Model) -> Result<()> {
    let mut order: Vec<&Tensor> = model.tensors.iter().filter(|t| t.bytes > 0).collect();
    order.sort_unstable_by_key(|t| (t.file, t.offset));
    // The tensor of this file seen so far whose data reaches furthest.
    let mut reach: Option<&Tensor> = None;
    let end = |t: &Tensor| t.offset.saturating_add(t.bytes);
    for t in order {
        match reach {
            Some(r) if r.file == t.file && t.offset < end(r) => {
                return Err(Error::format(format!(
                    "{}: tensors {} (bytes {}..{}) and {} (bytes {}..{}) share data; each tensor must have bytes of its own",
                    model.files[t.file].display(),
                    r.name,
                    r.offset,
                    end(r),
                    t.name,
                    t.offset,
                    end(t)
                )));
            }
            Some(r) if r.file == t.file && end(r) >= end(t) => {}
            _ => reach = Some(t),
        }
    }
    Ok(())
}

/// `n` bytes for a person: "1.50 GiB".
fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["bytes", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} bytes")
    } else {
        format!("{v:.2} {}", UNITS[unit])
    }
}

/// An upper bound of the bytes the vault (`experts.smoe` with `meta_bytes`
/// of metadata, and the scout of `scout_tensors`) takes on disk.
fn bytes_needed(
    model: &Model,
    plans: &[LayerPlan],
    (n_layers, n_experts): (u32, u32),
    meta_bytes: u64,
    scout_tensors: &[usize],
) -> u128 {
    // experts.smoe: page 0, the table's region and the metadata, then
    // every blob padded to the alignment (as VaultWriter lays it out).
    let a = u64::from(smoe::vault::DEFAULT_ALIGNMENT);
    let ids = u64::from(n_layers) * u64::from(n_experts);
    let mut needed = u128::from(a)
        + u128::from((ids * smoe::vault::ENTRY_BYTES as u64 + meta_bytes).next_multiple_of(a));
    for p in plans {
        needed += u128::from(p.blob_bytes.next_multiple_of(a)) * u128::from(n_experts);
    }
    // The scout: each tensor's bytes, padded to the GGUF alignment, and a
    // generous allowance for its entry in the header; the key/values.
    let pad = model.gguf.first().map_or(0, |g| g.alignment);
    for &i in scout_tensors {
        let t = &model.tensors[i];
        needed += u128::from(t.bytes) + u128::from(pad);
        needed += (t.name.len() + t.dtype.len() + 128 + 24 * t.shape.len()) as u128;
    }
    let kvs: usize = model.gguf.first().map_or(0, |g| {
        g.kvs
            .iter()
            .map(|kv| kv.key.len() + kv.raw.len() + 12)
            .sum()
    });
    let st: usize = model
        .safetensors_metadata
        .iter()
        .map(|(k, v)| k.len() + v.len() + 8)
        .sum();
    needed + (kvs + st + 4096) as u128
}

/// Refuses, before a byte is written, a vault that would not fit in the
/// free space of the filesystem that is to hold `out_dir`: it would fail
/// after filling the disk.
fn check_free_space(out_dir: &Path, needed: u128) -> Result<()> {
    let Some(free) = smoe::internals::sys::free_bytes(out_dir) else {
        return Ok(()); // not knowable here: the writes will say
    };
    if needed > u128::from(free) {
        let needed = u64::try_from(needed).unwrap_or(u64::MAX);
        return Err(Error::new(
            ErrorKind::Io,
            format!(
                "{}: the vault needs {needed} bytes ({}) but its filesystem has {free} bytes ({}) free",
                out_dir.display(),
                human_bytes(needed),
                human_bytes(free)
            ),
        ));
    }
    Ok(())
}

/// Where one item of one expert's blob comes from.
#[derive(Clone, Copy, Debug)]
struct Slice {
    file: usize,
    offset: u64,
    bytes: u64,
}

/// One layer's plan: its layout and, per item, how to find expert e's
/// slice.
struct LayerPlan {
    layer: u32,
    items: Vec<LayoutItem>,
    /// Per item: a stacked tensor (slice e at `offset + e × stride`), or
    /// one tensor per expert.
    sources: Vec<ItemSource>,
    blob_bytes: u64,
}

enum ItemSource {
    Stacked {
        file: usize,
        offset: u64,
        stride: u64,
    },
    PerExpert(Vec<Slice>),
}

impl LayerPlan {
    fn slice(&self, item: usize, expert: u32) -> Slice {
        match &self.sources[item] {
            ItemSource::Stacked {
                file,
                offset,
                stride,
            } => Slice {
                file: *file,
                offset: offset + u64::from(expert) * stride,
                bytes: *stride,
            },
            ItemSource::PerExpert(slices) => slices[expert as usize],
        }
    }
}

/// Checks the expert tensors and plans every layer's blobs.
fn plan(model: &Model) -> Result<(u32, u32, Vec<LayerPlan>)> {
    if model.experts.is_empty() {
        return Err(Error::format(format!(
            "{}: no expert tensors found ({} tensors; expected names like {})",
            model.files[0].display(),
            model.tensors.len(),
            match model.kind {
                SourceKind::Gguf => "blk.N.ffn_gate_exps.weight",
                SourceKind::Safetensors =>
                    "model.layers.N.mlp.experts.E.gate_proj.weight or model.layers.N.block_sparse_moe.experts.E.w1.weight",
            }
        )));
    }
    let bad = |what: String| Error::format(format!("{}: {what}", model.files[0].display()));
    // The expert count: what the source says, else what the tensors show.
    let shown = |x: &ExpertTensor| match x.expert {
        Some(e) => u64::from(e) + 1,
        None => *model.tensors[x.tensor].shape.first().unwrap_or(&0),
    };
    let n_experts = model
        .expert_count
        .or_else(|| model.experts.iter().map(shown).max());
    if let Some(n) = n_experts {
        for x in &model.experts {
            let t = &model.tensors[x.tensor];
            match x.expert {
                None if shown(x) != n => {
                    return Err(bad(format!(
                        "tensor {} stacks {} experts, the model has {n}",
                        t.name,
                        shown(x)
                    )))
                }
                Some(e) if u64::from(e) >= n => {
                    return Err(bad(format!(
                        "tensor {} is expert {e}, the model has {n} experts",
                        t.name
                    )))
                }
                _ => {}
            }
        }
    }
    let n_experts = n_experts
        .filter(|&n| n > 0)
        .ok_or_else(|| bad("no experts".into()))?;
    let n_experts = u32::try_from(n_experts).map_err(|_| bad(format!("{n_experts} experts")))?;
    // The expert tensor of the highest layer: a name may say any layer up
    // to 2^32 - 1, so the count is reckoned in u64 and checked.
    let top = model
        .experts
        .iter()
        .max_by_key(|x| x.layer)
        .expect("experts is not empty");
    let max_layer = top.layer;
    let (n_layers, from_tensor) = match model.block_count {
        Some(b) if b > u64::from(max_layer) => (b, false),
        Some(b) => {
            return Err(bad(format!(
                "expert tensors of layer {max_layer}, but the block count is {b}"
            )))
        }
        None => (u64::from(max_layer) + 1, true),
    };

    // Before anything is sized by them: a config.json, a header or a
    // tensor's name may claim any count.
    let max_ids = smoe::vault::MAX_EXPERT_IDS;
    let ids = n_layers.saturating_mul(u64::from(n_experts));
    if ids > max_ids {
        let top = &model.tensors[top.tensor];
        return Err(Error::format(if from_tensor {
            format!(
                "{}: tensor {} is in layer {max_layer}, so the model would have {n_layers} layers × {n_experts} experts = {ids} ids, above the vault's limit of {max_ids}",
                model.files[top.file].display(),
                top.name
            )
        } else {
            format!(
                "{}: {n_layers} layers × {n_experts} experts = {ids} ids, above the vault's limit of {max_ids}",
                model.files[0].display()
            )
        }));
    }
    let n_layers = u32::try_from(n_layers).expect("at most MAX_EXPERT_IDS");
    let mut by_layer: BTreeMap<u32, BTreeMap<String, Vec<&ExpertTensor>>> = BTreeMap::new();
    for x in &model.experts {
        by_layer
            .entry(x.layer)
            .or_default()
            .entry(x.role.clone())
            .or_default()
            .push(x);
    }
    let mut plans = Vec::new();
    for (layer, roles) in by_layer {
        let mut roles: Vec<(String, Vec<&ExpertTensor>)> = roles.into_iter().collect();
        roles.sort_by(|a, b| role_rank(&a.0).cmp(&role_rank(&b.0)));
        let mut items = Vec::new();
        let mut sources = Vec::new();
        let mut offset = 0u64;
        for (role, xs) in roles {
            let stacked: Vec<_> = xs.iter().filter(|x| x.expert.is_none()).collect();
            let (tensor_name, dtype, shape, source) = if let [x] = stacked.as_slice() {
                if xs.len() > 1 {
                    return Err(bad(format!(
                        "layer {layer} {role}: both a stacked tensor and per-expert tensors"
                    )));
                }
                let t = &model.tensors[x.tensor];
                let stride = t.bytes / u64::from(n_experts);
                if stride * u64::from(n_experts) != t.bytes || stride == 0 {
                    return Err(bad(format!(
                        "tensor {}: {} bytes do not split into {n_experts} experts",
                        t.name, t.bytes
                    )));
                }
                (
                    t.name.clone(),
                    t.dtype.clone(),
                    t.shape[1..].to_vec(),
                    ItemSource::Stacked {
                        file: t.file,
                        offset: t.offset,
                        stride,
                    },
                )
            } else if !stacked.is_empty() {
                return Err(bad(format!(
                    "layer {layer} {role}: more than one stacked tensor"
                )));
            } else {
                let mut slices: Vec<Option<(Slice, &Tensor)>> = vec![None; n_experts as usize];
                for x in &xs {
                    let e = x.expert.expect("per-expert");
                    let t = &model.tensors[x.tensor];
                    let slot = &mut slices[e as usize];
                    if slot.is_some() {
                        return Err(bad(format!(
                            "layer {layer} {role}: expert {e} appears twice"
                        )));
                    }
                    *slot = Some((
                        Slice {
                            file: t.file,
                            offset: t.offset,
                            bytes: t.bytes,
                        },
                        t,
                    ));
                }
                let first = slices
                    .iter()
                    .flatten()
                    .next()
                    .map(|(_, t)| *t)
                    .expect("xs is not empty");
                let mut out = Vec::with_capacity(slices.len());
                for (e, s) in slices.iter().enumerate() {
                    let Some((slice, t)) = s else {
                        return Err(bad(format!(
                            "layer {layer} {role}: expert {e} is missing (the model has {n_experts} experts)"
                        )));
                    };
                    if (&t.dtype, &t.shape) != (&first.dtype, &first.shape) {
                        return Err(bad(format!(
                            "layer {layer} {role}: {} is {} {:?}, but {} is {} {:?}; every expert of a layer must match",
                            t.name, t.dtype, t.shape, first.name, first.dtype, first.shape
                        )));
                    }
                    out.push(*slice);
                }
                let template = expert_template(&first.name);
                (
                    template,
                    first.dtype.clone(),
                    first.shape.clone(),
                    ItemSource::PerExpert(out),
                )
            };
            let bytes = match &source {
                ItemSource::Stacked { stride, .. } => *stride,
                ItemSource::PerExpert(s) => s[0].bytes,
            };
            items.push(LayoutItem {
                role,
                tensor: tensor_name,
                dtype,
                shape,
                offset,
                bytes,
            });
            sources.push(source);
            offset = (offset + bytes).next_multiple_of(ITEM_ALIGNMENT);
        }
        let blob_bytes = items.last().map_or(0, LayoutItem::end);
        plans.push(LayerPlan {
            layer,
            items,
            sources,
            blob_bytes,
        });
    }
    Ok((n_layers, n_experts, plans))
}

/// `model.layers.3.mlp.experts.7.gate_proj.weight` →
/// `model.layers.3.mlp.experts.{expert}.gate_proj.weight`.
fn expert_template(name: &str) -> String {
    let parts: Vec<&str> = name.split('.').collect();
    parts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            if i == 5 && parts.get(4) == Some(&"experts") {
                "{expert}"
            } else {
                p
            }
        })
        .collect::<Vec<_>>()
        .join(".")
}

/// Reads one blob's items from the source files, with zero padding
/// between them, as one stream for the vault writer.
struct BlobReader<'a> {
    files: &'a [File],
    paths: &'a [PathBuf],
    cancel: Cancel<'a>,
    /// (source, or None for zeros, length) in order.
    parts: Vec<(Option<Slice>, u64)>,
    part: usize,
    done: u64,
}

impl Read for BlobReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        // Asked at every read (64 KiB): a blob can be hundreds of MB.
        if (self.cancel)() {
            return Err(std::io::Error::other("interrupted"));
        }
        while let Some(&(slice, len)) = self.parts.get(self.part) {
            if self.done == len {
                self.part += 1;
                self.done = 0;
                continue;
            }
            let n = (len - self.done).min(buf.len() as u64) as usize;
            match slice {
                None => buf[..n].fill(0),
                Some(s) => {
                    let file = &self.files[s.file];
                    file.read_exact_at(&mut buf[..n], s.offset + self.done)
                        .map_err(|e| {
                            std::io::Error::new(
                                e.kind(),
                                format!("{}: {e}", self.paths[s.file].display()),
                            )
                        })?;
                }
            }
            self.done += n as u64;
            return Ok(n);
        }
        Ok(0)
    }
}

/// Temporary build directories are `.<OUT_DIR name>.smoe-pack-<pid>`.
const TMP_MARKER: &str = ".smoe-pack-";

fn temp_dir_for(out_dir: &Path) -> Result<PathBuf> {
    let name = out_dir
        .file_name()
        .ok_or_else(|| Error::argument(format!("{}: not a directory name", out_dir.display())))?;
    let parent = match out_dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    Ok(parent.join(format!(
        ".{}{TMP_MARKER}{}",
        name.to_string_lossy(),
        std::process::id()
    )))
}

/// Removes temporary directories that killed runs packing into `out_dir`
/// left behind (their process is gone).
fn remove_stale_temp_dirs(out_dir: &Path) {
    let (Some(name), Some(parent)) = (out_dir.file_name(), out_dir.parent()) else {
        return;
    };
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    let prefix = format!(".{}{TMP_MARKER}", name.to_string_lossy());
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        // `.NAME.smoe-pack-PID`, or `.NAME.smoe-pack-PID.old` (a vault
        // moved aside when a killed run was replacing it).
        let Some(pid) = file_name
            .to_str()
            .and_then(|n| n.strip_prefix(&prefix))
            .map(|p| p.strip_suffix(".old").unwrap_or(p))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        if is_dir && pid != std::process::id() && !smoe::internals::sys::process_exists(pid) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// The identity of the file `path` names (links followed), if it exists:
/// the same file reached by another name (a hard link, a symbolic link,
/// `dir/../dir/`) has the same one.
fn file_id(path: &Path) -> Option<FileId> {
    std::fs::metadata(path).ok().map(|m| files::file_id(&m))
}

/// Whether a vault directory may hold a file of this name: the vault, its
/// scout, the claim histogram and the histogram writer's temporary files.
fn is_vault_file_name(name: &str) -> bool {
    name == EXPERTS_FILE
        || name.starts_with("scout.")
        || name == FREQ_FILE
        || files::is_temp_file_name(name, FREQ_FILE)
}

/// Whether `out_dir` may become the vault: it must not exist, or, with
/// `force`, be an empty directory or one that holds a valid vault and
/// nothing else (only regular files named as [`is_vault_file_name`] says,
/// none of them one of `inputs`, the files the model is read from).
/// Nothing is changed either way.
fn check_out_dir(out_dir: &Path, force: bool, inputs: &[FileId]) -> Result<()> {
    let Ok(meta) = std::fs::symlink_metadata(out_dir) else {
        return Ok(());
    };
    if !force {
        return Err(Error::argument(format!(
            "{}: already exists; choose another directory or pass --force to replace a vault there",
            out_dir.display()
        )));
    }
    const RULE: &str =
        "--force replaces only an empty directory or one holding a valid vault and nothing else";
    let refuse = |what: String| {
        Err(Error::argument(format!(
            "{}: {what}; {RULE}",
            out_dir.display()
        )))
    };
    if !meta.is_dir() {
        let kind = FileKind::of(meta.file_type());
        return refuse(format!("is {kind}, not a vault directory"));
    }
    let inputs: std::collections::HashSet<&FileId> = inputs.iter().collect();
    let entries = std::fs::read_dir(out_dir).map_err(|e| Error::io("cannot list", out_dir, &e))?;
    let mut empty = true;
    for entry in entries {
        let entry = entry.map_err(|e| Error::io("cannot list", out_dir, &e))?;
        empty = false;
        let path = entry.path();
        let name = entry.file_name();
        let shown = name.to_string_lossy();
        let lmeta =
            std::fs::symlink_metadata(&path).map_err(|e| Error::io("cannot stat", &path, &e))?;
        let id = files::file_id(&lmeta);
        if inputs.contains(&id) || file_id(&path).is_some_and(|i| inputs.contains(&i)) {
            return refuse(format!("holds {shown}, which is the model being packed"));
        }
        if !name.to_str().is_some_and(is_vault_file_name) {
            return refuse(format!("holds {shown}, which is not a vault's file"));
        }
        if !lmeta.is_file() {
            let kind = FileKind::of(lmeta.file_type());
            return refuse(format!(
                "holds {shown}, which is {kind}, not a vault's file"
            ));
        }
    }
    if empty {
        return Ok(());
    }
    match smoe::vault::Vault::open(out_dir) {
        Ok(_) => Ok(()),
        Err(e) => refuse(format!("does not hold a valid vault ({e})")),
    }
}

/// Removes the temporary directory unless disarmed.
struct TempDir(Option<PathBuf>);

impl Drop for TempDir {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = std::fs::remove_dir_all(p);
        }
    }
}

/// Packs `source` into a vault at `out_dir`. `progress` is called with the
/// bytes copied so far and the total, as the copy goes.
///
/// With `opts.cancel` set, every phase (opening and parsing the model,
/// copying blobs, writing the scout) looks at the flag at least every few
/// megabytes or thousand entries; once it is set, `pack` removes what it
/// wrote and returns an error saying it was interrupted.
pub fn pack(
    source: &Path,
    out_dir: &Path,
    opts: &PackOptions<'_>,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<PackSummary> {
    // Relaxed: a flag set by a signal handler; it publishes nothing else.
    let cancelled = || opts.cancel.is_some_and(|c| c.load(Ordering::Relaxed));
    // Whatever failed once the flag was set (a read the flag cut short, a
    // step it stopped) was the interruption.
    pack_cancellable(source, out_dir, opts.force, &cancelled, progress).map_err(|e| {
        if cancelled() {
            interrupted()
        } else {
            e
        }
    })
}

fn pack_cancellable(
    source: &Path,
    out_dir: &Path,
    force: bool,
    cancelled: Cancel<'_>,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<PackSummary> {
    // Check the output before reading gigabytes (and again before the
    // rename: something may have appeared there meanwhile). Without
    // --force an existing OUT_DIR is refused at once; with it, once every
    // file of the model is known, since none of them may be in there.
    if !force {
        check_out_dir(out_dir, false, &[])?;
    }
    let model = open_model(source, cancelled)?;
    check_out_dir(out_dir, force, &model.inputs)?;
    check_no_overlap(&model)?;
    let (n_layers, n_experts, plans) = plan(&model)?;
    let files = &model.handles;
    if cancelled() {
        return Err(interrupted());
    }

    let vault_id = smoe::vault::random_id();
    let layouts = BlobLayouts {
        layers: plans.iter().map(|p| (p.layer, p.items.clone())).collect(),
    };
    let scout_name = match model.kind {
        SourceKind::Gguf => "scout.gguf",
        SourceKind::Safetensors => "scout.safetensors",
    };
    let meta = metadata(&model, &layouts, scout_name);
    let expert_bytes: u64 = plans
        .iter()
        .map(|p| p.items.iter().map(|i| i.bytes).sum::<u64>() * u64::from(n_experts))
        .sum();
    let expert_set: std::collections::HashSet<usize> =
        model.experts.iter().map(|x| x.tensor).collect();
    let scout_tensors: Vec<usize> = (0..model.tensors.len())
        .filter(|i| !expert_set.contains(i))
        .collect();
    let scout_bytes_in: u64 = scout_tensors.iter().map(|&i| model.tensors[i].bytes).sum();
    let total = expert_bytes + scout_bytes_in;
    let mut copied = 0u64;

    let needed = bytes_needed(
        &model,
        &plans,
        (n_layers, n_experts),
        meta.len() as u64,
        &scout_tensors,
    );
    check_free_space(out_dir, needed)?;
    remove_stale_temp_dirs(out_dir);
    let tmp = temp_dir_for(out_dir)?;
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(|e| Error::io("cannot remove", &tmp, &e))?;
    }
    std::fs::create_dir(&tmp).map_err(|e| Error::io("cannot create", &tmp, &e))?;
    let mut guard = TempDir(Some(tmp.clone()));

    let mut writer = VaultWriter::create(
        &tmp,
        n_layers,
        n_experts,
        WriterOptions {
            meta: Some(meta),
            vault_id: Some(vault_id),
            ..WriterOptions::default()
        },
    )?;
    for p in &plans {
        for e in 0..n_experts {
            if cancelled() {
                return Err(interrupted());
            }
            let mut parts = Vec::with_capacity(p.items.len() * 2);
            let mut at = 0u64;
            for (i, item) in p.items.iter().enumerate() {
                if item.offset > at {
                    parts.push((None, item.offset - at));
                }
                let s = p.slice(i, e);
                parts.push((Some(s), s.bytes));
                at = item.offset + s.bytes;
            }
            let mut reader = BlobReader {
                files,
                paths: &model.files,
                cancel: cancelled,
                parts,
                part: 0,
                done: 0,
            };
            writer
                .add_blob_from(p.layer, e, p.blob_bytes, &mut reader)
                .map_err(|err| err.context(format!("{}", source.display())))?;
            copied += p.blob_bytes;
            progress(copied, total);
        }
    }
    let vault_file = writer.finish()?;
    debug_assert_eq!(vault_file, tmp.join(EXPERTS_FILE));

    let scout_path = tmp.join(scout_name);
    let mut copy_tensor = |i: usize, w: &mut dyn Write| -> Result<()> {
        if cancelled() {
            return Err(interrupted());
        }
        let t = &model.tensors[scout_tensors[i]];
        copy_range(
            &files[t.file],
            &model.files[t.file],
            t.offset,
            t.bytes,
            w,
            cancelled,
        )
        .map_err(|e| e.context(format!("tensor {}", t.name)))?;
        copied += t.bytes;
        progress(copied, total);
        Ok(())
    };
    write_scout(
        &model,
        &scout_tensors,
        &vault_id,
        &scout_path,
        &mut copy_tensor,
    )?;
    let scout_size = std::fs::metadata(&scout_path)
        .map_err(|e| Error::io("cannot stat", &scout_path, &e))?
        .len();
    files::sync_dir(&tmp)?;
    if cancelled() {
        return Err(interrupted());
    }

    // Into place: the old vault (with --force) is moved aside first, so a
    // failure between the renames leaves one of the two whole.
    check_out_dir(out_dir, force, &model.inputs)?;
    if std::fs::symlink_metadata(out_dir).is_ok() {
        let aside = PathBuf::from(format!("{}.old", tmp.display()));
        std::fs::rename(out_dir, &aside)
            .map_err(|e| Error::io("cannot move aside", out_dir, &e))?;
        if let Err(e) = std::fs::rename(&tmp, out_dir) {
            let _ = std::fs::rename(&aside, out_dir);
            return Err(Error::io("cannot rename the new vault to", out_dir, &e));
        }
        let _ = std::fs::remove_dir_all(&aside);
    } else {
        std::fs::rename(&tmp, out_dir)
            .map_err(|e| Error::io("cannot rename the new vault to", out_dir, &e))?;
    }
    guard.0 = None;
    if let Some(parent) = out_dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        let _ = files::sync_dir(parent);
    }

    let mut dtypes: Vec<(String, Vec<String>)> = Vec::new();
    for p in &plans {
        for item in &p.items {
            let at = match dtypes.iter().position(|(r, _)| *r == item.role) {
                Some(at) => at,
                None => {
                    dtypes.push((item.role.clone(), Vec::new()));
                    dtypes.len() - 1
                }
            };
            if !dtypes[at].1.contains(&item.dtype) {
                dtypes[at].1.push(item.dtype.clone());
            }
        }
    }
    dtypes.sort_by(|a, b| role_rank(&a.0).cmp(&role_rank(&b.0)));
    let blob_min = plans.iter().map(|p| p.blob_bytes).min().unwrap_or(0);
    let blob_max = plans.iter().map(|p| p.blob_bytes).max().unwrap_or(0);
    Ok(PackSummary {
        kind: model.kind,
        files: model.files.clone(),
        arch: model.arch.clone(),
        top_k: model.top_k,
        n_layers,
        n_experts,
        n_entries: plans.len() as u32 * n_experts,
        blob_bytes: (blob_min, blob_max),
        dtypes,
        expert_bytes,
        scout: (scout_name.to_owned(), scout_size),
        layouts,
        out_dir: out_dir.to_path_buf(),
        vault_id: hex(&vault_id),
    })
}

/// Copies `bytes` bytes at `offset` of `file` to `w`, 1 MiB at a time,
/// asking `cancel` before each.
fn copy_range(
    file: &File,
    path: &Path,
    offset: u64,
    bytes: u64,
    w: &mut dyn Write,
    cancel: Cancel<'_>,
) -> Result<()> {
    let mut buf = vec![0u8; (1 << 20).min(bytes.max(1) as usize)];
    let mut done = 0u64;
    while done < bytes {
        if cancel() {
            return Err(interrupted());
        }
        let n = (bytes - done).min(buf.len() as u64) as usize;
        file.read_exact_at(&mut buf[..n], offset + done)
            .map_err(|e| Error::io("cannot read", path, &e))?;
        w.write_all(&buf[..n])
            .map_err(|e| Error::new(ErrorKind::Io, format!("cannot write the scout: {e}")))?;
        done += n as u64;
    }
    Ok(())
}

fn metadata(model: &Model, layouts: &BlobLayouts, scout: &str) -> String {
    let files = model
        .files
        .iter()
        .map(|p| {
            Value::from(
                p.file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
            )
        })
        .collect();
    let mut members: Vec<(String, Value)> = vec![
        ("format".into(), "smoe-vault".into()),
        (
            "writer".into(),
            format!("smoe pack {}", env!("CARGO_PKG_VERSION")).into(),
        ),
        (
            "source".into(),
            Value::Object(vec![
                ("kind".into(), model.kind.name().into()),
                ("files".into(), Value::Array(files)),
            ]),
        ),
    ];
    if let Some(arch) = &model.arch {
        members.push(("arch".into(), arch.as_str().into()));
    }
    if let Some(k) = model.top_k {
        members.push(("top_k".into(), k.into()));
    }
    members.push(("scout".into(), scout.into()));
    members.push(("layer_blob_layouts".into(), layouts.to_json()));
    Value::Object(members).to_json()
}

/// Writes the scout: the source's non-expert `tensors`, copied by `copy`,
/// in the source's format, with `smoe.vault_id` added to its key/values.
/// Writes the scout: the source's non-expert `tensors`, copied by `copy`,
/// in the source's own format, with `smoe.vault_id` added to its
/// key/values (GGUF) or `__metadata__` (safetensors).
fn write_scout(
    model: &Model,
    tensors: &[usize],
    vault_id: &[u8; 16],
    path: &Path,
    copy: &mut dyn FnMut(usize, &mut dyn Write) -> Result<()>,
) -> Result<()> {
    match model.kind {
        SourceKind::Gguf => {
            let first = &model.gguf[0];
            // The scout is one file: the split keys of a split source do not apply.
            let mut kvs: Vec<gguf::KeyValue> = first
                .kvs
                .iter()
                .filter(|kv| !kv.key.starts_with("split.") && kv.key != "smoe.vault_id")
                .cloned()
                .collect();
            kvs.push(gguf::KeyValue::string("smoe.vault_id", &hex(vault_id)));
            let infos: Vec<gguf::TensorInfo> = tensors
                .iter()
                .map(|&i| {
                    let t = &model.tensors[i];
                    model.gguf[t.file].tensors[t.entry].clone()
                })
                .collect();
            gguf::write(path, &kvs, &infos, first.alignment, copy)
        }
        SourceKind::Safetensors => {
            let mut metadata: Vec<(String, Value)> = model
                .safetensors_metadata
                .iter()
                .filter(|(k, _)| k != "smoe.vault_id")
                .map(|(k, v)| (k.clone(), v.as_str().into()))
                .collect();
            metadata.push(("smoe.vault_id".into(), hex(vault_id).into()));
            let mut members = vec![("__metadata__".to_owned(), Value::Object(metadata))];
            let mut offset = 0u64;
            for &i in tensors {
                let t = &model.tensors[i];
                members.push((
                    t.name.clone(),
                    Value::Object(vec![
                        ("dtype".into(), t.dtype.as_str().into()),
                        (
                            "shape".into(),
                            Value::Array(t.shape.iter().map(|&d| d.into()).collect()),
                        ),
                        (
                            "data_offsets".into(),
                            Value::Array(vec![offset.into(), (offset + t.bytes).into()]),
                        ),
                    ]),
                ));
                offset += t.bytes;
            }
            let mut header = Value::Object(members).to_json();
            // Pad with spaces so the data starts 8-byte aligned, as the format's
            // own writer does.
            while (header.len() + 8) % 8 != 0 {
                header.push(' ');
            }
            let mut w = ScoutFile::create(path)?;
            let io = |e: std::io::Error| Error::io("cannot write", path, &e);
            w.write_all(&(header.len() as u64).to_le_bytes())
                .map_err(io)?;
            w.write_all(header.as_bytes()).map_err(io)?;
            for i in 0..tensors.len() {
                copy(i, &mut w)?;
            }
            w.finish()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_recognised() {
        assert_eq!(
            gguf_expert("blk.3.ffn_gate_exps.weight"),
            Some((3, "gate".into()))
        );
        assert_eq!(
            gguf_expert("blk.0.ffn_gate_up_exps.bias"),
            Some((0, "gate_up_bias".into()))
        );
        assert_eq!(gguf_expert("blk.3.ffn_gate_shexp.weight"), None);
        assert_eq!(gguf_expert("blk.3.ffn_gate_inp.weight"), None);
        assert_eq!(gguf_expert("blk.3.exp_probs_b.bias"), None);
        assert_eq!(
            safetensors_expert("model.layers.2.block_sparse_moe.experts.7.w3.weight"),
            Some((2, "up".into(), Some(7)))
        );
        assert_eq!(
            safetensors_expert("model.layers.1.mlp.experts.10.down_proj.weight"),
            Some((1, "down".into(), Some(10)))
        );
        assert_eq!(
            safetensors_expert("model.layers.1.mlp.experts.gate_up_proj_bias"),
            Some((1, "gate_up_bias".into(), None))
        );
        assert_eq!(
            safetensors_expert("model.layers.1.mlp.shared_experts.gate_proj.weight"),
            None
        );
        assert_eq!(
            safetensors_expert("model.layers.1.mlp.shared_expert.up_proj.weight"),
            None
        );
        assert_eq!(safetensors_expert("model.layers.1.mlp.gate.weight"), None);
        assert_eq!(
            expert_template("model.layers.3.mlp.experts.7.gate_proj.weight"),
            "model.layers.3.mlp.experts.{expert}.gate_proj.weight"
        );
    }

    /// A config.json may claim any expert count: it is checked against the
    /// id cap before anything is sized by it.
    #[test]
    fn a_huge_claimed_expert_count_is_refused_before_allocating() {
        let dir = tempfile::tempdir().unwrap();
        let header = r#"{"model.layers.0.mlp.experts.0.up_proj.weight":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}}"#;
        let mut file = (header.len() as u64).to_le_bytes().to_vec();
        file.extend_from_slice(header.as_bytes());
        file.extend_from_slice(&[0u8; 16]);
        std::fs::write(dir.path().join("model.safetensors"), file).unwrap();
        std::fs::write(
            dir.path().join("config.json"),
            r#"{"num_local_experts": 4000000000, "num_hidden_layers": 1}"#,
        )
        .unwrap();
        let e = pack(
            dir.path(),
            &dir.path().join("out"),
            &PackOptions::default(),
            &mut |_, _| {},
        )
        .unwrap_err();
        assert!(e.to_string().contains("above the vault's limit"), "{e}");
        assert!(!dir.path().join("out").exists());
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
