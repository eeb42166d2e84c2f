"""The Streamer's settings, methods, errors and close rules."""

from __future__ import annotations

import ast
import os
import pathlib
import warnings

import pytest

import smoe
from conftest import EXPERTS, LAYERS, QUIET, need, vault_bytes

STUB = pathlib.Path(smoe.__file__).with_name("_native.pyi")


def stub_class(name: str) -> ast.ClassDef:
    tree = ast.parse(STUB.read_text())
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)


def test_the_stub_names_every_setting_with_its_default():
    init = next(
        n for n in stub_class("Streamer").body if isinstance(n, ast.FunctionDef) and n.name == "__init__"
    )
    names = [a.arg for a in init.args.kwonlyargs]
    assert tuple(names) == smoe.CONFIG_FIELDS + ("strict",)
    defaults = {a.arg: ast.literal_eval(d) for a, d in zip(init.args.kwonlyargs, init.args.kw_defaults)}
    assert defaults == {**smoe.config_defaults(), "strict": False}


def test_the_stub_names_every_counter():
    fields = [n.target.id for n in stub_class("Stats").body if isinstance(n, ast.AnnAssign)]
    assert tuple(fields) == smoe.STATS_FIELDS


def test_the_package_is_typed():
    assert pathlib.Path(smoe.__file__).with_name("py.typed").exists()


def test_stats_has_every_counter(streamer):
    stats = streamer.stats()
    assert tuple(stats) == smoe.STATS_FIELDS
    assert all(isinstance(v, int) for v in stats.values())
    assert stats["ring_slots"] == 4
    assert stats["workers"] == 2


def test_settings_reach_the_library(vault):
    with smoe.Streamer(vault, ring_slots=3, workers=1, policy="adaptive", direct_io="off", **{
        k: v for k, v in QUIET.items() if k != "workers"
    }) as s:
        stats = s.stats()
        assert (stats["ring_slots"], stats["workers"], stats["policy"], stats["direct_io"]) == (3, 1, 1, 0)


@pytest.mark.parametrize("populate", ["off", "background", "open", False, True])
def test_every_populate_value_opens_and_reads(vault, populate):
    # False and True: the switch `populate` was before it had three values
    with smoe.Streamer(vault, populate=populate, **QUIET) as s:
        with s.claim(0, 1) as lease:
            assert lease.numpy().tobytes() == vault_bytes(vault, s, 0, 1)


def test_unknown_keywords_are_named(vault):
    with pytest.raises(TypeError, match="'ringslots', 'colour'"):
        smoe.Streamer(vault, ringslots=3, colour="red")


@pytest.mark.parametrize(
    "setting, error, words",
    [
        ({"ring_slots": -1}, smoe.ArgumentError, "ring_slots must be in 0..=4294967295, got -1"),
        ({"ring_slots": 2**32}, smoe.ArgumentError, "0..=4294967295"),
        ({"ring_slots": 2.0}, TypeError, "ring_slots must be an int"),
        ({"ring_slots": True}, TypeError, "not bool"),
        ({"prewarm": 1}, TypeError, "prewarm must be a bool, not int"),
        ({"direct_io": "sometimes"}, smoe.ArgumentError, "direct_io must be one of"),
        ({"policy": 1}, TypeError, "policy must be one of"),
        ({"populate": "always"}, smoe.ArgumentError, "populate must be one of"),
        ({"populate": 2}, TypeError, "populate must be one of"),
        ({"scout_bytes": "1G"}, TypeError, "scout_bytes must be None or an int"),
        ({"freq_path": 3}, TypeError, "freq_path must be None, a str or an os.PathLike"),
        ({"strict": "yes"}, TypeError, "strict must be a bool"),
        # Ranges the library itself checks.
        ({"workers": 65}, smoe.ArgumentError, "workers is 65"),
    ],
)
def test_bad_settings_say_what_is_wrong(vault, setting, error, words):
    with pytest.raises(error, match=words):
        smoe.Streamer(vault, **setting)


def test_numpy_integers_and_paths_are_accepted(vault):
    numpy = pytest.importorskip("numpy")
    with smoe.Streamer(pathlib.Path(vault), ring_slots=numpy.uint32(2), **QUIET) as s:
        assert s.stats()["ring_slots"] == 2
        assert s.path == pathlib.Path(vault)


