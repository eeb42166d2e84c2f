//! Helpers of the tool's tests: running the real binary.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Runs `smoe ARGS...` to completion.
pub fn smoe(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_smoe"))
        .args(args)
        .output()
        .expect("the smoe binary runs")
}

/// Output bytes as text.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `smoe synth DIR/vault`: 4 layers (layer 0 dense) × 6 experts of 20 KiB,
/// seed 42, plus `extra` flags; returns the vault directory.
pub fn synth(dir: &Path, extra: &[&str]) -> PathBuf {
    let vault = dir.join("vault");
    let mut args = vec![
        "synth",
        vault.to_str().unwrap(),
        "--layers",
        "4",
        "--experts",
        "6",
        "--blob-kib",
        "20",
        "--dense",
        "0",
        "--seed",
        "42",
    ];
    args.extend_from_slice(extra);
    let out = smoe(&args);
    assert!(out.status.success(), "synth failed: {}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("experts.smoe"), "{stdout}");
    vault
}

/// `smoe synth DIR --layers L --experts E --blob-kib K EXTRA...`.
pub fn synth_shape(
    dir: &Path,
    layers: &str,
    experts: &str,
    blob_kib: &str,
    extra: &[&str],
) -> Output {
    let mut args = vec![
        "synth",
        dir.to_str().unwrap(),
        "--layers",
        layers,
        "--experts",
        experts,
        "--blob-kib",
        blob_kib,
    ];
    args.extend_from_slice(extra);
    smoe(&args)
}

/// Asserts that `text` contains `needle`, showing `text` if not.
#[track_caller]
pub fn assert_contains(text: &str, needle: &str) {
    assert!(text.contains(needle), "{needle:?} not in: {text}");
}

/// Whether a root-only test runs: as root; otherwise it prints that `name`
/// is skipped for want of `needs` and returns `false`, unless
/// SMOE_ROOT_TESTS is set (CI), where not being root is a failure.
pub fn root_tests(name: &str, needs: &str) -> bool {
    smoe_test_support::root_or_skip(&format!("{name} ({needs})"))
}
