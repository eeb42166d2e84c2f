//! Files the tool finds where it expects a vault: a FIFO as the vault file
//! or as a scout file never blocks a subcommand; each run fails (or, for a
//! scout, succeeds) at once, and a check fails after 5 s instead of hanging.
//! The library's side is the library's `tests/library/hardening_files.rs`.

use smoe_test_support as common;

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use smoe::vault::Vault;

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
    let expected = format!(
        "smoe: {}: is a FIFO, not a vault or model file",
        fifo.display()
    );
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

// ------------------------------------------------- bench's files (issue 19)

/// A trace of two tokens over layers 0 and 1 of [`small_vault`], top-2.
const TRACE: &str = "token,layer,r0,r1\n0,0,0,1\n0,1,2,3\n1,0,0,2\n1,1,1,3\n";

/// [`smoe_within_timeout`] under a 1 GiB address-space limit: a run that
/// reads without bound fails fast instead of taking the machine's memory.
fn smoe_limited(args: &[&str]) -> Output {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_smoe"));
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: the closure runs in the child between fork and exec and only
    // calls setrlimit, which is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: 1 << 30,
                rlim_max: 1 << 30,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &limit) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
    let mut child = cmd.spawn().expect("the smoe binary runs");
    let start = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if start.elapsed() > TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "`smoe {}` did not finish within {TIMEOUT:?}",
                args.join(" ")
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Exit `code`, no signal, exactly one stderr line `smoe: ...` holding
/// every needle.
#[track_caller]
fn assert_one_line(out: &Output, code: i32, needles: &[&str], what: &str) {
    use std::os::unix::process::ExitStatusExt;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.signal(), None, "{what}: killed; {stderr}");
    assert_eq!(out.status.code(), Some(code), "{what}: {stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "{what}: one stderr line expected: {stderr:?}"
    );
    assert!(lines[0].starts_with("smoe: "), "{what}: {stderr:?}");
    for needle in needles {
        assert!(
            stderr.contains(needle),
            "{what}: {needle:?} not in {stderr:?}"
        );
    }
}

