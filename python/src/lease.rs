//! `smoe.Lease`: one claim, and the views of its bytes.
//!
//! The rule this module keeps: no view (a `memoryview`, a numpy array, a
//! DLPack tensor, a torch tensor) ever shows a slot whose claim was released, and no claim
//! is released while one does. Every view counts itself in the lease's
//! [`Held`] and uncounts itself when it is gone; `release()` (or the end of
//! a `with` block) releases the claim at once when no view is alive, and
//! otherwise marks it, so that the last view to go releases it (under
//! `strict=True` it raises instead). A lease keeps its streamer's [`Core`]
//! alive, so the ring outlives every lease and view, even past `close()`.

use std::ffi::{c_int, c_void, CStr};
use std::mem::ManuallyDrop;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};

use pyo3::exceptions::{PyBufferError, PyImportError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use smoe::SlotInfo;

use crate::dlpack;
use crate::errors;
use crate::layout::{numpy_type, torch_type, Item, NumpyType};
use crate::streamer::{drop_core, Core};

/// How many views are alive, and whether the claim was released (or asked
/// to be).
#[derive(Debug, Default)]
struct Views {
    alive: usize,
    /// `release()` was called (or the `with` block ended): the lease's own
    /// methods raise from then on.
    release_asked: bool,
    /// The claim was released in the library.
    ticket_returned: bool,
}

/// What a lease and its views share: the claim, and its views' count.
pub(crate) struct Held {
    /// Dropped by `Held`'s drop, through [`drop_core`]: the last reference
    /// tears the streamer down (without the GIL when the lease's own drop
    /// is the last: see `Lease`'s drop).
    core: ManuallyDrop<Arc<Core>>,
    info: SlotInfo,
    views: Mutex<Views>,
}

impl Held {
    fn views(&self) -> MutexGuard<'_, Views> {
        // Nothing panics while holding it; a poisoned count is still right.
        self.views.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts a new view; refused once the release was asked.
    pub(crate) fn add_view(&self, py: Python<'_>) -> PyResult<()> {
        let mut views = self.views();
        if views.release_asked {
            // Let go first: making the error runs Python code, during
            // which another thread may take the GIL and drop a view.
            drop(views);
            return Err(self.released_error(py));
        }
        views.alive += 1;
        Ok(())
    }

    /// Uncounts a view; the last one releases a claim whose release was
    /// asked meanwhile. Needs no GIL: a DLPack consumer may drop its tensor
    /// from any thread.
    pub(crate) fn drop_view(&self) {
        let mut views = self.views();
        views.alive = views.alive.saturating_sub(1);
        if views.alive == 0 && views.release_asked && !views.ticket_returned {
            self.release_now(&mut views);
        }
    }

    /// Releases the claim in the library.
    fn release_now(&self, views: &mut Views) {
        views.ticket_returned = true;
        // A ticket this lease holds: it cannot be stale.
        let _ = self.core.streamer.release_ticket(self.info.ticket);
        // Release: pairs with `close()`'s Acquire in strict mode.
        self.core.held.fetch_sub(1, Ordering::Release);
    }

    fn released_error(&self, py: Python<'_>) -> PyErr {
        errors::stale(
            py,
            format!(
                "the lease of layer {} expert {} was released",
                self.info.layer, self.info.expert
            ),
        )
    }

    /// The claim's bytes.
    pub(crate) fn data(&self) -> *const u8 {
        self.info.data
    }

    /// How many bytes the claim holds.
    pub(crate) fn size(&self) -> u64 {
        self.info.size
    }
}

impl Drop for Held {
    /// The lease and every view are gone: a claim not released yet is
    /// released now.
    fn drop(&mut self) {
        let views = self.views.get_mut().unwrap_or_else(|p| p.into_inner());
        if !views.ticket_returned {
            views.ticket_returned = true;
            let _ = self.core.streamer.release_ticket(self.info.ticket);
            self.core.held.fetch_sub(1, Ordering::Release);
        }
        // SAFETY: taken once, here, and `self.core` is not used after.
        let core = unsafe { ManuallyDrop::take(&mut self.core) };
        // Attached or not, this thread cannot tell (a DLPack consumer
        // drops its tensor from any thread); a lease's own drop, which is
        // attached, lets go of the GIL before it drops the last `Held`.
        drop_core(core, None);
    }
}

/// One view of a lease's bytes, counted while it lives.
pub(crate) struct View(Arc<Held>);

impl View {
    pub(crate) fn held(&self) -> &Held {
        &self.0
    }
}

impl Drop for View {
    fn drop(&mut self) {
        self.0.drop_view();
    }
}

/// A claimed expert: its bytes stay in their slot, unchanged, until the
/// lease is released.
///
/// Read them without a copy through the buffer protocol
/// (``memoryview(lease)``, ``numpy.frombuffer(lease, ...)``), DLPack
/// (``numpy.from_dlpack(lease)``, ``torch.from_dlpack(lease)``),
/// ``lease.numpy(role)`` or ``lease.torch(role)``; every view is read-only
/// (a torch tensor by contract: torch has no read-only tensors). ``release()``, or the end of a ``with lease:`` block,
/// releases the claim: at once if no view is alive, else when the last
/// view is gone (``Streamer(..., strict=True)``: raises instead). After
/// ``release()`` the lease's methods raise ``smoe.Stale``; ``layer``,
/// ``expert``, ``hit``, ``size`` and ``slot_index`` stay readable.
#[pyclass(frozen, module = "smoe", name = "Lease")]
pub(crate) struct Lease {
    /// Dropped by the lease's drop, which lets go of the GIL when this is
    /// the last reference.
    held: ManuallyDrop<Arc<Held>>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        // SAFETY: taken once, here, and `self.held` is not used after.
        let held = unsafe { ManuallyDrop::take(&mut self.held) };
        if Arc::strong_count(&held) == 1 && Arc::strong_count(&held.core) == 1 {
            // The last lease of a closed streamer: dropping it tears the
            // streamer down (see `drop_core`).
            // SAFETY: every `Lease` is dropped on an attached thread: by its
            // Python object's deallocation, by PyO3 when making that object
            // fails, or by `wait()` while attached; none is made inside
            // `detach`.
            let py = unsafe { Python::assume_attached() };
            py.detach(move || drop(held));
        }
    }
}

