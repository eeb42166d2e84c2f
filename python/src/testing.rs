//! `smoe._native._testing` (feature `test-hooks`, never in a user's wheel):
//! a streamer whose reads wait behind a gate the test opens, so a claim can
//! be kept waiting as long as a test needs (another thread running meanwhile,
//! a Ctrl-C arriving). The library's read seam (`Streamer::with_reader`),
//! as its own tests use it.

use std::fs::File;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use smoe::internals::sys::ReadError;
use smoe::streamer::{BlobReader, FileReader};
use smoe::vault::Vault;

use crate::config::{self, Settings};
use crate::errors;
use crate::streamer::Streamer;

/// The longest a read waits behind a closed gate: a test that forgets to
/// open it still ends (the streamer's threads are joined at close).
const MOST_HELD: Duration = Duration::from_secs(30);

#[derive(Default)]
struct GateState {
    open: Mutex<bool>,
    opened: Condvar,
}

/// Reads once the gate is open.
struct GatedReader(Arc<GateState>);

impl BlobReader for GatedReader {
    fn read_exact_at(&self, file: &File, buf: &mut [u8], offset: u64) -> Result<(), ReadError> {
        let until = Instant::now() + MOST_HELD;
        let mut open = self.0.open.lock().unwrap_or_else(|p| p.into_inner());
        while !*open && Instant::now() < until {
            open = self
                .0
                .opened
                .wait_timeout(open, Duration::from_millis(100))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        drop(open);
        FileReader.read_exact_at(file, buf, offset)
    }
}

/// The gate of a streamer from ``open_gated``: reads wait until ``open()``
/// (or ``open_after()``), and again after ``close()``.
#[pyclass(frozen, module = "smoe._native._testing")]
struct Gate(Arc<GateState>);

#[pymethods]
impl Gate {
    /// Lets every read (waiting and later) through.
    fn open(&self) {
        self.0.set(true);
    }

    /// Holds every later read (and one already waiting) again.
    fn close(&self) {
        self.0.set(false);
    }

    /// Opens the gate ``seconds`` from now, from a thread that never takes
    /// the GIL: it opens even while a teardown holds the GIL.
    fn open_after(&self, seconds: f64) -> PyResult<()> {
        let wait = Duration::try_from_secs_f64(seconds)
            .map_err(|e| PyValueError::new_err(format!("seconds: {e}")))?;
        let gate = Arc::clone(&self.0);
        std::thread::spawn(move || {
            std::thread::sleep(wait);
            gate.set(true);
        });
        Ok(())
    }
}

impl GateState {
    fn set(&self, open: bool) {
        *self.open.lock().unwrap_or_else(|p| p.into_inner()) = open;
        self.opened.notify_all();
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.open();
    }
}

/// ``Streamer(path, **config)`` whose reads wait until the returned gate
/// is opened: ``(streamer, gate)``.
#[pyfunction]
#[pyo3(signature = (path, **config))]
fn open_gated(
    py: Python<'_>,
    path: PathBuf,
    config: Option<&Bound<'_, PyDict>>,
) -> PyResult<(Streamer, Gate)> {
    let Settings { config, strict } = config::settings(config)?;
    let gate = Arc::new(GateState::default());
    let reader = GatedReader(Arc::clone(&gate));
    let opened = {
        let path = path.clone();
        py.detach(move || {
            let vault = Vault::open(path)?;
            smoe::Streamer::with_reader(vault, config, reader)
        })
    };
    let streamer = opened.map_err(|err| errors::to_py(py, &err))?;
    Ok((Streamer::from_parts(streamer, strict, path), Gate(gate)))
}

/// Adds the `_testing` submodule.
pub(crate) fn add(parent: &Bound<'_, PyModule>) -> PyResult<()> {
    let testing = PyModule::new(parent.py(), "_testing")?;
    testing.add_class::<Gate>()?;
    testing.add_function(wrap_pyfunction!(open_gated, &testing)?)?;
    parent.add_submodule(&testing)?;
    Ok(())
}
