//! The core's one error type.
//!
//! An [`Error`] is a [`ErrorKind`] (what went wrong, in the terms of the C
//! API's status codes) plus the facts a person or a program needs to act on
//! it, each kept as a value: the file, the layer and expert, the byte offset
//! and length, the OS error, the vault field whose rule was broken. Its
//! sentence is built from those facts in `Display`, so a caller (or a test)
//! asks [`Error::layer_expert`] instead of searching the text for
//! "layer 3 expert 17", while a person still reads one line: "layer 3 expert
//! 17: read 12288 of 16384 bytes at offset 81920 in experts.smoe: unexpected
//! end of file". The `ffi` layer maps the kind to a `smoe_status` and the
//! sentence to `smoe_last_error()`; nothing here knows about C.

use std::fmt::{self, Write as _};
use std::io;
use std::path::{Path, PathBuf};

use crate::printable::{Escaping, PrintablePath};
use crate::sys::ReadError;

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

/// An error: its [`ErrorKind`], the facts it is about, and a sentence built
/// from them.
///
/// Every fact is optional; an error carries those that apply:
///
/// | fact | accessor | set by |
/// | --- | --- | --- |
/// | the file | [`path`](Error::path) | [`Error::io`], [`with_path`](Error::with_path) |
/// | layer and expert | [`layer_expert`](Error::layer_expert) | [`with_expert`](Error::with_expert) |
/// | byte offset in the file | [`offset`](Error::offset) | [`with_offset`](Error::with_offset) |
/// | bytes involved at that offset | [`length`](Error::length) | [`with_length`](Error::with_length) |
/// | the OS error number | [`os_error`](Error::os_error) | [`Error::io`], [`with_os_error`](Error::with_os_error) |
/// | the vault field whose rule was broken | [`field`](Error::field) | [`with_field`](Error::with_field) |
/// | a released ticket | [`ticket`](Error::ticket) | the streamer's stale-ticket error |
///
/// `Display` (and [`message`](Error::message), which the C API hands to
/// `smoe_last_error()`) builds one line from them: the file and the expert
/// are named in front of the words unless the sentence names them itself
/// ("read 16384 of 16384 bytes at offset 81920 in experts.smoe: ..."); the
/// other facts are in the words where a person needs them.
///
/// ```
/// use smoe::{Error, ErrorKind};
///
/// let err = Error::new(ErrorKind::RingFull, "every one of the 8 slots is claimed")
///     .with_expert(3, 17);
/// assert_eq!(err.layer_expert(), Some((3, 17)));
/// assert_eq!(err.to_string(), "layer 3 expert 17: every one of the 8 slots is claimed");
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Error {
    /// Boxed: a `Result<T, Error>` stays a pointer wide on the claim path,
    /// however many facts an error carries.
    inner: Box<Inner>,
}

#[derive(Clone, PartialEq, Eq)]
struct Inner {
    kind: ErrorKind,
    /// How the sentence is put together from `what` and the facts.
    form: Form,
    /// The words: what went wrong, or what was being done, without the
    /// facts `form` adds around them.
    what: String,
    /// What [`Error::context`] put in front, outermost first, each piece
    /// followed by ": ".
    context: String,
    path: Option<PathBuf>,
    expert: Option<(u32, u32)>,
    offset: Option<u64>,
    length: Option<u64>,
    os_error: Option<i32>,
    /// The I/O error's own text ("No such file or directory (os error
    /// 2)", "unexpected end of file") for the forms that end with it.
    cause: String,
    field: Option<&'static str>,
    ticket: Option<u64>,
}

/// The shapes of sentence an error takes. In each, `[path: ]` and
/// `[layer L expert E: ]` are written when the fact is set, and `context`
/// goes in front of everything.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Form {
    /// `[path: ][layer L expert E: ]what`.
    Text,
    /// `path what`: the file is the sentence's subject.
    PathIs,
    /// `[path: ]layer L expert E what`: the expert is the subject.
    ExpertIs,
    /// `[layer L expert E: ]what path: cause`: an I/O call on `path` failed.
    Io,
    /// `[layer L expert E: ]read done of length bytes at offset offset in
    /// path: cause`.
    Read { done: u64 },
    /// `[layer L expert E: ]blob at offset offset in path hashes to actual,
    /// expected xxh3 expected`.
    Checksum { expected: u64, actual: u64 },
    /// `[path: ]table entry index (layer L expert E): what`.
    TableEntry { index: u32 },
    /// `ticket T (slot S, generation G) what`.
    Ticket { slot: u32, generation: u64 },
}

