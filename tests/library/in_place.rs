//! A model opened in place (SPEC §6, issue 34): every committed model
//! fixture (GGUF single and split, safetensors single and sharded,
//! per-expert and stacked, strides that are and are not multiples of 4096)
//! opened by `Streamer::open` with no vault, every expert claimed, and every
//! item of its layout compared byte for byte with the slice the format's own
//! Python readers recorded in `tests/fixtures/models/EXPECTED.json`
//! (`gguf.GGUFReader`, the `safetensors` package), read here with a plain
//! `pread` of the model file at the offset they found.

use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use smoe::vault::Vault;
use smoe::{Config, Streamer};
use smoe_test_support::models::{write_gguf, GgufData, GgufTensor};
use smoe_test_support::native;

const WAIT: Duration = Duration::from_secs(10);

fn fixtures() -> PathBuf {
    native::manifest_dir().join("tests/fixtures/models")
}

fn expected() -> serde_json::Value {
    let text = std::fs::read_to_string(fixtures().join("EXPECTED.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// (role → (offset in the claimed bytes, bytes, dtype)) per layer, from the
/// streamer's metadata.
type Layouts = BTreeMap<u32, Vec<(String, u64, u64, String)>>;

fn layouts(meta: &str) -> Layouts {
    let v: serde_json::Value = serde_json::from_str(meta).unwrap();
    assert_eq!(v["format"], "smoe-model", "{meta}");
    let mut out = Layouts::new();
    for (layer, items) in v["layer_blob_layouts"].as_object().unwrap() {
        let items = items
            .as_array()
            .unwrap()
            .iter()
            .map(|i| {
                (
                    i["role"].as_str().unwrap().to_owned(),
                    i["offset"].as_u64().unwrap(),
                    i["bytes"].as_u64().unwrap(),
                    i["dtype"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        out.insert(layer.parse().unwrap(), items);
    }
    out
}

fn config() -> Config {
    Config {
        ring_slots: 4,
        workers: 2,
        // Nothing is written anywhere by these reads.
        freq_path: Some(PathBuf::new()),
        ..Config::default()
    }
}

/// Every expert slice of every fixture, claimed from the model in place,
/// equals the Python readers' bytes; every expert of a layer has the
/// layer's layout; the metadata says what the model is.
#[test]
fn every_fixture_streams_in_place_byte_for_byte() {
    let expected = expected();
    let mut slices = 0;
    let mut fixtures_seen = 0;
    let mut moved_any = false;
    for (name, fx) in expected["fixtures"].as_object().unwrap() {
        let src = fixtures().join(fx["source"].as_str().unwrap());
        let s = Streamer::open(&src, config()).unwrap_or_else(|e| panic!("{name}: {e}"));
        let meta: serde_json::Value = serde_json::from_str(s.vault().meta()).unwrap();
        let kind = if src.extension().is_some_and(|e| e == "gguf") {
            "gguf"
        } else {
            "safetensors"
        };
        assert_eq!(meta["source"]["kind"], kind, "{name}");
        let files = meta["source"]["files"].as_array().unwrap();
        assert_eq!(
            files.len(),
            fx["files"].as_array().unwrap().len()
                - usize::from(
                    // The sharded checkpoint's index is a file of the
                    // fixture, not a file of tensors.
                    fx["files"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|f| f["path"].as_str().unwrap().ends_with(".json"))
                ),
            "{name}: {files:?}"
        );
        let layouts = layouts(s.vault().meta());
        let mut by_expert: BTreeMap<(u32, u32), Vec<&serde_json::Value>> = BTreeMap::new();
        for sl in fx["expert_slices"].as_array().unwrap() {
            let key = (
                sl["layer"].as_u64().unwrap() as u32,
                sl["expert"].as_u64().unwrap() as u32,
            );
            by_expert.entry(key).or_default().push(sl);
        }
        for ((layer, expert), want) in &by_expert {
            let items = &layouts[layer];
            let c = s
                .claim_wait(*layer, *expert, WAIT)
                .unwrap_or_else(|e| panic!("{name} {layer}/{expert}: {e}"))
                .expect("read within 10 s");
            let size = items.iter().map(|i| i.1 + i.2).max().unwrap();
            assert_eq!(
                c.len() as u64,
                size,
                "{name}: the claim spans the slot up to its last item"
            );
            assert_eq!(
                c.as_ptr() as usize % 4096,
                0,
                "{name}: the claim starts at its slot"
            );
            for sl in want {
                let role = sl["role"].as_str().unwrap();
                let (_, offset, bytes, dtype) = items
                    .iter()
                    .find(|i| i.0 == role)
                    .unwrap_or_else(|| panic!("{name}: layer {layer} has no {role}"));
                assert_eq!(*bytes, sl["nbytes"].as_u64().unwrap(), "{name} {role}");
                assert_eq!(dtype, sl["dtype"].as_str().unwrap(), "{name} {role}");
                let mut source = vec![0u8; *bytes as usize];
                std::fs::File::open(fixtures().join(sl["file"].as_str().unwrap()))
                    .unwrap()
                    .read_exact_at(&mut source, sl["offset"].as_u64().unwrap())
                    .unwrap();
                let got = &c[*offset as usize..(*offset + *bytes) as usize];
                assert!(
                    got == &source[..],
                    "{name}: layer {layer} expert {expert} {role} differs from the Python reader's slice"
                );
                slices += 1;
            }
        }
        let st = s.stats();
        assert_eq!(st.io_errors, 0, "{name}");
        moved_any |= st.bytes_moved > 0;
        fixtures_seen += 1;
    }
    eprintln!("{slices} slices of {fixtures_seen} fixtures checked in place");
    assert!(
        fixtures_seen >= 16 && slices > 500,
        "{fixtures_seen} {slices}"
    );
    // The fixtures' strides are not multiples of 4096: some layers' payloads
    // are moved after the read; the test below covers the other case.
    assert!(moved_any, "no fixture needed a move");
}

/// A model written by gguf-py whose per-expert stride is a multiple of 4096
/// (17 blocks) and whose tensors do not start on a block, as in real
/// models: every expert's slice lands where the layout says with no move,
/// and equals the slice gguf-py's GGUFReader located
/// (`derived/qwen3moe-q8_0-stride4096.slices.json`).
#[test]
fn a_gguf_py_model_with_block_strides_streams_with_no_move() {
    let derived = fixtures().join("derived");
    let path = derived.join("qwen3moe-q8_0-stride4096.gguf");
    let truth: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(derived.join("qwen3moe-q8_0-stride4096.slices.json")).unwrap(),
    )
    .unwrap();
    let file = std::fs::read(&path).unwrap();
    let s = Streamer::open(&path, config()).unwrap();
    let layouts = layouts(s.vault().meta());
    let mut checked = 0;
    for sl in truth["expert_slices"].as_array().unwrap() {
        let (layer, expert) = (
            sl["layer"].as_u64().unwrap() as u32,
            sl["expert"].as_u64().unwrap() as u32,
        );
        let role = sl["role"].as_str().unwrap();
        let (offset, n) = (
            sl["offset"].as_u64().unwrap(),
            sl["nbytes"].as_u64().unwrap(),
        );
        assert_ne!(
            offset % 4096,
            0,
            "the fixture's slices do not start on a block"
        );
        assert_eq!(
            n % 4096,
            0,
            "the fixture's stride is a multiple of the block"
        );
        let (_, at, bytes, _) = layouts[&layer].iter().find(|i| i.0 == role).unwrap();
        assert_eq!(*bytes, n);
        assert_eq!(
            at % 4096,
            offset % 4096,
            "the payload keeps its offset in the block"
        );
        let c = s.claim_wait(layer, expert, WAIT).unwrap().unwrap();
        assert!(
            c[*at as usize..(*at + n) as usize] == file[offset as usize..(offset + n) as usize],
            "layer {layer} expert {expert} {role}"
        );
        checked += 1;
    }
    assert_eq!(checked, 2 * 4 * 3);
    assert_eq!(s.stats().bytes_moved, 0, "{:?}", s.stats());
}

/// Writes a GGUF v3 file of one layer of stacked F32 experts whose
/// per-expert stride is 4096 bytes (a multiple of the block, as Qwen3-235B's
/// and Mixtral's are), with data at an offset that is not: every expert's
/// slice then has the same offset modulo the block, and no byte is moved.
/// Returns the file's bytes and where its expert data starts.
fn write_aligned_stride_gguf(path: &Path, n_experts: u64, seed: u64) -> (Vec<u8>, u64) {
    let tensors = [
        GgufTensor::new("token_embd.weight", &[8, 1], 0),
        GgufTensor::new("blk.0.ffn_gate_exps.weight", &[1024, 1, n_experts], 0),
        GgufTensor::new("blk.0.ffn_up_exps.weight", &[1024, 1, n_experts], 0),
        GgufTensor::new("blk.0.ffn_down_exps.weight", &[1024, 1, n_experts], 0),
    ];
    let kvs = [
        ("llama.expert_count", n_experts as u32),
        ("llama.expert_used_count", 2),
        ("llama.block_count", 1),
    ];
    let data_at = write_gguf(path, "llama", &kvs, &tensors, GgufData::Random(seed));
    // token_embd's 32 bytes come first.
    let experts_at = data_at + 32;
    assert_ne!(
        experts_at % 4096,
        0,
        "the expert data must start off a block"
    );
    (std::fs::read(path).unwrap(), experts_at)
}

/// Strides that are multiples of the block: the payload lands where the
/// layout says with no move, and the bytes are the file's.
#[test]
fn a_block_multiple_stride_is_read_with_no_move() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("aligned.gguf");
    let (file, experts_at) = write_aligned_stride_gguf(&path, 8, 3);
    let vault = Vault::open(&path).unwrap();
    assert!(vault.model().is_some());
    let s = Streamer::with_vault(vault, config()).unwrap();
    let layouts = layouts(s.vault().meta());
    for e in 0..8u32 {
        let c = s.claim_wait(0, e, WAIT).unwrap().unwrap();
        for (k, (_, offset, bytes, _)) in layouts[&0].iter().enumerate() {
            let at = experts_at + k as u64 * 8 * 4096 + u64::from(e) * 4096;
            assert_eq!(
                &c[*offset as usize..(*offset + *bytes) as usize],
                &file[at as usize..(at + bytes) as usize],
                "expert {e} item {k}"
            );
        }
    }
    assert_eq!(s.stats().bytes_moved, 0, "{:?}", s.stats());
    assert_eq!(s.stats().io_errors, 0);
}

/// The same bytes through the C API, from a C program (tests/c/model_test.c)
/// linked against libsmoe.a: a GGUF, a split GGUF, a safetensors file and a
/// sharded safetensors checkpoint (per-expert and stacked tensors), every
/// expert claimed with `smoe_claim_wait`, checked against `smoe_expert_info`
/// there and against the Python readers' slices here.
#[test]
fn the_c_api_streams_models_in_place() {
    let expected = expected();
    let dir = tempfile::tempdir().unwrap();
    let library = dir.path().join("libsmoe.a");
    std::fs::copy(native::lib_dir().join("libsmoe.a"), &library).unwrap();
    let compiler = native::c_compilers()
        .into_iter()
        .next()
        .expect("a C compiler");
    let program = dir.path().join("model_test");
    native::run(
        std::process::Command::new(&compiler)
            .arg("-std=c11")
            .args(native::WARNINGS)
            .arg("-I")
            .arg(native::manifest_dir().join("include"))
            .arg(native::manifest_dir().join("tests/c/model_test.c"))
            .arg(&library)
            .args(native::native_static_libs())
            .arg("-o")
            .arg(&program),
    );
    let mut kinds = Vec::new();
    for name in [
        "qwen3moe-q8_0",       // GGUF, stacked
        "qwen3moe-q8_0-split", // split GGUF
        "mixtral-bf16",        // safetensors, per-expert
        "gptoss-bf16",         // safetensors, stacked, biases
        "qwen2moe-f32-sharded",
    ] {
        let fx = &expected["fixtures"][name];
        assert!(fx.is_object(), "{name} is not in EXPECTED.json");
        let src = fixtures().join(fx["source"].as_str().unwrap());
        let mut pairs: Vec<(u32, u32)> = fx["expert_slices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                (
                    s["layer"].as_u64().unwrap() as u32,
                    s["expert"].as_u64().unwrap() as u32,
                )
            })
            .collect();
        pairs.dedup();
        let out = dir.path().join(format!("{name}.bin"));
        let output = native::run(
            std::process::Command::new(&program)
                .arg(&src)
                .arg(&out)
                .args(pairs.iter().map(|(l, e)| format!("{l}:{e}"))),
        );
        assert_eq!(output.trim(), "ok", "{name}: {output}");
        let meta = std::fs::read_to_string(out.with_extension("bin.meta")).unwrap();
        let layouts = layouts(&meta);
        let bytes = std::fs::read(&out).unwrap();
        let mut at = 0usize;
        let mut claims = BTreeMap::new();
        for &(l, e) in &pairs {
            let n = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()) as usize;
            claims.insert((l, e), &bytes[at + 8..at + 8 + n]);
            at += 8 + n;
        }
        assert_eq!(at, bytes.len(), "{name}");
        for sl in fx["expert_slices"].as_array().unwrap() {
            let (l, e) = (
                sl["layer"].as_u64().unwrap() as u32,
                sl["expert"].as_u64().unwrap() as u32,
            );
            let role = sl["role"].as_str().unwrap();
            let (_, offset, n, _) = layouts[&l].iter().find(|i| i.0 == role).unwrap();
            let mut source = vec![0u8; *n as usize];
            std::fs::File::open(fixtures().join(sl["file"].as_str().unwrap()))
                .unwrap()
                .read_exact_at(&mut source, sl["offset"].as_u64().unwrap())
                .unwrap();
            assert!(
                claims[&(l, e)][*offset as usize..(*offset + *n) as usize] == source[..],
                "{name}: layer {l} expert {e} {role}"
            );
        }
        kinds.push(name);
    }
    assert_eq!(kinds.len(), 5);
}

// ---------------------------------------------------------------------------
// Bad input (issue 34 point 7): a clear error naming the file, never a
// panic, a hang or wrong bytes.

fn open_err(path: &Path) -> String {
    match Streamer::open(path, config()) {
        Ok(_) => panic!("{} opened", path.display()),
        Err(e) => e.to_string(),
    }
}

fn copy_fixture(name: &str, to: &Path) -> PathBuf {
    let dst = to.join(Path::new(name).file_name().unwrap());
    std::fs::copy(fixtures().join(name), &dst).unwrap();
    dst
}

#[test]
fn a_truncated_gguf_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = copy_fixture("qwen3moe-q8_0.gguf", dir.path());
    let bytes = std::fs::read(&path).unwrap();
    // In the header, then in the tensor data.
    for (keep, says) in [
        (100, "truncated"),
        (bytes.len() - 1000, "is outside the file"),
    ] {
        std::fs::write(&path, &bytes[..keep]).unwrap();
        let e = open_err(&path);
        assert!(
            e.contains("qwen3moe-q8_0.gguf") && e.contains(says),
            "{keep}: {e}"
        );
    }
}

/// The parts of the committed split GGUF, in order.
fn split_parts() -> Vec<PathBuf> {
    let split = fixtures().join("qwen3moe-q8_0-split");
    let mut parts: Vec<PathBuf> = std::fs::read_dir(&split)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "gguf"))
        .collect();
    parts.sort();
    parts
}

