"""loadstone for PyTorch: drop-ins for safetensors.torch and accelerate, state dicts, and weight
swaps into live modules. Importing this module imports torch; ``import loadstone`` does not.

    from loadstone.torch import load_file, load_checkpoint_and_dispatch
    state_dict = load_file("model.safetensors")                 # safetensors.torch.load_file
    model = load_checkpoint_and_dispatch(model, "ckpt/", device_map="auto",
                                         max_memory={0: "20GiB", "cpu": "64GiB"})

Every tensor is a torch.Tensor over loadstone's memory (no copy), which it keeps alive.
"""
import collections
import os

import torch

from . import _core
from ._describe import describe, describe_json
from ._dispatch import infer_auto_device_map, load_checkpoint_and_dispatch
from ._frameworks import to_torch, torch_dtype
from ._loader import device_name, make_plan, open_checkpoint
from ._loads import default_loader
from ._safe_open import reading


def _dtype_name(dtype):
    if dtype is None:
        return None
    return str(dtype).replace("torch.", "")


def load_file(filename, device="cpu", *, dtype=None, backend=None, progress=None):
    """safetensors.torch.load_file: {name: torch.Tensor} of every tensor, in the file's order.

    device: "cpu", "cuda", "cuda:N" or N. Extra: dtype (floating tensors cast while they load),
    backend (None: loadstone's reads into memory the tensors own; "pread"; "mmap": CPU tensors
    point into a private mapping of the file, as safetensors' do), progress (a tqdm bar; None:
    when stderr is a terminal). Any checkpoint loadstone opens works: an index, a folder, a
    .bin, a GGUF file. Tensors come as the file stores them, as safetensors gives them: a
    quantized weight stays packed (load_state_dict with a dtype dequantizes)."""
    ckpt = open_checkpoint(os.fspath(filename), as_stored=True)
    loader, options = reading(backend)
    plan = make_plan(ckpt, device=device_name(device), dtype=_dtype_name(dtype), **options)
    handle = loader.start(plan, ckpt.keys(), progress=progress)
    return {name: to_torch(t) for name, t in handle.result().items()}


def load_state_dict(path, *, device="cpu", device_map=None, max_memory=None, dtype=None,
                    keep_in_fp32_modules=None, no_split=None, offload_folder=None, variant=None,
                    subfolder=None, keep_packed=False, progress=None):
    """Every tensor of the checkpoint at `path` (a file, an index or a Hugging Face model
    folder, safetensors, .bin or GGUF) as {state-dict name: torch.Tensor}, placed by `device` or
    `device_map` ("auto", "balanced", "sequential", a dict; budgets in `max_memory`). Quantized
    weights are dequantized into `dtype` (a decoded compressed-tensors or GPTQ weight takes its
    state-dict name, M.weight) unless keep_packed. Tensors a map sends to "disk" are written to
    `offload_folder` and left out."""
    ckpt = open_checkpoint(path, variant, subfolder)
    loader = default_loader()
    plan = make_plan(ckpt, device=device_name(device) if device_map is None else None,
                     device_map=device_map if isinstance(device_map, (str, int)) else None,
                     explicit_map=device_map if isinstance(device_map, dict) else None,
                     max_memory=max_memory, dtype=_dtype_name(dtype),
                     keep_in_fp32=keep_in_fp32_modules, no_split=no_split,
                     offload_folder=os.fspath(offload_folder) if offload_folder else None,
                     keep_packed=keep_packed or None)
    handle = loader.start(plan, ckpt.keys(), progress=progress)
    if plan.offloaded:
        loader.write_offload(plan)
    renamed = {t["name"]: t["state_dict_name"] for t in plan.tensors}
    return {renamed[n]: to_torch(t) for n, t in handle.result().items()}


_IncompatibleKeys = collections.namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])


