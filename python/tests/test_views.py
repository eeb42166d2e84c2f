"""Zero-copy views of a lease, and the rule that none outlives its claim."""

from __future__ import annotations

import gc
import io
import os
import time

import numpy
import pytest

import smoe
from conftest import QUIET, vault_bytes


def held(s: smoe.Streamer) -> int:
    return s.stats()["slots_held"]


# What the refusal of the buffer protocol must name: the safe views and a
# copy.
SAFE_WAYS = ("lease.numpy()", "numpy.from_dlpack(lease)", "lease.torch(", "lease.numpy().tobytes()")


def refused(call) -> str:
    """The BufferError ``call`` raises; the same reason comes as a
    RuntimeWarning (for consumers that replace the error with their own)."""
    with pytest.warns(RuntimeWarning, match="exports no buffer"):
        with pytest.raises(BufferError) as caught:
            call()
    return str(caught.value)


@pytest.mark.parametrize(
    "consumer",
    ["memoryview", "numpy.frombuffer", "numpy.asarray", "numpy.array", "bytes", "PyObject_GetBuffer"],
)
def test_a_lease_exports_no_buffer(vault, consumer):
    """Issue 47, item 1: a buffer of the lease could be released under its
    array. numpy.frombuffer(lease) and numpy.asarray(lease) keep the buffer
    in a memoryview of numpy's making (``arr.base``), and its
    ``release()`` ends the buffer, and with it the last reference to
    anything that could hold the claim: the claim was freed with the array
    alive, which then showed another expert's bytes, and after ``close()``
    unmapped memory. No exporter can prevent that, so a lease exports no
    buffer: every consumer of the buffer protocol gets a BufferError that
    says why and names the views that hold the claim, and a copy. Nothing
    is counted: a strict release succeeds after it."""
    import ctypes

    def get_buffer(lease):
        call = ctypes.pythonapi.PyObject_GetBuffer
        call.argtypes = [ctypes.py_object, ctypes.c_void_p, ctypes.c_int]
        call.restype = ctypes.c_int
        py_buffer = ctypes.create_string_buffer(256)  # more than a Py_buffer
        call(lease, ctypes.addressof(py_buffer), 0)  # PyBUF_SIMPLE

    calls = {
        "memoryview": memoryview,
        "numpy.frombuffer": lambda lease: numpy.frombuffer(lease, dtype=numpy.uint8),
        "numpy.asarray": numpy.asarray,
        "numpy.array": numpy.array,
        "bytes": bytes,
        "PyObject_GetBuffer": get_buffer,
    }
    with smoe.Streamer(vault, ring_slots=4, strict=True, **QUIET) as s:
        lease = s.claim(0, 2, timeout=10)
        message = refused(lambda: calls[consumer](lease))
        for way in SAFE_WAYS:
            assert way in message, f"{way!r} not named in: {message}"
        assert "release" in message, f"the reason is not given: {message}"
        assert held(s) == 1
        lease.release()
        assert held(s) == 0


def test_lease_numpy_is_the_claim_read_only(vault, streamer):
    """What memoryview(lease) and numpy.frombuffer(lease) gave, the pinned
    way: the claim's bytes, read-only, at the slot's address."""
    with streamer.claim(0, 2, timeout=10) as lease:
        array = lease.numpy()
        assert not array.flags.writeable and array.size == lease.size
        assert array.ctypes.data == streamer.ring_region()[0] + lease.slot_index * streamer.stats()["slot_bytes"]
        with pytest.raises(ValueError):
            array[0] = 1
        assert array.tobytes() == vault_bytes(vault, streamer, 0, 2)
        view = memoryview(array)
        assert view.readonly and view.nbytes == lease.size
        with pytest.raises(TypeError):
            view[0] = 1
        view.release()
        del array


def test_a_writable_buffer_is_refused(vault):
    """A consumer asking for a writable buffer gets the lease's own refusal
    (through the C API, so that nothing in between replaces it), and the
    refused request counts no view: a strict release succeeds after it."""
    import ctypes

    get_buffer = ctypes.pythonapi.PyObject_GetBuffer
    get_buffer.argtypes = [ctypes.py_object, ctypes.c_void_p, ctypes.c_int]
    get_buffer.restype = ctypes.c_int
    py_buffer = ctypes.create_string_buffer(256)  # more than a Py_buffer
    PyBUF_WRITABLE = 0x0001
    with smoe.Streamer(vault, ring_slots=4, strict=True, **QUIET) as s:
        lease = s.claim(0, 1, timeout=10)
        with pytest.warns(RuntimeWarning, match="exports no buffer"):
            with pytest.raises(BufferError, match="exports no buffer"):
                get_buffer(lease, ctypes.addressof(py_buffer), PyBUF_WRITABLE)
            with pytest.raises((BufferError, TypeError)):
                (ctypes.c_char * lease.size).from_buffer(lease)
            with pytest.raises(TypeError):
                io.BytesIO(b"xy").readinto(lease)
        lease.release()