#[test]
fn a_missing_split_part_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let parts = split_parts();
    assert!(parts.len() >= 3, "{parts:?}");
    for p in &parts {
        if p != &parts[2] {
            std::fs::copy(p, dir.path().join(p.file_name().unwrap())).unwrap();
        }
    }
    let first = dir.path().join(parts[0].file_name().unwrap());
    let e = open_err(&first);
    let missing = parts[2].file_name().unwrap().to_string_lossy().into_owned();
    assert!(e.contains(&missing), "{e}");
}

/// Rewrites the value of the integer key/value `key` (of type `value_type`,
/// `value.len()` bytes) in the GGUF at `path`, found by its bytes.
fn patch_gguf_int(path: &Path, key: &str, value_type: u32, value: &[u8]) {
    let mut bytes = std::fs::read(path).unwrap();
    let mut pattern = (key.len() as u64).to_le_bytes().to_vec();
    pattern.extend_from_slice(key.as_bytes());
    pattern.extend_from_slice(&value_type.to_le_bytes());
    let at = bytes
        .windows(pattern.len())
        .position(|w| w == pattern)
        .unwrap_or_else(|| panic!("{key} not in {}", path.display()))
        + pattern.len();
    bytes[at..at + value.len()].copy_from_slice(value);
    std::fs::write(path, bytes).unwrap();
}