def test_metadata_is_the_parsed_json(streamer):
    meta = streamer.metadata
    assert meta["format"] == "smoe-vault"
    assert meta["synth"] == {"seed": 7, "blob_bytes": 20_000, "n_layers": LAYERS, "n_experts": EXPERTS}
    meta["format"] = "changed"
    assert streamer.metadata["format"] == "smoe-vault", "a new dict each time"


def test_warnings_and_ring_region(streamer):
    assert all(isinstance(w, str) for w in streamer.warnings)
    address, size, slot_bytes = streamer.ring_region()
    assert address % 16384 == 0
    assert size == 4 * slot_bytes == 4 * streamer.stats()["slot_bytes"]
    streamer.prewarm_pause(True)
    streamer.prewarm_pause(False)


def test_claim_is_in_the_ring(vault, streamer):
    address, size, slot_bytes = streamer.ring_region()
    assert streamer.prefetch_set(1, [3, 0]) == 2
    with streamer.claim(1, 3, timeout=10) as lease:
        assert (lease.layer, lease.expert) == (1, 3)
        assert lease.size == streamer.expert_info(1, 3)["size"]
        assert 0 <= lease.slot_index < 4
        assert lease.numpy().tobytes() == vault_bytes(vault, streamer, 1, 3)
    with streamer.claim(1, 3, timeout=0) as again:
        assert again.hit, "released, the expert stays in the ring"
    stats = streamer.stats()
    assert (stats["claims"], stats["hits"]) == (2, 1)


def test_claim_any_takes_each_member(vault, streamer):
    todo = [2, 0, 3]
    streamer.prefetch_set(0, todo)
    seen = []
    while todo:
        with streamer.claim_any(0, todo, timeout=10) as lease:
            assert lease.expert in todo
            assert lease.numpy().tobytes() == vault_bytes(vault, streamer, 0, lease.expert)
            todo.remove(lease.expert)
            seen.append(lease.expert)
    assert sorted(seen) == [0, 2, 3]


def test_speculative_prefetch(streamer):
    assert streamer.prefetch_set(1, [1], speculative=True) == 1
    streamer.claim(1, 1, timeout=10).release()


def test_timeout_zero_tries_once(streamer):
    with pytest.raises(TimeoutError, match="timeout=0 tries once"):
        streamer.claim(0, 1, timeout=0)
    assert streamer.stats()["pending"] == 1
    streamer.claim(0, 1, timeout=10).release()


@pytest.mark.parametrize("timeout", [-1, float("nan")])
def test_a_negative_timeout_is_refused(streamer, timeout):
    with pytest.raises(smoe.ArgumentError, match="timeout must be None or a number"):
        streamer.claim(0, 0, timeout=timeout)


def test_errors_are_the_library_s(vault, streamer):
    with pytest.raises(smoe.NotFound) as caught:
        streamer.claim(LAYERS, 0, timeout=0)
    assert caught.value.status == -2 and caught.value.status_name == "SMOE_ERR_NOT_FOUND"
    assert caught.value.layer == LAYERS
    with pytest.raises(smoe.NotFound, match="layer 0 expert 99 is not in the vault"):
        streamer.claim_any(0, [1, 99])
    with pytest.raises(smoe.NotFound):
        streamer.prefetch_set(0, [EXPERTS])
    with pytest.raises(smoe.ArgumentError, match="empty"):
        streamer.claim_any(0, [])
    with pytest.raises(smoe.IoError) as caught:
        smoe.Streamer(vault / "missing")
    assert isinstance(caught.value, OSError) and caught.value.errno == 2
    assert caught.value.path == str(vault / "missing")
    not_a_vault = vault / "not-a-vault.bin"
    not_a_vault.write_bytes(b"x" * 4096)
    with pytest.raises(smoe.FormatError):
        smoe.Streamer(not_a_vault)


@pytest.mark.parametrize(
    "call, error, words",
    [
        (lambda s: s.claim(-1, 0), smoe.ArgumentError, "layer must be in 0..=4294967295, got -1"),
        (lambda s: s.claim(0, 2**40), smoe.ArgumentError, "expert must be in 0..=4294967295"),
        (lambda s: s.claim(True, 0), TypeError, "layer must be an int"),
        (lambda s: s.claim("0", 0), TypeError, "layer must be an int in 0..=4294967295, not str"),
        (lambda s: s.prefetch_set(0, [1, -2]), smoe.ArgumentError, r"experts\[1\] must be in 0..=4294967295, got -2"),
        (lambda s: s.prefetch_set(0, "12"), TypeError, "experts must be a list of ints, not str"),
        (lambda s: s.claim_any(0, [2**32]), smoe.ArgumentError, r"experts\[0\] must be in"),
        (lambda s: s.claim_any(0, 5), TypeError, "experts must be a list of ints, not int"),
        (lambda s: s.expert_info(0, -5), smoe.ArgumentError, "expert must be in 0..=4294967295, got -5"),
    ],
)
def test_bad_ids_name_the_argument(streamer, call, error, words):
    """A layer or an expert outside the library's range is an ArgumentError
    (a ValueError) naming the argument, not an OverflowError; nothing is
    claimed or queued."""
    with pytest.raises(error, match=words):
        call(streamer)
    stats = streamer.stats()
    assert stats["slots_held"] == 0 and stats["claims"] == 0 and stats["pending"] == 0


