//! When a test cannot run here (a tool not installed, llama.cpp not built,
//! not root): one rule for every test, so none passes by skipping where it
//! must run.
//!
//! - A tool `.ci/run` provides (gcc, clang, make, pkg-config, cmake, the
//!   llama.cpp build, the smoe tool): [`skip_or_fail`]. Outside CI the test
//!   says why and what to install or build, and returns at once; under CI
//!   (`CI` set and not empty) the test fails.
//! - Root: [`skip_or_fail_root`]. The same, required when
//!   `SMOE_ROOT_TESTS` is set and not empty (`.ci/run` sets it and runs as
//!   root).
//! - What CI never has either (the shared traces beside the checkout):
//!   [`skip`], which only says why.
//!
//! Each prints `skipped: WHY` on stderr and returns (); the caller returns
//! at once, or leaves out the part of the test that needs what is missing.
//! `tests/library/skip.rs` runs each rule in a child process.

use std::env;

/// Whether `name` is set to something other than the empty string.
fn set(name: &str) -> bool {
    env::var_os(name).is_some_and(|v| !v.is_empty())
}

/// True under CI (`CI` set and not empty): a missing tool that `.ci/run`
/// installs fails the test rather than skips it.
pub fn in_ci() -> bool {
    set("CI")
}

/// True when the root-only tests must run (`SMOE_ROOT_TESTS` set and not
/// empty): not being root fails them rather than skips them.
pub fn root_tests_required() -> bool {
    set("SMOE_ROOT_TESTS")
}

/// A test, or a part of one, cannot run here because of `why` (what is
/// missing, and what to install or build). Under CI it fails, naming
/// `why`; elsewhere it prints `skipped: WHY` and the caller returns at once.
#[track_caller]
pub fn skip_or_fail(why: &str) {
    if in_ci() {
        panic!("CI is set, so this test fails rather than skips: {why}");
    }
    skip(why);
}

/// [`skip_or_fail`] for what needs root: it fails when `SMOE_ROOT_TESTS` is
/// set (and not empty) instead of under CI.
#[track_caller]
pub fn skip_or_fail_root(why: &str) {
    if root_tests_required() {
        panic!("SMOE_ROOT_TESTS is set, so this test fails rather than skips: {why}");
    }
    skip(why);
}

/// True when this process is root; otherwise [`skip_or_fail_root`] says
/// that `needs` (what the test needs root for) cannot be had here, and
/// false: the caller returns at once.
#[track_caller]
pub fn root_or_skip(needs: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    skip_or_fail_root(&format!(
        "{needs} needs root, and this is not root (run as root; SMOE_ROOT_TESTS=1 requires it)"
    ));
    false
}

/// Prints `skipped: WHY` on stderr, never failing: for what no CI machine
/// has either.
pub fn skip(why: &str) {
    eprintln!("skipped: {why}");
}
