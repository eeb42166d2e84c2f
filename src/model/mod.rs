//! Model files read in place: GGUF (single or split) and safetensors
//! (single or sharded), opened from their headers into one [`Model`] (every
//! tensor located by file and byte range, the expert tensors found by
//! name), and [`plan`]ned into the blobs a vault of it holds. The packer
//! (`smoe-pack`) opens and plans through this module and only writes; an
//! in-place open is to read the same table, so both see the same experts.
//!
//! This module owns:
//! - the readers: [`gguf`] (and the parts of a split model), `safetensors`
//!   (headers read member by member, the shards of an index, `config.json`)
//!   and `json` (serde_json with duplicate keys refused, order kept,
//!   cancellable), the last two only with the `safetensors` feature;
//! - the expert-name grammar ([`names`]);
//! - the checks and the per-layer blob layouts ([`plan`], [`check_no_overlap`]);
//! - the aligned windows an in-place read will use to bring each expert's
//!   slices to the same offsets in every slot of its layer ([`window`]);
//! - a model's identity and the cache directory of its own files
//!   ([`identity`]), since nothing is written beside a model.
//!
//! What it must never do: read tensor data (only headers: a model of any
//! size opens in memory that follows its tensor count), block on a FIFO
//! (every input is opened without blocking and must be a regular file),
//! panic or allocate what a header merely claims on any input, or know of
//! C. Every error names the file and what is wrong.

pub mod gguf;
pub mod identity;
#[cfg(feature = "safetensors")]
pub mod json;
pub mod meta;
pub mod names;
mod plan;
#[cfg(feature = "safetensors")]
mod safetensors;
pub mod window;

use std::fs::File;
use std::path::{Path, PathBuf};

pub use plan::{check_no_overlap, plan, LayerPlan, LayoutItem, Slice, ITEM_ALIGNMENT};

use crate::error::{Error, ErrorKind, Result};
use crate::fs_safe::{self as files, FileId};
use crate::sys::{self, OpenRegularError};

/// Most tensors a model may have, all its files together. Each costs a
/// few hundred bytes in memory (its name, type and shape, in the reader's
/// list and the model's), so the headers' byte caps alone let a crafted
/// header of tiny entries claim gigabytes; the largest real checkpoints
/// (one tensor per expert) have about 150,000.
pub const MAX_TENSORS: usize = 1 << 20;

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

/// A tensor of a source model, wherever it lives: GGUF and safetensors
/// tensors alike, located by file and byte range.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tensor {
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

/// An expert tensor found by name ([`names`]).
#[derive(Clone, Debug)]
pub struct ExpertTensor {
    /// Index into [`Model::tensors`].
    pub tensor: usize,
    /// Its layer (the source's block number).
    pub layer: u32,
    /// Its role in a blob: `gate`, `up`, `gate_up`, `down`, a `_bias` form,
    /// or a stacked tensor's own name.
    pub role: String,
    /// `Some(e)` for a per-expert tensor, `None` for a stacked one.
    pub expert: Option<u32>,
}

/// A model as its headers describe it, whatever its format.
#[derive(Debug)]
pub struct Model {
    /// The source's kind.
    pub kind: SourceKind,
    /// The files the tensors are in: split parts or shards, in order.
    pub files: Vec<PathBuf>,
    /// `files`, opened.
    pub handles: Vec<File>,
    /// Every tensor, file after file, in each file's order.
    pub tensors: Vec<Tensor>,
    /// The expert tensors among them.
    pub experts: Vec<ExpertTensor>,
    /// The model's architecture, where the source says.
    pub arch: Option<String>,
    /// Active experts per token, where the source says.
    pub top_k: Option<u64>,
    /// The source's block count, when it says.
    pub block_count: Option<u64>,
    /// The source's expert count, when it says.
    pub expert_count: Option<u64>,
    /// Where `block_count` and `expert_count` came from, for errors: "the
    /// key qwen3moe.expert_count", "num_experts in /m/config.json".
    pub counts_from: (Option<String>, Option<String>),
    /// A GGUF source's parts, parsed (empty for safetensors).
    pub gguf: Vec<gguf::Gguf>,
    /// A safetensors source's `__metadata__` (its first file's), in file
    /// order (empty for GGUF).
    pub safetensors_metadata: Vec<(String, String)>,
    /// The identity of every file read: parts or shards, the index and
    /// `config.json`.
    pub inputs: Vec<FileId>,
    /// Each of `files` as it was before its header was read (an `fstat`
    /// of its handle): an in-place open compares it with the file once
    /// every header is read, so that a file rewritten meanwhile is
    /// refused.
    pub opened_as: Vec<std::fs::Metadata>,
}

