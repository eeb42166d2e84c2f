//! `smoe pack` as a process: bad input is one line and exit 1 with nothing
//! left behind (no OUT_DIR, no temporary directory); Ctrl-C mid-pack leaves
//! no OUT_DIR; a SIGKILLed run's temporary directory is removed by the next
//! run; the summary and `smoe inspect`'s layout on a real fixture.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use smoe_test_support::models::write_many_tensor_safetensors;

fn smoe() -> Command {
    Command::new(env!("CARGO_BIN_EXE_smoe"))
}

/// Runs `smoe pack SRC OUT` to completion.
fn pack(src: &Path, out_dir: &Path) -> Output {
    smoe().arg("pack").arg(src).arg(out_dir).output().unwrap()
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/models")
}

/// Entries of `dir` whose names start with `prefix`.
fn entries_with_prefix(dir: &Path, prefix: &str) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(prefix))
        .collect()
}

/// A GGUF v3 file: `kvs` as (key, u32 value), tensors as (name, ne, type),
/// laid out back to back at 32-byte alignment; the data is a hole (zeros),
/// so large tensors cost no disk.
fn write_gguf(path: &Path, kvs: &[(&str, u32)], tensors: &[(&str, Vec<u64>, u32, u64)]) {
    let mut b = Vec::new();
    b.extend_from_slice(b"GGUF");
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    b.extend_from_slice(&(kvs.len() as u64 + 1).to_le_bytes());
    let s = |b: &mut Vec<u8>, t: &str| {
        b.extend_from_slice(&(t.len() as u64).to_le_bytes());
        b.extend_from_slice(t.as_bytes());
    };
    s(&mut b, "general.architecture");
    b.extend_from_slice(&8u32.to_le_bytes());
    s(&mut b, "qwen3moe");
    for (k, v) in kvs {
        s(&mut b, k);
        b.extend_from_slice(&4u32.to_le_bytes());
        b.extend_from_slice(&v.to_le_bytes());
    }
    let mut offset = 0u64;
    for (name, ne, ty, bytes) in tensors {
        s(&mut b, name);
        b.extend_from_slice(&(ne.len() as u32).to_le_bytes());
        for n in ne {
            b.extend_from_slice(&n.to_le_bytes());
        }
        b.extend_from_slice(&ty.to_le_bytes());
        b.extend_from_slice(&offset.to_le_bytes());
        offset = (offset + bytes).next_multiple_of(32);
    }
    let data = (b.len() as u64).next_multiple_of(32);
    std::fs::write(path, &b).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.set_len(data + offset).unwrap();
}

/// Runs `smoe pack SRC OUT` and checks the failure contract: exit 1, one
/// stderr line containing `needle`, no OUT_DIR, no temporary directory.
#[track_caller]
fn refuses(src: &Path, needle: &str) {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("vault");
    let out = pack(src, &out_dir);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{}: {stderr}", src.display());
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(stderr.starts_with("smoe: "), "{stderr}");
    assert!(stderr.contains(needle), "{needle:?} not in {stderr}");
    assert!(!out_dir.exists(), "OUT_DIR was created");
    assert!(
        entries_with_prefix(dir.path(), ".vault").is_empty(),
        "a temporary directory was left"
    );
}

#[test]
fn bad_input_is_one_line_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n);

    // A truncated file: the converter's output cut in half.
    let whole = std::fs::read(fixtures().join("mixtral-q8_0.gguf")).unwrap();
    std::fs::write(p("truncated.gguf"), &whole[..whole.len() / 2]).unwrap();
    refuses(&p("truncated.gguf"), "outside the file (truncated?)");
    std::fs::write(p("header-cut.gguf"), &whole[..100]).unwrap();
    refuses(&p("header-cut.gguf"), "truncated");

    // Random bytes named .gguf.
    let noise: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(p("noise.gguf"), &noise).unwrap();
    refuses(&p("noise.gguf"), "not a GGUF file");

    // A sharded checkpoint missing a shard.
    let sharded = fixtures().join("qwen2moe-f32-sharded");
    let copy = p("sharded");
    std::fs::create_dir(&copy).unwrap();
    for e in std::fs::read_dir(&sharded).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), copy.join(e.file_name())).unwrap();
    }
    std::fs::remove_file(copy.join("model-00003-of-00011.safetensors")).unwrap();
    refuses(&copy, "shard model-00003-of-00011.safetensors is missing");

    // No expert tensors.
    write_gguf(
        &p("dense.gguf"),
        &[],
        &[("token_embd.weight", vec![64, 256], 0, 64 * 256 * 4)],
    );
    refuses(&p("dense.gguf"), "no expert tensors found");

    // An unknown GGML type.
    write_gguf(
        &p("unknown.gguf"),
        &[],
        &[("blk.0.ffn_up_exps.weight", vec![64, 32, 4], 99, 0)],
    );
    refuses(
        &p("unknown.gguf"),
        "GGML type 99, which this reader does not know",
    );

    // Neither format.
    std::fs::write(p("model.bin"), b"not a model").unwrap();
    refuses(&p("model.bin"), "not a GGUF or safetensors model");
    refuses(&p("missing.gguf"), "No such file");
}

