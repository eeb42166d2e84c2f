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

use std::fs::File;
use std::hint::black_box;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use smoe::internals::model::{open_model, plan};
use smoe::vault::Vault;

/// Tensors per block: three expert tensors and seven others.
const PER_BLOCK: u64 = 10;
const EXPERTS: u64 = 8;
const GGUF_ALIGNMENT: u64 = 32;

/// Writes a GGUF v3 file of `layers` blocks to `path` (headers only; the
/// data section is a hole of the right size).
fn write_gguf(path: &Path, layers: u64) {
    let mut w = BufWriter::new(File::create(path).unwrap());
    let string = |w: &mut BufWriter<File>, s: &str| {
        w.write_all(&(s.len() as u64).to_le_bytes()).unwrap();
        w.write_all(s.as_bytes()).unwrap();
    };
    w.write_all(b"GGUF").unwrap();
    w.write_all(&3u32.to_le_bytes()).unwrap();
    w.write_all(&(layers * PER_BLOCK).to_le_bytes()).unwrap();
    w.write_all(&1u64.to_le_bytes()).unwrap(); // one key/value
    string(&mut w, "general.architecture");
    w.write_all(&8u32.to_le_bytes()).unwrap(); // GGUF_TYPE_STRING
    string(&mut w, "bench");
    let mut offset = 0u64;
    let mut header_bytes = 4 + 4 + 8 + 8 + (8 + 20) + 4 + (8 + 5);
    let mut tensor = |w: &mut BufWriter<File>, name: &str, dims: &[u64]| {
        string(w, name);
        w.write_all(&(dims.len() as u32).to_le_bytes()).unwrap();
        for d in dims {
            w.write_all(&d.to_le_bytes()).unwrap();
        }
        w.write_all(&0u32.to_le_bytes()).unwrap(); // GGML_TYPE_F32
        w.write_all(&offset.to_le_bytes()).unwrap();
        header_bytes += 8 + name.len() as u64 + 4 + 8 * dims.len() as u64 + 4 + 8;
        let bytes = dims.iter().product::<u64>() * 4;
        offset += bytes.next_multiple_of(GGUF_ALIGNMENT);
    };
    for l in 0..layers {
        for role in ["gate", "up", "down"] {
            tensor(
                &mut w,
                &format!("blk.{l}.ffn_{role}_exps.weight"),
                &[16, 4, EXPERTS],
            );
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
            tensor(&mut w, &format!("blk.{l}.{other}.weight"), &[16]);
        }
    }
    w.flush().unwrap();
    let file = w.into_inner().unwrap();
    let data_start = header_bytes.next_multiple_of(GGUF_ALIGNMENT);
    file.set_len(data_start + offset).unwrap();
}

fn model_open(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let files: Vec<(u64, PathBuf)> = [1_000u64, 5_000, 10_000]
        .into_iter()
        .map(|layers| {
            let path = dir.path().join(format!("m{layers}.gguf"));
            write_gguf(&path, layers);
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