impl Lease {
    /// A lease of the claim `info`, which it now holds.
    pub(crate) fn new(core: Arc<Core>, info: SlotInfo) -> Lease {
        // Relaxed is enough for a count only `close()` reads; the release
        // that ends it is Release.
        core.held.fetch_add(1, Ordering::Relaxed);
        Lease {
            held: ManuallyDrop::new(Arc::new(Held {
                core: ManuallyDrop::new(core),
                info,
                views: Mutex::new(Views::default()),
            })),
        }
    }

    /// A new counted view, or `smoe.Stale` after `release()`.
    fn view(&self, py: Python<'_>) -> PyResult<View> {
        self.held.add_view(py)?;
        Ok(View(Arc::clone(&self.held)))
    }

    fn check_held(&self, py: Python<'_>) -> PyResult<()> {
        if self.held.views().release_asked {
            return Err(self.held.released_error(py));
        }
        Ok(())
    }

    /// The layout's item of `role` for this lease's layer, checked to lie
    /// inside the claim; `smoe.Stale` after `release()`.
    fn item(&self, py: Python<'_>, role: &str) -> PyResult<Item> {
        self.check_held(py)?;
        let info = &self.held.info;
        let item = self
            .held
            .core
            .layouts
            .item(info.layer, role)
            .map_err(|why| errors::argument(py, why))?
            .clone();
        if item
            .offset
            .checked_add(item.bytes)
            .is_none_or(|end| end > info.size)
        {
            return Err(errors::format(
                py,
                format!(
                    "layer {}'s {role:?} ({} bytes at offset {}) runs past the claim's {} bytes",
                    info.layer, item.bytes, item.offset, info.size
                ),
            ));
        }
        Ok(item)
    }

