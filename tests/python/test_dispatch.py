"""loadstone.torch.infer_auto_device_map and load_checkpoint_and_dispatch against accelerate's, on
real modules built from tiny configs with random weights: a transformers LlamaForCausalLM (tied
and untied embeddings) and diffusers' UNet2DConditionModel, AutoencoderKL, SD3Transformer2DModel
and FluxTransformer2DModel.

- Maps: the same keys, in the same order, with the same devices as accelerate's, for GPU budgets
  (this machine has no GPU; accelerate warns and plans for them all the same), GPU + cpu + disk
  and cpu + disk budgets, the model's own no-split classes and none, with and without a float16
  target, accelerate's options (offload_buffers, fallback_allocation, clean_result,
  special_dtypes); and the string modes as accelerate.load_checkpoint_and_dispatch plans them
  (get_balanced_memory, then infer_auto_device_map).
- End to end on this CPU machine: a safetensors save, a .bin and a sharded save, loaded by both
  into a model built under init_empty_weights with a cpu budget smaller than the model (the rest
  goes to disk): the same hf_device_map, the same parameter dtypes and devices, the same forward
  output (and the original model's, without a dtype), and an offload folder that accelerate's
  OffloadedWeightsLoader reads back equal to the checkpoint.
- Errors: accelerate's ValueErrors, with accelerate's messages.

accelerate's clean_device_map visits sibling prefixes in set order, so where it merges two groups
under one parent its key order depends on PYTHONHASHSEED. The reference maps here are accelerate's
with that set iterating in insertion order, the order loadstone documents (docs/device-map.md,
"Where accelerate itself is not deterministic").

test_describe.py and test_patches.py build their models from TINY, here.
"""
import contextlib
import dataclasses
import functools
import gc
import json
import os
import pathlib
import shutil
import tempfile
import warnings
from typing import Callable

import accelerate
import accelerate.utils.modeling as accelerate_modeling
import diffusers
import pytest
import safetensors.torch
import torch
import transformers
from accelerate.utils import OffloadedWeightsLoader, compute_module_sizes, get_balanced_memory

import loadstone.torch as lt
from conftest import same_tensor
from loadstone import _dispatch

pytestmark = [
    # loadstone warns about a no-split class that matches no module (AutoencoderKL declares
    # BasicTransformerBlock, which it does not use); accelerate keeps quiet.
    pytest.mark.filterwarnings("ignore:no-split entry:UserWarning"),
    pytest.mark.filterwarnings("ignore:Based on the current allocation process:UserWarning"),
    # loadstone names the buffers accelerate's map leaves uncovered (SD3's pos_embed.pos_embed)
    pytest.mark.filterwarnings("ignore:.* covered by no key of the device map:UserWarning"),
]


