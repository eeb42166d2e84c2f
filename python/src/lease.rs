//! `smoe.Lease`: one claim, and the views of its bytes.
//!
//! The rule this module keeps: no view (a numpy array, a DLPack tensor, a
//! torch tensor) ever shows a slot whose claim was released, and no claim
//! is released while one does. Every view counts itself in the lease's
//! [`Held`] and uncounts itself when it is gone; `release()` (or the end of
//! a `with` block) releases the claim at once when no view is alive, and
//! otherwise marks it, so that the last view to go releases it (under
//! `strict=True` it raises instead). A view is an object the consumer
//! keeps, whose only way to end is its own death: a [`LeaseView`] (the
//! base of `lease.numpy()`'s arrays) or a DLPack tensor (`dlpack`). A held
//! claim keeps its streamer's [`Core`] alive, so the ring outlives every
//! view, even past `close()`; the claim's release lets go of it, so the
//! last release of a closed streamer tears it down.
//!
//! A `Lease` exports no buffer ([`NO_BUFFER`]): a buffer's consumer may
//! end it while its array lives (numpy keeps a lease's buffer in a
//! `memoryview` whose `release()` is public), and nothing then holds the
//! claim, whatever the exporter does.

use std::ffi::{c_int, c_void, CStr};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};

use pyo3::exceptions::{PyBufferError, PyImportError, PyRuntimeWarning};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use smoe::SlotInfo;

use crate::dlpack;
use crate::errors;
use crate::held::{Held, View, Views};
use crate::layout::{numpy_type, torch_type, Item, NumpyType};
use crate::shared::Core;

/// A view of a lease's bytes, as an object: the claim stays held while it
/// lives.
///
/// ``lease.numpy()``'s arrays rest on one (``array.base``). It has the
/// buffer protocol (the claim's bytes, read-only, format ``B``) and nothing
/// that releases it: it goes with the last reference to it, and a buffer
/// of it keeps a reference.
#[pyclass(frozen, module = "smoe", name = "LeaseView")]
pub(crate) struct LeaseView(View);

#[pymethods]
impl LeaseView {
    /// The buffer protocol; every buffer's object is this view itself. No
    /// ``__releasebuffer__``: a buffer released (a ``memoryview.release()``)
    /// only drops its reference to this view, and numpy, finding no
    /// releasebuffer slot, keeps the view itself as an array's base.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let held = slf.get().0.held();
        let (data, size) = (held.data(), held.size());
        // SAFETY: `view` is the Py_buffer CPython hands `bf_getbuffer`; the
        // bytes stay valid while `slf`, which the buffer keeps, lives (its
        // count keeps the claim held and the streamer alive).
        unsafe { fill_buffer(slf.into_any(), data, size, view, flags) }
    }

    fn __repr__(&self) -> String {
        let info = &self.0.held().info;
        format!(
            "<smoe.LeaseView layer {} expert {}: {} bytes>",
            info.layer, info.expert, info.size
        )
    }
}

/// The refusal of the buffer protocol on a lease: [`NO_BUFFER`] as a
/// `BufferError`.
fn no_buffer() -> PyErr {
    PyBufferError::new_err(NO_BUFFER.to_string_lossy().into_owned())
}

/// Fills `view` with the `size` bytes at `data`, read-only, one dimension
/// of unsigned bytes, its object `obj`; refuses a writable buffer.
///
/// # Safety
///
/// `view` is null or a `Py_buffer` CPython handed a `bf_getbuffer` to
/// fill, and the bytes stay valid and unchanged while `obj` lives.
unsafe fn fill_buffer(
    obj: Bound<'_, PyAny>,
    data: *const u8,
    size: u64,
    view: *mut ffi::Py_buffer,
    flags: c_int,
) -> PyResult<()> {
    if view.is_null() {
        return Err(PyBufferError::new_err("no Py_buffer to fill"));
    }
    if flags & ffi::PyBUF_WRITABLE == ffi::PyBUF_WRITABLE {
        return Err(PyBufferError::new_err(
            "a lease is read-only: its bytes are the ring's",
        ));
    }
    // SAFETY: `view` is the non-null Py_buffer to fill (the caller's
    // promise); `buf` stays valid while `obj`, which the buffer keeps
    // (a new reference), lives. `shape` and `strides` point into the
    // Py_buffer itself, as CPython's own PyBuffer_FillInfo does.
    unsafe {
        (*view).buf = data as *mut c_void;
        (*view).len = size as isize;
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
        (*view).obj = obj.into_ptr();
    }
    Ok(())
}

