//! The streamer every lease and view of it shares ([`Core`]), and its
//! teardown without the GIL. Below the Python classes that use it
//! (`streamer`, `lease`, `held`): it imports none of them.

use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicBool, AtomicUsize};

use pyo3::ffi;
use pyo3::prelude::*;

use crate::layout::Layouts;

/// What every lease of a streamer shares with it: the library's streamer,
/// kept alive (its ring mapped, its threads running) until the Python
/// `Streamer` is closed or gone *and* the last claim of it has been
/// released (a lease released with no view alive, or its last view gone).
/// Dropping the last `Arc<Core>` tears the library's streamer down, from
/// whichever thread drops it, without the GIL (see its `Drop`).
pub(crate) struct Core {
    /// Dropped by `Core`'s drop.
    pub(crate) streamer: ManuallyDrop<smoe::Streamer>,
    /// `Streamer(..., strict=True)`.
    pub(crate) strict: bool,
    /// Set by `close()`: a wait in another thread gives up within a slice
    /// of its wait (`crate::streamer`).
    pub(crate) closed: AtomicBool,
    /// Leases whose ticket is still held (not yet really released).
    pub(crate) held: AtomicUsize,
    /// `layer_blob_layouts`, for `Lease.numpy(role)`.
    pub(crate) layouts: Layouts,
    /// The process that opened it: a child made by `fork()` has a copy of
    /// the streamer without its I/O and pre-warm threads.
    pub(crate) pid: u32,
}

impl Core {
    pub(crate) fn new(streamer: smoe::Streamer, strict: bool) -> Core {
        let layouts = Layouts::parse(streamer.vault().meta());
        Core {
            streamer: ManuallyDrop::new(streamer),
            strict,
            closed: AtomicBool::new(false),
            held: AtomicUsize::new(0),
            layouts,
            pid: std::process::id(),
        }
    }
}

impl Drop for Core {
    /// Stops and joins the library's threads and writes the claim histogram
    /// and the trace (fsyncs): with the GIL released, so that collecting a
    /// streamer, releasing its last lease or dropping its last view does
    /// not stop every other Python thread meanwhile.
    fn drop(&mut self) {
        if self.pid != std::process::id() {
            // A forked child's copy: its teardown would join threads that
            // do not exist here and write the parent's histogram. The
            // parent frees the ring; the child's copy goes with the child.
            return;
        }
        // SAFETY: taken once, here, and `self.streamer` is not used after.
        let streamer = unsafe { ManuallyDrop::take(&mut self.streamer) };
        without_the_gil(move || drop(streamer));
    }
}

/// Runs `work`, which never takes the GIL, on this thread with the GIL not
/// held by it, whatever the thread: one attached to Python (a method's, a
/// deallocation's, a DLPack deleter called from either) lets go of the GIL
/// for it and takes it back after. The stable ABI cannot tell whether this
/// thread holds the GIL, but `PyGILState_Ensure` can: it returns at once
/// on a thread that holds it, and otherwise takes it, so that it can be let
/// go of the same way. A thread Python never knew (a consumer's own thread
/// freeing a DLPack tensor) holds no GIL and runs `work` as it stands, as
/// does any thread before the interpreter starts or after it ends. During
/// the interpreter's shutdown, a thread that does not hold the GIL stops
/// in `PyGILState_Ensure`, as any of Python's daemon threads does then.
fn without_the_gil(work: impl FnOnce() + Send) {
    // SAFETY: Py_IsInitialized may be called from any thread, at any time.
    let initialized = unsafe { ffi::Py_IsInitialized() } != 0;
    // SAFETY: with the interpreter initialized, this reads the thread's
    // entry in the interpreter's thread-state table, and takes no lock.
    if !initialized || unsafe { ffi::PyGILState_GetThisThreadState() }.is_null() {
        work();
        return;
    }
    let mut work = Some(work);
    // Not attached when PyO3 refuses (the interpreter shutting down, a
    // garbage collector's traversal): then it runs as it stands.
    Python::try_attach(|py| {
        if let Some(work) = work.take() {
            py.detach(work);
        }
    });
    if let Some(work) = work {
        work();
    }
}
