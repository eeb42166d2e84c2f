//! Hostile input for the tool, from the review that hardened the input
//! paths: the CLI never aborts. `smoe verify` streams a blob through a
//! bounded buffer whatever its size, `smoe synth` refuses a vault that cannot
//! fit the disk instead of allocating a blob-sized buffer, and every numeric
//! flag of every subcommand is range-checked, with one `smoe: ...` line
//! naming the flag, the value and the allowed range. Metadata the library
//! rejects is one such line too. The library's half (metadata whole or
//! rejected) is the library's `tests/library/hardening_input.rs`.

use smoe_test_support as common;

use crate::support;

use support::{smoe, synth, synth_shape, text};

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::forge::{sparse_vault, vault_claiming_meta_bytes, vault_with_meta_bytes};
use smoe::vault::{Vault, MAX_META_BYTES};
use xxhash_rust::xxh3::Xxh3;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const TIB: u64 = 1 << 40;

/// Exit `code`, no signal, exactly one stderr line `smoe: ...` holding every
/// needle, and no panic.
#[track_caller]
fn assert_one_line(out: &Output, code: i32, needles: &[&str], what: &str) {
    use std::os::unix::process::ExitStatusExt;
    let stderr = text(&out.stderr);
    assert_eq!(
        out.status.signal(),
        None,
        "{what}: killed by a signal; stderr: {stderr}"
    );
    assert_eq!(out.status.code(), Some(code), "{what}: stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "{what}: {stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "{what}: expected one stderr line: {stderr:?}"
    );
    assert!(lines[0].starts_with("smoe: "), "{what}: {stderr:?}");
    for needle in needles {
        assert!(
            stderr.contains(needle),
            "{what}: {needle:?} not in {stderr:?}"
        );
    }
}

// ------------------------------------------------------------- metadata

#[test]
fn inspect_rejects_metadata_with_a_nul() {
    let dir = tempfile::tempdir().unwrap();
    let path = vault_with_meta_bytes(dir.path(), b"{\"a\":1,\"b\":\"x\0y\"}");
    for args in [&["inspect"][..], &["inspect", "--json"], &["verify"]] {
        let mut args = args.to_vec();
        args.push(path.to_str().unwrap());
        let out = smoe(&args);
        assert_one_line(
            &out,
            1,
            &[path.to_str().unwrap(), "field meta", "byte 13 ", "NUL"],
            &format!("{args:?}"),
        );
        assert!(out.stdout.is_empty(), "{args:?}: {}", text(&out.stdout));
    }
}

#[test]
fn inspect_rejects_meta_bytes_above_the_cap() {
    // One byte over the cap is over; the CLI says so in one line.
    let dir = tempfile::tempdir().unwrap();
    let path = vault_claiming_meta_bytes(dir.path(), MAX_META_BYTES + 1);
    let out = smoe(&["inspect", path.to_str().unwrap()]);
    assert_one_line(
        &out,
        1,
        &["meta_bytes is 67108865", "at most 67108864"],
        "inspect",
    );
}

// ------------------------------------------------------------ big blobs

/// xxh3 of `n` zero bytes, hashed in pieces.
fn xxh3_of_zeros(n: u64) -> u64 {
    let zeros = vec![0u8; 8 << 20];
    let mut h = Xxh3::new();
    let mut left = n;
    while left > 0 {
        let k = left.min(zeros.len() as u64) as usize;
        h.update(&zeros[..k]);
        left -= k as u64;
    }
    h.digest()
}

/// Peak resident set of a process, from /proc (kB).
fn peak_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Runs `smoe args` to the end and returns its output and its peak RSS in
/// KiB, sampled from /proc while it runs. (`wait4`'s `ru_maxrss` will not
/// do: at exec the child inherits the high-water mark of the memory it was
/// spawned from, this test process's.)
fn smoe_measured(args: &[&str]) -> (Output, u64) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_smoe"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the smoe binary runs");
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = pipe.read_to_end(&mut v);
            v
        })
    };
    let stdout = drain(Box::new(child.stdout.take().unwrap()));
    let stderr = drain(Box::new(child.stderr.take().unwrap()));
    let mut peak = 0;
    let status = loop {
        // VmHWM only grows while the process lives; keep the last reading.
        if let Some(kib) = peak_rss_kib(child.id()) {
            peak = peak.max(kib);
        }
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let out = Output {
        status,
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    };
    (out, peak)
}

