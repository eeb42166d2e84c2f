//! A CMake project uses smoe (`tests/cmake/`): configured, built and run
//! against the tree `scripts/install.sh` writes into a prefix with a space
//! (`find_package(smoe 0.1 CONFIG REQUIRED)`), and against the source tree
//! through `add_subdirectory`, whose root `CMakeLists.txt` runs cargo. Each build
//! links the program twice, to `smoe::smoe` (static) and `smoe::smoe_shared`,
//! and runs both on a synthetic vault.
//!
//! Without cmake the tests say so and skip at once, except under CI (`CI`
//! set), where `.ci/run` installs it and they fail
//! ([`smoe_test_support::skip_or_fail`]).

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

use smoe::vault::synth::SynthSpec;

use smoe_test_support::native;

use native::{lib_dir, manifest_dir, on_path, run};

const LAYER: u32 = 1;
const EXPERTS: u32 = 6;

/// Whether cmake runs; false (after saying why) when the test must skip.
fn have_cmake() -> bool {
    if on_path("cmake") {
        return true;
    }
    smoe_test_support::skip_or_fail(
        "cmake is not installed (install cmake; .ci/run does, APT_PACKAGES)",
    );
    false
}

/// A vault with `EXPERTS` experts in layer `LAYER` (layer 0 dense).
fn vault(dir: &Path) -> PathBuf {
    let spec = SynthSpec {
        n_layers: 2,
        n_experts: EXPERTS,
        blob_bytes: 40_000,
        dense_layers: vec![0],
        seed: 22,
        top_k: 2,
    };
    spec.write(dir.join("vault"), &mut |_| {}).unwrap();
    dir.join("vault")
}

/// Configures and builds `tests/cmake` in `build` with `definitions`.
fn configure_and_build(build: &Path, definitions: &[String]) -> String {
    let configured = run(Command::new("cmake")
        .arg("-S")
        .arg(manifest_dir().join("tests/cmake"))
        .arg("-B")
        .arg(build)
        .arg("-DCMAKE_BUILD_TYPE=Release")
        .args(definitions));
    run(Command::new("cmake")
        .arg("--build")
        .arg(build)
        .args(["--parallel", "2"]));
    configured
}

/// Runs both programs of `build` on `vault`; the shared one must load
/// libsmoe through its SONAME from `shared_dir`, the static one not at all.
fn run_both(build: &Path, vault: &Path, shared_dir: &Path) {
    let expected = format!("ok {} {EXPERTS}", env!("CARGO_PKG_VERSION"));
    for link in ["static", "shared"] {
        let program = build.join(format!("consumer_{link}"));
        // No LD_LIBRARY_PATH: the shared program finds the library through
        // the rpath CMake gives a program in its build tree.
        let output = run(Command::new(&program)
            .arg(vault)
            .arg(LAYER.to_string())
            .arg(EXPERTS.to_string())
            .env_remove("LD_LIBRARY_PATH")
            .env_remove("DYLD_LIBRARY_PATH"));
        assert_eq!(output.trim(), expected, "{}", program.display());
        if cfg!(target_os = "linux") && on_path("ldd") {
            let libraries = run(Command::new("ldd")
                .arg(&program)
                .env_remove("LD_LIBRARY_PATH"));
            let smoe_line = libraries.lines().find(|line| line.contains("libsmoe"));
            if link == "static" {
                assert_eq!(smoe_line, None, "{program:?} loads libsmoe:\n{libraries}");
            } else {
                let line = smoe_line
                    .unwrap_or_else(|| panic!("{program:?} does not load libsmoe:\n{libraries}"));
                let want = format!(
                    "libsmoe.so.1 => {}",
                    shared_dir.join("libsmoe.so.1").display()
                );
                assert!(line.trim().starts_with(&want), "{line:?}, want {want:?}");
            }
        }
    }
}

