//! The library's integration tests, one binary: a module a subject. Run one
//! subject with a filter on its module, e.g.
//! `cargo test --release --test library -- streamer::`.
//!
//! The tests that measure or change the whole process (its CPU time, RSS,
//! working directory, cgroup), or load every core, are in the `alone`
//! binary (`tests/alone/`), one at a time.

mod budget;
mod c_api;
mod c_header;
mod cmake;
mod examples;
mod fuzz_corpus;
mod generation_wrap;
mod hardening_files;
mod hardening_input;
mod header;
mod in_place;
mod install;
mod lookahead;
mod popularity;
mod prewarm;
mod python;
mod roundtrip;
mod skip;
mod streamer;
mod swift;
mod trace;
mod vault_format;
mod working_set;
