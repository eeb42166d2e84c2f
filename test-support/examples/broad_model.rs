//! A random-weight Qwen3-MoE GGUF whose routing is broad, for measurements
//! (scripts/llama-bench.sh, scripts/llama-cuda.sh): a model llama.cpp
//! runs, made in Rust so that a machine with no Python (the GPU machine of
//! docs/performance.md) can make it from a carried binary.
//!
//! ```text
//! broad_model OUT.gguf [--layers 24] [--experts 64] [--top-k 8]
//!     [--embd 1024] [--expert-ff 768] [--heads 16] [--kv-heads 4]
//!     [--seed 20240610] [--vocab GGUF] [--move 1]
//! ```
//!
//! Weights are drawn from N(0, 1/fan_in), the token embeddings and the
//! router's rows from N(0, 1), norms are 1: attention and the experts move
//! the hidden state as much as the embedding does, so the greedy decode
//! wanders instead of repeating one token, and different tokens pick
//! different experts (with N(0, 0.02) a small model repeats one token and
//! routes every step to the same experts, which flatters every cache).
//! `--move X` scales what each layer adds to the hidden state (its attention
//! output and its experts' down projection) by X: with X above 1 the state
//! moves more from one layer to the next, and the next layer's routing is
//! harder to guess from this one's (issue 48's second model). The
//! matrices are Q8_0, quantized as ggml's reference quantizer does
//! (`quantize_row_q8_0_ref`: a block's scale is its largest magnitude over
//! 127, stored as f16; each value rounded half away from zero). The
//! vocabulary (the `tokenizer.*` key/values) is copied from `--vocab`
//! (default: the committed fixture tests/fixtures/models/qwen3moe-q8_0.gguf,
//! 384 pieces, at the path it had where this was built), and the embedding
//! and output matrices have as many rows as it has tokens. The defaults give about 3.9 GB. Each row's numbers come
//! from its own generator (seeded from the seed, the tensor and the row),
//! so the file is the same for any number of threads. The header is
//! written by the library's GGUF writer (`gguf::header_bytes`).
//!
//! `OUT.gguf` must not exist: the model is written to a temporary file
//! beside it and renamed to it only when complete, never over a file.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use smoe::internals::model::gguf::{header_bytes, GgmlType, Gguf, KeyValue, TensorInfo};

const USAGE: &str =
    "usage: broad_model OUT.gguf [--layers N] [--experts N] [--top-k N] [--embd N] \
[--expert-ff N] [--heads N] [--kv-heads N] [--seed N] [--vocab GGUF] [--move X]";

/// The shape and seed of the model.
struct Shape {
    layers: u64,
    experts: u64,
    top_k: u64,
    embd: u64,
    expert_ff: u64,
    heads: u64,
    kv_heads: u64,
    seed: u64,
    /// The scale of what a layer adds to the hidden state (`--move`).
    movement: f64,
}

