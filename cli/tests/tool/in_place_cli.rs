//! The tool on a model opened in place (SPEC §6, issue 34 point 5):
//! `inspect`, `verify`, `budget` and `bench` (scan, decode, trace replay
//! with the mmap baseline, sweep) on a GGUF, a split GGUF and a sharded
//! safetensors model from `tests/fixtures/models`, checked against
//! `EXPECTED.json` (written by the formats' own Python readers) and against
//! each other; a read-only model directory gains nothing; a file that is
//! not a model, or not a regular file, is one line and exit 1.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::{assert_contains, text};

/// What `smoe verify` prints first for a model.
const NO_CHECKSUMS: &str =
    "no checksums: a GGUF/safetensors model carries none; use `smoe pack` for checksummed blobs";

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/models")
}

fn expected() -> Value {
    let text = std::fs::read_to_string(fixtures().join("EXPECTED.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The fixtures every test runs on: a GGUF, a split GGUF (given by its
/// first part) and a sharded safetensors model (given by its directory),
/// by their names in `EXPECTED.json`; and one whose item offsets are not
/// multiples of 256 (safetensors, 8-byte aligned).
const MODELS: [&str; 4] = [
    "qwen3moe-q8_0",
    "qwen3moe-q8_0-split",
    "qwen2moe-f32-sharded",
    "mixtral-bf16",
];

/// The path a fixture is given by (its `source` in `EXPECTED.json`).
fn source(fx: &Value) -> PathBuf {
    fixtures().join(fx["source"].as_str().unwrap())
}

/// Runs `smoe ARGS...` with the histogram cache in `cache`, to its end or
/// at most 60 s (a FIFO must never block it): killed then, and the test
/// fails.
fn smoe_in(cache: &Path, args: &[&std::ffi::OsStr]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_smoe"))
        .args(args)
        .env("SMOE_CACHE_DIR", cache)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the smoe binary runs");
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("smoe {args:?} did not end within 60 s");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    child.wait_with_output().unwrap()
}

/// [`smoe_in`] with string arguments and a path first after the command.
fn run(cache: &Path, cmd: &[&str], path: &Path, extra: &[&str]) -> Output {
    let mut args: Vec<&std::ffi::OsStr> = cmd.iter().map(std::ffi::OsStr::new).collect();
    args.push(path.as_os_str());
    args.extend(extra.iter().map(std::ffi::OsStr::new));
    smoe_in(cache, &args)
}

/// Stdout of a run that must succeed with nothing on stderr but the
/// streamer's first-run histogram warning.
#[track_caller]
fn ok(out: &Output) -> String {
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    for line in stderr.lines() {
        assert!(
            line.contains("no histogram yet"),
            "unexpected stderr line: {line}"
        );
    }
    text(&out.stdout)
}

#[track_caller]
fn json_of(out: &Output) -> Value {
    serde_json::from_str(&ok(out)).expect("stdout is one JSON object")
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("{v} is not a u64"))
}

/// The bytes one load of `entry` reads (from `inspect --json`): each
/// window, up to its file's end.
fn entry_read_bytes(entry: &Value, files: &[Value]) -> u64 {
    entry["reads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let len = u(&files[u(&r["file"]) as usize]["bytes"]);
            u(&r["len"]).min(len - u(&r["offset"]))
        })
        .sum()
}

/// A fixture's `inspect --json`, checked against `EXPECTED.json`: the
/// shape, the files, every layer's items (dtype, shape, bytes) inside the
/// slot, the reads of each expert (aligned, inside the slot) covering each
/// of its slices where `EXPECTED.json` says it is, the dense bytes and the
/// metadata.
fn check_inspect(name: &str, fx: &Value, cache: &Path) -> Value {
    let j = json_of(&run(cache, &["inspect", "--json"], &source(fx), &[]));
    let keys: BTreeSet<&str> = j.as_object().unwrap().keys().map(String::as_str).collect();
    let want: BTreeSet<&str> = [
        "model",
        "n_layers",
        "n_experts",
        "n_entries",
        "vault_id",
        "meta",
        "entries",
    ]
    .into();
    assert_eq!(keys, want, "{name}");
    let gguf = fx["format"] == "gguf";
    let model = &j["model"];
    assert_eq!(model["kind"], fx["format"], "{name}");
    // Files: the fixture's, in order, with their sizes.
    let files = model["files"].as_array().unwrap();
    let want_files: Vec<(String, u64)> = fx["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            let p = Path::new(f["path"].as_str().unwrap());
            (
                p.file_name().unwrap().to_string_lossy().into(),
                u(&f["size"]),
            )
        })
        .collect();
    let got_files: Vec<(String, u64)> = files
        .iter()
        .map(|f| {
            let p = Path::new(f["path"].as_str().unwrap());
            (
                p.file_name().unwrap().to_string_lossy().into(),
                u(&f["bytes"]),
            )
        })
        .collect();
    assert_eq!(got_files, want_files, "{name}");
    // Shape.
    let layers: Vec<u64> = fx["expert_layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(u)
        .collect();
    let n_experts = u(&fx["n_experts"]);
    assert_eq!(u(&j["n_layers"]), u(&fx["n_layers"]), "{name}");
    assert_eq!(u(&j["n_experts"]), n_experts, "{name}");
    assert_eq!(
        u(&j["n_entries"]),
        layers.len() as u64 * n_experts,
        "{name}"
    );
    assert_eq!(j["meta"]["format"], "smoe-model", "{name}");
    assert_eq!(j["meta"]["source"]["kind"], fx["format"], "{name}");
    // Dense bytes: every tensor the Python reader says is not an expert's.
    let dense: u64 = fx["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["expert"] == false)
        .map(|t| u(&t["nbytes"]))
        .sum();
    assert_eq!(u(&model["dense_bytes"]), dense, "{name}");
    let histogram = model["histogram"].as_str().unwrap();
    assert!(
        Path::new(histogram).starts_with(cache),
        "{name}: the histogram {histogram} is not in the cache {}",
        cache.display()
    );
    // Layers: each role's dtype, shape and bytes; inside the slot.
    let model_layers = model["layers"].as_array().unwrap();
    let got_layers: Vec<u64> = model_layers.iter().map(|l| u(&l["layer"])).collect();
    assert_eq!(got_layers, layers, "{name}");
    let mut items_of: BTreeMap<u64, &Value> = BTreeMap::new();
    for l in model_layers {
        let layer = u(&l["layer"]);
        let (slot, data) = (u(&l["slot_bytes"]), u(&l["data_bytes"]));
        assert_eq!(slot % 4096, 0, "{name} layer {layer}");
        assert!(data <= slot, "{name} layer {layer}");
        let roles = &fx["layer_roles"][layer.to_string()];
        let items = l["items"].as_array().unwrap();
        assert_eq!(
            items.len(),
            roles.as_object().unwrap().len(),
            "{name} layer {layer}"
        );
        for item in items {
            let role = &roles[item["role"].as_str().unwrap()];
            assert_eq!(item["dtype"], role["dtype"], "{name} layer {layer} {item}");
            assert_eq!(u(&item["bytes"]), u(&role["nbytes"]), "{name} {item}");
            // GGUF shapes in EXPECTED.json are ggml's ne (ne0 first); the
            // layout's are row-major.
            let mut shape: Vec<u64> = role["shape"].as_array().unwrap().iter().map(u).collect();
            if gguf {
                shape.reverse();
            }
            let got: Vec<u64> = item["shape"].as_array().unwrap().iter().map(u).collect();
            assert_eq!(got, shape, "{name} layer {layer} {item}");
            assert!(
                u(&item["offset"]) + u(&item["bytes"]) <= data,
                "{name} {item}"
            );
        }
        items_of.insert(layer, l);
    }
    // Entries: aligned reads inside the slot, as many as the layer says.
    let entries = j["entries"].as_array().unwrap();
    assert_eq!(entries.len() as u64, u(&j["n_entries"]), "{name}");
    let mut by_id: BTreeMap<(u64, u64), &Value> = BTreeMap::new();
    for e in entries {
        let (layer, expert) = (u(&e["layer"]), u(&e["expert"]));
        let l = items_of[&layer];
        assert_eq!(u(&e["padded_size"]), u(&l["slot_bytes"]), "{name} {e}");
        assert_eq!(u(&e["size"]), u(&l["data_bytes"]), "{name} {e}");
        let reads = e["reads"].as_array().unwrap();
        assert_eq!(reads.len() as u64, u(&l["reads_per_expert"]), "{name} {e}");
        for r in reads {
            assert!((u(&r["file"]) as usize) < files.len(), "{name} {r}");
            for k in ["offset", "len", "slot"] {
                assert_eq!(u(&r[k]) % 4096, 0, "{name} {k} of {r}");
            }
            assert!(
                u(&r["slot"]) + u(&r["len"]) <= u(&e["padded_size"]),
                "{name} {r}"
            );
        }
        by_id.insert((layer, expert), e);
    }
    // Every slice where the Python reader found it: the entry's offset is
    // its first slice's; a window of the right file covers each slice; an
    // expert whose load moves nothing has each item where its window put it.
    let mut first_seen = BTreeSet::new();
    for s in fx["expert_slices"].as_array().unwrap() {
        let (layer, expert) = (u(&s["layer"]), u(&s["expert"]));
        let e = by_id[&(layer, expert)];
        let (offset, n) = (u(&s["offset"]), u(&s["nbytes"]));
        if first_seen.insert((layer, expert)) {
            assert_eq!(u(&e["offset"]), offset, "{name}: first slice of {e}");
        }
        let file = Path::new(s["file"].as_str().unwrap()).file_name().unwrap();
        let index = got_files
            .iter()
            .position(|(f, _)| f.as_str() == file.to_str().unwrap())
            .unwrap();
        let window = e["reads"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| {
                u(&r["file"]) as usize == index
                    && u(&r["offset"]) <= offset
                    && offset + n <= u(&r["offset"]) + u(&r["len"])
            })
            .unwrap_or_else(|| panic!("{name}: no read of {e} covers the slice {s}"));
        if u(&e["moved_bytes"]) == 0 {
            let item = items_of[&layer]["items"]
                .as_array()
                .unwrap()
                .iter()
                .find(|i| i["role"] == s["role"])
                .unwrap();
            assert_eq!(
                u(&window["slot"]) + offset - u(&window["offset"]),
                u(&item["offset"]),
                "{name}: {s} lands at its item's slot offset"
            );
        }
    }
    assert_eq!(first_seen.len(), entries.len(), "{name}");
    j
}

#[test]
fn inspect_shows_each_model_opened_in_place() {
    let expected = expected();
    let cache = tempfile::tempdir().unwrap();
    for name in MODELS {
        let fx = &expected["fixtures"][name];
        let j = check_inspect(name, fx, cache.path());
        let human = ok(&run(cache.path(), &["inspect"], &source(fx), &[]));
        let kind = if fx["format"] == "gguf" {
            "GGUF"
        } else {
            "safetensors"
        };
        assert_contains(
            &human,
            &format!("kind          {kind} model, opened in place"),
        );
        let n_files = fx["files"].as_array().unwrap().len();
        assert_contains(&human, &format!("files         {n_files} file"));
        for f in fx["files"].as_array().unwrap() {
            let file = Path::new(f["path"].as_str().unwrap()).file_name().unwrap();
            assert_contains(
                &human,
                &format!("{}  {} bytes", file.to_str().unwrap(), u(&f["size"])),
            );
        }
        assert_contains(&human, "checksums     none");
        assert_contains(
            &human,
            &format!("vault_id      {}", j["vault_id"].as_str().unwrap()),
        );
        let l = &j["model"]["layers"][0];
        let reads = u(&l["reads_per_expert"]);
        assert_contains(
            &human,
            &format!(
                "slot layout   layer{} 0",
                if human.contains("layers 0-") { "s" } else { "" }
            ),
        );
        assert_contains(
            &human,
            &format!(
                "(slot {} bytes, data {} bytes, {reads} read{} per expert)",
                u(&l["slot_bytes"]),
                u(&l["data_bytes"]),
                if reads == 1 { "" } else { "s" }
            ),
        );
        let item = &l["items"][0];
        assert_contains(
            &human,
            &format!("{} bytes at {}\n", u(&item["bytes"]), u(&item["offset"])),
        );
    }
    // The safetensors fixture places items at offsets that are not
    // multiples of 256: the layout reader accepts them for a model.
    let fx = &expected["fixtures"]["mixtral-bf16"];
    let j = check_inspect("mixtral-bf16", fx, cache.path());
    assert!(
        j["model"]["layers"][0]["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|i| u(&i["offset"]) % 256 != 0),
        "{j}"
    );
    // A sharded model by its index is the same model as by its directory.
    let dir = source(&expected["fixtures"]["qwen2moe-f32-sharded"]);
    let by_dir = json_of(&run(cache.path(), &["inspect", "--json"], &dir, &[]));
    let by_index = json_of(&run(
        cache.path(),
        &["inspect", "--json"],
        &dir.join("model.safetensors.index.json"),
        &[],
    ));
    assert_eq!(by_dir, by_index);
}

#[test]
fn verify_reads_every_expert_through_the_read_path_and_scan_agrees() {
    let expected = expected();
    let cache = tempfile::tempdir().unwrap();
    for name in MODELS {
        let fx = &expected["fixtures"][name];
        let j = check_inspect(name, fx, cache.path());
        let files = j["model"]["files"].as_array().unwrap();
        let entries = j["entries"].as_array().unwrap();
        let read: u64 = entries.iter().map(|e| entry_read_bytes(e, files)).sum();
        let moved: u64 = entries.iter().map(|e| u(&e["moved_bytes"])).sum();
        let items: u64 = entries
            .iter()
            .map(|e| {
                let l = j["model"]["layers"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|l| l["layer"] == e["layer"])
                    .unwrap();
                l["items"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|i| u(&i["bytes"]))
                    .sum::<u64>()
            })
            .sum();

        let out = run(cache.path(), &["verify"], &source(fx), &[]);
        let stdout = text(&out.stdout);
        assert!(out.status.success(), "{name}: {}", text(&out.stderr));
        assert!(out.stderr.is_empty(), "{name}: {}", text(&out.stderr));
        let mut lines = stdout.lines();
        assert_eq!(lines.next(), Some(NO_CHECKSUMS), "{name}");
        let summary = lines.next().unwrap();
        assert_eq!(lines.next(), None, "{name}: {stdout}");
        let n_layers = j["model"]["layers"].as_array().unwrap().len();
        assert_contains(
            summary,
            &format!(
                "read {} experts ({n_layers} layers × {} experts) of ",
                entries.len(),
                u(&j["n_experts"])
            ),
        );
        let n_files = files.len();
        assert_contains(
            summary,
            &format!(
                "({} model, {n_files} file{}) through the library's read path: {read} bytes read",
                fx["format"].as_str().unwrap(),
                if n_files == 1 { "" } else { "s" }
            ),
        );
        assert_contains(
            summary,
            &format!("{moved} bytes moved in the slot, {items} bytes of items"),
        );
        assert!(
            summary.ends_with("every read complete, every item inside its slot"),
            "{summary}"
        );

        // The streamer reads every expert once, the same windows.
        let scan = json_of(&run(
            cache.path(),
            &["bench"],
            &source(fx),
            &["--mode", "scan", "--json"],
        ));
        assert_eq!(scan["mode"], "scan");
        assert_eq!(u(&scan["experts"]), entries.len() as u64, "{name}: {scan}");
        assert_eq!(u(&scan["bytes_read"]), read, "{name}: {scan}");
        assert_eq!(u(&scan["bytes_moved"]), moved, "{name}: {scan}");
        assert_eq!(
            u(&scan["ring_slots"]),
            entries.len() as u64,
            "{name}: {scan}"
        );
    }
}

#[test]
fn bench_decodes_captures_and_replays_a_model_with_the_mmap_baseline() {
    let expected = expected();
    let cache = tempfile::tempdir().unwrap();
    let out_dir = tempfile::tempdir().unwrap();
    for name in [
        "qwen3moe-q8_0",
        "qwen3moe-q8_0-split",
        "qwen2moe-f32-sharded",
    ] {
        let fx = &expected["fixtures"][name];
        let model = source(fx);
        let layers = fx["expert_layers"].as_array().unwrap().len() as u64;
        let trace = out_dir.path().join(format!("{name}.csv"));
        let t = trace.to_str().unwrap();
        let decode = json_of(&run(
            cache.path(),
            &["bench"],
            &model,
            &[
                "--tokens",
                "6",
                "--ring-slots",
                "4",
                "--capture",
                t,
                "--json",
            ],
        ));
        // The metadata's top_k (2 for every fixture here).
        assert_eq!(decode["top_k_from"], "metadata", "{name}: {decode}");
        assert_eq!(u(&decode["top_k"]), 2, "{name}");
        assert_eq!(u(&decode["claims"]), 6 * layers * 2, "{name}: {decode}");
        assert_eq!(u(&decode["working_set"]["layers"]), layers, "{name}");
        assert!(u(&decode["bytes_read"]) > 0, "{name}: {decode}");
        assert!(trace.is_file(), "{name}: no trace captured");

        let replay = json_of(&run(
            cache.path(),
            &["bench"],
            &model,
            &[
                "--trace",
                t,
                "--ring-slots",
                "4",
                "--baseline",
                "mmap",
                "--json",
            ],
        ));
        assert_eq!(u(&replay["tokens"]), 6, "{name}: {replay}");
        assert_eq!(replay["claims"], decode["claims"], "{name}: {replay}");
        // The same claims on the same ring under LRU: the same hits.
        assert_eq!(replay["hits"], decode["hits"], "{name}: {replay}");
        assert_eq!(replay["baseline"]["kind"], "mmap", "{name}: {replay}");
        let model_bytes: u64 = fx["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| u(&f["size"]))
            .sum();
        assert_eq!(u(&replay["baseline"]["vault_bytes"]), model_bytes, "{name}");
        assert!(replay["ratio"].as_f64().is_some(), "{name}: {replay}");

        let sweep = json_of(&run(
            cache.path(),
            &["bench"],
            &model,
            &["--trace", t, "--sweep", "--json"],
        ));
        assert_eq!(u(&sweep["claims"]), 6 * layers * 2, "{name}: {sweep}");
        assert_eq!(
            u(&sweep["experts"]),
            layers * u(&fx["n_experts"]),
            "{name}: {sweep}"
        );

        // The text says the same.
        let human = ok(&run(
            cache.path(),
            &["bench"],
            &model,
            &["--trace", t, "--ring-slots", "4", "--baseline", "mmap"],
        ));
        assert_contains(&human, "decode: 6 tokens × ");
        assert_contains(&human, "\nmmap ");
    }
}

#[test]
fn budget_sizes_the_ring_for_a_model() {
    let expected = expected();
    let cache = tempfile::tempdir().unwrap();
    for name in [
        "qwen3moe-q8_0",
        "qwen3moe-q8_0-split",
        "qwen2moe-f32-sharded",
    ] {
        let fx = &expected["fixtures"][name];
        let inspect = check_inspect(name, fx, cache.path());
        let b = json_of(&run(cache.path(), &["budget", "--json"], &source(fx), &[]));
        assert_eq!(b["entries"], inspect["n_entries"], "{name}");
        // The slot: the largest padded size rounded up to 16 KiB.
        let largest = inspect["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| u(&e["padded_size"]))
            .max()
            .unwrap();
        assert_eq!(
            u(&b["slot_bytes"]),
            largest.next_multiple_of(16384),
            "{name}: {b}"
        );
        // The resident weights: the model's non-expert tensors.
        assert_eq!(
            b["scout_bytes"], inspect["model"]["dense_bytes"],
            "{name}: {b}"
        );
        assert_contains(
            b["sources"]["scout"].as_str().unwrap(),
            "non-expert tensors",
        );
        // The ring holds every expert of so small a model.
        assert_eq!(b["slots"], inspect["n_entries"], "{name}: {b}");
        assert_eq!(
            u(&b["ring_bytes"]),
            u(&b["slots"]) * u(&b["slot_bytes"]),
            "{name}"
        );
        assert_eq!(b["model"]["kind"], fx["format"], "{name}: {b}");
        let files: Vec<&str> = b["model"]["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f.as_str().unwrap())
            .collect();
        assert_eq!(files.len(), fx["files"].as_array().unwrap().len(), "{name}");
        assert_eq!(b["model"]["given"], source(fx).to_str().unwrap(), "{name}");

        let human = ok(&run(cache.path(), &["budget"], &source(fx), &[]));
        assert_contains(
            &human,
            &format!(
                "model             {}: a {} model opened in place, {} file",
                source(fx).display(),
                fx["format"].as_str().unwrap(),
                files.len()
            ),
        );
        assert_contains(
            &human,
            &format!("scout             {} bytes", b["scout_bytes"]),
        );
    }
}

/// Every file under `dir` with its size, modification time and mode, and
/// every directory: what a command that writes nothing leaves as it was.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, (u64, i64, i64, u32)> {
    let mut all = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let m = std::fs::symlink_metadata(&d).unwrap();
        all.insert(d.clone(), (0, m.mtime(), m.mtime_nsec(), m.mode()));
        for entry in std::fs::read_dir(&d).unwrap() {
            let p = entry.unwrap().path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            if m.is_dir() {
                todo.push(p);
            } else {
                all.insert(p, (m.len(), m.mtime(), m.mtime_nsec(), m.mode()));
            }
        }
    }
    all
}

/// `dir` and everything in it made read-only (as root this stops nothing:
/// the snapshot is what shows a write).
fn make_read_only(dir: &Path) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let p = entry.unwrap().path();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o444)).unwrap();
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o555)).unwrap();
}