#[test]
fn verify_streams_a_blob_larger_than_its_buffer_in_bounded_memory() {
    let dir = tempfile::tempdir().unwrap();
    // Not a multiple of the chunk or of the alignment: the last piece is
    // partial and holds the payload's end and the padding.
    let size = GIB + 12_345;
    let path = sparse_vault(dir.path(), size, Some(xxh3_of_zeros(size)));
    let (out, peak_kib) = smoe_measured(&["verify", path.to_str().unwrap()]);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.is_empty(), "{stderr}");
    let stdout = text(&out.stdout);
    assert!(stdout.contains("checked 1 blobs"), "{stdout}");
    assert!(stdout.contains("every blob is intact"), "{stdout}");
    // The old reader held the whole blob (1 GiB resident).
    assert!(peak_kib < 64 * 1024, "peak RSS {peak_kib} KiB");

    // A wrong checksum is still found at the end of the stream.
    let dir = tempfile::tempdir().unwrap();
    let path = sparse_vault(dir.path(), 40 * MIB + 1, Some(0xdead_beef));
    let out = smoe(&["verify", path.to_str().unwrap()]);
    assert_one_line(
        &out,
        1,
        &["layer 0 expert 1: xxh3 is ", "expected 00000000deadbeef"],
        "verify",
    );
}