/// What fills a tensor.
#[derive(Clone, Copy)]
enum Fill {
    /// Q8_0 of N(0, std²) values.
    Q8 { std: f64 },
    /// f32 ones.
    Ones,
    /// f32 N(0, 1) values.
    Normal,
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("broad_model: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let mut out = None;
    let mut vocab = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/models/qwen3moe-q8_0.gguf"
    ));
    let mut s = Shape {
        layers: 24,
        experts: 64,
        top_k: 8,
        embd: 1024,
        expert_ff: 768,
        heads: 16,
        kv_heads: 4,
        seed: 20240610,
        movement: 1.0,
    };
    while let Some(a) = args.next() {
        let mut value = || {
            args.next()
                .ok_or_else(|| format!("{a} needs a value\n{USAGE}"))
        };
        let number = |v: String| -> Result<u64, String> {
            v.parse::<u64>()
                .map_err(|_| format!("{a} takes a whole number, not '{v}'"))
        };
        match a.as_str() {
            "--layers" => s.layers = number(value()?)?,
            "--experts" => s.experts = number(value()?)?,
            "--top-k" => s.top_k = number(value()?)?,
            "--embd" => s.embd = number(value()?)?,
            "--expert-ff" => s.expert_ff = number(value()?)?,
            "--heads" => s.heads = number(value()?)?,
            "--kv-heads" => s.kv_heads = number(value()?)?,
            "--seed" => s.seed = number(value()?)?,
            "--vocab" => vocab = PathBuf::from(value()?),
            "--move" => {
                let v = value()?;
                s.movement = v
                    .parse::<f64>()
                    .ok()
                    .filter(|m| m.is_finite() && *m > 0.0 && *m <= 100.0)
                    .ok_or_else(|| {
                        format!("--move takes a number above 0, at most 100, not '{v}'")
                    })?;
            }
            _ if a.starts_with('-') => return Err(format!("unknown option {a}\n{USAGE}")),
            _ if out.is_none() => out = Some(PathBuf::from(a)),
            _ => return Err(format!("one output file only, not also {a}\n{USAGE}")),
        }
    }
    let out = out.ok_or(USAGE)?;
    check(&s)?;
    let (kvs, n_vocab) = key_values(&s, &vocab)?;
    let (mut infos, fills) = tensors(&s, n_vocab);
    if out.symlink_metadata().is_ok() {
        return Err(format!(
            "{} exists: this writes only a new file",
            out.display()
        ));
    }
    let dir = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let tmp = tempfile::Builder::new()
        .prefix(".broad_model-")
        .tempfile_in(&dir)
        .map_err(|e| format!("cannot make a temporary file in {}: {e}", dir.display()))?;
    let mut perms = tmp
        .as_file()
        .metadata()
        .map_err(|e| e.to_string())?
        .permissions();
    let head = header_bytes(&kvs, &mut infos, 32);
    let io = |e: std::io::Error| format!("cannot write {}: {e}", tmp.path().display());
    let mut w = BufWriter::with_capacity(8 << 20, tmp.as_file().try_clone().map_err(io)?);
    w.write_all(&head).map_err(io)?;
    let mut at = 0u64;
    let total = infos.len();
    for (i, (t, fill)) in infos.iter().zip(&fills).enumerate() {
        w.write_all(&vec![0u8; (t.offset - at) as usize])
            .map_err(io)?;
        let bytes = fill_tensor(&s, i as u64, t, *fill);
        debug_assert_eq!(bytes.len() as u64, t.bytes);
        w.write_all(&bytes).map_err(io)?;
        at = t.offset + t.bytes;
        if t.name.ends_with("ffn_down_exps.weight") || i + 1 == total {
            eprintln!("broad_model: {}/{} tensors ({})", i + 1, total, t.name);
        }
    }
    w.write_all(&vec![0u8; (at.next_multiple_of(32) - at) as usize])
        .map_err(io)?;
    w.into_inner()
        .map_err(|e| io(e.into_error()))?
        .sync_all()
        .map_err(io)?;
    // readable as a model made with any other tool is (the temporary file is 0600)
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o644);
    tmp.as_file().set_permissions(perms).map_err(io)?;
    tmp.persist_noclobber(&out)
        .map_err(|e| format!("cannot rename the model to {}: {}", out.display(), e.error))?;
    let gguf_bytes = std::fs::metadata(&out).map_or(0, |m| m.len());
    println!("{}: {} tensors, {} bytes", out.display(), total, gguf_bytes);
    Ok(())
}