#[test]
fn an_existing_out_dir_is_kept_unless_force_and_a_vault() {
    let dir = tempfile::tempdir().unwrap();
    let src = fixtures().join("qwen3moe-q8_0.gguf");
    let out_dir = dir.path().join("vault");
    std::fs::create_dir(&out_dir).unwrap();
    std::fs::write(out_dir.join("notes.txt"), b"mine").unwrap();
    let run = |force: bool| -> Output {
        let mut c = smoe();
        c.arg("pack").arg(&src).arg(&out_dir);
        if force {
            c.arg("--force");
        }
        c.output().unwrap()
    };
    for force in [false, true] {
        let out = run(force);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.contains(if force {
                "holds notes.txt, which is not a vault's file"
            } else {
                "already exists"
            }),
            "{stderr}"
        );
        assert_eq!(std::fs::read(out_dir.join("notes.txt")).unwrap(), b"mine");
    }
    std::fs::remove_file(out_dir.join("notes.txt")).unwrap();
    // An empty directory, then a vault, may be replaced with --force.
    assert!(run(true).status.success());
    let id = std::fs::read(out_dir.join("experts.smoe")).unwrap()[80..96].to_vec();
    assert!(!run(false).status.success());
    assert!(run(true).status.success());
    let id2 = std::fs::read(out_dir.join("experts.smoe")).unwrap()[80..96].to_vec();
    assert_ne!(id, id2, "replaced by a new vault");
    assert!(entries_with_prefix(dir.path(), ".vault").is_empty());
}

/// Every file under `dir` (recursively, links not followed) with its bytes
/// (a link's target path, a directory's marker).
fn snapshot(dir: &Path) -> std::collections::BTreeMap<PathBuf, Vec<u8>> {
    let mut out = std::collections::BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let t = std::fs::symlink_metadata(&p).unwrap().file_type();
            let bytes = if t.is_symlink() {
                std::fs::read_link(&p)
                    .unwrap()
                    .into_os_string()
                    .into_encoded_bytes()
            } else if t.is_dir() {
                todo.push(p.clone());
                b"<dir>".to_vec()
            } else {
                std::fs::read(&p).unwrap()
            };
            out.insert(p, bytes);
        }
    }
    out
}

