//! A model opened in place (SPEC §6): the vault's table built from a GGUF
//! or safetensors model's headers, with no copy. After open, a model and a
//! packed vault differ only in where an expert's bytes come from: a packed
//! expert is one aligned blob of `experts.smoe`; a model's is its slices in
//! the model's files, read through the aligned windows of its layer
//! ([`crate::model::window`]), so that every expert of a layer has the same
//! layout in its slot.
//!
//! A claim of a model's expert starts at its slot, as a vault's does; the
//! metadata's item offsets are positions in the slot (SPEC §6), so a host
//! addresses an item as `data + offset` for both, and an engine that views
//! the whole ring (`base + slot × slot_bytes + offset`) does too. The bytes
//! of a slot outside its items are its windows' other bytes (the file's
//! bytes around the slices: another expert's, say): no host reads them.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::format::{Entry, Header, DEFAULT_ALIGNMENT, MAX_META_BYTES, VERSION};
use crate::error::{Error, ErrorKind, Result};
use crate::fs_safe::{FileId, FileState};
use crate::model::meta::{metadata_json, MetaWriter};
use crate::model::window::{LayerWindows, Move, Read};
use crate::model::{self, LayerPlan, LayoutItem, Model, Slice, SourceKind};
use crate::sys::ReadError;

/// One of a model's files, as it was when its header was read: a read
/// checks that it still is (SPEC §6: a file changed while open fails its
/// reads rather than hand out other bytes).
#[derive(Clone, Debug)]
pub struct ModelFile {
    /// Its path.
    pub path: PathBuf,
    /// Its length when its header was read.
    pub len: u64,
    /// Its modification time then, where the filesystem keeps one.
    pub modified: Option<SystemTime>,
    /// Its device and inode: which file the path named then.
    pub id: FileId,
    /// Its status-change time then (`st_ctime`: seconds, nanoseconds),
    /// which every write moves and no call sets back.
    pub changed: (i64, i64),
}

impl ModelFile {
    /// The file at `path` in the state `metadata` describes.
    pub fn new(path: PathBuf, metadata: &std::fs::Metadata) -> ModelFile {
        let state = FileState::of(metadata);
        ModelFile {
            path,
            len: state.len,
            modified: state.modified,
            id: state.id,
            changed: state.changed,
        }
    }

    fn state(&self) -> FileState {
        FileState {
            id: self.id,
            len: self.len,
            modified: self.modified,
            changed: self.changed,
        }
    }

    /// Whether `file` (a descriptor of this file) is still the file whose
    /// header was read (device and inode) with the length, modification
    /// time and status-change time it had then; else a sentence, without
    /// the path, saying what changed. The length and the identity are
    /// exact; the times are the kernel's (best effort: a write through a
    /// shared mapping may not move them at once).
    pub fn check_unchanged(&self, file: &File) -> std::result::Result<(), String> {
        let meta = file
            .metadata()
            .map_err(|e| format!("cannot be stat'ed: {e}"))?;
        self.check_metadata(&meta)
    }

    /// [`ModelFile::check_unchanged`] on metadata already taken.
    pub fn check_metadata(&self, meta: &std::fs::Metadata) -> std::result::Result<(), String> {
        self.compare(meta, "while open")
    }

    /// `meta` against the recorded state; `when` says when a change was
    /// seen ("while open").
    fn compare(&self, meta: &std::fs::Metadata, when: &str) -> std::result::Result<(), String> {
        match self.state().differs(&FileState::of(meta)) {
            None => Ok(()),
            Some(how) if FileState::of(meta).id != self.id => {
                Err(format!("was replaced {when}: {how}"))
            }
            Some(how) => Err(format!("changed {when}: {how}")),
        }
    }
}

/// A caller's reusable lists of one load's reads and moves
/// ([`InPlace::load`]): one per thread, so a load allocates nothing.
#[derive(Debug, Default)]
pub struct Scratch {
    reads: Vec<Read>,
    moves: Vec<Move>,
}

/// What one [`InPlace::load`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Loaded {
    /// Bytes read from the files (whole windows, up to a file's end).
    pub bytes_read: u64,
    /// Payload bytes moved inside the buffer after the reads.
    pub bytes_moved: u64,
}

