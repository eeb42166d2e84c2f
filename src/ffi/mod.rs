//! The C API (docs/c-api.md): the only place in the crate with `extern "C"`.
//!
//! This module owns the boundary and nothing else. It converts: C pointers to
//! Rust references (checking NULL), [`crate::Error`] to [`smoe_status`] plus a
//! thread-local message for [`smoe_last_error`], and panics to
//! `SMOE_ERR_INTERNAL`. It must never hold logic of its own: every decision is
//! made by the core, which knows nothing of C.
//!
//! `include/smoe.h` is generated from this module by cbindgen (see `build.rs`
//! and `cbindgen.toml`); a test fails when the committed header drifts.
//!
//! # Writing an export
//!
//! Keep the real signature on the function, so cbindgen sees it, and put the
//! body inside `ffi_status` (status-returning calls) or `ffi_guard`
//! (anything else), which catch panics:
//!
//! ```ignore
//! /// One line of what it does.
//! ///
//! /// # Returns
//! /// - `SMOE_OK` ...
//! /// - `SMOE_ERR_ARGUMENT` if `s` or `out` is NULL.
//! ///
//! /// # Safety
//! /// `s` is either NULL or a pointer returned by `smoe_open` and not yet closed;
//! /// `out` is either NULL or valid for writing one `smoe_slot`.
//! #[no_mangle]
//! pub unsafe extern "C" fn smoe_claim(s: *mut smoe_streamer, layer: u32, expert: u32,
//!                                     out: *mut smoe_slot) -> smoe_status {
//!     ffi_status("smoe_claim", || {
//!         // SAFETY: the caller guarantees `s` is NULL or a live streamer.
//!         let s = unsafe { try_ref(s, "s") }?;
//!         let out = try_out(out, "out")?;
//!         let slot = s.claim(layer, expert)?;        // the core decides
//!         // SAFETY: `out` is non-NULL and the caller guarantees it is writable.
//!         unsafe { out.as_ptr().write(slot.into()) };
//!         Ok(smoe_status::SMOE_OK)
//!     })
//! }
//! ```
//!
//! # Enums coming in from C
//!
//! A C caller may pass any `int` where the header says `smoe_status`, and a
//! Rust enum holding a value that is not one of its variants is undefined
//! behaviour the moment it exists. So [`smoe_status`] is only ever *produced*
//! by Rust (returned, or written through an out-pointer); a parameter that C
//! declares as `smoe_status` is taken here as [`smoe_status_value`], a plain
//! `c_int` that cbindgen renames to `smoe_status` in the header (see
//! `cbindgen.toml`), and is matched with [`smoe_status::from_value`]. A C enum
//! whose enumerators include negative values fitting in `int` has type `int`
//! on every ABI we target, so the two declarations are call-compatible.

#![allow(non_camel_case_types)]