/// The split parts' `split.*` keys (written by gguf-py) are checked: a
/// renamed part, a part in the wrong place and parts of different splits
/// are refused naming the file, not read as a model that lacks layers.
#[test]
fn split_parts_must_agree_with_their_split_keys() {
    let parts = split_parts();
    assert_eq!(parts.len(), 4, "{parts:?}");
    let copy_all = |dir: &Path| -> Vec<PathBuf> {
        parts
            .iter()
            .map(|p| {
                let to = dir.join(p.file_name().unwrap());
                std::fs::copy(p, &to).unwrap();
                to
            })
            .collect()
    };
    // The committed parts open (the check passes on gguf-py's keys).
    let dir = tempfile::tempdir().unwrap();
    let copies = copy_all(dir.path());
    drop(Streamer::open(&copies[0], config()).unwrap());

    // The first part alone, renamed.
    let alone = tempfile::tempdir().unwrap();
    let renamed = alone.path().join("model.gguf");
    std::fs::copy(&parts[0], &renamed).unwrap();
    let e = open_err(&renamed);
    assert!(
        e.contains("model.gguf")
            && e.contains("is part of a split model (split.count 4, split.no 0)"),
        "{e}"
    );

    // Part 2 says it is part 3 (split.no is a u16, type 2).
    patch_gguf_int(&copies[1], "split.no", 2, &2u16.to_le_bytes());
    let e = open_err(&copies[0]);
    assert!(
        e.contains("-00002-of-00004.gguf") && e.contains("split.no is 2 (expected 1"),
        "{e}"
    );
    patch_gguf_int(&copies[1], "split.no", 2, &1u16.to_le_bytes());
    drop(Streamer::open(&copies[0], config()).unwrap());

    // Part 3 from a split of another size, then of another tensor count
    // (split.tensors.count is an i32, type 5).
    patch_gguf_int(&copies[2], "split.count", 2, &5u16.to_le_bytes());
    let e = open_err(&copies[0]);
    assert!(
        e.contains("-00003-of-00004.gguf") && e.contains("its split.count is 5"),
        "{e}"
    );
    patch_gguf_int(&copies[2], "split.count", 2, &4u16.to_le_bytes());
    patch_gguf_int(&copies[2], "split.tensors.count", 5, &28i32.to_le_bytes());
    let e = open_err(&copies[0]);
    assert!(
        e.contains("-00003-of-00004.gguf")
            && e.contains("split.tensors.count is 28, but the 4 parts hold 27 tensors"),
        "{e}"
    );
}

