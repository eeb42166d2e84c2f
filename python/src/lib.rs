//! The extension module `smoe._native` of the Python package `smoe`
//! (docs/python.md): the library's Rust API (`smoe::Streamer`, its claims,
//! stats and errors) for Python. The package's Python half, `smoe/`,
//! defines the exception classes and re-exports what is here.
//!
//! - `streamer`: `smoe.Streamer`; its blocking waits release the GIL and
//!   take it back every 50 ms for a moment, to run signal handlers.
//! - `lease`: `smoe.Lease`, one claim, and the rule that no view outlives
//!   its claim (numpy's views here, DLPack in `dlpack`).
//! - `config`: the settings' keywords and the counters' names, held to the
//!   library's structs by the compiler.
//! - `layout`: the metadata's blob layouts, for typed numpy views.
//! - `errors`: the library's errors as the `smoe.Error` family.
//! - `synth`: `smoe.synth`, the library's synthetic vaults.
//! - `pack`: `smoe.pack`, the packer.
//! - `interrupt`: long work (a pack, a synthetic vault) on its own thread,
//!   stopped by Ctrl-C.
//! - `testing` (feature `test-hooks`): a gated reader for the tests.

mod config;
mod dlpack;
mod errors;
mod held;
mod interrupt;
mod layout;
mod lease;
mod pack;
mod shared;
mod streamer;
mod synth;
#[cfg(feature = "test-hooks")]
mod testing;

use pyo3::prelude::*;

#[pymodule]
fn _native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = module.py();
    errors::init(module)?;
    module.add_class::<streamer::Streamer>()?;
    module.add_class::<lease::Lease>()?;
    module.add_class::<lease::LeaseView>()?;
    module.add_function(wrap_pyfunction!(synth::synth, module)?)?;
    module.add_function(wrap_pyfunction!(pack::pack, module)?)?;
    module.add_function(wrap_pyfunction!(streamer::config_defaults, module)?)?;
    module.add("CONFIG_FIELDS", streamer::names(py, config::CONFIG_FIELDS)?)?;
    module.add("STATS_FIELDS", streamer::names(py, config::STATS_FIELDS)?)?;
    module.add("__version__", env!("CARGO_PKG_VERSION"))?;
    #[cfg(feature = "test-hooks")]
    testing::add(module)?;
    Ok(())
}
