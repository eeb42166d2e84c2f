//! The committed `include/smoe.h` is exactly what the source generates.
//!
//! `build.rs` generates the header with the pinned cbindgen and
//! `cbindgen.toml` into `OUT_DIR/smoe.h` on every build whose `src/` or config
//! changed; cargo sets `OUT_DIR` for this test too. Outside CI the build also
//! copies it to `include/smoe.h`, so a developer only has to commit it; in CI
//! (`CI` set) nothing is copied, so a header that was not regenerated and
//! committed fails here.

use std::ffi::c_int;
use std::fs;
use std::path::Path;

use smoe::ffi::smoe_status;

fn generated() -> String {
    let path = concat!(env!("OUT_DIR"), "/smoe.h");
    fs::read_to_string(path).unwrap_or_else(|e| panic!("read {path}: {e}"))
}

fn committed() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("include/smoe.h");
    fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

#[test]
fn committed_header_matches_generated() {
    let (generated, committed) = (generated(), committed());
    if generated == committed {
        return;
    }
    let first_difference = generated
        .lines()
        .zip(committed.lines())
        .position(|(g, c)| g != c)
        .unwrap_or_else(|| generated.lines().count().min(committed.lines().count()));
    let line = |text: &str| {
        text.lines()
            .nth(first_difference)
            .unwrap_or("<end of file>")
            .to_owned()
    };
    panic!(
        "include/smoe.h differs from the header src/ffi generates, first at line {}:\n\
         committed: {}\n\
         generated: {}\n\
         Run `cargo build` without CI set to regenerate it, then commit include/smoe.h.",
        first_difference + 1,
        line(&committed),
        line(&generated),
    );
}

/// The declarations docs/c-api.md fixes, as they must read in the header
/// (nullability macros aside). The statuses come from the library's own list
/// (`smoe_status::ALL`), so a new status needs no edit here; their numbers
/// are pinned once, in `src/ffi`'s unit tests.
#[test]
fn header_declares_the_spec() {
    let header = committed()
        .replace("SMOE_NONNULL ", "")
        .replace("SMOE_NULLABLE ", "");
    let mut expected: Vec<String> = [
        "#define SMOE_ABI_VERSION 1\n",
        "typedef enum smoe_status {\n",
        "} smoe_status;\n",
        "\nuint32_t smoe_abi_version(void);\n",
        "\nconst char *smoe_status_str(smoe_status st);\n",
        "\nconst char *smoe_last_error(void);\n",
        "#include <stdbool.h>\n",
        "#include <stdint.h>\n",
        "#include <stddef.h>\n",
        "#ifndef SMOE_H\n",
        "extern \"C\" {\n",
    ]
    .map(str::to_owned)
    .into();
    expected.extend(
        smoe_status::ALL
            .iter()
            .map(|&st| format!("  {st:?} = {},\n", st as c_int)),
    );
    for line in &expected {
        assert!(header.contains(line), "include/smoe.h lacks {line:?}");
    }
    // The enumerators in the header's order are exactly the library's list.
    let enum_body = header
        .split_once("typedef enum smoe_status {\n")
        .and_then(|(_, rest)| rest.split_once("} smoe_status;"))
        .expect("smoe_status in the header")
        .0;
    let declared: Vec<&str> = enum_body
        .lines()
        .filter_map(|line| line.trim().strip_suffix(',')?.split(" = ").next())
        .collect();
    let listed: Vec<String> = smoe_status::ALL
        .iter()
        .map(|st| format!("{st:?}"))
        .collect();
    assert_eq!(declared, listed);
    // Returned strings are never NULL: Swift must see non-optional results.
    let header = committed();
    assert!(header.contains("const char *SMOE_NONNULL smoe_status_str(smoe_status st);"));
    assert!(header.contains("const char *SMOE_NONNULL smoe_last_error(void);"));
}

/// The version in Cargo.toml's `[package]`, read from the file itself.
fn cargo_toml_version() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
    let manifest = fs::read_to_string(&path).unwrap();
    let package = manifest
        .split("\n[package]\n")
        .nth(1)
        .unwrap_or_else(|| panic!("{}: no [package]", path.display()));
    package
        .lines()
        .take_while(|line| !line.starts_with('['))
        .find_map(|line| line.strip_prefix("version = \""))
        .and_then(|rest| rest.strip_suffix('"'))
        .unwrap_or_else(|| panic!("{}: no version in [package]", path.display()))
        .to_owned()
}

/// `SMOE_VERSION_MAJOR`, `_MINOR`, `_PATCH` and `_STRING` in the header and
/// `smoe_version()` all say Cargo.toml's version.
#[test]
fn versions_are_cargo_tomls() {
    let version = cargo_toml_version();
    let numbers: Vec<&str> = version
        .split(['-', '+'])
        .next()
        .unwrap()
        .split('.')
        .collect();
    assert_eq!(numbers.len(), 3, "{version}");
    let header = committed();
    for (name, value) in [
        ("SMOE_VERSION_MAJOR", numbers[0].to_owned()),
        ("SMOE_VERSION_MINOR", numbers[1].to_owned()),
        ("SMOE_VERSION_PATCH", numbers[2].to_owned()),
        ("SMOE_VERSION_STRING", format!("\"{version}\"")),
    ] {
        let line = format!("#define {name} {value}\n");
        assert!(header.contains(&line), "include/smoe.h lacks {line:?}");
    }
    assert!(header.contains("const char *SMOE_NONNULL smoe_version(void);"));
    // SAFETY: smoe_version returns a static NUL-terminated string.
    let loaded = unsafe { std::ffi::CStr::from_ptr(smoe::ffi::smoe_version()) };
    assert_eq!(loaded.to_str().unwrap(), version);
}
