//! Writes a synthetic Qwen3-MoE-shaped GGUF v3 file of random bytes, for
//! measuring reads on a machine with no Python (the device machine of
//! docs/performance.md): `layers` blocks of three stacked Q8_0 expert
//! tensors (`blk.N.ffn_{gate,up,down}_exps.weight`, `experts` experts of
//! `ff × embd`) and a norm, 32-byte aligned as a GGUF writer aligns them.
//! The bytes are not a model anyone can run: `smoe bench --mode scan` and
//! `smoe pack` read them; llama.cpp would not.
//!
//! `cargo run --release -p smoe-test-support --example synthetic_gguf -- OUT.gguf [LAYERS EXPERTS EMBD FF]`
//! (default 24 64 1024 768: the 3.9 GB broad model's shape).

use std::fs::File;
use std::io::{BufWriter, Seek, Write};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let out = args
        .get(1)
        .expect("usage: synthetic_gguf OUT.gguf [LAYERS EXPERTS EMBD FF]");
    let num = |i: usize, d: u64| args.get(i).map_or(d, |a| a.parse().expect("a number"));
    let (layers, experts, embd, ff) = (num(2, 24), num(3, 64), num(4, 1024), num(5, 768));
    // GGML_TYPE_Q8_0 = 8: 32 elements in 34 bytes.
    let q8 = |n: u64| n / 32 * 34;
    let mut tensors: Vec<(String, Vec<u64>, u32, u64)> = vec![(
        "token_embd.weight".into(),
        vec![embd, 384],
        0,
        embd * 384 * 4,
    )];
    for l in 0..layers {
        tensors.push((format!("blk.{l}.ffn_norm.weight"), vec![embd], 0, embd * 4));
        for (role, ne) in [
            ("gate", [embd, ff, experts]),
            ("up", [embd, ff, experts]),
            ("down", [ff, embd, experts]),
        ] {
            let bytes = q8(ne.iter().product());
            tensors.push((
                format!("blk.{l}.ffn_{role}_exps.weight"),
                ne.to_vec(),
                8,
                bytes,
            ));
        }
    }
    let mut w = BufWriter::with_capacity(8 << 20, File::create(out).expect("create OUT"));
    let string = |w: &mut BufWriter<File>, s: &str| {
        w.write_all(&(s.len() as u64).to_le_bytes()).unwrap();
        w.write_all(s.as_bytes()).unwrap();
    };
    w.write_all(b"GGUF").unwrap();
    w.write_all(&3u32.to_le_bytes()).unwrap();
    w.write_all(&(tensors.len() as u64).to_le_bytes()).unwrap();
    w.write_all(&4u64.to_le_bytes()).unwrap();
    string(&mut w, "general.architecture");
    w.write_all(&8u32.to_le_bytes()).unwrap();
    string(&mut w, "qwen3moe");
    for (k, v) in [
        ("qwen3moe.block_count", layers),
        ("qwen3moe.expert_count", experts),
        ("qwen3moe.expert_used_count", 8),
    ] {
        string(&mut w, k);
        w.write_all(&4u32.to_le_bytes()).unwrap();
        w.write_all(&(v as u32).to_le_bytes()).unwrap();
    }
    let mut offset = 0u64;
    for (name, ne, ty, bytes) in &tensors {
        string(&mut w, name);
        w.write_all(&(ne.len() as u32).to_le_bytes()).unwrap();
        for d in ne {
            w.write_all(&d.to_le_bytes()).unwrap();
        }
        w.write_all(&ty.to_le_bytes()).unwrap();
        w.write_all(&offset.to_le_bytes()).unwrap();
        offset += bytes.next_multiple_of(32);
    }
    let header = w.stream_position().unwrap();
    w.write_all(&vec![0u8; (header.next_multiple_of(32) - header) as usize])
        .unwrap();
    // xorshift64*: random enough that no layer of storage compresses it.
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut block = vec![0u8; 1 << 20];
    let mut left = offset;
    while left > 0 {
        for c in block.chunks_exact_mut(8) {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            c.copy_from_slice(&x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
        }
        let n = left.min(block.len() as u64) as usize;
        w.write_all(&block[..n]).unwrap();
        left -= n as u64;
    }
    w.flush().unwrap();
    println!("{out}: {} tensors, {} bytes of data", tensors.len(), offset);
}