def load_into(model, path, *, strict=True, assign=False, variant=None, subfolder=None,
              progress=None):
    """Fills `model`'s parameters and persistent buffers from the checkpoint at `path` in place
    — the weight swap of RL trainers and hot-swapping engines — and returns
    Module.load_state_dict's (missing_keys, unexpected_keys).

    Each tensor loads as its parameter's dtype (cast while it loads; quantized weights
    dequantized into it). A parameter in host memory, contiguous, of a dtype loadstone casts to
    (or equal to the stored one) is read straight into: no memory of loadstone's, no copy after.
    Others (on a GPU, float64, ...) are loaded, then copied with param.copy_(). assign=True hands
    the module loadstone's tensors instead (zero-copy; what a model on the meta device needs).
    Errors: RuntimeError with torch's message for shape mismatches, and with strict for missing
    or unexpected keys — raised before any byte is read."""
    state = model.state_dict(keep_vars=True)
    ckpt = open_checkpoint(path, variant, subfolder)
    match = _core.match_state_dict(
        ckpt, [(k, list(t.shape), t.is_floating_point()) for k, t in state.items()])
    missing, unexpected = match["missing"], match["unexpected"]
    fills = {key: ckpt.info(name) for key, name, _ in match["fills"]}
    errors = [f"size mismatch for {key}: copying a param with shape {torch.Size(found)} from "
              f"checkpoint, the shape in current model is {torch.Size(expected)}."
              for key, expected, found in match["mismatched"]]
    if strict:
        if unexpected:
            errors.insert(0, "Unexpected key(s) in state_dict: {}. ".format(
                ", ".join(f'"{k}"' for k in unexpected)))
        if missing:
            errors.insert(0, "Missing key(s) in state_dict: {}. ".format(
                ", ".join(f'"{k}"' for k in missing)))
    if errors:
        raise RuntimeError("Error(s) in loading state_dict for {}:\n\t{}".format(
            model.__class__.__name__, "\n\t".join(errors)))

    special, direct = {}, {}
    for key, info in fills.items():
        target = state[key]
        stored = info["dtype"]
        wants = _dtype_name(target.dtype)
        cast = target.is_floating_point() and wants in ("float32", "float16", "bfloat16") and (
            wants != stored or ckpt.dequantizes(info["name"]))
        if cast:
            special[info["name"]] = wants
        loads_as = wants if cast else stored
        if (not assign and target.device.type == "cpu" and target.is_contiguous()
                and loads_as == wants and target.numel() > 0):
            direct[info["name"]] = (target.data_ptr(), target.numel() * target.element_size())
    plan = make_plan(ckpt, device="cpu", include=[i["name"] for i in fills.values()],
                     special_dtypes=special or None, caller_memory=list(direct) or None)
    handle = default_loader().start(plan, ckpt.keys(), progress=progress, destinations=direct)
    loaded = handle.result()
    by_name = {info["name"]: key for key, info in fills.items()}
    with torch.no_grad():
        for name, tensor in loaded.items():
            key = by_name.get(name)
            if key is None or name in direct:
                continue  # a float8 weight's scales; or read straight into the parameter
            _put(model, key, state[key], to_torch(tensor), assign)
    return _IncompatibleKeys(missing, unexpected)


def _put(model, key, target, value, assign):
    """Copies `value` into the model's tensor `key` (or hands it over, with assign)."""
    if not assign and target.device.type != "meta":
        target.copy_(value)
        return
    module_name, _, leaf = key.rpartition(".")
    module = model.get_submodule(module_name) if module_name else model
    value = value.to(target.dtype) if value.dtype != target.dtype else value
    if leaf in module._parameters:
        param = module._parameters[leaf]
        module._parameters[leaf] = type(param)(value, requires_grad=param.requires_grad)
    else:
        module._buffers[leaf] = value


def weights_iterator(files, device="cpu", dtype=None, *, batch_bytes=256 << 20,
                     progress=None):
    """Yields (name, torch.Tensor) for every tensor of `files` (paths of checkpoints: safetensors
    shards, .bin, GGUF) as each lands — the iterator serving engines plug a loader in by (vLLM's
    and SGLang's safetensors_weights_iterator). Every yielded tensor owns its memory:
    list(weights_iterator(...)) is safe. Each file loads in batches of about `batch_bytes`, the
    next batch read while the consumer takes the current one, so a consumer that drops each
    tensor holds at most two batches beside what it keeps."""
    if isinstance(files, (str, os.PathLike)):
        files = [files]
    loader = default_loader()
    device = device_name(device)
    dtype = _dtype_name(dtype)
    for path in files:
        ckpt = open_checkpoint(os.fspath(path))
        batches, batch, size = [], [], 0
        for info in ckpt.infos():
            if batch and size + info["nbytes"] > batch_bytes:
                batches.append(batch)
                batch, size = [], 0
            batch.append(info["name"])
            size += info["nbytes"]
        if batch:
            batches.append(batch)

        def start(names):
            plan = make_plan(ckpt, device=device, dtype=dtype, include=names)
            renamed = {t["name"]: t["state_dict_name"] for t in plan.tensors}
            return loader.start(plan, names, progress=progress), renamed

        pending = start(batches[0]) if batches else None
        for i in range(len(batches)):
            handle, renamed = pending
            pending = start(batches[i + 1]) if i + 1 < len(batches) else None
            try:
                for tensor in handle.as_completed():
                    yield renamed.get(tensor.name, tensor.name), to_torch(tensor)
            except BaseException:
                if pending is not None:
                    pending[0].cancel()
                handle.cancel()
                raise


__all__ = [
    "load_file",
    "load_state_dict",
    "load_into",
    "load_checkpoint_and_dispatch",
    "infer_auto_device_map",
    "weights_iterator",
    "describe",
    "describe_json",
    "to_torch",
    "torch_dtype",
]
