#!/usr/bin/env python3
"""A dense Qwen3 GGUF from a Qwen3-MoE one, for a draft model that shares
its vocabulary: every key/value of SOURCE under the `qwen3` architecture
(the expert keys dropped, `qwen3.feed_forward_length` set to the experts'
FFN width), its non-layer tensors, each layer's attention and norms, and
as each layer's dense FFN (`ffn_gate`, `ffn_up`, `ffn_down`) the bytes of
its expert 0. The router is dropped. Bytes are copied unchanged, with
llama.cpp's own gguf-py (GGUFReader, GGUFWriter).

    python3 scripts/derive-dense.py GGUF_PY SOURCE DEST

GGUF_PY is llama.cpp's gguf-py directory (scripts/llama.sh extracts it under
$SMOE_LLAMA_DIR/llama.cpp/gguf-py); numpy must be installed. Made
tests/fixtures/models/derived/qwen3-q8_0-dense.gguf (see its README.md).
"""
import sys

import numpy as np

if len(sys.argv) != 4:
    sys.exit(__doc__)
sys.path.insert(0, sys.argv[1])
from gguf import GGUFReader, GGUFValueType, GGUFWriter  # noqa: E402

source, dest = sys.argv[2], sys.argv[3]
reader = GGUFReader(source)


def text(field, i):
    return bytes(field.parts[i]).decode("utf-8", "surrogateescape")


arch = text(reader.fields["general.architecture"], reader.fields["general.architecture"].data[0])
if arch != "qwen3moe":
    sys.exit(f"{source} is {arch}, not qwen3moe")
n_ff_exp = int(reader.fields["qwen3moe.expert_feed_forward_length"].parts[-1][0])
writer = GGUFWriter(dest, "qwen3")
for name, field in reader.fields.items():
    if name.startswith("GGUF.") or name == "general.architecture":
        continue
    if name.startswith("qwen3moe."):
        key = name[len("qwen3moe."):]
        if key.startswith("expert_"):
            continue
        name = "qwen3." + key
    kind = field.types[0]
    if name == "qwen3.feed_forward_length":
        writer.add_uint32(name, n_ff_exp)
    elif kind == GGUFValueType.ARRAY:
        if field.types[1] == GGUFValueType.STRING:
            writer.add_array(name, [text(field, i) for i in field.data])
        else:
            writer.add_array(name, [field.parts[i][0].item() for i in field.data])
    elif kind == GGUFValueType.STRING:
        writer.add_string(name, text(field, field.data[0]))
    else:
        writer.add_key_value(name, field.parts[field.data[0]][0].item(), kind)

for tensor in reader.tensors:
    name = tensor.name
    if name.endswith(".ffn_gate_inp.weight"):
        continue
    data = np.array(tensor.data)
    if name.endswith("_exps.weight"):
        name = name.replace("_exps.weight", ".weight")
        data = data[0]  # expert 0: the outermost dimension
    writer.add_tensor(name, data, raw_dtype=tensor.tensor_type)
writer.write_header_to_file()
writer.write_kv_data_to_file()
writer.write_tensors_to_file()
writer.close()