/// One layer of a model: where its experts' slices are, and how they reach
/// the same offsets of every slot.
#[derive(Clone, Debug)]
struct LayerSource {
    plan: LayerPlan,
    windows: LayerWindows,
}

/// Where a model's experts come from.
#[derive(Clone, Debug)]
pub struct InPlace {
    kind: SourceKind,
    files: Vec<ModelFile>,
    /// The layers that have experts, ascending by layer (a binary search
    /// finds one): sized by those layers, not by the block count, which a
    /// model at the id cap may set to 2^20 with one layer of experts.
    layers: Vec<LayerSource>,
    /// Bytes of every tensor that is not an expert's.
    dense_bytes: u64,
    /// Experts per layer.
    n_experts: u32,
}

/// What [`open`] builds: the parts of a [`super::Vault`].
pub(super) struct Opened {
    pub header: Header,
    pub entries: Vec<Entry>,
    pub meta: String,
    pub source: InPlace,
}

/// Longest string the metadata takes from a model's headers (its
/// architecture, a tensor's name or role): the GGUF specification's limit
/// on a key. Real ones are a few dozen bytes; the metadata is held for the
/// streamer's life and handed to C, and may not pass [`MAX_META_BYTES`]
/// as a whole either.
const MAX_META_STRING_BYTES: usize = 65_535;

/// At most the first 64 characters of `s`, and "…" when there are more:
/// a name too long to print whole.
fn start_of(s: &str) -> String {
    match s.char_indices().nth(64) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_owned(),
    }
}

/// Refuses a string the metadata would take from `model`'s headers that
/// is longer than [`MAX_META_STRING_BYTES`], naming its key or tensor.
fn check_meta_strings(model: &Model, plans: &[LayerPlan]) -> Result<()> {
    let too_long = |what: String, n: usize| {
        Error::format(format!(
            "{}: {what} is {n} bytes, above the limit of {MAX_META_STRING_BYTES} bytes on a string the metadata takes from a model",
            model.files[0].display()
        ))
    };
    if let Some(arch) = model
        .arch
        .as_deref()
        .filter(|a| a.len() > MAX_META_STRING_BYTES)
    {
        let key = match model.kind {
            SourceKind::Gguf => "general.architecture".to_owned(),
            SourceKind::Safetensors => "model_type in config.json".to_owned(),
        };
        return Err(too_long(key, arch.len()));
    }
    for item in plans.iter().flat_map(|p| &p.items) {
        for (what, s) in [("tensor", &item.tensor), ("the role of tensor", &item.role)] {
            if s.len() > MAX_META_STRING_BYTES {
                return Err(too_long(
                    format!("{what} {}", start_of(&item.tensor)),
                    s.len(),
                ));
            }
        }
    }
    Ok(())
}

