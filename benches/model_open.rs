//! Time to open a model in place from its headers (issue 34: "a model of
//! 100k tensors opens in well under a second, linear in the tensor count"):
//! `model::open_model` (the GGUF reader, the expert-name grammar) and
//! `model::plan` (the overlap check, the per-layer layouts), on synthetic
//! GGUF v3 files of 10k, 50k and 100k tensors, and the whole in-place
//! `Vault::open` (those two, the windows, the table, the metadata and the
//! identity). Nothing but headers is read:
//! each file's data section is a hole (`set_len`).
//!
//! Run with `cargo bench --bench model_open`. Each file has `layers`
//! blocks of ten tensors, three of them stacked expert tensors
//! (`blk.N.ffn_{gate,up,down}_exps.weight`, 8 experts of 16 × 4 F32) and
//! seven others (attention, norms), as a real model's blocks have.

use std::hint::black_box;
use std::path::{Path, PathBuf};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use smoe::internals::model::{open_model, plan};
use smoe::vault::Vault;
use smoe_test_support::models::{write_gguf, GgufData, GgufTensor};

/// Tensors per block: three expert tensors and seven others.
const PER_BLOCK: u64 = 10;
const EXPERTS: u64 = 8;

/// Writes a GGUF v3 file of `layers` blocks to `path` (headers only; the
/// data section is a hole of the right size).
fn write_model(path: &Path, layers: u64) {
    let mut tensors = Vec::new();
    for l in 0..layers {
        for role in ["gate", "up", "down"] {
            tensors.push(GgufTensor::new(
                format!("blk.{l}.ffn_{role}_exps.weight"),
                &[16, 4, EXPERTS],
                0,
            ));
        }
        for other in [
            "attn_q",
            "attn_k",
            "attn_v",
            "attn_output",
            "attn_norm",
            "ffn_norm",
            "ffn_gate_inp",
        ] {
            tensors.push(GgufTensor::new(format!("blk.{l}.{other}.weight"), &[16], 0));
        }
    }
    write_gguf(path, "bench", &[], &tensors, GgufData::Hole);
}

fn model_open(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let files: Vec<(u64, PathBuf)> = [1_000u64, 5_000, 10_000]
        .into_iter()
        .map(|layers| {
            let path = dir.path().join(format!("m{layers}.gguf"));
            write_model(&path, layers);
            (layers * PER_BLOCK, path)
        })
        .collect();
    let mut group = c.benchmark_group("model_open");
    group.sample_size(10);
    for (tensors, path) in &files {
        group.throughput(Throughput::Elements(*tensors));
        group.bench_with_input(BenchmarkId::new("open", tensors), path, |b, path| {
            b.iter(|| {
                let model = open_model(path, &|| false).unwrap();
                black_box(model.tensors.len())
            })
        });
        let model = open_model(path, &|| false).unwrap();
        assert_eq!(model.tensors.len() as u64, *tensors);
        group.bench_with_input(BenchmarkId::new("plan", tensors), &model, |b, model| {
            b.iter(|| black_box(plan(model).unwrap().2.len()))
        });
        // The whole in-place open `smoe_open` does before sizing the ring:
        // the above, each layer's windows, the table, the metadata and the
        // identity.
        group.bench_with_input(BenchmarkId::new("vault_open", tensors), path, |b, path| {
            b.iter(|| black_box(Vault::open(path).unwrap().entries().len()))
        });
    }
    group.finish();
}

criterion_group!(benches, model_open);
criterion_main!(benches);