/// A sharded checkpoint whose index places an expert in a shard that does
/// not hold it (a stale shard) is refused naming the index, the tensor and
/// the shard, instead of that layer's experts reading as dense.
#[test]
fn an_index_that_misplaces_an_expert_is_refused() {
    let src = fixtures().join("qwen2moe-f32-sharded");
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(&src).unwrap() {
        let p = entry.unwrap().path();
        std::fs::copy(&p, dir.path().join(p.file_name().unwrap())).unwrap();
    }
    drop(Streamer::open(dir.path(), config()).unwrap());
    let index = dir.path().join("model.safetensors.index.json");
    let text = std::fs::read_to_string(&index).unwrap();
    // A map entry for a tensor the shard lacks is fine when it is not an
    // expert's: converters list a tied `lm_head` and drop it from the shards.
    let tied = text.replacen(
        r#""lm_head.weight": "model-00001-of-00011.safetensors""#,
        r#""lm_head.weight": "model-00003-of-00011.safetensors""#,
        1,
    );
    assert_ne!(tied, text, "the fixture's index changed; update this test");
    std::fs::write(&index, &tied).unwrap();
    drop(Streamer::open(dir.path(), config()).unwrap());
    std::fs::write(&index, &text).unwrap();
    let moved = text.replacen(
        r#""model.layers.0.mlp.experts.0.gate_proj.weight": "model-00004-of-00011.safetensors""#,
        r#""model.layers.0.mlp.experts.0.gate_proj.weight": "model-00005-of-00011.safetensors""#,
        1,
    );
    assert_ne!(moved, text, "the fixture's index changed; update this test");
    std::fs::write(&index, moved).unwrap();
    let e = open_err(dir.path());
    assert!(
        e.contains("model.safetensors.index.json")
            && e.contains(
                "weight_map puts tensor model.layers.0.mlp.experts.0.gate_proj.weight in"
            )
            && e.contains("model-00005-of-00011.safetensors, which does not hold it"),
        "{e}"
    );
}

#[test]
fn a_safetensors_header_that_lies_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model.safetensors");
    let header = r#"{"model.layers.0.mlp.experts.0.up_proj.weight":{"dtype":"F32","shape":[2,2],"data_offsets":[0,4096]}}"#;
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(header.as_bytes());
    file.extend_from_slice(&[0u8; 16]);
    std::fs::write(&model, file).unwrap();
    let e = open_err(&model);
    assert!(
        e.contains("model.safetensors") && e.contains("data_offsets"),
        "{e}"
    );
    let e = open_err(dir.path());
    assert!(e.contains("model.safetensors"), "{e}");
}

#[test]
fn a_model_without_experts_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model.safetensors");
    let header =
        r#"{"model.embed_tokens.weight":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}}"#;
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(header.as_bytes());
    file.extend_from_slice(&[0u8; 16]);
    std::fs::write(&model, file).unwrap();
    let e = open_err(&model);
    assert!(e.contains("no expert tensors"), "{e}");
}

#[test]
fn a_fifo_a_device_and_an_unknown_file_are_refused_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("model.gguf");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let e = open_err(&fifo);
    assert!(e.contains("FIFO"), "{e}");
    let e = open_err(Path::new("/dev/null"));
    assert!(
        e.contains("/dev/null") && e.contains("character device"),
        "{e}"
    );
    let text = dir.path().join("notes.txt");
    std::fs::write(&text, "not a model at all").unwrap();
    let e = open_err(&text);
    assert!(
        e.contains("notes.txt") && e.contains("not a GGUF or safetensors"),
        "{e}"
    );
    let empty = tempfile::tempdir().unwrap();
    let e = open_err(empty.path());
    assert!(e.contains("experts.smoe"), "{e}");
}

