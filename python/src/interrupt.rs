//! Long work that must stop at Ctrl-C (`smoe.pack`, `smoe.synth`): it runs
//! on a thread of its own, the GIL released, while the caller's thread
//! runs Python's signal handlers every [`SIGNAL_EVERY`], whatever phase the
//! work is in. The first handler that raises (Ctrl-C's
//! `KeyboardInterrupt`) sets the work's cancel flag; the work stops at its
//! next check, removes what it wrote, and the exception is raised.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

/// How often the waiting caller takes the GIL back for a moment to run
/// signal handlers.
const SIGNAL_EVERY: Duration = Duration::from_millis(50);

/// Runs `work` on a thread of its own with the GIL released; `work` polls
/// the flag it is given and stops once it is set. Returns what `work`
/// returned; or the exception a signal handler raised meanwhile (it wins
/// even when the work finished in that moment); or, when `work` panicked,
/// a `RuntimeError` saying `panicked`.
pub(crate) fn run<T: Send>(
    py: Python<'_>,
    panicked: &str,
    work: impl FnOnce(&AtomicBool) -> T + Send,
) -> PyResult<T> {
    let cancel = AtomicBool::new(false);
    let (done, raised) = std::thread::scope(|scope| {
        let (finished_tx, finished) = mpsc::channel();
        let cancel = &cancel;
        let worker = scope.spawn(move || {
            let done = work(cancel);
            // The receiver outlives the scope's threads.
            let _ = finished_tx.send(());
            done
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
                    // Relaxed: the flag publishes nothing; the work only
                    // asks whether it is set.
                    cancel.store(true, Ordering::Relaxed);
                }
            }
        }
        // Joined with the GIL released: the work never takes it.
        let done = py.detach(move || worker.join());
        (done, raised)
    });
    if let Some(err) = raised {
        // The work saw the flag and removed what it wrote, or had just
        // finished, or panicked: the signal wins.
        return Err(err);
    }
    done.map_err(|_| PyRuntimeError::new_err(panicked.to_owned()))
}
