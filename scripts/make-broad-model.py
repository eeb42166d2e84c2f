#!/usr/bin/env python3
"""A random-weight Qwen3-MoE GGUF whose routing is broad, written with
llama.cpp's own gguf-py (GGUFWriter, its Q8_0 quantizer) and numpy, no
torch: the committed fixture tests/fixtures/models/derived/
qwen3moe-q8_0-stride4096.gguf (a file smoe's reader is checked against
because another program wrote it). The benchmarks' multi-GB models come
from test-support/examples/broad_model.rs (the same recipe in Rust, which a
machine with no Python runs from a carried binary).

    python3 scripts/make-broad-model.py GGUF_PY OUT.gguf [--layers 24]
        [--experts 64] [--top-k 8] [--embd 1024] [--expert-ff 768]
        [--heads 16] [--kv-heads 4] [--seed 20240610]

GGUF_PY is llama.cpp's gguf-py directory (scripts/llama.sh extracts it under
$SMOE_LLAMA_DIR/llama.cpp/gguf-py). The vocabulary (384 sentencepiece
pieces) is copied from tests/fixtures/models/qwen3moe-q8_0.gguf.

Weights are drawn from N(0, 1/fan_in), the embeddings and the router's rows
from N(0, 1), norms are 1: attention and the experts move the hidden state
as much as the embedding does, so the greedy decode wanders instead of
repeating one token, and different tokens pick different experts. (With
transformers' N(0, 0.02) a small model's decode repeats one token, routes
every step to the same top-k and flatters every cache.) The defaults (24 layers x 64 experts, top-8, hidden
1024, expert FFN 768) give about 3.9 GB at Q8_0.
"""
import argparse
import os
import sys

import numpy as np

parser = argparse.ArgumentParser()
parser.add_argument("gguf_py")
parser.add_argument("out")
parser.add_argument("--layers", type=int, default=24)
parser.add_argument("--experts", type=int, default=64)
parser.add_argument("--top-k", type=int, default=8)
parser.add_argument("--embd", type=int, default=1024)
parser.add_argument("--expert-ff", type=int, default=768)
parser.add_argument("--heads", type=int, default=16)
parser.add_argument("--kv-heads", type=int, default=4)
parser.add_argument("--seed", type=int, default=20240610)
args = parser.parse_args()
sys.path.insert(0, args.gguf_py)
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter  # noqa: E402
from gguf.quants import quantize  # noqa: E402

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
vocab = GGUFReader(os.path.join(root, "tests/fixtures/models/qwen3moe-q8_0.gguf"))
rng = np.random.default_rng(args.seed)
arch = "qwen3moe"
head_dim = args.embd // args.heads
n_vocab = 384

w = GGUFWriter(args.out + ".tmp", arch)
w.add_string("general.name", "smoe broad-routing Qwen3-MoE")
w.add_uint32(f"{arch}.block_count", args.layers)
w.add_uint32(f"{arch}.context_length", 4096)
w.add_uint32(f"{arch}.embedding_length", args.embd)
w.add_uint32(f"{arch}.feed_forward_length", args.expert_ff * 4)
w.add_uint32(f"{arch}.attention.head_count", args.heads)
w.add_uint32(f"{arch}.attention.head_count_kv", args.kv_heads)
w.add_float32(f"{arch}.rope.freq_base", 10000.0)
w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)
w.add_uint32(f"{arch}.expert_count", args.experts)
w.add_uint32(f"{arch}.expert_used_count", args.top_k)
w.add_uint32(f"{arch}.attention.key_length", head_dim)
w.add_uint32(f"{arch}.attention.value_length", head_dim)
w.add_uint32(f"{arch}.expert_feed_forward_length", args.expert_ff)
w.add_uint32("general.file_type", 7)  # Q8_0
w.add_uint32("general.quantization_version", 2)
for name, field in vocab.fields.items():
    if not name.startswith("tokenizer."):
        continue
    kind = field.types[0]
    if kind == GGUFValueType.ARRAY:
        if field.types[1] == GGUFValueType.STRING:
            w.add_array(name, [bytes(field.parts[i]).decode("utf-8", "surrogateescape") for i in field.data])
        else:
            w.add_array(name, [field.parts[i][0].item() for i in field.data])
    elif kind == GGUFValueType.STRING:
        w.add_string(name, bytes(field.parts[field.data[0]]).decode())
    else:
        w.add_key_value(name, field.parts[field.data[0]][0].item(), kind)


def q8(name, *shape, std=None):
    """A random Q8_0 tensor of numpy shape `shape` (outermost first), drawn
    from N(0, 1/fan_in) unless `std` says otherwise: each layer's output is
    of the size of its input, so attention and the experts move the hidden
    state as much as the embedding does."""
    if std is None:
        std = 1.0 / np.sqrt(shape[-1])
    data = rng.normal(0.0, std, size=shape).astype(np.float32)
    w.add_tensor(name, quantize(data, GGMLQuantizationType.Q8_0), raw_dtype=GGMLQuantizationType.Q8_0)


def f32(name, data):
    w.add_tensor(name, np.ascontiguousarray(data, dtype=np.float32))


q8("token_embd.weight", n_vocab, args.embd, std=1.0)
f32("output_norm.weight", np.ones(args.embd))
q8("output.weight", n_vocab, args.embd)
for il in range(args.layers):
    b = f"blk.{il}"
    f32(f"{b}.attn_norm.weight", np.ones(args.embd))
    q8(f"{b}.attn_q.weight", args.heads * head_dim, args.embd)
    q8(f"{b}.attn_k.weight", args.kv_heads * head_dim, args.embd)
    q8(f"{b}.attn_v.weight", args.kv_heads * head_dim, args.embd)
    q8(f"{b}.attn_output.weight", args.embd, args.heads * head_dim)
    f32(f"{b}.attn_q_norm.weight", np.ones(head_dim))
    f32(f"{b}.attn_k_norm.weight", np.ones(head_dim))
    f32(f"{b}.ffn_norm.weight", np.ones(args.embd))
    f32(f"{b}.ffn_gate_inp.weight", rng.normal(0.0, 1.0, size=(args.experts, args.embd)))
    q8(f"{b}.ffn_gate_exps.weight", args.experts, args.expert_ff, args.embd)
    q8(f"{b}.ffn_up_exps.weight", args.experts, args.expert_ff, args.embd)
    q8(f"{b}.ffn_down_exps.weight", args.experts, args.embd, args.expert_ff)
    print(f"layer {il + 1}/{args.layers}", file=sys.stderr, flush=True)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
os.replace(args.out + ".tmp", args.out)
