//! `scripts/install.sh PREFIX` installs the layout docs/c-api.md lists (the
//! shared library under its SONAME with the `libsmoe.so` link, the module map
//! in `include/smoe/`, the pkg-config file, the CMake package), and a library
//! a C program can use through pkg-config: shared (`pkg-config --cflags
//! --libs smoe`, found at run time through LD_LIBRARY_PATH) and static
//! (`pkg-config --static --cflags --libs smoe`, which adds Libs.private: the
//! native libraries of Rust's std), under a prefix with spaces too (smoe.pc
//! escapes them); a prefix smoe.pc cannot name is refused.
//! `tests/library/cmake.rs` builds against its CMake package (under a prefix
//! with a space), `scripts/swift-chroot.sh` a Swift package against its
//! smoe.pc.
//!
//! The script installs the libraries this `cargo test` built
//! (SMOE_SKIP_BUILD=1, SMOE_LIB_DIR = their directory), so it runs no cargo.

use std::fs;
use std::path::Path;
use std::process::Command;

use smoe_test_support::{native, skip_or_fail};

use native::{lib_dir, manifest_dir, run, shared_lib_name};

/// The shared library's file in PREFIX/lib: named after its SONAME (Apple:
/// its install name), `SMOE_ABI_VERSION` in it.
fn shared_file_name() -> String {
    let abi = smoe::ffi::SMOE_ABI_VERSION;
    if cfg!(target_vendor = "apple") {
        format!("libsmoe.{abi}.dylib")
    } else {
        format!("libsmoe.so.{abi}")
    }
}

/// Installs into a fresh prefix; returns the temporary directory holding it.
fn install() -> tempfile::TempDir {
    let prefix = tempfile::tempdir().unwrap();
    run(&mut install_command(prefix.path()));
    prefix
}

/// `scripts/install.sh PREFIX` on the libraries this `cargo test` built.
fn install_command(prefix: &Path) -> Command {
    let mut command = Command::new("bash");
    command
        .arg(manifest_dir().join("scripts/install.sh"))
        .arg(prefix)
        .env("SMOE_SKIP_BUILD", "1")
        .env("SMOE_LIB_DIR", lib_dir());
    command
}

/// Whether pkg-config runs; false (after saying why) when the test must
/// skip.
fn have_pkg_config() -> bool {
    if native::on_path("pkg-config") {
        return true;
    }
    skip_or_fail("pkg-config is not installed (install pkg-config; .ci/run does, APT_PACKAGES)");
    false
}

/// Splits pkg-config's output into arguments as the shell of a make recipe
/// or an `eval` does: at blanks, except a blank after a backslash, which
/// stays in the argument (pkg-config and pkgconf escape the spaces of a path
/// so).
fn shell_words(text: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => word.get_or_insert_with(String::new).extend(chars.next()),
            c if c.is_whitespace() => words.extend(word.take()),
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    words.extend(word);
    words
}

const PROGRAM: &str = r#"
#include <stdio.h>
#include <string.h>
#include "smoe.h"

int main(void) {
    smoe_streamer *s = NULL;
    smoe_status st = smoe_open("/nonexistent/smoe-install-test", NULL, &s);
    if (smoe_abi_version() != SMOE_ABI_VERSION || st != SMOE_ERR_IO || s != NULL ||
        strstr(smoe_last_error(), "/nonexistent/smoe-install-test") == NULL) {
        fprintf(stderr, "unexpected: %s: %s\n", smoe_status_str(st), smoe_last_error());
        return 1;
    }
    puts("ok");
    return 0;
}
"#;

