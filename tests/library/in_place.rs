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
    let mut in_place_any = false;
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
        in_place_any |= st.bytes_moved == 0;
        fixtures_seen += 1;
    }
    eprintln!("{slices} slices of {fixtures_seen} fixtures checked in place");
    assert!(fixtures_seen >= 16 && slices > 500, "{fixtures_seen} {slices}");
    // The fixtures' strides are not multiples of 4096: some layers' payloads
    // are moved after the read; the test below covers the other case.
    assert!(moved_any, "no fixture needed a move");
    let _ = in_place_any;
}

/// Writes a GGUF v3 file of one layer of stacked Q8_0-sized experts whose
/// per-expert stride is a multiple of 4096 (as Qwen3-235B's and Mixtral's
/// are), with data at an offset that is not: every expert's slice then has
/// the same offset modulo the block, and no byte is moved.
fn write_aligned_stride_gguf(path: &Path, n_experts: u64, seed: u8) -> Vec<u8> {
    // A tensor of F32 [n_experts, 1024 rows, 1024 cols]... kept small:
    // ne = [1024, 1, n_experts] f32 → 4096 bytes per expert.
    let mut head = Vec::new();
    head.extend_from_slice(b"GGUF");
    head.extend_from_slice(&3u32.to_le_bytes());
    let tensors: Vec<(String, Vec<u64>)> = vec![
        ("token_embd.weight".into(), vec![8, 1]),
        ("blk.0.ffn_gate_exps.weight".into(), vec![1024, 1, n_experts]),
        ("blk.0.ffn_up_exps.weight".into(), vec![1024, 1, n_experts]),
        ("blk.0.ffn_down_exps.weight".into(), vec![1024, 1, n_experts]),
    ];
    head.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    let kvs: Vec<(&str, u32)> = vec![
        ("llama.expert_count", n_experts as u32),
        ("llama.expert_used_count", 2),
        ("llama.block_count", 1),
    ];
    head.extend_from_slice(&((kvs.len() + 1) as u64).to_le_bytes());
    let s = |h: &mut Vec<u8>, t: &str| {
        h.extend_from_slice(&(t.len() as u64).to_le_bytes());
        h.extend_from_slice(t.as_bytes());
    };
    s(&mut head, "general.architecture");
    head.extend_from_slice(&8u32.to_le_bytes());
    s(&mut head, "llama");
    for (k, v) in &kvs {
        s(&mut head, k);
        head.extend_from_slice(&4u32.to_le_bytes());
        head.extend_from_slice(&v.to_le_bytes());
    }
    let mut offset = 0u64;
    for (name, ne) in &tensors {
        s(&mut head, name);
        head.extend_from_slice(&(ne.len() as u32).to_le_bytes());
        for d in ne {
            head.extend_from_slice(&d.to_le_bytes());
        }
        head.extend_from_slice(&0u32.to_le_bytes()); // F32
        head.extend_from_slice(&offset.to_le_bytes());
        offset += (ne.iter().product::<u64>() * 4).next_multiple_of(32);
    }
    let data_at = head.len().next_multiple_of(32);
    head.resize(data_at, 0);
    let mut data = vec![0u8; offset as usize];
    for (i, b) in data.iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 12) as u8;
    }
    head.extend_from_slice(&data);
    std::fs::write(path, &head).unwrap();
    head
}

/// Strides that are multiples of the block: the payload lands where the
/// layout says with no move, and the bytes are the file's.
#[test]
fn a_block_multiple_stride_is_read_with_no_move() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("aligned.gguf");
    let file = write_aligned_stride_gguf(&path, 8, 3);
    let vault = Vault::open(&path).unwrap();
    assert!(vault.model().is_some());
    let s = Streamer::with_vault(vault, config()).unwrap();
    let layouts = layouts(s.vault().meta());
    for e in 0..8u32 {
        let c = s.claim_wait(0, e, WAIT).unwrap().unwrap();
        for (k, (_, offset, bytes, _)) in layouts[&0].iter().enumerate() {
            let entry_offset = file.len() as u64 - 3 * 8 * 4096; // data start
            let at = entry_offset + k as u64 * 8 * 4096 + u64::from(e) * 4096;
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
