//! The C and C++ examples in `examples-c/` build warning-free and run
//! (`make -C examples-c run`, against the libraries and the `smoe` tool this
//! `cargo test` built; the tool is package smoe-cli, which a `cargo test` at
//! the root builds too), and the static-link flags that the README, the
//! examples' Makefile, `scripts/install.sh` and the root `CMakeLists.txt`
//! document are the ones rustc reports for the staticlib.

use std::collections::BTreeSet;
use std::env;
use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use smoe_test_support::{native, skip_or_fail};

use native::{lib_dir, manifest_dir, on_path, smoe_tool};

/// Runs `command` with its output captured, killing it after `limit`.
/// Returns (success, stdout + stderr).
fn run_with_timeout(command: &mut Command, limit: Duration) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let out_path = dir.path().join("output");
    let out = fs::File::create(&out_path).unwrap();
    let mut child = command
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap_or_else(|e| panic!("could not run {command:?}: {e}"));
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        thread::sleep(Duration::from_millis(50));
    };
    let output = fs::read_to_string(&out_path).unwrap_or_default();
    match status {
        Some(status) => (status.success(), format!("{status}\n{output}")),
        None => (false, format!("killed after {limit:?}\n{output}")),
    }
}

/// `make -C examples-c TARGET` with the paths of this build.
fn make(target: &str, build: &Path, extra: &[(&str, &str)]) -> Command {
    let mut command = Command::new("make");
    command
        .arg("-C")
        .arg(manifest_dir().join("examples-c"))
        .arg(target)
        .arg(format!("SMOE_LIB_DIR={}", lib_dir().display()))
        .arg(format!("BUILD={}", build.display()))
        // The shared example must find the library through its rpath, as a
        // user's build would; cargo's LD_LIBRARY_PATH can name
        // target/<profile>, where an older `cargo build` may have left a
        // stale libsmoe.so that would shadow the one under test.
        .env_remove("LD_LIBRARY_PATH");
    if let Some(bin) = smoe_tool() {
        command.arg(format!("SMOE_BIN={}", bin.display()));
    }
    for (name, value) in extra {
        command.arg(format!("{name}={value}"));
    }
    command
}

#[test]
fn examples_build_and_run() {
    if smoe_tool().is_none() {
        // `cargo test` at the root builds the tool (package smoe-cli, a
        // default member); `cargo test -p smoe` builds the library alone.
        skip_or_fail(
            "the smoe tool is not next to the libraries: `cargo test -p smoe` builds the \
             library alone; run `cargo test` at the root",
        );
        return;
    }
    if !on_path("make") {
        skip_or_fail("make is not installed (install make; .ci/run does, APT_PACKAGES)");
        return;
    }
    let build = tempfile::tempdir().unwrap();
    let (ok, output) = run_with_timeout(
        &mut make("run", build.path(), &[]),
        Duration::from_secs(300),
    );
    assert!(ok, "make -C examples-c run failed:\n{output}");
    for expected in [
        "stream: layer 1, 8 experts checked byte for byte, twice",
        "0 mismatches",
        "errors: every bad input was reported, none crashed",
    ] {
        assert!(output.contains(expected), "no {expected:?} in:\n{output}");
    }
    // Both stream programs ran: the static and the shared (rpath) one.
    assert_eq!(
        output.matches("checked byte for byte").count(),
        2,
        "{output}"
    );
}

/// clang checks the header's nullability annotations and is stricter in
/// places; the examples must build warning-free with it too.
#[test]
fn examples_build_with_clang() {
    let missing: Vec<&str> = ["make", "clang", "clang++"]
        .into_iter()
        .filter(|tool| !on_path(tool))
        .collect();
    if !missing.is_empty() {
        skip_or_fail(&format!(
            "not on the PATH: {} (install make and clang; .ci/run does, APT_PACKAGES)",
            missing.join(", ")
        ));
        return;
    }
    let build = tempfile::tempdir().unwrap();
    let (ok, output) = run_with_timeout(
        &mut make("all", build.path(), &[("CC", "clang"), ("CXX", "clang++")]),
        Duration::from_secs(300),
    );
    assert!(
        ok,
        "make -C examples-c all CC=clang CXX=clang++ failed:\n{output}"
    );
}

/// The `-l`/`-framework` flags in `text`, as a set.
fn link_flags(text: &str) -> BTreeSet<String> {
    let mut flags = BTreeSet::new();
    // Quotes, backquotes, `=` and parentheses delimit words too:
    // `LIBS="-lc -lm"`, `set(LIBS -lc -lm)`.
    let mut words = text
        .split(|c: char| c.is_whitespace() || "\"'`=()".contains(c))
        .filter(|word| !word.is_empty());
    while let Some(word) = words.next() {
        if word == "-framework" {
            if let Some(name) = words.next() {
                flags.insert(format!("-framework {name}"));
            }
        } else if word.starts_with("-l") && word.len() > 2 {
            flags.insert(word.to_string());
        }
    }
    flags
}