use std::any::Any;
use std::cell::RefCell;
use std::ffi::{c_char, c_int, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::NonNull;

use crate::{Error, ErrorKind};

mod api;
mod tier;
mod types;

pub use api::*;
pub use tier::*;
pub use types::{smoe_config, smoe_slot, smoe_stats, smoe_streamer};

/// The version of the C ABI this library implements. Compare it with
/// `smoe_abi_version()` at run time to detect a header/library mismatch.
pub const SMOE_ABI_VERSION: u32 = 1;

/// `smoe_config.policy`: evict the least recently used idle slot (default).
pub const SMOE_POLICY_LRU: u32 = 0;
/// `smoe_config.policy`: evict the idle slot whose layer the decode loop
/// reaches last (docs/c-api.md, "Eviction").
pub const SMOE_POLICY_ADAPTIVE: u32 = 1;

/// `smoe_config.populate`: the ring's pages are committed as slots are
/// first loaded (default).
pub const SMOE_POPULATE_OFF: u32 = 0;
/// `smoe_config.populate`: a thread pre-faults the ring after open.
pub const SMOE_POPULATE_BACKGROUND: u32 = 1;
/// `smoe_config.populate`: `smoe_open` pre-faults the ring before it
/// returns (docs/c-api.md, "The ring's memory").
pub const SMOE_POPULATE_OPEN: u32 = 2;

// Each status is declared here once, with its number and its doc: cbindgen
// reads this enum (it does not expand macros), so it stays written out.
// Everything else about a status (its name as text, the list of all of them,
// the core `ErrorKind` it reports) is derived by `status_table!` below.
//
// Values are never reused, the rule rustls-ffi keeps for `rustls_result`: a
// new status takes a number no status ever had, and a removed status moves
// its number to `RETIRED_STATUS_VALUES`, which a test keeps from ever being
// handed out again, so an old program never reads a new library's answer as
// something else.

/// The result of every call that can fail. Values are fixed by the ABI and
/// never reused (a retired value stays reserved); `smoe_status_str()` names
/// each one.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum smoe_status {
    /// Success.
    SMOE_OK = 0,
    /// Claim: not resident yet, its read is queued.
    SMOE_PENDING = 1,
    /// NULL, bad struct_size, out-of-range value.
    SMOE_ERR_ARGUMENT = -1,
    /// (layer, expert) is not in the vault.
    SMOE_ERR_NOT_FOUND = -2,
    /// Open or read failed (errno in the message).
    SMOE_ERR_IO = -3,
    /// Vault invalid, or a blob failed its checksum.
    SMOE_ERR_FORMAT = -4,
    /// The ring could not be allocated.
    SMOE_ERR_NO_MEMORY = -5,
    /// Every slot is claimed or loading.
    SMOE_ERR_RING_FULL = -6,
    /// Release of a ticket that is not held.
    SMOE_ERR_STALE = -7,
    /// E.g. direct I/O required but refused.
    SMOE_ERR_UNSUPPORTED = -8,
    /// A bug: a panic caught at the boundary.
    SMOE_ERR_INTERNAL = -99,
}

/// Numbers that once named a status and must never name another. None has
/// been retired yet.
pub const RETIRED_STATUS_VALUES: &[c_int] = &[];

/// How a `smoe_status` parameter arrives from C: any `int`, possibly not a
/// variant. Renamed to `smoe_status` in the header; see the module docs.
pub type smoe_status_value = c_int;

/// Derives everything about the statuses from one line each: the status and
/// the core error kind that maps to it (none for `SMOE_OK` and
/// `SMOE_PENDING`). It generates [`smoe_status::ALL`],
/// [`smoe_status::from_value`], [`smoe_status::kind`], the names
/// `smoe_status_str` returns, and `From<ErrorKind>`. Its matches are
/// exhaustive both ways, so a status missing here, or an [`ErrorKind`]
/// without a status, does not compile.
macro_rules! status_table {
    (@kind) => {
        None
    };
    (@kind $kind:ident) => {
        Some(ErrorKind::$kind)
    };
    ($($status:ident $(=> $kind:ident)?,)*) => {
        impl smoe_status {
            /// Every status, in ABI order (the order of the header).
            pub const ALL: &'static [smoe_status] = &[$(smoe_status::$status),*];

            /// The status whose ABI value is `value`, or `None` if no status
            /// has it.
            #[must_use]
            pub fn from_value(value: smoe_status_value) -> Option<smoe_status> {
                Self::ALL.iter().copied().find(|st| *st as c_int == value)
            }

            /// The core error kind this status reports; `None` for
            /// `SMOE_OK` and `SMOE_PENDING`.
            #[must_use]
            pub fn kind(self) -> Option<ErrorKind> {
                match self {
                    $(smoe_status::$status => status_table!(@kind $($kind)?),)*
                }
            }

            /// The constant's name, NUL-terminated, with static lifetime.
            fn name(self) -> &'static CStr {
                match self {
                    $(smoe_status::$status => const {
                        match CStr::from_bytes_with_nul(
                            concat!(stringify!($status), "\0").as_bytes(),
                        ) {
                            Ok(name) => name,
                            Err(_) => panic!("a status name holds a NUL"),
                        }
                    },)*
                }
            }
        }

        impl From<ErrorKind> for smoe_status {
            fn from(kind: ErrorKind) -> Self {
                match kind {
                    $($(ErrorKind::$kind => smoe_status::$status,)?)*
                }
            }
        }
    };
}

