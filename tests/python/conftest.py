"""Shared by the Python tests: where the committed fixtures are, and small helpers.

The tests run against the installed package (tests/python/run.sh installs it with `pip install .`
into a pinned venv) and the real libraries it stands in for: safetensors, accelerate, diffusers,
transformers, torch."""
import os
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"


def safetensors_files():
    return sorted(FIXTURES.rglob("*.safetensors"))


def rel(path):
    return str(pathlib.Path(path).relative_to(FIXTURES))


@pytest.fixture(autouse=True)
def _no_bars(monkeypatch):
    monkeypatch.setenv("LOADSTONE_NO_PROGRESS", "1")


@pytest.fixture
def python():
    return sys.executable


def same_tensor(a, b):
    """Same dtype, shape and bytes (NaNs and signed zeros included)."""
    import torch

    if a.dtype != b.dtype or tuple(a.shape) != tuple(b.shape):
        return False
    if a.numel() == 0:
        return True
    a = a.detach().cpu().contiguous().reshape(-1)
    b = b.detach().cpu().contiguous().reshape(-1)
    if a.dtype == torch.bool:
        return torch.equal(a, b)
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))


os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
