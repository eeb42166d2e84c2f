//! `smoe.pack`: the packer (`smoe_pack::pack`, what `smoe pack` runs), for
//! a Python user who has the package and not the command-line tool.

use std::path::PathBuf;

use pyo3::prelude::*;
use pyo3::types::PyDict;
use smoe_pack::{PackOptions, SourceKind};

use crate::errors;
use crate::interrupt;

/// Packs the model at ``source`` (a GGUF file or the first part of a split
/// one, a safetensors file, a checkpoint directory or its index) into a
/// vault at ``out_dir``: the experts into ``experts.smoe``, every other
/// tensor into a scout in the source's format and, from a safetensors
/// model, the ``config.json`` and ``generation_config.json`` beside it
/// (docs/pack.md). ``out_dir`` must not exist; ``force=True`` replaces it
/// only when it is empty or holds a vault and nothing else. Returns what
/// was written, as a ``dict``. The pack runs on a thread of its own, the
/// GIL released; Ctrl-C asks it to stop within 50 ms, and it stops at its
/// next check (every MiB copied, every few thousand header entries; a sync
/// or a rename finishes first), removes what it wrote and raises
/// ``KeyboardInterrupt``: no new ``out_dir`` (with ``force=True`` the old
/// vault stays). A Ctrl-C as the pack finishes still raises; the new vault
/// is then whole.
#[pyfunction]
#[pyo3(signature = (source, out_dir, *, force = false))]
pub(crate) fn pack<'py>(
    py: Python<'py>,
    source: PathBuf,
    out_dir: PathBuf,
    force: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let packed = interrupt::run(
        py,
        "smoe.pack: the packer panicked; nothing of out_dir was kept",
        |cancel| {
            let opts = PackOptions {
                force,
                cancel: Some(cancel),
            };
            smoe_pack::pack(&source, &out_dir, &opts, &mut |_, _| {})
        },
    )?;
    let summary = packed.map_err(|err| errors::to_py(py, &err))?;
    let out = PyDict::new(py);
    out.set_item("out_dir", &summary.out_dir)?;
    out.set_item(
        "kind",
        match summary.kind {
            SourceKind::Gguf => "gguf",
            SourceKind::Safetensors => "safetensors",
        },
    )?;
    out.set_item("files", &summary.files)?;
    out.set_item("arch", &summary.arch)?;
    out.set_item("top_k", summary.top_k)?;
    out.set_item("layers", summary.n_layers)?;
    out.set_item("experts", summary.n_experts)?;
    out.set_item("blobs", summary.n_entries)?;
    out.set_item("expert_bytes", summary.expert_bytes)?;
    out.set_item("scout", &summary.scout.0)?;
    out.set_item("scout_bytes", summary.scout.1)?;
    out.set_item("vault_id", &summary.vault_id)?;
    Ok(out)
}
