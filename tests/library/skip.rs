//! The rule of a test that cannot run here (`smoe_test_support::skip`):
//! outside CI it says why and returns; under CI (`CI` set and not empty) it
//! fails; the root-only rule fails when `SMOE_ROOT_TESTS` is set instead.
//! Each case runs this binary again as a child, with the environment under
//! test, on [`skip_child`].

use std::process::{Command, Output};

const CHILD_ENV: &str = "SMOE_TEST_SKIP_CHILD";
const WHY: &str = "frobnicate is not installed (install frobnicate)";
/// What the child prints once the helper returned.
const RETURNED: &str = "the helper returned";

/// The child: calls the helper `SMOE_TEST_SKIP_CHILD` names (`tool` or
/// `root`), then says it returned. Does nothing without the variable.
#[test]
fn skip_child() {
    let Some(which) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    match which.to_str() {
        Some("tool") => smoe_test_support::skip_or_fail(WHY),
        Some("root") => smoe_test_support::skip_or_fail_root(WHY),
        other => panic!("{CHILD_ENV}={other:?}: neither tool nor root"),
    }
    println!("{RETURNED}");
}

/// [`skip_child`] calling `which`'s helper, with `env` set (None: removed)
/// on top of an environment without `CI` and `SMOE_ROOT_TESTS`.
fn child(which: &str, env: &[(&str, Option<&str>)]) -> Output {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args([
            "--exact",
            "skip::skip_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, which)
        .env_remove("CI")
        .env_remove("SMOE_ROOT_TESTS");
    for (name, value) in env {
        match value {
            Some(value) => command.env(name, value),
            None => command.env_remove(name),
        };
    }
    command.output().expect("re-executing the test binary")
}

/// The child skipped: it passed, printed `skipped: WHY` and nothing of CI,
/// and went on after the helper.
#[track_caller]
fn assert_skipped(out: &Output, case: &str) {
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success(),
        "{case}: the child failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    assert!(
        stderr.contains(&format!("skipped: {WHY}")),
        "{case}: no `skipped: {WHY}` on stderr:\n{stderr}"
    );
    assert!(stdout.contains(RETURNED), "{case}: {stdout}");
}

/// The child failed, naming `because` and WHY, and did not go on.
#[track_caller]
fn assert_failed(out: &Output, case: &str, because: &str) {
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        !out.status.success(),
        "{case}: the child passed:\n{stdout}\n{stderr}"
    );
    let message = format!("{because}, so this test fails rather than skips: {WHY}");
    assert!(
        stderr.contains(&message),
        "{case}: no {message:?} on stderr:\n{stderr}"
    );
    assert!(!stdout.contains(RETURNED), "{case}: went on: {stdout}");
}

#[test]
fn a_missing_tool_skips_outside_ci_and_fails_under_it() {
    assert_skipped(&child("tool", &[]), "CI unset");
    assert_skipped(&child("tool", &[("CI", Some(""))]), "CI empty");
    // SMOE_ROOT_TESTS alone does not make a missing tool a failure.
    assert_skipped(
        &child("tool", &[("SMOE_ROOT_TESTS", Some("1"))]),
        "SMOE_ROOT_TESTS=1",
    );
    assert_failed(&child("tool", &[("CI", Some("1"))]), "CI=1", "CI is set");
    assert_failed(
        &child("tool", &[("CI", Some("true"))]),
        "CI=true",
        "CI is set",
    );
}

#[test]
fn a_root_test_skips_unless_smoe_root_tests_is_set() {
    assert_skipped(&child("root", &[]), "SMOE_ROOT_TESTS unset");
    assert_skipped(
        &child("root", &[("SMOE_ROOT_TESTS", Some(""))]),
        "SMOE_ROOT_TESTS empty",
    );
    assert_failed(
        &child("root", &[("SMOE_ROOT_TESTS", Some("1"))]),
        "SMOE_ROOT_TESTS=1",
        "SMOE_ROOT_TESTS is set",
    );
}
