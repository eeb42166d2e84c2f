"""``Lease.torch(role)``: typed torch views of the ring, their values the
checkpoint's (read back with the safetensors package, never smoe's parser),
and the lifetime rules every view obeys."""

from __future__ import annotations

import gc
import hashlib
import json
from collections import defaultdict

import pytest

import smoe
from conftest import MODELS, QUIET, need

torch = need("torch")
safetensors_torch = need("safetensors.torch")
from safetensors import safe_open  # noqa: E402

with open(MODELS / "EXPECTED.json") as _f:
    _FIXTURES = json.load(_f)["fixtures"]

SAFETENSORS = sorted(n for n, f in _FIXTURES.items() if f["format"] == "safetensors")
GGUF = sorted(n for n, f in _FIXTURES.items() if f["format"] == "gguf")

# safetensors' dtype names, as the safetensors package maps them to torch.
DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def held(s: smoe.Streamer) -> int:
    return s.stats()["slots_held"]


def by_expert(fixture: dict) -> dict[tuple[int, int], list[dict]]:
    slices = defaultdict(list)
    for item in fixture["expert_slices"]:
        slices[(item["layer"], item["expert"])].append(item)
    return slices


def checkpoint_tensor(readers: dict, item: dict) -> torch.Tensor:
    """One expert's slice of ``item["tensor"]``, read by the safetensors
    package: the tensor itself (one tensor per expert) or its row
    ``item["expert"]`` (stacked experts)."""
    tensor = readers[item["file"]].get_tensor(item["tensor"])
    if list(tensor.shape) == item["shape"]:
        return tensor
    return tensor[item["expert"]]


def raw(tensor: torch.Tensor) -> bytes:
    return tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


@pytest.mark.parametrize("name", SAFETENSORS)
def test_every_view_is_the_checkpoint_s_tensor(name):
    fixture = _FIXTURES[name]
    readers = {}
    with smoe.Streamer(MODELS / fixture["source"], ring_slots=4, **QUIET) as s:
        for file in {item["file"] for item in fixture["expert_slices"]}:
            readers[file] = safe_open(MODELS / file, framework="pt")
        for (layer, expert), items in sorted(by_expert(fixture).items()):
            with s.claim(layer, expert, timeout=10) as lease:
                for item in items:
                    view = lease.torch(item["role"])
                    want = checkpoint_tensor(readers, item)
                    assert view.dtype == DTYPES[item["dtype"]] == want.dtype
                    assert list(view.shape) == item["shape"] == list(want.shape)
                    assert torch.equal(view, want), (layer, expert, item["role"])
                    assert raw(view) == raw(want)
                    assert hashlib.sha256(raw(view)).hexdigest() == item["sha256"]
                    del view
        assert held(s) == 0


@pytest.mark.parametrize("name", GGUF)
def test_quantized_types_are_raw_bytes(name):
    """GGUF's quantized blocks are not elements: one dimension of uint8,
    the bytes at the offset gguf.GGUFReader recorded."""
    fixture = _FIXTURES[name]
    with smoe.Streamer(MODELS / fixture["source"], ring_slots=4, **QUIET) as s:
        for (layer, expert), items in sorted(by_expert(fixture).items()):
            with s.claim(layer, expert, timeout=10) as lease:
                for item in items:
                    view = lease.torch(item["role"])
                    with open(MODELS / item["file"], "rb") as f:
                        f.seek(item["offset"])
                        want = f.read(item["nbytes"])
                    if item["dtype"] in DTYPES:
                        assert view.dtype == DTYPES[item["dtype"]]
                        assert list(view.shape) == item["shape"][::-1], "GGUF's ne[], outermost first"
                    else:
                        assert view.dtype == torch.uint8 and view.shape == (item["nbytes"],)
                    assert raw(view) == want
                    del view


def test_a_view_is_the_ring_not_a_copy():
    fixture = _FIXTURES["mixtral-bf16"]
    with smoe.Streamer(MODELS / fixture["source"], ring_slots=4, **QUIET) as s:
        address, _, slot_bytes = s.ring_region()
        layout = {i["role"]: i for i in s.metadata["layer_blob_layouts"]["1"]}
        with s.claim(1, 2, timeout=10) as lease:
            down = lease.torch("down")
            assert down.data_ptr() == address + lease.slot_index * slot_bytes + layout["down"]["offset"]
            assert down.is_contiguous() and down.dtype == torch.bfloat16
            del down


def view_of(s: smoe.Streamer):
    lease = s.claim(0, 1, timeout=10)
    return lease, lease.torch("gate")


@pytest.fixture
def mixtral():
    with smoe.Streamer(MODELS / "mixtral-bf16", ring_slots=4, **QUIET) as s:
        yield s