impl Form {
    /// Whether the sentence names the file itself (else it goes in front).
    fn names_path(&self) -> bool {
        matches!(
            self,
            Form::PathIs | Form::Io | Form::Read { .. } | Form::Checksum { .. }
        )
    }

    /// Whether the sentence names the expert itself (else it goes in front).
    fn names_expert(&self) -> bool {
        matches!(self, Form::ExpertIs | Form::TableEntry { .. })
    }
}

/// The core's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    fn with_form(kind: ErrorKind, form: Form, what: String) -> Self {
        Error {
            inner: Box::new(Inner {
                kind,
                form,
                what,
                context: String::new(),
                path: None,
                expert: None,
                offset: None,
                length: None,
                os_error: None,
                cause: String::new(),
                field: None,
                ticket: None,
            }),
        }
    }

    /// An error of `kind` whose `message` says what went wrong. Facts added
    /// with [`with_path`](Error::with_path) and
    /// [`with_expert`](Error::with_expert) are named in front of it; the
    /// others are kept as values only.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self::with_form(kind, Form::Text, message.into())
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
    /// ("cannot open", "cannot read the table (288 bytes at offset 4096)
    /// of"), the file and the OS error follow: "cannot open experts.smoe: No
    /// such file or directory (os error 2)". Carries the path and the OS
    /// error number.
    pub fn io(what: impl fmt::Display, path: &Path, err: &io::Error) -> Self {
        let mut e = Self::with_form(ErrorKind::Io, Form::Io, what.to_string());
        e.inner.path = Some(path.to_path_buf());
        e.inner.os_error = err.raw_os_error();
        e.inner.cause = err.to_string();
        e
    }

    /// A failed blob read of `path`: "read 12288 of 16384 bytes at offset
    /// 81920 in experts.smoe: unexpected end of file". Carries the path, the
    /// offset, the length asked for and the OS error number.
    pub(crate) fn read(path: &Path, err: &ReadError) -> Self {
        let mut e = Self::with_form(
            ErrorKind::Io,
            Form::Read {
                done: err.done as u64,
            },
            String::new(),
        );
        e.inner.path = Some(path.to_path_buf());
        e.inner.offset = Some(err.offset);
        e.inner.length = Some(err.wanted as u64);
        e.inner.os_error = err.error.raw_os_error();
        e.inner.cause = err.error.to_string();
        e
    }

    /// A blob whose payload does not hash to its entry's xxh3 (a format
    /// error): "blob at offset 81920 in experts.smoe hashes to ..., expected
    /// xxh3 ...". Carries the path and the blob's offset.
    pub(crate) fn checksum(path: &Path, offset: u64, expected: u64, actual: u64) -> Self {
        let mut e = Self::with_form(
            ErrorKind::Format,
            Form::Checksum { expected, actual },
            String::new(),
        );
        e.inner.path = Some(path.to_path_buf());
        e.inner.offset = Some(offset);
        e
    }

    /// An error whose subject is `path`: "PATH is a directory without
    /// experts.smoe". Carries the path.
    pub fn path_is(kind: ErrorKind, path: &Path, what: impl Into<String>) -> Self {
        Self::with_form(kind, Form::PathIs, what.into()).with_path(path)
    }

    /// An error whose subject is an expert: "layer 3 expert 17 is not in the
    /// vault". Carries the layer and expert.
    pub(crate) fn expert_is(
        kind: ErrorKind,
        layer: u32,
        expert: u32,
        what: impl Into<String>,
    ) -> Self {
        Self::with_form(kind, Form::ExpertIs, what.into()).with_expert(layer, expert)
    }

    /// Table entry `index` of a vault breaks a rule about its `field` (a
    /// format error): "table entry 4 (layer 1 expert 3): offset is ...".
    /// Carries the layer, expert and field.
    pub(crate) fn table_entry(
        index: u32,
        layer: u32,
        expert: u32,
        field: Option<&'static str>,
        what: impl Into<String>,
    ) -> Self {
        let mut e = Self::with_form(ErrorKind::Format, Form::TableEntry { index }, what.into())
            .with_expert(layer, expert);
        e.inner.field = field;
        e
    }

    /// A released ticket that is not held (a stale error): "ticket 0x...
    /// (slot S, generation G)" followed by `what`. Carries the ticket.
    pub(crate) fn stale_ticket(
        ticket: u64,
        (slot, generation): (u32, u64),
        what: impl Into<String>,
    ) -> Self {
        let mut e = Self::with_form(
            ErrorKind::Stale,
            Form::Ticket { slot, generation },
            what.into(),
        );
        e.inner.ticket = Some(ticket);
        e
    }

    /// What class of failure this is.
    pub fn kind(&self) -> ErrorKind {
        self.inner.kind
    }

    /// The whole sentence, with its context: what `Display` writes and
    /// `smoe_last_error()` returns.
    pub fn message(&self) -> String {
        self.to_string()
    }

    /// The file the error is about: the one that could not be opened, read
    /// or written, or the vault whose rule was broken.
    pub fn path(&self) -> Option<&Path> {
        self.inner.path.as_deref()
    }

    /// The (layer, expert) the error is about.
    pub fn layer_expert(&self) -> Option<(u32, u32)> {
        self.inner.expert
    }

    /// The layer the error is about (see [`Error::layer_expert`]).
    pub fn layer(&self) -> Option<u32> {
        self.inner.expert.map(|(layer, _)| layer)
    }

    /// The expert the error is about, within [`Error::layer`].
    pub fn expert(&self) -> Option<u32> {
        self.inner.expert.map(|(_, expert)| expert)
    }

    /// The byte offset in [`Error::path`] where it went wrong: where a
    /// failed read started, where a damaged blob lies, the byte that breaks
    /// a rule.
    pub fn offset(&self) -> Option<u64> {
        self.inner.offset
    }

    /// The bytes involved at [`Error::offset`]: what a failed read asked
    /// for, or the payload a checksum covers.
    pub fn length(&self) -> Option<u64> {
        self.inner.length
    }

    /// The OS error number (`errno`), when the failure came from the OS.
    pub fn os_error(&self) -> Option<i32> {
        self.inner.os_error
    }

    /// The vault format field whose rule was broken, named as the format
    /// names it: a header field ("meta_bytes", "n_layers"), a table entry's field
    /// ("offset", "padded_size"), "meta" for the metadata's bytes, or the
    /// metadata key "layer_blob_layouts".
    pub fn field(&self) -> Option<&'static str> {
        self.inner.field
    }

    /// The ticket a stale release named.
    pub fn ticket(&self) -> Option<u64> {
        self.inner.ticket
    }

    /// The same error, about the file `path` (named in front of the
    /// sentence, unless the sentence names it already).
    pub fn with_path(mut self, path: impl AsRef<Path>) -> Self {
        self.inner.path = Some(path.as_ref().to_path_buf());
        self
    }

    /// The same error, about `expert` of `layer` (named in front of the
    /// sentence, "layer 3 expert 17: ", unless the sentence names it).
    pub fn with_expert(mut self, layer: u32, expert: u32) -> Self {
        self.inner.expert = Some((layer, expert));
        self
    }

    /// The same error, at byte `offset` of the file (a value only: the
    /// sentence says where it matters).
    pub fn with_offset(mut self, offset: u64) -> Self {
        self.inner.offset = Some(offset);
        self
    }

    /// The same error, about `length` bytes at [`Error::offset`] (a value
    /// only).
    pub fn with_length(mut self, length: u64) -> Self {
        self.inner.length = Some(length);
        self
    }

    /// The same error, carrying the OS error number `errno` (a value only).
    pub fn with_os_error(mut self, errno: Option<i32>) -> Self {
        self.inner.os_error = errno;
        self
    }

    /// The same error, about the vault format field `field` (a value only:
    /// the sentence names the field in its words).
    pub fn with_field(mut self, field: &'static str) -> Self {
        self.inner.field = Some(field);
        self
    }

    /// The same error with another kind (the facts and sentence unchanged).
    pub(crate) fn with_kind(mut self, kind: ErrorKind) -> Self {
        self.inner.kind = kind;
        self
    }

    /// The same error with `context` put in front of its sentence
    /// ("tensor blk.0.ffn_up: " + sentence). The facts are unchanged.
    pub fn context(mut self, context: impl fmt::Display) -> Self {
        self.inner.context = format!("{context}: {}", self.inner.context);
        self
    }
}

