//! `Streamer(path, **config)`'s keywords and `stats()`'s keys: the fields of
//! the library's `Config` and `Stats`, by name.
//!
//! The library declares each field once (`src/config.rs`'s schema macros),
//! but those macros are private to it, so the names are listed here once
//! more, and the compiler holds the list to the library's: each list
//! destructures its struct without `..`, so a field added there (or renamed)
//! does not compile here until it is added to the list. Each field's Python
//! type follows from its Rust type ([`ConfigValue`]), so no field has
//! conversion code of its own. `smoe/_native.pyi` repeats the names for
//! editors; `tests/test_api.py` checks it against [`CONFIG_FIELDS`] and
//! [`STATS_FIELDS`].

use std::path::PathBuf;

use pyo3::exceptions::PyTypeError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyInt, PyString};
use smoe::{Config, DirectIo, Policy, Populate, Stats};

use crate::errors;

/// A setting's Rust type, as Python writes it.
trait ConfigValue: Sized {
    /// What the type accepts, for error messages.
    const EXPECTED: &'static str;
    /// Converts `value`, the keyword `name`'s argument.
    fn from_py(value: &Bound<'_, PyAny>, name: &str) -> PyResult<Self>;
    /// The value as Python shows it (`smoe.config_defaults()`).
    fn to_py<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>>;
}

fn wrong_type(value: &Bound<'_, PyAny>, name: &str, expected: &str) -> PyErr {
    let got = value
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".to_owned());
    PyTypeError::new_err(format!("{name} must be {expected}, not {got}"))
}

/// An integer argument (anything with `__index__`, but not a bool) in
/// `0..=max`.
fn unsigned(value: &Bound<'_, PyAny>, name: &str, expected: &str, max: u64) -> PyResult<u64> {
    if let Some(n) = plain_int(value, max) {
        return Ok(n);
    }
    let py = value.py();
    if value.is_instance_of::<PyBool>() {
        return Err(wrong_type(value, name, expected));
    }
    // SAFETY: `value` is a live object and the GIL is held (`py`);
    // PyNumber_Index returns a new reference, or NULL with an exception
    // set, which `from_owned_ptr_or_err` takes.
    let index = unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyNumber_Index(value.as_ptr())) }
        .map_err(|_| wrong_type(value, name, expected))?;
    match index.extract::<u64>() {
        Ok(n) if n <= max => Ok(n),
        _ => Err(errors::argument(
            py,
            format!("{name} must be in 0..={max}, got {index}"),
        )),
    }
}

/// The common case, without a call into Python: a plain `int` in
/// `0..=max` (a routing loop passes thousands a token). `None` for
/// anything else, which the full check then reads or refuses.
fn plain_int(value: &Bound<'_, PyAny>, max: u64) -> Option<u64> {
    if !value.is_exact_instance_of::<PyInt>() {
        return None;
    }
    value.extract::<u64>().ok().filter(|&n| n <= max)
}

/// A layer's or an expert's number argument (`name`): an int in the
/// library's u32 range, else `TypeError` or `smoe.ArgumentError` naming it.
pub(crate) fn id_arg(value: &Bound<'_, PyAny>, name: &str) -> PyResult<u32> {
    <u32 as ConfigValue>::from_py(value, name)
}

/// A list of expert numbers (`name`): any iterable of ints but a string,
/// each checked as [`id_arg`] checks one (`experts[2]` in an error).
pub(crate) fn id_list_arg(value: &Bound<'_, PyAny>, name: &str) -> PyResult<Vec<u32>> {
    if value.is_instance_of::<pyo3::types::PyString>()
        || value.is_instance_of::<pyo3::types::PyBytes>()
    {
        return Err(wrong_type(value, name, "a list of ints"));
    }
    let items = value
        .try_iter()
        .map_err(|_| wrong_type(value, name, "a list of ints"))?;
    items
        .enumerate()
        .map(|(i, item)| {
            let item = item?;
            // The name is made only for an item that needs the full check.
            match plain_int(&item, u64::from(u32::MAX)) {
                Some(n) => Ok(n as u32),
                None => id_arg(&item, &format!("{name}[{i}]")),
            }
        })
        .collect()
}

impl ConfigValue for u32 {
    const EXPECTED: &'static str = "an int in 0..=4294967295";
    fn from_py(value: &Bound<'_, PyAny>, name: &str) -> PyResult<Self> {
        unsigned(value, name, Self::EXPECTED, u64::from(u32::MAX)).map(|n| n as u32)
    }
    fn to_py<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(self.into_pyobject(py)?.into_any())
    }
}

