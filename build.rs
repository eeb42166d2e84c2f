//! Generates `include/smoe.h` from `src/ffi/` with the pinned cbindgen, and
//! names the shared library after the C ABI's version.
//!
//! The header is written to `OUT_DIR/smoe.h` (a build script must not write
//! elsewhere, e.g. under `cargo publish`), then copied to `include/smoe.h`
//! when it differs, so a developer's build keeps the committed header
//! current. With `CI` set the copy is skipped: CI must catch a stale header
//! (`tests/library/header.rs`, `git diff --exit-code include/smoe.h`), not
//! repair it.
//!
//! The header's `SMOE_VERSION_*` macros come from the crate's version (cargo
//! hands it to this script), so Cargo.toml is their only home; cbindgen sees
//! no constant it could compute them from.
//!
//! The shared library's SONAME (Linux) is `libsmoe.so.<ABI>` and its install
//! name (Apple) `@rpath/libsmoe.<ABI>.dylib`, with `<ABI>` the
//! `SMOE_ABI_VERSION` that `src/ffi/mod.rs` declares: a program linked today
//! asks the loader for that name, which only an ABI break changes.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

fn main() -> ExitCode {
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=cbindgen.toml");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=Cargo.toml");
    println!("cargo:rerun-if-env-changed=CI");

    let result = env::var("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .map_err(|e| format!("CARGO_MANIFEST_DIR: {e}"))
        .and_then(|crate_dir| {
            name_shared_library(&crate_dir)?;
            generate(&crate_dir).map_err(|e| format!("generating include/smoe.h failed: {e}"))
        });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

/// `SMOE_ABI_VERSION` as `src/ffi/mod.rs` declares it
/// (`pub const SMOE_ABI_VERSION: u32 = N;`).
fn abi_version(crate_dir: &Path) -> Result<u32, String> {
    let path = crate_dir.join("src/ffi/mod.rs");
    let source = fs::read_to_string(&path).map_err(|e| format!("read {}: {e}", path.display()))?;
    source
        .lines()
        .find_map(|line| line.strip_prefix("pub const SMOE_ABI_VERSION: u32 = "))
        .and_then(|rest| rest.strip_suffix(';'))
        .and_then(|number| number.parse().ok())
        .ok_or_else(|| {
            format!(
                "{}: no line `pub const SMOE_ABI_VERSION: u32 = <number>;`",
                path.display()
            )
        })
}

/// The SONAME or install name of the cdylib (the staticlib and rlib have
/// none), passed to the linker.
fn name_shared_library(crate_dir: &Path) -> Result<(), String> {
    let abi = abi_version(crate_dir)?;
    let os = env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let vendor = env::var("CARGO_CFG_TARGET_VENDOR").unwrap_or_default();
    if vendor == "apple" {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-install_name,@rpath/libsmoe.{abi}.dylib");
    } else if os != "windows" {
        // ELF platforms (Linux, the BSDs): GNU ld, gold, lld and mold all
        // take -soname.
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libsmoe.so.{abi}");
    }
    Ok(())
}

/// The `#define`s of the crate's version, for the header.
fn version_macros() -> Result<String, String> {
    let var = |name: &str| env::var(name).map_err(|e| format!("{name}: {e}"));
    let (major, minor, patch) = (
        var("CARGO_PKG_VERSION_MAJOR")?,
        var("CARGO_PKG_VERSION_MINOR")?,
        var("CARGO_PKG_VERSION_PATCH")?,
    );
    let version = var("CARGO_PKG_VERSION")?;
    // After a blank line, below what cbindgen.toml puts there.
    Ok(format!(
        "\n\n\
         /*\n \
         * The version of the smoe library this header belongs to (the crate's\n \
         * version, from its Cargo.toml); smoe_version() returns the loaded library's.\n \
         */\n\
         #define SMOE_VERSION_MAJOR {major}\n\
         #define SMOE_VERSION_MINOR {minor}\n\
         #define SMOE_VERSION_PATCH {patch}\n\
         #define SMOE_VERSION_STRING \"{version}\""
    ))
}

fn generate(crate_dir: &Path) -> Result<(), String> {
    let out_dir = PathBuf::from(env::var("OUT_DIR").map_err(|e| e.to_string())?);

    let config_path = crate_dir.join("cbindgen.toml");
    let mut config = cbindgen::Config::from_file(&config_path)
        .map_err(|e| format!("{}: {e}", config_path.display()))?;
    let mut after_includes = config.after_includes.take().unwrap_or_default();
    after_includes.push_str(&version_macros()?);
    config.after_includes = Some(after_includes);
    // Only the ffi module (and its submodules) is the C API; parsing it
    // alone keeps other modules' `pub const`s out of the header and needs no
    // `cargo metadata`.
    let bindings = cbindgen::Builder::new()
        .with_config(config)
        .with_src(crate_dir.join("src/ffi/mod.rs"))
        .generate()
        .map_err(|e| format!("cbindgen: {e}"))?;
    let mut header = Vec::new();
    bindings.write(&mut header);

    let generated = out_dir.join("smoe.h");
    fs::write(&generated, &header).map_err(|e| format!("write {}: {e}", generated.display()))?;

    if env::var_os("CI").is_some() {
        return Ok(());
    }
    let committed = crate_dir.join("include/smoe.h");
    if fs::read(&committed).ok().as_deref() != Some(header.as_slice()) {
        write_atomically(&committed, &header)?;
        println!("cargo:warning=include/smoe.h regenerated from src/ffi; commit it");
    }
    Ok(())
}

/// Writes `bytes` to `path` through a temporary file and a rename, so a
/// concurrent reader never sees half a header.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), String> {
    let dir = path.parent().ok_or("include/smoe.h has no parent")?;
    fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    let temporary = dir.join(format!(".smoe.h.{}.tmp", std::process::id()));
    fs::write(&temporary, bytes).map_err(|e| format!("write {}: {e}", temporary.display()))?;
    fs::rename(&temporary, path).map_err(|e| {
        let _ = fs::remove_file(&temporary);
        format!("rename {} to {}: {e}", temporary.display(), path.display())
    })
}
