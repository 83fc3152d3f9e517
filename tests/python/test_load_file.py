"""loadstone.torch.load_file against safetensors.torch.load_file, on every committed .safetensors
fixture: the same keys in the same order, dtypes, shapes and bytes where the reference loads a
file, and an error (never a crash) where it refuses one."""
import pytest
import safetensors
import safetensors.torch
import torch

import loadstone
import loadstone.torch as lt
from conftest import deliberate_refusal, rel, safetensors_files, same_tensor


@pytest.mark.parametrize("path", safetensors_files(), ids=rel)
def test_load_file_matches_safetensors(path):
    refusal = deliberate_refusal(path)
    if refusal:
        with pytest.raises(loadstone.CorruptionError, match=refusal):
            lt.load_file(path)
        return
    try:
        expected = safetensors.torch.load_file(path)
    except Exception:  # the reference refuses it: so must loadstone
        with pytest.raises(loadstone.Error):
            lt.load_file(path)
        return
    got = lt.load_file(path)
    assert in_offset_order(path, list(got)) == in_offset_order(path, list(expected))
    for name, tensor in expected.items():
        assert same_tensor(got[name], tensor), name


def in_offset_order(path, names):
    """`names` grouped by data offset, in order: the reference orders tensors by offset and
    leaves tensors that share one (zero-sized ones) in its hash map's order, which changes from
    one process to the next."""
    ckpt = loadstone.Checkpoint.open(path, as_stored=True)
    offsets = [ckpt.info(n)["offset"] for n in names]
    assert offsets == sorted(offsets)
    groups = {}
    for n, off in zip(names, offsets):
        groups.setdefault(off, set()).add(n)
    return list(groups.items())


@pytest.mark.parametrize("backend", [None, "pread", "uring", "mmap"])
def test_backends_give_the_same_tensors(backend):
    path = loadstone_fixture("safetensors/dtypes.safetensors")
    expected = safetensors.torch.load_file(path)
    got = lt.load_file(path, backend=backend)
    assert list(got) == list(expected)
    assert all(same_tensor(got[n], t) for n, t in expected.items())


def test_dtype_casts_floating_tensors_only(tmp_path):
    path = tmp_path / "m.safetensors"
    tensors = {"w": torch.randn(64, 33), "h": torch.randn(7).half(), "i": torch.arange(5)}
    safetensors.torch.save_file(tensors, path)
    got = lt.load_file(path, dtype=torch.bfloat16)
    assert got["w"].dtype == torch.bfloat16 and torch.equal(got["w"], tensors["w"].bfloat16())
    assert got["h"].dtype == torch.bfloat16 and torch.equal(got["h"], tensors["h"].bfloat16())
    assert got["i"].dtype == torch.int64 and torch.equal(got["i"], tensors["i"])


def test_bfloat16_and_float8_arrive_as_their_torch_dtypes(tmp_path):
    path = tmp_path / "m.safetensors"
    tensors = {
        "bf16": torch.randn(4, 8).bfloat16(),
        "e4m3": torch.randn(4, 8).to(torch.float8_e4m3fn),
        "e5m2": torch.randn(4, 8).to(torch.float8_e5m2),
    }
    safetensors.torch.save_file(tensors, path)
    got = lt.load_file(path)
    for name, tensor in tensors.items():
        assert same_tensor(got[name], tensor), name


def test_missing_file_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError) as caught:
        lt.load_file(tmp_path / "nope.safetensors")
    assert isinstance(caught.value, loadstone.NotFoundError)
    assert "nope.safetensors" in str(caught.value)


def test_truncated_file_names_file_and_tensor(tmp_path):
    path = tmp_path / "t.safetensors"
    safetensors.torch.save_file({"weight": torch.randn(256, 256)}, path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 1000])
    with pytest.raises(loadstone.CorruptionError) as caught:
        lt.load_file(path)
    assert "t.safetensors" in str(caught.value)
    assert isinstance(caught.value, ValueError)


def test_a_folder_and_an_index_load_like_their_shards():
    folder = loadstone_fixture("safetensors/sharded")
    expected = {}
    for shard in sorted(folder.glob("*.safetensors")):
        expected.update(safetensors.torch.load_file(shard))
    for path in (folder, folder / "model.safetensors.index.json"):
        got = lt.load_file(path)
        assert sorted(got) == sorted(expected)
        assert all(same_tensor(got[n], t) for n, t in expected.items())


def loadstone_fixture(name):
    from conftest import FIXTURES

    return FIXTURES / name


def test_the_reference_version():
    assert safetensors.__version__ == "0.8.0"


def test_the_plan_says_where_each_conversion_runs_and_what_memory_each_tensor_gets(tmp_path):
    path = tmp_path / "m.safetensors"
    safetensors.torch.save_file({"half": torch.ones(4, dtype=torch.float16),
                                 "full": torch.zeros(4, dtype=torch.float32)}, str(path))
    ckpt = loadstone._core.Checkpoint.open(str(path))
    cpu = {t["name"]: t for t in loadstone._core.plan(ckpt, dtype="f32").tensors}
    assert (cpu["half"]["conversion"], cpu["half"]["conversion_site"]) == ("cast", "cpu")
    assert (cpu["full"]["conversion"], cpu["full"]["conversion_site"]) == ("none", "none")
    # Small tensors: the cast one staged into the arena, the other in its read's shared buffer.
    assert (cpu["half"]["memory"], cpu["full"]["memory"]) == ("arena", "shared")
    on_gpu = loadstone._core.plan(ckpt, dtype="f32", device_map="cuda:0")
    gpu = {t["name"]: t for t in on_gpu.tensors}
    assert gpu["half"]["conversion_site"] == "device" and gpu["half"]["memory"] == "device"
    assert gpu["full"]["conversion_site"] == "none"