/// A model file changed while open (its length or its modification time):
/// reads fail with an I/O error naming it, and no claim hands out bytes
/// read after the change. What was read before stays valid (it is the
/// model that was opened).
#[test]
fn a_model_changed_while_open_fails_its_reads() {
    for how in ["append", "touch"] {
        let dir = tempfile::tempdir().unwrap();
        let path = copy_fixture("qwen3moe-q8_0.gguf", dir.path());
        let s = Streamer::open(&path, config()).unwrap();
        drop(s.claim_wait(0, 0, WAIT).unwrap().unwrap());
        let f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        match how {
            "append" => {
                use std::io::Write;
                (&f).write_all(&[0u8; 10]).unwrap();
            }
            _ => f
                .set_modified(std::time::SystemTime::now() + Duration::from_secs(3600))
                .unwrap(),
        }
        drop(f);
        let e = s.claim_wait(1, 3, WAIT).unwrap_err();
        assert_eq!(e.kind(), smoe::ErrorKind::Io, "{how}: {e}");
        let text = e.to_string();
        assert!(
            text.contains("qwen3moe-q8_0.gguf") && text.contains("changed while open"),
            "{how}: {text}"
        );
        assert_eq!(s.stats().io_errors, 1, "{how}");
        // Retained before the change: still the model's bytes.
        assert!(s.claim(0, 0).unwrap().is_some(), "{how}");
    }
}

/// Nothing is written beside a model: its histogram goes to the cache
/// directory named by SMOE_CACHE_DIR, under the model's identity, which a
/// copy of the same file shares.
#[test]
fn the_histogram_of_a_model_lives_in_its_cache_directory() {
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("models");
    std::fs::create_dir(&models).unwrap();
    let path = copy_fixture("qwen3moe-q8_0.gguf", &models);
    let copy = dir.path().join("copy.gguf");
    std::fs::copy(&path, &copy).unwrap();
    let cache = dir.path().join("cache");
    // The process's environment is read at open; this binary's other tests
    // set freq_path, so they do not look at it.
    std::env::set_var("SMOE_CACHE_DIR", &cache);
    let cfg = Config {
        freq_path: None,
        ..config()
    };
    let s = Streamer::open(&path, cfg.clone()).unwrap();
    for e in 0..4 {
        drop(s.claim_wait(1, e, WAIT).unwrap().unwrap());
    }
    s.flush_stats().unwrap();
    drop(s);
    let listing: Vec<_> = std::fs::read_dir(&models).unwrap().collect();
    assert_eq!(listing.len(), 1, "only the model is in its directory");
    let id = smoe::vault::Vault::open(&path)
        .unwrap()
        .header()
        .vault_id_hex();
    let freq = cache.join("smoe").join(&id).join("expert_freq.bin");
    assert!(freq.is_file(), "{} is missing", freq.display());
    // The copy finds the same histogram: its first claims are known.
    let s = Streamer::open(&copy, cfg).unwrap();
    assert_eq!(s.vault().header().vault_id_hex(), id);
    assert!(
        s.warnings().iter().all(|w| !w.contains("expert_freq")),
        "{:?}",
        s.warnings()
    );
    std::env::remove_var("SMOE_CACHE_DIR");
}

/// `verify` on a model read in place has nothing to check: it says so.
#[test]
fn verify_on_a_model_says_nothing_is_verified() {
    let path = fixtures().join("qwen3moe-q8_0.gguf");
    let s = Streamer::open(
        &path,
        Config {
            verify: true,
            ..config()
        },
    )
    .unwrap();
    assert!(
        s.warnings()
            .iter()
            .any(|w| w.contains("verify is on") && w.contains("no checksums")),
        "{:?}",
        s.warnings()
    );
    let quiet = Streamer::open(&path, config()).unwrap();
    assert!(
        quiet.warnings().iter().all(|w| !w.contains("verify")),
        "{:?}",
        quiet.warnings()
    );
}

/// Experts of one layer must have the same slices: a per-expert checkpoint
/// whose expert 1 is F16 where expert 0 is F32 is refused, naming both.
#[test]
fn experts_of_a_layer_with_different_types_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model.safetensors");
    let header = r#"{"model.layers.0.mlp.experts.0.up_proj.weight":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},"model.layers.0.mlp.experts.1.up_proj.weight":{"dtype":"F16","shape":[2,4],"data_offsets":[16,32]}}"#;
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(header.as_bytes());
    file.extend_from_slice(&[0u8; 32]);
    std::fs::write(&model, file).unwrap();
    let e = open_err(&model);
    assert!(
        e.contains("experts.1.up_proj")
            && e.contains("F16")
            && e.contains("every expert of a layer"),
        "{e}"
    );
}

/// A split part changed while open fails the reads of the experts in it,
/// naming that part.
#[test]
fn a_split_part_changed_while_open_fails_its_reads() {
    let dir = tempfile::tempdir().unwrap();
    let parts = split_parts();
    for p in &parts {
        std::fs::copy(p, dir.path().join(p.file_name().unwrap())).unwrap();
    }
    let first = dir.path().join(parts[0].file_name().unwrap());
    let s = Streamer::open(&first, config()).unwrap();
    let files = s.vault().data_files();
    // Change every part but the first: whichever holds layer 1's experts
    // fails them.
    for f in &files[1..] {
        let h = std::fs::OpenOptions::new().append(true).open(f).unwrap();
        use std::io::Write;
        (&h).write_all(&[0u8; 7]).unwrap();
    }
    let e = s.claim_wait(1, 2, WAIT).unwrap_err();
    let text = e.to_string();
    assert!(text.contains("changed while open"), "{text}");
    assert!(
        files[1..]
            .iter()
            .any(|f| text.contains(&*f.file_name().unwrap().to_string_lossy())),
        "{text}"
    );
}

