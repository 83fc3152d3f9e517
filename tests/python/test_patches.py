"""loadstone.patch_diffusers() and loadstone.patch_transformers() against the libraries' own
from_pretrained: tiny UNet2DConditionModel, AutoencoderKL and LlamaForCausalLM (tied and untied)
saved with save_pretrained — one file, sharded, .bin, and diffusers' fp16 variant — load under
the patch to the state dict they load to without it (the same keys in the same order, dtypes and
bytes; ties kept), with and without a float16 dtype; with device_map="auto" and part of the
model offloaded to disk, to the same map and outputs. Spies show loadstone's readers doing the
reading inside the block and the library's own not, and after the block (or unpatch()) the
library's functions are the original objects again.
"""
import pytest
import safetensors.torch
import torch
import transformers.modeling_utils
from diffusers.models import model_loading_utils, modeling_utils

import loadstone
import loadstone._safe_open
import loadstone.torch
from conftest import same_tensor
from test_dispatch import TINY, forward, model

FORMATS = {
    "diffusers": ["safetensors", "sharded", "bin", "fp16-variant"],
    "transformers": ["safetensors", "sharded", "bin"],
}
CASES = [(name, fmt) for name in ("unet", "vae") for fmt in FORMATS["diffusers"]] + [
    (name, fmt) for name in ("llama-tied", "llama-untied") for fmt in FORMATS["transformers"]]
DTYPES = {"stored": None, "f16": torch.float16}


def save(name, fmt, folder):
    """TINY[name] saved in `fmt` into `folder`; returns from_pretrained's extra arguments."""
    tiny = TINY[name]
    if fmt == "fp16-variant":
        tiny.build().half().save_pretrained(folder, variant="fp16")
        return {"variant": "fp16"}
    m = model(name)
    if fmt == "sharded":
        size = sum(t.numel() * t.element_size() for t in m.state_dict().values())
        m.save_pretrained(folder, max_shard_size=f"{size // 3000}KB")
        assert len(list(folder.glob("*.safetensors"))) >= 3
    elif fmt == "bin" and tiny.is_transformers:  # transformers 5 saves safetensors only
        m.config.save_pretrained(folder)
        torch.save(m.state_dict(), folder / "pytorch_model.bin")
    else:
        m.save_pretrained(folder, safe_serialization=fmt == "safetensors")
    return {}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """saved(name, fmt): (folder, from_pretrained extras), saved once per module."""
    done = {}

    def get(name, fmt):
        if (name, fmt) not in done:
            folder = tmp_path_factory.mktemp(f"{name}-{fmt}")
            done[name, fmt] = folder, save(name, fmt, folder)
        return done[name, fmt]

    return get


class Spy:
    """Wraps a callable and counts the calls."""

    def __init__(self, wrapped):
        self.wrapped, self.calls = wrapped, []

    def __call__(self, *args, **kwargs):
        self.calls.append(args[0] if args else kwargs)
        return self.wrapped(*args, **kwargs)


@pytest.fixture
def readers(monkeypatch):
    """Spies on loadstone's readers (load_file, safe_open) and on the libraries' own (diffusers'
    safetensors.torch.load_file and torch.load, transformers' safe_open), installed before the
    patch so that the patch wraps the library's spy as its original."""
    spies = {
        "loadstone.load_file": (loadstone.torch, "load_file"),
        "loadstone.safe_open": (loadstone._safe_open, "safe_open"),
        "safetensors.load_file": (safetensors.torch, "load_file"),
        "torch.load": (torch, "load"),
        "transformers.safe_open": (transformers.modeling_utils, "safe_open"),
    }
    for key, (owner, attr) in spies.items():
        spies[key] = Spy(getattr(owner, attr))
        monkeypatch.setattr(owner, attr, spies[key])
    return spies


def loaded(cls, folder, dtype, extra):
    kwargs = dict(extra)
    if dtype is not None:
        kwargs["dtype" if issubclass(cls, transformers.PreTrainedModel) else "torch_dtype"] = dtype
    return cls.from_pretrained(folder, **kwargs)


def assert_same_model(got, expected):
    got_state, expected_state = got.state_dict(), expected.state_dict()
    assert list(got_state) == list(expected_state)
    for name, tensor in expected_state.items():
        assert same_tensor(got_state[name], tensor), name
    assert tie_groups(got) == tie_groups(expected)


def tie_groups(m):
    """The names of each parameter, grouped: a tied one's are one group."""
    groups = {}
    for name, param in m.named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), []).append(name)
    return sorted(groups.values())


PATCHED = {  # what the patches replace: name -> (owner, attribute)
    "diffusers.model_loading_utils.load_state_dict": (model_loading_utils, "load_state_dict"),
    "diffusers.modeling_utils.load_state_dict": (modeling_utils, "load_state_dict"),
    "transformers.modeling_utils.safe_open": (transformers.modeling_utils, "safe_open"),
    "transformers.modeling_utils.load_state_dict": (transformers.modeling_utils,
                                                    "load_state_dict"),
}


