//! Generates `include/smoe.h` from `src/ffi/` with the pinned cbindgen.
//!
//! The header is written to `OUT_DIR/smoe.h` (a build script must not write
//! elsewhere, e.g. under `cargo publish`), then copied to `include/smoe.h`
//! when it differs, so a developer's build keeps the committed header
//! current. With `CI` set the copy is skipped: CI must catch a stale header
//! (`tests/header.rs`, `git diff --exit-code include/smoe.h`), not repair it.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

fn main() -> ExitCode {
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=cbindgen.toml");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=CI");

    match generate() {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: generating include/smoe.h failed: {message}");
            ExitCode::FAILURE
        }
    }
}

fn generate() -> Result<(), String> {
    let crate_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").map_err(|e| e.to_string())?);
    let out_dir = PathBuf::from(env::var("OUT_DIR").map_err(|e| e.to_string())?);

    let config_path = crate_dir.join("cbindgen.toml");
    let config = cbindgen::Config::from_file(&config_path)
        .map_err(|e| format!("{}: {e}", config_path.display()))?;
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
