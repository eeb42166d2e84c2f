"""Hugging Face transformers models whose routed experts stream from the ring.

``smoe.transformers.from_pretrained(path, ring_slots=..., **kwargs)`` loads a
safetensors checkpoint directory with transformers (≥ 5) and returns the
model with its routed experts never loaded: their parameters stay on the
``meta`` device (no memory), and the experts are computed by the
``"smoe"`` implementation of transformers' experts interface
(``transformers.integrations.moe.ExpertsInterface``, chosen with
``experts_implementation=``), registered when this module is imported.

Per experts layer and forward call, the layer's routed experts go to
``Streamer.prefetch_set`` once; each is computed as ``Streamer.claim_any``
hands it over, by the model's own eager code, from torch views of the ring
(``Lease.torch``); the outputs are summed in the eager implementation's
order, so the logits equal ``experts_implementation="eager"``'s bit for bit.
In decode, with ``lookahead=1`` (off by default), while a layer computes,
the next layer's experts are guessed from its state with that layer's norm and
router and queued as speculative prefetches. Each forward pass is the
streamer's busy time (``prewarm_pause``). No code per model: every class whose experts use the interface works, and a
model that does not is refused. docs/python.md in the repository has the
rules and the costs.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import pathlib
import re
import threading
import time
from collections.abc import Callable
from typing import Any

import transformers

_VERSION = transformers.__version__


def _major(version: str) -> int:
    match = re.match(r"\d+", version)
    return int(match.group()) if match else 0


if _major(_VERSION) < 5:
    raise ImportError(
        f"smoe.transformers needs transformers 5 or newer (its experts interface, "
        f"transformers.integrations.moe); this is transformers {_VERSION}: "
        f"pip install 'smoe[transformers]' (or 'transformers>=5')"
    )

import torch  # noqa: E402  (transformers' version is checked first)
from safetensors import safe_open  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig  # noqa: E402
from transformers.integrations.moe import ExpertsInterface  # noqa: E402

import smoe  # noqa: E402

__all__ = ["IMPLEMENTATION", "from_pretrained", "streamed_experts"]

#: The name this module registers in transformers' experts interface.
IMPLEMENTATION = "smoe"

# The streamer's keywords: the library's settings and the package's own.
_STREAMER_KEYWORDS = frozenset(smoe.CONFIG_FIELDS) | {"strict"}

# safetensors' dtype names (the layouts' `dtype`) as torch dtypes.
_TORCH_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
}


def _experts_forward(self: torch.nn.Module, *args: Any, **kwargs: Any) -> torch.Tensor:
    """The ``"smoe"`` experts implementation: the module's experts, from the ring."""
    streamed = self.__dict__.get("_smoe_experts")
    if streamed is None:
        raise RuntimeError(
            f"{type(self).__name__}: experts_implementation={IMPLEMENTATION!r} computes the experts "
            f"of a model loaded by smoe.transformers.from_pretrained, and this module's were not"
        )
    return streamed.forward(self, *args, **kwargs)


ExpertsInterface.register(IMPLEMENTATION, _experts_forward)


class _Placeholder:
    """A state-dict entry that loads as a tensor on the ``meta`` device.

    transformers materialises each entry with ``entry[...]`` and then
    ``.to(device=..., dtype=...)``; this one answers with an empty meta
    tensor of the parameter's shape, so the parameter counts as loaded
    (never initialised, never given memory) and stays on ``meta``.
    """

    def __init__(self, shape: torch.Size, dtype: torch.dtype) -> None:
        self.shape = shape
        self.dtype = dtype

    def __getitem__(self, _index: Any) -> _Placeholder:
        return self

    def to(self, device: Any = None, dtype: torch.dtype | None = None, **_: Any) -> torch.Tensor:
        return torch.empty(self.shape, dtype=dtype or self.dtype, device="meta")

    def get_shape(self) -> list[int]:
        return list(self.shape)

    def is_floating_point(self) -> bool:
        return self.dtype.is_floating_point


class _OneExpert:
    """A stacked parameter as the eager code indexes it: ``param[expert]``
    is the claimed expert's tensor, any other expert an error."""

    def __init__(self, expert: int, tensor: torch.Tensor, meta: torch.Tensor) -> None:
        self._expert = expert
        self._tensor = tensor
        self.shape = meta.shape
        self.dtype = tensor.dtype
        self.device = tensor.device

    def __getitem__(self, index: Any) -> torch.Tensor:
        rest: tuple[Any, ...] = ()
        if isinstance(index, tuple):
            index, rest = index[0], index[1:]
        if int(index) != self._expert:
            raise RuntimeError(
                f"the eager experts code asked for expert {int(index)} while computing expert "
                f"{self._expert} (smoe.transformers computes one expert at a time)"
            )
        return self._tensor[rest] if rest else self._tensor


