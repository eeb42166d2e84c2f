//! The scout (docs/pack.md, "The scout"): every tensor of the source
//! that is not an expert slice, with its bytes unchanged, in the source's
//! own format, so an engine loads it with the reader it already has. From
//! GGUF a GGUF v3 file with every key/value of the source (the split keys
//! left out) and `smoe.vault_id`; from safetensors one safetensors file
//! with the source's `__metadata__` and `"smoe.vault_id"`. The model was
//! read by the library (`smoe::internals::model`); this is the writing.

use std::fs::File;
use std::io::Write;
use std::path::Path;

use smoe::internals::model::gguf::{header_bytes, KeyValue, TensorInfo};
use smoe::internals::model::json::Value;
use smoe::internals::model::{Model, SourceKind};
use smoe::vault::hex;
use smoe::{Error, ErrorKind, Result};

/// Writes the scout: the source's non-expert `tensors`, copied by `copy`,
/// in the source's own format, with `smoe.vault_id` added to its
/// key/values (GGUF) or `__metadata__` (safetensors).
pub(crate) fn write_scout(
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
            let mut kvs: Vec<KeyValue> = first
                .kvs
                .iter()
                .filter(|kv| !kv.key.starts_with("split.") && kv.key != "smoe.vault_id")
                .cloned()
                .collect();
            kvs.push(KeyValue::string("smoe.vault_id", &hex(vault_id)));
            let infos: Vec<TensorInfo> = tensors
                .iter()
                .map(|&i| {
                    let t = &model.tensors[i];
                    model.gguf[t.file].tensors[t.entry].clone()
                })
                .collect();
            write_gguf(path, &kvs, &infos, first.alignment, copy)
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

/// Bytes written to the scout between two `fdatasync`s: the final sync
/// (which a Ctrl-C has to wait for) then has at most this much to flush.
const SCOUT_SYNC_BYTES: u64 = 64 << 20;

/// The scout file being written: buffered, and synced every
/// [`SCOUT_SYNC_BYTES`].
struct ScoutFile<'p> {
    out: std::io::BufWriter<File>,
    path: &'p Path,
    unsynced: u64,
}

impl<'p> ScoutFile<'p> {
    /// Creates (or truncates) `path`.
    fn create(path: &'p Path) -> Result<ScoutFile<'p>> {
        let file = File::create(path).map_err(|e| Error::io("cannot create", path, &e))?;
        Ok(ScoutFile {
            out: std::io::BufWriter::with_capacity(1 << 20, file),
            path,
            unsynced: 0,
        })
    }

    /// Flushes and syncs the whole file.
    fn finish(self) -> Result<()> {
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

/// Writes a GGUF v3 file: `kvs` as given (raw bytes), then the tensor
/// infos of `tensors` with offsets laid out at `alignment`, then each
/// tensor's data, copied by `copy(index, writer)` in order.
fn write_gguf(
    path: &Path,
    kvs: &[KeyValue],
    tensors: &[TensorInfo],
    alignment: u64,
    copy: &mut dyn FnMut(usize, &mut dyn Write) -> Result<()>,
) -> Result<()> {
    let mut w = ScoutFile::create(path)?;
    let io = |e: std::io::Error| Error::io("cannot write", path, &e);
    let mut infos = tensors.to_vec();
    let head = header_bytes(kvs, &mut infos, alignment);
    w.write_all(&head).map_err(io)?;
    let mut at = 0u64;
    for (i, t) in tensors.iter().enumerate() {
        let pad = infos[i].offset - at;
        w.write_all(&vec![0u8; pad as usize]).map_err(io)?;
        let mut counted = CountingWriter {
            inner: &mut w,
            written: 0,
        };
        copy(i, &mut counted)?;
        if counted.written != t.bytes {
            return Err(Error::new(
                ErrorKind::Internal,
                format!(
                    "tensor {}: copied {} bytes, expected {}",
                    t.name, counted.written, t.bytes
                ),
            ));
        }
        at = infos[i].offset + t.bytes;
    }
    let end = at.next_multiple_of(alignment);
    w.write_all(&vec![0u8; (end - at) as usize]).map_err(io)?;
    w.finish()
}

/// Counts the bytes a tensor's copy writes through it.
struct CountingWriter<'w> {
    inner: &'w mut dyn Write,
    written: u64,
}

impl Write for CountingWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}