@pytest.fixture(autouse=True, scope="module")
def _quick():
    """One torch thread: this machine's 2 cores are shared, and torch's pool spinning against
    another process makes a tiny UNet's forward pass take seconds instead of milliseconds. And
    the objects alive now frozen out of the garbage collector's way: accelerate collects after
    every shard it loads, a second each with torch, diffusers and transformers imported."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()
    torch.set_num_threads(threads)


@pytest.fixture
def scratch(tmp_path):
    """Where the offload folders go: in memory where /dev/shm is (accelerate syncs every tensor
    it offloads to the disk, seconds per load here), else tmp_path."""
    shm = pathlib.Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield tmp_path
        return
    folder = pathlib.Path(tempfile.mkdtemp(prefix="loadstone-test-", dir=shm))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# --- the tiny models ----------------------------------------------------------------------------

def _activations(dtype, generator, **shapes):
    return {k: torch.randn(*s, generator=generator).to(dtype or torch.float32)
            for k, s in shapes.items()}


def _llama_inputs(dtype, g):
    return {"input_ids": torch.randint(0, 256, (2, 7), generator=g)}


def _unet_inputs(dtype, g):
    return {**_activations(dtype, g, sample=(2, 4, 8, 8), encoder_hidden_states=(2, 5, 16)),
            "timestep": torch.tensor([3, 500]), "return_dict": False}


def _vae_inputs(dtype, g):
    return {**_activations(dtype, g, sample=(2, 3, 16, 16)), "sample_posterior": False,
            "return_dict": False}


def _sd3_inputs(dtype, g):
    return {**_activations(dtype, g, hidden_states=(2, 4, 16, 16),
                           encoder_hidden_states=(2, 5, 16), pooled_projections=(2, 16)),
            "timestep": torch.tensor([3, 500]), "return_dict": False}


def _flux_inputs(dtype, g):
    return {**_activations(dtype, g, hidden_states=(2, 16, 8), encoder_hidden_states=(2, 5, 16),
                           pooled_projections=(2, 16)),
            "timestep": torch.tensor([0.25, 0.75]).to(dtype or torch.float32),
            "img_ids": torch.stack(torch.meshgrid(torch.zeros(1), torch.arange(4.0),
                                                  torch.arange(4.0), indexing="ij"), -1
                                   ).reshape(16, 3),
            "txt_ids": torch.zeros(5, 3), "return_dict": False}


@dataclasses.dataclass(frozen=True, eq=False)
class Tiny:
    """A model class and a config small enough to build with random weights in milliseconds."""
    name: str
    cls: type
    config: dict
    make_inputs: Callable
    cpu_share: float  # the cpu budget of the end-to-end loads, a share of the model's size

    @property
    def is_transformers(self):
        return issubclass(self.cls, transformers.PreTrainedModel)

    def build(self):
        torch.manual_seed(0)
        if self.is_transformers:
            return self.cls(self.cls.config_class(**self.config)).eval()
        return self.cls(**self.config).eval()

    def build_empty(self):
        """As accelerate's users do: under init_empty_weights, ties re-made (init_empty_weights
        leaves transformers' tied embeddings as two parameters)."""
        with accelerate.init_empty_weights():
            model = self.build()
        if self.is_transformers:
            model.tie_weights()
        return model

    def inputs(self, dtype=None):
        return self.make_inputs(dtype, torch.Generator().manual_seed(1))


def _llama(tie):
    return dict(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tie)