#[test]
fn nothing_is_written_beside_a_read_only_model() {
    let expected = expected();
    let root = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let outputs = tempfile::tempdir().unwrap();
    for name in [
        "qwen3moe-q8_0",
        "qwen3moe-q8_0-split",
        "qwen2moe-f32-sharded",
    ] {
        let fx = &expected["fixtures"][name];
        // A copy of the model's files in a directory of its own.
        let dir = root.path().join(name);
        std::fs::create_dir(&dir).unwrap();
        let src = source(fx);
        let src_dir = if src.is_dir() {
            src.clone()
        } else {
            src.parent().unwrap().to_path_buf()
        };
        let wanted: Vec<String> = fx["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| {
                let p = Path::new(f["path"].as_str().unwrap());
                p.file_name().unwrap().to_string_lossy().into_owned()
            })
            .collect();
        for entry in std::fs::read_dir(&src_dir).unwrap() {
            let p = entry.unwrap().path();
            let file = p.file_name().unwrap().to_string_lossy().into_owned();
            if src.is_dir() || wanted.contains(&file) {
                std::fs::copy(&p, dir.join(&file)).unwrap();
            }
        }
        let model = if src.is_dir() {
            dir.clone()
        } else {
            dir.join(src.file_name().unwrap())
        };
        make_read_only(&dir);
        let before = snapshot(root.path());
        let trace = outputs.path().join(format!("{name}.csv"));
        let t = trace.to_str().unwrap();
        let plot = outputs.path().join(format!("{name}.svg"));
        let p = plot.to_str().unwrap();
        let runs: Vec<(&[&str], Vec<&str>)> = vec![
            (&["inspect"], vec![]),
            (&["inspect", "--json"], vec![]),
            (&["verify"], vec![]),
            (&["budget"], vec![]),
            (&["budget", "--json"], vec![]),
            (&["bench"], vec!["--mode", "scan"]),
            (&["bench"], vec!["--tokens", "4", "--capture", t]),
            (
                &["bench"],
                vec![
                    "--trace",
                    t,
                    "--baseline",
                    "mmap",
                    "--ring-slots",
                    "4",
                    "--plot",
                    p,
                ],
            ),
            (&["bench"], vec!["--trace", t, "--sweep"]),
        ];
        for (cmd, extra) in &runs {
            ok(&run(cache.path(), cmd, &model, extra));
        }
        assert_eq!(
            snapshot(root.path()),
            before,
            "{name}: a command wrote beside the model"
        );
        assert!(trace.is_file() && plot.is_file(), "{name}: outputs missing");
        // The histogram went to the cache, under the model's identity.
        let j = json_of(&run(cache.path(), &["inspect", "--json"], &model, &[]));
        let id = j["vault_id"].as_str().unwrap();
        let histogram = cache.path().join("smoe").join(id).join("expert_freq.bin");
        assert!(histogram.is_file(), "{name}: no {}", histogram.display());
        assert_eq!(j["model"]["histogram"], histogram.to_str().unwrap());
    }
}

