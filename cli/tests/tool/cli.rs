//! Runs the real `smoe` binary as a process: synth, inspect (human and
//! JSON), verify (intact and damaged), every kind of bad input, and a small
//! demo. Each failure must exit 1 with exactly one `smoe: ...` line on
//! stderr, and nothing may panic.

use crate::support;

use support::{assert_contains, smoe, synth, synth_shape, text};

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;
use smoe::vault::Vault;

/// Exit code 1, exactly one stderr line `smoe: ...` containing every needle,
/// and no panic.
fn assert_fails(out: &Output, needles: &[&str]) {
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "expected one stderr line, got: {stderr:?}");
    assert!(lines[0].starts_with("smoe: "), "{stderr}");
    for needle in needles {
        assert!(stderr.contains(needle), "{needle:?} not in {stderr:?}");
    }
}

#[test]
fn synth_then_inspect_human() {
    let dir = tempfile::tempdir().unwrap();
    let vault = synth(dir.path(), &["--top-k", "4"]);
    let out = smoe(&["inspect", vault.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let v = Vault::open(&vault).unwrap();
    for needle in [
        v.header().vault_id_hex(),
        "4 layers × 6 experts".to_owned(),
        "18 blobs".to_owned(),
        "3 of 4 layers have experts (1-3)".to_owned(),
        format!("{} bytes", v.total_payload_bytes()),
        format!("{} bytes", v.header().file_bytes),
        format!("{} bytes padded", v.max_padded_size()),
        "checksums     yes".to_owned(),
        "\"top_k\": 4".to_owned(),
        "alignment     16384".to_owned(),
        "KiB".to_owned(),
    ] {
        assert!(stdout.contains(&needle), "{needle:?} not in\n{stdout}");
    }
}

#[test]
fn synth_then_inspect_json() {
    let dir = tempfile::tempdir().unwrap();
    let vault = synth(dir.path(), &[]);
    // Both forms of the path: the directory and the file.
    for path in [vault.clone(), vault.join("experts.smoe")] {
        let out = smoe(&["inspect", path.to_str().unwrap(), "--json"]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let json: Value = serde_json::from_slice(&out.stdout).expect("stdout is JSON");
        let obj = json.as_object().unwrap();
        let keys: BTreeSet<&str> = obj.keys().map(String::as_str).collect();
        let want: BTreeSet<&str> = [
            "version",
            "alignment",
            "n_layers",
            "n_experts",
            "n_entries",
            "flags",
            "data_offset",
            "file_bytes",
            "vault_id",
            "meta",
            "entries",
        ]
        .into();
        assert_eq!(keys, want);

        let v = Vault::open(&path).unwrap();
        let h = v.header();
        assert_eq!(json["version"], h.version);
        assert_eq!(json["alignment"], h.alignment);
        assert_eq!(json["n_layers"], 4);
        assert_eq!(json["n_experts"], 6);
        assert_eq!(json["n_entries"], 18);
        assert_eq!(json["flags"], h.flags);
        assert_eq!(json["data_offset"], h.data_offset);
        assert_eq!(json["file_bytes"], h.file_bytes);
        let id = json["vault_id"].as_str().unwrap();
        assert_eq!(id, h.vault_id_hex());
        assert!(id.len() == 32 && id.chars().all(|c| matches!(c, '0'..='9' | 'a'..='f')));
        let meta: Value = serde_json::from_str(v.meta()).unwrap();
        assert_eq!(json["meta"], meta);
        assert_eq!(json["meta"]["synth"]["seed"], 42);

        let entries = json["entries"].as_array().unwrap();
        assert_eq!(entries.len(), v.entries().len());
        for (j, e) in entries.iter().zip(v.entries()) {
            let keys: BTreeSet<&str> = j.as_object().unwrap().keys().map(String::as_str).collect();
            let want: BTreeSet<&str> =
                ["layer", "expert", "offset", "size", "padded_size", "xxh3"].into();
            assert_eq!(keys, want);
            assert_eq!(j["layer"], e.layer);
            assert_eq!(j["expert"], e.expert);
            assert_eq!(j["offset"], e.offset);
            assert_eq!(j["size"], e.size);
            assert_eq!(j["padded_size"], e.padded_size);
            let x = j["xxh3"].as_str().unwrap();
            assert!(
                x.len() == 16 && x.chars().all(|c| matches!(c, '0'..='9' | 'a'..='f')),
                "{x}"
            );
            assert_eq!(u64::from_str_radix(x, 16).unwrap(), e.xxh3);
        }
    }
}

#[test]
fn inspect_json_meta_is_null_without_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let opts = smoe::vault::WriterOptions {
        alignment: 4096,
        checksums: false,
        meta: None,
        vault_id: None,
    };
    let mut w = smoe::vault::VaultWriter::create(dir.path(), 1, 1, opts).unwrap();
    w.add_blob(0, 0, &[7u8; 10]).unwrap();
    let path = w.finish().unwrap();
    let out = smoe(&["inspect", "--json", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["meta"], Value::Null);
    assert_eq!(json["flags"], 0);
    assert_eq!(json["entries"][0]["xxh3"], "0000000000000000");

    let out = smoe(&["verify", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_contains(&text(&out.stdout), "no checksums");
}

#[test]
fn verify_intact_vault() {
    let dir = tempfile::tempdir().unwrap();
    let vault = synth(dir.path(), &[]);
    let out = smoe(&["verify", vault.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(out.stderr.is_empty(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("checked 18 blobs"), "{stdout}");
    assert!(stdout.contains("GB/s"), "{stdout}");
    assert!(
        stdout.contains("direct I/O") || stdout.contains("buffered I/O"),
        "{stdout}"
    );
}

/// Writes `byte` at `at` in the vault file (outside the header, table and
/// metadata, so the vault still opens and only the blob is bad).
fn poke(vault: &Path, at: u64, f: impl FnOnce(u8) -> u8) {
    let file = vault.join("experts.smoe");
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[at as usize] = f(bytes[at as usize]);
    std::fs::write(&file, bytes).unwrap();
}

#[test]
fn verify_names_a_flipped_payload_byte() {
    let dir = tempfile::tempdir().unwrap();
    let vault = synth(dir.path(), &[]);
    let e = *Vault::open(&vault).unwrap().entry(2, 5).unwrap();
    poke(&vault, e.offset + 1234, |b| b ^ 0x10);
    let out = smoe(&["verify", vault.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(stderr.contains("layer 2 expert 5: xxh3 is "), "{stderr}");
    assert!(
        stderr.contains(&format!("expected {:016x}", e.xxh3)),
        "{stderr}"
    );
    // Exactly one line, naming the file and the blob; the count is on stdout.
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("experts.smoe: layer 2 expert 5"),
        "{stderr}"
    );
    assert!(text(&out.stdout).contains("1 of 18 blobs bad"));
}

#[test]
fn verify_names_nonzero_padding() {
    let dir = tempfile::tempdir().unwrap();
    let vault = synth(dir.path(), &[]);
    let e = *Vault::open(&vault).unwrap().entry(1, 0).unwrap();
    assert!(e.padded_size > e.size);
    poke(&vault, e.offset + e.size, |_| 0xab);
    let out = smoe(&["verify", vault.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "layer 1 expert 0: padding byte at blob offset {} is nonzero",
            e.size
        )),
        "{stderr}"
    );
    assert!(
        !stderr.contains("xxh3 is"),
        "payload was untouched: {stderr}"
    );
}

fn bad_inputs(dir: &Path) -> Vec<(PathBuf, Vec<String>)> {
    let vault = synth(dir, &[]);
    let good = std::fs::read(vault.join("experts.smoe")).unwrap();
    let empty = dir.join("empty.smoe");
    std::fs::write(&empty, b"").unwrap();
    let truncated = dir.join("truncated.smoe");
    std::fs::write(&truncated, &good[..good.len() - 100]).unwrap();
    let short = dir.join("short.smoe");
    std::fs::write(&short, &good[..60]).unwrap();
    let other = dir.join("notes.txt");
    std::fs::write(&other, b"these are not the weights you are looking for\n").unwrap();
    let missing = dir.join("no-such-vault");
    let s = |p: &Path| p.display().to_string();
    vec![
        (empty.clone(), vec![s(&empty), "empty".into()]),
        (
            truncated.clone(),
            vec![s(&truncated), "file_bytes".into(), good.len().to_string()],
        ),
        (short.clone(), vec![s(&short), "truncated".into()]),
        // Not a vault's magic: taken for a model to open in place, which
        // it is not either (SPEC §6).
        (
            other.clone(),
            vec![s(&other), "not a GGUF or safetensors model".into()],
        ),
        (
            missing.clone(),
            vec![s(&missing), "No such file or directory".into()],
        ),
    ]
}

#[test]
fn bad_inputs_fail_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    for (path, needles) in bad_inputs(dir.path()) {
        let needles: Vec<&str> = needles.iter().map(String::as_str).collect();
        for cmd in [&["inspect"][..], &["inspect", "--json"], &["verify"]] {
            let mut args = cmd.to_vec();
            args.push(path.to_str().unwrap());
            let out = smoe(&args);
            assert_fails(&out, &needles);
            assert!(out.stdout.is_empty(), "{args:?}: {}", text(&out.stdout));
        }
    }
}

#[test]
fn directory_without_vault_fails_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let out = smoe(&["inspect", dir.path().to_str().unwrap()]);
    assert_fails(
        &out,
        &["experts.smoe", "holds neither", "model.safetensors"],
    );
}

#[test]
fn permission_denied_names_path_and_os_error() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    let vault = synth(dir.path(), &[]);
    let file = vault.join("experts.smoe");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o000)).unwrap();
    // Root reads through mode 000; to be denied for real, run the binary as
    // the unprivileged user `nobody` (65534), who may walk to the file but
    // not read it.
    // SAFETY: geteuid has no preconditions and cannot fail.
    let as_root = unsafe { libc::geteuid() } == 0;
    if as_root {
        for d in [dir.path(), vault.as_path()] {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
    }
    for cmd in ["inspect", "verify"] {
        let mut command = Command::new(env!("CARGO_BIN_EXE_smoe"));
        command.args([cmd, file.to_str().unwrap()]);
        if as_root {
            command.uid(65534).gid(65534);
        }
        let out = command.output().expect("the smoe binary runs");
        assert_fails(&out, &[file.to_str().unwrap(), "Permission denied"]);
    }
}

#[test]
fn usage_errors_exit_2() {
    assert_eq!(smoe(&[]).status.code(), Some(2));
    assert_eq!(smoe(&["inspect"]).status.code(), Some(2));
    assert_eq!(smoe(&["frobnicate"]).status.code(), Some(2));
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("v");
    let d = d.to_str().unwrap();
    let base = ["synth", d, "--layers", "2", "--experts", "2", "--blob-kib"];
    let mut args = base.to_vec();
    args.extend(["0"]);
    assert_eq!(smoe(&args).status.code(), Some(2));
    let mut args = base.to_vec();
    args.extend(["1", "--dense", "2"]);
    let out = smoe(&args);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("--dense layer 2"));
    assert_eq!(smoe(&["--help"]).status.code(), Some(0));
}

#[test]
fn synth_with_every_layer_dense_fails_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("v");
    let out = synth_shape(&d, "2", "3", "1", &["--dense", "0,1"]);
    assert_fails(&out, &["dense"]);
}

#[test]
fn demo_small() {
    let dir = tempfile::tempdir().unwrap();
    let out = smoe(&[
        "demo",
        "--size-mb",
        "24",
        "--dir",
        dir.path().to_str().unwrap(),
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert!(stdout.contains("24 layers × 64 experts"), "{stdout}");
    assert!(stdout.matches("GB/s").count() >= 2, "{stdout}");
    assert!(stdout.contains("demo OK"), "{stdout}");
    // One line compares smoe with mmap on the demo's vault and says how.
    let vs: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("vs mmap: "))
        .collect();
    assert_eq!(vs.len(), 1, "{stdout}");
    assert!(vs[0].contains("smoe/mmap"), "{stdout}");
    assert!(
        vs[0].contains("in a memory cgroup") || vs[0].contains("uncapped and warm"),
        "{stdout}"
    );
    // The streamer's warnings (here: a first run has no histogram yet) go to
    // stderr as in every subcommand, not to stdout as notes.
    let stderr = text(&out.stderr);
    assert!(
        stderr
            .lines()
            .any(|l| l.starts_with("smoe: warning: ") && l.contains("expert_freq.bin")),
        "{stderr}"
    );
    assert!(!stdout.contains("note: "), "{stdout}");
    // The temporary vault is gone.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);

    let out = smoe(&[
        "demo",
        "--size-mb",
        "8",
        "--keep",
        "--dir",
        dir.path().to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let kept: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(kept.len(), 1);
    let kept = kept[0].as_ref().unwrap().path();
    assert!(Vault::open(&kept).is_ok());
}

#[test]
fn bench_replays_a_trace_and_rejects_bad_ones() {
    let dir = tempfile::tempdir().unwrap();
    let vault = synth(dir.path(), &[]);
    let v = vault.to_str().unwrap();
    // Two tokens over layers 1..=3 (layer 0 is dense), top-2 of 3 ranks;
    // token 1 repeats token 0, so with a ring holding both tokens' experts
    // its 6 claims are hits.
    let trace = dir.path().join("trace.csv");
    std::fs::write(
        &trace,
        "token,layer,r0,r1,r2\n0,1,0,1,5\n0,2,2,3,5\n0,3,4,5,0\n1,1,0,1,5\n1,2,2,3,5\n1,3,4,5,0\n",
    )
    .unwrap();
    let out = smoe(&[
        "bench",
        v,
        "--trace",
        trace.to_str().unwrap(),
        "--top-k",
        "2",
        "--ring-slots",
        "12",
        "--check-seed",
        "42",
        "--json",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["tokens"], 2);
    assert_eq!(json["claims"], 12);
    assert_eq!(json["hits"], 6, "{json}");

    let bad = dir.path().join("bad.csv");
    for (content, needles) in [
        (
            "token,layer,r0\n0,0,1\n",
            &["layer 0 expert 1 is not in the vault"][..],
        ),
        ("token,layer,r0\n0,9,1\n", &["layer 9 expert 1"][..]),
        (
            "token,layer,r0\n0,1,x\n",
            &["trace line 2", "r0 is \"x\""][..],
        ),
        ("layer,token,r0\n", &["trace line 1", "header"][..]),
    ] {
        std::fs::write(&bad, content).unwrap();
        let out = smoe(&["bench", v, "--trace", bad.to_str().unwrap()]);
        assert_fails(&out, needles);
    }
    let missing = smoe(&["bench", v, "--trace", "/nonexistent/trace.csv"]);
    assert_fails(
        &missing,
        &["/nonexistent/trace.csv", "No such file or directory"],
    );
}

/// `--help` of every subcommand: ranges as people read them, never Rust's
/// `0..=18446744073709551615`, and a pointer into docs/ says where the docs
/// are; `bench --help` groups its flags under headings.
#[test]
fn help_reads_as_people_write() {
    let commands = [
        "inspect",
        "verify",
        "synth",
        "demo",
        "bench",
        "pack",
        "budget",
        "completions",
    ];
    let mut all = vec![text(&smoe(&["--help"]).stdout)];
    for c in commands {
        let out = smoe(&[c, "--help"]);
        assert!(out.status.success(), "{c}: {}", text(&out.stderr));
        all.push(text(&out.stdout));
    }
    for help in &all {
        for bad in ["..=", "18446744073709551615", "4294967295"] {
            assert!(!help.contains(bad), "{bad:?} in\n{help}");
        }
        for (at, _) in help.match_indices("docs/") {
            let rest = &help[at..help.len().min(at + 80)];
            let sentence = rest.split(['\n']).next().unwrap();
            assert!(
                sentence.contains("smoe's source"),
                "a docs/ path without where to find it: {sentence:?}"
            );
        }
    }
    let bench = text(&smoe(&["bench", "--help"]).stdout);
    let section = |heading: &str| -> String {
        let start = bench
            .find(&format!("\n{heading}:\n"))
            .unwrap_or_else(|| panic!("no heading {heading:?} in\n{bench}"));
        let rest = &bench[start + heading.len() + 3..];
        let end = rest.find("\n\n\n").unwrap_or(rest.len());
        // The next heading ends the section.
        let end = ["\nTrace replay:", "\nComparison:", "\nRing:", "\nOutput:"]
            .iter()
            .filter_map(|h| rest.find(h))
            .min()
            .unwrap_or(end);
        rest[..end].to_owned()
    };
    for (heading, flags) in [
        (
            "Trace replay",
            &["--trace", "--max-tokens", "--capture"][..],
        ),
        (
            "Comparison",
            &["--sweep", "--baseline", "--mem-cap", "--no-isolation"],
        ),
        (
            "Ring",
            &["--ring-slots", "--workers", "--direct", "--policy"],
        ),
        ("Output", &["--plot", "--json"]),
    ] {
        let s = section(heading);
        for flag in flags {
            assert!(
                s.contains(&format!("      {flag} ")) || s.contains(&format!("      {flag}\n")),
                "{flag} not under {heading}:\n{s}"
            );
        }
    }
}

#[test]
fn completions_for_each_shell() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = smoe(&["completions", shell]);
        assert!(out.status.success(), "{shell}: {}", text(&out.stderr));
        let script = text(&out.stdout);
        for word in ["bench", "budget", "mem-cap", "ring-slots", "completions"] {
            assert!(script.contains(word), "{shell}: {word} missing");
        }
    }
    let out = smoe(&["completions", "tcsh"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("smoe: ") && stderr.contains("tcsh"),
        "{stderr}"
    );
    // bash can load what it prints.
    if std::process::Command::new("bash")
        .arg("--version")
        .output()
        .is_ok()
    {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("smoe.bash");
        std::fs::write(&file, smoe(&["completions", "bash"]).stdout).unwrap();
        let check = std::process::Command::new("bash")
            .arg("-c")
            .arg(format!("source '{}' && complete -p smoe", file.display()))
            .output()
            .unwrap();
        assert!(check.status.success(), "{}", text(&check.stderr));
        assert_contains(&text(&check.stdout), "smoe");
    }
}

#[test]
fn synth_blob_size_takes_units() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("v");
    let out = synth_shape(&d, "1", "2", "1M", &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let json: Value =
        serde_json::from_slice(&smoe(&["inspect", "--json", d.to_str().unwrap()]).stdout).unwrap();
    assert_eq!(json["meta"]["synth"]["blob_bytes"], 1 << 20);
    let out = synth_shape(&dir.path().join("w"), "1", "2", "1000B", &[]);
    assert_eq!(out.status.code(), Some(2));
    assert_contains(&text(&out.stderr), "whole number of KiB");
}