    /// Checks that `item`'s shape, in elements of `size` bytes, is its
    /// byte length.
    fn check_elements(&self, py: Python<'_>, item: &Item, size: u64) -> PyResult<()> {
        let elements = item.shape.iter().try_fold(1u64, |n, &d| n.checked_mul(d));
        if elements.and_then(|n| n.checked_mul(size)) != Some(item.bytes) {
            return Err(errors::format(
                py,
                format!(
                    "layer {}'s {:?} is {} bytes, not the {:?} elements of {} its shape and \
                     dtype make",
                    self.held.info.layer, item.role, item.bytes, item.shape, item.dtype
                ),
            ));
        }
        Ok(())
    }
}

/// `Py_buffer.format` for unsigned bytes; CPython never writes through it.
const FORMAT_BYTES: &CStr = c"B";

#[pymethods]
impl Lease {
    /// The layer claimed.
    #[getter]
    fn layer(&self) -> u32 {
        self.held.info.layer
    }

    /// The expert claimed (with ``claim_any``: the member that landed).
    #[getter]
    fn expert(&self) -> u32 {
        self.held.info.expert
    }

    /// No demand read was needed: the expert was in the ring already.
    #[getter]
    fn hit(&self) -> bool {
        self.held.info.hit
    }

    /// The claim's bytes (what ``memoryview(lease)`` shows).
    #[getter]
    fn size(&self) -> u64 {
        self.held.info.size
    }

    /// The slot: the bytes start at ``ring address + slot_index ×
    /// slot_bytes`` (``Streamer.ring_region()``).
    #[getter]
    fn slot_index(&self) -> u32 {
        self.held.info.slot_index
    }

    /// Whether ``release()`` was called (the claim itself may still wait
    /// for its last view).
    #[getter]
    fn released(&self) -> bool {
        self.held.views().release_asked
    }

    /// Releases the claim: at once when no view of it is alive, otherwise
    /// when the last one is gone (``stats()["slots_held"]`` counts it
    /// meanwhile). With ``Streamer(..., strict=True)`` a release while a
    /// view is alive raises ``BufferError`` and changes nothing. A second
    /// release raises ``smoe.Stale``.
    fn release(&self, py: Python<'_>) -> PyResult<()> {
        let mut views = self.held.views();
        if views.release_asked {
            drop(views);
            return Err(self.held.released_error(py));
        }
        if views.alive > 0 && self.held.core.strict {
            return Err(PyBufferError::new_err(format!(
                "layer {} expert {}: {} view(s) of this lease are alive (a memoryview, a \
                 numpy array, a DLPack tensor); strict=True refuses to defer the release",
                self.held.info.layer, self.held.info.expert, views.alive
            )));
        }
        views.release_asked = true;
        if views.alive == 0 {
            self.held.release_now(&mut views);
        }
        Ok(())
    }