/// Every name in `dir`, sorted.
fn names_in(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn bench_trace_must_be_a_regular_file_and_never_blocks() {
    let v = small_vault();
    let vs = v.dir.path().to_str().unwrap();
    let fifo = v.dir.path().join("trace.fifo");
    common::mkfifo(&fifo);
    let dir = v.dir.path().join("a-directory");
    std::fs::create_dir(&dir).unwrap();
    for (trace, what) in [
        ("/dev/zero", "is a character device"),
        (fifo.to_str().unwrap(), "is a FIFO"),
        (dir.to_str().unwrap(), "is a directory"),
    ] {
        let args = ["bench", vs, "--trace", trace, "--workers", "1"];
        let out = smoe_limited(&args);
        assert_one_line(&out, 1, &[trace, what], &format!("{args:?}"));
    }
}

#[test]
fn bench_plot_replaces_nothing_but_an_svg() {
    let v = small_vault();
    let root = v.dir.path();
    let vs = root.to_str().unwrap();
    let trace = root.join("t.csv");
    std::fs::write(&trace, TRACE).unwrap();
    let vault_file = root.join("experts.smoe");
    let notes = root.join("NOTES.txt");
    std::fs::write(&notes, "my notes\n").unwrap();
    let fifo = root.join("plot.fifo");
    common::mkfifo(&fifo);
    let dir = root.join("plot-dir");
    std::fs::create_dir(&dir).unwrap();
    let link = root.join("link.svg");
    std::os::unix::fs::symlink(&vault_file, &link).unwrap();
    let dangling = root.join("dangling.svg");
    std::os::unix::fs::symlink(root.join("missing"), &dangling).unwrap();
    let before: Vec<(std::path::PathBuf, Vec<u8>)> = [&vault_file, &trace, &notes]
        .into_iter()
        .map(|p| (p.clone(), std::fs::read(p).unwrap()))
        .collect();
    // A broken trace as well: the plot is judged before anything is read.
    let bad_trace = root.join("bad.csv");
    std::fs::write(&bad_trace, "not a trace\n").unwrap();
    let names = names_in(root);
    for plot in [
        &vault_file,
        &trace,
        &notes,
        &fifo,
        &dir,
        &link,
        &dangling,
        std::path::Path::new("/dev/null"),
    ] {
        let p = plot.to_str().unwrap();
        for t in [&trace, &bad_trace] {
            let args = [
                "bench",
                vs,
                "--trace",
                t.to_str().unwrap(),
                "--top-k",
                "2",
                "--ring-slots",
                "4",
                "--workers",
                "1",
                "--plot",
                p,
            ];
            let out = smoe_within_timeout(&args);
            assert_one_line(&out, 2, &[p, "--plot"], &format!("{args:?}"));
            assert!(out.stdout.is_empty(), "{args:?}: nothing was run");
        }
        let args = [
            "bench",
            vs,
            "--trace",
            trace.to_str().unwrap(),
            "--top-k",
            "2",
            "--sweep",
            "--plot",
            p,
        ];
        assert_one_line(&smoe_within_timeout(&args), 2, &[p], &format!("{args:?}"));
    }
    for (path, bytes) in &before {
        assert_eq!(&std::fs::read(path).unwrap(), bytes, "{}", path.display());
    }
    assert_eq!(
        names_in(root),
        names,
        "nothing written, no temporary file left"
    );
    assert!(names_in(&dir).is_empty());
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(Vault::open(root).is_ok());
}

#[test]
fn bench_plot_writes_a_new_file_and_replaces_its_own_plot() {
    let v = small_vault();
    let root = v.dir.path();
    let vs = root.to_str().unwrap();
    let trace = root.join("t.csv");
    std::fs::write(&trace, TRACE).unwrap();
    let names = names_in(root);
    let plot = root.join("plot.svg");
    let empty = root.join("empty.svg");
    std::fs::write(&empty, "").unwrap();
    for target in [&plot, &plot, &empty] {
        let p = target.to_str().unwrap();
        let args = [
            "bench",
            vs,
            "--trace",
            trace.to_str().unwrap(),
            "--top-k",
            "2",
            "--ring-slots",
            "4",
            "--workers",
            "1",
            "--plot",
            p,
        ];
        let out = smoe_within_timeout(&args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let svg = std::fs::read_to_string(target).unwrap();
        assert!(
            svg.starts_with("<svg data-generator=\"smoe bench\" ") && svg.contains("Hit rate"),
            "{p}: {svg:.80}"
        );
    }
    let mut want = names;
    want.extend(["empty.svg", "expert_freq.bin", "plot.svg"].map(String::from));
    want.sort();
    assert_eq!(names_in(root), want, "no temporary file left");
}

#[test]
fn bench_prints_the_streamers_warnings() {
    let v = small_vault();
    let root = v.dir.path();
    let vs = root.to_str().unwrap();
    let notes = root.join("NOTES.txt");
    std::fs::write(&notes, "my notes\n").unwrap();
    let vault_file = root.join("experts.smoe");
    let vault_bytes = std::fs::read(&vault_file).unwrap();
    let missing_dir = root.join("no-such-dir").join("t.csv");
    for (capture, what) in [
        (notes.as_path(), "is not a routing trace"),
        (std::path::Path::new("/dev/null"), "is a character device"),
        (missing_dir.as_path(), "not writable"),
    ] {
        let c = capture.to_str().unwrap();
        let args = [
            "bench",
            vs,
            "--tokens",
            "2",
            "--top-k",
            "2",
            "--ring-slots",
            "4",
            "--workers",
            "1",
            "--capture",
            c,
        ];
        let out = smoe_within_timeout(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?}: {stderr}");
        let line = stderr
            .lines()
            .find(|l| l.contains(c))
            .unwrap_or_else(|| panic!("{args:?}: no warning naming {c} in {stderr:?}"));
        assert!(line.starts_with("smoe: warning: "), "{line}");
        assert!(
            line.contains(what) && line.contains("no trace is recorded"),
            "{line}"
        );
    }
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), "my notes\n");
    assert_eq!(std::fs::read(&vault_file).unwrap(), vault_bytes);
    assert!(!root.join("no-such-dir").exists());
    // Where nothing would be captured, --capture is refused, not ignored.
    let trace = root.join("t.csv");
    std::fs::write(&trace, "token,layer,r0\n0,0,1\n").unwrap();
    let capture = root.join("captured.csv");
    let c = capture.to_str().unwrap();
    let t = trace.to_str().unwrap();
    for extra in [&["--mode", "scan"][..], &["--trace", t, "--sweep"]] {
        let mut args = vec!["bench", vs, "--top-k", "1", "--capture", c];
        args.extend_from_slice(extra);
        let out = smoe_within_timeout(&args);
        assert_one_line(&out, 2, &["--capture"], &format!("{args:?}"));
        assert!(!capture.exists(), "{args:?}");
    }
}

// ----------------------------------------- bench's own files (issue 33)