class _OneExpertModule:
    """The experts module as its eager ``forward`` sees it while one expert
    is computed: the stacked parameters answer for that expert only, with
    its tensors from the ring; every other attribute is the module's."""

    __slots__ = ("_module", "_params")

    def __init__(self, module: torch.nn.Module, params: dict[str, _OneExpert]) -> None:
        self._module = module
        self._params = params

    def __getattr__(self, name: str) -> Any:
        params = object.__getattribute__(self, "_params")
        if name in params:
            return params[name]
        return getattr(object.__getattribute__(self, "_module"), name)


# How long a forward pass waits for a slot while every slot of the ring is
# held by other claims before it raises smoe.RingFull.
_RING_FULL_PATIENCE = 60.0

class _Claim:
    """One claimed expert as the builders see it: the lease, and its bytes
    as one ``uint8`` tensor (one DLPack export, made when first asked
    for)."""

    __slots__ = ("lease", "_whole")

    def __init__(self, lease: smoe.Lease) -> None:
        self.lease = lease
        self._whole: torch.Tensor | None = None

    def bytes(self, offset: int, count: int) -> torch.Tensor:
        if offset + count > self.lease.size:
            raise smoe.FormatError(
                f"layer {self.lease.layer}: a layout item ({count} bytes at offset {offset}) runs "
                f"past the claim's {self.lease.size} bytes"
            )
        if self._whole is None:
            self._whole = torch.from_dlpack(self.lease)
        return self._whole.narrow(0, offset, count)


# Per thread: one tensor per (parameter, shape, dtype), reused for every
# expert that parameter is copied for (a claim's compute ends before the
# next claim's tensors are built, and threads never share one).
_SCRATCH = threading.local()


