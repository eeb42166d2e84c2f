"""Shared fixtures: a synthetic vault, the repository's model fixtures."""

from __future__ import annotations

import importlib
import json
import os
import pathlib
import types

import pytest

import smoe

REPO = pathlib.Path(__file__).resolve().parents[2]
MODELS = REPO / "tests" / "fixtures" / "models"

# Settings every test streamer shares: few threads (the CI machine has 2
# cores), no pre-warm reads behind a test's back, no histogram file written
# beside a fixture or in the user's cache.
QUIET = {"workers": 2, "prewarm": False, "freq_path": ""}

# No Hugging Face hub, ever: every transformers model is built by the tests.
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def need(module: str) -> types.ModuleType:
    """Imports ``module`` (torch, transformers, safetensors) for a test
    module, or skips the module saying why: tests/library/python.rs sets
    ``SMOE_TEST_TORCH_MISSING`` when it could not install them. Under
    ``CI=true`` a missing module fails instead."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        why = os.environ.get("SMOE_TEST_TORCH_MISSING") or f"{e}"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI is set, so this fails rather than skips: no {module} ({why})", pytrace=False)
        pytest.skip(f"no {module} ({why})", allow_module_level=True)


# The synthetic vault's shape.
LAYERS = 2
EXPERTS = 4


@pytest.fixture(scope="session")
def vault(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A synthetic vault: 2 layers × 4 experts of about 20 kB."""
    directory = tmp_path_factory.mktemp("vault")
    return smoe.synth(directory, layers=LAYERS, experts=EXPERTS, blob_bytes=20_000, seed=7)


@pytest.fixture
def streamer(vault: pathlib.Path):
    """A streamer of the synthetic vault with a ring of 4 slots."""
    with smoe.Streamer(vault, ring_slots=4, **QUIET) as s:
        yield s


def vault_bytes(vault: pathlib.Path, s: smoe.Streamer, layer: int, expert: int) -> bytes:
    """The bytes of (layer, expert) read from the vault file itself."""
    info = s.expert_info(layer, expert)
    with open(vault / "experts.smoe", "rb") as f:
        f.seek(info["offset"])
        return f.read(info["size"])


@pytest.fixture(scope="session")
def expected() -> dict:
    """tests/fixtures/models/EXPECTED.json: what the formats' own readers saw."""
    with open(MODELS / "EXPECTED.json") as f:
        return json.load(f)


@pytest.fixture(scope="session")
def testing():
    """smoe._native._testing (a build with the test-hooks feature), or a
    skip; under ``CI=true`` (where tests/library/python.rs builds with the
    hooks) a failure, so the waiting tests cannot vanish unseen."""
    hooks = getattr(smoe._native, "_testing", None)
    if hooks is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI is set, so this fails rather than skips: this build has no test hooks", pytrace=False)
        pytest.skip(
            "this build has no test hooks: build with "
            'MATURIN_PEP517_ARGS="--features test-hooks" pip install ./python'
        )
    return hooks
