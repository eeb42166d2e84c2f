"""Models opened in place: every expert's bytes, through typed views, equal
the bytes at the offsets the formats' own readers recorded
(tests/fixtures/models/EXPECTED.json: the safetensors package and
gguf.GGUFReader, never smoe's parser)."""

from __future__ import annotations

import hashlib
from collections import defaultdict

import numpy
import pytest

import smoe
from conftest import MODELS, QUIET

with open(MODELS / "EXPECTED.json") as _f:
    import json

    FIXTURES = sorted(json.load(_f)["fixtures"])

# The numpy dtype each source type is viewed as; raw bytes otherwise (the
# quantized GGML types; BF16 where numpy has no bfloat16, as here).
TYPED = {"F32": numpy.float32, "F16": numpy.float16}


def file_bytes(path, offset: int, size: int) -> bytes:
    with open(MODELS / path, "rb") as f:
        f.seek(offset)
        return f.read(size)


@pytest.mark.parametrize("name", FIXTURES)
def test_every_expert_slice_is_the_file_s_bytes(expected, name):
    fixture = expected["fixtures"][name]
    by_expert = defaultdict(list)
    for item in fixture["expert_slices"]:
        by_expert[(item["layer"], item["expert"])].append(item)
    with smoe.Streamer(MODELS / fixture["source"], ring_slots=4, **QUIET) as s:
        meta = s.metadata
        assert meta["format"] == "smoe-model"
        assert meta["source"]["kind"] == fixture["format"]
        for (layer, expert), items in sorted(by_expert.items()):
            with s.claim(layer, expert, timeout=10) as lease:
                whole = lease.numpy()
                layout = {i["role"]: i for i in meta["layer_blob_layouts"][str(layer)]}
                for item in items:
                    want = file_bytes(item["file"], item["offset"], item["nbytes"])
                    assert hashlib.sha256(want).hexdigest() == item["sha256"]
                    view = lease.numpy(item["role"])
                    assert not view.flags.writeable
                    assert view.tobytes() == want, (layer, expert, item["role"])
                    start = layout[item["role"]]["offset"]
                    assert whole[start : start + item["nbytes"]].tobytes() == want
                    # Safetensors shapes are row-major already; GGUF's are
                    # ne[], innermost first.
                    shape = item["shape"] if fixture["format"] == "safetensors" else item["shape"][::-1]
                    if item["dtype"] in TYPED:
                        assert view.dtype == TYPED[item["dtype"]]
                        assert list(view.shape) == shape
                    else:
                        assert view.dtype == numpy.uint8 and view.shape == (item["nbytes"],)
                    del view
                del whole
        assert s.stats()["slots_held"] == 0


def test_a_typed_view_has_the_layout_s_values(expected):
    """The reference FFN input and output of EXPECTED.json, computed here
    from the typed views of a float32 model: the views hold the numbers,
    not just the bytes."""
    fixture = expected["fixtures"]["qwen2moe-f32-sharded"]
    ref = fixture["reference_ffn"][0]
    layer, expert = ref["layer"], ref["expert"]
    with smoe.Streamer(MODELS / fixture["source"], ring_slots=4, **QUIET) as s:
        with s.claim(layer, expert, timeout=10) as lease:
            gate, up, down = (lease.numpy(r).astype(numpy.float64) for r in ("gate", "up", "down"))
    x = numpy.asarray(ref["input"], dtype=numpy.float64)
    h = gate @ x
    y = down @ (h / (1 + numpy.exp(-h)) * (up @ x))
    # EXPECTED.json writes 9 significant digits.
    numpy.testing.assert_allclose(y, ref["output"], rtol=1e-7, atol=1e-12)


def test_roles_that_are_not_there_are_named(expected):
    fixture = expected["fixtures"]["mixtral-q8_0"]
    with smoe.Streamer(MODELS / fixture["source"], ring_slots=2, **QUIET) as s:
        with s.claim(0, 0, timeout=10) as lease:
            with pytest.raises(smoe.ArgumentError, match=r"no \"gate_up\" \(its roles: gate, up, down\)"):
                lease.numpy("gate_up")


@pytest.mark.parametrize("name", ["mixtral-q8_0", "qwen2moe-f32-sharded"])
def test_pack_makes_a_vault_with_the_model_s_experts(expected, tmp_path, name):
    """``smoe.pack`` writes a vault whose experts are byte for byte the
    slices the formats' own readers recorded."""
    fixture = expected["fixtures"][name]
    out = tmp_path / "vault"
    summary = smoe.pack(MODELS / fixture["source"], out)
    assert summary["out_dir"] == out and summary["kind"] == fixture["format"]
    assert summary["vault_id"] and summary["scout"] == f"scout.{fixture['format']}"
    assert (out / summary["scout"]).stat().st_size == summary["scout_bytes"]
    by_expert = defaultdict(list)
    for item in fixture["expert_slices"]:
        by_expert[(item["layer"], item["expert"])].append(item)
    assert summary["blobs"] == len(by_expert)
    with smoe.Streamer(out, ring_slots=2, **QUIET) as s:
        assert s.metadata["format"] == "smoe-vault"
        for (layer, expert), items in sorted(by_expert.items()):
            with s.claim(layer, expert, timeout=10) as lease:
                for item in items:
                    want = file_bytes(item["file"], item["offset"], item["nbytes"])
                    assert lease.numpy(item["role"]).tobytes() == want, (layer, expert, item["role"])


def test_pack_refuses_an_existing_out_dir_and_bad_input(tmp_path):
    out = tmp_path / "vault"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(smoe.ArgumentError, match="exists"):
        smoe.pack(MODELS / "mixtral-q8_0.gguf", out)
    with pytest.raises(smoe.ArgumentError, match="notes.txt"):
        smoe.pack(MODELS / "mixtral-q8_0.gguf", out, force=True)
    assert [p.name for p in out.iterdir()] == ["notes.txt"] and (out / "notes.txt").read_text() == "mine"
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00")
    with pytest.raises(smoe.FormatError, match="truncated"):
        smoe.pack(bad, tmp_path / "v2")
    assert not (tmp_path / "v2").exists()


def sparse_checkpoint(path, n_experts=8, rows=1024, cols=4096):
    """A Mixtral-named safetensors file of zeros, its data a hole on disk:
    n_experts × 3 × rows × cols float32 (384 MiB by default), big enough
    that packing it takes a while."""
    header, offset = {}, 0
    for e in range(n_experts):
        for role, shape in (("w1", [rows, cols]), ("w3", [rows, cols]), ("w2", [cols, rows])):
            size = rows * cols * 4
            name = f"model.layers.0.block_sparse_moe.experts.{e}.{role}.weight"
            header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
            offset += size
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text)
        f.truncate(8 + len(text) + offset)


def test_ctrl_c_stops_a_pack_and_leaves_nothing(tmp_path):
    import os
    import signal
    import threading
    import time

    source = tmp_path / "model.safetensors"
    sparse_checkpoint(source)
    out = tmp_path / "vault"
    started = threading.Event()

    def interrupt_once_writing():
        # The packer's temporary directory, beside out_dir, holds a file.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if any(any(p.iterdir()) for p in tmp_path.glob(".vault.smoe-pack-*")):
                started.set()
                os.kill(os.getpid(), signal.SIGINT)
                return
            time.sleep(0.001)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        watcher = threading.Thread(target=interrupt_once_writing)
        watcher.start()
        with pytest.raises(KeyboardInterrupt):
            smoe.pack(source, out)
            time.sleep(5)  # had the pack finished first, the signal lands here
        watcher.join()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert started.is_set(), "the pack never started writing"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors"], "nothing left"