/// A fresh vault of the small fixture at `dir`.
fn vault_at(dir: &Path) {
    let out = pack(&fixtures().join("qwen3moe-q8_0.gguf"), dir);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `smoe pack SRC OUT --force` must refuse with one line naming `needle`,
/// exit 1, and leave every file under `root` as it was.
#[track_caller]
fn force_refuses(src: &Path, out_dir: &Path, root: &Path, needle: &str) {
    let before = snapshot(root);
    let out = smoe()
        .arg("pack")
        .arg(src)
        .arg(out_dir)
        .arg("--force")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(stderr.starts_with("smoe: "), "{stderr}");
    assert!(stderr.contains(needle), "{needle:?} not in {stderr}");
    assert!(stderr.contains("--force replaces only"), "{stderr}");
    assert_eq!(snapshot(root), before, "files changed: {stderr}");
}

/// Issue 19, item 1: `--force` replaced a directory holding the model
/// itself and the user's notes, judged a vault by the name experts.smoe
/// alone. It replaces only an empty directory or a valid vault with
/// nothing but a vault's files; the model counts by identity, whatever its
/// name there.
#[test]
fn force_never_replaces_user_files() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    // copies of the fixtures: a hard link to a committed fixture would move its ctime, which
    // a test reading it in place at the same time takes for a rewrite (and fails its reads)
    let model = root.join("qwen3moe-q8_0.gguf");
    std::fs::copy(fixtures().join("qwen3moe-q8_0.gguf"), &model).unwrap();

    // The case: a vault, the model and notes in one directory.
    let v = root.join("v");
    vault_at(&v);
    std::fs::copy(&model, v.join("model.gguf")).unwrap();
    std::fs::write(v.join("NOTES.txt"), b"mine").unwrap();
    force_refuses(&v.join("model.gguf"), &v, root, "v: holds ");
    std::fs::remove_file(v.join("NOTES.txt")).unwrap();
    force_refuses(&v.join("model.gguf"), &v, root, "holds model.gguf");
    std::fs::remove_file(v.join("model.gguf")).unwrap();

    // The model under a name a vault may hold: a hard link, a symbolic link.
    std::fs::hard_link(&model, v.join("scout.orig")).unwrap();
    force_refuses(
        &model,
        &v,
        root,
        "holds scout.orig, which is the model being packed",
    );
    std::fs::remove_file(v.join("scout.orig")).unwrap();
    std::os::unix::fs::symlink(&model, v.join("scout.link")).unwrap();
    force_refuses(
        &model,
        &v,
        root,
        "holds scout.link, which is the model being packed",
    );
    std::fs::remove_file(v.join("scout.link")).unwrap();

    // Another part of a split GGUF, another shard of a safetensors model.
    let split = root.join("split");
    std::fs::create_dir(&split).unwrap();
    for e in std::fs::read_dir(fixtures().join("qwen3moe-q8_0-split")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), split.join(e.file_name())).unwrap();
    }
    let part = |i: u32| split.join(format!("qwen3moe-q8_0-split-{i:05}-of-00004.gguf"));
    std::fs::hard_link(part(2), v.join("scout.gguf.part2")).unwrap();
    force_refuses(
        &part(1),
        &v,
        root,
        "holds scout.gguf.part2, which is the model",
    );
    std::fs::remove_file(v.join("scout.gguf.part2")).unwrap();
    let sharded = root.join("sharded");
    std::fs::create_dir(&sharded).unwrap();
    for e in std::fs::read_dir(fixtures().join("qwen2moe-f32-sharded")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), sharded.join(e.file_name())).unwrap();
    }
    std::fs::remove_file(v.join("scout.gguf")).unwrap();
    std::fs::hard_link(
        sharded.join("model-00007-of-00011.safetensors"),
        v.join("scout.safetensors"),
    )
    .unwrap();
    force_refuses(
        &sharded,
        &v,
        root,
        "holds scout.safetensors, which is the model",
    );
    std::fs::remove_file(v.join("scout.safetensors")).unwrap();

    // A config.json in a vault packed from a GGUF is the user's: the
    // packer lists in the metadata the configs it copied, here none.
    std::fs::write(v.join("config.json"), b"{\"mine\": 1}").unwrap();
    force_refuses(
        &model,
        &v,
        root,
        "holds config.json, which the vault's metadata does not list as copied",
    );
    std::fs::remove_file(v.join("config.json")).unwrap();

    // Not a regular file, though named like one.
    std::fs::create_dir(v.join("scout.d")).unwrap();
    std::fs::write(v.join("scout.d/weights.bin"), b"mine").unwrap();
    force_refuses(&model, &v, root, "holds scout.d, which is a directory");
    std::fs::remove_dir_all(v.join("scout.d")).unwrap();

    // A 0-byte experts.smoe is no vault, with or without another file.
    let w = root.join("w");
    std::fs::create_dir(&w).unwrap();
    std::fs::write(w.join("experts.smoe"), b"").unwrap();
    std::fs::write(w.join("other.txt"), b"mine").unwrap();
    force_refuses(
        &model,
        &w,
        root,
        "holds other.txt, which is not a vault's file",
    );
    std::fs::remove_file(w.join("other.txt")).unwrap();
    force_refuses(&model, &w, root, "does not hold a valid vault");

    // A vault with only a vault's files is replaced: its scout, the
    // histogram and a histogram writer's temporary file.
    std::fs::write(v.join("expert_freq.bin"), b"counts").unwrap();
    std::fs::write(v.join(".expert_freq.bin.tmp-1-0"), b"half").unwrap();
    let id = std::fs::read(v.join("experts.smoe")).unwrap()[80..96].to_vec();
    let out = smoe()
        .arg("pack")
        .arg(&model)
        .arg(&v)
        .arg("--force")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id2 = std::fs::read(v.join("experts.smoe")).unwrap()[80..96].to_vec();
    assert_ne!(id, id2, "replaced by a new vault");
    assert!(!v.join("expert_freq.bin").exists());
}

/// A model big enough that packing takes a while: one layer of 8 experts,
/// 3 × 128 MiB of F32 zeros (a hole on disk).
fn big_model(dir: &Path) -> PathBuf {
    let path = dir.join("big.gguf");
    let (n_embd, n_ff, n_exp) = (4096u64, 1024u64, 8u64);
    let bytes = n_embd * n_ff * n_exp * 4;
    write_gguf(
        &path,
        &[],
        &[
            (
                "blk.0.ffn_gate_exps.weight",
                vec![n_embd, n_ff, n_exp],
                0,
                bytes,
            ),
            (
                "blk.0.ffn_up_exps.weight",
                vec![n_embd, n_ff, n_exp],
                0,
                bytes,
            ),
            (
                "blk.0.ffn_down_exps.weight",
                vec![n_ff, n_embd, n_exp],
                0,
                bytes,
            ),
        ],
    );
    path
}