/// Opens the model at `path` (SPEC §6): its headers, the plan of every
/// layer (SPEC §5's rules, [`model::plan`]), the windows of every layer,
/// the table and the metadata. Reads no tensor data. `after_headers` is
/// called once every header has been read and planned, before the files
/// are recorded (a test's seam: what happens to a file there is what a
/// writer racing the open does).
pub(super) fn open(path: &Path, after_headers: &dyn Fn()) -> Result<Opened> {
    let model = model::open_model(path, &|| false)?;
    model::check_no_overlap(&model)?;
    let (n_layers, n_experts, plans) = model::plan(&model)?;
    check_meta_strings(&model, &plans)?;
    after_headers();
    let id = model::identity::identity(&model)?;
    // Each file as it was before its header was read, checked against
    // the file now that every header is read: a file rewritten meanwhile
    // would give the table of one file and the bytes of another.
    let mut files = Vec::with_capacity(model.files.len());
    for ((p, f), before) in model.files.iter().zip(&model.handles).zip(&model.opened_as) {
        let known = ModelFile::new(p.clone(), before);
        let now = f.metadata().map_err(|e| Error::io("cannot stat", p, &e))?;
        known
            .compare(&now, "while it was being opened")
            .map_err(|why| Error::path_is(ErrorKind::Io, p, why))?;
        files.push(known);
    }
    let mut layers: Vec<LayerSource> = Vec::with_capacity(plans.len());
    let mut entries = Vec::new();
    let n_entries = plans.len() * n_experts as usize;
    crate::try_alloc::reserve(&mut entries, n_entries, || {
        crate::try_alloc::no_memory(format_args!(
            "the {n_entries} table entries of {}",
            model.files[0].display()
        ))
    })?;
    let mut layouts: Vec<(u32, Vec<LayoutItem>)> = Vec::with_capacity(plans.len());
    for plan in plans {
        let slices: Vec<Vec<Slice>> = (0..n_experts)
            .map(|e| (0..plan.items.len()).map(|i| plan.slice(i, e)).collect())
            .collect();
        let views: Vec<&[Slice]> = slices.iter().map(Vec::as_slice).collect();
        let windows = LayerWindows::plan(&views).map_err(|e| {
            Error::format(format!(
                "{}: layer {}: {e}",
                model.files[0].display(),
                plan.layer
            ))
        })?;
        let items: Vec<LayoutItem> = plan
            .items
            .iter()
            .zip(windows.offsets())
            .map(|(item, &at)| LayoutItem {
                offset: at,
                ..item.clone()
            })
            .collect();
        let size = items.iter().map(LayoutItem::end).max().unwrap_or(0);
        for (e, s) in slices.iter().enumerate() {
            entries.push(Entry {
                layer: plan.layer,
                expert: e as u32,
                offset: s[0].offset,
                size,
                padded_size: windows.slot_bytes(),
                xxh3: 0,
            });
        }
        layouts.push((plan.layer, items));
        // `plan` returns the layers ascending.
        layers.push(LayerSource { plan, windows });
    }
    let views: Vec<(u32, &[LayoutItem])> =
        layouts.iter().map(|(l, i)| (*l, i.as_slice())).collect();
    let writer = format!("smoe {}", env!("CARGO_PKG_VERSION"));
    let meta = metadata_json(
        &model,
        &views,
        MetaWriter {
            format: "smoe-model",
            writer: &writer,
            scout: None,
            configs: &[],
        },
    );
    // As a vault's header may not claim more (format::Header::parse).
    if meta.len() as u64 > MAX_META_BYTES {
        return Err(Error::format(format!(
            "{}: its metadata would be {} bytes, above the limit of {MAX_META_BYTES} bytes (64 MiB) on metadata ({} layers of layouts)",
            model.files[0].display(),
            meta.len(),
            layouts.len()
        ))
        .with_field("meta"));
    }
    let dense_bytes = dense_bytes(&model);
    let header = synthetic_header(n_layers, n_experts, entries.len(), id, &files);
    Ok(Opened {
        header,
        entries,
        meta,
        source: InPlace {
            kind: model.kind,
            files,
            layers,
            dense_bytes,
            n_experts,
        },
    })
}

/// Bytes of the tensors of `model` that are not experts: what an engine
/// loads and keeps besides the ring.
fn dense_bytes(model: &Model) -> u64 {
    let mut expert = vec![false; model.tensors.len()];
    for x in &model.experts {
        expert[x.tensor] = true;
    }
    model
        .tensors
        .iter()
        .zip(&expert)
        .filter(|(_, &e)| !e)
        .map(|(t, _)| t.bytes)
        .fold(0, u64::saturating_add)
}

/// The header a model's table stands behind: its counts and identity; no
/// checksums; the offsets of a file it does not have are 0.
fn synthetic_header(
    n_layers: u32,
    n_experts: u32,
    n_entries: usize,
    id: [u8; 16],
    files: &[ModelFile],
) -> Header {
    Header {
        version: VERSION,
        alignment: DEFAULT_ALIGNMENT,
        n_layers,
        n_experts,
        // At most MAX_EXPERT_IDS, which `plan` checked.
        n_entries: n_entries as u32,
        flags: 0,
        table_offset: 0,
        table_bytes: 0,
        meta_offset: 0,
        meta_bytes: 0,
        data_offset: 0,
        file_bytes: files.iter().map(|f| f.len).fold(0, u64::saturating_add),
        vault_id: id,
        table_xxh3: 0,
        meta_xxh3: 0,
    }
}

impl InPlace {
    /// The model's kind.
    pub fn kind(&self) -> SourceKind {
        self.kind
    }

    /// The model's files, in order (split parts, shards).
    pub fn files(&self) -> &[ModelFile] {
        &self.files
    }

    /// Bytes of the model's tensors that are not experts.
    pub fn dense_bytes(&self) -> u64 {
        self.dense_bytes
    }

