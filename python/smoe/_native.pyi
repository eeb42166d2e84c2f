# Type stubs of the extension module smoe._native (python/src/). The
# settings' keywords and the counters' keys repeat the library's fields:
# tests/test_api.py checks them against CONFIG_FIELDS and STATS_FIELDS.

import os
import pathlib
import types
from typing import Any, Literal, Sequence, TypedDict, final

import numpy
import numpy.typing
import torch as _torch  # aliased: Lease.torch would shadow it

__version__: str

CONFIG_FIELDS: tuple[str, ...]
"""Every setting ``Streamer`` takes as a keyword, in the library's order."""

STATS_FIELDS: tuple[str, ...]
"""Every key of ``Streamer.stats()``, in the library's order."""

_Path = str | os.PathLike[str]

class Stats(TypedDict):
    """``Streamer.stats()``: the library's counters and sizes (docs/c-api.md, ``smoe_stats``)."""

    claims: int
    hits: int
    pending: int
    bytes_read: int
    reads_demand: int
    reads_speculative: int
    reads_prewarm: int
    evictions: int
    io_errors: int
    checksum_errors: int
    resident: int
    ring_slots: int
    slot_bytes: int
    workers: int
    direct_io: int
    freq_ignored: int
    prewarm_slots: int
    trace_events: int
    trace_dropped: int
    policy: int
    slots_active: int
    shrinks: int
    grows: int
    slots_held: int
    evicted_unclaimed: int
    bytes_moved: int
    bytes_speculative: int
    bytes_speculative_unclaimed: int
    prediction_routed: int
    prediction_hits: int
    speculative_dropped: int
    busy_ns: int
    drive_idle_ns: int

class ExpertInfo(TypedDict):
    """``Streamer.expert_info()``: where an expert lives."""

    layer: int
    expert: int
    offset: int
    size: int
    padded_size: int
    xxh3: int

def config_defaults() -> dict[str, Any]:
    """Every setting's default, as ``Streamer``'s keywords take them."""

def synth(
    directory: _Path,
    *,
    layers: int,
    experts: int,
    blob_bytes: int,
    seed: int = 0,
    top_k: int = 2,
    dense_layers: Sequence[int] = (),
) -> pathlib.Path:
    """Writes a synthetic vault into ``directory`` and returns ``directory``.

    ``layers`` × ``experts`` blobs of about ``blob_bytes`` each, whose bytes
    are a pure function of ``(seed, layer, expert, offset)``. No blob
    layouts: ``Lease.numpy`` has no roles on it (``lease.numpy()`` is the
    bytes). A vault larger than the free space is refused before anything
    is made; Ctrl-C stops it and removes what it made.
    """

class _PackSummary(TypedDict):
    out_dir: pathlib.Path
    kind: Literal["gguf", "safetensors"]
    files: list[pathlib.Path]
    arch: str | None
    top_k: int | None
    layers: int
    experts: int
    blobs: int
    expert_bytes: int
    scout: str
    scout_bytes: int
    vault_id: str

def pack(source: _Path, out_dir: _Path, *, force: bool = False) -> _PackSummary:
    """Packs the model at ``source`` into a vault at ``out_dir``
    (what ``smoe pack`` does: docs/pack.md) and returns what was written.

    ``source``: a GGUF file (a split one's first part), a ``.safetensors``
    file, a checkpoint directory or its index. The experts go into
    ``experts.smoe``, the rest into a scout in the source's format; the
    ``config.json`` and ``generation_config.json`` beside a safetensors
    model are copied beside them. ``out_dir`` must not exist; ``force=True``
    replaces it only when it is empty or holds a vault and nothing else.
    The pack runs on a thread of its own, the GIL released. Ctrl-C asks it
    to stop within 50 ms; it stops at its next check (every MiB copied; a
    sync or rename finishes first), removes what it wrote and raises
    ``KeyboardInterrupt``: no new ``out_dir`` (with ``force=True`` the old
    vault stays). A Ctrl-C as the pack finishes still raises; the new vault
    is then whole.
    """