/// The shape's numbers make a model llama.cpp loads.
fn check(s: &Shape) -> Result<(), String> {
    let positive = [
        ("--layers", s.layers),
        ("--experts", s.experts),
        ("--top-k", s.top_k),
        ("--embd", s.embd),
        ("--expert-ff", s.expert_ff),
        ("--heads", s.heads),
        ("--kv-heads", s.kv_heads),
    ];
    for (name, v) in positive {
        if v == 0 || v > 1 << 20 {
            return Err(format!("{name} must be 1 to {}, not {v}", 1 << 20));
        }
    }
    if s.top_k > s.experts {
        return Err(format!(
            "--top-k {} is more than the {} experts",
            s.top_k, s.experts
        ));
    }
    if s.embd % s.heads != 0 || s.heads % s.kv_heads != 0 {
        return Err(format!(
            "--embd {} must be a multiple of --heads {}, and that of --kv-heads {}",
            s.embd, s.heads, s.kv_heads
        ));
    }
    let head_dim = s.embd / s.heads;
    if s.embd % 32 != 0 || s.expert_ff % 32 != 0 || head_dim % 32 != 0 {
        return Err(format!(
            "--embd {}, --expert-ff {} and the head size {head_dim} must be multiples of 32 (Q8_0 blocks)",
            s.embd, s.expert_ff
        ));
    }
    Ok(())
}

fn u32_kv(key: &str, v: u64) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value_type: 4, // UINT32
        raw: (v as u32).to_le_bytes().to_vec(),
    }
}

fn f32_kv(key: &str, v: f32) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value_type: 6, // FLOAT32
        raw: v.to_le_bytes().to_vec(),
    }
}

/// The model's key/values (its hyperparameters and `--vocab`'s tokenizer)
/// and the vocabulary's size (the length of `tokenizer.ggml.tokens`).
fn key_values(s: &Shape, vocab: &Path) -> Result<(Vec<KeyValue>, u64), String> {
    let arch = "qwen3moe";
    let head_dim = s.embd / s.heads;
    let mut kvs = vec![
        KeyValue::string("general.architecture", arch),
        KeyValue::string("general.name", "smoe broad-routing Qwen3-MoE"),
        u32_kv(&format!("{arch}.block_count"), s.layers),
        u32_kv(&format!("{arch}.context_length"), 4096),
        u32_kv(&format!("{arch}.embedding_length"), s.embd),
        u32_kv(&format!("{arch}.feed_forward_length"), s.expert_ff * 4),
        u32_kv(&format!("{arch}.attention.head_count"), s.heads),
        u32_kv(&format!("{arch}.attention.head_count_kv"), s.kv_heads),
        f32_kv(&format!("{arch}.rope.freq_base"), 10000.0),
        f32_kv(&format!("{arch}.attention.layer_norm_rms_epsilon"), 1e-6),
        u32_kv(&format!("{arch}.expert_count"), s.experts),
        u32_kv(&format!("{arch}.expert_used_count"), s.top_k),
        u32_kv(&format!("{arch}.attention.key_length"), head_dim),
        u32_kv(&format!("{arch}.attention.value_length"), head_dim),
        u32_kv(&format!("{arch}.expert_feed_forward_length"), s.expert_ff),
        u32_kv("general.file_type", 7), // MOSTLY_Q8_0
        u32_kv("general.quantization_version", 2),
    ];
    let file = File::open(vocab).map_err(|e| format!("cannot open {}: {e}", vocab.display()))?;
    let source = Gguf::read(&file, vocab, &|| false).map_err(|e| e.to_string())?;
    let before = kvs.len();
    kvs.extend(
        source
            .kvs
            .into_iter()
            .filter(|kv| kv.key.starts_with("tokenizer.")),
    );
    // an array's value: its element type (u32), its length (u64), the elements
    let n_vocab = kvs[before..]
        .iter()
        .find(|kv| kv.key == "tokenizer.ggml.tokens" && kv.value_type == 9)
        .and_then(|kv| kv.raw.get(4..12))
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
        .filter(|&n| n > 0 && n <= 1 << 24)
        .ok_or_else(|| {
            format!(
                "{} has no tokenizer.ggml.tokens array of 1 to 2^24 tokens",
                vocab.display()
            )
        })?;
    Ok((kvs, n_vocab))
}