def test_ids_accept_numpy_integers_and_ranges(streamer):
    np = need("numpy")
    assert streamer.prefetch_set(np.uint32(0), range(2)) == 2
    with streamer.claim_any(np.int64(0), (np.int16(1), 0), timeout=10) as lease:
        assert lease.layer == 0
    streamer.claim(0, np.uint8(1), timeout=10).release()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork on this platform")
def test_a_forked_child_is_told_to_open_its_own(vault):
    """A child made by fork() has the streamer without its I/O threads: a
    claim there would wait for a read that never lands. It raises at once,
    saying so; the parent's streamer goes on."""
    with smoe.Streamer(vault, ring_slots=2, **QUIET) as s:
        s.claim(0, 0, timeout=10).release()
        with warnings.catch_warnings():
            # Python 3.12 warns that fork() in a threaded process may deadlock.
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:
            code = 3
            try:
                s.claim(0, 1, timeout=5)
            except RuntimeError as e:
                code = 0 if "forked" in str(e) else 2
            except BaseException:
                code = 1
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
        s.claim(0, 1, timeout=10).release()


def test_a_full_ring_raises_ring_full(vault):
    with smoe.Streamer(vault, ring_slots=2, **QUIET) as s:
        first = s.claim(0, 0, timeout=10)
        second = s.claim(0, 1, timeout=10)
        with pytest.raises(smoe.RingFull) as caught:
            s.claim(0, 2, timeout=10)
        assert caught.value.status == -6
        first.release()
        s.claim(0, 2, timeout=10).release()
        second.release()


def test_every_status_has_its_class():
    classes = [
        smoe.ArgumentError, smoe.NotFound, smoe.IoError, smoe.FormatError, smoe.NoMemory,
        smoe.RingFull, smoe.Stale, smoe.Unsupported, smoe.InternalError,
    ]
    assert [c.status for c in classes] == [-1, -2, -3, -4, -5, -6, -7, -8, -99]
    assert all(issubclass(c, smoe.Error) for c in classes)
    assert issubclass(smoe.IoError, OSError) and issubclass(smoe.ArgumentError, ValueError)
    assert smoe.RingFull.__module__ == "smoe"


def test_close_is_idempotent_and_later_calls_raise(vault):
    s = smoe.Streamer(vault, **QUIET)
    assert not s.closed
    s.close()
    s.close()
    assert s.closed
    for call in (s.stats, lambda: s.claim(0, 0), lambda: s.prefetch_set(0, [0]), s.ring_region,
                 lambda: s.metadata, lambda: s.warnings, lambda: s.prewarm_pause(True)):
        with pytest.raises(smoe.ClosedError):
            call()
    with pytest.raises(smoe.ClosedError):
        with s:
            pass
    assert "closed" in repr(s)


def test_with_closes(vault):
    with smoe.Streamer(vault, **QUIET) as s:
        pass
    assert s.closed


def test_synth_checks_its_arguments(tmp_path):
    with pytest.raises(smoe.ArgumentError, match="every layer is dense"):
        smoe.synth(tmp_path, layers=1, experts=2, blob_bytes=100, dense_layers=[0])


ERROR_CLASSES = [
    smoe.Error, smoe.ArgumentError, smoe.NotFound, smoe.IoError, smoe.FormatError, smoe.NoMemory,
    smoe.RingFull, smoe.Stale, smoe.Unsupported, smoe.InternalError, smoe.ClosedError,
]
FACTS = ("message", "path", "layer", "expert", "offset", "length", "os_error")


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda c: c.__name__)
def test_errors_survive_pickle(cls):
    """Issue 47, item 7: ``smoe.IoError`` lost ``errno`` and ``filename``
    through pickle (and so through multiprocessing). Every class keeps its
    message and facts, and an OSError's ``errno``, ``strerror`` and
    ``filename``."""
    import pickle

    error = cls("what went wrong", path="/a/b", layer=1, expert=2, offset=3, length=4, os_error=5)
    error.note = "an attribute of the caller's"
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is cls and str(back) == str(error) == "what went wrong"
    assert {f: getattr(back, f) for f in FACTS} == {f: getattr(error, f) for f in FACTS}
    assert back.note == error.note
    if isinstance(error, OSError):
        assert (back.errno, back.strerror, back.filename) == (error.errno, error.strerror, error.filename)
        assert (back.errno, back.filename) == (5, "/a/b")