impl ConfigValue for u64 {
    const EXPECTED: &'static str = "an int in 0..=18446744073709551615";
    fn from_py(value: &Bound<'_, PyAny>, name: &str) -> PyResult<Self> {
        unsigned(value, name, Self::EXPECTED, u64::MAX)
    }
    fn to_py<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(self.into_pyobject(py)?.into_any())
    }
}

impl ConfigValue for bool {
    const EXPECTED: &'static str = "a bool";
    fn from_py(value: &Bound<'_, PyAny>, name: &str) -> PyResult<Self> {
        // Only True and False: a 0 or a "no" here is more likely a mistake
        // (a count given to a switch) than a wish.
        value
            .cast::<PyBool>()
            .map(|b| b.is_true())
            .map_err(|_| wrong_type(value, name, Self::EXPECTED))
    }
    fn to_py<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(PyBool::new(py, *self).to_owned().into_any())
    }
}

impl ConfigValue for Option<u64> {
    const EXPECTED: &'static str = "None or an int in 0..=18446744073709551615";
    fn from_py(value: &Bound<'_, PyAny>, name: &str) -> PyResult<Self> {
        if value.is_none() {
            return Ok(None);
        }
        unsigned(value, name, Self::EXPECTED, u64::MAX).map(Some)
    }
    fn to_py<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(self.into_pyobject(py)?.into_any())
    }
}

impl ConfigValue for Option<PathBuf> {
    const EXPECTED: &'static str = "None, a str or an os.PathLike";
    fn from_py(value: &Bound<'_, PyAny>, name: &str) -> PyResult<Self> {
        if value.is_none() {
            return Ok(None);
        }
        value
            .extract::<PathBuf>()
            .map(Some)
            .map_err(|_| wrong_type(value, name, Self::EXPECTED))
    }
    fn to_py<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(self
            .as_ref()
            .map(|p| p.as_os_str())
            .into_pyobject(py)?
            .into_any())
    }
}

/// A setting whose values are names: each name and its value.
trait Named: Sized + Copy + PartialEq + 'static {
    const NAMES: &'static [(&'static str, Self)];
    /// The values False and True stand for, where the setting was a switch
    /// before it had names.
    const FROM_BOOL: Option<(Self, Self)> = None;
}

impl Named for DirectIo {
    const NAMES: &'static [(&'static str, Self)] = &[
        ("auto", DirectIo::Auto),
        ("require", DirectIo::Require),
        ("off", DirectIo::Off),
    ];
}

impl Named for Policy {
    const NAMES: &'static [(&'static str, Self)] =
        &[("lru", Policy::Lru), ("adaptive", Policy::Adaptive)];
}

impl Named for Populate {
    const NAMES: &'static [(&'static str, Self)] = &[
        ("off", Populate::Off),
        ("background", Populate::Background),
        ("open", Populate::Open),
    ];
    const FROM_BOOL: Option<(Self, Self)> = Some((Populate::Off, Populate::Background));
}

impl<T: Named> ConfigValue for T {
    const EXPECTED: &'static str = "a str";
    fn from_py(value: &Bound<'_, PyAny>, name: &str) -> PyResult<Self> {
        if let (Some((off, on)), Ok(b)) = (T::FROM_BOOL, value.cast::<PyBool>()) {
            return Ok(if b.is_true() { on } else { off });
        }
        let names: Vec<&str> = T::NAMES.iter().map(|(n, _)| *n).collect();
        let text = value
            .cast::<PyString>()
            .map_err(|_| wrong_type(value, name, &format!("one of {names:?}")))?
            .to_cow()?
            .into_owned();
        T::NAMES
            .iter()
            .find(|(n, _)| *n == text)
            .map(|(_, v)| *v)
            .ok_or_else(|| {
                errors::argument(
                    value.py(),
                    format!("{name} must be one of {names:?}, got {text:?}"),
                )
            })
    }
    fn to_py<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let name = T::NAMES
            .iter()
            .find(|(_, v)| v == self)
            .map_or("?", |(n, _)| *n);
        Ok(PyString::new(py, name).into_any())
    }
}

/// The Python-only keyword: releases and closes that would be deferred
/// raise instead (docs/python.md, "Lifetimes").
pub(crate) const STRICT: &str = "strict";