status_table! {
    SMOE_OK,
    SMOE_PENDING,
    SMOE_ERR_ARGUMENT => Argument,
    SMOE_ERR_NOT_FOUND => NotFound,
    SMOE_ERR_IO => Io,
    SMOE_ERR_FORMAT => Format,
    SMOE_ERR_NO_MEMORY => NoMemory,
    SMOE_ERR_RING_FULL => RingFull,
    SMOE_ERR_STALE => Stale,
    SMOE_ERR_UNSUPPORTED => Unsupported,
    SMOE_ERR_INTERNAL => Internal,
}

// ---------------------------------------------------------------------------
// This thread's last error message.
// ---------------------------------------------------------------------------

thread_local! {
    /// The message `smoe_last_error()` hands out; `None` means "no error yet"
    /// (read as ""). Replaced only by `set_last_error`/`clear_last_error`, so a
    /// pointer handed out stays valid until the next failing call on this
    /// thread; the C contract promises less (until the next smoe call) to
    /// leave room to change that.
    static LAST_ERROR: RefCell<Option<CString>> = const { RefCell::new(None) };
}

/// Records `err`'s message as this thread's last error.
pub(crate) fn set_last_error(err: &Error) {
    set_last_error_message(&err.message());
}

/// Records `message` as this thread's last error. An interior NUL (which C
/// could not see past) is replaced by `?`.
fn set_last_error_message(message: &str) {
    let bytes: Vec<u8> = message
        .bytes()
        .map(|b| if b == 0 { b'?' } else { b })
        .collect();
    let message = CString::new(bytes).unwrap_or_default();
    // `try_with` fails only while this thread's locals are being destroyed;
    // there is nobody left to read the message then.
    let _ = LAST_ERROR.try_with(|slot| *slot.borrow_mut() = Some(message));
}

/// Forgets this thread's last error, so `smoe_last_error()` reads "".
#[allow(dead_code)] // boundary toolkit; no export needs it yet
pub(crate) fn clear_last_error() {
    let _ = LAST_ERROR.try_with(|slot| *slot.borrow_mut() = None);
}

// ---------------------------------------------------------------------------
// The panic boundary.
// ---------------------------------------------------------------------------

/// What an export returns when its body panicked.
pub(crate) trait PanicValue {
    /// The value returned to C after a caught panic.
    fn panic_value() -> Self;
}

impl PanicValue for smoe_status {
    fn panic_value() -> Self {
        smoe_status::SMOE_ERR_INTERNAL
    }
}

impl PanicValue for () {
    fn panic_value() -> Self {}
}

impl PanicValue for u32 {
    fn panic_value() -> Self {
        0
    }
}

impl PanicValue for &'static c_char {
    fn panic_value() -> Self {
        empty_c_str()
    }
}

impl<T> PanicValue for *const T {
    fn panic_value() -> Self {
        std::ptr::null()
    }
}

impl<T> PanicValue for *mut T {
    fn panic_value() -> Self {
        std::ptr::null_mut()
    }
}

/// Runs `body`, the whole body of the export `function`. A panic is caught
/// here, recorded as this thread's last error ("internal error: panic in
/// smoe_claim: ..."), and turned into `R::panic_value()`, so it never crosses
/// into C. Use [`ffi_status`] for exports that return a status.
pub(crate) fn ffi_guard<R: PanicValue>(function: &'static str, body: impl FnOnce() -> R) -> R {
    // AssertUnwindSafe: after a panic the boundary touches nothing the body
    // could have left half-updated; the core's own state machines are
    // atomics whose every intermediate state is legal.
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(value) => value,
        Err(payload) => {
            set_last_error_message(&format!(
                "internal error: panic in {function}: {}",
                crate::printable::Printable(panic_message(payload.as_ref()))
            ));
            R::panic_value()
        }
    }
}