/// Starts `smoe pack SRC OUT` and waits until its temporary directory has
/// a partly written vault file in it.
fn start_pack(src: &Path, out_dir: &Path) -> (std::process::Child, PathBuf) {
    let child = smoe()
        .arg("pack")
        .arg(src)
        .arg(out_dir)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let tmp = out_dir
        .parent()
        .unwrap()
        .join(format!(".vault.smoe-pack-{}", child.id()));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let started = std::fs::read_dir(&tmp).is_ok_and(|mut e| e.next().is_some());
        if started {
            break;
        }
        assert!(Instant::now() < deadline, "the pack never started writing");
        std::thread::sleep(Duration::from_millis(2));
    }
    (child, tmp)
}

#[test]
fn ctrl_c_mid_pack_leaves_no_out_dir() {
    let dir = tempfile::tempdir().unwrap();
    let src = big_model(dir.path());
    let out_dir = dir.path().join("vault");
    let (child, tmp) = start_pack(&src, &out_dir);
    // SAFETY: kill(2) with the pid of our own child and a valid signal.
    assert_eq!(
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) },
        0
    );
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("interrupted"), "{stderr}");
    assert!(!out_dir.exists(), "OUT_DIR exists after Ctrl-C");
    assert!(!tmp.exists(), "the temporary directory was left");
}

#[test]
fn a_killed_packs_leftover_is_removed_by_the_next_run() {
    let dir = tempfile::tempdir().unwrap();
    let src = big_model(dir.path());
    let out_dir = dir.path().join("vault");
    let (mut child, tmp) = start_pack(&src, &out_dir);
    child.kill().unwrap(); // SIGKILL: no chance to clean up
    child.wait().unwrap();
    assert!(!out_dir.exists(), "OUT_DIR exists after SIGKILL");
    assert!(
        tmp.exists(),
        "the killed run's temporary directory is there"
    );
    let out = pack(&fixtures().join("qwen3moe-q8_0.gguf"), &out_dir);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!tmp.exists(), "the leftover was not removed");
    assert!(entries_with_prefix(dir.path(), ".vault").is_empty());
}

#[test]
fn summary_and_inspect_show_the_layout() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("vault");
    let out = pack(&fixtures().join("synthetic-mixed.gguf"), &out_dir);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for needle in [
        "layers: 4",
        "experts per layer: 4",
        "blob size:",
        "scout: scout.gguf",
        "smoe budget",
    ] {
        assert!(stdout.contains(needle), "{needle:?} not in {stdout}");
    }
    let out = smoe().arg("inspect").arg(&out_dir).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(stdout.contains("layout"), "{stdout}");
    // Every layer's items, with dtype, shape and bytes.
    let vault = smoe::vault::Vault::open(&out_dir).unwrap();
    let layouts = smoe_pack::layout::BlobLayouts::of(&vault).unwrap().unwrap();
    for (_, items) in &layouts.layers {
        for i in items {
            let shape = i.shape_text();
            assert!(
                stdout.lines().any(|l| l.contains(&i.role)
                    && l.contains(&i.dtype)
                    && l.contains(&shape)
                    && l.contains(&format!("{} bytes", i.bytes))),
                "{} {} {shape} not in {stdout}",
                i.role,
                i.dtype
            );
        }
    }
}

#[test]
fn a_safetensors_vault_carries_the_checkpoints_configs() {
    let dir = tempfile::tempdir().unwrap();
    // Both configs, copied byte for byte (whitespace and key order kept).
    let src = fixtures().join("mixtral-bf16");
    let out_dir = dir.path().join("vault");
    let out = pack(&src, &out_dir);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for name in ["config.json", "generation_config.json"] {
        assert_eq!(
            std::fs::read(out_dir.join(name)).unwrap(),
            std::fs::read(src.join(name)).unwrap(),
            "{name}"
        );
    }
    // A vault that carries them may be replaced with --force.
    let again = smoe()
        .args(["pack", "--force"])
        .arg(&src)
        .arg(&out_dir)
        .output()
        .unwrap();
    assert!(
        again.status.success(),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    // Only what is there: a checkpoint without generation_config.json.
    let m = copy_fixture("qwen2moe-f32-sharded", &dir.path().join("sharded"));
    std::fs::remove_file(m.join("generation_config.json")).unwrap();
    let out_dir = dir.path().join("vault2");
    let out = pack(&m, &out_dir);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out_dir.join("config.json").is_file());
    assert!(!out_dir.join("generation_config.json").exists());
    // A generation_config.json put there later is the user's: --force
    // refuses, though the vault comes from a safetensors model.
    std::fs::write(out_dir.join("generation_config.json"), b"{}").unwrap();
    force_refuses(
        &m,
        &out_dir,
        dir.path(),
        "holds generation_config.json, which the vault's metadata does not list",
    );
    std::fs::remove_file(out_dir.join("generation_config.json")).unwrap();
    // A GGUF carries its configuration in itself.
    let out_dir = dir.path().join("vault3");
    assert!(pack(&fixtures().join("mixtral-q8_0.gguf"), &out_dir)
        .status
        .success());
    assert!(!out_dir.join("config.json").exists());
    // A generation_config.json that is not a JSON object is refused, naming
    // it, and nothing is created.
    std::fs::write(m.join("generation_config.json"), b"[1]").unwrap();
    refuses_at_once(
        &m,
        "generation_config.json: holds an array, expected a JSON object",
    );
}