/// The tensor infos (offsets laid out later) and how each is filled, in the
/// order llama.cpp's converters write them.
fn tensors(s: &Shape, n_vocab: u64) -> (Vec<TensorInfo>, Vec<Fill>) {
    let head_dim = s.embd / s.heads;
    let mut infos = Vec::new();
    let mut fills = Vec::new();
    // numpy order (outermost first), as the converters describe shapes
    let mut add = |name: String, shape: &[u64], fill: Fill| {
        let ggml_type = GgmlType::from_id(if matches!(fill, Fill::Q8 { .. }) {
            8
        } else {
            0
        })
        .expect("Q8_0 and F32 are ggml types");
        let n: u64 = shape.iter().product();
        infos.push(TensorInfo {
            name,
            ne: shape.iter().rev().copied().collect(),
            ggml_type,
            offset: 0,
            bytes: n / ggml_type.block * ggml_type.block_bytes,
        });
        fills.push(fill);
    };
    let q8 = |fan_in: u64| Fill::Q8 {
        std: 1.0 / (fan_in as f64).sqrt(),
    };
    add(
        "token_embd.weight".into(),
        &[n_vocab, s.embd],
        Fill::Q8 { std: 1.0 },
    );
    add("output_norm.weight".into(), &[s.embd], Fill::Ones);
    add("output.weight".into(), &[n_vocab, s.embd], q8(s.embd));
    for il in 0..s.layers {
        let b = format!("blk.{il}");
        let q = s.heads * head_dim;
        let kv = s.kv_heads * head_dim;
        add(format!("{b}.attn_norm.weight"), &[s.embd], Fill::Ones);
        add(format!("{b}.attn_q.weight"), &[q, s.embd], q8(s.embd));
        add(format!("{b}.attn_k.weight"), &[kv, s.embd], q8(s.embd));
        add(format!("{b}.attn_v.weight"), &[kv, s.embd], q8(s.embd));
        let moved = |fan_in: u64| Fill::Q8 {
            std: s.movement / (fan_in as f64).sqrt(),
        };
        add(format!("{b}.attn_output.weight"), &[s.embd, q], moved(q));
        add(format!("{b}.attn_q_norm.weight"), &[head_dim], Fill::Ones);
        add(format!("{b}.attn_k_norm.weight"), &[head_dim], Fill::Ones);
        add(format!("{b}.ffn_norm.weight"), &[s.embd], Fill::Ones);
        add(
            format!("{b}.ffn_gate_inp.weight"),
            &[s.experts, s.embd],
            Fill::Normal,
        );
        let (e, ff, d) = (s.experts, s.expert_ff, s.embd);
        add(format!("{b}.ffn_gate_exps.weight"), &[e, ff, d], q8(d));
        add(format!("{b}.ffn_up_exps.weight"), &[e, ff, d], q8(d));
        add(format!("{b}.ffn_down_exps.weight"), &[e, d, ff], moved(ff));
    }
    (infos, fills)
}

/// Tensor `index`'s bytes, its rows made on every core.
fn fill_tensor(s: &Shape, index: u64, t: &TensorInfo, fill: Fill) -> Vec<u8> {
    let cols = t.ne[0];
    let rows: u64 = t.ne[1..].iter().product();
    let row_bytes = (t.bytes / rows) as usize;
    let mut bytes = vec![0u8; t.bytes as usize];
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let per = (rows as usize).div_ceil(threads).max(1);
    std::thread::scope(|scope| {
        for (c, chunk) in bytes.chunks_mut(per * row_bytes).enumerate() {
            scope.spawn(move || {
                let mut values = vec![0f32; cols as usize];
                for (r, row) in chunk.chunks_mut(row_bytes).enumerate() {
                    let row_index = (c * per + r) as u64;
                    let mut rng = Normal::new(s.seed, index, row_index);
                    match fill {
                        Fill::Ones => {
                            for v in row.chunks_exact_mut(4) {
                                v.copy_from_slice(&1f32.to_le_bytes());
                            }
                        }
                        Fill::Normal => {
                            for v in row.chunks_exact_mut(4) {
                                v.copy_from_slice(&(rng.next() as f32).to_le_bytes());
                            }
                        }
                        Fill::Q8 { std } => {
                            for v in values.iter_mut() {
                                *v = (rng.next() * std) as f32;
                            }
                            quantize_q8_0(&values, row);
                        }
                    }
                }
            });
        }
    });
    bytes
}