/// Asked between steps whether to stop (a pack's cancel flag).
pub type Cancel<'a> = &'a dyn Fn() -> bool;

/// The error a cancelled open or pack returns.
pub fn interrupted() -> Error {
    Error::new(ErrorKind::Io, "interrupted; nothing was written")
}

/// A name that occurs more than once, if any.
fn first_duplicate<'a>(names: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    let mut names: Vec<&str> = names.collect();
    names.sort_unstable();
    names.windows(2).find(|w| w[0] == w[1]).map(|w| w[0])
}

/// Opens an input file read-only without blocking (a FIFO does not wait
/// for a writer): it must be a regular file, else an error naming it.
fn open_input(path: &Path) -> Result<(File, std::fs::Metadata)> {
    sys::open_regular(path).map_err(|e| match e {
        OpenRegularError::Os(e) => {
            files::dangling_link(path).unwrap_or_else(|| Error::io("cannot open", path, &e))
        }
        OpenRegularError::NotRegular(kind) => Error::path_is(
            ErrorKind::Argument,
            path,
            format!("is {kind}, not a regular file"),
        ),
    })
}

/// Opens the model at `source`: a GGUF file (the first part of a split
/// one), a safetensors file, a directory holding `model.safetensors` or
/// `model.safetensors.index.json`, or that index. Reads headers only;
/// `cancel` is asked every few thousand entries whether to stop.
pub fn open_model(source: &Path, cancel: Cancel<'_>) -> Result<Model> {
    let meta = std::fs::metadata(source).map_err(|e| Error::io("cannot open", source, &e))?;
    if meta.is_dir() {
        return open_safetensors(source, cancel);
    }
    // Opened without blocking before a byte is read: a FIFO is refused.
    let (file, _) = open_input(source)?;
    if gguf::looks_like_gguf(source, &file) {
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

/// A GGUF model: its parts' headers, the architecture's counts from the
/// first part's key/values.
fn open_gguf(source: &Path, cancel: Cancel<'_>) -> Result<Model> {
    let (parts, handles): (Vec<PathBuf>, Vec<File>) = gguf::gguf_parts(source)?.into_iter().unzip();
    let mut files = Vec::with_capacity(parts.len());
    let mut inputs = Vec::with_capacity(parts.len());
    let mut opened_as = Vec::with_capacity(parts.len());
    for (path, file) in parts.iter().zip(&handles) {
        if cancel() {
            return Err(interrupted());
        }
        // Before the header is read: what the file must still be after.
        let before = file
            .metadata()
            .map_err(|e| Error::io("cannot stat", path, &e))?;
        files.push(gguf::Gguf::read(file, path, cancel)?);
        inputs.push(files::file_id(&before));
        opened_as.push(before);
    }
    check_split(&parts, &files)?;
    let total: usize = files.iter().map(|g| g.tensors.len()).sum();
    if total > MAX_TENSORS {
        return Err(Error::format(format!(
            "{}: the {} parts hold {total} tensors, above this reader's cap of {MAX_TENSORS}",
            source.display(),
            parts.len()
        )));
    }
    let no_memory =
        || crate::try_alloc::no_memory(format_args!("the {total} tensors of {}", source.display()));
    let mut tensors = Vec::new();
    tensors.try_reserve_exact(total).map_err(|_| no_memory())?;
    for (i, g) in files.iter().enumerate() {
        for (entry, t) in g.tensors.iter().enumerate() {
            tensors.push(Tensor {
                name: crate::try_alloc::string(&t.name).ok_or_else(no_memory)?,
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
    let from = |n: Option<u64>, k: &str| n.and(arch.as_ref()).map(|a| format!("the key {a}.{k}"));
    let counts_from = (
        from(block_count, "block_count"),
        from(expert_count, "expert_count"),
    );
    let experts = tensors
        .iter()
        .enumerate()
        .filter_map(|(i, t)| {
            names::gguf_expert(&t.name).map(|(layer, role)| ExpertTensor {
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
        counts_from,
        inputs,
        opened_as,
        gguf: files,
        safetensors_metadata: Vec::new(),
    })
}

/// The parts of a split GGUF agree with their `split.*` keys, as
/// llama.cpp's `gguf-split` and gguf-py write them in every part
/// (`split.no`, from 0; `split.count`; `split.tensors.count`, the tensors
/// of all parts): each part is the one its name says, of the same split,
/// and the parts hold every tensor. A file whose name is not a split
/// part's but whose `split.count` is above 1 is a renamed part, refused
/// rather than read as a model that lacks the other parts' layers.
fn check_split(parts: &[PathBuf], files: &[gguf::Gguf]) -> Result<()> {
    let count = parts.len() as u64;
    let key = |g: &gguf::Gguf, k: &str| g.kv(k).map(|kv| kv.as_u64().ok_or(()));
    let bad = |path: &Path, what: String| Error::format(format!("{}: {what}", path.display()));
    if count == 1 {
        return match key(&files[0], "split.count") {
            Some(Ok(n)) if n > 1 => Err(bad(
                &parts[0],
                format!(
                    "is part of a split model (split.count {n}, split.no {}), but its name is not a split part's: give the first part, named name-00001-of-{n:05}.gguf, with the others beside it",
                    match key(&files[0], "split.no") {
                        Some(Ok(i)) => i.to_string(),
                        _ => "absent".to_owned(),
                    }
                ),
            )),
            Some(Err(())) => Err(bad(&parts[0], "split.count is not an integer".to_owned())),
            _ => Ok(()),
        };
    }
    let mut total = 0u64;
    for (i, (path, g)) in parts.iter().zip(files).enumerate() {
        let i = i as u64;
        match key(g, "split.count") {
            Some(Ok(n)) if n == count => {}
            Some(Ok(n)) => {
                return Err(bad(
                    path,
                    format!("part {} of {count} by its name, but its split.count is {n}", i + 1),
                ))
            }
            _ => {
                return Err(bad(
                    path,
                    format!(
                        "part {} of {count} by its name, but it has no integer split.count key (gguf-split writes one in every part)",
                        i + 1
                    ),
                ))
            }
        }
        match key(g, "split.no") {
            Some(Ok(n)) if n == i => {}
            found => {
                return Err(bad(
                    path,
                    format!(
                        "part {} of {count} by its name, but its split.no is {} (expected {i}: split.no counts from 0)",
                        i + 1,
                        match found {
                            Some(Ok(n)) => n.to_string(),
                            _ => "absent or not an integer".to_owned(),
                        }
                    ),
                ))
            }
        }
        total += g.tensors.len() as u64;
    }
    for (path, g) in parts.iter().zip(files) {
        match key(g, "split.tensors.count") {
            None => {}
            Some(Ok(n)) if n == total => {}
            Some(found) => {
                return Err(bad(
                    path,
                    format!(
                        "split.tensors.count is {}, but the {count} parts hold {total} tensors (parts of two different splits?)",
                        found.map_or_else(|()| "not an integer".to_owned(), |n| n.to_string())
                    ),
                ))
            }
        }
    }
    Ok(())
}

/// A safetensors checkpoint: its files' headers, the counts from
/// `config.json` beside them.
#[cfg(feature = "safetensors")]
fn open_safetensors(source: &Path, cancel: Cancel<'_>) -> Result<Model> {
    let ckpt = safetensors::Checkpoint::open(source, cancel)?;
    let tensors = ckpt.tensors;
    let config = ckpt.config.as_ref();
    // The first of `keys` that config.json holds as an integer, and which.
    let cfg_key = |keys: &[&'static str]| {
        keys.iter().find_map(|&k| {
            config
                .and_then(|c| c.get(k))
                .and_then(json::Value::as_u64)
                .map(|n| (n, k))
        })
    };
    let cfg_u64 = |keys: &[&'static str]| cfg_key(keys).map(|(n, _)| n);
    let config_path = ckpt.config_path.display();
    let experts: Vec<ExpertTensor> = tensors
        .iter()
        .enumerate()
        .filter_map(|(i, t)| {
            names::safetensors_expert(&t.name).map(|(layer, role, expert)| ExpertTensor {
                tensor: i,
                layer,
                role,
                expert,
            })
        })
        .collect();
    let expert_count = cfg_key(&["num_local_experts", "num_experts", "n_routed_experts"]);
    let block_count = block_count(
        cfg_u64(&["num_hidden_layers"]),
        cfg_u64(&["num_nextn_predict_layers"]),
        &experts,
    );
    Ok(Model {
        kind: SourceKind::Safetensors,
        files: ckpt.files.iter().map(|f| f.path.clone()).collect(),
        handles: ckpt.handles,
        tensors,
        experts,
        arch: config
            .and_then(|c| c.get("model_type"))
            .and_then(json::Value::as_str)
            .map(str::to_owned),
        top_k: cfg_u64(&["num_experts_per_tok", "moe_topk", "top_k"]),
        block_count,
        expert_count: expert_count.map(|(n, _)| n),
        counts_from: (
            block_count.map(|n| match cfg_u64(&["num_hidden_layers"]) {
                Some(hidden) if hidden != n => {
                    format!("num_hidden_layers and num_nextn_predict_layers in {config_path}")
                }
                _ => format!("num_hidden_layers in {config_path}"),
            }),
            expert_count.map(|(_, k)| format!("{k} in {config_path}")),
        ),
        gguf: Vec::new(),
        inputs: ckpt.inputs,
        opened_as: ckpt.opened_as,
        safetensors_metadata: ckpt.metadata,
    })
}

/// A checkpoint's layer count. DeepSeek-V3/R1's and GLM-4.5's ship their
/// multi-token prediction block(s) as the `num_nextn_predict_layers`
/// layers after the decoder's, with experts of their own: they count when
/// their tensors are there (a checkpoint trimmed of them keeps the key).
#[cfg(feature = "safetensors")]
fn block_count(hidden: Option<u64>, nextn: Option<u64>, experts: &[ExpertTensor]) -> Option<u64> {
    let n = hidden?;
    let past = experts.iter().any(|e| u64::from(e.layer) >= n);
    Some(match (past, nextn) {
        (true, Some(extra)) => n.saturating_add(extra),
        _ => n,
    })
}

/// Without the `safetensors` feature, a safetensors model is refused.
#[cfg(not(feature = "safetensors"))]
fn open_safetensors(source: &Path, _cancel: Cancel<'_>) -> Result<Model> {
    Err(Error::new(
        ErrorKind::Unsupported,
        format!(
            "{}: a safetensors model, and this smoe reads GGUF only (built without its safetensors feature)",
            source.display()
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GGUF-only build names what it cannot read, and why.
    #[cfg(not(feature = "safetensors"))]
    #[test]
    fn a_gguf_only_build_refuses_safetensors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.safetensors");
        std::fs::write(&path, [0u8; 16]).unwrap();
        for source in [path.as_path(), dir.path()] {
            let e = open_model(source, &|| false).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
            assert!(
                e.to_string()
                    .contains("built without its safetensors feature"),
                "{e}"
            );
        }
    }

    /// Whatever the build, a file that is neither format is refused with
    /// its name.
    #[test]
    fn neither_format_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.bin");
        std::fs::write(&path, b"not a model").unwrap();
        let e = open_model(&path, &|| false).unwrap_err();
        assert!(
            e.to_string()
                .contains("model.bin: not a GGUF or safetensors model"),
            "{e}"
        );
    }
}