def test_lease_numpy_without_a_role_is_the_claim(vault, streamer):
    """The claim's bytes as a uint8 array, read-only, for any numpy (the
    pinned way to what numpy.frombuffer(lease) gives)."""
    with streamer.claim(0, 2, timeout=10) as lease:
        array = lease.numpy()
        assert array.dtype == numpy.uint8 and array.shape == (lease.size,)
        assert not array.flags.writeable
        assert array.tobytes() == vault_bytes(vault, streamer, 0, 2)
        assert type(array.base).__name__ == "LeaseView" and "layer 0 expert 2" in repr(array.base)
    assert held(streamer) == 1, "the array is a view"
    del array
    assert held(streamer) == 0


def test_release_waits_for_the_last_view(streamer):
    lease = streamer.claim(1, 2, timeout=10)
    view = lease.numpy()
    array = numpy.from_dlpack(lease)
    first = view[:16].tobytes()
    lease.release()
    assert lease.released
    assert held(streamer) == 1, "a view is alive: the slot stays held"
    assert view[:16].tobytes() == first == array[:16].tobytes()
    del view
    assert held(streamer) == 1
    del array
    assert held(streamer) == 0


def test_with_block_defers_too(streamer):
    with streamer.claim(1, 2, timeout=10) as lease:
        array = lease.numpy()
    assert lease.released and held(streamer) == 1
    del array
    assert held(streamer) == 0


def test_a_released_lease_s_methods_raise(streamer):
    lease = streamer.claim(0, 3, timeout=10)
    lease.release()
    for call in (
        lease.release,
        lambda: lease.numpy(),
        lambda: lease.__dlpack__(max_version=(1, 0)),
        lease.__dlpack_device__,
        lambda: lease.numpy("gate"),
        lambda: lease.__enter__(),
    ):
        with pytest.raises(smoe.Stale, match="layer 0 expert 3 was released"):
            call()
    assert (lease.layer, lease.expert) == (0, 3), "its identity stays readable"
    assert "released" in repr(lease)


def test_a_lease_dropped_unreleased_is_released(streamer):
    lease = streamer.claim(0, 0, timeout=10)
    assert held(streamer) == 1
    del lease
    gc.collect()
    assert held(streamer) == 0


def test_strict_refuses_a_deferred_release(vault):
    with smoe.Streamer(vault, ring_slots=4, strict=True, **QUIET) as s:
        lease = s.claim(0, 1, timeout=10)
        view = lease.numpy()
        with pytest.raises(BufferError, match="strict=True"):
            lease.release()
        assert not lease.released and held(s) == 1
        with pytest.raises(BufferError):
            with lease:
                pass
        del view
        lease.release()
        assert held(s) == 0


def test_strict_with_block_unwinding_defers(vault):
    with smoe.Streamer(vault, ring_slots=4, strict=True, **QUIET) as s:
        with pytest.raises(KeyError):
            with s.claim(0, 1, timeout=10) as lease:
                view = lease.numpy()
                raise KeyError("the error on its way out is not masked")
        assert lease.released and held(s) == 1
        del view
        assert held(s) == 0


def test_strict_close_refuses_while_leases_are_held(vault):
    s = smoe.Streamer(vault, ring_slots=4, strict=True, **QUIET)
    lease = s.claim(1, 1, timeout=10)
    with pytest.raises(BufferError, match="1 lease"):
        s.close()
    assert not s.closed
    lease.release()
    s.close()


def test_a_lease_outlives_its_streamer(vault):
    s = smoe.Streamer(vault, ring_slots=4, **QUIET)
    lease = s.claim(1, 3, timeout=10)
    want = vault_bytes(vault, s, 1, 3)
    array = lease.numpy()
    s.close()
    del s
    gc.collect()
    # The ring stays mapped (and the claim held) until the lease and its
    # views are gone.
    assert array.tobytes() == want == lease.numpy().tobytes()
    lease.release()
    assert array.tobytes() == want
    del array, lease
    gc.collect()