#[test]
fn installs_the_files() {
    let prefix = install();
    let p = prefix.path();
    for file in [
        "lib/libsmoe.a".to_string(),
        format!("lib/{}", shared_file_name()),
        "include/smoe.h".into(),
        "include/smoe.hpp".into(),
        "include/smoe/module.modulemap".into(),
        "lib/pkgconfig/smoe.pc".into(),
        "lib/cmake/smoe/smoeConfig.cmake".into(),
        "lib/cmake/smoe/smoeConfigVersion.cmake".into(),
    ] {
        let metadata = fs::symlink_metadata(p.join(&file));
        assert!(
            metadata.is_ok_and(|m| m.is_file()),
            "{file} is not installed as a file"
        );
    }
    // -lsmoe finds the library through a link to its SONAME's file.
    let link = p.join("lib").join(shared_lib_name());
    assert_eq!(
        fs::read_link(&link).unwrap_or_else(|e| panic!("{}: {e}", link.display())),
        Path::new(&shared_file_name())
    );
    // Nothing loose in include/ but the headers: a module map there would
    // collide with other packages' (and a SwiftPM package's own).
    let mut loose: Vec<String> = fs::read_dir(p.join("include"))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    loose.sort();
    assert_eq!(loose, ["smoe", "smoe.h", "smoe.hpp"]);
    let modulemap = fs::read_to_string(p.join("include/smoe/module.modulemap")).unwrap();
    assert!(modulemap.contains("module CSMoE"), "{modulemap}");
    assert!(modulemap.contains("link \"smoe\""), "{modulemap}");
    let header = modulemap
        .lines()
        .find_map(|line| line.trim().strip_prefix("header \""))
        .and_then(|rest| rest.split('"').next())
        .expect("a header line");
    assert!(
        p.join("include/smoe").join(header).is_file(),
        "the module map's header {header} is not there"
    );
    let config = fs::read_to_string(p.join("lib/cmake/smoe/smoeConfig.cmake")).unwrap();
    assert!(!config.contains('@'), "an unreplaced @VARIABLE@:\n{config}");
    for target in ["smoe::smoe", "smoe::smoe_shared"] {
        assert!(
            config.contains(&format!("add_library({target} ")),
            "{config}"
        );
    }
    let version = fs::read_to_string(p.join("lib/cmake/smoe/smoeConfigVersion.cmake")).unwrap();
    let line = format!("set(PACKAGE_VERSION \"{}\")", env!("CARGO_PKG_VERSION"));
    assert!(
        version.lines().any(|l| l == line),
        "no {line:?}:\n{version}"
    );
    let pc = fs::read_to_string(p.join("lib/pkgconfig/smoe.pc")).unwrap();
    for line in [
        format!("Version: {}", env!("CARGO_PKG_VERSION")),
        "Libs: -L${libdir} -lsmoe".into(),
        "Cflags: -I${includedir}".into(),
    ] {
        assert!(
            pc.lines().any(|l| l == line),
            "smoe.pc has no line {line:?}:\n{pc}"
        );
    }
    assert!(
        pc.lines().any(|l| l.starts_with("Libs.private: -l")),
        "{pc}"
    );
}

/// The installed shared library names itself `libsmoe.so.<ABI>` (what
/// programs linked against it record as NEEDED).
#[test]
#[cfg(target_os = "linux")]
fn shared_library_has_its_soname() {
    if !native::on_path("readelf") {
        skip_or_fail("readelf is not installed (install binutils, which gcc brings)");
        return;
    }
    let prefix = install();
    let library = prefix.path().join("lib").join(shared_file_name());
    let dynamic = run(Command::new("readelf").arg("-d").arg(&library));
    let soname = dynamic
        .lines()
        .find(|line| line.contains("(SONAME)"))
        .unwrap_or_else(|| panic!("{} has no SONAME:\n{dynamic}", library.display()));
    assert!(
        soname.ends_with(&format!("[{}]", shared_file_name())),
        "{soname}"
    );
}

#[test]
fn pkg_config_links_shared_and_static() {
    if !have_pkg_config() {
        return;
    }
    let prefix = install();
    pkg_config_links(prefix.path());
}

/// A prefix with spaces: smoe.pc escapes them (`prefix=/a\ b`), pkg-config
/// prints `-I/a\ b/include`, and a build that reads that as a shell does
/// compiles, links and runs. (smoe.pc named the prefix as it was, and
/// pkg-config printed `-I/a b/include`: two arguments.)
#[test]
fn pkg_config_links_under_a_prefix_with_spaces() {
    if !have_pkg_config() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("PREFIX WITH SPACE");
    run(&mut install_command(&prefix));
    pkg_config_links(&prefix);
    let pc = fs::read_to_string(prefix.join("lib/pkgconfig/smoe.pc")).unwrap();
    let line = format!(
        "prefix={}",
        prefix.display().to_string().replace(' ', "\\ ")
    );
    assert!(pc.lines().any(|l| l == line), "no {line:?} in:\n{pc}");
}

