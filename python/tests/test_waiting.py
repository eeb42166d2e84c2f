"""Blocking waits: the GIL is released, Ctrl-C interrupts, timeouts and a
close from another thread end them. The streamers here read behind a gate
(smoe._native._testing, the library's read seam), so a claim waits exactly
as long as a test wants."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

import smoe
from conftest import QUIET, vault_bytes


@pytest.fixture
def gated(vault, testing):
    s, gate = testing.open_gated(vault, ring_slots=4, **{**QUIET, "workers": 1})
    yield s, gate
    gate.open()
    s.close()


def test_another_thread_runs_while_a_claim_waits(vault, gated):
    s, gate = gated
    ran = []

    def other():
        # Pure Python: it runs only while the waiting thread lets go of the GIL.
        for i in range(1000):
            ran.append(i)
        gate.open()

    start = time.monotonic()
    threading.Timer(0.2, other).start()
    with s.claim(0, 1, timeout=20) as lease:
        waited = time.monotonic() - start
        assert len(ran) == 1000
        assert not lease.hit
        assert lease.numpy().tobytes() == vault_bytes(vault, s, 0, 1)
    assert 0.15 < waited < 10


def test_claim_any_waits_too(gated):
    s, gate = gated
    threading.Timer(0.1, gate.open).start()
    with s.claim_any(1, [2, 3], timeout=20) as lease:
        assert lease.expert in (2, 3)


def test_a_timeout_raises_timeout_error(gated):
    s, gate = gated
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="layer 0 expert 2 did not land in the ring within 0.3 s"):
        s.claim(0, 2, timeout=0.3)
    assert 0.25 < time.monotonic() - start < 5
    # One wait, however many slices it was asked to go on: one pending.
    assert s.stats()["pending"] == 1
    gate.open()
    s.claim(0, 2, timeout=20).release()


def test_ctrl_c_interrupts_a_wait(gated):
    s, gate = gated
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()
        start = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            s.claim(1, 1)  # no timeout: only the signal ends it
        assert time.monotonic() - start < 5
    finally:
        signal.signal(signal.SIGINT, previous)
    assert s.stats()["slots_held"] == 0
    assert s.stats()["pending"] == 1
    gate.open()
    with s.claim(1, 1, timeout=20) as lease:
        assert lease.expert == 1


def test_ctrl_c_is_never_lost_when_the_claim_lands_with_it(vault, testing):
    # The signal and the read's landing a moment apart: whether the claim
    # raises or returns, the KeyboardInterrupt reaches Python, and nothing
    # stays held.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        for round_ in range(6):
            s, gate = testing.open_gated(vault, ring_slots=4, **{**QUIET, "workers": 1})

            def interrupt_then_land(gate=gate):
                os.kill(os.getpid(), signal.SIGINT)
                gate.open()

            interrupted = False
            lease = None
            try:
                threading.Timer(0.1, interrupt_then_land).start()
                lease = s.claim(0, 1, timeout=20)
                # Returned first: the signal is raised by Python's next check.
                for _ in range(100):
                    time.sleep(0.01)
            except KeyboardInterrupt:
                interrupted = True
            assert interrupted, f"round {round_}: the KeyboardInterrupt was lost"
            if lease is not None:
                lease.release()
            assert s.stats()["slots_held"] == 0
            s.close()
    finally:
        signal.signal(signal.SIGINT, previous)


def test_close_from_another_thread_ends_a_wait(gated):
    s, gate = gated

    def close_then_open():
        s.close()
        # The waiting thread drops the last reference, which joins the
        # library's I/O thread: let its read finish.
        time.sleep(0.2)
        gate.open()

    threading.Timer(0.2, close_then_open).start()
    with pytest.raises(smoe.ClosedError):
        s.claim(0, 3)