#[test]
fn verify_a_one_tib_blob_does_not_abort() {
    let dir = tempfile::tempdir().unwrap();
    let path = sparse_vault(dir.path(), TIB, Some(1));
    // Before: `memory allocation of 1099511644160 bytes failed` and SIGABRT,
    // at once. Now it streams; reading a TiB takes minutes, so watch it for
    // a while: it must be alive (or have exited cleanly) and stay small.
    let mut child = Command::new(env!("CARGO_BIN_EXE_smoe"))
        .args(["verify", path.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The other subcommands on the same vault: a summary, a plan, or one
    // line saying the ring cannot be had; never a signal.
    for args in [
        &["inspect"][..],
        &["inspect", "--json"],
        &["budget", "--json"],
        &["bench", "--tokens", "1", "--top-k", "1"],
        &["bench", "--mode", "scan"],
    ] {
        let mut args = args.to_vec();
        args.insert(1, path.to_str().unwrap());
        let out = smoe(&args);
        if !out.status.success() {
            assert_one_line(&out, 1, &[], &format!("{args:?}"));
        }
    }
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut exited = None;
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait().unwrap() {
            exited = Some(status);
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    match exited {
        Some(status) => {
            use std::os::unix::process::ExitStatusExt;
            let mut stderr = String::new();
            let _ = child.stderr.take().unwrap().read_to_string(&mut stderr);
            assert_eq!(status.signal(), None, "killed by a signal: {stderr}");
            assert!(matches!(status.code(), Some(0 | 1)), "{status}: {stderr}");
            assert!(stderr.lines().all(|l| l.starts_with("smoe: ")), "{stderr}");
        }
        None => {
            let peak = peak_rss_kib(child.id());
            child.kill().unwrap();
            let _ = child.wait();
            let peak = peak.expect("peak RSS of the running verify");
            assert!(peak < 64 * 1024, "peak RSS {peak} KiB");
        }
    }
}

#[test]
fn synth_refuses_a_vault_larger_than_the_disk_instead_of_aborting() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("v");
    // 64 blobs of 1 TiB each: 64 TiB, more than this disk holds. Before: a
    // 1 TiB buffer for the first blob, `memory allocation failed`, SIGABRT.
    let start = Instant::now();
    let out = synth_shape(&d, "1", "64", "1073741824", &[]);
    assert_one_line(
        &out,
        1,
        &[d.to_str().unwrap(), "needs", "64.00 TiB", "free"],
        "synth",
    );
    assert!(start.elapsed() < Duration::from_secs(10));
    assert!(!d.join("experts.smoe").exists());
}

#[test]
fn synth_streams_blobs_without_a_blob_sized_buffer() {
    // A 300 MiB blob: the old writer held it whole (300 MiB resident).
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("v");
    let (out, peak_kib) = smoe_measured(&[
        "synth",
        d.to_str().unwrap(),
        "--layers",
        "1",
        "--experts",
        "1",
        "--blob-kib",
        "307200",
        "--top-k",
        "1",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(peak_kib < 64 * 1024, "peak RSS {peak_kib} KiB");
    let out = smoe(&["verify", d.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v = Vault::open(&d).unwrap();
    let spec = smoe::vault::synth::SynthSpec {
        n_layers: 1,
        n_experts: 1,
        blob_bytes: 307_200 * 1024,
        dense_layers: vec![],
        seed: 0,
        top_k: 1,
    };
    let e = v.entry(0, 0).unwrap();
    assert_eq!(e.size, spec.blob_size(0, 0));
    let mut tail = vec![0u8; 100_000];
    File::open(v.path())
        .unwrap()
        .read_exact_at(&mut tail, e.offset + e.size - 100_000)
        .unwrap();
    let mut want = vec![0u8; e.size as usize];
    smoe::vault::synth::fill_payload(0, 0, 0, &mut want);
    assert!(tail == want[want.len() - 100_000..], "payload tail differs");
}

/// Every numeric flag of every subcommand, out of range: exit 2 when the
/// command line alone is wrong (a usage error, as clap's), exit 1 when the
/// value does not fit the vault it names; always one `smoe: ...` line that
/// names the flag, the value and what is allowed.
#[test]
fn numeric_flags_out_of_range_fail_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let v = synth(dir.path(), &[]);
    let vs = v.to_str().unwrap().to_owned();
    let new = dir.path().join("new").to_str().unwrap().to_owned();
    let synth = |extra: &[&str]| -> Vec<String> {
        let mut a = vec!["synth".to_owned(), new.clone()];
        // The required flags, unless the case sets them itself.
        for (flag, value) in [("--layers", "4"), ("--experts", "6"), ("--blob-kib", "4")] {
            if !extra.contains(&flag) {
                a.extend([flag.to_owned(), value.to_owned()]);
            }
        }
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let on = |cmd: &str, extra: &[&str]| -> Vec<String> {
        let mut a = vec![cmd.to_owned(), vs.clone()];
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let demo = |extra: &[&str]| -> Vec<String> {
        let mut a = vec!["demo".to_owned(), "--dir".to_owned(), new.clone()];
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let big = "18446744073709551616"; // u64::MAX + 1
    #[rustfmt::skip]
    let cases: Vec<(Vec<String>, i32, Vec<&str>)> = vec![
        // bench
        (on("bench", &["--top-k", "0"]), 2, vec!["--top-k", "'0'", "1..="]),
        (on("bench", &["--top-k", "1000"]), 1, vec!["--top-k 1000", "1..=6", "n_experts"]),
        (on("bench", &["--top-k", "7", "--mode", "scan"]), 1, vec!["--top-k 7", "1..=6"]),
        (on("bench", &["--tokens", "0"]), 2, vec!["--tokens", "'0'", "1.."]),
        (on("bench", &["--tokens", "4294967296"]), 2, vec!["--tokens", "4294967296"]),
        (on("bench", &["--ring-slots", "19"]), 1, vec!["--ring-slots 19", "18", "entries"]),
        (on("bench", &["--ring-slots", "-1"]), 2, vec!["--ring-slots", "-1"]),
        (on("bench", &["--workers", "65"]), 2, vec!["--workers", "65", "0..=64"]),
        (on("bench", &["--workers", "4294967296"]), 2, vec!["--workers", "4294967296"]),
        (on("bench", &["--keep", "1.5"]), 2, vec!["--keep", "1.5", "0..=1"]),
        (on("bench", &["--keep", "-0.1"]), 2, vec!["--keep", "-0.1", "0..=1"]),
        (on("bench", &["--keep", "NaN"]), 2, vec!["--keep", "NaN", "0..=1"]),
        (on("bench", &["--check-seed", big]), 2, vec!["--check-seed", big]),
        // budget
        (on("budget", &["--slot-mb", "4294967296"]), 2, vec!["--slot-mb", "4294967296"]),
        (on("budget", &["--slot-mb", "-1"]), 2, vec!["--slot-mb", "-1"]),
        (on("budget", &["--scout-bytes", big]), 2, vec!["--scout-bytes", big]),
        (on("budget", &["--overhead-bytes", "-5"]), 2, vec!["--overhead-bytes", "-5"]),
        // demo
        (demo(&["--size-mb", "0"]), 2, vec!["--size-mb", "'0'", "1..=1000000"]),
        (demo(&["--size-mb", "1000001"]), 2, vec!["--size-mb", "1000001", "1..=1000000"]),
        (demo(&["--tokens", "0"]), 2, vec!["--tokens", "'0'", "1.."]),
        // synth
        (synth(&["--layers", "0"]), 2, vec!["--layers", "'0'", "1..=1048576"]),
        (synth(&["--layers", "1048577"]), 2, vec!["--layers", "1048577", "1..=1048576"]),
        (synth(&["--experts", "0"]), 2, vec!["--experts", "'0'", "1..=1048576"]),
        (synth(&["--layers", "1025", "--experts", "1024"]), 2,
            vec!["--layers 1025", "--experts 1024", "1049600", "1048576"]),
        (synth(&["--blob-kib", "0"]), 2, vec!["--blob-kib", "'0'", "1..=1073741824"]),
        (synth(&["--blob-kib", "1073741825"]), 2, vec!["--blob-kib", "1073741825"]),
        (synth(&["--top-k", "0"]), 2, vec!["--top-k", "'0'", "1.."]),
        (synth(&["--top-k", "7"]), 2, vec!["--top-k 7", "1..=6", "--experts 6"]),
        (synth(&["--dense", "4"]), 2, vec!["--dense layer 4", "0..4"]),
        (synth(&["--seed", "-1"]), 2, vec!["--seed", "-1"]),
    ];
    for (args, code, needles) in &cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = smoe(&args);
        assert_one_line(&out, *code, needles, &format!("{args:?}"));
        assert!(out.stdout.is_empty(), "{args:?}: {}", text(&out.stdout));
    }
    // Nothing was written by the refused synth and demo runs.
    assert!(!Path::new(&new).exists());

    // The edges themselves are accepted.
    let out = smoe(&[
        "bench",
        &vs,
        "--top-k",
        "6",
        "--ring-slots",
        "18",
        "--workers",
        "64",
        "--keep",
        "1",
        "--tokens",
        "1",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = smoe(&[
        "bench",
        &vs,
        "--top-k",
        "1",
        "--keep",
        "0",
        "--workers",
        "0",
        "--tokens",
        "2",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

// ------------------------------------------------ routing traces (issue 19)

/// `smoe bench` of a 2-layer × 4-expert vault replaying `trace` at top-2,
/// plus `extra`.
fn bench_trace(vault: &Path, trace: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "bench",
        vault.to_str().unwrap(),
        "--trace",
        trace.to_str().unwrap(),
        "--top-k",
        "2",
        "--ring-slots",
        "4",
        "--workers",
        "1",
        "--json",
    ];
    args.extend_from_slice(extra);
    smoe(&args)
}

#[test]
fn trace_errors_quote_at_most_80_characters() {
    let v = common::vault(2, 4, 5000, &[]);
    let trace = v.dir.path().join("t.csv");
    // 4 MiB: under the 16 MiB a line may hold.
    let long = "x".repeat(4 << 20);
    for (content, needles) in [
        (
            format!("token,layer,r0\n0,0,{long}\n"),
            &["trace line 2", "r0 is \"xxxx", "4194304 bytes"][..],
        ),
        (format!("{long}\n0,0,1\n"), &["trace line 1", "header"][..]),
        (
            format!("token,layer,{long}\n"),
            &["trace line 1", "column 3"][..],
        ),
        (
            format!("token,layer,r0\n{long},0,1\n"),
            &["trace line 2", "token"][..],
        ),
    ] {
        std::fs::write(&trace, content).unwrap();
        let out = bench_trace(v.dir.path(), &trace, &[]);
        assert_one_line(&out, 1, needles, "a 4 MiB field");
        assert!(
            out.stderr.len() < 400,
            "{} bytes on stderr",
            out.stderr.len()
        );
    }
}

#[test]
fn trace_lines_are_bounded() {
    // A regular file of 64 MiB of NUL bytes: no line end anywhere.
    let v = common::vault(2, 4, 5000, &[]);
    let trace = v.dir.path().join("zeros.csv");
    File::create(&trace).unwrap().set_len(64 * MIB).unwrap();
    let out = bench_trace(v.dir.path(), &trace, &[]);
    assert_one_line(&out, 1, &["trace line 1", "16 MiB"], "a 64 MiB line");
    assert!(
        out.stderr.len() < 400,
        "{} bytes on stderr",
        out.stderr.len()
    );
}

#[test]
fn trace_is_read_only_up_to_the_last_token_needed() {
    let v = common::vault(2, 4, 5000, &[]);
    let trace = v.dir.path().join("t.csv");
    let mut content = String::from("token,layer,r0,r1\n0,0,0,1\n0,1,2,3\n1,0,0,2\n1,1,1,3\n");
    content.push_str("2,0,3,2\n2,1,0,1\n");
    // Line 8 on: not a trace at all.
    content.push_str("this line is not a row\n");
    content.push_str(&"\u{0}".repeat(1 << 20));
    std::fs::write(&trace, &content).unwrap();
    for n in ["1", "2", "3"] {
        let out = bench_trace(v.dir.path(), &trace, &["--max-tokens", n]);
        assert!(
            out.status.success(),
            "--max-tokens {n}: {}",
            text(&out.stderr)
        );
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(json["tokens"].to_string(), n, "{json}");
    }
    // Token 3 would start on line 8: that line is read, and refused.
    let out = bench_trace(v.dir.path(), &trace, &["--max-tokens", "4"]);
    assert_one_line(&out, 1, &["trace line 8"], "--max-tokens 4");
    let out = bench_trace(v.dir.path(), &trace, &[]);
    assert_one_line(&out, 1, &["trace line 8"], "the whole trace");
}

#[test]
fn trace_numbers_encoding_and_bom() {
    let v = common::vault(2, 4, 5000, &[]);
    let trace = v.dir.path().join("t.csv");
    let rows = "0,0,0,1\n0,1,2,3\n";
    // A UTF-8 byte order mark before the header is skipped.
    std::fs::write(&trace, format!("\u{feff}token,layer,r0,r1\n{rows}")).unwrap();
    let out = bench_trace(v.dir.path(), &trace, &[]);
    assert!(out.status.success(), "BOM: {}", text(&out.stderr));
    for (bad, needles) in [
        ("0,0,+1,2\n", &["trace line 4", "r0 is \"+1\""][..]),
        ("+0,0,1,2\n", &["trace line 4", "token is \"+0\""][..]),
        ("0,+0,1,2\n", &["trace line 4", "layer is \"+0\""][..]),
        ("0,0,\u{ff11},2\n", &["trace line 4", "r0"][..]),
    ] {
        std::fs::write(&trace, format!("token,layer,r0,r1\n{rows}{bad}")).unwrap();
        let out = bench_trace(v.dir.path(), &trace, &[]);
        assert_one_line(&out, 1, needles, bad);
    }
    // Not UTF-8 on line 4: the line is named.
    let mut bytes = format!("token,layer,r0,r1\n{rows}0,1,").into_bytes();
    bytes.extend_from_slice(b"\xff\xfe\n");
    std::fs::write(&trace, &bytes).unwrap();
    let out = bench_trace(v.dir.path(), &trace, &[]);
    assert_one_line(&out, 1, &["trace line 4", "UTF-8"], "invalid UTF-8");
    // A BOM anywhere but the start is not skipped.
    std::fs::write(&trace, format!("token,layer,r0,r1\n\u{feff}{rows}")).unwrap();
    let out = bench_trace(v.dir.path(), &trace, &[]);
    assert_one_line(&out, 1, &["trace line 2", "token"], "a BOM on line 2");
}

/// A `--top-k` above the ranks the trace has is refused, one line naming
/// the trace, its ranks and the flag (exit 2): it once ran, and said
/// "top-5" beside a working set of top-4. The ranks are the most any
/// replayed row names: a row may leave its last ranks empty, as a capture
/// does. A top-k from the vault's metadata (here 6, `smoe synth`'s for 6
/// experts) is lowered to the trace's ranks, and the output says so.
#[test]
fn bench_top_k_above_the_traces_ranks_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let v = synth(dir.path(), &[]);
    let vs = v.to_str().unwrap();
    let trace = dir.path().join("t.csv");
    let ts = trace.to_str().unwrap();
    // Six rank columns, at most four named in a row.
    std::fs::write(
        &trace,
        "token,layer,r0,r1,r2,r3,r4,r5\n0,1,0,1,2,3,,\n0,2,4,5,,,,\n0,3,1,,,,,\n1,1,1,2,,,,\n1,3,0,1,2,,,\n",
    )
    .unwrap();
    for extra in [&[][..], &["--sweep"], &["--max-tokens", "1"]] {
        for k in ["5", "6"] {
            let mut args = vec![
                "bench",
                vs,
                "--trace",
                ts,
                "--top-k",
                k,
                "--ring-slots",
                "6",
            ];
            args.extend_from_slice(extra);
            let flag = format!("--top-k {k}");
            let out = smoe(&args);
            assert_one_line(&out, 2, &[ts, "4 ranks", &flag], &format!("{args:?}"));
            assert!(out.stdout.is_empty(), "{args:?}");
        }
    }
    // The trace's own ranks are accepted, and what the run says is top-4.
    let out = smoe(&["bench", vs, "--trace", ts, "--top-k", "4", "--sweep"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("at top-4 (from --top-k)"), "{stdout}");
    assert!(stdout.contains("3 layers × top-4"), "{stdout}");
    // A top-k from the metadata: lowered, and said so.
    let out = smoe(&["bench", vs, "--trace", ts, "--ring-slots", "6", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["top_k"], 4, "{json}");
    assert_eq!(json["top_k_from"], "trace", "{json}");
    assert_eq!(json["working_set"]["top_k"], 4, "{json}");
    // A ring that holds the trace's top-4 is enough: it was checked against
    // the metadata's larger top-k before that was lowered, and refused.
    let out = smoe(&["bench", vs, "--trace", ts, "--ring-slots", "4", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (&json["top_k"], &json["ring_slots"]),
        (&4.into(), &4.into()),
        "{json}"
    );
    let out = smoe(&["bench", vs, "--trace", ts, "--ring-slots", "3"]);
    assert_one_line(&out, 1, &["--ring-slots 3", "top-k 4"], "ring of 3");
}
