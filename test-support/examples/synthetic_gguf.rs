//! Writes a synthetic Qwen3-MoE-shaped GGUF v3 file of random bytes, for
//! measuring reads on a machine with no Python (the GPU machine of
//! docs/performance.md): `layers` blocks of three stacked Q8_0 expert
//! tensors (`blk.N.ffn_{gate,up,down}_exps.weight`, `experts` experts of
//! `ff × embd`) and a norm. The bytes are not a model anyone can run:
//! `smoe bench --mode scan` and `smoe pack` read them; llama.cpp would not.
//!
//! `cargo run --release -p smoe-test-support --example synthetic_gguf -- OUT.gguf [LAYERS EXPERTS EMBD FF]`
//! (default 24 64 1024 768: the 3.9 GB broad model's shape).

use smoe_test_support::models::{write_gguf, GgufData, GgufTensor};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let out = args
        .get(1)
        .expect("usage: synthetic_gguf OUT.gguf [LAYERS EXPERTS EMBD FF]");
    let num = |i: usize, d: u64| args.get(i).map_or(d, |a| a.parse().expect("a number"));
    let (layers, experts, embd, ff) = (num(2, 24), num(3, 64), num(4, 1024), num(5, 768));
    let mut tensors = vec![GgufTensor::new("token_embd.weight", &[embd, 384], 0)];
    for l in 0..layers {
        tensors.push(GgufTensor::new(
            format!("blk.{l}.ffn_norm.weight"),
            &[embd],
            0,
        ));
        for (role, ne) in [
            ("gate", [embd, ff, experts]),
            ("up", [embd, ff, experts]),
            ("down", [ff, embd, experts]),
        ] {
            tensors.push(GgufTensor::new(
                format!("blk.{l}.ffn_{role}_exps.weight"),
                &ne,
                8,
            ));
        }
    }
    let kvs = [
        ("qwen3moe.block_count", layers as u32),
        ("qwen3moe.expert_count", experts as u32),
        ("qwen3moe.expert_used_count", 8),
    ];
    let at = write_gguf(
        std::path::Path::new(out),
        "qwen3moe",
        &kvs,
        &tensors,
        GgufData::Random(0x9E37_79B9_7F4A_7C15),
    );
    let bytes: u64 = tensors.iter().map(|t| t.bytes.next_multiple_of(32)).sum();
    println!(
        "{out}: {} tensors, {bytes} bytes of data from offset {at}",
        tensors.len()
    );
}
