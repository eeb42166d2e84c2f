#!/usr/bin/env python3
"""Make the model fixtures under tests/fixtures/models/.

Run through scripts/make-model-fixtures.sh, which creates the virtual
environment (torch, transformers, safetensors, sentencepiece, gguf) and fetches
the llama-cpp-python source distribution that carries llama.cpp's converter.
CI never runs this: it uses the committed files.

Every weight file is written by someone else's writer:
  * safetensors by Hugging Face transformers' save_pretrained (tiny random
    models built from a config alone, seeded);
  * GGUF by llama.cpp's convert_hf_to_gguf.py (from the sdist), by llama.cpp's
    llama-quantize (K-quants, only when a build is given), and by the `gguf`
    Python package (GGUFWriter + gguf.quants) for the synthetic mixed file.
EXPECTED.json is then written from independent readers (the `safetensors`
package plus the JSON header, and gguf.GGUFReader), never from our own code.

Usage (inside the venv):
  make-model-fixtures.py --out DIR --work DIR --llama-src DIR [--llama-build DIR]
  make-model-fixtures.py _convert LLAMA_SRC CONVERTER-ARGS...   (internal)
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import random
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

# Sizes are kept tiny: each committed file <= 2 MB, all of them <= 10 MB.
VOCAB = 384          # sentencepiece BPE with byte_fallback: 256 bytes + 3 specials + 125 pieces
SEED = 20240610

MAX_FILE = 2 * 1024 * 1024
MAX_TOTAL = 10 * 1024 * 1024


# --------------------------------------------------------------------------
# The converter wrapper: route the vocab of the architectures whose converter
# classes expect a BPE tokenizer.json to the sentencepiece path, then run
# convert_hf_to_gguf.py as is.
# --------------------------------------------------------------------------
SP_VOCAB_ARCHES = [
    "Qwen2MoeForCausalLM",
    "Qwen3MoeForCausalLM",
    "DeepseekV3ForCausalLM",
    "GptOssForCausalLM",
    "Cohere2MoeForCausalLM",
]


def convert_main(llama_src: str, args: list[str]) -> None:
    import runpy
    src = Path(llama_src)
    sys.path.insert(0, str(src))
    sys.path.insert(1, str(src / "gguf-py"))
    import conversion  # noqa: F401  (llama.cpp's converter package, from the sdist)
    from conversion import get_model_class

    def sp_vocab(self):
        self._set_vocab_sentencepiece()

    for arch in SP_VOCAB_ARCHES:
        get_model_class(arch).set_vocab = sp_vocab
    sys.argv = [str(src / "convert_hf_to_gguf.py")] + args
    runpy.run_path(str(src / "convert_hf_to_gguf.py"), run_name="__main__")


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------
def sha256_file(p: Path) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def sha256_range(p: Path, off: int, n: int) -> str:
    with open(p, "rb") as f:
        f.seek(off)
        b = f.read(n)
    assert len(b) == n, (p, off, n)
    return hashlib.sha256(b).hexdigest()


def log(msg: str) -> None:
    print(f"[fixtures] {msg}", flush=True)


def corpus_lines() -> list[str]:
    """A deterministic English-like text to train the toy tokenizer on."""
    words = (
        "the a an of to in on for with from by and or but not is are was were be "
        "expert experts mixture router gate up down layer layers token tokens model "
        "weights stream streaming disk ssd memory cache slot slots ring claim release "
        "prefetch speculate hit miss evict bytes block blocks tensor tensors shape dtype "
        "float half brain quant quantized scale scales offset offsets header metadata "
        "vault blob blobs checksum engine kernel matrix vector hidden size feed forward "
        "attention head heads key value query norm rope embedding output logits sample "
        "greedy prompt reply fast slow small large tiny random seed file files shard "
        "shards split merge stack stacked fused pack packer scout reader writer "
        "mixtral qwen deepseek olmoe gpt oss llama gguf safetensors python rust swift "
        "hello world one two three four five six seven eight nine ten zero"
    ).split()
    rng = random.Random(SEED)
    lines = []
    for _ in range(3000):
        n = rng.randint(4, 14)
        s = " ".join(rng.choice(words) for _ in range(n))
        s = s[0].upper() + s[1:]
        s += rng.choice([".", ".", ".", "?", "!", ","]) + " " + str(rng.randint(0, 999))
        lines.append(s)
    return lines


def train_tokenizer(dst: Path) -> None:
    import sentencepiece as spm
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus_lines()),
        model_writer=buf,
        model_type="bpe",
        vocab_size=VOCAB,
        byte_fallback=True,
        character_coverage=1.0,
        normalization_rule_name="identity",
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        num_threads=1,
        minloglevel=2,
    )
    dst.write_bytes(buf.getvalue())
    sp = spm.SentencePieceProcessor(model_proto=buf.getvalue())
    assert sp.vocab_size() == VOCAB, sp.vocab_size()


# --------------------------------------------------------------------------
# transformers models (tiny, random, seeded)
# --------------------------------------------------------------------------
COMMON = dict(vocab_size=VOCAB, bos_token_id=1, eos_token_id=2, pad_token_id=None,
              max_position_embeddings=512, tie_word_embeddings=False)

HF_MODELS = {
    # Mixtral: per-expert tensors model.layers.N.block_sparse_moe.experts.E.w{1,2,3}.weight
    "mixtral-bf16": dict(
        model_type="mixtral", dtype="bfloat16",
        hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        num_local_experts=4, num_experts_per_tok=2),
    # Qwen3-MoE with 16 experts (so that experts.10 sorts before experts.2)
    "qwen3moe-f16": dict(
        model_type="qwen3_moe", dtype="float16",
        hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        num_experts=16, num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[]),
    # Qwen2-MoE: shared expert + shared_expert_gate, saved sharded
    "qwen2moe-f32-sharded": dict(
        model_type="qwen2_moe", dtype="float32",
        hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
        shared_expert_intermediate_size=64,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[]),
    # DeepSeek-V3: layer 0 dense (first_k_dense_replace=1), shared experts,
    # router e_score_correction_bias
    "deepseekv3-bf16": dict(
        model_type="deepseek_v3", dtype="bfloat16",
        hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
        num_hidden_layers=3, first_k_dense_replace=1,
        num_attention_heads=4, num_key_value_heads=4,
        q_lora_rank=32, kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=16,
        v_head_dim=16, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
        n_group=1, topk_group=1,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
    # gpt-oss: stacked mlp.experts.gate_up_proj [E, hidden, 2*ff] (gate/up
    # interleaved by column) and down_proj [E, ff, hidden], with biases
    "gptoss-bf16": dict(
        model_type="gpt_oss", dtype="bfloat16",
        hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        num_local_experts=4, num_experts_per_tok=2, sliding_window=64,
        layer_types=["sliding_attention", "full_attention"]),
    # Cohere2-MoE: only used as the source of the converter's fused
    # ffn_gate_up_exps GGUF (--fuse-gate-up-exps is refused for Qwen3-MoE and
    # Mixtral); not committed as safetensors.
    "cohere2moe-bf16": dict(
        model_type="cohere2_moe", dtype="bfloat16",
        hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        num_experts=4, num_experts_per_tok=2, sliding_window=64),
    # Only used as the source of the K-quant GGUF (ne0 must be a multiple of 256);
    # not committed.
    "mixtral256-f16": dict(
        model_type="mixtral", dtype="float16",
        hidden_size=256, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=1, head_dim=64,
        num_local_experts=4, num_experts_per_tok=2),
}

# which HF dirs are committed, and how they are saved
COMMITTED_HF = {
    "mixtral-bf16": {},
    "qwen3moe-f16": {},
    "qwen2moe-f32-sharded": {"max_shard_size": "64KB"},
    "deepseekv3-bf16": {},
    "gptoss-bf16": {},
}


def make_hf(name: str, work_hf: Path, tokenizer: Path) -> Path:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    spec = dict(HF_MODELS[name])
    mt = spec.pop("model_type")
    dtype = getattr(torch, spec.pop("dtype"))
    cfg = AutoConfig.for_model(mt, **{**COMMON, **spec})
    torch.manual_seed(SEED)
    model = AutoModelForCausalLM.from_config(cfg)
    model = model.to(dtype)
    d = work_hf / name
    if d.exists():
        shutil.rmtree(d)
    kw = COMMITTED_HF.get(name, {})
    model.save_pretrained(d, safe_serialization=True, **kw)
    shutil.copy(tokenizer, d / "tokenizer.model")
    log(f"transformers saved {name}: {sorted(p.name for p in d.iterdir())}")
    return d


# --------------------------------------------------------------------------
# GGUF outputs
# --------------------------------------------------------------------------
# (output name, HF source, converter args)
CONVERSIONS = [
    ("mixtral-f16.gguf", "mixtral-bf16", ["--outtype", "f16"]),
    ("mixtral-q8_0.gguf", "mixtral-bf16", ["--outtype", "q8_0"]),
    ("qwen3moe-bf16.gguf", "qwen3moe-f16", ["--outtype", "bf16"]),
    ("qwen3moe-q8_0.gguf", "qwen3moe-f16", ["--outtype", "q8_0"]),
    ("cohere2moe-q8_0-fused.gguf", "cohere2moe-bf16", ["--outtype", "q8_0", "--fuse-gate-up-exps"]),
    # split GGUF: qwen3moe-q8_0-split-0000K-of-0000N.gguf in a folder of its own
    ("qwen3moe-q8_0-split/qwen3moe-q8_0-split.gguf", "qwen3moe-f16",
     ["--outtype", "q8_0", "--split-max-size", "120K"]),
    ("qwen2moe-q8_0.gguf", "qwen2moe-f32-sharded", ["--outtype", "q8_0"]),
    ("deepseekv3-q8_0.gguf", "deepseekv3-bf16", ["--outtype", "q8_0"]),
    ("gptoss-f32.gguf", "gptoss-bf16", ["--outtype", "f32"]),
]


def run_convert(llama_src: Path, src: Path, out: Path, args: list[str]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, __file__, "_convert", str(llama_src), *args,
           "--outfile", str(out), str(src)]
    log("convert: " + " ".join(cmd[3:]))
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.stderr.write(r.stdout[-4000:] + r.stderr[-8000:])
        raise SystemExit(f"convert_hf_to_gguf failed for {out.name}")


def make_synthetic(out: Path) -> None:
    """A GGUF written by the `gguf` package: stacked experts whose types differ
    per layer and per role (Q8_0, Q4_0, BF16 fused gate_up, F16, MXFP4 with F32
    biases), general.alignment 64. Not a model llama.cpp runs."""
    import numpy as np
    import gguf
    from gguf import GGMLQuantizationType as T
    rng = np.random.RandomState(SEED)
    n_embd, n_ff, n_exp, n_layer, n_vocab = 64, 64, 4, 4, 32

    def rnd(*shape):
        return (rng.standard_normal(shape) * 0.05).astype(np.float32)

    w = gguf.GGUFWriter(str(out), "llama")
    w.data_alignment = 64
    w.add_custom_alignment(64)
    w.add_name("smoe synthetic mixed-type MoE")
    w.add_block_count(n_layer)
    w.add_context_length(128)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_expert_feed_forward_length(n_ff)
    w.add_head_count(4)
    w.add_head_count_kv(4)
    w.add_expert_count(n_exp)
    w.add_expert_used_count(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_string("smoe.fixture.note", "layer 0 Q8_0; layer 1 gate/up Q4_0, down Q8_0; "
                 "layer 2 fused gate_up BF16, down F16; layer 3 MXFP4 with F32 biases")

    def add(name, data, qtype):
        if qtype in (T.F32,):
            w.add_tensor(name, data.astype(np.float32))
        elif qtype == T.F16:
            w.add_tensor(name, data.astype(np.float16))
        else:
            q = gguf.quants.quantize(data, qtype)
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qtype)

    add("token_embd.weight", rnd(n_vocab, n_embd), T.F32)
    for b in range(n_layer):
        add(f"blk.{b}.attn_norm.weight", np.ones(n_embd, np.float32), T.F32)
        add(f"blk.{b}.ffn_norm.weight", np.ones(n_embd, np.float32), T.F32)
        add(f"blk.{b}.ffn_gate_inp.weight", rnd(n_exp, n_embd), T.F32)
        gate, up, down = rnd(n_exp, n_ff, n_embd), rnd(n_exp, n_ff, n_embd), rnd(n_exp, n_embd, n_ff)
        if b == 0:
            add(f"blk.{b}.ffn_gate_exps.weight", gate, T.Q8_0)
            add(f"blk.{b}.ffn_up_exps.weight", up, T.Q8_0)
            add(f"blk.{b}.ffn_down_exps.weight", down, T.Q8_0)
        elif b == 1:
            add(f"blk.{b}.ffn_gate_exps.weight", gate, T.Q4_0)
            add(f"blk.{b}.ffn_up_exps.weight", up, T.Q4_0)
            add(f"blk.{b}.ffn_down_exps.weight", down, T.Q8_0)
        elif b == 2:
            add(f"blk.{b}.ffn_gate_up_exps.weight", np.concatenate([gate, up], axis=1), T.BF16)
            add(f"blk.{b}.ffn_down_exps.weight", down, T.F16)
        else:
            add(f"blk.{b}.ffn_gate_exps.weight", gate, T.MXFP4)
            add(f"blk.{b}.ffn_up_exps.weight", up, T.MXFP4)
            add(f"blk.{b}.ffn_down_exps.weight", down, T.MXFP4)
            add(f"blk.{b}.ffn_gate_exps.bias", rnd(n_exp, n_ff), T.F32)
            add(f"blk.{b}.ffn_up_exps.bias", rnd(n_exp, n_ff), T.F32)
            add(f"blk.{b}.ffn_down_exps.bias", rnd(n_exp, n_embd), T.F32)
    add("output_norm.weight", np.ones(n_embd, np.float32), T.F32)
    add("output.weight", rnd(n_vocab, n_embd), T.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    log(f"gguf package wrote {out.name}")


# --------------------------------------------------------------------------
# EXPECTED.json from independent readers
# --------------------------------------------------------------------------
ST_PER_EXPERT = re.compile(
    r"^model\.layers\.(\d+)\.(mlp|block_sparse_moe)\.experts\.(\d+)\."
    r"(gate_proj|up_proj|down_proj|w1|w2|w3)\.weight$")
ST_STACKED = re.compile(
    r"^model\.layers\.(\d+)\.mlp\.experts\.(gate_up_proj|gate_proj|up_proj|down_proj)(_bias)?$")
GGUF_EXPERT = re.compile(r"^blk\.(\d+)\.ffn_(gate|up|down|gate_up)_exps\.(weight|bias)$")
ROLE = {"gate_proj": "gate", "w1": "gate", "up_proj": "up", "w3": "up",
        "down_proj": "down", "w2": "down", "gate_up_proj": "gate_up"}
ROLE_ORDER = ["gate", "up", "gate_up", "down",
              "gate_bias", "up_bias", "gate_up_bias", "down_bias"]


def st_header(p: Path):
    with open(p, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
    return 8 + n, hdr


def read_safetensors_fixture(files: list[Path], base: Path):
    """Tensors as seen by the safetensors package (dtype, shape, bytes), with
    absolute offsets from the header."""
    import torch
    from safetensors import safe_open
    tensors = []
    meta = None
    for p in files:
        data_start, hdr = st_header(p)
        with safe_open(str(p), framework="pt") as f:
            m = f.metadata()
            if meta is None:
                meta = m
            for k in f.keys():
                sl = f.get_slice(k)
                dtype, shape = sl.get_dtype(), list(sl.get_shape())
                b, e = hdr[k]["data_offsets"]
                assert hdr[k]["dtype"] == dtype and hdr[k]["shape"] == shape
                t = f.get_tensor(k).contiguous()
                raw = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
                assert len(raw) == e - b, (k, len(raw), e - b)
                assert hashlib.sha256(raw).hexdigest() == sha256_range(p, data_start + b, e - b)
                tensors.append(dict(name=k, file=str(p.relative_to(base)), dtype=dtype,
                                    shape=shape, offset=data_start + b, nbytes=e - b,
                                    sha256=hashlib.sha256(raw).hexdigest()))
    return tensors, meta or {}


def read_gguf_fixture(files: list[Path], base: Path):
    from gguf import GGUFReader
    tensors, kvs = [], {}
    for p in files:
        r = GGUFReader(str(p))
        kvs[str(p.relative_to(base))] = {
            fld.name: fld.types[0].name for fld in r.fields.values()
            if not fld.name.startswith("GGUF.")}
        for t in r.tensors:
            digest = sha256_range(p, int(t.data_offset), int(t.n_bytes))
            # the reader's own view of the data must be those bytes
            assert hashlib.sha256(t.data.tobytes()).hexdigest() == digest, t.name
            tensors.append(dict(name=t.name, file=str(p.relative_to(base)),
                                dtype=t.tensor_type.name, shape=[int(x) for x in t.shape],
                                offset=int(t.data_offset), nbytes=int(t.n_bytes),
                                sha256=digest))
    alignment = None
    r0 = GGUFReader(str(files[0]))
    if "general.alignment" in r0.fields:
        alignment = int(r0.fields["general.alignment"].contents())
    return tensors, kvs, alignment


def expert_slices(fmt: str, tensors: list[dict]):
    """Per (layer, expert, role) the byte range of that expert's slice."""
    slices, expert_names = [], set()
    for t in tensors:
        if fmt == "gguf":
            m = GGUF_EXPERT.match(t["name"])
            if not m:
                continue
            layer, role = int(m.group(1)), m.group(2) + ("_bias" if m.group(3) == "bias" else "")
            n_exp = t["shape"][-1]   # ne[last] is the expert
            per = t["nbytes"] // n_exp
            assert per * n_exp == t["nbytes"]
            for e in range(n_exp):
                slices.append(dict(layer=layer, expert=e, role=role, tensor=t["name"],
                                   file=t["file"], dtype=t["dtype"], shape=t["shape"][:-1],
                                   offset=t["offset"] + e * per, nbytes=per))
            expert_names.add(t["name"])
            continue
        m = ST_PER_EXPERT.match(t["name"])
        if m:
            slices.append(dict(layer=int(m.group(1)), expert=int(m.group(3)),
                               role=ROLE[m.group(4)], tensor=t["name"], file=t["file"],
                               dtype=t["dtype"], shape=t["shape"], offset=t["offset"],
                               nbytes=t["nbytes"]))
            expert_names.add(t["name"])
            continue
        m = ST_STACKED.match(t["name"])
        if m:
            layer, role = int(m.group(1)), ROLE[m.group(2)] + ("_bias" if m.group(3) else "")
            n_exp = t["shape"][0]    # outermost dimension is the expert
            per = t["nbytes"] // n_exp
            for e in range(n_exp):
                slices.append(dict(layer=layer, expert=e, role=role, tensor=t["name"],
                                   file=t["file"], dtype=t["dtype"], shape=t["shape"][1:],
                                   offset=t["offset"] + e * per, nbytes=per))
            expert_names.add(t["name"])
    slices.sort(key=lambda s: (s["layer"], s["expert"], ROLE_ORDER.index(s["role"])))
    return slices, expert_names