def originals():
    return {key: getattr(owner, attr) for key, (owner, attr) in PATCHED.items()}


def same_objects(a, b):
    return all(a[k] is b[k] for k in a)


def patch_for(name):
    return loadstone.patch_transformers if TINY[name].is_transformers else loadstone.patch_diffusers


@pytest.fixture(params=["cached", "cold"])
def residency(request, monkeypatch):
    """Both of the patches' routes: a file in the page cache is mapped, a cold one read (the
    share of cached pages is what the rule asks; here it is told)."""
    share = 1.0 if request.param == "cached" else 0.0
    monkeypatch.setattr(loadstone._core, "cached_fraction", lambda path: share)
    return request.param


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("name,fmt", CASES)
def test_from_pretrained_under_the_patch_loads_the_same_model(name, fmt, dtype, saved, readers,
                                                              residency):
    folder, extra = saved(name, fmt)
    cls = TINY[name].cls
    expected = loaded(cls, folder, dtype, extra)
    library_reads = {k: len(s.calls) for k, s in readers.items() if not k.startswith("loadstone")}
    assert any(library_reads.values())  # without the patch the library reads
    before = originals()
    for spy in readers.values():
        spy.calls.clear()

    with patch_for(name)():
        assert not same_objects(originals(), before)
        got = loaded(cls, folder, dtype, extra)

    assert same_objects(originals(), before)
    assert_same_model(got, expected)
    files = len(list(folder.glob("*.safetensors")) or list(folder.glob("*.bin")))
    ours = len(readers["loadstone.load_file"].calls) + len(readers["loadstone.safe_open"].calls)
    assert ours == files  # every file read through loadstone, once
    assert all(not s.calls for k, s in readers.items() if not k.startswith("loadstone")), \
        {k: s.calls for k, s in readers.items()}


@pytest.mark.parametrize("name", ["vae", "llama-untied"])
def test_from_pretrained_with_disk_offload_under_the_patch(name, saved, tmp_path):
    """device_map="auto" with a cpu budget smaller than the model: the library offloads part of
    it to disk itself; under the patch the same map, the same outputs."""
    tiny = TINY[name]
    folder, extra = saved(name, "sharded")
    size = sum(t.numel() * t.element_size() for t in model(name).state_dict().values())
    options = dict(extra, device_map="auto", max_memory={"cpu": size // 2})
    inputs = tiny.inputs()
    expected = tiny.cls.from_pretrained(folder, offload_folder=tmp_path / "a", **options)
    with patch_for(name)():
        got = tiny.cls.from_pretrained(folder, offload_folder=tmp_path / "l", **options)
    assert {"cpu", "disk"} <= set(expected.hf_device_map.values())
    assert got.hf_device_map == expected.hf_device_map
    assert same_tensor(forward(got, inputs), forward(expected, inputs))


@pytest.mark.parametrize("patch", [loadstone.patch_diffusers, loadstone.patch_transformers])
def test_a_plain_call_patches_until_unpatch(patch):
    before = originals()
    patched = patch()
    try:
        assert not same_objects(originals(), before)
    finally:
        patched.unpatch()
    assert same_objects(originals(), before)
    patched.unpatch()  # a second unpatch changes nothing
    assert same_objects(originals(), before)


@pytest.mark.parametrize("patch", [loadstone.patch_diffusers, loadstone.patch_transformers])
def test_nested_blocks_and_an_error_inside_restore_the_originals(patch, tmp_path):
    name = "vae" if patch is loadstone.patch_diffusers else "llama-tied"
    if TINY[name].is_transformers:
        model(name).config.save_pretrained(tmp_path)
    else:
        model(name).save_config(tmp_path)
    before = originals()
    with pytest.raises(OSError):  # a config and no weights
        with patch():
            with patch():
                pass
            assert not same_objects(originals(), before)
            TINY[name].cls.from_pretrained(tmp_path)
    assert same_objects(originals(), before)


@pytest.mark.parametrize("patch", [loadstone.patch_diffusers, loadstone.patch_transformers])
def test_patches_undone_in_the_order_they_were_made(patch):
    before = originals()
    first, second = patch(), patch()
    first.unpatch()
    second.unpatch()
    restored = same_objects(originals(), before)
    for key, (owner, attr) in PATCHED.items():  # leave the process as the test found it
        setattr(owner, attr, before[key])
    assert restored


def test_the_route_follows_the_page_cache(tmp_path):
    """A file read just now is mapped; one whose pages were dropped is read."""
    import os

    from loadstone._patches import backend_for

    path = tmp_path / "m.safetensors"
    safetensors.torch.save_file({"w": torch.randn(512, 512)}, path)
    path.read_bytes()
    assert backend_for(path, "cpu") == "mmap"
    assert backend_for(path, "cuda:0") is None  # a device load is always read
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    if loadstone.cached_fraction(path) >= loadstone.MOSTLY_CACHED:
        pytest.skip("the kernel kept the file's pages (posix_fadvise is advice)")
    assert backend_for(path, "cpu") is None
