"""The exceptions of smoe: ``smoe.Error`` and one subclass per library status.

Each class that reports a status of the C API has ``status`` (its number,
e.g. ``smoe.RingFull.status == -6``) and ``status_name``
(``"SMOE_ERR_RING_FULL"``), set from the library's status table when the
package is imported. Where a builtin means the same thing, the class is
that builtin too: ``except OSError`` catches ``smoe.IoError``, ``except
ValueError`` catches ``smoe.ArgumentError``.
"""

from __future__ import annotations

import os


class Error(Exception):
    """An error of the smoe library: its message, and the facts it is about.

    ``message`` is the library's sentence (what ``smoe_last_error()`` says
    in C). The facts are ``None`` when the error does not carry them:
    ``path`` (the file), ``layer`` and ``expert``, ``offset`` and ``length``
    (bytes in the file), ``os_error`` (the OS error number).
    """

    status: int | None = None
    status_name: str | None = None

    def __init__(
        self,
        message: str,
        *,
        path: str | os.PathLike[str] | None = None,
        layer: int | None = None,
        expert: int | None = None,
        offset: int | None = None,
        length: int | None = None,
        os_error: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.path = path
        self.layer = layer
        self.expert = expert
        self.offset = offset
        self.length = length
        self.os_error = os_error

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[object, ...]:
        # Pickle (multiprocessing hands a child's exception to its parent
        # this way): the facts are keyword-only, which the default reduce
        # (the class called with ``args``) loses, and an OSError's
        # ``errno``, ``strerror`` and ``filename`` are not in ``__dict__``.
        facts = {name: getattr(self, name) for name in _FACTS}
        state = dict(self.__dict__)
        if isinstance(self, OSError):
            state.update(
                errno=self.errno, strerror=self.strerror, filename=self.filename, filename2=self.filename2
            )
        return (_rebuild, (type(self), self.message, facts), state)


# The facts an Error carries, its constructor's keywords.
_FACTS = ("path", "layer", "expert", "offset", "length", "os_error")


def _rebuild(cls: type[Error], message: str, facts: dict[str, object]) -> Error:
    """An unpickled error: its class called as the library calls it."""
    return cls(message, **facts)  # type: ignore[arg-type]


class ArgumentError(Error, ValueError):
    """A value out of range or malformed (``SMOE_ERR_ARGUMENT``)."""


class NotFound(Error, LookupError):
    """The layer or the (layer, expert) pair is not in the vault (``SMOE_ERR_NOT_FOUND``)."""


class IoError(Error, OSError):
    """Opening or reading a file failed (``SMOE_ERR_IO``); ``errno`` is ``os_error``."""

    def __init__(self, message: str, **facts: object) -> None:
        super().__init__(message, **facts)  # type: ignore[arg-type]
        self.errno = self.os_error
        self.filename = self.path


class FormatError(Error):
    """The vault, the model or a blob is invalid (``SMOE_ERR_FORMAT``)."""


class NoMemory(Error, MemoryError):
    """The ring could not be allocated or locked (``SMOE_ERR_NO_MEMORY``)."""


class RingFull(Error):
    """Every slot is claimed or loading (``SMOE_ERR_RING_FULL``): release leases."""


class Stale(Error):
    """A claim that is not held was used: a released lease (``SMOE_ERR_STALE``)."""


class Unsupported(Error):
    """The platform refused what was asked (direct I/O, mlock) (``SMOE_ERR_UNSUPPORTED``)."""


class InternalError(Error):
    """A bug: a panic was caught, or the streamer failed earlier (``SMOE_ERR_INTERNAL``)."""


class ClosedError(ArgumentError):
    """The streamer was closed: every call but ``close()`` raises this."""


# Shown as smoe.RingFull, not smoe._errors.RingFull, in tracebacks and reprs.
for _class in (
    Error,
    ArgumentError,
    NotFound,
    IoError,
    FormatError,
    NoMemory,
    RingFull,
    Stale,
    Unsupported,
    InternalError,
    ClosedError,
):
    _class.__module__ = "smoe"
del _class