def test_dlpack_is_read_only_uint8_on_the_cpu(vault, streamer):
    with streamer.claim(1, 0, timeout=10) as lease:
        assert lease.__dlpack_device__() == (1, 0)
        array = numpy.from_dlpack(lease)
        assert array.dtype == numpy.uint8 and array.shape == (lease.size,)
        assert not array.flags.writeable
        assert array.tobytes() == vault_bytes(vault, streamer, 1, 0)
    assert held(streamer) == 1, "the tensor is a view"
    del array
    assert held(streamer) == 0


@pytest.mark.parametrize(
    "keywords, words",
    [
        ({}, "DLPack ≥ 1.0"),
        ({"max_version": (0, 8)}, "DLPack ≥ 1.0"),
        ({"max_version": (1, 0), "copy": True}, "without a copy"),
        ({"max_version": (1, 0), "dl_device": (2, 0)}, "CPU memory"),
        ({"max_version": (1, 0), "stream": 1}, "stream must be None"),
    ],
)
def test_dlpack_refuses_what_it_cannot_honour(streamer, keywords, words):
    with streamer.claim(1, 0, timeout=10) as lease:
        with pytest.raises(BufferError, match=words):
            lease.__dlpack__(**keywords)
    assert held(streamer) == 0


class Once:
    """Hands numpy the same capsule each time."""

    def __init__(self, capsule):
        self.capsule = capsule

    def __dlpack__(self, **_):
        return self.capsule

    def __dlpack_device__(self):
        return (1, 0)


def test_a_capsule_is_consumed_once(streamer):
    lease = streamer.claim(0, 2, timeout=10)
    capsule = Once(lease.__dlpack__(max_version=(1, 0)))
    array = numpy.from_dlpack(capsule)
    assert "used_dltensor_versioned" in repr(capsule.capsule)
    with pytest.raises(ValueError, match="incorrect name"):
        numpy.from_dlpack(capsule)
    lease.release()
    assert held(streamer) == 1
    del capsule
    assert held(streamer) == 1, "the consumer owns the tensor now"
    del array
    assert held(streamer) == 0


def test_an_unconsumed_capsule_frees_its_view(streamer):
    lease = streamer.claim(0, 2, timeout=10)
    capsule = lease.__dlpack__(max_version=(1, 1))
    lease.release()
    assert held(streamer) == 1
    del capsule
    assert held(streamer) == 0


def test_strict_streamer_with_block(vault):
    with pytest.raises(BufferError, match="1 lease"):
        with smoe.Streamer(vault, ring_slots=4, strict=True, **QUIET) as s:
            lease = s.claim(0, 1, timeout=10)
    assert not s.closed, "refused: nothing closed"
    lease.release()
    s.close()
    # Unwinding, it closes as a streamer that is not strict does.
    with pytest.raises(KeyError):
        with smoe.Streamer(vault, ring_slots=4, strict=True, **QUIET) as s:
            lease = s.claim(0, 1, timeout=10)
            raise KeyError("the error on its way out is not masked")
    assert s.closed
    assert len(lease.numpy().tobytes()) == lease.size
    lease.release()


# What a user may do to the objects under a numpy view: release every
# memoryview found below the array (``arr.base``, ``arr.base.base``...).
# Then the lease is released, other experts are read through the ring, the
# streamer is closed, and the array read again. Run in a child process: an
# array left showing a freed ring is a SIGSEGV.
PINNED_VIEW = r"""
import sys
import numpy
import smoe

path, how = sys.argv[1:]
s = smoe.Streamer(path, ring_slots=2, workers=1, prewarm=False, freq_path="")
lease = s.claim(1, 5, timeout=10)
array = {
    "role": lambda: lease.numpy("gate"),
    "whole": lambda: lease.numpy(),
    "dlpack": lambda: numpy.from_dlpack(lease),
}[how]()
want = array.tobytes()
base = array
while base is not None:
    if isinstance(base, memoryview):
        base.release()
    base = getattr(base, "base", None)
lease.release()
print("held", s.stats()["slots_held"], flush=True)
for expert in range(16):
    s.claim(1, expert, timeout=10).release()
print("same", array.tobytes() == want, flush=True)
s.close()
print("after close", array.tobytes() == want, flush=True)
"""


@pytest.mark.parametrize("how", ["role", "whole", "dlpack"])
def test_a_numpy_view_s_base_cannot_be_released(how):
    """Issue 47, item 1: ``lease.numpy(role)`` was built on a memoryview
    (``arr.base.base``) whose ``release()`` uncounted the view, so the
    claim was freed with the array alive: it then showed another expert's
    bytes, and after ``close()`` reading it was a SIGSEGV. Nothing under
    the array may be releasable; DLPack's capsule never was."""
    import subprocess
    import sys

    from conftest import MODELS

    done = subprocess.run(
        [sys.executable, "-c", PINNED_VIEW, str(MODELS / "qwen3moe-f16"), how],
        capture_output=True, text=True, timeout=120,
    )
    assert done.stdout.splitlines() == ["held 1", "same True", "after close True"], (
        f"exit {done.returncode}\n{done.stdout}{done.stderr}"
    )
    assert done.returncode == 0, done.stderr


