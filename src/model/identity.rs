//! A model's identity and its cache directory (SPEC §6, issue 34 point 4).
//!
//! A model opened in place has no vault id, and nothing may be written
//! beside it: its histogram lives in a cache directory named by an
//! identity derived from the model's headers and file sizes, never from
//! paths or times, so a copy of the same files has the same identity and
//! finds the same histogram, and a model whose tensor table or sizes
//! changed gets another.
//!
//! This module computes; it creates no directory.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use xxhash_rust::xxh3::Xxh3;

use super::Model;
use crate::error::{Error, Result};

/// The identity's recipe, hashed first: a new recipe gives every model a
/// new identity (its histogram starts over) instead of colliding with an
/// old one.
const RECIPE: &[u8] = b"smoe model identity 1\0";

/// The environment variable that overrides where models' own files go.
pub const CACHE_DIR_VAR: &str = "SMOE_CACHE_DIR";

/// The identity of `model`: xxh3-128 over its kind, each file's size, and
/// its tensor table (each tensor's name, file, offset, length, type and
/// shape), in order. 16 bytes, shown as 32 hex digits ([`crate::printable::hex`]).
///
/// # Errors
///
/// [`crate::ErrorKind::Io`] naming the file whose size cannot be read.
pub fn identity(model: &Model) -> Result<[u8; 16]> {
    let mut h = Xxh3::new();
    let mut field = |bytes: &[u8]| {
        h.update(&(bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    };
    field(RECIPE);
    field(model.kind.name().as_bytes());
    field(&(model.handles.len() as u64).to_le_bytes());
    for (file, path) in model.handles.iter().zip(&model.files) {
        let size = file
            .metadata()
            .map_err(|e| Error::io("cannot read the size of", path, &e))?
            .len();
        field(&size.to_le_bytes());
    }
    field(&(model.tensors.len() as u64).to_le_bytes());
    for t in &model.tensors {
        field(t.name.as_bytes());
        field(&(t.file as u64).to_le_bytes());
        field(&t.offset.to_le_bytes());
        field(&t.bytes.to_le_bytes());
        field(t.dtype.as_bytes());
        field(&(t.shape.len() as u64).to_le_bytes());
        for d in &t.shape {
            field(&d.to_le_bytes());
        }
    }
    Ok(h.digest128().to_le_bytes())
}

/// Where a model's own files go ([`cache_dir`]): the directory and, when
/// the environment held something that was passed over on the way (a
/// relative `SMOE_CACHE_DIR`), a sentence saying so; or why there is no
/// such directory.
pub type CacheDir = std::result::Result<(PathBuf, Option<String>), String>;

/// The directory of a model's own files (its histogram):
/// `<base>/smoe/<identity in hex>`, where `<base>` is `$SMOE_CACHE_DIR`
/// if set to an absolute path, else the platform's user cache directory
/// ([`crate::sys::user_cache_home`]). A relative `SMOE_CACHE_DIR` would
/// put the histogram wherever the process happens to run, perhaps beside
/// the model: it is passed over, as a relative `XDG_CACHE_HOME` is, and
/// the result says so (a note, or part of the reason). `env` reads a
/// variable (the process's environment, or a test's). An error, saying
/// which variable is missing or relative, when there is no such directory
/// (no absolute `HOME`): the caller then keeps no histogram, and says
/// why.
pub fn cache_dir(identity: &[u8; 16], env: impl Fn(&str) -> Option<OsString>) -> CacheDir {
    let leaf = |base: PathBuf| base.join("smoe").join(crate::printable::hex(identity));
    let set = |name: &str| env(name).filter(|v| !v.is_empty());
    let ignored = match set(CACHE_DIR_VAR) {
        Some(v) if Path::new(&v).is_absolute() => return Ok((leaf(PathBuf::from(v)), None)),
        Some(v) => Some(format!("{CACHE_DIR_VAR} ({v:?}) is relative; ignored")),
        None => None,
    };
    if let Some(base) = crate::sys::user_cache_home(&env) {
        return Ok((leaf(base), ignored));
    }
    let home = match set("HOME") {
        Some(h) => format!("HOME ({h:?}) is relative"),
        None => "HOME is not set".to_owned(),
    };
    Err(match ignored {
        Some(why) => format!("there is no user cache directory: {why}, and {home}"),
        None if set("HOME").is_none() => {
            "there is no user cache directory (neither SMOE_CACHE_DIR nor HOME is set)".to_owned()
        }
        None => format!("there is no user cache directory: {CACHE_DIR_VAR} is not set and {home}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::path::Path;

    fn fixture(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/models")
            .join(name)
    }

    fn id_of(path: &Path) -> [u8; 16] {
        identity(&super::super::open_model(path, &|| false).unwrap()).unwrap()
    }

    /// A copy elsewhere is the same model; another model, or the same file
    /// one byte longer, is not.
    #[test]
    fn the_identity_follows_the_headers_and_sizes_not_the_path() {
        let original = fixture("qwen3moe-q8_0.gguf");
        let dir = tempfile::tempdir().unwrap();
        let copy = dir.path().join("renamed.gguf");
        std::fs::copy(&original, &copy).unwrap();
        let id = id_of(&original);
        assert_eq!(id_of(&copy), id, "a copy");
        assert_ne!(id_of(&fixture("mixtral-q8_0.gguf")), id, "another model");
        let longer = dir.path().join("longer.gguf");
        std::fs::copy(&original, &longer).unwrap();
        let file = std::fs::OpenOptions::new()
            .append(true)
            .open(&longer)
            .unwrap();
        file.set_len(file.metadata().unwrap().len() + 1).unwrap();
        assert_ne!(id_of(&longer), id, "one byte longer");
    }

    #[test]
    fn the_cache_directory_follows_the_environment() {
        let id = [0xab; 16];
        let hex = "ab".repeat(16);
        let env = |vars: &[(&str, &str)]| {
            let vars: HashMap<String, OsString> = vars
                .iter()
                .map(|(k, v)| (k.to_string(), OsString::from(v)))
                .collect();
            move |k: &str| vars.get(k).cloned()
        };
        let dir = |vars: &[(&str, &str)]| cache_dir(&id, env(vars)).map(|(d, _)| d).ok();
        assert_eq!(
            cache_dir(&id, env(&[("SMOE_CACHE_DIR", "/c"), ("HOME", "/h")])),
            Ok((PathBuf::from(format!("/c/smoe/{hex}")), None))
        );
        // Empty is unset, and a relative path is passed over, saying so.
        let (home, note) = cache_dir(&id, env(&[("SMOE_CACHE_DIR", ""), ("HOME", "/h")])).unwrap();
        assert_eq!(note, None);
        assert_eq!(
            cache_dir(&id, env(&[("SMOE_CACHE_DIR", "rel"), ("HOME", "/h")])),
            Ok((
                home.clone(),
                Some("SMOE_CACHE_DIR (\"rel\") is relative; ignored".to_owned())
            ))
        );
        #[cfg(target_os = "linux")]
        {
            assert_eq!(home, PathBuf::from(format!("/h/.cache/smoe/{hex}")));
            assert_eq!(
                dir(&[("XDG_CACHE_HOME", "/x"), ("HOME", "/h")]),
                Some(PathBuf::from(format!("/x/smoe/{hex}")))
            );
            // A relative XDG_CACHE_HOME is ignored (the XDG base directory
            // specification), as is a relative HOME.
            assert_eq!(
                dir(&[("XDG_CACHE_HOME", "x"), ("HOME", "/h")]),
                Some(PathBuf::from(format!("/h/.cache/smoe/{hex}")))
            );
        }
        #[cfg(target_vendor = "apple")]
        assert_eq!(home, PathBuf::from(format!("/h/Library/Caches/smoe/{hex}")));
        // Without a directory, the reason names what the environment held.
        for (vars, reason) in [
            (
                &[("HOME", "h")][..],
                "there is no user cache directory: SMOE_CACHE_DIR is not set and HOME (\"h\") is relative",
            ),
            (
                &[][..],
                "there is no user cache directory (neither SMOE_CACHE_DIR nor HOME is set)",
            ),
            (
                &[("SMOE_CACHE_DIR", "rel")][..],
                "there is no user cache directory: SMOE_CACHE_DIR (\"rel\") is relative; ignored, and HOME is not set",
            ),
        ] {
            assert_eq!(cache_dir(&id, env(vars)), Err(reason.to_owned()), "{vars:?}");
        }
    }
}
