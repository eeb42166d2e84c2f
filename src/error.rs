//! The core's one error type.
//!
//! An [`Error`] is a [`ErrorKind`] (what went wrong, in the terms of the C
//! API's status codes) plus a message that carries the context a person needs
//! to act on it: the file, the offset, the layer and expert, the OS error.
//! The `ffi` layer maps the kind to a `smoe_status` and the message to
//! `smoe_last_error()`; nothing here knows about C.

use std::fmt;
use std::io;
use std::path::Path;

/// What class of failure an [`Error`] is. Each kind maps to one C status.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// A caller-supplied value is out of range or malformed.
    Argument,
    /// The (layer, expert) pair is not in the vault.
    NotFound,
    /// Opening or reading a file failed.
    Io,
    /// The vault (or a blob) is invalid: a broken rule or a checksum mismatch.
    Format,
    /// The ring could not be allocated.
    NoMemory,
    /// Every slot is claimed or loading.
    RingFull,
    /// A ticket that is not held was released.
    Stale,
    /// The platform refused something the caller required (e.g. direct I/O).
    Unsupported,
    /// A bug: a panic was caught, or the streamer failed earlier.
    Internal,
}

/// An error with the context needed to act on it.
#[derive(Clone, PartialEq, Eq)]
pub struct Error {
    kind: ErrorKind,
    message: String,
    os_error: Option<i32>,
}

/// The core's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An error of `kind` with a complete, human-readable `message`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
            os_error: None,
        }
    }

    /// A format error: the vault or a blob breaks a rule.
    pub fn format(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Format, message)
    }

    /// An argument error.
    pub fn argument(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Argument, message)
    }

    /// An I/O error on `path`: `what` says what was being done
    /// ("open", "read 16384 bytes at offset 81920 of"), the OS error follows.
    pub fn io(what: impl fmt::Display, path: &Path, err: &io::Error) -> Self {
        Error {
            kind: ErrorKind::Io,
            message: format!("{what} {}: {}", path.display(), describe_io(err)),
            os_error: err.raw_os_error(),
        }
    }

    /// What class of failure this is.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The full message, with its context.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The OS error number, when the failure came from the OS.
    pub fn os_error(&self) -> Option<i32> {
        self.os_error
    }

    /// The same error with `context` put in front of its message
    /// ("layer 3 expert 17: " + message).
    pub fn context(mut self, context: impl fmt::Display) -> Self {
        self.message = format!("{context}: {}", self.message);
        self
    }
}

/// `io::Error`'s text, plus the errno name-free number when there is one, so a
/// message reads "No such file or directory (os error 2)".
fn describe_io(err: &io::Error) -> String {
    err.to_string()
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.kind, self.message)
    }
}

impl std::error::Error for Error {}