/// `--capture` never replaces a file the run reads: the `--trace` input
/// (named as given, through `./` or `..`, a symbolic link or a hard link),
/// the vault file or the vault's histogram. Each is refused before the
/// run, one line naming it and exit 2, and nothing is written. It once
/// replaced the trace with a capture of the run cut to `--top-k` ranks.
#[test]
fn bench_capture_never_replaces_the_runs_own_files() {
    let v = small_vault();
    let root = v.dir.path();
    let vs = root.to_str().unwrap();
    let trace = root.join("t.csv");
    std::fs::write(&trace, "token,layer,r0,r1,r2\n0,0,0,1,2\n0,1,2,3,0\n").unwrap();
    let dotted = format!("{vs}/./t.csv");
    let up = format!(
        "{vs}/../{}/t.csv",
        root.file_name().unwrap().to_str().unwrap()
    );
    let link = root.join("link.csv");
    std::os::unix::fs::symlink(&trace, &link).unwrap();
    let hard = root.join("hard.csv");
    std::fs::hard_link(&trace, &hard).unwrap();
    let vault_file = root.join("experts.smoe");
    let histogram = root.join(smoe::vault::FREQ_FILE);
    let before: Vec<(std::path::PathBuf, Vec<u8>)> = [&trace, &vault_file]
        .into_iter()
        .map(|p| (p.clone(), std::fs::read(p).unwrap()))
        .collect();
    let names = names_in(root);
    let t = trace.to_str().unwrap();
    for capture in [
        t,
        &dotted,
        &up,
        link.to_str().unwrap(),
        hard.to_str().unwrap(),
        vault_file.to_str().unwrap(),
        histogram.to_str().unwrap(),
    ] {
        for extra in [&[][..], &["--baseline", "mmap"]] {
            let mut args = vec![
                "bench",
                vs,
                "--trace",
                t,
                "--top-k",
                "2",
                "--ring-slots",
                "4",
                "--workers",
                "1",
                "--capture",
                capture,
            ];
            args.extend_from_slice(extra);
            let out = smoe_within_timeout(&args);
            assert_one_line(&out, 2, &[capture, "--capture"], &format!("{args:?}"));
            assert!(out.stdout.is_empty(), "{args:?}: nothing was run");
        }
    }
    // Nor the --plot file, not yet there: the same directory and name.
    let plot = format!("{vs}/plot.svg");
    let capture = format!("{vs}/./plot.svg");
    let args = [
        "bench",
        vs,
        "--trace",
        t,
        "--top-k",
        "2",
        "--plot",
        &plot,
        "--capture",
        &capture,
    ];
    let out = smoe_within_timeout(&args);
    assert_one_line(
        &out,
        2,
        &[&capture, "the --plot file"],
        &format!("{args:?}"),
    );
    for (path, bytes) in &before {
        assert_eq!(&std::fs::read(path).unwrap(), bytes, "{}", path.display());
    }
    assert_eq!(names_in(root), names, "nothing written");
    // A capture beside them is written, and is a trace of the run.
    let capture = root.join("captured.csv");
    let c = capture.to_str().unwrap();
    let args = [
        "bench",
        vs,
        "--trace",
        t,
        "--top-k",
        "2",
        "--ring-slots",
        "4",
        "--workers",
        "1",
        "--capture",
        c,
    ];
    let out = smoe_within_timeout(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let captured = std::fs::read_to_string(&capture).unwrap();
    assert!(captured.starts_with("token,layer,r0,r1\n"), "{captured}");
}

/// A saved web page:
/// its first line is the comment browsers add, and it holds an inline SVG.
const SAVED_PAGE: &str = "<!-- saved from url=(0022)http://example.com/ -->\n<html><head>\
    <title>Results</title></head><body><p>My notes</p><svg width=\"10\" height=\"10\">\
    <rect width=\"10\" height=\"10\"/></svg></body></html>\n";

/// An XHTML document with an inline SVG.
const XHTML: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<!DOCTYPE html>\n\
    <html xmlns=\"http://www.w3.org/1999/xhtml\"><body><svg \
    xmlns=\"http://www.w3.org/2000/svg\" width=\"1\" height=\"1\"/></body></html>\n";

/// `--plot` replaces only a plot smoe wrote (or a missing or empty file):
/// a saved web page, an XHTML document holding an inline `<svg`, or an SVG
/// drawn by anything else is refused before the run, one line naming it
/// and exit 2, and left as it was. The first two were once replaced.
#[test]
fn bench_plot_replaces_only_a_plot_smoe_wrote() {
    let v = small_vault();
    let root = v.dir.path();
    let vs = root.to_str().unwrap();
    let trace = root.join("t.csv");
    std::fs::write(&trace, TRACE).unwrap();
    let t = trace.to_str().unwrap();
    let page = root.join("page.svg");
    std::fs::write(&page, SAVED_PAGE).unwrap();
    let xhtml = root.join("doc.svg");
    std::fs::write(&xhtml, XHTML).unwrap();
    let drawn = root.join("drawn.svg");
    let hand_made = "<?xml version=\"1.0\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\"/>\n";
    std::fs::write(&drawn, hand_made).unwrap();
    let names = names_in(root);
    for (plot, content) in [(&page, SAVED_PAGE), (&xhtml, XHTML), (&drawn, hand_made)] {
        let p = plot.to_str().unwrap();
        for extra in [&["--ring-slots", "4", "--workers", "1"][..], &["--sweep"]] {
            let mut args = vec!["bench", vs, "--trace", t, "--top-k", "2", "--plot", p];
            args.extend_from_slice(extra);
            let out = smoe_within_timeout(&args);
            assert_one_line(&out, 2, &[p, "--plot"], &format!("{args:?}"));
            assert!(out.stdout.is_empty(), "{args:?}: nothing was run");
            assert_eq!(std::fs::read_to_string(plot).unwrap(), content, "{p}");
        }
    }
    assert_eq!(names_in(root), names, "nothing written");
}