/// A prefix smoe.pc cannot name (pkg-config expands `$`, splits at quotes)
/// is refused, naming the prefix and the character, before anything is
/// written.
#[test]
fn install_refuses_a_prefix_pkg_config_cannot_name() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["price$5", "it's", "a\"b", "tab\there"] {
        let prefix = dir.path().join(name);
        let out = install_command(&prefix).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name:?}: {stderr}");
        assert!(
            stderr.contains("smoe.pc cannot name such a path"),
            "{name:?}: {stderr}"
        );
        let bad = name.chars().find(|c| !c.is_alphanumeric()).unwrap();
        let named = if bad == '\t' {
            "holds $'\\t'".to_owned()
        } else {
            format!("holds {bad}:")
        };
        assert!(
            stderr.contains(&named),
            "{name:?}: no {named:?} in {stderr}"
        );
        assert!(!prefix.exists(), "{name:?}: the prefix was made");
    }
    // pkg-config drops a trailing blank, escaped or not (pkgconf printed
    // -I.../end/include for "end "): refused too, whatever follows it.
    for name in ["end ", "end /", "end /./", "end /sub/.."] {
        let prefix = format!("{}/{name}", dir.path().display());
        let out = install_command(Path::new(&prefix)).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name:?}: {stderr}");
        assert!(stderr.contains("ends with a space"), "{name:?}: {stderr}");
        assert!(
            !dir.path().join("end ").exists(),
            "{name:?}: the prefix was made"
        );
    }
}

/// An exported CDPATH does not move the install elsewhere: `cd pp` once
/// printed the directory CDPATH found, and the prefix became
/// "CDPATH/pp\nCDPATH/pp".
#[test]
fn install_ignores_cdpath() {
    let dir = tempfile::tempdir().unwrap();
    let elsewhere = dir.path().join("cdpath");
    fs::create_dir_all(elsewhere.join("pp")).unwrap();
    let work = dir.path().join("work");
    fs::create_dir(&work).unwrap();
    let out = install_command(Path::new("pp"))
        .current_dir(&work)
        .env("CDPATH", &elsewhere)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let pc = fs::read_to_string(work.join("pp/lib/pkgconfig/smoe.pc")).unwrap();
    let prefix_line = pc.lines().find(|l| l.starts_with("prefix=")).unwrap();
    assert_eq!(prefix_line, format!("prefix={}", work.join("pp").display()));
    assert!(
        fs::read_dir(elsewhere.join("pp")).unwrap().next().is_none(),
        "installed under CDPATH"
    );
}

/// `pkg-config --cflags --libs smoe` (shared) and `--static` under the
/// installed `prefix` build a C program that runs.
fn pkg_config_links(prefix: &Path) {
    let pkgconfig_dir = prefix.join("lib/pkgconfig");
    let pkg_config = |args: &[&str]| -> Vec<String> {
        shell_words(&run(Command::new("pkg-config")
            .args(args)
            .arg("smoe")
            .env("PKG_CONFIG_PATH", &pkgconfig_dir)))
    };
    let compiler = native::default_c_compiler();
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("app.c");
    fs::write(&source, PROGRAM).unwrap();
    let compile = |output: &Path, flags: &[String]| {
        run(Command::new(&compiler)
            .arg("-std=c11")
            .args(native::WARNINGS)
            .arg(&source)
            .arg("-o")
            .arg(output)
            .args(flags));
    };

    // Shared: the loader finds libsmoe through LD_LIBRARY_PATH.
    let shared = dir.path().join("app-shared");
    compile(&shared, &pkg_config(&["--cflags", "--libs"]));
    let lib_path = prefix.join("lib");
    let output = run(Command::new(&shared)
        .env("LD_LIBRARY_PATH", &lib_path)
        .env("DYLD_LIBRARY_PATH", &lib_path));
    assert_eq!(output.trim(), "ok");
    if cfg!(target_os = "linux") && !native::on_path("readelf") {
        skip_or_fail(
            "the check of the program's NEEDED entry: readelf is not installed (install binutils)",
        );
    } else if cfg!(target_os = "linux") {
        let dynamic = run(Command::new("readelf").arg("-d").arg(&shared));
        let needed = format!("Shared library: [{}]", shared_file_name());
        assert!(dynamic.contains(&needed), "no {needed:?} in:\n{dynamic}");
    }

    // Static: --static adds Libs.private. With both libsmoe.a and the shared
    // library in libdir a linker prefers the shared one for -lsmoe, so name
    // the archive (what the README tells users to do).
    let archive = prefix.join("lib/libsmoe.a").display().to_string();
    let static_flags: Vec<String> = pkg_config(&["--static", "--cflags", "--libs"])
        .into_iter()
        .map(|flag| {
            if flag == "-lsmoe" {
                archive.clone()
            } else {
                flag
            }
        })
        .collect();
    assert!(
        static_flags.contains(&"-lpthread".to_string()) || cfg!(not(target_os = "linux")),
        "pkg-config --static gave no native libs: {static_flags:?}"
    );
    let fully_static = dir.path().join("app-static");
    compile(&fully_static, &static_flags);
    // No LD_LIBRARY_PATH and no rpath: it runs only if libsmoe is inside.
    let output = run(Command::new(&fully_static)
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("DYLD_LIBRARY_PATH"));
    assert_eq!(output.trim(), "ok");
}
