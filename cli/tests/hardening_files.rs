//! Files the tool finds where it expects a vault: a FIFO as the vault file
//! or as a scout file never blocks a subcommand; each run fails (or, for a
//! scout, succeeds) at once, and a check fails after 5 s instead of hanging.
//! The library's side is the library's `tests/hardening_files.rs`.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(5);
const LAYERS: u32 = 2;
const EXPERTS: u32 = 4;

fn small_vault() -> common::TestVault {
    common::vault(LAYERS, EXPERTS, 5000, &[])
}

/// Runs the CLI with a 5 s limit; kills it and fails on a timeout.
fn smoe_within_timeout(args: &[&str]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_smoe"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the smoe binary runs");
    let start = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if start.elapsed() > TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "`smoe {}` did not finish within {TIMEOUT:?}: it blocked",
                args.join(" ")
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn cli_on_a_fifo_vault_file_fails_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("experts.smoe");
    common::mkfifo(&fifo);
    let expected = format!("smoe: {}: is a FIFO, not a vault file", fifo.display());
    for vault in [dir.path(), fifo.as_path()] {
        let vault = vault.to_str().unwrap();
        for args in [
            vec!["inspect", vault],
            vec!["inspect", vault, "--json"],
            vec!["verify", vault],
            vec!["budget", vault],
            vec![
                "bench",
                vault,
                "--tokens",
                "1",
                "--workers",
                "1",
                "--ring-slots",
                "4",
            ],
        ] {
            let out = smoe_within_timeout(&args);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
            assert_eq!(stderr.trim_end(), expected, "{args:?}");
        }
    }
}

#[test]
fn fifo_scout_does_not_block_budget() {
    let v = small_vault();
    let scout = v.dir.path().join("scout.gguf");
    common::mkfifo(&scout);
    let out = smoe_within_timeout(&["budget", v.dir.path().to_str().unwrap(), "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["scout_bytes"], 0, "a FIFO has no size to count");
}