def dequant(fmt, base: Path, s: dict):
    """The slice as float64 in row-major [rows, cols] of the matrix y = W x
    (for GGUF rows = ne1, cols = ne0)."""
    import numpy as np
    import gguf
    raw = np.fromfile(base / s["file"], dtype=np.uint8, count=s["nbytes"], offset=s["offset"])
    if fmt == "gguf":
        qt = gguf.GGMLQuantizationType[s["dtype"]]
        ne = s["shape"]
        if qt == gguf.GGMLQuantizationType.F32:
            v = raw.view(np.float32)
        elif qt == gguf.GGMLQuantizationType.F16:
            v = raw.view(np.float16)
        else:
            v = gguf.quants.dequantize(raw.reshape(1, -1), qt).reshape(-1)
        return v.astype(np.float64).reshape(list(reversed(ne)))
    dt = s["dtype"]
    if dt == "F32":
        v = raw.view(np.float32)
    elif dt == "F16":
        v = raw.view(np.float16)
    elif dt == "BF16":
        v = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    else:
        raise ValueError(dt)
    return v.astype(np.float64).reshape(s["shape"])


def reference_ffn(fmt, base: Path, slices: list[dict], layer: int, expert: int, arch: str):
    """y = down . (silu(gate . x) * (up . x)) as docs/pack.md, "From a blob to your kernels", has it (biases ignored)."""
    import numpy as np
    mine = {s["role"]: s for s in slices if s["layer"] == layer and s["expert"] == expert}
    note = None
    if "gate_up" in mine:
        gu = dequant(fmt, base, mine["gate_up"])
        if fmt == "safetensors":
            # gpt-oss: [hidden, 2*ff], gate = even columns, up = odd columns
            gu = gu.T
            gate, up = gu[0::2], gu[1::2]
            note = ("gpt-oss layout: gate_up slice is [n_embd, 2*n_ff] (input-major); "
                    "gate = columns 0::2, up = columns 1::2; down slice is [n_ff, n_embd]")
        else:
            n_ff = gu.shape[0] // 2
            gate, up = gu[:n_ff], gu[n_ff:]
            note = "fused GGUF gate_up: rows [0, n_ff) are gate, [n_ff, 2*n_ff) are up"
    else:
        gate, up = dequant(fmt, base, mine["gate"]), dequant(fmt, base, mine["up"])
    down = dequant(fmt, base, mine["down"])
    if fmt == "safetensors" and "gate_up" in mine:
        down = down.T
    n_embd = gate.shape[1]
    x = np.array([((i * 7) % 13 - 6) / 8.0 for i in range(n_embd)], dtype=np.float64)
    g, u = gate @ x, up @ x
    h = g / (1.0 + np.exp(-g)) * u
    y = down @ h
    out = dict(layer=layer, expert=expert,
               input_formula="x[i] = ((i*7) % 13 - 6) / 8 for i in 0..n_embd",
               input=[float(v) for v in x], output=[float(f"{v:.9g}") for v in y],
               computed="float64 from the dequantized slices (gguf.quants.dequantize for quantized types)")
    if note:
        out["note"] = note
    return out


