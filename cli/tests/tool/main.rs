//! The tool's integration tests, one binary: the real `smoe` run as a
//! process, a module a subject. Run one subject with a filter on its
//! module, e.g. `cargo test --release -p smoe-cli --test tool -- pack::`.
//!
//! Files that test the tool's side of a library test file carry `_cli`
//! (`budget_cli` beside the library's `budget`), so no two test files of
//! the workspace share a name.

mod bench_compare;
mod budget_cli;
mod cli;
mod hardening_files_cli;
mod hardening_input_cli;
mod id_space_cli;
mod in_place_cli;
mod llama;
mod pack;
mod support;
