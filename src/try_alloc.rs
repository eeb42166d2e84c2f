//! Allocations sized by input, made fallible: what a model's headers make
//! the reader hold (its entries, its names, a header's bytes) grows
//! through these, so that a process short of memory (a host under
//! `ulimit -v`, a container's limit) gets an error of the
//! [`ErrorKind::NoMemory`] kind instead of an abort. Small fixed
//! allocations are not worth the ceremony; the growing ones are where a
//! failure happens.

use crate::error::{Error, ErrorKind, Result};

/// The error of an allocation that failed: `what` says what it was for
/// (it names the file).
pub fn no_memory(what: impl std::fmt::Display) -> Error {
    Error::new(
        ErrorKind::NoMemory,
        format!("out of memory: cannot allocate {what}"),
    )
}

/// Appends `item` to `v`, growing it as `push` would (amortized), or fails
/// with `what()`'s error when the memory cannot be had.
pub fn push<T>(v: &mut Vec<T>, item: T, what: impl FnOnce() -> Error) -> Result<()> {
    if v.len() == v.capacity() && v.try_reserve(1).is_err() {
        return Err(what());
    }
    v.push(item);
    Ok(())
}

/// Room for `n` more items in `v` (amortized growth), or `what()`'s error.
pub fn reserve<T>(v: &mut Vec<T>, n: usize, what: impl FnOnce() -> Error) -> Result<()> {
    v.try_reserve(n).map_err(|_| what())
}

/// `n` zero bytes, or `what()`'s error.
pub fn zeroed(n: usize, what: impl FnOnce() -> Error) -> Result<Vec<u8>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| what())?;
    v.resize(n, 0);
    Ok(v)
}

/// A copy of `s`, or `None` when the memory cannot be had.
pub fn string(s: &str) -> Option<String> {
    let mut out = String::new();
    out.try_reserve_exact(s.len()).ok()?;
    out.push_str(s);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_allocation_that_cannot_be_had_is_an_error() {
        let e = zeroed(usize::MAX, || no_memory("everything")).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NoMemory);
        assert_eq!(e.to_string(), "out of memory: cannot allocate everything");
        let mut v: Vec<u64> = Vec::new();
        assert!(reserve(&mut v, usize::MAX / 4, || no_memory("a list")).is_err());
        push(&mut v, 7, || no_memory("x")).unwrap();
        assert_eq!(v, [7]);
        assert_eq!(string("abc").as_deref(), Some("abc"));
    }
}