def describe(name: str, fmt: str, files: list[Path], base: Path, info: dict) -> dict:
    if fmt == "gguf":
        tensors, kvs, alignment = read_gguf_fixture(files, base)
    else:
        tensors, meta = read_safetensors_fixture(files, base)
    slices, expert_names = expert_slices(fmt, tensors)
    for s in slices:
        s["sha256"] = sha256_range(base / s["file"], s["offset"], s["nbytes"])
    for t in tensors:
        t["expert"] = t["name"] in expert_names
    layers = sorted({s["layer"] for s in slices})
    experts = sorted({s["expert"] for s in slices})
    roles = {}
    for s in slices:
        roles.setdefault(str(s["layer"]), {})[s["role"]] = dict(dtype=s["dtype"], shape=s["shape"],
                                                              nbytes=s["nbytes"])
    d = dict(
        format=fmt,
        files=[dict(path=str(p.relative_to(base)), size=p.stat().st_size, sha256=sha256_file(p))
               for p in files],
        **info,
        expert_layers=layers,
        n_experts=len(experts),
        layer_roles=roles,
        expert_slices=slices,
        tensors=tensors,
    )
    if fmt == "gguf":
        d["alignment"] = alignment if alignment is not None else 32
        d["alignment_key_present"] = alignment is not None
        first = d["files"][0]["path"]
        d["kv_keys"] = kvs[first]
        if len(files) > 1:
            d["kv_keys_of_other_parts"] = {k: sorted(v) for k, v in kvs.items() if k != first}
    else:
        d["metadata"] = meta
    if layers:
        d["reference_ffn"] = [reference_ffn(fmt, base, slices, l, min(1, experts[-1]),
                                            info.get("architecture", "")) for l in layers]
    return d