def tasks() -> int:
    """The library's threads in this process (named ``smoe-...``)."""
    count = 0
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                count += f.read().startswith("smoe-")
        except FileNotFoundError:
            pass  # ended meanwhile
    return count


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="no /proc/self/task to count threads")
def test_the_last_release_tears_a_closed_streamer_down(vault, tmp_path):
    """Issue 47, item 3: after the README's ``with`` blocks, the ``lease``
    name still holds the released lease, and it kept the closed streamer
    alive (the ring, the library's threads, the histogram unwritten) until
    the Lease object was collected. The teardown follows the last release."""
    histogram = tmp_path / "histogram"
    gc.collect()  # no other test's streamer torn down meanwhile
    before = tasks()
    with smoe.Streamer(vault, ring_slots=4, workers=4, prewarm=False, freq_path=str(histogram)) as s:
        # A thread names itself once it runs.
        deadline = time.monotonic() + 10
        while tasks() == before and time.monotonic() < deadline:
            time.sleep(0.01)
        assert tasks() > before, "the library's threads run"
        with s.claim(0, 1, timeout=10) as lease:
            assert lease.numpy().tobytes() == vault_bytes(vault, s, 0, 1)
    assert lease.released and (lease.layer, lease.expert) == (0, 1)
    assert histogram.exists(), "the teardown writes the claim histogram"
    assert tasks() == before, "the library's threads are joined"
    # Released before the close, then the close the last holder: the same.
    with smoe.Streamer(vault, ring_slots=4, workers=4, prewarm=False, freq_path="") as s:
        lease = s.claim(0, 2, timeout=10)
        array = lease.numpy()
        lease.release()
    assert tasks() > before, "a view is alive: the ring and its threads stay"
    del array
    assert tasks() == before, "the last view's release tore the streamer down"
    del lease


def test_a_view_s_teardown_lets_other_threads_run(vault, testing):
    """Issue 47, item 6: when a DLPack view is the last holder of a closed
    streamer, its release tears the streamer down (joins the library's
    threads, writes the histogram): with the GIL held, that stopped every
    other Python thread (1.4 s in the report). Here the teardown waits for
    a read held behind the test's gate for 0.5 s, while another Python
    thread counts; it must go on counting."""
    import threading

    s, gate = testing.open_gated(vault, ring_slots=4, **{**QUIET, "workers": 1})
    gate.open()
    lease = s.claim(0, 1, timeout=10)
    array = numpy.from_dlpack(lease)
    lease.release()
    del lease
    gate.close()
    s.prefetch_set(1, [3])  # its read waits behind the gate
    time.sleep(0.2)
    s.close()
    ticks: list[float] = []
    stop = threading.Event()

    def count():
        while not stop.is_set():
            ticks.append(time.monotonic())
            time.sleep(0.001)

    ticker = threading.Thread(target=count)
    ticker.start()
    time.sleep(0.05)
    gate.open_after(0.5)  # from a thread of the library's, which needs no GIL
    start = time.monotonic()
    del array  # the last holder: the teardown
    took = time.monotonic() - start
    time.sleep(0.05)
    stop.set()
    ticker.join()
    assert took > 0.4, f"the teardown waited for the held read ({took:.3f} s)"
    during = [t for t in ticks if start <= t <= start + took]
    gaps = [b - a for a, b in zip([start, *during], [*during, start + took])]
    print(f"teardown {took:.3f} s; another thread's longest pause {max(gaps) * 1000:.1f} ms")
    assert max(gaps) < 0.2, (
        f"another thread stood still for {max(gaps):.3f} s of the {took:.3f} s teardown"
    )


def test_a_dlpack_device_error_names_the_devices(streamer):
    """Issue 47, item 9: the message printed Rust's ``Some((2, 0))``."""
    with streamer.claim(1, 0, timeout=10) as lease:
        with pytest.raises(BufferError) as caught:
            lease.__dlpack__(max_version=(1, 0), dl_device=(2, 0))
    message = str(caught.value)
    assert "Some" not in message, message
    assert "(2, 0) (kDLCUDA)" in message and "(1, 0) (kDLCPU)" in message, message