#[test]
fn find_package_from_the_install_tree() {
    if !have_cmake() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // A space in the prefix: the package finds the tree from its own place
    // and quotes every path.
    let prefix = dir.path().join("install prefix");
    run(Command::new("bash")
        .arg(manifest_dir().join("scripts/install.sh"))
        .arg(&prefix)
        .env("SMOE_SKIP_BUILD", "1")
        .env("SMOE_LIB_DIR", lib_dir()));
    let vault = vault(dir.path());
    let build = dir.path().join("build");
    let configured = configure_and_build(
        &build,
        &[format!("-DCMAKE_PREFIX_PATH={}", prefix.display())],
    );
    let found = format!(
        "smoe {} from {}",
        env!("CARGO_PKG_VERSION"),
        prefix.join("lib/cmake/smoe").display()
    );
    assert!(
        configured.contains(&found),
        "no {found:?} in:\n{configured}"
    );
    run_both(&build, &vault, &prefix.join("lib"));

    // The package's version check.
    let project = dir.path().join("versions");
    std::fs::create_dir(&project).unwrap();
    let mut script =
        String::from("cmake_minimum_required(VERSION 3.16)\nproject(v LANGUAGES NONE)\n");
    for (request, _) in version_requests() {
        script.push_str(&format!(
            "unset(smoe_DIR CACHE)\nfind_package(smoe {request} CONFIG QUIET)\n\
             message(STATUS \"request {request}: ${{smoe_FOUND}}\")\n"
        ));
    }
    std::fs::write(project.join("CMakeLists.txt"), script).unwrap();
    let output = run(Command::new("cmake")
        .arg("-S")
        .arg(&project)
        .arg("-B")
        .arg(project.join("build"))
        .arg(format!("-DCMAKE_PREFIX_PATH={}", prefix.display())));
    for (request, served) in version_requests() {
        let want = format!("request {request}: {}", if served { "1" } else { "0" });
        assert!(output.contains(&want), "no {want:?} in:\n{output}");
    }
}

/// `find_package(smoe REQUEST)` requests for this version M.m.p, each with
/// whether the package serves it: at least M.m.p, the same major version,
/// and while that is 0 the same minor one (semantic versioning).
fn version_requests() -> Vec<(String, bool)> {
    let major: u32 = env!("CARGO_PKG_VERSION_MAJOR").parse().unwrap();
    let minor: u32 = env!("CARGO_PKG_VERSION_MINOR").parse().unwrap();
    let mut requests = vec![
        (format!("{major}.{minor}"), true),
        (format!("{major}.{minor}.0"), true),
        (format!("{major}"), true),
        (format!("{major}.{minor}...<{major}.{}", minor + 2), true),
        (format!("{major}.{}", minor + 1), false),
        (format!("{}", major + 1), false),
    ];
    if major == 0 && minor > 0 {
        requests.push((format!("0.{}", minor - 1), false));
    }
    requests
}

/// `add_subdirectory` of this repository: the root CMakeLists.txt builds
/// the library with cargo, in a target directory of its own (so it neither
/// waits for nor invalidates the build running this test), kept under
/// `target/` between runs.
#[test]
fn add_subdirectory_of_the_source_tree() {
    if !have_cmake() {
        return;
    }
    let cargo_target = lib_dir()
        .ancestors()
        .find(|dir| dir.file_name().is_some_and(|name| name == "target"))
        .map(|target| target.join("cmake-subdirectory"))
        .unwrap_or_else(|| env::temp_dir().join("smoe-cmake-subdirectory"));
    let dir = tempfile::tempdir().unwrap();
    let vault = vault(dir.path());
    let build = dir.path().join("build");
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    configure_and_build(
        &build,
        &[
            format!("-DSMOE_SOURCE_DIR={}", manifest_dir().display()),
            format!("-DSMOE_CARGO={cargo}"),
            format!("-DSMOE_CARGO_TARGET_DIR={}", cargo_target.display()),
        ],
    );
    run_both(&build, &vault, &cargo_target.join("release"));
}
