//! Helpers of the tests that build and run native (C/C++) programs against
//! the libraries this `cargo test` built: the library's `c_api`,
//! `c_header`, `cmake`, `install` and `examples`, and the packer's
//! `models`.

use std::env;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::skip_or_fail;

/// The warnings every C/C++ compile here turns on, as errors.
pub const WARNINGS: [&str; 4] = ["-Wall", "-Wextra", "-Wpedantic", "-Werror"];

/// The repository's root, the library's manifest directory: the first
/// directory above this crate's (`test-support/`) that holds
/// `include/smoe.h`.
pub fn manifest_dir() -> &'static Path {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.ancestors()
        .find(|dir| dir.join("include/smoe.h").is_file())
        .unwrap_or(here)
}

/// The directory holding `smoe.h`.
pub fn include_dir() -> PathBuf {
    manifest_dir().join("include")
}

/// Runs `command`, failing the test with its output if it does not succeed.
/// Returns its stdout followed by its stderr.
pub fn run(command: &mut Command) -> String {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("could not run {command:?}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success(),
        "{command:?} failed ({}):\n{text}",
        output.status
    );
    text
}

/// Whether `program --version` runs and succeeds.
pub fn on_path(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// The C compiler to use: `$CC`, else `cc`.
pub fn default_c_compiler() -> String {
    env::var("CC").unwrap_or_else(|_| "cc".into())
}

/// The C compilers to try: `$CC` or `cc`, and `clang`, the only compiler
/// that checks the header's nullability annotations. Without clang on the
/// PATH its pass is skipped, saying so ([`skip_or_fail`]: under CI, which
/// installs clang, that fails the test).
#[track_caller]
pub fn c_compilers() -> Vec<String> {
    with_clang(default_c_compiler(), "clang")
}

/// The C++ compilers to try: `$CXX` or `c++`, and `clang++` as
/// [`c_compilers`] adds clang.
#[track_caller]
pub fn cxx_compilers() -> Vec<String> {
    with_clang(env::var("CXX").unwrap_or_else(|_| "c++".into()), "clang++")
}

/// `default`, then `clang` unless `default` is it already; when `clang` is
/// not on the PATH, [`skip_or_fail`] (the caller goes on without it).
#[track_caller]
fn with_clang(default: String, clang: &str) -> Vec<String> {
    let mut compilers = vec![default];
    if compilers.iter().any(|c| c == clang) {
        return compilers;
    }
    if on_path(clang) {
        compilers.push(clang.into());
    } else {
        skip_or_fail(&format!(
            "the {clang} pass: {clang} is not on the PATH (install clang, the only compiler \
             that checks the header's nullability annotations)"
        ));
    }
    compilers
}

/// `name` as cargo built it alongside this test binary: the library target is
/// compiled once with every crate type of Cargo.toml into `deps/`, next to
/// the test binary (only `cargo build` copies them up to `target/<profile>`,
/// which is looked in too).
fn built_file(name: &str) -> Option<PathBuf> {
    let exe = env::current_exe().ok()?;
    let deps = exe.parent()?;
    [deps.join(name), deps.parent()?.join(name)]
        .into_iter()
        .find(|path| path.is_file())
}

/// The staticlib cargo built alongside this test binary, if it is there.
pub fn staticlib() -> Option<PathBuf> {
    built_file(if cfg!(windows) {
        "smoe.lib"
    } else {
        "libsmoe.a"
    })
}

/// The directory holding the libsmoe.a and shared library built with this
/// test (see [`built_file`]).
pub fn lib_dir() -> PathBuf {
    built_file("libsmoe.a")
        .and_then(|archive| archive.parent().map(Path::to_path_buf))
        .unwrap_or_else(|| {
            panic!(
                "libsmoe.a not found next to {:?} or in its parent directory; \
                 Cargo.toml lists crate-type \"staticlib\"",
                env::current_exe().ok()
            )
        })
}

/// The `smoe` tool, when this build made it: it belongs to the workspace
/// member `smoe-cli`, which `cargo build` and `cargo test` at the root build
/// along with the library, into `target/<profile>` next to the libraries.
pub fn smoe_tool() -> Option<PathBuf> {
    built_file("smoe")
}

/// The file name of the shared library.
pub fn shared_lib_name() -> &'static str {
    if cfg!(target_vendor = "apple") {
        "libsmoe.dylib"
    } else {
        "libsmoe.so"
    }
}

/// What a C program linking the staticlib also needs: the native libraries
/// Rust's std uses, as the README lists them (tests/library/examples.rs checks that
/// list against rustc's `--print native-static-libs`).
pub fn native_static_libs() -> Vec<&'static OsStr> {
    let libs: &[&str] = if cfg!(target_os = "linux") {
        &[
            "-lgcc_s",
            "-lutil",
            "-lrt",
            "-lpthread",
            "-lm",
            "-ldl",
            "-lc",
        ]
    } else if cfg!(target_vendor = "apple") {
        &["-lSystem"]
    } else {
        &[]
    };
    libs.iter().map(OsStr::new).collect()
}
