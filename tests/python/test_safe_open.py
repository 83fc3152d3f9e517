"""loadstone.safe_open against safetensors.safe_open: keys, metadata, tensors and slices give what
the reference gives; a slice reads only the bytes it selects; a closed file and a missing tensor
are errors."""
import random

import numpy as np
import pytest
import safetensors
import safetensors.numpy
import safetensors.torch
import torch

import loadstone
from conftest import FIXTURES, deliberate_refusal, rel, safetensors_files, same_tensor


def readable(path):
    if deliberate_refusal(path):
        return False
    try:
        safetensors.torch.load_file(path)
        return True
    except Exception:
        return False


READABLE = [p for p in safetensors_files() if readable(p)]


@pytest.mark.parametrize("path", READABLE, ids=rel)
def test_keys_metadata_and_tensors_match(path):
    with safetensors.safe_open(path, framework="pt") as ref, \
            loadstone.safe_open(path, framework="pt") as got:
        assert got.keys() == ref.keys()
        assert set(got.offset_keys()) == set(ref.offset_keys())
        assert got.metadata() == (ref.metadata() or None)
        for name in ref.keys():
            assert same_tensor(got.get_tensor(name), ref.get_tensor(name)), name
            ref_slice, got_slice = ref.get_slice(name), got.get_slice(name)
            assert got_slice.get_shape() == ref_slice.get_shape()
            assert got_slice.get_dtype() == ref_slice.get_dtype()
        assert list(got.get_tensors()) == got.offset_keys()


def random_key(shape, rng):
    """A basic index for `shape`: ints (negative too), slices with steps, an Ellipsis, None."""
    key = []
    for size in shape:
        kind = rng.choice(["int", "slice", "full", "step"]) if size else "full"
        if kind == "int":
            key.append(rng.randrange(-size, size))
        elif kind == "slice":
            a, b = sorted(rng.randrange(-size - 2, size + 3) for _ in range(2))
            key.append(slice(a, b))
        elif kind == "step":
            key.append(slice(rng.randrange(0, size), None, rng.randrange(1, 4)))
        else:
            key.append(slice(None))
    if key and rng.random() < 0.3:
        cut = rng.randrange(len(key))
        key = key[:cut] + [Ellipsis]
    if rng.random() < 0.2:
        key.insert(rng.randrange(len(key) + 1), None)
    return tuple(key) if len(key) != 1 or rng.random() < 0.5 else key[0]


def test_slices_equal_the_reference(tmp_path):
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    tensors = {
        "m": torch.randn(37, 53),
        "c": torch.randn(5, 6, 7, 3).bfloat16(),
        "v": torch.arange(100, dtype=torch.int32),
        "b": torch.rand(9, 4) > 0.5,
        "s": torch.tensor(1.5),
        "e": torch.zeros(0, 4),
    }
    path = tmp_path / "s.safetensors"
    safetensors.torch.save_file(tensors, path)
    with safetensors.safe_open(path, "pt") as ref, loadstone.safe_open(path, "pt") as got:
        for trial in range(300):
            name = rng.choice(list(tensors))
            key = random_key(tensors[name].shape, rng)
            try:
                expected = ref.get_slice(name)[key]
            except Exception as e:  # the reference refuses it: so does loadstone, same type
                with pytest.raises(type(e)):
                    got.get_slice(name)[key]
                continue
            result = got.get_slice(name)[key]
            assert same_tensor(result, expected), f"seed {seed} trial {trial}: {name}[{key!r}]"


def test_a_slice_reads_only_its_bytes(tmp_path):
    """Only the selected bytes are read, and gaps of at most 4 KiB between them (one request
    costs more than a page)."""
    weight = torch.randn(512, 4096)  # 8 MiB, rows of 16 KiB
    path = tmp_path / "w.safetensors"
    safetensors.torch.save_file({"w": weight}, path)
    row = 4096 * 4
    with loadstone.safe_open(path, "pt") as f:
        assert torch.equal(f.get_slice("w")[100:110], weight[100:110])
        assert f.bytes_read == 10 * row
        before = f.bytes_read
        # A tensor-parallel column band: a run of 4 KiB per row, 12 KiB apart.
        assert torch.equal(f.get_slice("w")[:, 1024:2048], weight[:, 1024:2048])
        assert f.bytes_read - before == 512 * 1024 * 4
        before = f.bytes_read
        # Narrower bands than the gap read through it: never more than the rows they span.
        assert torch.equal(f.get_slice("w")[:, 100:101], weight[:, 100:101])
        assert f.bytes_read - before <= 512 * row
        before = f.bytes_read
        assert torch.equal(f.get_slice("w")[7, 3], weight[7, 3])
        assert f.bytes_read - before == 4
        before = f.bytes_read
        f.get_tensor("w")
        assert f.bytes_read - before == 512 * row


def test_numpy_framework(tmp_path):
    array = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    path = tmp_path / "n.safetensors"
    safetensors.numpy.save_file({"a": array}, path)
    with loadstone.safe_open(path, framework="np") as f:
        got = f.get_tensor("a")
        assert isinstance(got, np.ndarray)
        np.testing.assert_array_equal(got, array)
        np.testing.assert_array_equal(f.get_slice("a")[1:, ::2, -1], array[1:, ::2, -1])


def test_errors(tmp_path):
    path = FIXTURES / "safetensors" / "dtypes.safetensors"
    f = loadstone.safe_open(path, "pt")
    with pytest.raises(loadstone.NotFoundError, match="does not contain tensor nope"):
        f.get_tensor("nope")
    with f:
        pass
    with pytest.raises(loadstone.Error, match="closed"):
        f.keys()
    with pytest.raises(loadstone.UnsupportedError):
        loadstone.safe_open(path, "tf")
    with pytest.raises(FileNotFoundError):
        loadstone.safe_open(tmp_path / "missing.safetensors", "pt")
    with pytest.raises(loadstone.InvalidArgumentError, match="backend"):
        loadstone.safe_open(path, "pt", backend="carrier-pigeon")


def test_prefetch_reads_the_file_once(tmp_path):
    tensors = {f"t{i}": torch.randn(64, 64) for i in range(20)}
    path = tmp_path / "p.safetensors"
    safetensors.torch.save_file(tensors, path)
    with loadstone.safe_open(path, "pt", prefetch=True) as f:
        for name in f.keys():
            assert torch.equal(f.get_tensor(name), tensors[name])
            assert torch.equal(f.get_slice(name)[3:9, ::2], tensors[name][3:9, ::2])
        assert f.bytes_read == sum(t.numel() * 4 for t in tensors.values())