# --------------------------------------------------------------------------
def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_convert":
        convert_main(sys.argv[2], sys.argv[3:])
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--work", required=True, type=Path)
    ap.add_argument("--llama-src", required=True, type=Path,
                    help="vendor/llama.cpp of the llama-cpp-python sdist")
    ap.add_argument("--llama-build", type=Path, default=None,
                    help="a cmake build dir holding bin/llama-quantize (K-quants) and bin/llama-simple (smoke run)")
    a = ap.parse_args()
    out, work = a.out.resolve(), a.work.resolve()
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    # start from a clean fixture folder (only the files this script makes)
    for p in list(out.iterdir()):
        shutil.rmtree(p) if p.is_dir() else p.unlink()

    tok = out / "tokenizer.model"
    train_tokenizer(tok)
    log(f"tokenizer.model: {tok.stat().st_size} bytes, vocab {VOCAB}")

    work_hf = work / "hf"
    work_hf.mkdir(exist_ok=True)
    for name in HF_MODELS:
        if name == "mixtral256-f16" and a.llama_build is None:
            continue
        make_hf(name, work_hf, tok)

    # the committed safetensors folders: weights + config (tokenizer.model is shared)
    for name in COMMITTED_HF:
        dst = out / name
        dst.mkdir()
        for p in sorted((work_hf / name).iterdir()):
            if p.name == "tokenizer.model":
                continue
            shutil.copy(p, dst / p.name)

    for fname, src, args in CONVERSIONS:
        run_convert(a.llama_src, work_hf / src, out / fname, args)

    if a.llama_build is not None:
        qbin = a.llama_build / "bin" / "llama-quantize"
        f16 = work / "mixtral256-f16.gguf"
        run_convert(a.llama_src, work_hf / "mixtral256-f16", f16, ["--outtype", "f16"])
        dst = out / "mixtral256-q4_k_m.gguf"
        log(f"llama-quantize {f16.name} -> {dst.name} Q4_K_M")
        subprocess.run([str(qbin), str(f16), str(dst), "Q4_K_M", "1"], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    make_synthetic(out / "synthetic-mixed.gguf")

    # EXPECTED.json
    fixtures = {}
    for name in COMMITTED_HF:
        d = out / name
        cfg = json.loads((d / "config.json").read_text())
        files = sorted(d.glob("*.safetensors"))
        info = dict(architecture=cfg["architectures"][0], writer="transformers save_pretrained",
                    n_layers=cfg["num_hidden_layers"], n_embd=cfg["hidden_size"],
                    sharded=(d / "model.safetensors.index.json").exists(),
                    source=str(d.relative_to(out)))
        if info["sharded"]:
            idx = json.loads((d / "model.safetensors.index.json").read_text())
            info["index"] = "model.safetensors.index.json"
            info["index_tensor_count"] = len(idx["weight_map"])
        fixtures[name] = describe(name, "safetensors", files, out, info)
    gguf_files = sorted(p for p in out.rglob("*.gguf"))
    groups: dict[str, list[Path]] = {}
    for p in gguf_files:
        m = re.match(r"^(.*)-(\d{5})-of-(\d{5})\.gguf$", p.name)
        key = str(p.relative_to(out).parent / m.group(1)) if m else str(p.relative_to(out))[:-5]
        groups.setdefault(key, []).append(p)
    conv_src = {Path(f).name[:-5]: s for f, s, _ in CONVERSIONS}
    ran = smoke(a.llama_build, groups) if a.llama_build is not None else {}
    for key, files in sorted(groups.items()):
        from gguf import GGUFReader
        r = GGUFReader(str(files[0]))
        arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
        bc = int(r.fields[f"{arch}.block_count"].contents())
        emb = int(r.fields[f"{arch}.embedding_length"].contents())
        base = Path(key).name
        if base == "synthetic-mixed":
            writer = "gguf package GGUFWriter (gguf.quants)"
        elif base == "mixtral256-q4_k_m":
            writer = "llama.cpp llama-quantize Q4_K_M (from convert_hf_to_gguf.py --outtype f16)"
        else:
            writer = "llama.cpp convert_hf_to_gguf.py " + " ".join(
                next(args for f, s, args in CONVERSIONS if Path(f).name[:-5] == base))
        info = dict(architecture=arch, writer=writer, n_layers=bc, n_embd=emb,
                    split=len(files) > 1, source=str(files[0].relative_to(out)))
        if base in conv_src:
            info["converted_from"] = conv_src[base]
        if key in ran:
            info["llama_simple"] = ran[key]
        fixtures[Path(key).name] = describe(key, "gguf", files, out, info)

    # size checks
    total = 0
    for p in sorted(out.rglob("*")):
        if p.is_file():
            sz = p.stat().st_size
            total += sz
            if sz > MAX_FILE:
                raise SystemExit(f"{p} is {sz} bytes, over the 2 MB per-file limit")
    versions = package_versions(a.llama_src)
    doc = dict(
        comment=("Ground truth read back by independent readers (safetensors package + JSON "
                 "header; gguf.GGUFReader). Offsets are absolute byte offsets in the file; "
                 "safetensors shapes are row-major as in the header; GGUF shapes are ggml ne[] "
                 "(ne0 first); a stacked slice's shape drops the expert dimension. "
                 "expert_slices are in blob order: layer, expert, then gate, up (or gate_up), "
                 "down, then biases."),
        generated_by="scripts/make-model-fixtures.sh",
        versions=versions,
        fixtures=fixtures,
    )
    (out / "EXPECTED.json").write_text(compact_json(doc) + "\n")
    write_readme(out, doc)
    total = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    log(f"total size of {out}: {total} bytes")
    if total > MAX_TOTAL:
        raise SystemExit(f"fixtures total {total} bytes, over 10 MB")


NOTES = {
    "mixtral-bf16": "Mixtral per-expert tensors `block_sparse_moe.experts.E.w1` (gate), `w3` (up), "
                    "`w2` (down); router `block_sparse_moe.gate`.",
    "qwen3moe-f16": "16 experts, so the header order (dtype, then name) puts `experts.10` before "
                    "`experts.2`; router `mlp.gate`; q_norm/k_norm.",
    "qwen2moe-f32-sharded": "Sharded by `save_pretrained(max_shard_size=\"64KB\")`: "
                            "`model.safetensors.index.json` + 11 shards; each expert's down, gate "
                            "and up sit in three different shards. Shared expert "
                            "`mlp.shared_expert.*` and `mlp.shared_expert_gate` are not experts.",
    "deepseekv3-bf16": "3 layers, `first_k_dense_replace=1`: layer 0 is dense (`mlp.gate_proj` "
                       "etc., no experts). Shared experts `mlp.shared_experts.*` and "
                       "`mlp.gate.e_score_correction_bias` are not experts.",
    "gptoss-bf16": "Stacked experts: `mlp.experts.gate_up_proj` is [E, n_embd, 2*n_ff] "
                   "(input-major, gate and up interleaved by column: gate = 0::2, up = 1::2), "
                   "`mlp.experts.down_proj` is [E, n_ff, n_embd], biases `gate_up_proj_bias` "
                   "[E, 2*n_ff] and `down_proj_bias` [E, n_embd]; router `mlp.router` with bias.",
    "cohere2moe-q8_0-fused": "The converter's fused `blk.N.ffn_gate_up_exps.weight` "
                             "(ne=[n_embd, 2*n_ff, E]: each expert's gate rows, then its up rows), "
                             "from a Cohere2-MoE model (`--fuse-gate-up-exps` is refused for "
                             "Mixtral and Qwen3-MoE).",
    "deepseekv3-q8_0": "deepseek2 arch; blk.0 dense (`ffn_gate/up/down`); `*_shexp` and "
                       "`exp_probs_b.bias` are not experts; attention tensors with ne0 = 16/32 "
                       "stay as the converter chose.",
    "gptoss-f32": "gpt-oss as converted from unquantized weights: separate gate/up/down exps "
                  "plus `ffn_{gate,up,down}_exps.bias` (ne=[n, E]); router bias "
                  "`ffn_gate_inp.bias`; attention sinks.",
    "mixtral-f16": "llama arch, stacked `blk.N.ffn_{gate,up,down}_exps.weight`.",
    "mixtral-q8_0": "llama arch, stacked Q8_0 experts; norms and router stay F32.",
    "mixtral256-q4_k_m": "K-quants by llama-quantize Q4_K_M from a hidden-256 Mixtral: types "
                         "differ per layer (see the dtypes column).",
    "qwen2moe-q8_0": "Shared expert `ffn_{gate,up,down}_shexp` and `ffn_gate_inp_shexp` are "
                     "not experts.",
    "qwen3moe-bf16": "16 experts, BF16 experts.",
    "qwen3moe-q8_0": "16 experts, Q8_0.",
    "qwen3moe-q8_0-split": "Split GGUF (`--split-max-size 120K`): 4 parts "
                           "`-0000K-of-00004.gguf`; the first holds every key/value plus "
                           "`split.*`, the others only `split.*` keys; experts of layer 0 are "
                           "in parts 1 and 2.",
    "synthetic-mixed": "Not a runnable model: `general.alignment` = 64, stacked experts with "
                       "per-layer and per-role types: layer 0 Q8_0; layer 1 gate/up Q4_0, "
                       "down Q8_0; layer 2 fused `ffn_gate_up_exps` BF16 + down F16; layer 3 "
                       "MXFP4 with F32 `ffn_*_exps.bias`.",
}


def write_readme(out: Path, doc: dict) -> None:
    v = doc["versions"]
    fx = doc["fixtures"]
    L = []
    L.append("""# Model fixtures

Small **real** MoE model files written by other people's writers, for the
tests of `smoe pack` (docs/pack.md) and the llama.cpp client (docs/llama.md). Nothing
here was written by smoe's own code.

**Generated, not hand-edited.** `scripts/make-model-fixtures.sh` made every
file in this folder, this README included (the script and its Python half,
`scripts/make-model-fixtures.py`, are the source). **CI never runs it**: CI
uses the committed files and never installs torch. To regenerate (about 6 GB
of venv, a few minutes plus a one-off llama.cpp build):

    scripts/make-model-fixtures.sh        # SMOE_FIXTURE_VENV, SMOE_FIXTURE_CACHE to relocate

The weights are random (seeded, `torch.manual_seed(%d)`); the output is
byte-for-byte reproducible with the versions below (two runs compared).

## Writers

- **safetensors**: Hugging Face `transformers` `AutoModelForCausalLM.from_config(cfg)`
  then `save_pretrained(dir, safe_serialization=True)`; tiny configs (hidden 64,
  2-3 layers, 4 or 16 experts). `config.json` and `generation_config.json`
  are kept beside the weights.
- **GGUF**: llama.cpp's `convert_hf_to_gguf.py` from the `llama-cpp-python`
  %s source distribution (`vendor/llama.cpp`, with its `conversion/` package
  and `gguf-py`), run on those safetensors. Its converter classes for
  Qwen2/3-MoE, DeepSeek, gpt-oss and Cohere2-MoE expect a BPE `tokenizer.json`;
  a wrapper in the script routes their `set_vocab` to the sentencepiece path
  (`_set_vocab_sentencepiece`), as Mixtral's class does by itself.
  `mixtral256-q4_k_m.gguf` is then `llama-quantize ... Q4_K_M` built from the
  same sdist.
- **synthetic GGUF**: the `gguf` Python package (`GGUFWriter`, `gguf.quants.quantize`).
- **tokenizer**: `tokenizer.model` is a sentencepiece BPE model with
  `byte_fallback=True`, %d pieces, trained by the `sentencepiece` package on a
  seeded generated text; every model's `vocab_size` is %d. llama.cpp needs the
  byte fallback to run a model.

## Versions
""" % (SEED, v["llama-cpp-python sdist"], VOCAB, VOCAB))
    for k, val in v.items():
        L.append(f"- {k}: `{val}`")
    L.append("""
## EXPECTED.json

The ground truth for tests, read back by independent readers (the
`safetensors` package with the file's JSON header for offsets;
`gguf.GGUFReader`), never by smoe's parser. Per fixture:

- `files` (path, size, sha256), `architecture`, `writer`, `n_layers`,
  `n_embd`, `expert_layers`, `n_experts`, `layer_roles` (per layer and role:
  dtype, slice shape, bytes);
- `expert_slices`: one entry per (layer, expert, role) in blob order (gate, up
  or gate_up, down, then biases), with the source `tensor`, `file`, absolute
  `offset`, `nbytes` and `sha256` of that expert's bytes. For a stacked tensor
  the slice is `[offset + e*nbytes, offset + (e+1)*nbytes)`;
- `tensors`: every tensor (name, file, dtype, shape, absolute offset, nbytes,
  sha256, `expert` true/false), so a test can check the scout holds exactly
  the non-expert ones;
- GGUF: `kv_keys` (name and GGUF value type; for a split model those of the
  first part, and `kv_keys_of_other_parts`), `alignment`,
  `alignment_key_present`; safetensors: `metadata` (`__metadata__`);
- `reference_ffn`: for expert 1 of every expert layer, an input `x` and the output
  `y = down . (silu(gate . x) * (up . x))` (docs/pack.md, "From a blob to your kernels"; biases ignored),
  computed in float64 from the dequantized slices;
- `llama_simple` (GGUF, when the build was there): whether the pinned
  llama.cpp's `llama-simple` loads and runs the file, and what it printed
  (greedy, 8 tokens, prompt `Hello world`, a `GGML_NATIVE=OFF` CPU build).

Shapes: safetensors shapes are row-major as in the header; GGUF shapes are
ggml `ne[]`, `ne0` first; a stacked slice's shape drops the expert dimension.

## Fixtures
""")
    L.append("| fixture | files | arch | writer | layers (with experts) | experts | expert dtypes |")
    L.append("|---|---|---|---|---|---|---|")
    for name, f in fx.items():
        size = sum(x["size"] for x in f["files"])
        nfiles = len(f["files"])
        types = ", ".join(sorted({x["dtype"] for rr in f["layer_roles"].values()
                                  for x in rr.values()}))
        w = f["writer"].split(" ")[0] if not f["writer"].startswith("llama.cpp") else (
            "llama-quantize" if "quantize" in f["writer"] else "convert_hf_to_gguf")
        if f["writer"].startswith("gguf"):
            w = "gguf package"
        L.append(f"| `{name}` | {nfiles} ({size:,} B) | {f['architecture']} | {w} | "
                 f"{f['n_layers']} ({', '.join(map(str, f['expert_layers']))}) | "
                 f"{f['n_experts']} | {types} |")
    L.append("")
    for name, f in fx.items():
        L.append(f"### `{name}`\n")
        L.append(f"- {NOTES.get(name, '')}")
        L.append(f"- writer: {f['writer']}" + (f" (from `{f['converted_from']}`)"
                                                 if "converted_from" in f else ""))
        roles = "; ".join(f"layer {l}: " + ", ".join(f"{r} {x['dtype']} {x['shape']}"
                                                     for r, x in rr.items())
                          for l, rr in f["layer_roles"].items())
        L.append(f"- layers {f['n_layers']}, experts in layers {f['expert_layers']}, "
                 f"{f['n_experts']} experts; n_embd {f['n_embd']}")
        L.append(f"- expert slices: {roles}")
        names = []
        for s in f["expert_slices"]:
            if s["tensor"] not in names:
                names.append(s["tensor"])
        L.append("- expert tensors (first of " + str(len(names)) + "): " +
                 ", ".join(f"`{n}`" for n in names[:4]))
        if "llama_simple" in f:
            ls = f["llama_simple"]
            L.append("- llama.cpp `llama-simple`: " + ("runs" if ls["runs"] else
                                                         "fails: `" + ls["error"] + "`"))
        L.append("- files:")
        for x in f["files"]:
            L.append(f"  - `{x['path']}` {x['size']:,} B, sha256 `{x['sha256']}`")
        L.append("")
    L.append(README_TAIL)
    total = sum(p.stat().st_size for p in out.rglob("*") if p.is_file() and p.name != "README.md")
    L.append(f"\nAll files here but this README: {total:,} bytes.")
    (out / "README.md").write_text("\n".join(L) + "\n")


README_TAIL = """## What did not work, and the way around it

- `pip download --no-binary :all: llama-cpp-python==0.3.36` builds the sdist's
  build dependency `cmake` from source just to read the metadata (long);
  `--no-binary llama-cpp-python` fetches the same sdist (sha256 checked).
- `convert_hf_to_gguf.py --fuse-gate-up-exps` is refused for Qwen3-MoE and
  Mixtral (`Missing FFN_GATE_UP_EXP for MODEL_TENSORS of QWEN3MOE`): only some
  architectures (Qwen3-Next, Qwen3.5-MoE, Gemma4, Cohere2-MoE, ...) allow it.
  The fused fixture is therefore a Cohere2-MoE model.
- The converter classes of Qwen2/3-MoE, DeepSeek-V3, gpt-oss and Cohere2-MoE
  want a BPE `tokenizer.json`; their `set_vocab` is pointed at the
  sentencepiece path by the wrapper (`_convert` in the script).
- OLMoE is left out: its tensor names are those of Qwen3-MoE. It converts,
  but the pinned llama.cpp loads it only when `num_key_value_heads` equals
  `num_attention_heads`; with fewer KV heads it stops at
  `tensor 'blk.0.attn_k_norm.weight' has wrong shape; expected 64, got 32`.
- gpt-oss from `from_config` is unquantized, so its GGUF has F32 (not MXFP4)
  experts; MXFP4 stacked experts are in `synthetic-mixed.gguf`.
- transformers 5 holds MoE experts fused in memory but `save_pretrained`
  writes the per-expert checkpoint names (`experts.E.gate_proj.weight`, Mixtral
  `w1/w2/w3`); gpt-oss is the one saved stacked.
- K-quants need `ne0` a multiple of 256, hence the separate hidden-256 Mixtral
  for `mixtral256-q4_k_m.gguf` (its F16 source is not committed).
"""


def compact_json(o, ind: int = 0) -> str:
    """JSON with one line per flat object or list (a slice, a tensor)."""
    def flat(v):
        if isinstance(v, dict):
            return all(not isinstance(x, (dict, list)) or (isinstance(x, list) and all(
                not isinstance(y, (dict, list)) for y in x)) for x in v.values())
        if isinstance(v, list):
            return all(not isinstance(y, (dict, list)) for y in v)
        return True
    if flat(o):
        return json.dumps(o)
    pad, pad1 = " " * ind, " " * (ind + 1)
    if isinstance(o, dict):
        items = [f"{pad1}{json.dumps(k)}: {compact_json(v, ind + 1)}" for k, v in o.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    items = [pad1 + compact_json(v, ind + 1) for v in o]
    return "[\n" + ",\n".join(items) + "\n" + pad + "]"


def package_versions(llama_src: Path) -> dict:
    from importlib.metadata import version
    v = {p: version(p) for p in ("torch", "transformers", "safetensors", "sentencepiece",
                                 "gguf", "numpy")}
    v["python"] = sys.version.split()[0]
    pyproj = (llama_src / "gguf-py" / "pyproject.toml").read_text()
    v["llama.cpp gguf-py (vendored, used by the converter)"] = re.search(
        r'^version = "([^"]+)"', pyproj, re.M).group(1)
    v["llama-cpp-python sdist"] = os.environ.get("SMOE_LLAMA_CPP_PYTHON_VERSION", "?")
    v["llama-cpp-python sdist sha256"] = os.environ.get("SMOE_LLAMA_CPP_PYTHON_SHA256", "?")
    return v


def smoke(build: Path, groups: dict) -> dict:
    """Does llama.cpp itself load and run each GGUF? (greedy, 8 tokens; the
    synthetic file is not a runnable model)"""
    simple = build / "bin" / "llama-simple"
    res = {}
    if not simple.exists():
        return res
    for key, files in sorted(groups.items()):
        if key.endswith("synthetic-mixed"):
            continue
        cmd = [str(simple), "-m", str(files[0]), "-n", "8", "Hello world"]
        r = subprocess.run(cmd, capture_output=True, text=True,
                           errors="backslashreplace", timeout=300)
        if r.returncode == 0:
            res[key] = dict(runs=True, command="llama-simple -m FILE -n 8 'Hello world'",
                            stdout=r.stdout.strip())
        else:
            err = [l for l in r.stderr.strip().splitlines() if l.strip()]
            res[key] = dict(runs=False, error=(err or ["?"])[-1])
        log(f"llama-simple {key}: {res[key]}")
    return res


if __name__ == "__main__":
    main()
