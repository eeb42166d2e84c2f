//! `include/smoe.h` compiles cleanly as C11 and C++17, twice in one
//! translation unit and from two units linked together, and a C program
//! linked against the staticlib this `cargo test` built runs correctly.
//!
//! The compiler is `$CC` / `$CXX`, else `cc` / `c++`; then `clang` /
//! `clang++`, because only clang sees the nullability macros (without it
//! that pass is skipped, saying so; under CI, which installs it, that is a
//! failure).

use std::env;
use std::fs;
use std::process::Command;

use smoe_test_support::native;

use native::{
    c_compilers, cxx_compilers, include_dir, native_static_libs, run, staticlib, WARNINGS,
};

/// One source file per translation unit; each includes the header twice and
/// uses every declaration, so an unguarded or conflicting header fails.
const UNIT_A: &str = r#"
#include "smoe.h"
#include "smoe.h"

const char *unit_a(smoe_status st) {
    return smoe_status_str(st);
}
"#;

const UNIT_B: &str = r#"
#include "smoe.h"
#include "smoe.h"

const char *unit_a(smoe_status st);

int main(void) {
    smoe_status st = SMOE_ERR_INTERNAL;
    const char *error = smoe_last_error();
    (void)error;
    return (unit_a(st) != NULL && smoe_abi_version() == SMOE_ABI_VERSION) ? 0 : 1;
}
"#;

/// Compiles the two units with `compiler` as `-std={std}`, then links them
/// into one program with the staticlib and runs it.
fn compile_units(compiler: &str, std: &str, extension: &str) {
    let dir = tempfile::tempdir().unwrap();
    let mut objects = Vec::new();
    for (name, source) in [("unit_a", UNIT_A), ("unit_b", UNIT_B)] {
        let source_path = dir.path().join(format!("{name}.{extension}"));
        fs::write(&source_path, source).unwrap();
        let object = dir.path().join(format!("{name}.o"));
        run(Command::new(compiler)
            .arg(format!("-std={std}"))
            .args(WARNINGS)
            .arg("-I")
            .arg(include_dir())
            .arg("-c")
            .arg(&source_path)
            .arg("-o")
            .arg(&object));
        objects.push(object);
    }
    // The header defines no symbol, so both units link into one program.
    let program = dir.path().join("units");
    run(Command::new(compiler)
        .args(&objects)
        .arg(library())
        .args(native_static_libs())
        .arg("-o")
        .arg(&program));
    run(&mut Command::new(&program));
}

/// The staticlib this `cargo test` built (it always builds one).
fn library() -> std::path::PathBuf {
    staticlib().unwrap_or_else(|| {
        panic!(
            "libsmoe.a not found next to {:?}; cargo builds it with the library \
             because Cargo.toml lists crate-type \"staticlib\"",
            env::current_exe().ok()
        )
    })
}

#[test]
fn header_compiles_as_c11() {
    for compiler in c_compilers() {
        compile_units(&compiler, "c11", "c");
    }
}

#[test]
fn header_compiles_as_cxx17() {
    for compiler in cxx_compilers() {
        compile_units(&compiler, "c++17", "cpp");
    }
}

/// A C program that checks `smoe_status_str` for every status the library
/// lists (`smoe_status::ALL`, so a new status needs no edit here) and for
/// values that are none.
fn program() -> String {
    let checks: String = smoe::ffi::smoe_status::ALL
        .iter()
        .map(|st| format!("    expect(\"{st:?}\", smoe_status_str({st:?}), \"{st:?}\");\n"))
        .collect();
    format!(
        r#"
#include <stdio.h>
#include <string.h>
#include "smoe.h"

static int failures = 0;

static void expect(const char *what, const char *got, const char *want) {{
    if (got == NULL || strcmp(got, want) != 0) {{
        fprintf(stderr, "%s: got \"%s\", want \"%s\"\n", what, got ? got : "(null)", want);
        failures++;
    }}
}}

int main(void) {{
    if (smoe_abi_version() != SMOE_ABI_VERSION) {{
        fprintf(stderr, "smoe_abi_version() = %u\n", (unsigned)smoe_abi_version());
        failures++;
    }}
{checks}    /* Any int may arrive where the header says smoe_status. */
    expect("42", smoe_status_str((smoe_status)42), "SMOE_UNKNOWN_STATUS");
    expect("-100", smoe_status_str((smoe_status)-100), "SMOE_UNKNOWN_STATUS");
    expect("smoe_last_error", smoe_last_error(), "");
    if (failures == 0) {{
        puts("ok");
    }}
    return failures == 0 ? 0 : 1;
}}
"#
    )
}

#[test]
fn c_program_links_and_runs() {
    let library = library();
    for compiler in c_compilers() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("status.c");
        fs::write(&source, program()).unwrap();
        let program = dir.path().join("status");
        run(Command::new(&compiler)
            .arg("-std=c11")
            .args(WARNINGS)
            .arg("-I")
            .arg(include_dir())
            .arg(&source)
            .arg(&library)
            .args(native_static_libs())
            .arg("-o")
            .arg(&program));
        let output = run(&mut Command::new(&program));
        assert_eq!(output.trim(), "ok", "{compiler}");
    }
}
