//! `smoe.pack`: the packer (`smoe_pack::pack`, what `smoe pack` runs), for
//! a Python user who has the package and not the command-line tool.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use pyo3::prelude::*;
use pyo3::types::PyDict;
use smoe_pack::{PackOptions, SourceKind};

use crate::errors;

/// How often, at most, a pack asks Python whether Ctrl-C was pressed.
const SIGNAL_EVERY: Duration = Duration::from_millis(50);

/// Packs the model at ``source`` (a GGUF file or the first part of a split
/// one, a safetensors file, a checkpoint directory or its index) into a
/// vault at ``out_dir``: the experts into ``experts.smoe``, every other
/// tensor into a scout in the source's format and, from a checkpoint
/// directory, its ``config.json`` and ``generation_config.json``
/// (docs/pack.md). ``out_dir`` must not exist; ``force=True`` replaces it
/// only when it is empty or holds a vault and nothing else. Returns what
/// was written, as a ``dict``. The GIL is released while it copies, and
/// Ctrl-C stops it (``KeyboardInterrupt``), leaving no ``out_dir``.
#[pyfunction]
#[pyo3(signature = (source, out_dir, *, force = false))]
pub(crate) fn pack<'py>(
    py: Python<'py>,
    source: PathBuf,
    out_dir: PathBuf,
    force: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let cancel = AtomicBool::new(false);
    let mut raised: Option<PyErr> = None;
    let packed = {
        let (source, out_dir, cancel, raised) = (&source, &out_dir, &cancel, &mut raised);
        py.detach(move || {
            let mut asked = Instant::now();
            // Called after each MiB copied: now and then, take the GIL to
            // run signal handlers (they run only on the main thread, with
            // it), and stop the pack when one raises.
            let mut progress = |_: u64, _: u64| {
                if asked.elapsed() < SIGNAL_EVERY || cancel.load(Ordering::Relaxed) {
                    return;
                }
                asked = Instant::now();
                if let Err(err) = Python::attach(|py| py.check_signals()) {
                    *raised = Some(err);
                    // Relaxed: the flag publishes nothing; the packer reads
                    // it in this same thread.
                    cancel.store(true, Ordering::Relaxed);
                }
            };
            let opts = PackOptions {
                force,
                cancel: Some(cancel),
            };
            smoe_pack::pack(source, out_dir, &opts, &mut progress)
        })
    };
    if let Some(err) = raised {
        return Err(err);
    }
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
