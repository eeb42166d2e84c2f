"""smoe: stream Mixture-of-Experts expert weights from SSD into a ring of aligned slots.

Open a model (GGUF, safetensors) or a vault, hand each layer's working set
over, and read each expert's bytes in place, without a copy::

    import smoe

    with smoe.Streamer("model.gguf", ring_slots=64) as s:
        s.prefetch_set(3, [17, 5])
        with s.claim_any(3, [17, 5], timeout=1.0) as lease:
            gate = lease.numpy("gate")      # read-only, typed from the layout
            down = lease.torch("down")      # a torch tensor, the same way

``smoe.transformers.from_pretrained(path, ring_slots=...)`` runs a Hugging
Face transformers model with its routed experts streamed (imported on first
use: it needs transformers and torch).

The API, its lifetime rules and what is not done yet: docs/python.md in the
repository.
"""

from ._errors import (
    ArgumentError,
    ClosedError,
    Error,
    FormatError,
    InternalError,
    IoError,
    NoMemory,
    NotFound,
    RingFull,
    Stale,
    Unsupported,
)
from ._native import (
    CONFIG_FIELDS,
    STATS_FIELDS,
    Lease,
    LeaseView,
    Streamer,
    __version__,
    config_defaults,
    pack,
    synth,
)



def __getattr__(name: str) -> object:
    # `smoe.transformers` without an import of its own; imported on first
    # use only, since it imports transformers and torch.
    if name == "transformers":
        import importlib

        return importlib.import_module(".transformers", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CONFIG_FIELDS",
    "STATS_FIELDS",
    "ArgumentError",
    "ClosedError",
    "Error",
    "FormatError",
    "InternalError",
    "IoError",
    "Lease",
    "LeaseView",
    "NoMemory",
    "NotFound",
    "RingFull",
    "Stale",
    "Streamer",
    "Unsupported",
    "__version__",
    "config_defaults",
    "pack",
    "synth",
]