/// Runs `cmd` (stderr piped) under a 2 GiB address-space limit, killing it
/// after `limit`; returns its output and how long it ran, or None if it
/// had to be killed.
fn run_bounded(cmd: &mut Command, limit: Duration) -> (Option<Output>, Duration) {
    use std::os::unix::process::CommandExt;
    // SAFETY: between fork and exec the closure calls only setrlimit(2),
    // which is async-signal-safe, on a local struct.
    unsafe {
        cmd.pre_exec(|| {
            let cap = libc::rlimit {
                rlim_cur: 2 << 30,
                rlim_max: 2 << 30,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &cap) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let start = Instant::now();
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    loop {
        if child.try_wait().unwrap().is_some() {
            return (Some(child.wait_with_output().unwrap()), start.elapsed());
        }
        if start.elapsed() > limit {
            child.kill().unwrap();
            child.wait().unwrap();
            return (None, start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// `smoe pack SRC OUT` must fail within 10 s with one line containing
/// `needle`, exit 1, leaving no OUT_DIR and no temporary directory.
#[track_caller]
fn refuses_at_once(src: &Path, needle: &str) {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("vault");
    let (out, took) = run_bounded(
        smoe().arg("pack").arg(src).arg(&out_dir),
        Duration::from_secs(10),
    );
    let out = out.unwrap_or_else(|| panic!("{}: still running after {took:?}", src.display()));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{}: {stderr}", src.display());
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(stderr.starts_with("smoe: "), "{stderr}");
    assert!(stderr.contains(needle), "{needle:?} not in {stderr}");
    assert!(!out_dir.exists(), "OUT_DIR was created");
    assert!(entries_with_prefix(dir.path(), ".vault").is_empty());
}

/// A copy of the fixture directory or file `name` at `to`.
fn copy_fixture(name: &str, to: &Path) -> PathBuf {
    let from = fixtures().join(name);
    if from.is_dir() {
        std::fs::create_dir_all(to).unwrap();
        for e in std::fs::read_dir(&from).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    } else {
        std::fs::copy(&from, to).unwrap();
    }
    to.to_path_buf()
}

/// Replaces `path` with a FIFO (`None`) or a symbolic link to `target`.
fn replace_with(path: &Path, target: Option<&str>) {
    let _ = std::fs::remove_file(path);
    match target {
        Some(t) => std::os::unix::fs::symlink(t, path).unwrap(),
        None => {
            let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: `c` is a NUL-terminated path that outlives the call.
            assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        }
    }
}

/// Issue 19, item 4: a FIFO named model.safetensors, config.json or the
/// index blocked pack forever (SIGTERM and the first Ctrl-C did not stop
/// it); a config.json linked to /dev/zero was read to 2 GB, then ignored;
/// a shard linked to /dev/zero was "missing". Every input is now opened
/// without blocking and must be a regular file, else one line names it.
#[test]
fn inputs_that_are_not_regular_files_are_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n);
    let shard = "model-00003-of-00011.safetensors";
    for (file, target, needle) in [
        (
            "config.json",
            None,
            "config.json is a FIFO, not a regular file",
        ),
        (
            "model.safetensors.index.json",
            None,
            "model.safetensors.index.json is a FIFO, not a regular file",
        ),
        (
            "config.json",
            Some("/dev/zero"),
            "config.json is a character device, not a regular file",
        ),
        (
            "model.safetensors.index.json",
            Some("/dev/urandom"),
            "index.json is a character device, not a regular file",
        ),
        (
            shard,
            Some("/dev/zero"),
            "is a character device, not a regular file",
        ),
        (shard, None, "is a FIFO, not a regular file"),
    ] {
        let model = copy_fixture("qwen2moe-f32-sharded", &p(&format!("m-{}", rand_name())));
        replace_with(&model.join(file), target);
        refuses_at_once(&model, needle);
    }
    // A single-file checkpoint, given as a directory and by name.
    std::fs::create_dir(p("single")).unwrap();
    replace_with(&p("single/model.safetensors"), None);
    refuses_at_once(
        &p("single"),
        "model.safetensors is a FIFO, not a regular file",
    );
    refuses_at_once(
        &p("single/model.safetensors"),
        "model.safetensors is a FIFO, not a regular file",
    );
    // A GGUF, and a split GGUF's second part.
    replace_with(&p("fifo.gguf"), None);
    refuses_at_once(&p("fifo.gguf"), "fifo.gguf is a FIFO, not a regular file");
    let split = copy_fixture("qwen3moe-q8_0-split", &p("split"));
    replace_with(&split.join("qwen3moe-q8_0-split-00002-of-00004.gguf"), None);
    refuses_at_once(
        &split.join("qwen3moe-q8_0-split-00001-of-00004.gguf"),
        "(part 2 of 4 of the split model) is a FIFO, not a regular file",
    );
}

/// A name no other call of this test process returns.
fn rand_name() -> String {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        .to_string()
}

/// Issue 19, item 4: a config.json that could not be read (not UTF-8) or
/// meant nothing (not an object) was silently dropped, and JSON files were
/// read without bound. Each is now an error naming the file.
#[test]
fn a_config_or_index_that_cannot_be_read_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let model = |name: &str| copy_fixture("qwen2moe-f32-sharded", &dir.path().join(name));
    let m = model("utf8");
    std::fs::write(m.join("config.json"), b"{\"model_type\": \"qwen\xff\"}").unwrap();
    refuses_at_once(&m, "config.json: not UTF-8 (invalid byte at offset 20)");
    let m = model("json");
    std::fs::write(m.join("config.json"), b"{\"num_experts\": 4,}").unwrap();
    refuses_at_once(&m, "config.json: invalid JSON at byte 18");
    let m = model("array");
    std::fs::write(m.join("config.json"), b"[4]").unwrap();
    refuses_at_once(&m, "config.json: holds an array, expected a JSON object");
    // Over the cap: a sparse 65 MiB file, refused before a byte is read.
    let m = model("big");
    let f = std::fs::File::create(m.join("config.json")).unwrap();
    f.set_len(65 << 20).unwrap();
    refuses_at_once(
        &m,
        "config.json: 68157440 bytes, above the 64 MiB cap on JSON files",
    );
    let f = std::fs::OpenOptions::new()
        .append(true)
        .open(m.join("model.safetensors.index.json"))
        .unwrap();
    f.set_len(65 << 20).unwrap();
    refuses_at_once(
        &m,
        "model.safetensors.index.json: 68157440 bytes, above the 64 MiB cap",
    );
}

/// Sends `signal` to `child` once `ready()` holds (checked every 2 ms, for
/// up to 60 s), then asserts that it exits within 3 s saying it was
/// interrupted, and that neither `out_dir` nor `tmp` is left.
#[track_caller]
fn stops_on(
    mut child: std::process::Child,
    signal: libc::c_int,
    ready: impl Fn() -> bool,
    out_dir: &Path,
    tmp: &Path,
) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ready() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the pack ended before the phase under test"
        );
        assert!(Instant::now() < deadline, "the phase under test never came");
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(
        child.try_wait().unwrap().is_none(),
        "ended before the signal"
    );
    // SAFETY: kill(2) with the pid of our own, still running child.
    assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, signal) }, 0);
    let sent = Instant::now();
    let bound = Duration::from_secs(3);
    while child.try_wait().unwrap().is_none() {
        if sent.elapsed() > bound {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("signal {signal}: still running {bound:?} after it");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let took = sent.elapsed();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("interrupted"), "{stderr}");
    assert!(!out_dir.exists(), "OUT_DIR exists after the signal");
    assert!(!tmp.exists(), "the temporary directory was left");
    eprintln!("signal {signal}: stopped {took:?} after it");
}