/// A claimed expert: its bytes stay in their slot, unchanged, until the
/// lease is released.
///
/// Read them without a copy through ``lease.numpy()`` (the claim, or
/// ``lease.numpy(role)``), ``lease.torch(role)`` or DLPack
/// (``numpy.from_dlpack(lease)``, ``torch.from_dlpack(lease)``); every view
/// is read-only (a torch tensor by contract: torch has no read-only
/// tensors). A lease exports no buffer (``memoryview(lease)``,
/// ``numpy.frombuffer(lease)`` raise ``BufferError``): a consumer could
/// release a buffer while its array lives. A copy:
/// ``lease.numpy().tobytes()``. ``release()``, or the end of a ``with lease:`` block, releases
/// the claim: at once if no view is alive, else when the last view is gone
/// (``Streamer(..., strict=True)``: raises instead). After ``release()``
/// the lease's methods raise ``smoe.Stale``; ``layer``, ``expert``,
/// ``hit``, ``size`` and ``slot_index`` stay readable.
#[pyclass(frozen, module = "smoe", name = "Lease")]
pub(crate) struct Lease {
    held: Arc<Held>,
}

impl Lease {
    /// A lease of the claim `info`, which it now holds.
    pub(crate) fn new(core: Arc<Core>, info: SlotInfo) -> Lease {
        // Relaxed is enough for a count only `close()` reads; the release
        // that ends it is Release.
        core.held.fetch_add(1, Ordering::Relaxed);
        Lease {
            held: Arc::new(Held {
                info,
                strict: core.strict,
                views: Mutex::new(Views {
                    alive: 0,
                    release_asked: false,
                    core: Some(core),
                }),
            }),
        }
    }

    /// Marks the release asked (`views` is the held lock) and, with no
    /// view alive, releases the claim.
    fn ask_release(&self, mut views: MutexGuard<'_, Views>) {
        views.release_asked = true;
        let core = if views.alive == 0 {
            self.held.release_now(&mut views)
        } else {
            None
        };
        drop(views);
        // After the lock: perhaps the teardown of a closed streamer.
        drop(core);
    }

    /// A new counted view, or `smoe.Stale` after `release()`.
    fn view(&self, py: Python<'_>) -> PyResult<View> {
        self.held.add_view(py)?;
        Ok(View(Arc::clone(&self.held)))
    }

    /// A new counted view as an object (see [`LeaseView`]).
    fn view_object<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, LeaseView>> {
        Bound::new(py, LeaseView(self.view(py)?))
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
        let info = &self.held.info;
        let found = {
            let views = self.held.views();
            match (&views.core, views.release_asked) {
                (Some(core), false) => Some(core.layouts.item(info.layer, role).cloned()),
                _ => None,
            }
        };
        // The errors are made after the lock is let go (they run Python).
        let item = found
            .ok_or_else(|| self.held.released_error(py))?
            .map_err(|why| errors::argument(py, why))?;
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

/// Why a lease exports no buffer, and what to use instead: the refusal of
/// `memoryview(lease)`, `numpy.frombuffer(lease)`, `numpy.asarray(lease)`,
/// `bytes(lease)`, `torch.frombuffer(lease)`.
const NO_BUFFER: &CStr = c"a smoe.Lease exports no buffer: its consumer could release the buffer \
     while an array made from it lives (numpy.frombuffer(lease).base is a memoryview whose \
     release() is public), and the claim would then be freed under the array. Views that hold \
     the claim: lease.numpy() (the claim as uint8) or lease.numpy(role), \
     numpy.from_dlpack(lease), lease.torch(role), torch.from_dlpack(lease); a copy: \
     lease.numpy().tobytes()";

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

    /// The claim's bytes (what ``lease.numpy()`` shows).
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
        let views = self.held.views();
        if views.release_asked {
            drop(views);
            return Err(self.held.released_error(py));
        }
        if views.alive > 0 && self.held.strict {
            return Err(PyBufferError::new_err(format!(
                "layer {} expert {}: {} view(s) of this lease are alive (a numpy array, a \
                 torch tensor, a DLPack capsule); strict=True refuses to defer the release",
                self.held.info.layer, self.held.info.expert, views.alive
            )));
        }
        self.ask_release(views);
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
        let views = self.held.views();
        if views.release_asked {
            return Ok(false);
        }
        if views.alive > 0 && self.held.strict && !unwinding {
            drop(views);
            return self.release(py).map(|()| false);
        }
        self.ask_release(views);
        Ok(false)
    }

