#!/usr/bin/env python3
"""A deeper GGUF from a shallower one: every key/value of SOURCE (with
`<arch>.block_count` set to N_LAYERS), its non-layer tensors, and layer i's
tensors copied from SOURCE's layer i mod (its layer count). Bytes are copied
unchanged, with llama.cpp's own gguf-py (GGUFReader, GGUFWriter).

    python3 scripts/derive-fixture.py GGUF_PY SOURCE DEST N_LAYERS [--still]

--still: every layer is a copy of SOURCE's layer 0, and each layer's
attention output and experts' down projection are zero bytes (a Q8_0 block
of zero bytes is a zero scale and zero values), so no layer moves the
hidden state: every layer routes a token as the first one does, and the
next layer's router applied to a layer's state is exactly that layer's
routing (a fixture whose lookahead is known).

GGUF_PY is llama.cpp's gguf-py directory (scripts/llama.sh extracts it under
$SMOE_LLAMA_DIR/llama.cpp/gguf-py); numpy must be installed. Made
tests/fixtures/models/derived/ (see its README.md).
"""
import sys

import numpy as np

still = sys.argv[5:] == ["--still"]
if len(sys.argv) != 5 and not still:
    sys.exit(__doc__)
sys.path.insert(0, sys.argv[1])
from gguf import GGUFReader, GGUFValueType, GGUFWriter  # noqa: E402

source, dest, n_layers = sys.argv[2], sys.argv[3], int(sys.argv[4])
reader = GGUFReader(source)


def text(field, i):
    return bytes(field.parts[i]).decode("utf-8", "surrogateescape")


arch = text(reader.fields["general.architecture"], reader.fields["general.architecture"].data[0])
writer = GGUFWriter(dest, arch)
for name, field in reader.fields.items():
    if name.startswith("GGUF.") or name == "general.architecture":
        continue
    kind = field.types[0]
    if name == f"{arch}.block_count":
        writer.add_uint32(name, n_layers)
    elif kind == GGUFValueType.ARRAY:
        if field.types[1] == GGUFValueType.STRING:
            writer.add_array(name, [text(field, i) for i in field.data])
        else:
            writer.add_array(name, [field.parts[i][0].item() for i in field.data])
    elif kind == GGUFValueType.STRING:
        writer.add_string(name, text(field, field.data[0]))
    else:
        writer.add_key_value(name, field.parts[field.data[0]][0].item(), kind)

layers = {}
for tensor in reader.tensors:
    parts = tensor.name.split(".")
    if parts[0] == "blk":
        layers.setdefault(int(parts[1]), []).append(tensor)
    else:
        writer.add_tensor(tensor.name, np.array(tensor.data), raw_dtype=tensor.tensor_type)
shallow = sorted(layers)
for il in range(n_layers):
    for tensor in layers[shallow[0 if still else il % len(shallow)]]:
        rest = tensor.name.split(".")[2:]
        name = ".".join(["blk", str(il)] + rest)
        data = np.array(tensor.data)
        if still and rest[0] in ("attn_output", "ffn_down_exps"):
            data = np.zeros_like(data)
        writer.add_tensor(name, data, raw_dtype=tensor.tensor_type)
writer.write_header_to_file()
writer.write_kv_data_to_file()
writer.write_tensors_to_file()
writer.close()