fn spawn_pack(src: &Path, out_dir: &Path) -> (std::process::Child, PathBuf) {
    let child = smoe()
        .arg("pack")
        .arg(src)
        .arg(out_dir)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let tmp = out_dir
        .parent()
        .unwrap()
        .join(format!(".vault.smoe-pack-{}", child.id()));
    (child, tmp)
}

/// Issue 19, item 4: SIGINT and SIGTERM stop pack within a second (3 s
/// allowed on a shared machine) in every phase, leaving nothing behind.
/// Parsing: 40 shards (hard links of one file, whose 300,000-tensor header
/// takes a while to read) take far longer than that to parse.
#[test]
fn a_signal_stops_pack_while_it_parses_headers() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    std::fs::create_dir(&model).unwrap();
    let one = dir.path().join("one.safetensors");
    write_many_tensor_safetensors(&one, 300_000);
    let mut map = Vec::new();
    for i in 1..=40 {
        let name = format!("model-{i:05}-of-00040.safetensors");
        std::fs::hard_link(&one, model.join(&name)).unwrap();
        map.push(format!("\"w.{i}\":\"{name}\""));
    }
    std::fs::write(
        model.join("model.safetensors.index.json"),
        format!("{{\"weight_map\":{{{}}}}}", map.join(",")),
    )
    .unwrap();
    for signal in [libc::SIGINT, libc::SIGTERM] {
        let out_dir = dir.path().join("vault");
        let (child, tmp) = spawn_pack(&model, &out_dir);
        let started = Instant::now();
        stops_on(
            child,
            signal,
            || started.elapsed() > Duration::from_millis(500) && !tmp.exists(),
            &out_dir,
            &tmp,
        );
    }
}