/// A model file replaced by a rename between the open of its headers and
/// the start of the streamer (the same length and modification time) is
/// refused: its bytes are not the model the table was built from.
#[test]
fn a_model_replaced_before_the_streamer_starts_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = copy_fixture("qwen3moe-q8_0.gguf", dir.path());
    let vault = Vault::open(&path).unwrap();
    let other = dir.path().join("other.gguf");
    let mut bytes = std::fs::read(&path).unwrap();
    let n = bytes.len();
    bytes[n - 100] ^= 0xff;
    std::fs::write(&other, &bytes).unwrap();
    let mtime = std::fs::metadata(&path).unwrap().modified().unwrap();
    std::fs::File::options()
        .write(true)
        .open(&other)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    std::fs::rename(&other, &path).unwrap();
    let e = match Streamer::with_vault(vault, config()) {
        Ok(_) => panic!("a replaced model file was streamed"),
        Err(e) => e,
    };
    assert_eq!(e.kind(), smoe::ErrorKind::Io, "{e}");
    assert!(e.to_string().contains("was replaced"), "{e}");
}

/// A Hugging Face cache whose blob is gone leaves a dangling link where
/// the model was (`snapshots/<rev>/model.safetensors -> ../../blobs/<sha>`):
/// the error names the link and the target it lacks, whether the link is
/// the checkpoint's file, its index, or a shard the index names; and
/// whether the directory or the link itself is given.
#[test]
fn a_dangling_model_link_is_named_with_its_missing_target() {
    let mut wrong = Vec::new();
    for (link, with_index) in [
        ("model.safetensors", false),
        ("model.safetensors.index.json", false),
        ("model-00001-of-00002.safetensors", true),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let target = "../../blobs/0123456789abcdef";
        std::os::unix::fs::symlink(target, dir.path().join(link)).unwrap();
        if with_index {
            std::fs::write(
                dir.path().join("model.safetensors.index.json"),
                format!(
                    r#"{{"weight_map":{{"model.layers.0.mlp.experts.0.up_proj.weight":"{link}"}}}}"#
                ),
            )
            .unwrap();
        }
        let given = [dir.path().to_path_buf(), dir.path().join(link)];
        for path in &given[..if with_index { 1 } else { 2 }] {
            let e = open_err(path);
            if !(e.contains(link) && e.contains(target) && e.contains("broken symbolic link")) {
                wrong.push(format!("{}: {e}", path.display()));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "the link and its target not named: {wrong:#?}"
    );
}

/// The environment variable that makes [`cache_dir_child`] open a model
/// with the histogram in its cache directory and print the warnings.
const CACHE_CHILD: &str = "SMOE_TEST_CACHE_DIR_CHILD";

/// Runs in a child process of
/// [`the_cache_directory_warnings_say_what_the_environment_holds`] (the
/// environment is the process's): opens the model `$CACHE_CHILD` names
/// and prints each warning on a line of its own.
#[test]
fn cache_dir_child() {
    let Some(model) = std::env::var_os(CACHE_CHILD) else {
        return;
    };
    let s = Streamer::open(
        Path::new(&model),
        Config {
            freq_path: None,
            ..config()
        },
    )
    .unwrap();
    // After the harness's "test ... " (no newline before the output).
    println!();
    for w in s.warnings() {
        println!("WARNING {w}");
    }
    println!("CHILD DONE");
}

/// A relative SMOE_CACHE_DIR is not used (the histogram would land
/// wherever the process runs), and the streamer says so, naming the
/// variable and its value; without HOME, the warning says which variable
/// was missing or relative, never that SMOE_CACHE_DIR is unset when it is
/// set.
#[test]
fn the_cache_directory_warnings_say_what_the_environment_holds() {
    let dir = tempfile::tempdir().unwrap();
    let model = copy_fixture("qwen3moe-q8_0.gguf", dir.path());
    let home = dir.path().join("home");
    let cwd = dir.path().join("cwd");
    std::fs::create_dir_all(&cwd).unwrap();
    let home_s = home.to_str().unwrap();
    // (SMOE_CACHE_DIR, HOME, what a warning must say, what none may say)
    type Case<'a> = (
        Option<&'a str>,
        Option<&'a str>,
        &'a [&'a str],
        &'a [&'a str],
    );
    let cases: [Case; 4] = [
        (
            Some("rel"),
            Some(home_s),
            &["SMOE_CACHE_DIR", "\"rel\"", "is relative; ignored"],
            &["will not be kept"],
        ),
        (
            Some("rel"),
            None,
            &[
                "will not be kept",
                "SMOE_CACHE_DIR",
                "\"rel\"",
                "relative",
                "HOME is not set",
            ],
            &["neither SMOE_CACHE_DIR nor HOME is set"],
        ),
        (
            None,
            Some("relative-home"),
            &["will not be kept", "HOME", "\"relative-home\"", "relative"],
            &["neither SMOE_CACHE_DIR nor HOME is set"],
        ),
        (
            None,
            None,
            &["will not be kept", "neither SMOE_CACHE_DIR nor HOME is set"],
            &[],
        ),
    ];
    let mut wrong = Vec::new();
    for (cache, home, must, must_not) in cases {
        let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
        cmd.args([
            "--exact",
            "in_place::cache_dir_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .current_dir(&cwd)
        .env(CACHE_CHILD, &model)
        .env_remove("SMOE_CACHE_DIR")
        .env_remove("XDG_CACHE_HOME")
        .env_remove("HOME");
        if let Some(c) = cache {
            cmd.env("SMOE_CACHE_DIR", c);
        }
        if let Some(h) = home {
            cmd.env("HOME", h);
        }
        let out = cmd.output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("CHILD DONE"),
            "child: {}\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let warnings: Vec<&str> = stdout
            .lines()
            .filter_map(|l| l.strip_prefix("WARNING "))
            .collect();
        let said = |n: &&str| warnings.iter().any(|w| w.contains(n));
        if !must.iter().all(said) || must_not.iter().any(said) {
            wrong.push(format!(
                "SMOE_CACHE_DIR {cache:?}, HOME {home:?}: {warnings:?}"
            ));
        }
    }
    // Nothing was made where the process ran.
    assert_eq!(std::fs::read_dir(&cwd).unwrap().count(), 0);
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// A safetensors file holding `tensors` (name, F32 shape), data a hole.
fn write_safetensors(path: &Path, tensors: &[(String, Vec<u64>)]) {
    let mut at = 0u64;
    let entries: Vec<String> = tensors
        .iter()
        .map(|(name, shape)| {
            let bytes = 4 * shape.iter().product::<u64>();
            let dims: Vec<String> = shape.iter().map(u64::to_string).collect();
            let e = format!(
                r#""{name}":{{"dtype":"F32","shape":[{}],"data_offsets":[{at},{}]}}"#,
                dims.join(","),
                at + bytes
            );
            at += bytes;
            e
        })
        .collect();
    let header = format!("{{{}}}", entries.join(","));
    let mut b = (header.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(header.as_bytes());
    std::fs::write(path, &b).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.set_len(b.len() as u64 + at).unwrap();
}

/// The 64 MiB cap on metadata holds for a model's as for a vault's: a 70
/// MiB `general.architecture`, a 40 MiB stacked tensor name (its role
/// and its name both go into the layout) and 600 layers of 60,000-byte
/// names (each under the cap on one string, 72 MB together) are refused,
/// naming the key or tensor, the size and the cap, not kept in memory
/// for the streamer's life and handed to C.
#[test]
fn a_model_whose_metadata_passes_64_mib_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut wrong = Vec::new();
    let mut check = |path: &Path, needles: &[&str]| match Vault::open(path) {
        Ok(v) => wrong.push(format!(
            "{}: opened, {} bytes of metadata",
            path.display(),
            v.meta().len()
        )),
        Err(e) => {
            let text = e.to_string();
            if !needles.iter().all(|n| text.contains(n)) || text.len() > 1000 {
                wrong.push(format!(
                    "{}: {}",
                    path.display(),
                    &text[..text.len().min(1000)]
                ));
            }
        }
    };
    let arch = dir.path().join("arch.gguf");
    write_gguf(
        &arch,
        &"a".repeat(70 << 20),
        &[],
        &[GgufTensor::new("blk.0.ffn_up_exps.weight", &[32, 2, 2], 0)],
        GgufData::Hole,
    );
    check(&arch, &["general.architecture", "73400320 bytes"]);

    let long = dir.path().join("long.safetensors");
    let name = format!("model.layers.0.mlp.experts.{}", "x".repeat(40 << 20));
    write_safetensors(&long, &[(name, vec![2, 2])]);
    check(&long, &["model.layers.0.mlp.experts.xxx", "41943067 bytes"]);

    let many = dir.path().join("many.safetensors");
    let tensors: Vec<(String, Vec<u64>)> = (0..600)
        .map(|l| {
            (
                format!("model.layers.{l}.mlp.experts.{}", "y".repeat(60_000)),
                vec![2, 2],
            )
        })
        .collect();
    write_safetensors(&many, &tensors);
    check(&many, &["67108864"]);
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// Rewrites the data of `path` in place (same inode, same length: the
/// last 4096 bytes inverted), then sets its modification time back to
/// `mtime`: a writer that hides its change from a check of the length
/// and the modification time. The status-change time (ctime) still
/// moves; it cannot be set back.
fn rewrite_in_place(path: &Path, mtime: std::time::SystemTime) {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let len = f.metadata().unwrap().len();
    let mut tail = vec![0u8; 4096];
    f.read_exact_at(&mut tail, len - 4096).unwrap();
    for b in &mut tail {
        *b = !*b;
    }
    f.write_all_at(&tail, len - 4096).unwrap();
    f.set_modified(mtime).unwrap();
    assert_eq!(f.metadata().unwrap().len(), len);
}

/// A model file rewritten while `smoe_open` reads its headers (here,
/// through the open's seam, right after the headers are read) is refused,
/// naming the file: its table would come from one file and its bytes from
/// another. Whether the rewrite changes the length or only the bytes,
/// with the modification time set back.
#[test]
fn a_model_rewritten_while_it_is_opened_is_refused() {
    let mut wrong = Vec::new();
    for how in ["append", "same size, mtime set back"] {
        let dir = tempfile::tempdir().unwrap();
        let path = copy_fixture("qwen3moe-q8_0.gguf", dir.path());
        // The kernel's clock for file times moves in ticks: let one pass
        // since the copy, so a rewrite gets another status-change time.
        std::thread::sleep(Duration::from_millis(50));
        let mtime = std::fs::metadata(&path).unwrap().modified().unwrap();
        let rewrite = || match how {
            "append" => {
                let f = std::fs::OpenOptions::new()
                    .append(true)
                    .open(&path)
                    .unwrap();
                f.write_all_at(&[0u8; 10], 0).unwrap();
            }
            _ => rewrite_in_place(&path, mtime),
        };
        match smoe::internals::model::open_in_place_observed(&path, &rewrite) {
            Ok(vault) => {
                let s = Streamer::with_vault(vault, config());
                wrong.push(format!(
                    "{how}: opened (a streamer on it: {})",
                    match s {
                        Ok(_) => "SMOE_OK".to_owned(),
                        Err(e) => e.to_string(),
                    }
                ));
            }
            Err(e) => {
                let text = e.to_string();
                if e.kind() != smoe::ErrorKind::Io
                    || !text.contains("qwen3moe-q8_0.gguf")
                    || !text.contains("changed while it was being opened")
                {
                    wrong.push(format!("{how}: {:?} {text}", e.kind()));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// A model file rewritten in place while open, with the same length and
/// its modification time set back, fails the reads after the change: its
/// status-change time (ctime) moved. Before the change, the expert read
/// is the model's.
#[test]
fn a_same_size_rewrite_with_its_mtime_set_back_fails_the_reads() {
    let dir = tempfile::tempdir().unwrap();
    let path = copy_fixture("qwen3moe-q8_0.gguf", dir.path());
    std::thread::sleep(Duration::from_millis(50));
    let mtime = std::fs::metadata(&path).unwrap().modified().unwrap();
    let s = Streamer::open(&path, config()).unwrap();
    drop(s.claim_wait(0, 0, WAIT).unwrap().unwrap());
    rewrite_in_place(&path, mtime);
    let claimed = s.claim_wait(1, 3, WAIT).map(|c| c.map_or(0, |c| c.len()));
    match claimed {
        Ok(n) => panic!("claimed {n} bytes of a file rewritten while open (SMOE_OK)"),
        Err(e) => {
            assert_eq!(e.kind(), smoe::ErrorKind::Io, "{e}");
            let text = e.to_string();
            assert!(
                text.contains("qwen3moe-q8_0.gguf") && text.contains("changed while open"),
                "{text}"
            );
        }
    }
}

/// Bytes a terminal acts on: C0 controls (ESC, BEL, NUL, VT, FF, newline
/// among them), DEL and the C1 controls (U+0080 to U+009F; CSI is U+009B).
fn raw_controls(text: &str) -> Vec<char> {
    text.chars().filter(|&c| c.is_control()).collect()
}

/// Names from a model reach an error line, `smoe_last_error()` and every
/// message escaped: a tensor name holding ESC, BEL, NUL, VT, FF, DEL, CSI
/// and a newline that forges a `slot layout` line is shown as `\x1b`,
/// `\x07`, `\x00`, `\x0b`, `\x0c`, `\x7f`, `\u{9b}`, `\x0a`, never as the
/// bytes a terminal would act on.
#[test]
fn names_from_a_model_are_escaped_in_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("evil.gguf");
    let name = "t\u{1b}[2J\u{7}\u{0}\u{b}\u{c}\u{7f}\u{9b}1m\nslot layout   x";
    assert!(name.len() <= 64, "a GGUF tensor name is at most 64 bytes");
    write_gguf(
        &path,
        "qwen3moe",
        &[],
        // GGML type 99 does not exist: the error names the tensor.
        &[GgufTensor {
            name: name.to_owned(),
            ne: vec![32],
            ggml_type: 99,
            bytes: 0,
        }],
        GgufData::Hole,
    );
    let e = open_err(&path);
    let c_path = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    let mut s: *mut smoe::ffi::smoe_streamer = std::ptr::null_mut();
    // SAFETY: a valid C string, NULL config (defaults) and a writable out.
    let st = unsafe { smoe::ffi::smoe_open(c_path.as_ptr(), std::ptr::null(), &mut s) };
    assert_ne!(st, smoe::ffi::smoe_status::SMOE_OK);
    // SAFETY: NUL-terminated, valid until this thread's next call.
    let last = unsafe { std::ffi::CStr::from_ptr(smoe::ffi::smoe_last_error()) }
        .to_string_lossy()
        .into_owned();
    let mut wrong = Vec::new();
    for (what, text) in [("Error", &e), ("smoe_last_error()", &last)] {
        let escaped = [
            "\\x1b[2J", "\\x07", "\\x00", "\\x0b", "\\x0c", "\\x7f", "\\u{9b}", "\\x0a",
        ];
        if !raw_controls(text).is_empty() || !escaped.iter().all(|x| text.contains(x)) {
            wrong.push(format!("{what}: {text:?}"));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// The environment variable that makes [`no_memory_child`] open a model
/// under an address-space limit.
const NO_MEMORY_CHILD: &str = "SMOE_TEST_NO_MEMORY_CHILD";

/// Runs in a child process of
/// [`smoe_open_under_a_memory_limit_fails_with_no_memory`]: limits its
/// own address space to what it uses plus 96 MiB, then `smoe_open`s the
/// model `$NO_MEMORY_CHILD` names and prints the status and the error.
#[test]
fn no_memory_child() {
    let Some(model) = std::env::var_os(NO_MEMORY_CHILD) else {
        return;
    };
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let vm_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmSize:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap();
    let limit = (vm_kib << 10) + (96 << 20);
    let rl = libc::rlimit {
        rlim_cur: limit,
        rlim_max: limit,
    };
    // SAFETY: a plain struct, read by the call.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_AS, &rl) }, 0);
    let c_path = std::ffi::CString::new(model.into_encoded_bytes()).unwrap();
    let mut s: *mut smoe::ffi::smoe_streamer = std::ptr::null_mut();
    // SAFETY: a valid C string, NULL config (defaults) and a writable out.
    let st = unsafe { smoe::ffi::smoe_open(c_path.as_ptr(), std::ptr::null(), &mut s) };
    // SAFETY: NUL-terminated, valid until this thread's next call.
    let last = unsafe { std::ffi::CStr::from_ptr(smoe::ffi::smoe_last_error()) }
        .to_string_lossy()
        .into_owned();
    println!();
    println!("CHILD {st:?} {last}");
}

/// `smoe_open` of a header that needs more memory than the process may
/// have (a 200 MiB GGUF string value, under a limit 96 MiB above what it
/// uses) returns `SMOE_ERR_NO_MEMORY` naming the file: a failed
/// allocation must not abort the host.
#[test]
fn smoe_open_under_a_memory_limit_fails_with_no_memory() {
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big-string.gguf");
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes());
    b.extend_from_slice(&1u64.to_le_bytes());
    b.extend_from_slice(&12u64.to_le_bytes());
    b.extend_from_slice(b"general.name");
    b.extend_from_slice(&8u32.to_le_bytes());
    b.extend_from_slice(&(200u64 << 20).to_le_bytes());
    std::fs::write(&path, &b).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(b.len() as u64 + (200 << 20)).unwrap();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "in_place::no_memory_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(NO_MEMORY_CHILD, &path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let said = stdout
        .lines()
        .find(|l| l.starts_with("CHILD "))
        .unwrap_or_default();
    assert!(
        out.status.signal().is_none()
            && said.contains("SMOE_ERR_NO_MEMORY")
            && said.contains("big-string.gguf"),
        "child: {} {said:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
            .lines()
            .take(3)
            .collect::<Vec<_>>()
            .join("\n")
    );
}