/// Declares the settings a keyword may name, in the library's order.
macro_rules! config_fields {
    ($($name:ident),* $(,)?) => {
        /// Every setting a keyword may name, in the library's order.
        pub(crate) const CONFIG_FIELDS: &[&str] = &[$(stringify!($name)),*];

        /// Sets the setting `name` from `value`; false when no setting has
        /// that name.
        fn set_field(config: &mut Config, name: &str, value: &Bound<'_, PyAny>) -> PyResult<bool> {
            /// The conversion of a field's own type.
            fn convert<T: ConfigValue>(_field: &T, value: &Bound<'_, PyAny>, name: &str) -> PyResult<T> {
                T::from_py(value, name)
            }
            match name {
                $(stringify!($name) => {
                    config.$name = convert(&config.$name, value, name)?;
                })*
                _ => return Ok(false),
            }
            Ok(true)
        }

        /// Every setting's default, as Python writes it.
        pub(crate) fn defaults(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
            let config = Config::default();
            let dict = PyDict::new(py);
            $(dict.set_item(stringify!($name), ConfigValue::to_py(&config.$name, py)?)?;)*
            Ok(dict)
        }

        // Every field of `Config`, by name: a field the library adds fails
        // here until it is listed above (or below, with the hooks that are
        // not settings of the C API either).
        const _: fn(Config) = |Config {
            $($name: _,)*
            count_claims: _,
            trace_capacity: _,
            pressure_root: _,
            huge_pages: _,
        }| {};
    };
}

config_fields!(
    ring_slots,
    slot_mb,
    workers,
    direct_io,
    prewarm,
    prewarm_slots,
    verify,
    scout_bytes,
    engine_overhead_bytes,
    freq_path,
    trace_path,
    policy,
    populate,
    lock,
    elastic,
    pinned,
);

/// What `Streamer(path, **config)`'s keywords ask for.
pub(crate) struct Settings {
    pub(crate) config: Config,
    pub(crate) strict: bool,
}

/// Reads the keywords: every setting named, converted and checked for
/// type; an unknown keyword is a `TypeError` naming each (ranges and the
/// settings' rules are the library's, checked at open).
pub(crate) fn settings(kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<Settings> {
    let mut settings = Settings {
        config: Config::default(),
        strict: false,
    };
    let Some(kwargs) = kwargs else {
        return Ok(settings);
    };
    let mut unknown = Vec::new();
    for (key, value) in kwargs.iter() {
        let name = key.cast::<PyString>()?.to_cow()?.into_owned();
        if name == STRICT {
            settings.strict = bool::from_py(&value, STRICT)?;
        } else if !set_field(&mut settings.config, &name, &value)? {
            unknown.push(format!("'{name}'"));
        }
    }
    if !unknown.is_empty() {
        return Err(PyTypeError::new_err(format!(
            "Streamer() got unexpected keyword argument{} {}; the settings are {}, and '{STRICT}'",
            if unknown.len() == 1 { "" } else { "s" },
            unknown.join(", "),
            CONFIG_FIELDS.join(", "),
        )));
    }
    Ok(settings)
}

/// Declares `stats()`'s keys, in the library's order.
macro_rules! stats_fields {
    ($($name:ident),* $(,)?) => {
        /// Every key of `stats()`, in the library's order.
        pub(crate) const STATS_FIELDS: &[&str] = &[$(stringify!($name)),*];

        /// Every counter of `stats` by name. The destructuring names every
        /// field: a counter the library adds fails here until it is listed.
        pub(crate) fn stats_dict(py: Python<'_>, stats: Stats) -> PyResult<Bound<'_, PyDict>> {
            let Stats { $($name),* } = stats;
            let dict = PyDict::new(py);
            $(dict.set_item(stringify!($name), $name)?;)*
            Ok(dict)
        }
    };
}

stats_fields!(
    claims,
    hits,
    pending,
    bytes_read,
    reads_demand,
    reads_speculative,
    reads_prewarm,
    evictions,
    io_errors,
    checksum_errors,
    resident,
    ring_slots,
    slot_bytes,
    workers,
    direct_io,
    freq_ignored,
    prewarm_slots,
    trace_events,
    trace_dropped,
    policy,
    slots_active,
    shrinks,
    grows,
    slots_held,
    evicted_unclaimed,
    bytes_moved,
    bytes_speculative,
    bytes_speculative_unclaimed,
    prediction_routed,
    prediction_hits,
    speculative_dropped,
    busy_ns,
    drive_idle_ns,
);
