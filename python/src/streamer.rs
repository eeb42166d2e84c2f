//! `smoe.Streamer`: the library's `Streamer`, its blocking waits made with
//! the GIL released, and stoppable: Ctrl-C or a `close()` from another
//! thread ends one within [`WAIT_SLICE`].

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pyo3::exceptions::{PyBufferError, PyRuntimeError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use smoe::{Priority, SlotInfo};

use crate::config::{self, Settings};
use crate::errors;
use crate::lease::Lease;
use crate::shared::Core;

/// How often a waiting `claim`/`claim_any` (one library wait, counted once)
/// takes the GIL for a moment to run signal handlers (Ctrl-C) and looks for
/// a `close()` from another thread. Short enough that Ctrl-C feels
/// immediate.
const WAIT_SLICE: Duration = Duration::from_millis(50);

/// A claim's deadline, from Python's `timeout`.
#[derive(Clone, Copy, Debug)]
enum Timeout {
    /// `None` (or infinity): wait until the claim lands.
    Unbounded,
    /// `0`: one try.
    Once,
    /// Wait until then.
    Until(Instant, Duration),
}

fn parse_timeout(py: Python<'_>, timeout: Option<f64>) -> PyResult<Timeout> {
    match timeout {
        None => Ok(Timeout::Unbounded),
        Some(t) if t == f64::INFINITY => Ok(Timeout::Unbounded),
        Some(0.0) => Ok(Timeout::Once),
        Some(t) if t > 0.0 => {
            let wait = Duration::try_from_secs_f64(t).unwrap_or(Duration::MAX);
            Ok(match Instant::now().checked_add(wait) {
                Some(deadline) => Timeout::Until(deadline, wait),
                None => Timeout::Unbounded,
            })
        }
        Some(t) => Err(errors::argument(
            py,
            format!("timeout must be None or a number of seconds ≥ 0, got {t}"),
        )),
    }
}

/// Streams a model's or a vault's experts into a ring of aligned slots.
///
/// ``Streamer(path, **config)``: ``path`` is a vault (a directory holding
/// ``experts.smoe``, or that file) or a model opened in place (a GGUF file,
/// the first part of a split GGUF, a ``.safetensors`` file or a checkpoint
/// directory). The keywords are the library's settings (``ring_slots``,
/// ``workers``, ``direct_io``, ...: ``smoe.CONFIG_FIELDS``,
/// ``smoe.config_defaults()``), and ``strict``: a release or a close that
/// would be deferred raises ``BufferError`` instead (for tests).
///
/// A context manager: ``with smoe.Streamer(path) as s: ...`` closes it.
#[pyclass(frozen, module = "smoe", name = "Streamer")]
pub(crate) struct Streamer {
    /// `None` once closed.
    core: Mutex<Option<Arc<Core>>>,
    path: PathBuf,
}

impl Streamer {
    /// A streamer from an open library streamer.
    pub(crate) fn from_parts(streamer: smoe::Streamer, strict: bool, path: PathBuf) -> Streamer {
        Streamer {
            core: Mutex::new(Some(Arc::new(Core::new(streamer, strict)))),
            path,
        }
    }

    /// The open streamer, or `ClosedError`.
    fn core(&self, py: Python<'_>) -> PyResult<Arc<Core>> {
        // The lock is let go before the error is made: making it runs
        // Python code, during which another thread may take the GIL and
        // then wait for this lock.
        let core = self.core.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let core = core.ok_or_else(|| errors::closed(py))?;
        if core.pid != std::process::id() {
            let pid = core.pid;
            return Err(PyRuntimeError::new_err(format!(
                "this streamer was opened in process {pid}, and this is a child it forked: \
                 its reads would never land (the I/O threads do not survive fork()); \
                 open a Streamer in the child, or start children with \
                 multiprocessing's \"spawn\" or \"forkserver\""
            )));
        }
        Ok(core)
    }

    /// `close()`; `strict` false closes even a strict streamer whose
    /// leases are held (its `with` block ending by an exception).
    fn close_as(&self, strict: bool) -> PyResult<()> {
        let core = {
            let mut slot = self.core.lock().unwrap_or_else(|p| p.into_inner());
            let Some(core) = slot.as_ref() else {
                return Ok(());
            };
            let held = core.held.load(Ordering::Acquire);
            if strict && core.strict && held > 0 {
                return Err(PyBufferError::new_err(format!(
                    "{held} lease(s) of this streamer are still held (strict=True): \
                     release them before close()"
                )));
            }
            slot.take()
        };
        if let Some(core) = core {
            // Release: a waiting thread that sees it gives up.
            core.closed.store(true, Ordering::Release);
            // The last reference tears the streamer down (see `Core`'s
            // drop).
            drop(core);
        }
        Ok(())
    }

    /// Runs `attempt` (one of the library's stoppable waits: it asks the
    /// closure it is given, at least every [`WAIT_SLICE`], whether to go
    /// on) with the GIL released, until it lands a claim, `timeout` passes,
    /// a signal handler raises (Ctrl-C: `KeyboardInterrupt`) or another
    /// thread closes the streamer. One wait, so a claim that never lands
    /// counts once in `stats()["pending"]`. `what` names the claim for a
    /// timeout's message.
    fn wait<F>(&self, py: Python<'_>, timeout: Timeout, what: &str, attempt: F) -> PyResult<Lease>
    where
        F: Fn(
                &smoe::Streamer,
                Duration,
                &mut dyn FnMut() -> bool,
            ) -> smoe::Result<Option<SlotInfo>>
            + Sync,
    {
        let core = self.core(py)?;
        let lease = |info: SlotInfo| Lease::new(Arc::clone(&core), info);
        let wait = match timeout {
            Timeout::Unbounded => Duration::MAX,
            // Atomics only, and queues the read: the library never waits,
            // so the GIL stays held.
            Timeout::Once => Duration::ZERO,
            Timeout::Until(deadline, _) => deadline.saturating_duration_since(Instant::now()),
        };
        let mut raised: Option<PyErr> = None;
        let mut finalizing = false;
        let claimed = if wait.is_zero() {
            attempt(&core.streamer, Duration::ZERO, &mut || true)
        } else {
            let core = &*core;
            let raised = &mut raised;
            let finalizing = &mut finalizing;
            let attempt = &attempt;
            py.detach(move || {
                let mut keep_waiting = || {
                    if core.closed.load(Ordering::Acquire) {
                        return false;
                    }
                    // Signal handlers run only with the GIL, on the main
                    // thread: take it for the moment they need. PyO3
                    // refuses to attach to an interpreter that is no longer
                    // initialized (or, built for Python 3.13 or later, one
                    // that is finalizing): stop waiting then. Earlier in a
                    // shutdown, CPython stops this thread as it stops any
                    // daemon thread that takes the GIL then.
                    match Python::try_attach(|py| py.check_signals()) {
                        Some(Ok(())) => true,
                        Some(Err(err)) => {
                            *raised = Some(err);
                            false
                        }
                        None => {
                            *finalizing = true;
                            false
                        }
                    }
                };
                attempt(&core.streamer, wait, &mut keep_waiting)
            })
        };
        let result = match claimed {
            // The library asks `keep_waiting` only while nothing has landed,
            // so a raised signal never comes with a claim; were it to, the
            // claim is given back and the signal wins.
            Ok(Some(info)) => match raised {
                None => Ok(lease(info)),
                Some(err) => {
                    drop(lease(info));
                    Err(err)
                }
            },
            Err(err) => Err(errors::to_py(py, &err)),
            // Nothing is held: the wait gave up.
            Ok(None) => Err(if let Some(err) = raised {
                err
            } else if finalizing {
                PyRuntimeError::new_err(format!(
                    "the wait for {what} stopped: the interpreter is shutting down"
                ))
            } else if core.closed.load(Ordering::Acquire) {
                errors::closed(py)
            } else {
                errors::timeout(match timeout {
                    Timeout::Until(_, wait) => format!(
                        "{what} did not land in the ring within {} s",
                        wait.as_secs_f64()
                    ),
                    _ => format!(
                        "{what} is not in the ring yet (timeout=0 tries once; its read is queued)"
                    ),
                })
            }),
        };
        // Perhaps the last reference (another thread closed the streamer
        // meanwhile): see `Core`'s drop.
        drop(core);
        result
    }
}

#[pymethods]
impl Streamer {
    #[new]
    #[pyo3(signature = (path, **config))]
    fn new(py: Python<'_>, path: PathBuf, config: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        let Settings { config, strict } = config::settings(config)?;
        let opened = {
            let path = path.clone();
            py.detach(move || smoe::Streamer::open(path, config))
        };
        let streamer = opened.map_err(|err| errors::to_py(py, &err))?;
        Ok(Streamer::from_parts(streamer, strict, path))
    }

    /// Queues the reads of a layer's working set, in the order given
    /// (``speculative=True``: as a bet, after every demand read). Never
    /// waits. Returns how many members are now resident, in flight or hold
    /// a failed read's error for their next claim: all of them, or fewer
    /// when the ring could not take the rest (``claim_any`` queues those as
    /// slots free up).
    #[pyo3(signature = (layer, experts, speculative = false))]
    fn prefetch_set(
        &self,
        py: Python<'_>,
        layer: &Bound<'_, PyAny>,
        experts: &Bound<'_, PyAny>,
        speculative: bool,
    ) -> PyResult<u32> {
        let layer = config::id_arg(layer, "layer")?;
        let experts = config::id_list_arg(experts, "experts")?;
        let core = self.core(py)?;
        let priority = if speculative {
            Priority::Speculative
        } else {
            Priority::Demand
        };
        core.streamer
            .prefetch_set(layer, &experts, priority)
            .map_err(|err| errors::to_py(py, &err))
    }

    /// Claims ``(layer, expert)``, queueing its read if it is not in the
    /// ring, and waits for it: ``timeout=None`` without bound, ``0`` tries
    /// once, otherwise up to ``timeout`` seconds; ``TimeoutError`` when it
    /// has not landed. The wait releases the GIL, and Ctrl-C interrupts it
    /// (``KeyboardInterrupt``). Returns a ``Lease``: the expert's bytes stay
    /// in their slot, unchanged, until it is released.
    #[pyo3(signature = (layer, expert, timeout = None))]
    fn claim(
        &self,
        py: Python<'_>,
        layer: &Bound<'_, PyAny>,
        expert: &Bound<'_, PyAny>,
        timeout: Option<f64>,
    ) -> PyResult<Lease> {
        let layer = config::id_arg(layer, "layer")?;
        let expert = config::id_arg(expert, "expert")?;
        let timeout = parse_timeout(py, timeout)?;
        self.wait(
            py,
            timeout,
            &format!("layer {layer} expert {expert}"),
            |s, wait, keep| s.claim_wait_ticket_until(layer, expert, wait, WAIT_SLICE, keep),
        )
    }

    /// Claims whichever member of a layer's working set is in the ring
    /// first (queueing the others' reads as slots free up), with
    /// ``claim``'s timeout and waiting rules. ``lease.expert`` says which.
    #[pyo3(signature = (layer, experts, timeout = None))]
    fn claim_any(
        &self,
        py: Python<'_>,
        layer: &Bound<'_, PyAny>,
        experts: &Bound<'_, PyAny>,
        timeout: Option<f64>,
    ) -> PyResult<Lease> {
        let layer = config::id_arg(layer, "layer")?;
        let experts = config::id_list_arg(experts, "experts")?;
        let timeout = parse_timeout(py, timeout)?;
        self.wait(
            py,
            timeout,
            &format!("a member of layer {layer}'s set {experts:?}"),
            |s, wait, keep| s.claim_any_ticket_until(layer, &experts, wait, WAIT_SLICE, keep),
        )
    }

    /// Every counter and size of the library's ``Stats``, by name
    /// (``smoe.STATS_FIELDS``).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let core = self.core(py)?;
        config::stats_dict(py, core.streamer.stats())
    }

    /// The vault's or the model's metadata (docs/format.md §3), parsed: a
    /// new ``dict`` each time; ``{}`` when there is none.
    #[getter]
    fn metadata<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let core = self.core(py)?;
        let meta = core.streamer.vault().meta();
        if meta.is_empty() {
            return Ok(PyDict::new(py).into_any());
        }
        py.import("json")?.call_method1("loads", (meta,))
    }

    /// Warnings recorded at open (a fallback to buffered I/O, a histogram
    /// file not replaced, ...).
    #[getter]
    fn warnings(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        Ok(self.core(py)?.streamer.warnings().to_vec())
    }

    /// Tells the pre-warm thread the engine is busy (``True``) or idle
    /// (``False``: it resumes, re-warming what was evicted meanwhile).
    fn prewarm_pause(&self, py: Python<'_>, busy: bool) -> PyResult<()> {
        self.core(py)?.streamer.prewarm_pause(busy);
        Ok(())
    }

    /// The ring: ``(address, bytes, slot_bytes)``, for a host that
    /// registers it once with a device. The address stays valid while the
    /// streamer is open or any claim of it is held.
    fn ring_region(&self, py: Python<'_>) -> PyResult<(usize, u64, u64)> {
        let (base, bytes, slot_bytes) = self.core(py)?.streamer.ring_region();
        Ok((base as usize, bytes, slot_bytes))
    }

    /// Where ``(layer, expert)`` lives: ``offset`` (in the vault file, or
    /// the first slice's offset in its model file), ``size`` (a claim's
    /// bytes), ``padded_size`` (the slot bytes it needs) and ``xxh3`` (its
    /// checksum, 0 when the vault has none).
    fn expert_info<'py>(
        &self,
        py: Python<'py>,
        layer: &Bound<'py, PyAny>,
        expert: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let layer = config::id_arg(layer, "layer")?;
        let expert = config::id_arg(expert, "expert")?;
        let entry = self
            .core(py)?
            .streamer
            .expert_info(layer, expert)
            .map_err(|err| errors::to_py(py, &err))?;
        let info = PyDict::new(py);
        info.set_item("layer", entry.layer)?;
        info.set_item("expert", entry.expert)?;
        info.set_item("offset", entry.offset)?;
        info.set_item("size", entry.size)?;
        info.set_item("padded_size", entry.padded_size)?;
        info.set_item("xxh3", entry.xxh3)?;
        Ok(info)
    }

    /// The path the streamer was opened with.
    #[getter]
    fn path(&self) -> PathBuf {
        self.path.clone()
    }

    /// Whether ``close()`` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.core
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_none()
    }

    /// Closes the streamer: every later call raises ``smoe.ClosedError``; a
    /// second ``close()`` does nothing. Leases still held stay valid: the
    /// ring and the I/O threads are freed (and the claim histogram and the
    /// trace written) when the last claim is released (the last lease
    /// released with no view alive, or its last view gone). With
    /// ``strict=True`` a close while leases are held raises
    /// ``BufferError`` and closes nothing.
    fn close(&self) -> PyResult<()> {
        self.close_as(true)
    }

    fn __enter__(slf: Bound<'_, Self>) -> PyResult<Bound<'_, Self>> {
        slf.get().core(slf.py())?;
        Ok(slf)
    }

    /// Closes. Under ``strict=True`` with leases held, raises only when no
    /// other exception is on its way out (then it closes as a streamer
    /// that is not strict does).
    #[pyo3(signature = (exc_type = None, _exc = None, _traceback = None))]
    fn __exit__(
        &self,
        exc_type: Option<Bound<'_, PyAny>>,
        _exc: Option<Bound<'_, PyAny>>,
        _traceback: Option<Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        let unwinding = exc_type.is_some_and(|t| !t.is_none());
        self.close_as(!unwinding)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        let state = match self.core.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            Some(core) => {
                let stats = core.streamer.stats();
                format!("{} slots × {} bytes", stats.ring_slots, stats.slot_bytes)
            }
            None => "closed".to_owned(),
        };
        format!("<smoe.Streamer {:?}: {state}>", self.path)
    }
}

impl Drop for Streamer {
    fn drop(&mut self) {
        if let Some(core) = self
            .core
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            core.closed.store(true, Ordering::Release);
            // Perhaps the last reference: see `Core`'s drop.
            drop(core);
        }
    }
}

/// The settings' defaults, as ``Streamer``'s keywords take them.
#[pyfunction]
pub(crate) fn config_defaults(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    config::defaults(py)
}

/// The tuple of `names`.
pub(crate) fn names<'py>(py: Python<'py>, names: &[&str]) -> PyResult<Bound<'py, PyTuple>> {
    PyTuple::new(py, names)
}
