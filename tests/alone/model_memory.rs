//! What a model opened in place costs before its first claim (issue 34,
//! "Memory"): the expert table and the per-layer layouts, and nothing else
//! resident; no byte of tensor data read. Measured on the header of a model
//! shaped like Qwen3-235B-A22B at Q4_K (94 layers × 128 experts, stacked
//! gate, up and down of 3,538,944 bytes per expert), whose 127 GB data
//! section is a hole (`set_len`).
//!
//! In the `alone` binary: it measures the process's RSS.

use smoe_test_support as common;

use std::path::Path;

use common::models::{write_gguf, GgufData, GgufTensor};

use smoe::vault::Vault;
use smoe::{Config, Streamer};

const LAYERS: u64 = 94;
const EXPERTS: u64 = 128;
const N_EMBD: u64 = 4096;
const N_FF: u64 = 1536;
/// GGML_TYPE_Q4_K: 256 elements in 144 bytes.
const Q4_K: u32 = 12;

/// A GGUF v3 header of a Qwen3-235B-shaped model; the data is a hole.
fn write_model(path: &Path) {
    let mut tensors = Vec::new();
    for l in 0..LAYERS {
        for (role, ne) in [
            ("gate", [N_EMBD, N_FF, EXPERTS]),
            ("up", [N_EMBD, N_FF, EXPERTS]),
            ("down", [N_FF, N_EMBD, EXPERTS]),
        ] {
            tensors.push(GgufTensor::new(
                format!("blk.{l}.ffn_{role}_exps.weight"),
                &ne,
                Q4_K,
            ));
        }
        for other in ["attn_norm", "ffn_norm"] {
            tensors.push(GgufTensor::new(
                format!("blk.{l}.{other}.weight"),
                &[N_EMBD],
                0,
            ));
        }
        tensors.push(GgufTensor::new(
            format!("blk.{l}.ffn_gate_inp.weight"),
            &[N_EMBD, EXPERTS],
            0,
        ));
    }
    let kvs = [
        ("qwen3moe.block_count", LAYERS as u32),
        ("qwen3moe.expert_count", EXPERTS as u32),
        ("qwen3moe.expert_used_count", 8),
    ];
    write_gguf(path, "qwen3moe", &kvs, &tensors, GgufData::Hole);
}

#[test]
fn a_model_in_place_costs_its_table_and_nothing_more_before_a_claim() {
    let _alone = crate::alone();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("qwen3-235b-shape.gguf");
    write_model(&path);
    let rss0 = common::rss_bytes();
    let vault = Vault::open(&path).unwrap();
    let rss1 = common::rss_bytes();
    let entries = vault.entries().len() as u64;
    assert_eq!(entries, LAYERS * EXPERTS);
    assert_eq!(vault.model().unwrap().reads_per_expert(0), 3);
    // The table and the layouts, measured: the entries (48 bytes each) and
    // the dense index (4 bytes per id) are most of it.
    let per_expert = rss1.saturating_sub(rss0) as f64 / entries as f64;
    let s = Streamer::with_vault(
        vault,
        Config {
            ring_slots: 64,
            workers: 4,
            prewarm: false,
            freq_path: Some("".into()),
            ..Config::default()
        },
    )
    .unwrap();
    let rss2 = common::rss_bytes();
    let (_, ring_bytes, slot_bytes) = s.ring_region();
    eprintln!(
        "{entries} experts: RSS +{} KiB at Vault::open ({per_expert:.0} bytes per expert), \
         +{} KiB more at Streamer::with_vault (a ring of 64 x {slot_bytes} bytes = {} MiB reserved)",
        rss1.saturating_sub(rss0) / 1024,
        rss2.saturating_sub(rss1) / 1024,
        ring_bytes >> 20
    );
    assert!(
        per_expert < 512.0,
        "the expert table costs {per_expert:.0} bytes per expert"
    );
    // Nothing of the ring (677 MiB) nor of the model (127 GB) is resident:
    // the workers' stacks and the streamer's tables are a few MiB.
    assert!(
        rss2.saturating_sub(rss1) < 16 << 20,
        "{} bytes resident after open",
        rss2 - rss1
    );
    assert_eq!(
        s.stats().bytes_read,
        0,
        "no tensor data read before a claim"
    );
}