/// Copying blobs: two experts of 3 × 128 MiB each (F32 zeros, a hole).
#[test]
fn a_signal_stops_pack_while_it_copies_blobs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.gguf");
    let (n_embd, n_ff, n_exp) = (8192u64, 4096u64, 2u64);
    let bytes = n_embd * n_ff * n_exp * 4;
    write_gguf(
        &path,
        &[],
        &[
            (
                "blk.0.ffn_gate_exps.weight",
                vec![n_embd, n_ff, n_exp],
                0,
                bytes,
            ),
            (
                "blk.0.ffn_up_exps.weight",
                vec![n_embd, n_ff, n_exp],
                0,
                bytes,
            ),
            (
                "blk.0.ffn_down_exps.weight",
                vec![n_ff, n_embd, n_exp],
                0,
                bytes,
            ),
        ],
    );
    for signal in [libc::SIGINT, libc::SIGTERM] {
        let out_dir = dir.path().join("vault");
        let (child, tmp) = spawn_pack(&path, &out_dir);
        let vault_written = || std::fs::read_dir(&tmp).is_ok_and(|mut e| e.next().is_some());
        stops_on(child, signal, vault_written, &out_dir, &tmp);
    }
}

/// Writing the scout: small experts, then one 1 GiB tensor for the scout.
#[test]
fn a_signal_stops_pack_while_it_writes_the_scout() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("scout-heavy.gguf");
    write_gguf(
        &path,
        &[],
        &[
            (
                "blk.0.ffn_up_exps.weight",
                vec![64, 32, 2],
                0,
                64 * 32 * 2 * 4,
            ),
            ("token_embd.weight", vec![65536, 4096], 0, 65536 * 4096 * 4),
        ],
    );
    for signal in [libc::SIGINT, libc::SIGTERM] {
        let out_dir = dir.path().join("vault");
        let (child, tmp) = spawn_pack(&path, &out_dir);
        let scout_started = || tmp.join("scout.gguf").exists();
        stops_on(child, signal, scout_started, &out_dir, &tmp);
    }
}

/// A GGUF v3 file of F32 tensors at the given offsets (relative to the
/// data section, multiples of 32): (name, `ne`, offset). The data is a
/// hole up to the furthest end. Returns where the data section starts.
fn write_gguf_at(path: &Path, tensors: &[(&str, Vec<u64>, u64)]) -> u64 {
    let mut b = Vec::new();
    b.extend_from_slice(b"GGUF");
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes());
    let mut end = 0u64;
    for (name, ne, offset) in tensors {
        b.extend_from_slice(&(name.len() as u64).to_le_bytes());
        b.extend_from_slice(name.as_bytes());
        b.extend_from_slice(&(ne.len() as u32).to_le_bytes());
        for n in ne {
            b.extend_from_slice(&n.to_le_bytes());
        }
        b.extend_from_slice(&0u32.to_le_bytes());
        b.extend_from_slice(&offset.to_le_bytes());
        end = end.max(offset + 4 * ne.iter().product::<u64>());
    }
    let data = (b.len() as u64).next_multiple_of(32);
    std::fs::write(path, &b).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.set_len(data + end).unwrap();
    data
}