def _scratch(key: str, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
    pool = _SCRATCH.__dict__.setdefault("pool", {})
    found = pool.get((key, shape, dtype))
    if found is None:
        found = pool[(key, shape, dtype)] = torch.empty(shape, dtype=dtype)
    return found


def _aligned(tensor: torch.Tensor, key: str) -> torch.Tensor:
    """``tensor`` where its data is 64-byte aligned and contiguous, else
    its copy into a scratch tensor (which torch's allocator aligned)."""
    if tensor.is_contiguous() and tensor.data_ptr() % _ALIGN == 0:
        return tensor
    return _scratch(key, tensor.shape, tensor.dtype).copy_(tensor)


# A builder makes one parameter's per-expert tensor from a claim.
_Builder = Callable[[_Claim], torch.Tensor]


class _Layer:
    """One experts module: its layer in the streamer, and how each stacked
    parameter's per-expert tensor is made from a claim's roles."""

    def __init__(
        self,
        name: str,
        module: torch.nn.Module,
        streamer: smoe.Streamer,
        layer: int,
        builders: dict[str, _Builder],
    ) -> None:
        self.name = name
        self.streamer = streamer
        self.layer = layer
        self.builders = builders
        self.num_experts = int(module.num_experts)
        eager = type(module).forward.__wrapped__  # type: ignore[attr-defined]
        self.eager: Callable[..., torch.Tensor] = eager
        self.signature = inspect.signature(eager)
        # The guesses of the next layers' experts queued while this layer
        # computes (from_pretrained's lookahead); None: none.
        self.lookahead: _Lookahead | None = None

    def forward(self, module: torch.nn.Module, *args: Any, **kwargs: Any) -> torch.Tensor:
        bound = self.signature.bind(module, *args, **kwargs)
        values = list(bound.arguments.values())
        if len(values) < 4:
            raise TypeError(f"{self.name}: the experts take hidden states, expert indices and weights")
        hidden_states, top_k_index, top_k_weights = values[1:4]
        # The experts the eager loop visits, in its order (ascending); an
        # index equal to num_experts is its sentinel, never an expert.
        hit = [e for e in torch.unique(top_k_index).tolist() if 0 <= e < self.num_experts]
        if not hit:
            return torch.zeros_like(hidden_states)
        outputs: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.streamer.prefetch_set(self.layer, hit)
        if self.lookahead is not None:
            # After this layer's demand set, before its first wait: the
            # bets are read once the set's reads are done, while this
            # layer computes.
            self.lookahead.queue(len(hit))
        todo = list(hit)
        while todo:
            with self._claim_any(todo) as lease:
                expert = lease.expert
                outputs[expert] = self._one(module, lease, hidden_states, top_k_index, top_k_weights)
            todo.remove(expert)
        # The eager loop's accumulation: index_add_ of each expert's rows,
        # experts in ascending order, in the dtype of its output.
        first = outputs[hit[0]][1]
        final = torch.zeros(hidden_states.shape, dtype=first.dtype, device=first.device)
        for expert in hit:
            token_idx, rows = outputs[expert]
            final.index_add_(0, token_idx, rows)
        return final

    def _claim_any(self, todo: list[int]) -> smoe.Lease:
        """``claim_any``, waiting while the ring is full of slots that other
        claims hold: other threads' forward passes through the same model
        (each holds one lease at a time, for one expert's compute). With
        no slot held, or after ``_RING_FULL_PATIENCE`` seconds, the
        ``RingFull`` is raised: the ring is too small, or something else
        holds its slots."""
        delay, waited = 0.001, 0.0
        while True:
            try:
                return self.streamer.claim_any(self.layer, todo)
            except smoe.RingFull:
                if self.streamer.stats()["slots_held"] == 0 or waited >= _RING_FULL_PATIENCE:
                    raise
            time.sleep(delay)
            waited += delay
            delay = min(2 * delay, 0.05)

    def _one(
        self,
        module: torch.nn.Module,
        lease: smoe.Lease,
        hidden_states: torch.Tensor,
        top_k_index: torch.Tensor,
        top_k_weights: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows expert ``lease.expert`` adds, computed by the module's
        eager code on that expert's tokens alone. The ring's views live only
        in this frame: none outlives the lease."""
        expert = lease.expert
        # The eager loop's rows for this expert, in its order (top-k
        # position, then token).
        top_k_pos, token_idx = torch.where((top_k_index == expert).T)
        rows = token_idx.numel()
        sub_index = torch.full((rows, 1), expert, dtype=top_k_index.dtype, device=top_k_index.device)
        sub_weights = top_k_weights[token_idx, top_k_pos].unsqueeze(-1)
        params = {}
        claim = _Claim(lease)
        for pname, build in self.builders.items():
            meta = getattr(module, pname)
            tensor = build(claim)
            if tensor.dtype != meta.dtype or tensor.device != hidden_states.device:
                tensor = tensor.to(device=hidden_states.device, dtype=meta.dtype)
            params[pname] = _OneExpert(expert, tensor, meta)
        # No autograd: a graph would keep the ring's views past the lease.
        with torch.no_grad():
            out = self.eager(
                _OneExpertModule(module, params), hidden_states[token_idx], sub_index, sub_weights
            )
        del params, claim
        return token_idx, out


class _Guess:
    """How one layer's experts are guessed from an earlier layer's state:
    the layer's FFN norm (``None`` when the state is normalized already)
    and its router (weight, bias, and a selection bias such as
    DeepSeek-V3's ``e_score_correction_bias``, added to the sigmoid of the
    logits as its router does)."""

    def __init__(self, layer: _Layer, norm: torch.nn.Module | None, router: torch.nn.Module, top_k: int) -> None:
        self.layer = layer
        self.norm = norm
        self.router = router
        self.top_k = top_k
        experts = router.weight.shape[0]
        bias = getattr(router, "bias", None)
        self.has_bias = isinstance(bias, torch.Tensor) and tuple(bias.shape) == (experts,)
        correction = getattr(router, "e_score_correction_bias", None)
        self.has_correction = isinstance(correction, torch.Tensor) and tuple(correction.shape) == (experts,)

    def picks(self, state: torch.Tensor, width: int | None) -> list[int]:
        """Each token's ``width`` (default: the router's top-k) most likely
        experts, best first, token by token within a rank; no repeats."""
        # forward() itself, not the module: no hook of the norm runs (the
        # lookahead's own would take this for that layer's state).
        x = state if self.norm is None else self.norm.forward(state)
        weight = self.router.weight
        bias = self.router.bias.to(weight.dtype) if self.has_bias else None
        scores = torch.nn.functional.linear(x.to(weight.dtype), weight, bias)
        if self.has_correction:
            scores = scores.float().sigmoid() + self.router.e_score_correction_bias
        k = min(width or self.top_k, scores.shape[-1])
        ranked = torch.topk(scores, k, dim=-1).indices.T.reshape(-1).tolist()
        return list(dict.fromkeys(ranked))


class _Lookahead:
    """In decode, while one layer computes, the next layers' experts
    guessed from its post-attention residual (its FFN norm's input, caught
    by a forward pre-hook) and queued as speculation: bets that the
    library reads after the layer's own reads, and that the next layers'
    demand sets settle (docs/c-api.md, "Predictions"). Outputs never
    change: the guesses only choose reads."""

    def __init__(self, source: _Layer, guesses: list[_Guess], width: int | None) -> None:
        self.source = source
        self.guesses = guesses
        self.width = width
        self.state = threading.local()

    def catch(self, _module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        """Forward pre-hook: keeps the state the guesses start from."""
        if args and isinstance(args[0], torch.Tensor):
            self.state.value = args[0]

    def queue(self, routed: int) -> None:
        """Queues the guesses when the source layer's routed set (``routed``
        experts) is at most half its experts: a decode step (a prompt reads
        most experts of every layer anyway)."""
        state = self.state.__dict__.pop("value", None)
        if state is None or 2 * routed > self.source.num_experts:
            return
        with torch.no_grad():
            state = state.reshape(-1, state.shape[-1])
            for guess in self.guesses:
                picks = guess.picks(state, self.width)
                if picks:
                    guess.layer.streamer.prefetch_set(guess.layer.layer, picks, speculative=True)


def _router_of(block: torch.nn.Module, experts: int) -> torch.nn.Module | None:
    """The MoE block's router: its child (other than the experts) whose
    ``weight`` has one row per expert (``gate``, ``router``; a shared
    expert's one-row gate is not)."""
    for name, child in block.named_children():
        weight = getattr(child, "weight", None)
        if (
            isinstance(weight, torch.Tensor)
            and weight.dim() == 2
            and weight.shape[0] == experts
            and "_smoe_experts" not in child.__dict__
        ):
            return child
    return None


def _wire_lookahead(
    model: torch.nn.Module, layers: list[tuple[str, _Layer]], depth: int, width: int | None
) -> int:
    """Gives each streamed layer the guesses of the next ``depth`` layers
    with routed experts; returns how many layers guess. A layer guesses
    from its decoder layer's ``post_attention_layernorm`` input, normalized
    by each guessed layer's own norm; a model without that norm guesses
    from the MoE block's input (normalized already) with the routers
    alone. A layer whose router is not found is not guessed (nor, the
    chain being broken, any after it from before it)."""
    modules = dict(model.named_modules())
    top_k = getattr(model.config, "num_experts_per_tok", None)
    plan = []
    for name, layer in sorted(layers, key=lambda item: item[1].layer):
        block_name = name.rpartition(".")[0]
        block = modules.get(block_name)
        match = re.match(r"(.*(?:^|\.)layers\.\d+)\.", name)
        decoder = modules.get(match.group(1)) if match else None
        norm = getattr(decoder, "post_attention_layernorm", None)
        router = _router_of(block, layer.num_experts) if block is not None else None
        k = getattr(router, "top_k", top_k)
        plan.append(
            (
                layer,
                block,
                norm if isinstance(norm, torch.nn.Module) else None,
                router,
                int(k) if isinstance(k, int) and k > 0 else None,
            )
        )
    wired = 0
    for i, (layer, block, norm, _, _) in enumerate(plan):
        guesses = []
        for target, _, target_norm, router, k in plan[i + 1 : i + 1 + depth]:
            if router is None or k is None or (norm is not None and target_norm is None):
                break
            guesses.append(_Guess(target, target_norm if norm is not None else None, router, k))
        if not guesses or block is None:
            continue
        lookahead = _Lookahead(layer, guesses, width)
        (norm if norm is not None else block).register_forward_pre_hook(lookahead.catch)
        layer.lookahead = lookahead
        wired += 1
    return wired


class _Busy:
    """``prewarm_pause(True)`` when a forward pass of the model starts and
    ``False`` when the last one running ends (threads may run the model at
    once): the library's pre-warm waits meanwhile, and its ``busy_ns`` and
    ``drive_idle_ns`` count the passes."""

    def __init__(self, streamer: smoe.Streamer) -> None:
        self.streamer = streamer
        self.lock = threading.Lock()
        self.running = 0

    def enter(self, _module: torch.nn.Module, _args: Any) -> None:
        with self.lock:
            if self.running == 0:
                self.streamer.prewarm_pause(True)
            self.running += 1

    def leave(self, _module: torch.nn.Module, _args: Any, _output: Any) -> None:
        with self.lock:
            self.running = max(0, self.running - 1)
            if self.running == 0:
                with contextlib.suppress(smoe.ClosedError):
                    self.streamer.prewarm_pause(False)


def _experts_modules(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The modules whose class computes its experts through the interface
    (transformers' ``use_experts_implementation`` decorator)."""
    found = []
    for name, module in model.named_modules():
        marks = vars(module)
        if all(m in marks for m in ("has_gate", "has_bias", "is_transposed", "is_concatenated")) and hasattr(
            type(module).forward, "__wrapped__"
        ):
            found.append((name, module))
    return found


def _layer_of(name: str) -> int | None:
    match = re.search(r"(?:^|\.)layers\.(\d+)\.", name)
    return int(match.group(1)) if match else None


# torch's CPU allocator aligns every tensor to 64 bytes, as eager's
# parameters are; its matrix kernels take other paths, which round
# differently, on data that is not.
_ALIGN = 64


def _role_view(item: dict[str, Any], shape: tuple[int, ...], transpose: bool, key: str) -> _Builder:
    """One layout item as the parameter's per-expert tensor: a view of the
    ring, or (transposed, or not 64-byte aligned) its copy in scratch."""
    role = item["role"]
    dtype = _TORCH_DTYPES.get(item["dtype"])
    if dtype is not None and _numel(tuple(item["shape"])) * dtype.itemsize != item["bytes"]:
        dtype = None  # lease.torch(role) says what is wrong

    def view(claim: _Claim) -> torch.Tensor:
        if dtype is None:
            tensor = claim.lease.torch(role)
        else:
            # What lease.torch(role) makes, from the claim's one export.
            tensor = claim.bytes(item["offset"], item["bytes"]).view(dtype).view(item["shape"])
        if tensor.dim() != len(shape) and tensor.numel() == _numel(shape):
            tensor = tensor.reshape(shape)
        return tensor.t() if transpose else tensor

    def build(claim: _Claim) -> torch.Tensor:
        # A model read in place keeps its file's offsets: a safetensors
        # tensor starts wherever the header before it ends. Such a view is
        # copied into aligned memory, so the logits stay eager's bit for
        # bit (tests: qwen3moe float32, whose down_proj sits 56 bytes past
        # a 64-byte boundary).
        return _aligned(view(claim), key)

    build.view = view  # type: ignore[attr-defined]
    return build


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _fused(first: _Builder, second: _Builder, dim: int, interleaved: bool, key: str) -> _Builder:
    """``gate`` and ``up`` as one parameter: their concatenation (or
    interleaving) along ``dim``, made in scratch from the ring's views."""
    view_a, view_b = first.view, second.view  # type: ignore[attr-defined]

    def build(claim: _Claim) -> torch.Tensor:
        a, b = view_a(claim), view_b(claim)
        if interleaved:
            # gate and up alternate along the dimension: g0, u0, g1, u1, ...
            d = dim % a.dim()
            return _aligned(torch.stack((a, b), dim=d + 1).flatten(d, d + 1), key)
        shape = list(a.shape)
        shape[dim] += b.shape[dim]
        return torch.cat((a, b), dim=dim, out=_scratch(key, torch.Size(shape), a.dtype))

    return build


def _adjacent(
    gate: dict[str, Any], up: dict[str, Any], want: tuple[int, ...], key: str
) -> _Builder | None:
    """``gate`` and ``up`` stored one after the other in the claim, each
    ``want`` halved along the first dimension: their concatenation is the
    bytes from gate's start to up's end, a view (copied only when it is not
    64-byte aligned)."""
    dtype = _TORCH_DTYPES.get(gate["dtype"])
    if (
        dtype is None
        or up["dtype"] != gate["dtype"]
        or up["offset"] != gate["offset"] + gate["bytes"]
        or gate["bytes"] != up["bytes"]
        or gate["bytes"] + up["bytes"] != _numel(want) * dtype.itemsize
    ):
        return None
    offset, count = gate["offset"], gate["bytes"] + up["bytes"]

    def build(claim: _Claim) -> torch.Tensor:
        return _aligned(claim.bytes(offset, count).view(dtype).view(want), key)

    return build


def _builders(
    name: str, module: torch.nn.Module, layout: list[dict[str, Any]], cls_name: str
) -> dict[str, _Builder]:
    """How each stacked parameter of ``module`` is made from a claim: a
    role's view as it is (a stacked checkpoint tensor), transposed (a
    per-expert ``nn.Linear`` weight where the module stores its weights
    transposed), or the concatenation of ``gate`` and ``up`` (a fused
    ``gate_up_proj`` from per-expert checkpoint tensors)."""
    items = {item["role"]: item for item in layout}
    transposed = bool(module.is_transposed)
    builders: dict[str, _Builder] = {}

    def direct(role: str, want: tuple[int, ...], key: str) -> _Builder | None:
        item = items.get(role)
        if item is None:
            return None
        have = tuple(item["shape"])
        per_expert = "{expert}" in item.get("tensor", "")
        if have == want or (_numel(have) == _numel(want) and len(want) == 1):
            return _role_view(item, want, transpose=False, key=key)
        if per_expert and transposed and len(have) == 2 and have[::-1] == want:
            return _role_view(item, have, transpose=True, key=key)
        return None

    for pname, param in module.named_parameters(recurse=False):
        if param.dim() < 1 or param.shape[0] != module.num_experts:
            continue
        want = tuple(param.shape[1:])
        if pname.endswith("_proj_bias"):
            role = pname[: -len("_proj_bias")] + "_bias"
        elif pname.endswith("_proj"):
            role = pname[: -len("_proj")]
        else:
            role = pname
        build = direct(role, want, pname)
        if build is None and role in ("gate_up", "gate_up_bias"):
            suffix = "_bias" if role.endswith("_bias") else ""
            half = list(want)
            dim = -1 if (transposed and not suffix) else 0
            if half[dim] % 2 == 0:
                half[dim] //= 2
                gate, up = direct("gate" + suffix, tuple(half), pname), direct("up" + suffix, tuple(half), pname)
                if gate is not None and up is not None:
                    concatenated = bool(module.is_concatenated)
                    if concatenated and dim == 0:
                        build = _adjacent(items["gate" + suffix], items["up" + suffix], want, pname)
                    if build is None:
                        build = _fused(gate, up, dim, interleaved=not concatenated, key=pname)
        if build is None:
            roles = ", ".join(f"{r} {tuple(i['shape'])}" for r, i in items.items())
            raise smoe.FormatError(
                f"{cls_name}: {name}.{pname} (one expert: {want}) has no counterpart in the "
                f"checkpoint's layer {_layer_of(name)} (its roles: {roles})"
            )
        builders[pname] = build
    return builders


def _checkpoint_files(path: pathlib.Path, streamer: smoe.Streamer) -> list[pathlib.Path]:
    """The files holding the dense weights: a vault's scout, or the
    checkpoint's own files (smoe skips their experts)."""
    meta = streamer.metadata
    if meta.get("format") == "smoe-vault":
        scout = meta.get("scout")
        if (
            not isinstance(scout, str)
            or not scout
            or pathlib.PurePath(scout).name != scout
            or not (path / scout).is_file()
        ):
            raise smoe.FormatError(
                f"{path}: the vault names no scout file beside experts.smoe "
                f"(metadata 'scout': {scout!r}); pack it again with smoe pack"
            )
        return [path / scout]
    source = meta.get("source", {})
    return [path / f for f in source.get("files", [])]


def _expert_tensors(streamer: smoe.Streamer) -> set[str]:
    """The checkpoint's names of the routed experts' tensors: each layout
    item's ``tensor``, a template with ``{expert}`` for one tensor per
    expert, or the stacked tensor's name. Every layer's experts as the
    streamer finds them (a layer the model builds was checked to have as
    many as its module; a multi-token prediction layer has no module)."""
    names = set()
    for layer, items in streamer.metadata["layer_blob_layouts"].items():
        count = _experts_in(streamer, int(layer))
        for item in items:
            tensor = item.get("tensor", "")
            if "{expert}" in tensor:
                names.update(tensor.replace("{expert}", str(e)) for e in range(count))
            else:
                names.add(tensor)
    return names


def from_pretrained(
    path: str | os.PathLike[str],
    *,
    model_class: Any = None,
    **kwargs: Any,
) -> Any:
    """A transformers model from a safetensors checkpoint directory, its
    routed experts streamed by smoe.

    ``path`` is a directory holding ``config.json`` and the weights: a
    checkpoint (``model.safetensors`` or a sharded index), read in place by
    ``smoe.Streamer(path)``, or a vault ``smoe pack`` made from one (its
    experts from ``experts.smoe``, the dense weights from its
    ``scout.safetensors``; the packer copies ``config.json`` beside them).
    ``config=`` supplies the configuration when ``path`` has none. Keyword arguments that are the streamer's
    settings (``ring_slots``, ``workers``, ...: ``smoe.CONFIG_FIELDS``, and
    ``strict``) open the streamer; the rest go to transformers'
    ``from_pretrained`` (``dtype``, ``attn_implementation``, config
    overrides...). ``model_class`` is the transformers class to load
    (default ``AutoModelForCausalLM``).

    ``lookahead`` (default 0: off) is how many layers ahead a decode
    step guesses: while a layer computes, each token's top-k experts of
    the next layers with routed experts, by their FFN norms and routers
    applied to this layer's post-attention residual, are queued as
    speculative prefetches (bets the layers' real sets settle).
    ``lookahead_width`` is how many experts a token each guess takes
    (default: the router's top-k). Off when the ring holds every expert.
    The guesses never change an output: only which reads are queued.

    The routed experts' parameters stay on the ``meta`` device, never
    read into memory; the dense weights (attention, routers, shared
    experts, embeddings) load as transformers loads them. The model's
    ``smoe_streamer`` is the streamer (its ``stats()``; ``close()`` when
    done). Raises ``smoe.Unsupported`` for a model whose experts do not use
    transformers' experts interface.
    """
    path = pathlib.Path(path)
    implementation = kwargs.pop("experts_implementation", IMPLEMENTATION)
    if implementation != IMPLEMENTATION:
        raise smoe.ArgumentError(
            f"smoe.transformers.from_pretrained computes the experts with "
            f"experts_implementation={IMPLEMENTATION!r}, not {implementation!r}"
        )
    if "state_dict" in kwargs:
        raise smoe.ArgumentError(
            "smoe.transformers.from_pretrained reads the weights from path, not a state_dict"
        )
    if not path.is_dir():
        raise smoe.ArgumentError(
            f"{path}: smoe.transformers.from_pretrained takes a safetensors checkpoint directory "
            f"(config.json beside model.safetensors or its index) or a vault packed from one"
        )
    streamer_kwargs = {k: kwargs.pop(k) for k in list(kwargs) if k in _STREAMER_KEYWORDS}
    depth = _count_keyword(kwargs.pop("lookahead", 0), "lookahead", minimum=0)
    width = kwargs.pop("lookahead_width", None)
    if width is not None:
        width = _count_keyword(width, "lookahead_width", minimum=1)
    cls = AutoModelForCausalLM if model_class is None else model_class

    config = kwargs.pop("config", None)
    # The model's dtype, not a configuration override: AutoConfig would take
    # dtype="auto" as config.dtype, which transformers then looks up in torch.
    dtype = kwargs.pop("dtype", None)
    if config is None and (path / "config.json").is_file():
        config, kwargs = AutoConfig.from_pretrained(path, return_unused_kwargs=True, **kwargs)
    if dtype is not None:
        kwargs["dtype"] = dtype
    if config is not None:
        skeleton, model_name, experts = _skeleton(cls, config)
        concrete = type(skeleton)

    # What the streamer reads at path (a checkpoint, a vault and what it was
    # packed from) says what else is needed there.
    streamer = smoe.Streamer(path, **streamer_kwargs)
    try:
        _check_source(streamer, path)
        if config is None:
            raise smoe.ArgumentError(
                f"{path}: has no config.json (a checkpoint holds one beside its weights; "
                f"smoe pack copies it into the vault); pass config="
            )
        plans = _plan(streamer, model_name, experts, _prediction_layers(path, config))
        # Each routed experts parameter loads as an empty meta tensor.
        placeholders = {
            f"{name}.{pname}": _Placeholder(param.shape, param.dtype)
            for (name, module), (_, _, builders) in zip(experts, plans)
            for pname, param in module.named_parameters(recurse=False)
            if pname in builders
        }
        skip = _expert_tensors(streamer)
        del skeleton, experts
        with contextlib.ExitStack() as files:
            # The dense weights, as transformers itself reads them: slices of
            # the files, materialised one by one while loading.
            state: dict[str, Any] = {}
            first_float = None
            for file in _checkpoint_files(path, streamer):
                reader = files.enter_context(safe_open(file, framework="pt"))
                for key in reader.keys():
                    if key in skip:
                        continue
                    piece = reader.get_slice(key)
                    state[key] = piece
                    if first_float is None and piece.get_dtype() in _TORCH_DTYPES:
                        first_float = _TORCH_DTYPES[piece.get_dtype()]
            state.update(placeholders)
            if getattr(config, "dtype", None) is None and kwargs.get("dtype", "auto") == "auto":
                # transformers would read it off the weights; these are slices.
                kwargs["dtype"] = first_float or torch.get_default_dtype()
            if "generation_config" not in kwargs and (path / "generation_config.json").is_file():
                kwargs["generation_config"] = GenerationConfig.from_pretrained(path)
            # transformers takes a state_dict instead of a path, not beside one.
            model = concrete.from_pretrained(
                None,
                config=config,
                state_dict=state,
                experts_implementation=IMPLEMENTATION,
                **kwargs,
            )
        model.config.name_or_path = str(path)
        modules = dict(model.named_modules())
        streamed = []
        for name, layer, builders in plans:
            module = modules[name]
            loaded = [p for p in builders if getattr(module, p).device.type != "meta"]
            if loaded:
                raise smoe.InternalError(
                    f"{model_name}: transformers gave {name}.{loaded[0]} memory; smoe.transformers "
                    f"does not know this version's loader (transformers {_VERSION})"
                )
            module.__dict__["_smoe_experts"] = streamed_layer = _Layer(name, module, streamer, layer, builders)
            streamed.append((name, streamed_layer))
        # Nothing to read ahead through a ring that holds every expert.
        experts = sum(layer.num_experts for _, layer in streamed)
        if depth > 0 and streamer.stats()["ring_slots"] < experts:
            _wire_lookahead(model, streamed, depth, width)
        busy = _Busy(streamer)
        model.register_forward_pre_hook(busy.enter)
        model.register_forward_hook(busy.leave, always_call=True)
        model.__dict__["smoe_streamer"] = streamer
        return model
    except BaseException:
        streamer.close()
        raise


def _count_keyword(value: Any, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"smoe.transformers.from_pretrained: {name} must be an int, not {type(value).__name__}")
    if value < minimum:
        raise smoe.ArgumentError(f"smoe.transformers.from_pretrained: {name} must be at least {minimum}, not {value}")
    return value


def _skeleton(cls: Any, config: Any) -> tuple[torch.nn.Module, str, list[tuple[str, torch.nn.Module]]]:
    """The model's structure on the meta device (no memory), its class's
    name and its experts modules; refuses a model whose experts do not go
    through transformers' experts interface."""
    with torch.device("meta"):
        skeleton = cls.from_config(config) if hasattr(cls, "from_config") else cls(config)
    model_name = type(skeleton).__name__  # an Auto class resolves to it
    experts = _experts_modules(skeleton)
    if not experts:
        raise smoe.Unsupported(
            f"{model_name} ({config.model_type}) does not compute its experts through "
            f"transformers' experts interface "
            f"(transformers.integrations.moe.use_experts_implementation): "
            f"smoe.transformers cannot stream them"
        )
    return skeleton, model_name, experts


def _check_source(streamer: smoe.Streamer, path: pathlib.Path) -> None:
    """Refuses what is not a safetensors checkpoint or a vault packed from
    one (a GGUF, a vault packed from a GGUF): transformers' models read
    safetensors names and layouts."""
    meta = streamer.metadata
    source = meta.get("source")
    kind = source.get("kind") if isinstance(source, dict) else None
    if kind == "safetensors":
        return
    vault = meta.get("format") == "smoe-vault"
    name = f"{kind.upper()} model" if isinstance(kind, str) else "model of unknown kind"
    what = f"a vault packed from a {name}" if vault else f"a {name}"
    raise smoe.ArgumentError(
        f"{path}: is {what}; smoe.transformers.from_pretrained takes a safetensors checkpoint "
        f"or a vault packed from one (llama.cpp with smoe runs GGUF models: docs/llama.md)"
    )


def _plan(
    streamer: smoe.Streamer,
    model_name: str,
    experts: list[tuple[str, torch.nn.Module]],
    unbuilt: range,
) -> list[tuple[str, int, dict[str, _Builder]]]:
    """Each experts module's layer in the checkpoint and the builders of
    its parameters; refuses a checkpoint that does not match the model.
    The layers in ``unbuilt`` (DeepSeek-V3's and GLM-4.5's multi-token
    prediction layers, which transformers does not build) are left to the
    streamer."""
    layouts = streamer.metadata.get("layer_blob_layouts", {})
    plans = []
    for name, module in experts:
        layer = _layer_of(name)
        if layer is None or str(layer) not in layouts:
            raise smoe.FormatError(
                f"{model_name}: {name} has no routed experts in the checkpoint smoe reads "
                f"(its expert layers: {', '.join(sorted(layouts, key=int))})"
            )
        _check_count(streamer, model_name, name, layer, int(module.num_experts))
        plans.append((name, layer, _builders(name, module, layouts[str(layer)], model_name)))
    unused = sorted(
        (
            layer
            for layer in set(layouts) - {str(layer) for _, layer, _ in plans}
            if int(layer) not in unbuilt
        ),
        key=int,
    )
    if unused:
        raise smoe.FormatError(
            f"{model_name}: the checkpoint's layer {unused[0]} has routed experts, and the model "
            f"has no experts module there"
        )
    return plans


def _prediction_layers(path: pathlib.Path, config: Any) -> range:
    """The multi-token prediction layers the checkpoint at ``path`` may
    hold after its decoder's: ``num_nextn_predict_layers`` of them from
    ``num_hidden_layers``, as its own ``config.json`` says (the model's
    config may have been given other values), else as ``config`` says."""
    try:
        saved = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        saved = None
    if not isinstance(saved, dict):
        saved = {k: getattr(config, k, None) for k in ("num_hidden_layers", "num_nextn_predict_layers")}
    layers, extra = saved.get("num_hidden_layers"), saved.get("num_nextn_predict_layers")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (layers, extra)):
        return range(0)
    return range(layers, layers + extra)


def _experts_in(streamer: smoe.Streamer, layer: int) -> int:
    """How many experts the checkpoint's ``layer`` has (numbered from 0)."""
    count = 0
    while True:
        try:
            streamer.expert_info(layer, count)
        except smoe.NotFound:
            return count
        count += 1


def _check_count(streamer: smoe.Streamer, model_name: str, name: str, layer: int, count: int) -> None:
    try:
        streamer.expert_info(layer, count - 1)
    except smoe.NotFound:
        raise smoe.FormatError(
            f"{model_name}: {name} has {count} experts; the checkpoint's layer {layer} has fewer"
        ) from None
    try:
        streamer.expert_info(layer, count)
    except smoe.NotFound:
        return
    raise smoe.FormatError(
        f"{model_name}: {name} has {count} experts; the checkpoint's layer {layer} has more"
    )


def streamed_experts(model: torch.nn.Module) -> dict[str, int]:
    """The experts modules of a model from :func:`from_pretrained`, by
    name, with the layer each streams."""
    return {
        name: module.__dict__["_smoe_experts"].layer
        for name, module in model.named_modules()
        if "_smoe_experts" in module.__dict__
    }