TINY = {t.name: t for t in [
    Tiny("llama-tied", transformers.LlamaForCausalLM, _llama(True), _llama_inputs, 0.5),
    Tiny("llama-untied", transformers.LlamaForCausalLM, _llama(False), _llama_inputs, 0.5),
    Tiny("unet", diffusers.UNet2DConditionModel, dict(
        block_out_channels=(16, 32), layers_per_block=1, cross_attention_dim=16, sample_size=8,
        norm_num_groups=8, in_channels=4, out_channels=4, attention_head_dim=4,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D")), _unet_inputs, 0.5),
    Tiny("vae", diffusers.AutoencoderKL, dict(
        block_out_channels=(8, 16), norm_num_groups=8, latent_channels=4, in_channels=3,
        out_channels=3, sample_size=16, down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2), _vae_inputs, 0.5),
    Tiny("sd3", diffusers.SD3Transformer2DModel, dict(
        sample_size=16, patch_size=2, in_channels=4, out_channels=4, num_layers=2,
        attention_head_dim=8, num_attention_heads=2, joint_attention_dim=16,
        caption_projection_dim=16, pooled_projection_dim=16, pos_embed_max_size=32),
        _sd3_inputs, 0.75),
    Tiny("flux", diffusers.FluxTransformer2DModel, dict(
        patch_size=1, in_channels=8, num_layers=1, num_single_layers=2, attention_head_dim=8,
        num_attention_heads=2, joint_attention_dim=16, pooled_projection_dim=16,
        axes_dims_rope=(2, 2, 4)), _flux_inputs, 0.5),
]}


@functools.cache
def model(name):
    """TINY[name] built once (seed 0): tests only read it."""
    return TINY[name].build()


def own_no_split(m):
    return sorted(m._no_split_modules)


def forward(m, inputs):
    with torch.no_grad():
        out = m(**inputs)
    return out.logits if hasattr(out, "logits") else out[0]


# --- accelerate, the reference ------------------------------------------------------------------

@contextlib.contextmanager
def sets_in_insertion_order():
    """accelerate's clean_device_map with its set of sibling prefixes iterating in insertion
    order (a module-level `set` shadowing the builtin while the outermost call runs)."""
    original = accelerate_modeling.clean_device_map

    def clean_device_map(device_map, module_name=""):
        if module_name:
            return original(device_map, module_name)
        accelerate_modeling.set = lambda items=(): dict.fromkeys(items)
        try:
            return original(device_map, module_name)
        finally:
            del accelerate_modeling.set

    accelerate_modeling.clean_device_map = clean_device_map
    try:
        yield
    finally:
        accelerate_modeling.clean_device_map = original


def accelerate_map(m, max_memory, **options):
    """accelerate.infer_auto_device_map (which converts max_memory in place: it gets a copy)."""
    with sets_in_insertion_order():
        return accelerate.infer_auto_device_map(
            m, max_memory=dict(max_memory) if max_memory is not None else None, **options)


def accelerate_plan(m, mode, max_memory, no_split, dtype, offload_buffers=False):
    """The map accelerate.load_checkpoint_and_dispatch plans for a string device_map."""
    max_memory = dict(max_memory) if max_memory is not None else None
    with sets_in_insertion_order():
        if mode != "sequential":
            max_memory = get_balanced_memory(m, max_memory=max_memory,
                                             no_split_module_classes=no_split, dtype=dtype,
                                             low_zero=mode == "balanced_low_0")
        return accelerate.infer_auto_device_map(m, max_memory=max_memory,
                                                no_split_module_classes=no_split, dtype=dtype,
                                                offload_buffers=offload_buffers)


def budgets(m, shares, dtype=None):
    """{device: share of the model's size} as bytes, sized at `dtype` as accelerate sizes it."""
    if shares is None:
        return None
    size = compute_module_sizes(m, dtype=dtype)[""]
    return {device: int(share * size) for device, share in shares.items()}


# --- device maps --------------------------------------------------------------------------------

BUDGETS = {
    "gpus-cpu-disk": {0: 0.25, 1: 0.3, "cpu": 0.25},
    "gpus-cpu": {0: 0.4, 1: 0.45, "cpu": 1.0},
    "gpu-cpu-disk": {0: 0.3, "cpu": 0.3},
    "cpu-disk": {"cpu": 0.5},
}
DTYPES = {"own": None, "f16": torch.float16}


@pytest.mark.parametrize("name", TINY)
def test_the_tiny_models_are_small_and_the_budgets_split_them(name):
    m = model(name)
    assert compute_module_sizes(m)[""] < 4 << 20
    devices = set()
    for shares in BUDGETS.values():
        devices |= set(accelerate_map(m, budgets(m, shares), no_split_module_classes=[]).values())
    assert devices == {0, 1, "cpu", "disk"}


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("no_split", ["own", "none"])
@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("name", TINY)
def test_infer_auto_device_map_matches_accelerate(name, budget, no_split, dtype):
    m = model(name)
    classes = own_no_split(m) if no_split == "own" else []
    max_memory = budgets(m, BUDGETS[budget], dtype)
    expected = accelerate_map(m, max_memory, no_split_module_classes=classes, dtype=dtype)
    got = lt.infer_auto_device_map(m, max_memory=dict(max_memory),
                                   no_split_module_classes=classes, dtype=dtype)
    assert list(got.items()) == list(expected.items())


def _last_weight(m):
    return [n for n, _ in m.named_parameters()][-1]


OPTIONS = {
    "offload_buffers": lambda m: {"offload_buffers": True},
    "fallback_allocation": lambda m: {"fallback_allocation": True},
    "no_clean": lambda m: {"clean_result": False},
    "special_dtypes": lambda m: {"special_dtypes": {_last_weight(m): torch.bfloat16,
                                                    next(iter(m.state_dict())): torch.float16}},
}


@pytest.mark.parametrize("option", OPTIONS)
@pytest.mark.parametrize("budget", ["gpus-cpu-disk", "gpu-cpu-disk"])
@pytest.mark.parametrize("name", TINY)
def test_infer_auto_device_map_options_match_accelerate(name, budget, option):
    m = model(name)
    max_memory = budgets(m, BUDGETS[budget])
    options = dict(OPTIONS[option](m), no_split_module_classes=own_no_split(m))
    expected = accelerate_map(m, max_memory, **options)
    got = lt.infer_auto_device_map(m, max_memory=dict(max_memory), **options)
    assert list(got.items()) == list(expected.items())


def test_budgets_as_size_strings():
    m = model("llama-untied")
    size = compute_module_sizes(m)[""]
    max_memory = {0: f"{size * 35 // 100_000}KB", 1: f"{size // 3 // 1024}KiB", "cpu": size // 5}
    expected = accelerate_map(m, max_memory, no_split_module_classes=[])
    assert len(set(expected.values())) == 4
    assert list(lt.infer_auto_device_map(m, max_memory=max_memory).items()) == \
        list(expected.items())


def test_no_split_given_as_one_class_name():
    m = model("llama-untied")
    max_memory = budgets(m, BUDGETS["cpu-disk"])
    expected = accelerate_map(m, max_memory, no_split_module_classes="LlamaDecoderLayer")
    assert expected != accelerate_map(m, max_memory, no_split_module_classes=[])  # it matters
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = lt.infer_auto_device_map(m, max_memory=dict(max_memory),
                                       no_split_module_classes="LlamaDecoderLayer")
    assert list(got.items()) == list(expected.items())


MODE_BUDGETS = {
    "three-gpus-cpu": {0: 0.3, 1: 0.3, 2: 0.3, "cpu": 0.5},
    "two-gpus-cpu-disk": {0: 0.2, 1: 0.5, "cpu": 0.3},
    "cpu-disk": {"cpu": 0.5},
    "default": None,
}


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("budget", MODE_BUDGETS)
@pytest.mark.parametrize("mode", ["auto", "balanced", "balanced_low_0", "sequential"])
@pytest.mark.parametrize("name", TINY)
def test_string_modes_plan_as_load_checkpoint_and_dispatch_does(name, mode, budget, dtype):
    m = model(name)
    no_split = own_no_split(m)
    max_memory = budgets(m, MODE_BUDGETS[budget], dtype)
    for offload_buffers in (False, True):
        expected = accelerate_plan(m, mode, max_memory, no_split, dtype, offload_buffers)
        got = _dispatch._plan_map(m, mode, dict(max_memory) if max_memory else None, no_split,
                                  dtype, offload_buffers=offload_buffers)
        assert list(got.items()) == list(expected.items()), offload_buffers


# --- end to end on the CPU ----------------------------------------------------------------------

FORMATS = ["safetensors", "bin", "sharded"]


def save(tiny, m, fmt, folder):
    """`m` saved as its library saves it; returns what load_checkpoint_and_dispatch is given: a
    folder accelerate finds the weights in, or the weights file."""
    folder.mkdir()
    if fmt == "sharded":
        size = compute_module_sizes(m)[""]
        m.save_pretrained(folder, max_shard_size=f"{size // 4000}KB")
        assert len(list(folder.glob("*.index.json"))) == 1
        return folder
    if fmt == "bin" and tiny.is_transformers:  # transformers 5 saves safetensors only
        torch.save(m.state_dict(), folder / "pytorch_model.bin")
        return folder
    m.save_pretrained(folder, safe_serialization=fmt == "safetensors")
    if tiny.is_transformers:
        return folder
    (path,) = folder.glob("diffusion_pytorch_model.*")
    return str(path)  # accelerate takes a file's path as a str only


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """checkpoint(name, fmt): TINY[name]'s weights saved in that format (once per module)."""
    saved = {}

    def get(name, fmt):
        if (name, fmt) not in saved:
            folder = tmp_path_factory.mktemp("ckpt") / f"{name}-{fmt}"
            saved[name, fmt] = save(TINY[name], model(name), fmt, folder)
        return saved[name, fmt]

    return get


def checkpoint_tensors(path):
    """Every tensor of the checkpoint, read by the reference readers."""
    path = pathlib.Path(path)
    files = [path] if path.is_file() else (sorted(path.glob("*.safetensors"))
                                           or sorted(path.glob("*.bin")))
    tensors = {}
    for f in files:
        if f.suffix == ".safetensors":
            tensors.update(safetensors.torch.load_file(f))
        else:
            tensors.update(torch.load(f, weights_only=True))
    return tensors


def offloaded(folder):
    """What accelerate's hooks read from an offload folder: {name: tensor}."""
    loader = OffloadedWeightsLoader(save_folder=str(folder))
    return {name: loader[name] for name in loader.keys()}


def placement(m):
    return {n: (p.dtype, p.device) for n, p in m.named_parameters()}


def dispatch(load, tiny, ckpt, folder, **options):
    """`load` (accelerate's load_checkpoint_and_dispatch or loadstone's) into an empty model."""
    m = tiny.build_empty()
    with sets_in_insertion_order():
        return load(m, ckpt, offload_folder=str(folder), **options)


E2E = [(name, fmt, dtype, False) for name in TINY for fmt in FORMATS
       for dtype in (None, torch.float16)]
E2E += [(name, "safetensors", torch.bfloat16, False) for name in TINY]
E2E += [(name, fmt, None, True) for name in TINY for fmt in ("safetensors", "sharded")]


def e2e_id(case):
    name, fmt, dtype, in_place = case
    return "-".join([name, fmt, str(dtype).replace("torch.", "")] + ["in-place"] * in_place)


@pytest.mark.parametrize("case", E2E, ids=e2e_id)
def test_load_checkpoint_and_dispatch_on_cpu_and_disk(case, checkpoint, scratch):
    name, fmt, dtype, in_place = case
    tiny, original = TINY[name], model(name)
    ckpt = checkpoint(name, fmt)
    options = dict(device_map="auto", max_memory=budgets(original, {"cpu": tiny.cpu_share}, dtype),
                   no_split_module_classes=own_no_split(original), dtype=dtype)
    ref = dispatch(accelerate.load_checkpoint_and_dispatch, tiny, ckpt, scratch / "ref", **options)
    if in_place:
        options["offload_in_place"] = True
    got = dispatch(lt.load_checkpoint_and_dispatch, tiny, ckpt, scratch / "got", **options)

    assert {"cpu", "disk"} <= set(ref.hf_device_map.values())  # the case is what it claims
    assert list(got.hf_device_map.items()) == list(ref.hf_device_map.items())
    assert placement(got) == placement(ref)
    inputs = tiny.inputs(dtype)
    expected = forward(ref, inputs)
    assert same_tensor(forward(got, inputs), expected)
    if dtype is None:
        assert same_tensor(expected, forward(original, inputs))

    # The offload folder: what accelerate's hooks read back is the checkpoint's tensor as stored
    # (accelerate offloads it before any cast), entry for entry what accelerate wrote.
    got_disk, ref_disk = offloaded(scratch / "got"), offloaded(scratch / "ref")
    assert sorted(got_disk) == sorted(ref_disk) and got_disk
    stored = checkpoint_tensors(ckpt)
    for tensor_name, tensor in got_disk.items():
        assert same_tensor(tensor, stored[tensor_name]), tensor_name
    index = json.loads((scratch / "got" / "index.json").read_text())
    ref_index = json.loads((scratch / "ref" / "index.json").read_text())
    if in_place:  # safetensors tensors referenced where they are: nothing copied
        assert dat_files(scratch / "got") == []
        assert sorted(index) == sorted(ref_index)
        assert all({"safetensors_file", "weight_name"} <= set(e) for e in index.values())
    else:  # accelerate's folder: the same index, each tensor a NAME.dat
        assert index == ref_index
        assert dat_files(scratch / "got") == dat_files(scratch / "ref") == \
            sorted(f"{n}.dat" for n in index)


def dat_files(folder):
    return sorted(p.name for p in folder.glob("*.dat"))


def test_loads_match_for_other_checkpoint_paths_and_argument_forms(checkpoint, scratch):
    """The index file itself, a pathlib.Path, dtype as a string, budgets as size strings, a
    string mode other than auto, an explicit map with torch.device values, strict=True."""
    tiny, original = TINY["llama-untied"], model("llama-untied")
    folder = checkpoint("llama-untied", "sharded")
    size = compute_module_sizes(original)[""]
    explicit = {"model.embed_tokens": torch.device("cpu"), "model.layers.0": "cpu",
                "model.layers.1": "disk", "model.layers.2": "cpu", "model.layers.3": "disk",
                "model.norm": "disk", "model.rotary_emb": "cpu", "lm_head": "disk"}
    cases = {
        "index": (folder / "model.safetensors.index.json", dict(max_memory={"cpu": size // 2})),
        "path": (pathlib.Path(folder), dict(max_memory={"cpu": size // 2})),
        "str-dtype": (folder, dict(max_memory={"cpu": size // 4}, dtype="float16")),
        "sizes": (folder, dict(device_map="sequential", max_memory={"cpu": f"{size // 2000}KB"})),
        "balanced": (folder, dict(device_map="balanced", max_memory={"cpu": size // 2})),
        "strict": (folder, dict(max_memory={"cpu": size // 2}, strict=True)),
        "explicit": (checkpoint("llama-untied", "bin"), dict(device_map=explicit)),
    }
    inputs = tiny.inputs()
    for case, (ckpt, options) in cases.items():
        options = {"device_map": "auto", **options}
        ref = dispatch(accelerate.load_checkpoint_and_dispatch, tiny, ckpt, scratch / case / "a",
                       **options)
        got = dispatch(lt.load_checkpoint_and_dispatch, tiny, ckpt, scratch / case / "l",
                       **options)
        assert {"cpu", "disk"} <= set(ref.hf_device_map.values()), case
        assert list(got.hf_device_map.items()) == list(ref.hf_device_map.items()), case
        assert placement(got) == placement(ref), case
        assert same_tensor(forward(got, inputs), forward(ref, inputs)), case


def test_without_a_device_map_the_weights_just_load(checkpoint):
    tiny = TINY["unet"]
    ckpt = checkpoint("unet", "safetensors")
    torch.manual_seed(123)  # weights unlike the checkpoint's
    ref = accelerate.load_checkpoint_and_dispatch(tiny.cls(**tiny.config).eval(), ckpt)
    got = lt.load_checkpoint_and_dispatch(tiny.cls(**tiny.config).eval(), ckpt)
    assert not hasattr(got, "hf_device_map")
    expected, stored = ref.state_dict(), checkpoint_tensors(ckpt)
    assert list(got.state_dict()) == list(expected)
    for n, t in got.state_dict().items():
        assert same_tensor(t, expected[n]) and same_tensor(t, stored[n]), n


@pytest.fixture(scope="module")
def half_checkpoint(tmp_path_factory):
    """llama-untied's weights saved in float16: a checkpoint whose dtype is not the model's."""
    folder = tmp_path_factory.mktemp("half")
    TINY["llama-untied"].build().half().save_pretrained(folder)
    return folder


def test_a_float16_checkpoint_into_a_float32_model_on_the_cpu(half_checkpoint, scratch):
    """Without disk in the map accelerate casts every weight to the model's dtype."""
    tiny = TINY["llama-untied"]
    options = dict(device_map={"": "cpu"})
    ref = dispatch(accelerate.load_checkpoint_and_dispatch, tiny, half_checkpoint,
                   scratch / "a", **options)
    got = dispatch(lt.load_checkpoint_and_dispatch, tiny, half_checkpoint, scratch / "l",
                   **options)
    assert placement(got) == placement(ref)
    assert {p.dtype for p in got.parameters()} == {torch.float32}
    assert same_tensor(forward(got, tiny.inputs()), forward(ref, tiny.inputs()))


OFFLOAD_STATE_DICT = {
    # accelerate's default with "disk" in the map: offload_state_dict=True
    "disk-in-the-map": dict(device_map="auto", max_memory={"cpu": 0.5}),
    "asked-for": dict(device_map={"": "cpu"}, offload_state_dict=True),
}


@pytest.mark.parametrize("case", OFFLOAD_STATE_DICT)
def test_a_float16_checkpoint_into_a_float32_model_with_offload_state_dict(
        half_checkpoint, scratch, case):
    tiny = TINY["llama-untied"]
    options = dict(OFFLOAD_STATE_DICT[case])
    if "max_memory" in options:
        options["max_memory"] = budgets(model("llama-untied"), options["max_memory"])
    ref = dispatch(accelerate.load_checkpoint_and_dispatch, tiny, half_checkpoint,
                   scratch / "a", **options)
    got = dispatch(lt.load_checkpoint_and_dispatch, tiny, half_checkpoint, scratch / "l",
                   **options)
    assert {p.dtype for p in ref.parameters()} == {torch.float16}  # accelerate: all as stored
    assert list(got.hf_device_map.items()) == list(ref.hf_device_map.items())
    assert placement(got) == placement(ref)
    assert same_tensor(forward(got, tiny.inputs()), forward(ref, tiny.inputs()))


class WithBuffers(torch.nn.Module):
    """Persistent buffers (BatchNorm's running statistics and its int64 counter) in modules the
    maps below send to the cpu and to disk."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(64, 64)
        self.bn = torch.nn.BatchNorm1d(64)
        self.c = torch.nn.Linear(64, 64)
        self.bn2 = torch.nn.BatchNorm1d(64)

    def forward(self, x):
        return self.bn2(self.c(self.bn(self.a(x))))


@pytest.fixture(scope="module")
def buffers_checkpoint(tmp_path_factory):
    torch.manual_seed(0)
    m = WithBuffers().eval()
    with torch.no_grad():
        for bn in (m.bn, m.bn2):
            bn.running_mean.normal_()
            bn.running_var.uniform_(0.5, 2)
            bn.num_batches_tracked.fill_(7)
    folder = tmp_path_factory.mktemp("buffers")
    safetensors.torch.save_file(m.state_dict(), folder / "model.safetensors")
    torch.save(m.state_dict(), folder / "pytorch_model.bin")
    return folder


def outcome(load, ckpt, folder, **options):
    """(map, buffers' dtypes and devices, output) of a load and a forward pass, or the error."""
    with accelerate.init_empty_weights():
        m = WithBuffers().eval()
    try:
        m = load(m, ckpt, offload_folder=str(folder), **options)
        x = torch.randn(2, 64, generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            out = m(x.to(options.get("dtype") or torch.float32))
    except Exception as e:  # noqa: BLE001 - compared with accelerate's
        return type(e), str(e)
    return (list(m.hf_device_map.items()),
            {n: (b.dtype, b.device) for n, b in m.named_buffers()}, out)


@pytest.mark.parametrize("offload_buffers", [False, True])
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("file", ["model.safetensors", "pytorch_model.bin"])
def test_buffers_on_cpu_and_disk(buffers_checkpoint, file, dtype, offload_buffers, scratch):
    """Where accelerate drops the buffers of disk-mapped modules (offload_buffers=False) its
    output is not the model's, and in float16 it raises: loadstone does the same."""
    for device_map in ({"a": "cpu", "bn": "disk", "c": "disk", "bn2": "cpu"},
                       {"a": "cpu", "bn": "cpu", "c": "disk", "bn2": "disk"}):
        options = dict(device_map=device_map, dtype=dtype, offload_buffers=offload_buffers)
        ckpt = str(buffers_checkpoint / file)  # accelerate takes a str only
        ref = outcome(accelerate.load_checkpoint_and_dispatch, ckpt, scratch / "a", **options)
        got = outcome(lt.load_checkpoint_and_dispatch, ckpt, scratch / "l", **options)
        shutil.rmtree(scratch / "a", ignore_errors=True)
        shutil.rmtree(scratch / "l", ignore_errors=True)
        if len(ref) == 2:  # accelerate raised
            assert got == ref
            continue
        assert got[:2] == ref[:2]
        assert same_tensor(got[2], ref[2])


# --- errors -------------------------------------------------------------------------------------

def raised(call):
    with pytest.raises(Exception) as caught:
        call()
    return type(caught.value), str(caught.value)


def test_a_string_device_map_that_is_no_mode(checkpoint):
    tiny, ckpt = TINY["vae"], checkpoint("vae", "safetensors")
    ref = raised(lambda: accelerate.load_checkpoint_and_dispatch(tiny.build_empty(), ckpt,
                                                                 device_map="fastest"))
    got = raised(lambda: lt.load_checkpoint_and_dispatch(tiny.build_empty(), ckpt,
                                                         device_map="fastest"))
    assert ref[0] is ValueError and "please choose 'auto'" in ref[1]
    assert got == ref


def test_disk_in_the_map_without_an_offload_folder(checkpoint):
    tiny, ckpt = TINY["vae"], checkpoint("vae", "safetensors")
    device_map = {"encoder": "cpu", "decoder": "disk", "quant_conv": "cpu",
                  "post_quant_conv": "cpu"}
    ref = raised(lambda: accelerate.load_checkpoint_and_dispatch(tiny.build_empty(), ckpt,
                                                                 device_map=device_map))
    got = raised(lambda: lt.load_checkpoint_and_dispatch(tiny.build_empty(), ckpt,
                                                         device_map=device_map))
    assert ref[0] is ValueError and "offload_folder" in ref[1]
    assert got == ref


def test_a_buffer_no_key_of_the_map_covers(checkpoint, scratch):
    """accelerate splits SD3's pos_embed for this budget but does not queue its buffer: no key of
    the map covers pos_embed.pos_embed, and both raise accelerate's error for it."""
    tiny, ckpt = TINY["sd3"], checkpoint("sd3", "safetensors")
    options = dict(device_map="auto", max_memory=budgets(model("sd3"), {"cpu": 0.5}),
                   no_split_module_classes=own_no_split(model("sd3")))
    ref = raised(lambda: dispatch(accelerate.load_checkpoint_and_dispatch, tiny, ckpt,
                                  scratch / "a", **options))
    got = raised(lambda: dispatch(lt.load_checkpoint_and_dispatch, tiny, ckpt, scratch / "l",
                                  **options))
    assert ref == (ValueError, "pos_embed.pos_embed doesn't have any device set.")
    assert got == ref


def test_the_reference_versions():
    assert accelerate.__version__ == "1.15.0"
    assert diffusers.__version__ == "0.42.1"
    assert transformers.__version__ == "5.25.0"