    fn __enter__(slf: Bound<'_, Self>) -> PyResult<Bound<'_, Self>> {
        slf.get().check_held(slf.py())?;
        Ok(slf)
    }

    /// Releases, unless ``release()`` already did. Under ``strict=True``
    /// with views alive it raises only when no other exception is on its
    /// way out (then the release is deferred).
    #[pyo3(signature = (exc_type = None, _exc = None, _traceback = None))]
    fn __exit__(
        &self,
        py: Python<'_>,
        exc_type: Option<Bound<'_, PyAny>>,
        _exc: Option<Bound<'_, PyAny>>,
        _traceback: Option<Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        let unwinding = exc_type.is_some_and(|t| !t.is_none());
        let mut views = self.held.views();
        if views.release_asked {
            return Ok(false);
        }
        if views.alive > 0 && self.held.core.strict && !unwinding {
            drop(views);
            return self.release(py).map(|()| false);
        }
        views.release_asked = true;
        if views.alive == 0 {
            self.held.release_now(&mut views);
        }
        Ok(false)
    }

    /// A read-only numpy array of one item of the expert's layout (the
    /// metadata's ``layer_blob_layouts``: ``gate``, ``up``, ``down``,
    /// ``gate_up``, ``*_bias``...), without a copy: the item's dtype and
    /// shape for plain types (``F32``, ``F16``, ``BF16`` where numpy knows
    /// ``bfloat16``, integers); one dimension of ``uint8`` for quantized
    /// GGML types and anything else. The array is a view: it keeps the
    /// claim held until it is gone. Needs numpy (``pip install
    /// 'smoe[numpy]'``).
    fn numpy<'py>(slf: &Bound<'py, Self>, role: &str) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let lease = slf.get();
        let item = lease.item(py, role)?;
        let numpy = py.import("numpy").map_err(|e| {
            let error = PyImportError::new_err(
                "Lease.numpy needs numpy: pip install 'smoe[numpy]' (or numpy itself)",
            );
            error.set_cause(py, Some(e));
            error
        })?;
        let typed = match numpy_type(&item.dtype) {
            NumpyType::Typed(name, size) => Some((numpy.call_method1("dtype", (name,))?, size)),
            NumpyType::Bfloat16 => numpy
                .call_method1("dtype", ("bfloat16",))
                .ok()
                .map(|dtype| (dtype, 2)),
            NumpyType::Raw => None,
        };
        let (dtype, size, shape) = match typed {
            Some((dtype, size)) => {
                lease.check_elements(py, &item, size)?;
                (dtype, size, item.shape.clone())
            }
            None => (numpy.call_method1("dtype", ("u1",))?, 1, vec![item.bytes]),
        };
        let kwargs = PyDict::new(py);
        kwargs.set_item("dtype", dtype)?;
        kwargs.set_item("count", item.bytes / size)?;
        kwargs.set_item("offset", item.offset)?;
        let flat = numpy.call_method("frombuffer", (slf,), Some(&kwargs))?;
        flat.call_method1("reshape", (PyTuple::new(py, shape)?,))
    }

    /// A torch tensor of one item of the expert's layout, without a copy
    /// (through DLPack): the item's dtype and shape for the types torch
    /// has (``F32``, ``F16``, ``BF16``, ``F8_E4M3``, ``F8_E5M2``,
    /// integers); one dimension of ``uint8`` for quantized GGML types and
    /// anything else. torch has no read-only tensors: the tensor is
    /// read-only by contract (a write changes the ring's copy of the expert
    /// for every later claim until it is evicted). The tensor is a view: it
    /// and every tensor made from it without a copy keep the claim held
    /// until they are gone. Needs PyTorch (``pip install 'smoe[torch]'``).
    fn torch<'py>(slf: &Bound<'py, Self>, role: &str) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let lease = slf.get();
        let item = lease.item(py, role)?;
        let torch = py.import("torch").map_err(|e| {
            let error = PyImportError::new_err(
                "Lease.torch needs PyTorch: pip install 'smoe[torch]' (or torch itself)",
            );
            error.set_cause(py, Some(e));
            error
        })?;
        // The claim's bytes as one uint8 tensor: a counted view, freed when
        // the last tensor sharing its memory is gone.
        let whole = torch.call_method1("from_dlpack", (slf,)).map_err(|e| {
            if !e.is_instance_of::<PyBufferError>(py) {
                return e;
            }
            let version = torch
                .getattr("__version__")
                .map_or_else(|_| "?".to_owned(), |v| v.to_string());
            let error = PyImportError::new_err(format!(
                "Lease.torch needs torch 2.9 or newer, which reads DLPack 1.0 (its read-only \
                 flag); this is torch {version}"
            ));
            error.set_cause(py, Some(e));
            error
        })?;
        let bytes = whole.call_method1("narrow", (0, item.offset, item.bytes))?;
        match torch_type(&item.dtype) {
            Some((name, size)) => {
                lease.check_elements(py, &item, size)?;
                bytes
                    .call_method1("view", (torch.getattr(name)?,))?
                    .call_method1("view", (PyTuple::new(py, &item.shape)?,))
            }
            None => Ok(bytes),
        }
    }

    /// DLPack (``numpy.from_dlpack(lease)``): the claim's bytes as a
    /// one-dimensional ``uint8`` CPU tensor, versioned (DLPack ≥ 1.0) with
    /// the read-only flag set. A consumer that asks for the unversioned
    /// form, which cannot say read-only, gets ``BufferError`` (as numpy
    /// does for its read-only arrays). The tensor is a view: it keeps the
    /// claim held until the consumer frees it.
    #[pyo3(signature = (*, stream = None, max_version = None, dl_device = None, copy = None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<Bound<'py, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.check_held(py)?;
        if stream.is_some_and(|s| !s.is_none()) {
            return Err(PyBufferError::new_err(
                "a lease is CPU memory: stream must be None",
            ));
        }
        if let Some(device) = dl_device.filter(|&d| d != dlpack::CPU_DEVICE) {
            return Err(PyBufferError::new_err(format!(
                "a lease is CPU memory, device {}; it cannot be exported to {}",
                dlpack::device_name(dlpack::CPU_DEVICE),
                dlpack::device_name(device)
            )));
        }
        if copy == Some(true) {
            return Err(PyBufferError::new_err(
                "a lease is exported without a copy; copy it after (numpy.array(lease))",
            ));
        }
        match max_version {
            Some((major, _)) if major >= 1 => {}
            _ => {
                return Err(PyBufferError::new_err(
                    "a lease's bytes are read-only, which only DLPack ≥ 1.0 can say: pass \
                     max_version=(1, 0) or more (numpy ≥ 2.1 does)",
                ))
            }
        }
        dlpack::export(py, self.view(py)?)
    }

    /// ``(kDLCPU, 0)``.
    fn __dlpack_device__(&self, py: Python<'_>) -> PyResult<(i32, i32)> {
        self.check_held(py)?;
        Ok(dlpack::CPU_DEVICE)
    }

    /// The buffer protocol: the claim's ``size`` bytes, read-only, one
    /// dimension of unsigned bytes; each buffer is a counted view.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let py = slf.py();
        if view.is_null() {
            return Err(PyBufferError::new_err("no Py_buffer to fill"));
        }
        if flags & ffi::PyBUF_WRITABLE == ffi::PyBUF_WRITABLE {
            return Err(PyBufferError::new_err(
                "a lease is read-only: its bytes are the ring's",
            ));
        }
        let lease = slf.get();
        lease.held.add_view(py)?;
        let info = &lease.held.info;
        // SAFETY: `view` is the non-null Py_buffer CPython hands
        // `bf_getbuffer` to fill. `buf` stays valid and unchanged while the
        // buffer lives: the view counted above keeps the claim held (its
        // slot never reloaded) and `obj` keeps the lease, and so the
        // streamer's ring, alive until `__releasebuffer__`. `shape` and
        // `strides` point into the Py_buffer itself, as CPython's own
        // PyBuffer_FillInfo does.
        unsafe {
            (*view).buf = info.data as *mut c_void;
            (*view).len = info.size as isize;
            (*view).readonly = 1;
            (*view).itemsize = 1;
            (*view).format = if flags & ffi::PyBUF_FORMAT == ffi::PyBUF_FORMAT {
                FORMAT_BYTES.as_ptr() as *mut _
            } else {
                std::ptr::null_mut()
            };
            (*view).ndim = 1;
            (*view).shape = if flags & ffi::PyBUF_ND == ffi::PyBUF_ND {
                &mut (*view).len
            } else {
                std::ptr::null_mut()
            };
            (*view).strides = if flags & ffi::PyBUF_STRIDES == ffi::PyBUF_STRIDES {
                &mut (*view).itemsize
            } else {
                std::ptr::null_mut()
            };
            (*view).suboffsets = std::ptr::null_mut();
            (*view).internal = std::ptr::null_mut();
            (*view).obj = slf.into_any().into_ptr();
        }
        Ok(())
    }

    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {
        self.held.drop_view();
    }

    fn __repr__(&self) -> String {
        let info = &self.held.info;
        let state = if self.held.views().release_asked {
            ", released"
        } else {
            ""
        };
        format!(
            "<smoe.Lease layer {} expert {}: {} bytes, hit {}{state}>",
            info.layer,
            info.expert,
            info.size,
            if info.hit { "True" } else { "False" }
        )
    }
}
