"""State dicts, weight swaps and weight iterators: every checkpoint kind through the same calls,
checked against its producer (torch.load for .bin, the producers' own dequantization for GGUF,
bitsandbytes, compressed-tensors, GPTQ and AWQ, committed with the fixtures); load_into against
torch's Module.load_state_dict; weights_iterator's tensors each owning their memory."""
import gc
import json
import zlib

import pytest
import safetensors.torch
import torch

import loadstone
import loadstone.torch as lt
from conftest import FIXTURES, same_tensor
from test_lifetime import run_child

SUFFIXES = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}

QUANTIZED = [("bnb/bnb4.safetensors", "bnb/expected.safetensors", None),
             ("bnb/bnb8.safetensors", "bnb/expected8.safetensors", None),
             ("ct/pack.safetensors", "ct/expected.safetensors", None),
             ("ct/float.safetensors", "ct/float_expected.safetensors", None),
             ("gguf/dequant/blocks.gguf", "gguf/dequant/expected.safetensors", None)] + [
    (f"gptq/{case}", "gptq/expected.safetensors", case)
    for case in ("gptq4_g32", "gptq2_g32", "gptq3_g32", "gptq8_g64", "gptq4_desc_act",
                 "gptq4_v2", "gptq4_sym", "gptq4_one_group", "gptq4_no_gidx", "awq4_g32")]


@pytest.mark.parametrize("source,expected,case", QUANTIZED, ids=lambda v: str(v))
@pytest.mark.parametrize("dtype", list(SUFFIXES), ids=str)
def test_quantized_weights_decode_as_their_producers_do(source, expected, case, dtype):
    got = lt.load_state_dict(FIXTURES / source, dtype=dtype)
    suffix = "." + SUFFIXES[dtype]
    want = {k[: -len(suffix)]: v for k, v in safetensors.torch.load_file(FIXTURES / expected).items()
            if k.endswith(suffix)}
    if case is not None:  # one GPTQ/AWQ case per folder: its layer.weight is <case>.weight
        want = {"layer.weight": want[f"{case}.weight"]}
    assert want
    for name, tensor in want.items():
        assert same_tensor(got[name], tensor), name


def torch_bin_cases():
    manifest = json.loads((FIXTURES / "torch" / "manifest.json").read_text())
    return [entry for entry in manifest["valid"] if entry["path"].endswith(".bin")]


@pytest.mark.parametrize("entry", torch_bin_cases(), ids=lambda e: e["path"])
def test_torch_save_archives_load_as_torch_load_does(entry):
    got = lt.load_state_dict(FIXTURES / "torch" / entry["path"])
    assert sorted(got) == sorted(t["name"] for t in entry["tensors"])
    for t in entry["tensors"]:
        tensor = got[t["name"]]
        assert list(tensor.shape) == t["shape"], t["name"]
        data = tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        assert zlib.crc32(data) == t["crc32"], t["name"]


def test_a_sharded_diffusers_folder_with_subfolder_and_variant():
    folder = FIXTURES / "safetensors" / "diffusers"
    for subfolder, variant in (("unet", None), ("vae", "fp16"), ("text_encoder", None)):
        got = lt.load_state_dict(folder, subfolder=subfolder, variant=variant)
        files = sorted((folder / subfolder).glob(
            f"*.{variant}.safetensors" if variant else "*[!6].safetensors"))
        want = {}
        for f in files:
            want.update(safetensors.torch.load_file(f))
        assert sorted(got) == sorted(want), subfolder
        assert all(same_tensor(got[n], t) for n, t in want.items())


class Small(torch.nn.Module):
    def __init__(self, dtype=torch.float32):
        super().__init__()
        self.a = torch.nn.Linear(64, 32, dtype=dtype)
        self.b = torch.nn.Linear(32, 8, dtype=dtype)
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))
        self.register_buffer("scratch", torch.zeros(4), persistent=False)


def test_load_into_swaps_weights_in_place(tmp_path, monkeypatch):
    torch.manual_seed(1)
    source = Small()
    source.steps.fill_(7)
    path = tmp_path / "w.safetensors"
    safetensors.torch.save_file(source.state_dict(), path)
    target = Small()
    pointers = {n: t.data_ptr() for n, t in target.state_dict().items()}
    copied = []  # tensors loaded elsewhere and copied in: none, each is read into its parameter
    monkeypatch.setattr(lt, "_put", lambda model, key, *rest: copied.append(key))
    result = lt.load_into(target, path)
    assert copied == []
    assert result.missing_keys == [] and result.unexpected_keys == []
    for name, tensor in source.state_dict().items():
        assert same_tensor(target.state_dict()[name], tensor), name
        assert target.state_dict()[name].data_ptr() == pointers[name], name  # same memory


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_load_into_casts_as_copy_does(tmp_path, dtype):
    torch.manual_seed(2)
    source = Small()
    path = tmp_path / "w.safetensors"
    safetensors.torch.save_file(source.state_dict(), path)
    ours, theirs = Small(dtype), Small(dtype)
    lt.load_into(ours, path)
    theirs.load_state_dict(source.state_dict())
    for name, tensor in theirs.state_dict().items():
        assert same_tensor(ours.state_dict()[name], tensor), name


