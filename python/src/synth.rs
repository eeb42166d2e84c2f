//! `smoe.synth`: the library's synthetic vaults (`smoe::vault::synth`),
//! for trying the package, and a host's tests, before there is a model.

use std::path::PathBuf;
use std::sync::atomic::Ordering;

use pyo3::prelude::*;
use smoe::vault::synth::SynthSpec;

use crate::errors;
use crate::interrupt;

/// Writes a synthetic vault into ``directory`` (created if missing) and
/// returns ``directory``: ``layers`` × ``experts`` blobs of about
/// ``blob_bytes`` each (up to 4095 bytes less, as real blobs end short of
/// their padding), whose bytes are a pure function of ``(seed, layer,
/// expert, offset)``; ``dense_layers`` have no experts. Its metadata has no
/// ``layer_blob_layouts``: there are bytes, no roles. What ``smoe synth``
/// writes (docs/cli.md). A vault larger than the free space of its
/// filesystem is refused (``smoe.IoError``) before anything is created.
/// The write runs on a thread of its own, the GIL released; Ctrl-C asks it
/// to stop within 50 ms, and it stops at its next check (every 64 KiB
/// written), removes what it wrote and the directories it made, and raises
/// ``KeyboardInterrupt``.
#[pyfunction]
#[pyo3(signature = (directory, *, layers, experts, blob_bytes, seed = 0, top_k = 2, dense_layers = Vec::new()))]
#[allow(clippy::too_many_arguments)] // Python's keywords, one each
pub(crate) fn synth(
    py: Python<'_>,
    directory: PathBuf,
    layers: u32,
    experts: u32,
    blob_bytes: u64,
    seed: u64,
    top_k: u32,
    dense_layers: Vec<u32>,
) -> PyResult<PathBuf> {
    let spec = SynthSpec {
        n_layers: layers,
        n_experts: experts,
        blob_bytes,
        dense_layers,
        seed,
        top_k,
    };
    let written = interrupt::run(py, "smoe.synth: the writer panicked", |cancel| {
        // Relaxed: the flag publishes nothing (see `interrupt::run`).
        spec.write_cancellable(&directory, &mut |_| {}, &|| cancel.load(Ordering::Relaxed))
    })?;
    written.map_err(|err| errors::to_py(py, &err))?;
    Ok(directory)
}
