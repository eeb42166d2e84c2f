//! `smoe.pack`: the packer (`smoe_pack::pack`, what `smoe pack` runs), for
//! a Python user who has the package and not the command-line tool.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use smoe_pack::{PackOptions, SourceKind};

use crate::errors;

/// How often a pack's caller, waiting for it with the GIL released, takes
/// the GIL back for a moment to run signal handlers (Ctrl-C).
const SIGNAL_EVERY: Duration = Duration::from_millis(50);

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
    let cancel = AtomicBool::new(false);
    let (packed, raised) = std::thread::scope(|scope| {
        let (done, finished) = mpsc::channel();
        let (source, out_dir, cancel) = (&source, &out_dir, &cancel);
        // The pack, on its own thread: this one keeps answering signals
        // whatever phase the packer is in.
        let worker = scope.spawn(move || {
            let opts = PackOptions {
                force,
                cancel: Some(cancel),
            };
            let packed = smoe_pack::pack(source, out_dir, &opts, &mut |_, _| {});
            // The receiver outlives the scope's threads.
            let _ = done.send(());
            packed
        });
        let mut raised: Option<PyErr> = None;
        let mut finished = finished;
        loop {
            let (ended, back) = py.detach(move || {
                let ended = finished.recv_timeout(SIGNAL_EVERY).is_ok();
                (ended, finished)
            });
            finished = back;
            if ended || worker.is_finished() {
                break;
            }
            if raised.is_none() {
                if let Err(err) = py.check_signals() {
                    raised = Some(err);
                    // Relaxed: the flag publishes nothing; the packer only
                    // asks whether it is set, and removes what it wrote.
                    cancel.store(true, Ordering::Relaxed);
                }
            }
        }
        // Joined with the GIL released: the packer never takes it.
        let packed = py.detach(move || worker.join());
        (packed, raised)
    });
    if let Some(err) = raised {
        // The packer saw the flag and removed what it wrote, or had just
        // finished (then the vault is whole), or panicked: the signal wins.
        return Err(err);
    }
    let packed = packed.map_err(|_| {
        PyRuntimeError::new_err("smoe.pack: the packer panicked; nothing of out_dir was kept")
    })?;
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
