//! The library's errors as Python exceptions.
//!
//! The classes live in `smoe/_errors.py` (Python, so that each can also be
//! the builtin a Python user expects: `IoError` an `OSError`,
//! `ArgumentError` a `ValueError`). Which class an [`ErrorKind`] raises is
//! decided here, by an exhaustive match: a kind added to the library does
//! not compile until it has a class. The status numbers come from the C
//! API's one status table (`smoe::ffi::smoe_status`), set on the classes at
//! import.

use pyo3::exceptions::PyTimeoutError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use smoe::ffi::smoe_status;
use smoe::{Error, ErrorKind};

/// The Python module that defines the exception classes.
const ERRORS_MODULE: &str = "smoe._errors";

/// The class an error of `kind` raises (in [`ERRORS_MODULE`]).
fn class_name(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::Argument => "ArgumentError",
        ErrorKind::NotFound => "NotFound",
        ErrorKind::Io => "IoError",
        ErrorKind::Format => "FormatError",
        ErrorKind::NoMemory => "NoMemory",
        ErrorKind::RingFull => "RingFull",
        ErrorKind::Stale => "Stale",
        ErrorKind::Unsupported => "Unsupported",
        ErrorKind::Internal => "InternalError",
    }
}

/// At import: every status that reports an error kind has its class, and
/// each class gets its status (`smoe.RingFull.status == -6`) and the
/// status's C name (`smoe.RingFull.status_name == "SMOE_ERR_RING_FULL"`).
/// A class missing from `smoe/_errors.py` fails the import, naming it.
pub(crate) fn init(module: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = module.py();
    let errors = py.import(ERRORS_MODULE)?;
    for &status in smoe_status::ALL {
        let Some(kind) = status.kind() else { continue };
        let class = errors.getattr(class_name(kind))?;
        class.setattr("status", status as i32)?;
        class.setattr("status_name", format!("{status:?}"))?;
    }
    Ok(())
}

/// The exception for `err`: its kind's class, the library's message, and
/// the facts the error carries as attributes (`path`, `layer`, `expert`,
/// `offset`, `length`, `os_error`).
pub(crate) fn to_py(py: Python<'_>, err: &Error) -> PyErr {
    build(py, err).unwrap_or_else(|failed| failed)
}

fn build(py: Python<'_>, err: &Error) -> PyResult<PyErr> {
    let class = py.import(ERRORS_MODULE)?.getattr(class_name(err.kind()))?;
    let facts = PyDict::new(py);
    facts.set_item("path", err.path().map(|p| p.as_os_str()))?;
    facts.set_item("layer", err.layer())?;
    facts.set_item("expert", err.expert())?;
    facts.set_item("offset", err.offset())?;
    facts.set_item("length", err.length())?;
    facts.set_item("os_error", err.os_error())?;
    let exception = class.call((err.message(),), Some(&facts))?;
    Ok(PyErr::from_value(exception))
}

/// An exception of the class `name` in [`ERRORS_MODULE`] saying `message`
/// (the Python side's own errors: a closed streamer, a released lease).
fn raise(py: Python<'_>, name: &str, message: String) -> PyErr {
    let made = py
        .import(ERRORS_MODULE)
        .and_then(|m| m.getattr(name))
        .and_then(|class| class.call1((message,)));
    match made {
        Ok(exception) => PyErr::from_value(exception),
        Err(failed) => failed,
    }
}

/// `smoe.ClosedError`: the streamer was closed.
pub(crate) fn closed(py: Python<'_>) -> PyErr {
    raise(
        py,
        "ClosedError",
        "the streamer is closed (close() was called)".to_owned(),
    )
}

/// `smoe.Stale`: a released lease was used (its ticket is no longer held).
pub(crate) fn stale(py: Python<'_>, message: String) -> PyErr {
    raise(py, class_name(ErrorKind::Stale), message)
}

/// `smoe.ArgumentError`: a bad value from Python.
pub(crate) fn argument(py: Python<'_>, message: String) -> PyErr {
    raise(py, class_name(ErrorKind::Argument), message)
}

/// `smoe.FormatError`: the vault's metadata contradicts itself.
pub(crate) fn format(py: Python<'_>, message: String) -> PyErr {
    raise(py, class_name(ErrorKind::Format), message)
}

/// The builtin `TimeoutError` (a claim did not land in time).
pub(crate) fn timeout(message: String) -> PyErr {
    PyTimeoutError::new_err(message)
}