/// Runs `body`, the whole body of the status-returning export `function`:
/// `Ok(status)` is returned as is, `Err(e)` records `e`'s message and returns
/// its kind's status, a panic becomes `SMOE_ERR_INTERNAL` (see [`ffi_guard`]).
pub(crate) fn ffi_status(
    function: &'static str,
    body: impl FnOnce() -> Result<smoe_status, Error>,
) -> smoe_status {
    ffi_guard(function, || status_of(body()))
}

/// Converts a core result to a status: `Ok` is `SMOE_OK`; an error is stored
/// for `smoe_last_error()` and mapped by its kind.
pub(crate) fn status_of<T>(result: Result<T, Error>) -> smoe_status
where
    T: Into<StatusOnOk>,
{
    match result {
        Ok(value) => value.into().0,
        Err(err) => {
            set_last_error(&err);
            err.kind().into()
        }
    }
}

/// The status a successful result stands for: `()` is `SMOE_OK`, a status is
/// itself (so a body can answer `SMOE_PENDING`).
pub(crate) struct StatusOnOk(smoe_status);

impl From<()> for StatusOnOk {
    fn from((): ()) -> Self {
        StatusOnOk(smoe_status::SMOE_OK)
    }
}

impl From<smoe_status> for StatusOnOk {
    fn from(status: smoe_status) -> Self {
        StatusOnOk(status)
    }
}

/// The text of a panic payload (`panic!` with a literal or a format string).
fn panic_message(payload: &(dyn Any + Send)) -> &str {
    if let Some(text) = payload.downcast_ref::<&'static str>() {
        text
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text
    } else {
        "(non-string panic payload)"
    }
}

// ---------------------------------------------------------------------------
// Pointer helpers: NULL becomes SMOE_ERR_ARGUMENT naming the parameter.
// ---------------------------------------------------------------------------

/// The error for a NULL `parameter`.
fn null_argument(parameter: &str) -> Error {
    Error::argument(format!("{parameter} is NULL"))
}

/// `value`, or an argument error naming `parameter` if it is `None` (for
/// exports that take a nullable borrow as `Option<&T>`).
#[allow(dead_code)] // boundary toolkit; no export needs it yet
pub(crate) fn required<T>(value: Option<T>, parameter: &str) -> Result<T, Error> {
    value.ok_or_else(|| null_argument(parameter))
}

/// Borrows `*ptr`, or an argument error naming `parameter` if it is NULL.
///
/// # Safety
/// `ptr` is either NULL or satisfies the requirements of `&*ptr` for `'a`.
pub(crate) unsafe fn try_ref<'a, T>(ptr: *const T, parameter: &str) -> Result<&'a T, Error> {
    // SAFETY: the caller guarantees a non-NULL `ptr` is valid for `&'a T`.
    unsafe { ptr.as_ref() }.ok_or_else(|| null_argument(parameter))
}

/// Mutably borrows `*ptr`, or an argument error naming `parameter` if NULL.
/// For out-parameters that may be uninitialized use [`try_out`] instead.
///
/// # Safety
/// `ptr` is either NULL or satisfies the requirements of `&mut *ptr` for `'a`.
#[allow(dead_code)] // boundary toolkit; no export needs it yet
pub(crate) unsafe fn try_mut<'a, T>(ptr: *mut T, parameter: &str) -> Result<&'a mut T, Error> {
    // SAFETY: the caller guarantees a non-NULL `ptr` is valid for `&'a mut T`.
    unsafe { ptr.as_mut() }.ok_or_else(|| null_argument(parameter))
}

/// Checks an out-parameter for NULL without reading or borrowing it (its
/// memory may be uninitialized): write the result with `ptr.as_ptr().write`,
/// only on success.
pub(crate) fn try_out<T>(ptr: *mut T, parameter: &str) -> Result<NonNull<T>, Error> {
    NonNull::new(ptr).ok_or_else(|| null_argument(parameter))
}