def test_an_io_error_crosses_processes(vault):
    """The error a child process raised, as its parent gets it."""
    import concurrent.futures
    import multiprocessing

    missing = str(vault / "missing")
    spawn = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=spawn) as pool:
        with pytest.raises(smoe.IoError) as caught:
            pool.submit(smoe.Streamer, missing).result(timeout=120)
    assert isinstance(caught.value, OSError)
    assert (caught.value.errno, caught.value.filename, caught.value.path) == (2, missing, missing)
    assert caught.value.os_error == 2 and missing in str(caught.value)


def test_lease_numpy_without_numpy_says_what_to_install(monkeypatch):
    """Issue 47, item 8: without numpy, ``lease.numpy()`` was a bare
    ``ModuleNotFoundError``; it names the extra, as ``lease.torch()`` does."""
    import sys

    from conftest import MODELS

    with smoe.Streamer(MODELS / "mixtral-bf16", ring_slots=2, **QUIET) as s:
        with s.claim(0, 1, timeout=10) as lease:
            monkeypatch.setitem(sys.modules, "numpy", None)  # import numpy fails
            with pytest.raises(ImportError, match=r"pip install 'smoe\[numpy\]'") as caught:
                lease.numpy("gate")
            assert isinstance(caught.value.__cause__, ImportError)
        assert s.stats()["slots_held"] == 0


# smoe.synth in a child whose files may not grow past 64 MiB: a stand-in
# for a small disk, so that a synth that does not check the size first
# fails after 64 MiB instead of filling this machine's disk.
SYNTH_TOO_BIG = r"""
import resource, signal, sys, time
import smoe

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit: EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 20, 64 << 20))
start = time.monotonic()
try:
    smoe.synth(sys.argv[1], layers=1, experts=2, blob_bytes=2**62)
except smoe.IoError as e:
    print(f"{time.monotonic() - start:.3f}")
    print(e)
"""


def test_synth_refuses_a_vault_larger_than_the_disk(tmp_path):
    """Issue 47, item 5: ``blob_bytes=2**62`` wrote until the disk was
    full. A vault that cannot fit is refused before a byte is written, and
    nothing is left."""
    import subprocess
    import sys

    target = tmp_path / "new" / "vault"
    done = subprocess.run(
        [sys.executable, "-c", SYNTH_TOO_BIG, str(target)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    seconds, message = done.stdout.splitlines()
    print(f"refused in {seconds} s: {message}")
    assert "but its filesystem has" in message and "free" in message, message
    assert float(seconds) < 1.0, f"refused after {seconds} s"
    assert not (tmp_path / "new").exists(), "nothing is created"


def test_synth_stops_at_ctrl_c_and_leaves_nothing(tmp_path):
    """Issue 47, item 5: Ctrl-C did nothing until the whole vault was
    written, and left it. It stops within a second, as ``smoe.pack``
    does, removes the files and directories it made, and raises
    ``KeyboardInterrupt``; a directory that was there stays, with what it
    held."""
    import signal
    import threading
    import time

    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("the user's")
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        for target, made in ((tmp_path / "new" / "vault", tmp_path / "new"), (kept, None)):
            threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
            start = time.monotonic()
            with pytest.raises(KeyboardInterrupt):
                # 4 GiB: seconds of writing, even into the page cache.
                smoe.synth(target, layers=8, experts=16, blob_bytes=32 << 20)
            took = time.monotonic() - start
            print(f"{target}: stopped {took - 0.3:.3f} s after Ctrl-C")
            assert took < 1.5, f"stopped {took - 0.3:.2f} s after Ctrl-C"
            if made is not None:
                assert not made.exists(), "the directories it made are gone"
    finally:
        signal.signal(signal.SIGINT, previous)
    assert sorted(p.name for p in kept.iterdir()) == ["notes.txt"]
    assert (kept / "notes.txt").read_text() == "the user's"
