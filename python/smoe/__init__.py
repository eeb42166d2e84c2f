"""smoe: stream Mixture-of-Experts expert weights from SSD into a ring of aligned slots.

Open a model (GGUF, safetensors) or a vault, hand each layer's working set
over, and read each expert's bytes in place, without a copy::

    import smoe

    with smoe.Streamer("model.gguf", ring_slots=64) as s:
        s.prefetch_set(3, [17, 5])
        with s.claim_any(3, [17, 5], timeout=1.0) as lease:
            gate = lease.numpy("gate")      # read-only, typed from the layout

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
    Streamer,
    __version__,
    config_defaults,
    synth,
)

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
    "NoMemory",
    "NotFound",
    "RingFull",
    "Stale",
    "Streamer",
    "Unsupported",
    "__version__",
    "config_defaults",
    "synth",
]