def test_a_release_waits_for_the_last_tensor(mixtral):
    lease, gate = view_of(mixtral)
    first = gate[0, :8].clone()
    derived = gate.t()[:8]  # a view of a view shares the claim's memory too
    lease.release()
    assert lease.released and held(mixtral) == 1, "tensors are alive: the slot stays held"
    del gate
    gc.collect()
    assert held(mixtral) == 1, "the derived view still shows the slot"
    assert torch.equal(derived.t()[0], first)
    del derived
    gc.collect()
    assert held(mixtral) == 0


def test_a_copy_is_not_a_view(mixtral):
    lease, gate = view_of(mixtral)
    copy = gate.clone()
    cast = gate.float()
    del gate
    lease.release()
    assert held(mixtral) == 0, "copies do not keep the claim"
    assert copy.dtype == torch.bfloat16 and cast.dtype == torch.float32


def test_strict_refuses_a_release_while_a_tensor_is_alive():
    with smoe.Streamer(MODELS / "mixtral-bf16", ring_slots=4, strict=True, **QUIET) as s:
        lease, gate = view_of(s)
        with pytest.raises(BufferError, match="strict=True"):
            lease.release()
        assert not lease.released and held(s) == 1
        del gate
        gc.collect()
        lease.release()
        assert held(s) == 0


def test_a_released_lease_makes_no_tensor(mixtral):
    lease = mixtral.claim(0, 1, timeout=10)
    lease.release()
    with pytest.raises(smoe.Stale, match="layer 0 expert 1 was released"):
        lease.torch("gate")


def test_roles_that_are_not_there_are_named(mixtral):
    with mixtral.claim(0, 0, timeout=10) as lease:
        with pytest.raises(smoe.ArgumentError, match=r"no \"gate_up\" \(its roles: gate, up, down\)"):
            lease.torch("gate_up")


def test_a_vault_without_layouts_has_no_roles(streamer):
    with streamer.claim(0, 0, timeout=10) as lease:
        with pytest.raises(smoe.ArgumentError, match="no layer_blob_layouts"):
            lease.torch("gate")
        whole = torch.from_dlpack(lease)
        assert whole.dtype == torch.uint8 and whole.shape == (lease.size,)
        del whole


def test_views_cross_threads(mixtral):
    """A tensor dropped in another thread releases the deferred claim there."""
    import threading

    lease, gate = view_of(mixtral)
    lease.release()
    box = [gate]
    del gate
    thread = threading.Thread(target=box.clear)
    thread.start()
    thread.join()
    gc.collect()
    assert held(mixtral) == 0


def test_torch_frombuffer_is_refused(mixtral):
    """Issue 47, item 1: a lease exports no buffer (a consumer may release
    a buffer while its array lives), so ``torch.frombuffer(lease)`` is
    refused. torch replaces the lease's BufferError with its own
    RuntimeError ("could not retrieve a contiguous buffer"), so the reason
    comes as a RuntimeWarning too, naming the views that hold the claim;
    nothing is counted."""
    import warnings

    lease = mixtral.claim(0, 1, timeout=10)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises((BufferError, RuntimeError)):
            torch.frombuffer(lease, dtype=torch.uint8)
    ours = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert ours, f"no RuntimeWarning: {[str(w.message) for w in caught]}"
    for way in ("lease.torch(role)", "torch.from_dlpack(lease)", "lease.numpy()"):
        assert way in ours[0], f"{way!r} not named in: {ours[0]}"
    assert "exports no buffer" in ours[0] and "release" in ours[0], ours[0]
    lease.release()
    assert held(mixtral) == 0


def test_torch_from_dlpack_is_a_counted_view(mixtral):
    """``torch.from_dlpack(lease)``, the claim's bytes as one uint8 tensor
    (what ``torch.frombuffer`` gave), counts as a view until the tensor is
    gone: the slot is never reloaded under it."""
    lease = mixtral.claim(0, 1, timeout=10)
    whole = torch.from_dlpack(lease)
    assert whole.dtype == torch.uint8 and whole.shape == (lease.size,)
    want = whole.clone()
    lease.release()
    assert held(mixtral) == 1, "the tensor is a view: the slot stays held"
    for layer in (0, 1):
        for expert in range(4):
            mixtral.claim(layer, expert, timeout=10).release()
    assert torch.equal(whole, want), "the tensor shows its own expert's bytes"
    del whole
    gc.collect()
    assert held(mixtral) == 0


def test_strict_refuses_a_release_while_a_from_dlpack_tensor_is_alive():
    with smoe.Streamer(MODELS / "mixtral-bf16", ring_slots=4, strict=True, **QUIET) as s:
        lease = s.claim(0, 1, timeout=10)
        whole = torch.from_dlpack(lease)
        with pytest.raises(BufferError, match="strict=True"):
            lease.release()
        del whole
        gc.collect()
        lease.release()
        assert held(s) == 0