/// ggml's `quantize_row_q8_0_ref`: blocks of 32, an f16 scale (the
/// block's largest magnitude over 127) and 32 signed bytes.
fn quantize_q8_0(x: &[f32], out: &mut [u8]) {
    for (block, y) in x.chunks_exact(32).zip(out.chunks_exact_mut(34)) {
        let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        y[..2].copy_from_slice(&f16_bits(d).to_le_bytes());
        for (q, v) in y[2..].iter_mut().zip(block) {
            *q = (v * id).round() as i8 as u8;
        }
    }
}

/// IEEE binary16 bits of `x`, rounded to nearest, ties to even (as ggml's
/// fp32-to-fp16 conversion rounds).
fn f16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32;
    let man = b & 0x7f_ffff;
    if exp == 0xff {
        return sign | 0x7c00 | if man != 0 { 0x200 } else { 0 };
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    let (r, rem, half) = if e <= 0 {
        if e < -10 {
            return sign;
        }
        // a subnormal: the value over 2^-24, with the implicit bit
        let shift = (14 - e) as u32;
        let m = man | 0x80_0000;
        (m >> shift, m & ((1 << shift) - 1), 1u32 << (shift - 1))
    } else {
        ((e as u32) << 10 | man >> 13, man & 0x1fff, 0x1000)
    };
    // a carry out of the mantissa moves into the exponent, as it should
    let r = if rem > half || (rem == half && r & 1 == 1) {
        r + 1
    } else {
        r
    };
    sign | r as u16
}

/// N(0, 1) numbers of one row: Box–Muller over a splitmix64 stream.
struct Normal {
    state: u64,
    spare: Option<f64>,
}

impl Normal {
    fn new(seed: u64, tensor: u64, row: u64) -> Normal {
        let mut n = Normal {
            state: seed
                ^ tensor.wrapping_mul(0x9E37_79B9_7F4A_7C15)
                ^ row.wrapping_mul(0xC2B2_AE3D_27D4_EB4F),
            spare: None,
        };
        n.bits();
        n
    }

    fn bits(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn next(&mut self) -> f64 {
        if let Some(v) = self.spare.take() {
            return v;
        }
        // u1 in (0, 1]: its logarithm is finite
        let u1 = ((self.bits() >> 11) + 1) as f64 / (1u64 << 53) as f64;
        let u2 = (self.bits() >> 11) as f64 / (1u64 << 53) as f64;
        let r = (-2.0 * u1.ln()).sqrt();
        let (sin, cos) = (std::f64::consts::TAU * u2).sin_cos();
        self.spare = Some(r * sin);
        r * cos
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_bits_rounds_as_ieee() {
        assert_eq!(f16_bits(1.0), 0x3c00);
        assert_eq!(f16_bits(-2.0), 0xc000);
        assert_eq!(f16_bits(65504.0), 0x7bff);
        assert_eq!(f16_bits(65520.0), 0x7c00, "rounds up to infinity");
        assert_eq!(f16_bits(5.960_464_5e-8), 0x0001, "the least subnormal");
        assert_eq!(f16_bits(1.0 + 1.0 / 2048.0), 0x3c00, "a tie goes to even");
        assert_eq!(f16_bits(1.0 + 3.0 / 2048.0), 0x3c02, "a tie goes to even");
        assert_eq!(f16_bits(0.0), 0);
    }
}
