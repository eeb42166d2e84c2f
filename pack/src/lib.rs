//! The packer (`smoe pack`): writes a vault of a GGUF or safetensors model
//! (the format is in `docs/format.md`), and reads back the blob layouts it
//! writes ([`layout`]).
//!
//! It opens, checks and plans the model through the library
//! (`smoe::internals::model`: the GGUF and safetensors readers, the
//! expert-name grammar, the overlap and id-cap checks, every layer's blob
//! layout: each expert's slices in the order gate, up or gate_up, down, then
//! biases, each at a multiple of 256 bytes), and only writes: `experts.smoe`
//! with the library's [`VaultWriter`], a checksum per blob and the layouts
//! in its metadata, and the scout (`scout.rs`): every other tensor and
//! key/value, in the source's own format. It follows the library's
//! file-safety rules (`smoe::internals::files`). A crate of its own, apart
//! from the library (`smoe`), so that a host linking the C library never
//! compiles the writing side.
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

pub mod layout;
mod scout;

use std::collections::HashSet;
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use smoe::internals::files::{self, FileId, FileKind};
use smoe::internals::model::names::role_rank;
use smoe::internals::model::{
    check_no_overlap, interrupted, open_model, plan, Cancel, LayerPlan, Model, Slice,
};
use smoe::internals::model::{json, meta};
use smoe::vault::{hex, VaultWriter, WriterOptions, EXPERTS_FILE, FREQ_FILE};
use smoe::{Error, ErrorKind, Result};

use crate::layout::BlobLayouts;
use crate::scout::write_scout;

pub use smoe::internals::model::json::MAX_JSON_BYTES;
pub use smoe::internals::model::SourceKind;

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

/// The files of a safetensors checkpoint directory that a vault packed from
/// it carries, copied byte for byte beside the scout (docs/format.md §6.2):
/// what an engine needs besides the weights to build the model (the
/// Python package's `smoe.transformers.from_pretrained(VAULT)`).
const CHECKPOINT_CONFIGS: [&str; 2] = ["config.json", "generation_config.json"];

/// Whether a vault directory may hold a file of this name: the vault, its
/// scout, the checkpoint's configs, the claim histogram and the histogram
/// writer's temporary files.
fn is_vault_file_name(name: &str) -> bool {
    name == EXPERTS_FILE
        || name.starts_with("scout.")
        || CHECKPOINT_CONFIGS.contains(&name)
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
    let inputs: HashSet<&FileId> = inputs.iter().collect();
    let entries = std::fs::read_dir(out_dir).map_err(|e| Error::io("cannot list", out_dir, &e))?;
    let mut empty = true;
    // Configs the packer copies: each must be one the vault's metadata
    // says it copied.
    let mut configs: Vec<String> = Vec::new();
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
        if CHECKPOINT_CONFIGS.contains(&&*shown) {
            configs.push(shown.into_owned());
        }
    }
    if empty {
        return Ok(());
    }
    let vault = match smoe::vault::Vault::open(out_dir) {
        Ok(vault) => vault,
        Err(e) => return refuse(format!("does not hold a valid vault ({e})")),
    };
    let copied: Vec<String> = json::parse(vault.meta())
        .ok()
        .and_then(|m| {
            let names = m.get("configs")?.as_array()?;
            Some(
                names
                    .iter()
                    .filter_map(|n| n.as_str().map(str::to_owned))
                    .collect(),
            )
        })
        .unwrap_or_default();
    if let Some(name) = configs.iter().find(|c| !copied.contains(c)) {
        return refuse(format!(
            "holds {name}, which the vault's metadata does not list as copied by the packer (\"configs\"): it is not the packer's"
        ));
    }
    Ok(())
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
    // Read and checked now, written last: a bad config.json fails the pack
    // before a byte is copied.
    let configs = read_configs(&model, cancelled)?;
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
    let config_names: Vec<&str> = configs.iter().map(|(name, _)| *name).collect();
    let meta = metadata(&model, &layouts, scout_name, &config_names);
    let expert_bytes: u64 = plans
        .iter()
        .map(|p| p.items.iter().map(|i| i.bytes).sum::<u64>() * u64::from(n_experts))
        .sum();
    let expert_set: HashSet<usize> = model.experts.iter().map(|x| x.tensor).collect();
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
    smoe::internals::files::check_free_space(out_dir, needed)?;
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
    write_configs(&configs, &tmp)?;
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

/// The text of each of [`CHECKPOINT_CONFIGS`] beside a safetensors
/// model's files (where the model reader finds `config.json`), checked to
/// be a JSON object as the reader checks `config.json` (one reader: the
/// library's). None for a GGUF.
fn read_configs(model: &Model, cancel: Cancel<'_>) -> Result<Vec<(&'static str, String)>> {
    let mut configs = Vec::new();
    if model.kind != SourceKind::Safetensors {
        return Ok(configs);
    }
    let Some(dir) = model.files.first().and_then(|f| f.parent()) else {
        return Ok(configs);
    };
    for name in CHECKPOINT_CONFIGS {
        let path = dir.join(name);
        if matches!(std::fs::symlink_metadata(&path), Err(e) if e.kind() == std::io::ErrorKind::NotFound)
        {
            continue;
        }
        let (text, _) = json::read_json_text(&path)?;
        let value = json::parse_cancellable(&text, cancel)
            .map_err(|e| Error::format(format!("{}: {e}", path.display())))?;
        if value.as_object().is_none() {
            return Err(Error::format(format!(
                "{}: holds {}, expected a JSON object",
                path.display(),
                value.kind()
            )));
        }
        configs.push((name, text));
    }
    Ok(configs)
}

/// Writes `configs` into `tmp`, byte for byte as read.
fn write_configs(configs: &[(&'static str, String)], tmp: &Path) -> Result<()> {
    for (name, text) in configs {
        let to = tmp.join(name);
        let mut out = File::create_new(&to).map_err(|e| Error::io("cannot create", &to, &e))?;
        out.write_all(text.as_bytes())
            .and_then(|()| out.sync_all())
            .map_err(|e| Error::io("cannot write", &to, &e))?;
    }
    Ok(())
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

/// The vault's metadata (SPEC §1.2), written by the library's one writer of
/// it ([`smoe::internals::model::meta`]), which a model opened in place
/// uses too.
fn metadata(model: &Model, layouts: &BlobLayouts, scout: &str, configs: &[&str]) -> String {
    let views: Vec<(u32, &[smoe::internals::model::LayoutItem])> = layouts
        .layers
        .iter()
        .map(|(l, items)| (*l, items.as_slice()))
        .collect();
    let writer = format!("smoe pack {}", env!("CARGO_PKG_VERSION"));
    meta::metadata_json(
        model,
        &views,
        meta::MetaWriter {
            format: "smoe-vault",
            writer: &writer,
            scout: Some(scout),
            configs,
        },
    )
}
