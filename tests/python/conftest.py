"""Shared by the Python tests: where the committed fixtures are, and small helpers.

The tests run against the installed package (tests/python/run.sh installs it with `pip install .`
into a pinned venv) and the real libraries it stands in for: safetensors, accelerate, diffusers,
transformers, torch."""
import json
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


def deliberate_refusal(path):
    """The error loadstone gives on purpose where the reference accepts a file (a tensor or
    metadata key given twice: the reference keeps the last), from the fixture's expectations."""
    expected = path.with_name(path.name.replace(".safetensors", ".expected.json"))
    if not expected.exists():
        return None
    doc = json.loads(expected.read_text())
    return doc.get("error") if doc.get("reference") == "accepts" else None


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
    a, b = dense_bytes(a), dense_bytes(b)
    return torch.equal(a, b)


def dense_bytes(t):
    """The bytes of `t` as a fresh uint8 vector: a view may keep any stride on a dimension of
    size 1, and torch copies no float4."""
    import torch

    t = t.detach().cpu()
    if t.element_size() == 1 and t.dtype != torch.uint8:
        t = t.view(torch.uint8)  # float8, float4 pairs, bool: byte for byte
    dense = torch.empty(t.shape, dtype=t.dtype).copy_(t).reshape(-1)
    return dense.view(torch.uint8)


os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