/// What rustc says a program linking libsmoe.a needs, from
/// `cargo rustc --release --lib --crate-type staticlib -- --print
/// native-static-libs`, built in a target directory of its own so it neither
/// waits for nor invalidates the build running this test.
fn native_static_libs() -> String {
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let target_dir = lib_dir()
        .ancestors()
        .find(|dir| dir.file_name().is_some_and(|name| name == "target"))
        .map(|target| target.join("native-static-libs"))
        .unwrap_or_else(|| env::temp_dir().join("smoe-native-static-libs"));
    let mut command = Command::new(cargo);
    command
        .current_dir(manifest_dir())
        .args([
            "rustc",
            "--release",
            "--lib",
            "--crate-type",
            "staticlib",
            "--target-dir",
        ])
        .arg(&target_dir)
        .args(["--", "--print", "native-static-libs"]);
    let (ok, output) = run_with_timeout(&mut command, Duration::from_secs(900));
    assert!(ok, "{command:?} failed:\n{output}");
    output
        .lines()
        .find_map(|line| {
            line.split_once("native-static-libs:")
                .map(|(_, libs)| libs.trim())
        })
        .unwrap_or_else(|| panic!("no native-static-libs line from {command:?}:\n{output}"))
        .to_string()
}

/// Lines inside the ``` fenced blocks of `markdown`.
fn fenced_lines(markdown: &str) -> Vec<&str> {
    let mut inside = false;
    let mut lines = Vec::new();
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            inside = !inside;
        } else if inside {
            lines.push(line);
        }
    }
    lines
}

#[test]
#[cfg(target_os = "linux")]
fn documented_static_libs_match_rustc() {
    let libs = native_static_libs();
    let want = link_flags(&libs);
    assert!(!want.is_empty(), "rustc printed no libraries: {libs:?}");

    // README: every fenced line that links libsmoe.a by hand (not through
    // pkg-config) names exactly these.
    let readme = fs::read_to_string(manifest_dir().join("README.md")).unwrap();
    let static_lines: Vec<&str> = fenced_lines(&readme)
        .into_iter()
        .filter(|line| line.contains("libsmoe.a") && !line.contains("pkg-config"))
        .collect();
    assert!(
        !static_lines.is_empty(),
        "README.md has no fenced line linking libsmoe.a; add one, e.g.\n\
         cc -std=c11 app.c -I include target/release/libsmoe.a {libs}"
    );
    for line in static_lines {
        assert_eq!(
            link_flags(line),
            want,
            "README.md line {line:?}; rustc says {libs:?}"
        );
    }

    // The examples' Makefile, the install script (which writes the
    // installed CMake package's list from it) and the root CMakeLists.txt
    // (Linux branch each).
    let read = |file: &str| fs::read_to_string(manifest_dir().join(file)).unwrap();
    for (file, marker) in [
        ("examples-c/Makefile", "NATIVE_STATIC_LIBS ?="),
        ("scripts/install.sh", "DEFAULT_NATIVE_STATIC_LIBS="),
        ("CMakeLists.txt", "set(SMOE_NATIVE_STATIC_LIBS"),
    ] {
        let text = read(file);
        // The Linux line: the macOS one links libSystem.
        let line = text
            .lines()
            .find(|line| line.contains(marker) && !line.contains("-lSystem"))
            .unwrap_or_else(|| panic!("{file}: no line with {marker:?}"));
        assert_eq!(
            link_flags(line),
            want,
            "{file} line {line:?}; rustc says {libs:?}"
        );
    }
}

/// The README's C example, as it stands there, builds with the flags its
/// build lines give and prints what its last line says it prints, on the
/// vault its `smoe synth` line makes: the README is compiled, not only read.
#[test]
#[cfg(target_os = "linux")]
fn the_readmes_c_example_runs_as_it_says() {
    let (Some(lib), Some(tool)) = (native::staticlib(), smoe_tool()) else {
        skip_or_fail("libsmoe.a or the smoe tool is not built: run cargo build --release");
        return;
    };
    let readme = fs::read_to_string(manifest_dir().join("README.md")).unwrap();
    let section = readme
        .split("## From C")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("README.md has a \"From C\" section");
    let code = section
        .split("```c\n")
        .nth(1)
        .and_then(|s| s.split("```").next())
        .expect("the section holds a ```c block");
    let want = section
        .lines()
        .find_map(|l| l.strip_prefix("./example /tmp/vault    # "))
        .expect("the section says what ./example prints");
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("example.c");
    fs::write(&source, code).unwrap();
    let exe = dir.path().join("example");
    // The README's own build line: its flags, with this build's paths.
    let line = section
        .lines()
        .find(|l| l.starts_with("cc ") && l.contains("libsmoe.a"))
        .expect("the section's build line");
    let mut cc = Command::new(native::default_c_compiler());
    for word in line.split_whitespace().skip(1) {
        match word {
            "include" => cc.arg(native::include_dir()),
            "example.c" => cc.arg(&source),
            "target/release/libsmoe.a" => cc.arg(&lib),
            "example" => cc.arg(&exe),
            _ => cc.arg(word),
        };
    }
    native::run(&mut cc);
    let vault = dir.path().join("vault");
    native::run(Command::new(tool).arg("synth").arg(&vault).args([
        "--layers",
        "2",
        "--experts",
        "4",
        "--blob-kib",
        "20",
    ]));
    let out = native::run(Command::new(&exe).arg(&vault));
    let first = out.lines().next().unwrap_or("");
    assert_eq!(first, want, "the README's example printed:\n{out}");
    assert!(out.contains("claims 1, hits 0, bytes read "), "{out}");
}