@final
class Streamer:
    """Streams a model's or a vault's experts into a ring of aligned slots.

    ``path``: a vault (directory or ``experts.smoe``) or a model opened in
    place (GGUF, split GGUF's first part, ``.safetensors``, checkpoint
    directory). The keywords are the library's settings (0 or ``None``
    means the library's automatic choice; docs/c-api.md, ``smoe_config``)
    and ``strict``: a release or close that would be deferred raises
    ``BufferError`` instead. A context manager that closes on exit.
    """

    def __init__(
        self,
        path: _Path,
        *,
        ring_slots: int = 0,
        slot_mb: int = 0,
        workers: int = 0,
        direct_io: Literal["auto", "require", "off"] = "auto",
        prewarm: bool = True,
        prewarm_slots: int = 0,
        verify: bool = False,
        scout_bytes: int | None = None,
        engine_overhead_bytes: int = 0,
        freq_path: _Path | None = None,
        trace_path: _Path | None = None,
        policy: Literal["lru", "adaptive"] = "lru",
        populate: Literal["off", "background", "open"] | bool = "off",
        lock: bool = False,
        elastic: bool = True,
        pinned: bool = False,
        strict: bool = False,
    ) -> None: ...
    def prefetch_set(self, layer: int, experts: Sequence[int], speculative: bool = False) -> int:
        """Queues a layer's working set, in order; never waits. How many members are resident or on their way."""
    def claim(self, layer: int, expert: int, timeout: float | None = None) -> Lease:
        """Claims (layer, expert), waiting for its read: None without bound, 0 once; TimeoutError after."""
    def claim_any(self, layer: int, experts: Sequence[int], timeout: float | None = None) -> Lease:
        """Claims whichever member of the set lands first (``lease.expert`` says which)."""
    def stats(self) -> Stats:
        """Every counter and size, by name."""
    @property
    def metadata(self) -> dict[str, Any]:
        """The vault's or model's metadata (docs/format.md §3), parsed; ``{}`` when there is none."""
    @property
    def warnings(self) -> list[str]:
        """Warnings recorded at open."""
    def prewarm_pause(self, busy: bool) -> None:
        """Tells the pre-warm thread the engine is busy (True) or idle (False)."""
    def ring_region(self) -> tuple[int, int, int]:
        """``(address, bytes, slot_bytes)`` of the ring."""
    def expert_info(self, layer: int, expert: int) -> ExpertInfo:
        """Where (layer, expert) lives: offset, size, padded_size, xxh3."""
    @property
    def path(self) -> pathlib.Path:
        """The path the streamer was opened with."""
    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called."""
    def close(self) -> None:
        """Closes; later calls raise ``smoe.ClosedError``. Leases still held stay valid."""
    def __enter__(self) -> Streamer: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: types.TracebackType | None,
    ) -> bool: ...

@final
class LeaseView:
    """A counted view of a lease's bytes, as an object: the claim stays held while it lives.

    The base of ``Lease.numpy()``'s arrays. The buffer protocol (read-only,
    format ``B``); nothing releases it.
    """

    def __buffer__(self, flags: int, /) -> memoryview: ...

@final
class Lease:
    """A claimed expert: its bytes stay in their slot, unchanged, until released.

    Read-only views without a copy: ``lease.numpy()`` (the claim) or
    ``lease.numpy(role)``, ``lease.torch(role)``, ``numpy.from_dlpack(lease)``,
    ``torch.from_dlpack(lease)``. A lease exports no buffer:
    ``memoryview(lease)``, ``numpy.frombuffer(lease)`` and
    ``numpy.asarray(lease)`` raise ``BufferError`` (a consumer could release
    the buffer while its array lives). A copy: ``lease.numpy().tobytes()``.
    A release while a view is alive is deferred until the last view is gone
    (``strict=True``: raises ``BufferError``). After ``release()`` the
    methods raise ``smoe.Stale``.
    """

    @property
    def layer(self) -> int: ...
    @property
    def expert(self) -> int: ...
    @property
    def hit(self) -> bool:
        """No demand read was needed."""
    @property
    def size(self) -> int:
        """The claim's bytes."""
    @property
    def slot_index(self) -> int:
        """The slot: bytes at ring address + slot_index × slot_bytes."""
    @property
    def released(self) -> bool:
        """Whether ``release()`` was called."""
    def release(self) -> None:
        """Releases the claim (deferred while a view is alive)."""
    def numpy(self, role: str | None = None) -> numpy.typing.NDArray[Any]:
        """A read-only array of one item of the layer's blob layout (``gate``, ``up``, ``down``, ...); without a role, the claim's bytes as uint8."""
    def torch(self, role: str) -> _torch.Tensor:
        """A torch tensor of one item of the layout, without a copy (read-only by contract); uint8 for quantized types."""
    def __dlpack__(
        self,
        *,
        stream: Any | None = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> object:
        """A DLPack ≥ 1.0 capsule: uint8, one dimension, read-only, CPU."""
    def __dlpack_device__(self) -> tuple[int, int]: ...
    # No __buffer__ or __array__ here: both raise BufferError at run time,
    # and without them a type checker refuses memoryview(lease) too.
    def __enter__(self) -> Lease: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: types.TracebackType | None,
    ) -> bool: ...