/// A safetensors file of F32 tensors at the given data offsets: (name,
/// shape, begin); the data is a hole.
fn write_safetensors_at(path: &Path, tensors: &[(&str, Vec<u64>, u64)]) {
    let mut end = 0u64;
    let members: Vec<String> = tensors
        .iter()
        .map(|(name, shape, begin)| {
            let e = begin + 4 * shape.iter().product::<u64>();
            end = end.max(e);
            format!("\"{name}\":{{\"dtype\":\"F32\",\"shape\":{shape:?},\"data_offsets\":[{begin},{e}]}}")
        })
        .collect();
    let header = format!("{{{}}}", members.join(","));
    let mut b = (header.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(header.as_bytes());
    std::fs::write(path, &b).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.set_len(b.len() as u64 + end).unwrap();
}

/// Issue 19, item 5: tensors whose data ranges alias each other were each
/// copied whole (a 411 KB GGUF became a 501 MB vault). They are refused,
/// naming both tensors.
#[test]
fn overlapping_tensor_data_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n);
    // 200 layers whose experts are all the same bytes.
    let names: Vec<String> = (0..200)
        .map(|l| format!("blk.{l}.ffn_up_exps.weight"))
        .collect();
    let aliased: Vec<(&str, Vec<u64>, u64)> = names
        .iter()
        .map(|n| (n.as_str(), vec![64, 8, 4], 0))
        .collect();
    let at = write_gguf_at(&p("aliased.gguf"), &aliased);
    let (a, b) = (at, at + 8192);
    refuses(
        &p("aliased.gguf"),
        &format!("tensors blk.0.ffn_up_exps.weight (bytes {a}..{b}) and blk.1.ffn_up_exps.weight (bytes {a}..{b}) share data"),
    );
    // One tensor's data inside another's, past a third that does not overlap.
    let at = write_gguf_at(
        &p("inside.gguf"),
        &[
            ("blk.0.ffn_up_exps.weight", vec![64, 8, 4], 0),
            ("blk.1.ffn_up_exps.weight", vec![64, 8, 4], 8192),
            ("output_norm.weight", vec![64], 8192 + 4096),
        ],
    );
    refuses(
        &p("inside.gguf"),
        &format!(
            "tensors blk.1.ffn_up_exps.weight (bytes {}..{}) and output_norm.weight (bytes {}..{}) share data",
            at + 8192,
            at + 16384,
            at + 12288,
            at + 12544
        ),
    );
    write_safetensors_at(
        &p("aliased.safetensors"),
        &[
            ("model.layers.0.mlp.experts.0.up_proj.weight", vec![8, 8], 0),
            (
                "model.layers.0.mlp.experts.1.up_proj.weight",
                vec![8, 8],
                128,
            ),
        ],
    );
    refuses(
        &p("aliased.safetensors"),
        "share data; each tensor must have bytes of its own",
    );
    // Back to back is fine.
    write_gguf_at(
        &p("adjacent.gguf"),
        &[
            ("blk.0.ffn_up_exps.weight", vec![64, 8, 4], 0),
            ("blk.1.ffn_up_exps.weight", vec![64, 8, 4], 8192),
        ],
    );
    let out = pack(&p("adjacent.gguf"), &p("vault"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Issue 19, item 5: a vault larger than the free space is refused before
/// a byte is written, as `smoe synth` does. The model: a sparse 4 TiB GGUF.
/// The pack runs with a 256 MiB file-size limit, so that the code before
/// this check (which wrote until the disk filled) fails safely here.
#[test]
fn a_vault_larger_than_the_free_space_is_refused_before_writing() {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("huge.gguf");
    write_gguf_at(
        &src,
        &[("blk.0.ffn_up_exps.weight", vec![65536, 65536, 256], 0)],
    );
    let out_dir = dir.path().join("vault");
    let mut cmd = smoe();
    cmd.arg("pack").arg(&src).arg(&out_dir);
    // SAFETY: between fork and exec the closure calls only signal(2) and
    // setrlimit(2), both async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            let cap = libc::rlimit {
                rlim_cur: 256 << 20,
                rlim_max: 256 << 20,
            };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &cap) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("vault: the vault needs ")
            && stderr.contains("(4.00 TiB) but its filesystem has"),
        "{stderr}"
    );
    assert!(!out_dir.exists(), "OUT_DIR was created");
    assert!(entries_with_prefix(dir.path(), ".vault").is_empty());
}

/// Issue 19, item 7: a layer index of 4294967295 overflowed `max_layer +
/// 1` ("n_layers × n_experts is 0 × 4 = 0", no file named; a panic in a
/// debug build). Now the file and the tensor are named.
#[test]
fn a_layer_beyond_the_id_space_names_the_file_and_the_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n);
    for layer in [u32::MAX, 1 << 20] {
        let name = format!("blk.{layer}.ffn_up_exps.weight");
        write_gguf_at(&p("layer.gguf"), &[(name.as_str(), vec![64, 8, 4], 0)]);
        refuses(
            &p("layer.gguf"),
            &format!("layer.gguf: tensor {name} is in layer {layer}, so the model would have {} layers × 4 experts", u64::from(layer) + 1),
        );
    }
    let name = format!("model.layers.{}.mlp.experts.0.up_proj.weight", u32::MAX);
    write_safetensors_at(&p("layer.safetensors"), &[(name.as_str(), vec![8, 8], 0)]);
    refuses(
        &p("layer.safetensors"),
        &format!("layer.safetensors: tensor {name} is in layer 4294967295"),
    );
}