    /// How many reads an expert of `layer` takes.
    pub fn reads_per_expert(&self, layer: u32) -> usize {
        self.layer(layer)
            .map_or(0, |l| l.windows.reads_per_expert())
    }

    /// Appends the reads, then the moves, that load `expert` of `layer`
    /// into a slot (the worker's, [`crate::model::window::LayerWindows::reads`]).
    /// Nothing for an expert the model does not have.
    pub fn reads(&self, layer: u32, expert: u32, reads: &mut Vec<Read>, moves: &mut Vec<Move>) {
        let Some(l) = self.layer(layer) else {
            return;
        };
        if expert >= self.n_experts {
            return;
        }
        let mut slices = [Slice {
            file: 0,
            offset: 0,
            bytes: 0,
        }; 16];
        let n = l.plan.items.len();
        if n <= slices.len() {
            for (i, s) in slices[..n].iter_mut().enumerate() {
                *s = l.plan.slice(i, expert);
            }
            l.windows.reads(&slices[..n], reads, moves);
        } else {
            let slices: Vec<Slice> = (0..n).map(|i| l.plan.slice(i, expert)).collect();
            l.windows.reads(&slices, reads, moves);
        }
    }

    /// Loads `entry`'s expert into `buf` (its slot, at least
    /// `entry.padded_size` bytes, aligned for direct I/O): each window of
    /// its layer's plan read straight into place by `read` (a descriptor of
    /// the model's file from `files`, in order; the window; the file
    /// offset), then the moves that put its payload at the layer's offsets
    /// (SPEC §6). After each read the file is checked to be the one opened
    /// (length, modification and status-change times): a model changed while open fails
    /// the load rather than hand out other bytes. The one read path of a
    /// model: the streamer's workers and the tool's `verify` and `bench`
    /// call it.
    ///
    /// # Errors
    ///
    /// [`crate::ErrorKind::Io`] naming the file: a failed or short read, or
    /// a file changed since open.
    pub fn load(
        &self,
        files: &[File],
        entry: &Entry,
        buf: &mut [u8],
        scratch: &mut Scratch,
        mut read: impl FnMut(&File, &mut [u8], u64) -> std::result::Result<(), ReadError>,
    ) -> Result<Loaded> {
        let Scratch { reads, moves } = scratch;
        reads.clear();
        moves.clear();
        self.reads(entry.layer, entry.expert, reads, moves);
        if reads.is_empty() {
            return Err(Error::expert_is(
                ErrorKind::NotFound,
                entry.layer,
                entry.expert,
                "is not in the model",
            ));
        }
        let mut loaded = Loaded::default();
        for r in reads.iter() {
            let known = &self.files[r.file];
            let file = files.get(r.file).ok_or_else(|| {
                Error::new(
                    ErrorKind::Internal,
                    format!("no descriptor of {}", known.path.display()),
                )
            })?;
            let changed = || {
                known
                    .check_unchanged(file)
                    .map_err(|why| Error::path_is(ErrorKind::Io, &known.path, why))
            };
            let window = buf
                .get_mut(r.slot as usize..(r.slot + r.len) as usize)
                .ok_or_else(|| {
                    Error::new(
                        ErrorKind::Internal,
                        format!(
                            "a window of {} bytes at {} passes the buffer of {}",
                            r.len, r.slot, entry.padded_size
                        ),
                    )
                })?;
            // The bytes of the window the file has: a window may run past
            // the end of the file, never its payload (the model's reader
            // checked that every tensor lies inside its file).
            let there = known.len.saturating_sub(r.offset).min(r.len);
            match read(file, window, r.offset) {
                Ok(()) => loaded.bytes_read += r.len,
                Err(e) if there < r.len && e.done as u64 >= there && there >= r.need => {
                    loaded.bytes_read += there;
                }
                Err(e) => {
                    changed()?;
                    return Err(Error::read(&known.path, &e));
                }
            }
            changed()?;
        }
        for m in moves.iter() {
            let (from, to, len) = (m.from as usize, m.to as usize, m.len as usize);
            buf.copy_within(from..from + len, to);
            loaded.bytes_moved += m.len;
        }
        Ok(loaded)
    }

    fn layer(&self, layer: u32) -> Option<&LayerSource> {
        self.layers
            .binary_search_by_key(&layer, |l| l.plan.layer)
            .ok()
            .map(|i| &self.layers[i])
    }
}
