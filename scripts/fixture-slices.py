#!/usr/bin/env python3
"""Every expert slice of a GGUF file as llama.cpp's own gguf-py reads it
(GGUFReader): for each stacked expert tensor `blk.N.ffn_*_exps.*`, its type,
and per expert the absolute file offset, the length and the sha256 of the
slice. The ground truth a test compares smoe's in-place reads with, written
by a reader that is not smoe's.

    python3 scripts/fixture-slices.py GGUF_PY FILE.gguf > FILE.slices.json

GGUF_PY is llama.cpp's gguf-py directory (scripts/llama.sh extracts it under
$SMOE_LLAMA_DIR/llama.cpp/gguf-py); numpy must be installed.
"""
import hashlib
import json
import os
import re
import sys

if len(sys.argv) != 3:
    sys.exit(__doc__)
sys.path.insert(0, sys.argv[1])
from gguf import GGUFReader  # noqa: E402

path = sys.argv[2]
reader = GGUFReader(path)
raw = open(path, "rb").read()
slices = []
for t in reader.tensors:
    m = re.fullmatch(r"blk\.(\d+)\.ffn_(gate|up|down|gate_up)_exps\.(weight|bias)", t.name)
    if not m:
        continue
    n_experts = int(t.shape[-1])
    stride = int(t.n_bytes) // n_experts
    for e in range(n_experts):
        at = int(t.data_offset) + e * stride
        slices.append({
            "layer": int(m.group(1)),
            "expert": e,
            "role": m.group(2) if m.group(3) == "weight" else m.group(2) + "_bias",
            "tensor": t.name,
            "dtype": t.tensor_type.name,
            "offset": at,
            "nbytes": stride,
            "sha256": hashlib.sha256(raw[at:at + stride]).hexdigest(),
        })
json.dump({"file": os.path.basename(path), "expert_slices": slices}, sys.stdout, indent=1)
print()