impl fmt::Display for Error {
    /// The sentence, every piece of it escaped ([`crate::printable`]): a
    /// name from a file (a tensor's, a path) holding a control character
    /// or a newline shows as `\x1b`, `\x0a`, never as itself.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let e = &*self.inner;
        let f = &mut Escaping(f);
        f.write_str(&e.context)?;
        // Constructors set the facts their form names; "" and 0 stand in
        // for one a caller could not have removed anyway.
        let path = PrintablePath(e.path.as_deref().unwrap_or(Path::new("")));
        let (layer, expert) = e.expert.unwrap_or_default();
        if e.path.is_some() && !e.form.names_path() {
            write!(f, "{path}: ")?;
        }
        if e.expert.is_some() && !e.form.names_expert() {
            write!(f, "layer {layer} expert {expert}: ")?;
        }
        let what = &e.what;
        let cause = &e.cause;
        match e.form {
            Form::Text => f.write_str(what),
            Form::PathIs => write!(f, "{path} {what}"),
            Form::ExpertIs => write!(f, "layer {layer} expert {expert} {what}"),
            Form::Io => write!(f, "{what} {path}: {cause}"),
            Form::Read { done } => write!(
                f,
                "read {done} of {} bytes at offset {} in {path}: {cause}",
                e.length.unwrap_or_default(),
                e.offset.unwrap_or_default()
            ),
            Form::Checksum { expected, actual } => write!(
                f,
                "blob at offset {} in {path} hashes to {actual:016x}, expected xxh3 {expected:016x}",
                e.offset.unwrap_or_default()
            ),
            Form::TableEntry { index } => {
                write!(f, "table entry {index} (layer {layer} expert {expert}): {what}")
            }
            Form::Ticket { slot, generation } => write!(
                f,
                "ticket {:#x} (slot {slot}, generation {generation}) {what}",
                e.ticket.unwrap_or_default()
            ),
        }
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {self}", self.inner.kind)
    }
}