#[test]
fn an_output_never_replaces_a_file_of_the_model() {
    let expected = expected();
    let root = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let fx = &expected["fixtures"]["qwen2moe-f32-sharded"];
    let dir = root.path().join("m");
    std::fs::create_dir(&dir).unwrap();
    for entry in std::fs::read_dir(source(fx)).unwrap() {
        let p = entry.unwrap().path();
        std::fs::copy(&p, dir.join(p.file_name().unwrap())).unwrap();
    }
    let before = snapshot(&dir);
    let trace = root.path().join("t.csv");
    std::fs::write(&trace, "token,layer,r0\n0,0,1\n0,1,2\n").unwrap();
    let shard = dir.join("model-00005-of-00011.safetensors");
    let s = shard.to_str().unwrap();
    let t = trace.to_str().unwrap();
    for extra in [
        vec!["--tokens", "2", "--capture", s],
        vec!["--trace", t, "--plot", s],
    ] {
        let out = run(cache.path(), &["bench"], &dir, &extra);
        assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
        let stderr = text(&out.stderr);
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert_contains(&stderr, &format!("is a file of the model {s}"));
    }
    // --check-seed checks a synthetic vault's bytes: refused for a model.
    let out = run(cache.path(), &["bench"], &dir, &["--check-seed", "1"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert_contains(&text(&out.stderr), "is a model opened in place");
    assert_eq!(snapshot(&dir), before);
}

/// Asserts exit 1 with exactly one `smoe: ` line on stderr naming `named`,
/// nothing on stdout and no panic.
#[track_caller]
fn one_line_exit_1(out: &Output, named: &Path, what: &str) {
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{what}: {stderr}");
    assert!(out.stdout.is_empty(), "{what}: {}", text(&out.stdout));
    assert_eq!(stderr.lines().count(), 1, "{what}: {stderr}");
    assert!(stderr.starts_with("smoe: "), "{what}: {stderr}");
    assert!(!stderr.contains("panicked"), "{what}: {stderr}");
    assert_contains(&stderr, &named.display().to_string());
}

#[test]
fn a_file_that_is_not_a_model_is_one_line_and_exit_1() {
    let dir = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let notes = dir.path().join("notes.txt");
    std::fs::write(&notes, "not a model\n").unwrap();
    let junk = dir.path().join("junk.safetensors");
    std::fs::write(&junk, [0xffu8; 100]).unwrap();
    let empty = dir.path().join("empty.gguf");
    std::fs::write(&empty, b"").unwrap();
    let truncated = dir.path().join("truncated.gguf");
    let whole = std::fs::read(fixtures().join("qwen3moe-q8_0.gguf")).unwrap();
    std::fs::write(&truncated, &whole[..whole.len() / 2]).unwrap();
    let fifo = dir.path().join("pipe.gguf");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: `c` is a NUL-terminated path that outlives the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let part2 = fixtures().join("qwen3moe-q8_0-split/qwen3moe-q8_0-split-00002-of-00004.gguf");
    let config = fixtures().join("mixtral-bf16/config.json");
    let commands: [(&[&str], &[&str]); 6] = [
        (&["inspect"], &[]),
        (&["inspect", "--json"], &[]),
        (&["verify"], &[]),
        (&["budget"], &[]),
        (&["bench"], &["--tokens", "2"]),
        (&["bench"], &["--mode", "scan"]),
    ];
    for path in [&notes, &junk, &empty, &truncated, &fifo, &part2, &config] {
        for (cmd, extra) in commands {
            let out = run(cache.path(), cmd, path, extra);
            one_line_exit_1(&out, path, &format!("{cmd:?} {}", path.display()));
        }
    }
    // What each says.
    let says = |path: &Path| text(&run(cache.path(), &["verify"], path, &[]).stderr);
    assert_contains(&says(&notes), "not a GGUF or safetensors model");
    assert_contains(&says(&fifo), "is a FIFO");
    assert_contains(&says(&part2), "give the first part");
    assert_contains(&says(&truncated), "truncated.gguf");
}

/// A GGUF file of one stacked expert tensor (F32, 2 experts), its data a
/// hole, whose architecture is `arch`.
fn write_tiny_gguf(path: &Path, arch: &str, tensor: &str, ggml_type: u32) {
    use smoe_test_support::models::{write_gguf, GgufData, GgufTensor};
    write_gguf(
        path,
        arch,
        &[],
        &[GgufTensor {
            name: tensor.to_owned(),
            ne: vec![32, 2, 2],
            ggml_type,
            bytes: if ggml_type == 0 { 32 * 2 * 2 * 4 } else { 0 },
        }],
        GgufData::Hole,
    );
}

/// Characters a terminal acts on (C0, DEL, C1), other than the newline
/// ending each line.
fn raw_controls(text: &str) -> Vec<char> {
    text.chars()
        .filter(|&c| c.is_control() && c != '\n')
        .collect()
}

/// Names from a model (its file name, its architecture, a stacked
/// tensor's role, a tensor name in an error) holding ESC, BEL, NUL, VT,
/// FF, DEL, CSI and a newline reach `smoe inspect`'s text and JSON and
/// its error line escaped: no byte a terminal acts on, no forged
/// `slot layout` line, one `smoe:` line.
#[test]
fn inspect_escapes_names_from_a_model() {
    let dir = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let evil =
        "\u{1b}]0;pwned\u{7}\u{0}\u{b}\u{c}\u{7f}\u{9b}31m\nslot layout   layers 0-99 (forged)";
    let mut wrong = Vec::new();
    let forged = |out: &str| out.lines().filter(|l| l.starts_with("slot layout")).count();

    // A GGUF whose file name and architecture hold them.
    let gguf = dir
        .path()
        .join(format!("m{}.gguf", evil.replace('\u{0}', "")));
    write_tiny_gguf(&gguf, evil, "blk.0.ffn_up_exps.weight", 0);
    let out = run(cache.path(), &["inspect"], &gguf, &[]);
    let stdout = text(&out.stdout);
    if !out.status.success() || !raw_controls(&stdout).is_empty() || forged(&stdout) != 1 {
        wrong.push(format!(
            "inspect GGUF: {} {stdout:?} {}",
            out.status,
            text(&out.stderr)
        ));
    }
    let out = run(cache.path(), &["inspect", "--json"], &gguf, &[]);
    let stdout = text(&out.stdout);
    let parsed: Result<Value, _> = serde_json::from_str(&stdout);
    if !out.status.success()
        || !raw_controls(&stdout).is_empty()
        || parsed.map_or(true, |v| v["meta"]["arch"] != evil)
    {
        wrong.push(format!("inspect --json GGUF: {} {stdout:?}", out.status));
    }

    // A safetensors stacked expert whose role (its own name) holds them.
    let st = dir.path().join("st");
    std::fs::create_dir(&st).unwrap();
    let role = evil.replace('.', "");
    let header = serde_json::json!({
        format!("model.layers.0.mlp.experts.{role}"):
            {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}
    })
    .to_string();
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(&[0u8; 16]);
    std::fs::write(st.join("model.safetensors"), bytes).unwrap();
    let out = run(cache.path(), &["inspect"], &st, &[]);
    let stdout = text(&out.stdout);
    if !out.status.success() || !raw_controls(&stdout).is_empty() || forged(&stdout) != 1 {
        wrong.push(format!(
            "inspect safetensors: {} {stdout:?} {}",
            out.status,
            text(&out.stderr)
        ));
    }

    // A tensor name in an error (GGML type 99 does not exist).
    let bad = dir.path().join("bad.gguf");
    let name: String = evil.chars().take(40).collect();
    write_tiny_gguf(&bad, "qwen3moe", &name, 99);
    let out = run(cache.path(), &["inspect"], &bad, &[]);
    let stderr = text(&out.stderr);
    if out.status.code() != Some(1)
        || stderr.lines().count() != 1
        || !stderr.starts_with("smoe: ")
        || !raw_controls(&stderr).is_empty()
        || !stderr.contains("\\x1b]0;pwned\\x07\\x00\\x0b\\x0c\\x7f\\u{9b}31m\\x0a")
    {
        wrong.push(format!("error line: {} {stderr:?}", out.status));
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// Writes the hostile headers of issue 47 item 11 into `dir`: a sparse
/// GGUF of one 200 MiB string value, a sparse 256 MiB GGUF of 20.6
/// million empty keys, and a safetensors file of a 95 MB header (1.58
/// million tensors).
fn write_amplifying_headers(dir: &Path) -> Vec<PathBuf> {
    use std::io::Write;
    let string = dir.join("big-string.gguf");
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes());
    b.extend_from_slice(&1u64.to_le_bytes());
    b.extend_from_slice(&12u64.to_le_bytes());
    b.extend_from_slice(b"general.name");
    b.extend_from_slice(&8u32.to_le_bytes());
    b.extend_from_slice(&(200u64 << 20).to_le_bytes());
    std::fs::write(&string, &b).unwrap();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&string)
        .unwrap();
    f.set_len(b.len() as u64 + (200 << 20)).unwrap();

    let keys = dir.join("empty-keys.gguf");
    let n = ((256u64 << 20) - 24) / 13;
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes());
    b.extend_from_slice(&n.to_le_bytes());
    std::fs::write(&keys, &b).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&keys).unwrap();
    f.set_len(24 + 13 * n).unwrap();

    let st = dir.join("big-header.safetensors");
    let mut header = String::with_capacity(96_000_000);
    header.push('{');
    let mut i = 0;
    while header.len() < 95_000_000 {
        header.push_str(&format!(
            "\"t.{i}\":{{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}},"
        ));
        i += 1;
    }
    header.pop();
    header.push('}');
    let mut w = std::io::BufWriter::new(std::fs::File::create(&st).unwrap());
    w.write_all(&(header.len() as u64).to_le_bytes()).unwrap();
    w.write_all(header.as_bytes()).unwrap();
    w.flush().unwrap();
    vec![string, keys, st]
}

/// Under a 128 MiB address-space limit (`ulimit -v`), `smoe inspect` of a
/// header that would need more (a 200 MiB string value, 20.6 million
/// keys, a 95 MB safetensors header) is one `smoe:` line naming the file
/// and exit 1: an allocation that fails is an error, never an abort
/// (SIGABRT).
#[test]
fn a_header_larger_than_memory_is_one_line_not_an_abort() {
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let mut wrong = Vec::new();
    for path in write_amplifying_headers(dir.path()) {
        let out = Command::new("sh")
            .arg("-c")
            .arg("ulimit -v 131072 && exec \"$0\" inspect \"$1\"")
            .arg(env!("CARGO_BIN_EXE_smoe"))
            .arg(&path)
            .env("SMOE_CACHE_DIR", cache.path())
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stderr = text(&out.stderr);
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if out.status.signal().is_some()
            || out.status.code() != Some(1)
            || stderr.lines().count() != 1
            || !stderr.starts_with("smoe: ")
            || !stderr.contains(&name)
        {
            let first: String = stderr.lines().take(2).collect::<Vec<_>>().join(" | ");
            wrong.push(format!("{name}: {} {first}", out.status));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}