/// Borrows the C array `ptr[0..n]`: empty when `n` is 0 (`ptr` may then be
/// NULL), else an argument error naming `parameter` if `ptr` is NULL.
///
/// # Safety
/// `ptr` is either NULL or valid for reading `n` values of `T`, not written
/// to during `'a`.
pub(crate) unsafe fn try_slice<'a, T>(
    ptr: *const T,
    n: u32,
    parameter: &str,
) -> Result<&'a [T], Error> {
    if n == 0 {
        return Ok(&[]);
    }
    if ptr.is_null() {
        return Err(Error::argument(format!("{parameter} is NULL but n is {n}")));
    }
    // SAFETY: non-NULL, and the caller guarantees `n` readable values.
    Ok(unsafe { std::slice::from_raw_parts(ptr, n as usize) })
}

/// Borrows a C string, or an argument error naming `parameter` if NULL.
///
/// # Safety
/// `ptr` is either NULL or a valid NUL-terminated string that outlives `'a`
/// and is not written to during it.
pub(crate) unsafe fn try_c_str<'a>(ptr: *const c_char, parameter: &str) -> Result<&'a CStr, Error> {
    if ptr.is_null() {
        return Err(null_argument(parameter));
    }
    // SAFETY: non-NULL, and the caller guarantees a valid NUL-terminated string.
    Ok(unsafe { CStr::from_ptr(ptr) })
}

/// `text` as C sees it: a reference to its first character (the NUL, if empty).
fn first_char(text: &'static CStr) -> &'static c_char {
    // SAFETY: `as_ptr` points to `text`'s first character (a `CStr` always
    // holds at least its NUL), which lives and stays unchanged for `'static`.
    unsafe { &*text.as_ptr() }
}

/// The static empty C string.
fn empty_c_str() -> &'static c_char {
    first_char(c"")
}

// ---------------------------------------------------------------------------
// Exports.
// ---------------------------------------------------------------------------

/// The ABI version of the library actually loaded, `SMOE_ABI_VERSION` of the
/// header it was built from.
///
/// # Returns
/// Always `SMOE_ABI_VERSION` (1 for this library).
///
/// # Safety
/// None: takes nothing, may be called at any time from any thread.
#[no_mangle]
pub extern "C" fn smoe_abi_version() -> u32 {
    SMOE_ABI_VERSION
}

/// The crate's version (`version` in its Cargo.toml), as C sees it.
const VERSION: &CStr =
    match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
        Ok(version) => version,
        Err(_) => panic!("CARGO_PKG_VERSION holds a NUL byte"),
    };

/// The version of the library actually loaded, e.g. `"0.1.0"`:
/// `SMOE_VERSION_STRING` of the header it was built from. The header's
/// `SMOE_VERSION_MAJOR`, `SMOE_VERSION_MINOR` and `SMOE_VERSION_PATCH` are its
/// three numbers, all generated from the crate's version. Within one
/// `SMOE_ABI_VERSION` a newer library keeps every older program working; the
/// version tells which fixes and additions a program gets.
///
/// # Returns
/// A static NUL-terminated string, never NULL, never to be freed:
/// `MAJOR.MINOR.PATCH`, with a `-pre` suffix on a pre-release.
///
/// # Safety
/// None: takes nothing, may be called at any time from any thread.
#[no_mangle]
pub extern "C" fn smoe_version() -> &'static c_char {
    first_char(VERSION)
}

/// The name of a status, e.g. `"SMOE_ERR_IO"`.
///
/// # Returns
/// A static NUL-terminated string, never NULL, never to be freed: the
/// constant's name for each `smoe_status` value, or `"SMOE_UNKNOWN_STATUS"`
/// for any other `int`.
///
/// # Safety
/// None: any `int` value is accepted.
#[no_mangle]
pub extern "C" fn smoe_status_str(st: smoe_status_value) -> &'static c_char {
    ffi_guard("smoe_status_str", || {
        let name = match smoe_status::from_value(st) {
            Some(status) => status.name(),
            None => c"SMOE_UNKNOWN_STATUS",
        };
        first_char(name)
    })
}