impl std::error::Error for Error {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_form_builds_its_sentence_from_the_facts() {
        let p = Path::new("v/experts.smoe");
        let enoent = io::Error::from_raw_os_error(libc::ENOENT);
        let e = Error::io("cannot open", p, &enoent);
        assert_eq!(
            e.to_string(),
            "cannot open v/experts.smoe: No such file or directory (os error 2)"
        );
        assert_eq!((e.path(), e.os_error()), (Some(p), Some(libc::ENOENT)));

        let short = ReadError {
            done: 12288,
            wanted: 16384,
            offset: 81920,
            error: io::Error::new(io::ErrorKind::UnexpectedEof, "unexpected end of file"),
        };
        let e = Error::read(p, &short).with_expert(3, 17);
        assert_eq!(
            e.to_string(),
            "layer 3 expert 17: read 12288 of 16384 bytes at offset 81920 in v/experts.smoe: unexpected end of file"
        );
        assert_eq!(
            e.to_string(),
            format!("layer 3 expert 17: {}", short.message(p))
        );
        assert_eq!(
            (e.offset(), e.length(), e.os_error()),
            (Some(81920), Some(16384), None)
        );

        let e = Error::checksum(p, 4096, 0xab, 0xcd).with_expert(1, 2);
        assert_eq!(
            e.to_string(),
            "layer 1 expert 2: blob at offset 4096 in v/experts.smoe hashes to 00000000000000cd, expected xxh3 00000000000000ab"
        );
        assert_eq!(e.kind(), ErrorKind::Format);

        let e = Error::table_entry(4, 1, 3, Some("size"), "size is 0, expected at least 1")
            .with_path(p);
        assert_eq!(
            e.to_string(),
            "v/experts.smoe: table entry 4 (layer 1 expert 3): size is 0, expected at least 1"
        );
        assert_eq!(
            (e.layer(), e.expert(), e.field()),
            (Some(1), Some(3), Some("size"))
        );

        let e = Error::expert_is(ErrorKind::NotFound, 0, 9, "is not in the vault");
        assert_eq!(e.to_string(), "layer 0 expert 9 is not in the vault");
        let e = Error::path_is(
            ErrorKind::Argument,
            p,
            "is a directory without experts.smoe",
        );
        assert_eq!(
            e.to_string(),
            "v/experts.smoe is a directory without experts.smoe"
        );
        let e = Error::stale_ticket(0x21, (1, 2), "is not held");
        assert_eq!(
            e.to_string(),
            "ticket 0x21 (slot 1, generation 2) is not held"
        );
        assert_eq!(e.ticket(), Some(0x21));

        let e = Error::format("header field n_layers is 0, expected at least 1")
            .with_field("n_layers")
            .with_path(p)
            .context("pack");
        assert_eq!(
            e.to_string(),
            "pack: v/experts.smoe: header field n_layers is 0, expected at least 1"
        );
        assert_eq!(format!("{e:?}"), format!("Format: {e}"));
        assert_eq!(e.message(), e.to_string());
    }
}