    /// A read-only numpy array of one item of the expert's layout (the
    /// metadata's ``layer_blob_layouts``: ``gate``, ``up``, ``down``,
    /// ``gate_up``, ``*_bias``...), without a copy: the item's dtype and
    /// shape for plain types (``F32``, ``F16``, ``BF16`` where numpy knows
    /// ``bfloat16``, integers); one dimension of ``uint8`` for quantized
    /// GGML types and anything else. Without a role, the claim's bytes as
    /// one dimension of ``uint8``. The array is a view: it keeps the claim
    /// held until it is gone (its base, a ``smoe.LeaseView``, has nothing
    /// that releases it). Needs numpy (``pip install 'smoe[numpy]'``).
    #[pyo3(signature = (role = None))]
    fn numpy<'py>(slf: &Bound<'py, Self>, role: Option<&str>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let lease = slf.get();
        let item = match role {
            Some(role) => Some(lease.item(py, role)?),
            None => {
                lease.check_held(py)?;
                None
            }
        };
        let numpy = py.import("numpy").map_err(|e| {
            let error = PyImportError::new_err(
                "Lease.numpy needs numpy: pip install 'smoe[numpy]' (or numpy itself)",
            );
            error.set_cause(py, Some(e));
            error
        })?;
        let bytes = numpy.call_method1("dtype", ("u1",))?;
        let (dtype, offset, shape) = match item {
            None => (bytes, 0, vec![lease.held.info.size]),
            Some(item) => {
                let typed = match numpy_type(&item.dtype) {
                    NumpyType::Typed(name, size) => {
                        Some((numpy.call_method1("dtype", (name,))?, size))
                    }
                    NumpyType::Bfloat16 => numpy
                        .call_method1("dtype", ("bfloat16",))
                        .ok()
                        .map(|dtype| (dtype, 2)),
                    NumpyType::Raw => None,
                };
                match typed {
                    Some((dtype, size)) => {
                        lease.check_elements(py, &item, size)?;
                        (dtype, item.offset, item.shape.clone())
                    }
                    None => (bytes, item.offset, vec![item.bytes]),
                }
            }
        };
        let elements: u64 = shape.iter().product();
        let kwargs = PyDict::new(py);
        kwargs.set_item("dtype", dtype)?;
        kwargs.set_item("count", elements)?;
        kwargs.set_item("offset", offset)?;
        // numpy keeps the view object itself as the array's base (its type
        // has no releasebuffer slot, so numpy wraps it in no memoryview).
        let flat = numpy.call_method("frombuffer", (lease.view_object(py)?,), Some(&kwargs))?;
        if shape.len() == 1 {
            return Ok(flat);
        }
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
                "a lease is exported without a copy; copy it after (lease.numpy().copy())",
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

    /// Refused (``BufferError``): a lease exports no buffer, because its
    /// consumer could release the buffer while an array made from it lives
    /// (see the message). ``lease.numpy()``, ``numpy.from_dlpack(lease)``
    /// and ``lease.torch(role)`` are views that hold the claim. The reason
    /// is also a ``RuntimeWarning``: some consumers replace the
    /// ``BufferError`` with their own error (``torch.frombuffer`` raises
    /// "could not retrieve a contiguous buffer").
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        _view: *mut ffi::Py_buffer,
        _flags: c_int,
    ) -> PyResult<()> {
        let py = slf.py();
        // Under `-W error` the warning is an exception: the BufferError
        // goes out all the same.
        let _ = PyErr::warn(py, &py.get_type::<PyRuntimeWarning>(), NO_BUFFER, 1);
        Err(no_buffer())
    }

    /// Refused as the buffer protocol is: numpy.asarray(lease) and
    /// numpy.array(lease), which would otherwise make an object array of
    /// the lease in silence, say what to use.
    #[pyo3(signature = (dtype = None, copy = None))]
    fn __array__(&self, dtype: Option<Bound<'_, PyAny>>, copy: Option<bool>) -> PyResult<()> {
        let _ = (dtype, copy);
        Err(no_buffer())
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
