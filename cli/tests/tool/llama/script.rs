//! scripts/llama.sh's cache directory.

use super::*;

/// scripts/llama.sh replaces parts of its cache: pointed (SMOE_LLAMA_DIR)
/// at a directory it did not make, a llama.cpp checkout say (named as its
/// cache's own tree is), it stops before touching it, naming what is there.
#[test]
fn the_build_script_refuses_a_directory_it_did_not_make() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/llama.sh");
    for (what, made) in [("notes.txt", true), (".git", false), ("llama.cpp", false)] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(what);
        if made {
            std::fs::write(&path, "mine").unwrap();
        } else {
            std::fs::create_dir(&path).unwrap();
            std::fs::write(path.join("mine"), "mine").unwrap();
        }
        let before = listing(dir.path());
        let out = Command::new("bash")
            .arg(&script)
            .arg("build")
            .env("SMOE_LLAMA_DIR", dir.path())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success()
                && stderr.contains(&format!(
                    "holds {what}, and this script did not make the directory"
                )),
            "{what}: {}\n{stderr}",
            out.status
        );
        assert_eq!(listing(dir.path()), before, "{what}: the directory changed");
    }
}

/// Every path under `dir` with its bytes (a directory's are empty).
fn listing(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                todo.push(path.clone());
                out.push((path, Vec::new()));
            } else {
                let bytes = std::fs::read(&path).unwrap();
                out.push((path, bytes));
            }
        }
    }
    out.sort();
    out
}