def test_missing_and_unexpected_keys_as_torch_reports_them(tmp_path):
    source = Small().state_dict()
    del source["b.bias"]
    source["extra.weight"] = torch.ones(3)
    path = tmp_path / "w.safetensors"
    safetensors.torch.save_file(source, path)
    ours, theirs = Small(), Small()
    want = theirs.load_state_dict(source, strict=False)
    got = lt.load_into(ours, path, strict=False)
    assert got.missing_keys == want.missing_keys
    assert got.unexpected_keys == want.unexpected_keys
    with pytest.raises(RuntimeError) as ref:
        Small().load_state_dict(source)
    with pytest.raises(RuntimeError) as caught:
        lt.load_into(Small(), path)
    assert str(caught.value) == str(ref.value)
    wrong = {k: v for k, v in Small().state_dict().items()}
    wrong["a.weight"] = torch.zeros(5, 5)
    safetensors.torch.save_file(wrong, path)
    with pytest.raises(RuntimeError) as ref:
        Small().load_state_dict(wrong)
    with pytest.raises(RuntimeError) as caught:
        lt.load_into(Small(), path)
    assert str(caught.value) == str(ref.value)


def test_load_into_a_model_on_the_meta_device_with_assign(tmp_path):
    source = Small()
    path = tmp_path / "w.safetensors"
    safetensors.torch.save_file(source.state_dict(), path)
    with torch.device("meta"):
        model = Small()
    model.scratch = torch.zeros(4)
    lt.load_into(model, path, assign=True)
    for name, tensor in source.state_dict().items():
        assert same_tensor(model.state_dict()[name], tensor), name
    assert isinstance(model.a.weight, torch.nn.Parameter) and model.a.weight.requires_grad


def test_weights_iterator_tensors_own_their_memory(tmp_path):
    torch.manual_seed(3)
    files = []
    want = {}
    for shard in range(2):
        tensors = {f"s{shard}.t{i}": torch.randn(256, 256) for i in range(40)}
        path = tmp_path / f"model-{shard}.safetensors"
        safetensors.torch.save_file(tensors, path)
        files.append(path)
        want.update(tensors)
    got = list(lt.weights_iterator(files, batch_bytes=1 << 20))  # many batches, all kept
    gc.collect()
    assert sorted(name for name, _ in got) == sorted(want)
    for name, tensor in got:
        assert same_tensor(tensor, want[name]), name
    first = next(iter(lt.weights_iterator(files, dtype=torch.bfloat16)))
    assert first[1].dtype == torch.bfloat16


def test_weights_iterator_peak_memory_is_batches_not_the_model(tmp_path):
    path = tmp_path / "m.safetensors"
    safetensors.torch.save_file({f"t{i}": torch.randn(1024, 1024) for i in range(64)}, path)
    got = run_child("""
        import json, sys
        import loadstone.torch as lt
        def status(key):
            with open("/proc/self/status") as f:
                return next(int(l.split()[1]) * 1024 for l in f if l.startswith(key))
        for _ in lt.weights_iterator(sys.argv[1], batch_bytes=16 << 20):
            break
        open("/proc/self/clear_refs", "w").write("5")
        base = status("VmRSS")
        n = 0
        for name, tensor in lt.weights_iterator(sys.argv[1], batch_bytes=16 << 20):
            n += tensor.numel()
            del tensor
        print(json.dumps({"peak": status("VmHWM") - base, "n": n}))
    """, path)
    assert got["n"] == 64 << 20
    assert got["peak"] < 64 << 20, got  # the model is 256 MiB; two 16 MiB batches in flight


def test_load_state_dict_with_a_device_map_offloads_to_disk(tmp_path):
    tensors = {f"layers.{i}.weight": torch.randn(64, 64) for i in range(4)}
    path = tmp_path / "model.safetensors"
    safetensors.torch.save_file(tensors, path)
    folder = tmp_path / "offload"
    got = lt.load_state_dict(path, device_map={"layers.0": "cpu", "layers.1": "cpu",
                                               "layers.2": "disk", "layers.3": "disk"},
                             offload_folder=folder)
    assert sorted(got) == ["layers.0.weight", "layers.1.weight"]
    index = json.loads((folder / "index.json").read_text())
    assert sorted(index) == ["layers.2.weight", "layers.3.weight"]
    from accelerate.utils import OffloadedWeightsLoader

    weights = OffloadedWeightsLoader(save_folder=str(folder))
    for name in index:
        assert same_tensor(weights[name], tensors[name]), name
    _ = loadstone