/// This thread's last error message: the message of the most recent call on
/// this thread that failed (or caught a panic), with its context (file,
/// offset, layer and expert, OS error).
///
/// # Returns
/// A NUL-terminated string, never NULL, owned by the library: `""` if no call
/// on this thread has failed. It stays valid until the next `smoe_` call on
/// this thread (or the thread's exit); copy it to keep it.
///
/// # Safety
/// From C: none beyond the lifetime above. From Rust this is `unsafe` because
/// the returned reference's `'static` lifetime is a lie: the caller must not
/// use it after the next call into this module on the same thread.
#[no_mangle]
pub unsafe extern "C" fn smoe_last_error() -> &'static c_char {
    ffi_guard("smoe_last_error", || {
        let ptr = LAST_ERROR
            .try_with(|slot| slot.borrow().as_ref().map(|message| message.as_ptr()))
            .ok()
            .flatten();
        match ptr {
            // SAFETY: `ptr` points to the first byte of this thread's stored
            // `CString`, which is neither freed nor changed until the next
            // `set_last_error`/`clear_last_error` on this thread, i.e. until
            // a later smoe call; the caller promises not to use the
            // reference after that.
            Some(ptr) => unsafe { &*ptr },
            None => empty_c_str(),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads a C string out of a `&c_char` as the C side would.
    fn text(first: &c_char) -> String {
        // SAFETY: every `&c_char` these exports return starts a NUL-terminated
        // string that is still alive here.
        unsafe { CStr::from_ptr(first) }
            .to_str()
            .unwrap()
            .to_owned()
    }

    /// The one place the numbers are pinned: the C API's values are ABI and
    /// never change (a new status is appended with a new number).
    #[test]
    fn status_values_are_the_abi() {
        let values: Vec<c_int> = smoe_status::ALL.iter().map(|st| *st as c_int).collect();
        assert_eq!(values, [0, 1, -1, -2, -3, -4, -5, -6, -7, -8, -99]);
        for &st in smoe_status::ALL {
            assert_eq!(smoe_status::from_value(st as c_int), Some(st));
            assert_eq!(text(smoe_status_str(st as c_int)), format!("{st:?}"));
        }
    }

    #[test]
    fn values_are_unique_and_never_retired_ones() {
        let mut seen = std::collections::HashSet::new();
        for &st in smoe_status::ALL {
            let value = st as c_int;
            assert!(seen.insert(value), "{st:?}: value {value} used twice");
            assert!(
                !RETIRED_STATUS_VALUES.contains(&value),
                "{st:?} reuses the retired value {value}"
            );
        }
        for value in RETIRED_STATUS_VALUES {
            assert_eq!(text(smoe_status_str(*value)), "SMOE_UNKNOWN_STATUS");
        }
    }

    #[test]
    fn out_of_range_status_is_named_unknown() {
        for value in [2, -9, -98, -100, c_int::MIN, c_int::MAX] {
            assert_eq!(smoe_status::from_value(value), None);
            assert_eq!(text(smoe_status_str(value)), "SMOE_UNKNOWN_STATUS");
        }
    }

    #[test]
    fn last_error_is_per_thread_and_starts_empty() {
        std::thread::spawn(|| {
            // SAFETY: each reference is used before the next smoe call.
            assert_eq!(text(unsafe { smoe_last_error() }), "");
            let status = status_of::<()>(Err(Error::new(ErrorKind::Stale, "ticket 7 not held")));
            assert_eq!(status, smoe_status::SMOE_ERR_STALE);
            assert_eq!(text(unsafe { smoe_last_error() }), "ticket 7 not held");
            clear_last_error();
            assert_eq!(text(unsafe { smoe_last_error() }), "");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn every_kind_maps_to_its_status() {
        // `From<ErrorKind>` is an exhaustive match, so every kind has a
        // status; here each status with a kind is the one that kind gives.
        let mut kinds = 0;
        for &st in smoe_status::ALL {
            if let Some(kind) = st.kind() {
                assert_eq!(smoe_status::from(kind), st);
                kinds += 1;
            }
        }
        assert_eq!(kinds, smoe_status::ALL.len() - 2, "all but OK and PENDING");
        assert_eq!(smoe_status::SMOE_OK.kind(), None);
        assert_eq!(smoe_status::SMOE_PENDING.kind(), None);
        assert_eq!(
            smoe_status::from(ErrorKind::Io),
            smoe_status::SMOE_ERR_IO,
            "spot check by name"
        );
    }

    #[test]
    fn panic_becomes_internal_with_a_message() {
        std::thread::spawn(|| {
            let status = ffi_status("smoe_test", || panic!("slot {} broke", 3));
            assert_eq!(status, smoe_status::SMOE_ERR_INTERNAL);
            // SAFETY: used before the next smoe call.
            let message = text(unsafe { smoe_last_error() });
            assert_eq!(message, "internal error: panic in smoe_test: slot 3 broke");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn ok_results_and_pending_pass_through() {
        assert_eq!(
            ffi_status("t", || Ok(smoe_status::SMOE_OK)),
            smoe_status::SMOE_OK
        );
        assert_eq!(
            ffi_status("t", || Ok(smoe_status::SMOE_PENDING)),
            smoe_status::SMOE_PENDING
        );
        assert_eq!(status_of(Ok(())), smoe_status::SMOE_OK);
    }

    #[test]
    fn null_pointers_name_the_parameter() {
        std::thread::spawn(|| {
            // SAFETY: NULL is allowed by each helper's contract.
            let err = unsafe { try_ref::<u32>(std::ptr::null(), "cfg") }.unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Argument);
            assert_eq!(err.message(), "cfg is NULL");
            // SAFETY: as above.
            let err = unsafe { try_c_str(std::ptr::null(), "vault_path") }.unwrap_err();
            assert_eq!(err.message(), "vault_path is NULL");
            assert!(try_out::<u64>(std::ptr::null_mut(), "out").is_err());
            assert!(required::<&u8>(None, "s").is_err());
            let value = 5u32;
            // SAFETY: `&value` is a valid reference.
            assert_eq!(unsafe { try_ref(&value, "x") }.unwrap(), &5);
            assert_eq!(
                status_of::<()>(Err(null_argument("s"))),
                smoe_status::SMOE_ERR_ARGUMENT
            );
            // SAFETY: used before the next smoe call.
            assert_eq!(text(unsafe { smoe_last_error() }), "s is NULL");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn metadata_is_handed_out_without_a_copy() {
        let dir = std::env::temp_dir().join(format!("smoe-meta-nocopy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let opts = crate::vault::WriterOptions {
            meta: Some("{\"arch\":\"t\"}".to_owned()),
            ..Default::default()
        };
        let mut w = crate::vault::VaultWriter::create(&dir, 1, 1, opts).unwrap();
        w.add_blob(0, 0, b"x").unwrap();
        let path = w.finish().unwrap();
        let config = crate::Config {
            freq_path: Some(std::path::PathBuf::new()),
            ..crate::Config::default()
        };
        let s = smoe_streamer::new(crate::Streamer::open(&path, config).unwrap());
        // SAFETY: `s` is alive for the whole use of the reference.
        let handed: *const c_char = unsafe { smoe_vault_metadata(&s) };
        // SAFETY: `handed` points at the NUL-terminated metadata of `s`,
        // which is still open.
        assert_eq!(text(unsafe { &*handed }), "{\"arch\":\"t\"}");
        assert_eq!(
            handed.cast::<u8>(),
            s.inner.vault().meta().as_ptr(),
            "the C string is the vault's own bytes"
        );
        drop(s);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn interior_nul_in_a_message_is_replaced() {
        std::thread::spawn(|| {
            // An error's text escapes it, as every control character.
            set_last_error(&Error::format("bad\0name"));
            // SAFETY: used before the next smoe call.
            assert_eq!(text(unsafe { smoe_last_error() }), "bad\\x00name");
            // Any other message has it replaced.
            set_last_error_message("bad\0name");
            // SAFETY: used before the next smoe call.
            assert_eq!(text(unsafe { smoe_last_error() }), "bad?name");
        })
        .join()
        .unwrap();
    }
}
